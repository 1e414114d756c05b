"""The lowered program: the graphs a plan runs, per layer kind and layout, and what they issue.

Contract: :class:`LoweredProgram` is what :func:`galvatron_fx.passes.lower_program.lower` makes
of a captured model and a plan, and what the runtime executes: per distinct (layer kind,
strategy, placements, mesh) one :class:`LayerGraphs` — the forward and backward graphs of local
ATen ops and functional collectives, with the layouts of their inputs and outputs — per layer
one :class:`LoweredLayer` naming its graphs, its stage and the data-parallel collectives of its
parameters, per stage a step graph (:attr:`LoweredProgram.stages`: the layers' forward and
backward calls in order, with the FSDP gathers and reduce-scatters, the gradient buckets and
the pipeline sends and receives as named nodes), and the gradient buckets. The records depend
on nothing but ``torch``; :func:`collectives_of` reads a graph's collectives.

Terms: a :class:`CollectiveRecord` is one collective as the cost model prices it: ``op``
(``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``), ``group_size`` ranks,
``bytes`` by the cost model's convention (an all-gather's gathered output, an all-to-all's
whole tensor, else its input), ``phase`` ``fwd`` or ``bwd``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.fx as fx

from galvatron_fx.ir.plan_records import CollectiveRecord

__all__ = ["CollectiveRecord", "HoistedReduce", "LayerGraphs", "LoweringKey", "ParamMeta", "LoweredLayer", "LoweredProgram", "collectives_of", "each_collective"]

# functional collective -> the cost model's name (and whether its bytes count the whole group)
FUNCTIONAL_COLLECTIVES = {
    "all_reduce": ("all_reduce", False), "all_reduce_coalesced": ("all_reduce", False),
    "all_gather_into_tensor": ("all_gather", True), "all_gather_into_tensor_coalesced": ("all_gather", True),
    "reduce_scatter_tensor": ("reduce_scatter", False), "reduce_scatter_tensor_coalesced": ("reduce_scatter", False),
    "all_to_all_single": ("all_to_all", True),
}


def _group_size(name: Any) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name).size()


def each_collective(gm: fx.GraphModule):
    """``(node, tensor argument, op, group size, bytes)`` per functional collective of ``gm`` in
    graph order (fake or real values in ``node.meta["val"]``; a coalesced one once per tensor)."""
    for n in gm.graph.nodes:
        t = n.target
        if n.op != "call_function" or getattr(t, "namespace", None) != "_c10d_functional" \
                or t._opname not in FUNCTIONAL_COLLECTIVES:
            continue
        op, whole = FUNCTIONAL_COLLECTIVES[t._opname]
        src = n.args[0]
        size = _group_size(n.args[-1])
        for x in (src if isinstance(src, (list, tuple)) else [src]):
            v = x.meta.get("val") if isinstance(x, fx.Node) else None
            if isinstance(v, torch.Tensor):
                nbytes = v.numel() * v.element_size()
                yield n, x, op, size, nbytes * size if whole else nbytes


def collectives_of(gm: fx.GraphModule, phase: str) -> list[CollectiveRecord]:
    """The functional collectives of ``gm``, in graph order, as records."""
    return [CollectiveRecord(phase, op, size, nbytes) for _n, _x, op, size, nbytes in each_collective(gm)]


class ParamMeta(NamedTuple):
    """One parameter as a layer's graphs take it (``LayerGraphs.param_meta``, in their order)."""

    fqn: str
    placement: str  # its storage placement on the tp axis, as a plan writes it ("R", "S(0)")
    shape: tuple[int, ...]  # its global shape
    dtype: torch.dtype
    trainable: bool  # floating point and trained: its gradient is synced and stepped


class HoistedReduce(NamedTuple):
    """An all-reduce of a value the forward saves for the backward, moved out of the backward
    graph (:mod:`galvatron_fx.passes.hoist_saved_collectives`): launched when the forward ends,
    waited when the backward starts."""

    saved_index: int  # which saved value (the backward graph's placeholder index)
    reduce_op: Any  # a torch.distributed.ReduceOp
    group: str  # the process group's name, as the graph named it


@dataclass(frozen=True)
class LoweringKey:
    """What a layer's lowered graphs depend on in one program: layers of one kind with equal
    keys share one :class:`LayerGraphs` (``LoweredProgram.layer_graphs``)."""

    kind: str
    placements: tuple[tuple[str, str], ...]  # (node, placement string), sorted
    recompute: str
    dp: int
    tp: int
    compute_dtype: str
    user_inputs: tuple[int, ...]  # which of the layer's inputs are the user's (the forward may take them whole)
    mesh_id: int  # the mesh object, within this process

    def across_meshes(self, mesh_key: tuple, batched: tuple[str, ...]) -> tuple:
        """The key of these graphs across programs of one captured model: the mesh by what its
        graphs name (device type, ranks, process groups) instead of its identity, and which
        values are batched."""
        return (dataclasses.replace(self, mesh_id=0), mesh_key, batched)


