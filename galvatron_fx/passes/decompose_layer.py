"""decompose_layer — one layer's subgraph, re-traced into the ATen ops DTensor dispatches at run time.

Contract: takes an annotated :class:`~galvatron_fx.ir.ModelGraph` and one of its layers;
returns a :class:`DecomposedLayer`: a new ``GraphModule`` of the layer's forward as
post-dispatch ATen ops (``addmm``, ``native_layer_norm``, ``view``, the attention kernel, …)
with fake values in ``node.meta["val"]``, the role of each external input, and each node's
forward FLOPs and bytes. The model's graph is not changed. This is a graph transformation the
solver (:mod:`galvatron_fx.search.intra_layer`) and the runtime
(:mod:`galvatron_fx.runtime.layer_exec`) call per layer kind; it is not run by the pass runner.

Terms: an input's *role* is ``"param"`` (a parameter), ``"activation"`` (a floating value
computed outside the layer that only this layer reads: the hidden state handed on, which
follows the sequence-parallel layout) or ``"other"`` (a value many layers read, such as a
rotary table or a mask, which stays replicated). A plan's placement strings name the nodes
of this graph (:mod:`galvatron_fx.ir.placements`).

Algorithm: ``make_fx`` on fake tensors of the captured shapes, the inputs requiring grad as
in training (some ops dispatch to other kernels then); then each node is re-run on fake
tensors under :class:`~galvatron_fx.passes.annotate_costs.CostCounter` for its FLOPs and
bytes. :func:`check_placements` decomposes the layers of a plan and checks their placements.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten

from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.placements import check_layer_placements
from galvatron_fx.ops import shardings
from galvatron_fx.passes.annotate_costs import CostCounter, layer_callable
from galvatron_fx.passes.kernel_costs import kernel_bytes, kernel_flops

if TYPE_CHECKING:
    from galvatron_fx.ir.plan import ParallelPlan

log = logging.getLogger(__name__)

__all__ = ["DecomposedLayer", "check_placements", "decompose_layer", "decomposed_kind", "param_values", "requires_grad_values"]


@dataclass
class DecomposedLayer:
    """The layer's forward as post-dispatch ATen ops, with per-node measured costs."""

    gm: fx.GraphModule
    inputs: list[fx.Node]  # placeholders, in the order of the layer's external inputs
    input_roles: list[str]  # "param", "activation" (from another layer) or "other"
    input_names: list[str]  # names of the original graph's external values
    input_grads: list[bool] = field(default_factory=list)  # which of them require grad in training
    fwd_flops: dict[str, int] = field(default_factory=dict)
    fwd_bytes: dict[str, int] = field(default_factory=dict)
    # (node, tp) -> strategies; also (strategy_key, tp): nodes alike share one list
    strategies: dict[tuple, list] = field(default_factory=dict)
    # placeholder -> the parameter's (or buffer's) name within the layer ("attn.q_proj.weight")
    param_names: dict[str, str] = field(default_factory=dict)
    structure: dict = field(default_factory=dict)  # what the layer ILP reads of gm, read once


def decompose_layer(mg: ModelGraph, layer: LayerInfo) -> DecomposedLayer:
    """Re-trace ``layer`` into the ATen ops DTensor dispatches at run time, on fake tensors."""
    by_name = mg.nodes_by_name()
    nodes = mg.layer_nodes(layer)
    ext = mg.layer_inputs(layer)
    param_nodes = {node for p in mg.params.values() if not p.is_buffer for node in p.nodes}
    readers: dict[str, int] = defaultdict(int)
    for other in mg.layers:
        for name in other.input_names:
            readers[name] += 1
    # the hidden state handed from the previous layer follows the sequence-parallel layout;
    # values many layers read (rotary tables, masks, an encoder output) stay replicated
    roles = ["param" if a.name in param_nodes else
             ("activation" if a.op != "placeholder" and _is_float(a) and readers[a.name] == 1 else "other")
             for a in ext]
    run = layer_callable(nodes, ext, [by_name[o] for o in layer.output_names], mg.gm)
    needs = requires_grad_values(mg)  # (kept on the graph: one pass over it, not one per layer)
    grad = {a for a in ext if a.name in needs}
    try:
        gm = _traced(run, ext, grad, "cpu")
    except Exception as e:
        # an op the CPU cannot run as captured (an integer histogram in a graph captured for
        # another device): traced on stand-ins of the captured device instead
        devices = {a.meta["val"].device for a in ext if isinstance(a.meta.get("val"), torch.Tensor)}
        if devices <= {torch.device("cpu")}:
            raise
        log.debug("layer %s traced on %s stand-ins (%s: %s)", layer.name, devices, type(e).__name__, e)
        gm = _traced(run, ext, grad, None)
    # rules for the library ops the layer calls (a Hugging Face mixture-of-experts grouped matmul)
    shardings.ensure_rules({n.target for n in gm.graph.nodes if n.op == "call_function"})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fqn: dict[str, str] = {}
    for name, p in mg.params.items():
        for node in p.nodes:
            fqn.setdefault(node, name.removeprefix(layer.name + "."))
    dl = DecomposedLayer(gm=gm, inputs=placeholders, input_roles=roles, input_names=[a.name for a in ext],
                         input_grads=[a in grad for a in ext],
                         param_names={ph.name: fqn[a.name] for ph, a in zip(placeholders, ext) if a.name in fqn})
    _measure_forward(dl)
    return dl


