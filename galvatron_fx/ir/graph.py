"""``ModelGraph``: the captured training graph, its parameters and its layer segmentation.

A *layer* is a contiguous run of graph nodes that the search treats as one unit: the
embedding, each repeated block, the head, the loss, and any "other" segment between them.
Identical blocks share one ``kind`` (a structural hash of ops, shapes and wiring, not names),
so every later step — cost annotation, the intra-layer ILP — runs once per kind.

Everything here is keyed by names (node names, parameter FQNs, layer names), never by
``fx.Node`` objects held across copies, so plans and reports survive graph copies and JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

import torch
import torch.fx as fx


class LayerRole(StrEnum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"
    LOSS = "loss"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One parameter or buffer of the captured model.

    ``layers`` lists every layer that reads it: a tied embedding/head weight appears in two,
    once here, with the other name in ``aliases``.
    """

    name: str  # FQN in the original module (the first one, for a tied parameter)
    node: str  # placeholder name in the graph (the first one)
    shape: tuple[int, ...]
    dtype: str
    numel: int
    nbytes: int
    is_buffer: bool = False
    requires_grad: bool = True
    layers: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # other FQNs of the same tensor (tied weights)
    alias_nodes: tuple[str, ...] = ()  # their placeholders: export lifts each FQN separately

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.alias_nodes)


@dataclass(frozen=True, slots=True)
class InputInfo:
    """One user input of the captured graph: where the caller passes it and, for a non-tensor
    argument (``use_cache=False``), the value the graph was specialised to."""

    name: str  # the graph's placeholder name (for a tensor input, an entry of ``input_names``)
    key: int | str  # positional index, or keyword name
    is_tensor: bool = True
    value: object = None


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """Per-layer sums of the node facts (one forward + one backward at the captured shapes).

    ``activation_bytes`` are bytes saved for backward (unique storages, parameters excluded);
    ``output_bytes`` are the bytes of the values the layer hands to later layers;
    ``bwd_transient_bytes`` is the peak the backward adds (see the field);
    ``param_bytes``/``num_params`` count the trainable parameters charged to this layer: each
    parameter to the first layer that reads it (a tied embedding/head weight to the embedding;
    ``ParamInfo.layers`` lists every reader), buffers never.
    """

    fwd_flops: int = 0
    bwd_flops: int = 0
    fwd_bytes: int = 0
    bwd_bytes: int = 0
    activation_bytes: int = 0
    output_bytes: int = 0
    param_bytes: int = 0
    num_params: int = 0
    # under recomputation (``galvatron_fx.ir.recompute``): memory kept from forward to backward,
    # and the extra FLOPs/bytes the backward spends recomputing
    activation_bytes_selective: int = 0
    activation_bytes_full: int = 0
    recompute_flops_selective: int = 0
    recompute_flops_full: int = 0
    recompute_bytes_selective: int = 0
    recompute_bytes_full: int = 0
    # the largest live set the backward (without recomputation) allocates beyond what the
    # forward saved: the arriving output gradients, the temporaries and the input gradients
    # (parameter gradients are counted as gradients)
    bwd_transient_bytes: int = 0

    @property
    def train_flops(self) -> int:
        return self.fwd_flops + self.bwd_flops

    def activation_bytes_for(self, recompute: str) -> int:
        """Activation bytes kept for backward under ``recompute`` (none / selective / full)."""
        return {"none": self.activation_bytes, "selective": self.activation_bytes_selective,
                "full": self.activation_bytes_full}[str(recompute)]

    def recompute_flops_for(self, recompute: str) -> int:
        return {"none": 0, "selective": self.recompute_flops_selective,
                "full": self.recompute_flops_full}[str(recompute)]

    def recompute_bytes_for(self, recompute: str) -> int:
        return {"none": 0, "selective": self.recompute_bytes_selective,
                "full": self.recompute_bytes_full}[str(recompute)]


@dataclass(slots=True)
class LayerInfo:
    """One segment of the graph. ``kind`` is the structural hash shared by identical layers."""

    name: str
    index: int
    role: LayerRole
    kind: str
    node_names: list[str]
    param_names: list[str]  # FQNs of the parameters and buffers the layer reads
    input_names: list[str]  # non-parameter values produced outside the layer, in first-use order
    output_names: list[str]  # values of this layer read by later layers or by the graph output
    modules: list[str] = field(default_factory=list)  # module FQNs whose ops fall in this layer
    costs: LayerCosts | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["role"] = str(self.role)
        return d