@dataclass(eq=False)
class LayerGraphs:
    """The lowered graphs of one layer kind under one layout (see module doc). Filled by the
    lowering's passes in turn; ``name`` is the first layer that runs them."""

    name: str
    kind: str
    key: LoweringKey | None = None
    decomposed: Any = None  # DecomposedLayer
    option: Any = None  # LayerOption
    strategy: Any = None  # LayerStrategy
    fqns: dict = field(default_factory=dict)
    compute_dtype: torch.dtype | None = None
    param_dtype: torch.dtype | None = None
    trace: Any = None  # passes.apply_placements.Trace: layouts, out_grad, the joint graph
    joint: fx.GraphModule | None = None
    fw: fx.GraphModule | None = None
    bw: fx.GraphModule | None = None
    simple: bool = True  # the graphs have the form the runtime calls directly (hoist_saved_collectives)
    # traced as plain local ops on this rank's share of the batch (passes.localize_batch), not with DTensor
    local: bool = False
    hoisted: list[HoistedReduce] = field(default_factory=list)
    # positions of the (non-parameter) inputs the forward also takes whole, after its inputs
    # (passes.fold_input_reductions)
    whole_inputs: list = field(default_factory=list)
    recompute: str = "none"
    recompute_bw: fx.GraphModule | None = None  # the backward as it runs under full recomputation
    param_names: list[str] = field(default_factory=list)  # FQNs, in the graphs' parameter order
    param_meta: list[ParamMeta] = field(default_factory=list)  # per parameter, in that order
    timings_s: dict = field(default_factory=dict)
    mismatches: list = field(default_factory=list)
    fw_collectives: list = field(default_factory=list)
    bw_collectives: list = field(default_factory=list)

    def graphs(self) -> dict[str, fx.GraphModule]:
        """What the pass runner lints and dumps."""
        out = {}
        for name in ("joint",) if self.fw is None else ("fw", "bw", "recompute_bw"):
            gm = getattr(self, name)
            if gm is not None:
                out[name] = gm
        return out


@dataclass
class LoweredLayer:
    """One layer of the plan as the program runs it."""

    name: str
    kind: str
    stage: int
    strategy: Any  # LayerStrategy
    dp: int
    graphs: LayerGraphs
    param_names: list = field(default_factory=list)  # FQNs, in the order its graphs take them
    option_source: str = "plan"  # "plan" | "tp1" (all replicated, none saved) | "re-solved"
    fw_dp: list = field(default_factory=list)  # FSDP gathers before the forward
    bw_dp: list = field(default_factory=list)  # FSDP gathers and reduce-scatters of the backward
    step_dp: list = field(default_factory=list)  # DDP: its gradients' bytes in the stage's buckets

    @property
    def fw_collectives(self) -> list[CollectiveRecord]:
        return list(self.graphs.fw_collectives) + list(self.fw_dp)

    @property
    def bw_collectives(self) -> list[CollectiveRecord]:
        return list(self.graphs.bw_collectives) + list(self.bw_dp)


@dataclass
class GradBucket:
    """One fused all-reduce of data-parallel gradients: the parameters it sums, in order."""

    stage: int
    group_size: int
    bytes: int
    params: list[str]
    after_layer: str  # the layer whose backward completes it


@dataclass
class LoweredProgram:
    """A plan, lowered (see module doc)."""

    plan: Any  # ParallelPlan
    layers: list[LoweredLayer] = field(default_factory=list)
    layer_graphs: dict[LoweringKey, LayerGraphs] = field(default_factory=dict)
    buckets: list[GradBucket] = field(default_factory=list)
    stages: dict[int, fx.GraphModule] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)

    def graph_of(self, name: str) -> LayerGraphs:
        return next(lay.graphs for lay in self.layers if lay.name == name)

    def graphs(self) -> dict[str, fx.GraphModule]:
        """What the pass runner lints and dumps: the stages' step graphs."""
        return {f"stage{s}": gm for s, gm in self.stages.items()}


# ---- the step graph's operations: named nodes, never run -------------------------------------

def _marker(name: str, doc: str):
    def op(*args):
        raise RuntimeError(f"{name} is a node of a lowered program's step graph, for reading; it does not run")
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    op.__module__ = "gfx"
    return op


layer_forward = _marker("layer_forward", "A layer's forward graph, on its inputs (its parameters implied).")
layer_backward = _marker("layer_backward", "A layer's backward graph (a recomputed layer's forward again first).")
send = _marker("send", "Send a value to another pipeline stage (point-to-point).")
recv = _marker("recv", "Receive a value from another pipeline stage (point-to-point).")
send_grad = _marker("send_grad", "Send a value's gradient back to the stage that made it.")
recv_grad = _marker("recv_grad", "Receive a value's gradient from the stage that read it.")
fsdp_all_gather = _marker("fsdp_all_gather", "FSDP: gather a layer's sharded parameters over dp.")
fsdp_reduce_scatter = _marker("fsdp_reduce_scatter", "FSDP: reduce-scatter a layer's gradients over dp.")
all_reduce_bucket = _marker("all_reduce_bucket", "DDP: sum one bucket of gradients over dp.")


def _getitem(value, k: int):
    """One output of a layer with several."""
    raise RuntimeError("a step-graph node, for reading; it does not run")