def _graph_state(mg: ModelGraph) -> tuple:
    """What the graph-level caches on ``mg.gm.meta`` depend on: the graph (its identity and node
    count) and which parameters are trainable."""
    return (len(mg.gm.graph.nodes), id(mg.gm.graph),
            frozenset(p.name for p in mg.params.values() if p.requires_grad and not p.is_buffer))


def decomposed_kind(mg: ModelGraph, layer: LayerInfo) -> DecomposedLayer:
    """:func:`decompose_layer` of the first layer of ``layer``'s kind asked for, kept on the
    captured graph (as its lowerings are) while its nodes and trainable parameters stay as they
    were: every program lowered from ``mg`` decomposes each kind once. Its input names are the
    first layer's: callers replace them with their layer's."""
    key = _graph_state(mg)
    cache = mg.gm.meta.get("gfx_decomposed")
    if cache is None or cache[0] != key:
        kinds: dict[str, DecomposedLayer] = {}
        cache = mg.gm.meta["gfx_decomposed"] = (key, kinds)
    if layer.kind not in cache[1]:
        cache[1][layer.kind] = decompose_layer(mg, layer)
    return cache[1][layer.kind]


def _traced(run, ext: list[fx.Node], grad: set[fx.Node], device: str | None) -> fx.GraphModule:
    with FakeTensorMode(allow_non_fake_inputs=True):
        # inputs that require grad in training do here too: some ops dispatch to other kernels
        # then (an attention mask that requires grad takes SDPA's math path, differentiable in it)
        xs = [_fake(a.meta["val"], device).requires_grad_(a in grad) for a in ext]
        return make_fx(run, tracing_mode="real")(*xs)


def requires_grad_values(mg: ModelGraph) -> set[str]:
    """Names of the captured graph's values that require grad in training (kept on the graph,
    for its nodes and trainable parameters as they are: a graph rewritten or a parameter frozen
    since is looked at anew)."""
    key = _graph_state(mg)
    cache = mg.gm.meta.get("gfx_requires_grad")
    if cache is None or cache[0] != key:
        cache = mg.gm.meta["gfx_requires_grad"] = (key, {n.name for n in _requires_grad(mg)})
    return cache[1]