@dataclass(frozen=True, slots=True)
class BatchScaling:
    """How the captured graph's sizes follow the batch, read off a probe capture of the same model
    at another batch (:func:`galvatron_fx.passes.batch_probe.mark_batched`), node by node (paired by op and
    inputs: :func:`galvatron_fx.passes.batch_probe.paired_nodes`).

    ``ints``: per node, the integer arguments that grow in proportion to the batch, as ``(index
    among the flat leaves of (args, kwargs), value at batch)`` (a ``view``'s ``B*T``, an
    ``arange``'s ``B``). ``dims``: per node, for each flat tensor output, the dims whose size
    grows in proportion to the batch. ``irregular``: nodes where something changes with the
    batch but not in proportion (or that the probe lacks): a graph with one cannot be
    re-instantiated at another batch there."""

    batch: int
    probe_batch: int
    ints: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    dims: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    irregular: frozenset[str] = frozenset()

    def scales(self, value: int, batch: int) -> int | None:
        """``value`` (proportional to the captured batch) at ``batch``, or None if not integral."""
        q, r = divmod(value * batch, self.batch)
        return None if r else q


@dataclass(slots=True)
class ModelGraph:
    """The captured model: graph module, parameters, user inputs/outputs and layers.

    ``gm`` is the exported ATen training graph (parameters and buffers are placeholders);
    ``params`` maps FQN → :class:`ParamInfo`; ``layers`` is in execution order.
    """

    gm: fx.GraphModule
    params: dict[str, ParamInfo]
    input_names: list[str]  # user-input placeholders, in call order
    output_names: list[str]  # the loss
    layers: list[LayerInfo] = field(default_factory=list)
    name: str = "model"
    example_shapes: list[tuple[int, ...]] = field(default_factory=list)
    example_dtypes: list[str] = field(default_factory=list)
    exported: object | None = None  # the torch.export.ExportedProgram, when captured by export
    inputs: list[InputInfo] = field(default_factory=list)  # every user argument, tensors or not
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # lifted tensor constants by FQN
    extra_output_names: list[str] = field(default_factory=list)  # outputs besides the loss (logits)
    output_keys: dict[str, str] = field(default_factory=dict)  # output node -> its key in the model's output
    # values whose dim 0 is the batch (see galvatron_fx.passes.batch_probe.mark_batched); empty: unknown
    batched: set[str] = field(default_factory=set)
    # how every size follows the batch (from the same probe as ``batched``); None: unknown
    batch_scaling: BatchScaling | None = None
    # FQNs of the buffers the forward writes in training (BatchNorm's running statistics)
    mutated_buffers: list[str] = field(default_factory=list)

    # ---- inputs -------------------------------------------------------------------------------
    def bind_inputs(self, args=(), kwargs=None) -> list[torch.Tensor]:
        """The tensor user inputs, in ``input_names`` order, from a call's ``args`` and ``kwargs``
        (or from ``args`` alone when it is a mapping of names to values: a Hugging Face batch).
        A positional input may also be passed by name. Raises ``ValueError`` naming what is
        missing, unexpected or differs from the value the graph was specialised to."""
        from collections.abc import Mapping

        if isinstance(args, Mapping):
            args, kwargs = (), {**args, **(kwargs or {})}
        args, kwargs = tuple(args), dict(kwargs or {})
        infos = self.inputs or [InputInfo(name=n, key=i) for i, n in enumerate(self.input_names)]
        known = {i.key for i in infos} | {i.name for i in infos}
        unexpected = [k for k in kwargs if k not in known]
        if len(args) > sum(isinstance(i.key, int) for i in infos) or unexpected:
            raise ValueError(f"{self.name} was captured with inputs {self._signature()}; got {len(args)} positional "
                             f"and keywords {sorted(kwargs)}")
        out: list[torch.Tensor] = []
        for info in infos:
            if isinstance(info.key, int) and info.key < len(args):
                value, given = args[info.key], True
            elif info.key in kwargs or info.name in kwargs:
                value, given = kwargs.get(info.key, kwargs.get(info.name)), True
            else:
                value, given = None, False
            if info.is_tensor:
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"input {info.key!r} of {self.name} must be a tensor (captured with inputs "
                                     f"{self._signature()}), got {type(value).__name__}")
                out.append(value)
            elif given and value != info.value:
                raise ValueError(f"argument {info.key!r} of {self.name} was captured as {info.value!r} and is "
                                 f"fixed in the graph; got {value!r}: capture again with the new value")
        return out

    def _signature(self) -> str:
        infos = self.inputs or [InputInfo(name=n, key=i) for i, n in enumerate(self.input_names)]
        return "(" + ", ".join(f"{i.key}=" + ("<tensor>" if i.is_tensor else repr(i.value)) if isinstance(i.key, str)
                               else "<tensor>" for i in infos) + ")"

    # ---- lookups -------------------------------------------------------------------------
    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    def node(self, name: str) -> fx.Node:
        """The node called ``name``; raises KeyError naming the graph if absent."""
        for n in self.gm.graph.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in the captured graph of {self.name}")

    def nodes_by_name(self) -> dict[str, fx.Node]:
        return {n.name: n for n in self.gm.graph.nodes}

    def layer(self, name: str) -> LayerInfo:
        for layer in self.layers:
            if layer.name == name:
                return layer
        known = ", ".join(l.name for l in self.layers[:8])
        raise KeyError(f"no layer named {name!r}; layers are: {known}, ...")

    def layer_nodes(self, layer: LayerInfo) -> list[fx.Node]:
        """The layer's nodes, in graph order."""
        by_name = self.nodes_by_name()
        return [by_name[n] for n in layer.node_names]

    def layer_inputs(self, layer: LayerInfo) -> list[fx.Node]:
        """Values the layer reads from outside (parameters included), in first-use order."""
        nodes = self.layer_nodes(layer)
        inside = set(nodes)
        ext: list[fx.Node] = []
        for n in nodes:
            for a in n.all_input_nodes:
                if a not in inside and a.op != "get_attr" and a not in ext:
                    ext.append(a)
        return ext

    def coupled(self) -> dict[str, str]:
        """Layer name -> its first value that holds the batch in two dims (from the batch probe,
        ``batch_scaling``): a layer where one sample's result depends on other samples' inputs
        beyond sums over the batch (CLIP's image × text similarities, in-batch negatives). Such a
        model's loss over a micro-batch is not its share of the batch's loss: it trains in one
        micro-batch per step. Empty when nothing couples samples, or without a probe."""
        s = self.batch_scaling
        if s is None:
            return {}
        cached = self.gm.meta.get("gfx_coupled")
        if cached is not None and cached[0] is s and cached[1] == len(self.layers):
            return dict(cached[2])
        out: dict[str, str] = {}
        for layer in self.layers:
            for n in layer.node_names:
                if any(len(dims) > 1 for dims in s.dims.get(n, ())):
                    out[layer.name] = n
                    break
        self.gm.meta["gfx_coupled"] = (s, len(self.layers), dict(out))
        return out

    def kinds(self) -> dict[str, list[LayerInfo]]:
        """Layer kind hash → the layers of that kind, in order."""
        out: dict[str, list[LayerInfo]] = {}
        for layer in self.layers:
            out.setdefault(layer.kind, []).append(layer)
        return out

    def blocks(self) -> list[LayerInfo]:
        return [l for l in self.layers if l.role == LayerRole.BLOCK]

    @property
    def num_params(self) -> int:
        """Trainable parameter count (each tied parameter once; buffers excluded)."""
        return sum(p.numel for p in self.params.values() if not p.is_buffer)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params.values() if not p.is_buffer)

    def total_costs(self) -> LayerCosts:
        """Sums over layers; parameters counted once even when tied."""
        tot = {k: 0 for k in LayerCosts.__dataclass_fields__}
        for layer in self.layers:
            if layer.costs is None:
                raise ValueError("the graph has no costs yet: run annotate_costs_pass first")
            for k in tot:
                tot[k] += getattr(layer.costs, k)
        tot["num_params"] = self.num_params
        tot["param_bytes"] = self.param_bytes
        return LayerCosts(**tot)

    # ---- views -----------------------------------------------------------------------------
    def summary(self, *, nodes: bool = False) -> str:
        """A per-layer table (and, with ``nodes=True``, a per-node table) as text."""
        from galvatron_fx.report.inspect import format_layer_table, format_node_table

        text = format_layer_table(self)
        if nodes:
            text += "\n\n" + format_node_table(self)
        return text

    def to_json_dict(self, *, nodes: bool = False) -> dict:
        from galvatron_fx.report.inspect import graph_to_json_dict

        return graph_to_json_dict(self, nodes=nodes)

    def to_dot(self) -> str:
        from galvatron_fx.report.inspect import graph_to_dot

        return graph_to_dot(self)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