def _requires_grad(mg: ModelGraph) -> set[fx.Node]:
    """The captured graph's nodes whose values require grad in training: trainable parameters
    and the floating values computed from them."""
    trainable = {node for p in mg.params.values() if p.requires_grad and not p.is_buffer for node in p.nodes}
    out: set[fx.Node] = set()
    for n in mg.gm.graph.nodes:
        if n.op == "placeholder":
            if n.name in trainable:
                out.add(n)
        elif _is_float(n) and any(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def _is_float(n: fx.Node) -> bool:
    v = n.meta.get("val")
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _fake(val, device: str | None = "cpu") -> torch.Tensor:
    shape = [int(s) for s in val.shape]
    return torch.empty(shape, dtype=val.dtype, device=device or val.device)


def _measure_forward(dl: DecomposedLayer) -> None:
    """FLOPs and bytes of every decomposed node's forward kernel: :func:`kernel_flops` and
    :func:`kernel_bytes` of its op on the values the trace recorded (what :class:`CostCounter`
    counts of the op run on them, without running it again: an unrolled scan's thousands of ops
    cost seconds of fake-tensor dispatch). A graph with a value not recorded is run on fake tensors."""
    calls = [n for n in dl.gm.graph.nodes if n.op == "call_function"]
    if all("val" in a.meta for n in calls for a in (n, *n.all_input_nodes)):
        val = lambda a: a.meta["val"]  # noqa: E731
        for n in calls:
            if not isinstance(n.target, torch._ops.OpOverload):  # (getitem: no kernel)
                dl.fwd_flops[n.name] = dl.fwd_bytes[n.name] = 0
                continue
            args, kwargs = fx.node.map_arg(n.args, val), fx.node.map_arg(n.kwargs, val)
            dl.fwd_flops[n.name] = kernel_flops(n.target, args, kwargs, n.meta["val"])
            dl.fwd_bytes[n.name] = kernel_bytes(n.target, args, kwargs, n.meta["val"])
        return
    env: dict[fx.Node, Any] = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for n in dl.gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = _fake(n.meta["val"])
            elif n.op == "call_function":
                args = torch.fx.node.map_arg(n.args, lambda a: env[a])
                kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
                try:
                    with CostCounter() as cc:
                        env[n] = n.target(*args, **kwargs)
                    dl.fwd_flops[n.name], dl.fwd_bytes[n.name] = cc.flops, cc.bytes
                except Exception:  # (not runnable on CPU stand-ins: see decompose_layer) its bytes
                    env[n] = _stand_in(n.meta.get("val"))
                    dl.fwd_flops[n.name] = 0
                    dl.fwd_bytes[n.name] = sum(t.numel() * t.element_size() for t in tree_flatten((args, kwargs, env[n]))[0]
                                               if isinstance(t, torch.Tensor))


def _stand_in(val):
    if isinstance(val, torch.Tensor):
        return _fake(val)
    if isinstance(val, (list, tuple)):
        return type(val)(_stand_in(v) for v in val)
    return val


def param_values(dl: DecomposedLayer) -> set[str]:
    """Names of the decomposed layer's nodes computed from parameters and factories alone (the
    parameters and their views, transposes, casts; positions from ``arange`` and what a position
    embedding looks up with them): their bytes do not grow with the batch."""
    out = {ph.name for ph, r in zip(dl.inputs, dl.input_roles) if r == "param"}
    for n in dl.gm.graph.nodes:
        if n.op == "call_function" and all(a.name in out for a in n.all_input_nodes):
            out.add(n.name)
    return out


def node_labels(dl: DecomposedLayer) -> dict[str, str]:
    """Readable names of the decomposed layer's nodes that have one: a parameter's placeholder
    by the parameter's name within the layer (``attn.q_proj.weight``), what is computed from it
    alone by that name and the op (``attn.q_proj.weight (t)``), an op reading it by the module and
    the op (``attn.q_proj mm``), another input by the captured value it is (``input add_3``)."""
    labels: dict[str, str] = {}
    root: dict[str, str] = {}  # node -> the parameter it is computed from
    for ph, name in zip(dl.inputs, dl.input_names):
        if ph.name in dl.param_names:
            labels[ph.name] = root[ph.name] = dl.param_names[ph.name]
        else:
            labels[ph.name] = f"input {name}"
    alone = param_values(dl)
    for n in dl.gm.graph.nodes:
        if n.op != "call_function":
            continue
        srcs = [root[a.name] for a in n.all_input_nodes if a.name in root]
        if not srcs:
            continue
        op = getattr(n.target, "_opname", getattr(n.target, "__name__", str(n.target)))
        if n.name in alone:
            root[n.name] = srcs[0]
            labels[n.name] = f"{srcs[0]} ({op})"
        else:
            labels[n.name] = f"{srcs[0].rpartition('.')[0] or srcs[0]} {op}"
    return labels


def check_placements(plan: ParallelPlan, mg: ModelGraph, *, decomposed: dict | None = None) -> None:
    """:func:`~galvatron_fx.ir.placements.check_layer_placements` for every layer of ``plan``
    that has placements and a layer of the same name in ``mg``; ``decomposed`` (layer kind →
    decomposed layer) is used and filled so that a caller that decomposes the layers anyway pays
    nothing twice."""
    decomposed = {} if decomposed is None else decomposed
    layers = {layer.name: layer for layer in mg.layers}
    for lp in plan.layers:
        layer = layers.get(lp.name)
        if layer is None or not lp.placements:
            continue
        if layer.kind not in decomposed:
            decomposed[layer.kind] = decompose_layer(mg, layer)
        check_layer_placements(lp.name, lp.placements, decomposed[layer.kind].gm)
