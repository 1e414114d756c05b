"""annotate_costs_pass — measure what every node costs, forward and backward, once per layer kind.

Contract: requires ``"layers"`` (``ctx.graph.layers``, ``facts(node).layer``); produces
``"costs"``: on every node ``facts(node)`` gets ``fwd_flops``, ``bwd_flops``, ``fwd_bytes``,
``bwd_bytes``, ``output_bytes``, ``saved_bytes`` and ``requires_grad``; every layer gets a
:class:`~galvatron_fx.ir.graph.LayerCosts`. The graph is not changed.

Terms: *FLOPs* and *bytes* are those of the kernels each op really dispatches to, counted by
:class:`~galvatron_fx.passes.kernel_costs.CostCounter` (PyTorch's FLOP formulas; bytes read and
written by each kernel, metadata queries and views excluded). *Saved bytes* are the unique storages that
autograd keeps for backward (``saved_tensors_hooks``), parameters excluded — the activation
memory of the layer.

Algorithm: nothing is guessed and nothing real is allocated. Under ``FakeTensorMode``, for
the first layer of each kind:
1. forward: run the layer's nodes in order on fake inputs (layer inputs and parameters as
   leaves, ``requires_grad`` as in training), counting each node's kernels and attributing
   each newly saved storage to the node whose op saved it;
2. backward: for each node, re-run its op on fresh leaves and call ``autograd.grad`` with a
   fake upstream gradient, counting the backward kernels;
then copy the facts node-by-node to the other layers of that kind (equal kinds have equal
canonical node order), and sum per layer.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import operator
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.checkpoint import _StopRecomputationError

from galvatron_fx.ir.graph import LayerCosts, LayerInfo
from galvatron_fx.ir.meta import NodeFacts, copy_costs, cost_field_names, facts, tensor_bytes
from galvatron_fx.ir.recompute import Recompute, checkpoint_fn
from galvatron_fx.ops.attention import sdpa_or_biased
from galvatron_fx.passes.kernel_costs import CostCounter
from galvatron_fx.passes.runner import PassContext, graph_pass
from galvatron_fx.passes.state_writes import writes_state, written_through

log = logging.getLogger(__name__)
aten = torch.ops.aten
_CPU = torch.device("cpu")


# ---- helpers ------------------------------------------------------------------------------

def _concrete(s) -> int:
    if isinstance(s, torch.SymInt):
        hint = s.node.hint
        if hint is None:
            raise ValueError(f"symbolic size {s} has no example value to annotate at")
        return int(hint)
    return int(s)


def _fake_like(val, requires_grad: bool) -> torch.Tensor:
    """A contiguous fake cpu tensor shaped like ``val`` (a FakeTensor from the tracer)."""
    t = torch.empty([_concrete(s) for s in val.shape], dtype=val.dtype, device="cpu")
    if requires_grad and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _materialize(val, requires_grad: bool):
    if isinstance(val, torch.Tensor):
        return _fake_like(val, requires_grad)
    if isinstance(val, (list, tuple)):
        return type(val)(_materialize(v, requires_grad) for v in val)
    if isinstance(val, torch.SymInt):
        return _concrete(val)
    return val


def _storage_key(t: torch.Tensor):
    return StorageWeakRef(t.untyped_storage()).cdata


def _requires_grad(gm: fx.GraphModule, trainable_nodes: set[str]) -> dict[fx.Node, bool]:
    """Which values carry gradient in training: those computed from trainable parameters."""
    rg: dict[fx.Node, bool] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            rg[n] = n.name in trainable_nodes
        elif n.op == "output":
            continue
        else:
            val = n.meta.get("val")
            floating = any(isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
                           for v in tree_flatten(val)[0])
            rg[n] = floating and any(rg.get(a, False) for a in n.all_input_nodes)
    return rg


def _resolve(a, env: dict[fx.Node, object], gm: fx.GraphModule):
    def get(x):
        if isinstance(x, fx.Node):
            if x.op == "get_attr":
                return _getattr(gm, x.target)
            return env[x]
        if isinstance(x, torch.device) and x.type == "meta":
            return _CPU  # costs are measured on fake cpu tensors whatever the model's device
        return x

    return tree_map(get, a) if not isinstance(a, fx.Node) else get(a)


def _getattr(gm: fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _call(n: fx.Node, args, kwargs):
    if n.op == "call_function":
        if n.target is aten.scaled_dot_product_attention.default:  # a trained bias: one op (attention.py)
            return sdpa_or_biased(*args, **kwargs)
        if n.target is aten.histc.default and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point() \
                and args[0].device.type == "cpu":
            # a graph captured for another device counts integer ids (a router's tokens per expert),
            # which the CPU's histogram cannot: the same counts from their float values
            return n.target(args[0].float(), *args[1:], **kwargs)
        return cast(Callable[..., Any], n.target)(*args, **kwargs)
    if n.op == "call_method":
        self_, *rest = args
        return getattr(self_, cast(str, n.target))(*rest, **kwargs)
    raise NotImplementedError(f"cannot annotate node {n.format_node()}: op {n.op!r}")


def _measure_layer(layer: LayerInfo, gm: fx.GraphModule, by_name: dict[str, fx.Node],
                   rg: dict[fx.Node, bool], param_nodes: set[str], shared: set[str], failures: list[str], *,
                   stateful: bool = False) -> tuple[dict[str, NodeFacts], set[str], dict[str, _Variant], set[str]]:
    """Run one layer forward (and each node's backward) on fake tensors (``stateful``: the layer
    writes state in place, :func:`~galvatron_fx.passes.state_writes.writes_state`).

    Returns per-node costs, the names of the ``shared`` inputs (values read by several layers,
    or saved by their producer too) that the layer saves for backward: those are charged once,
    to their producer; and the layer's outputs that it saves itself.
    """
    nodes = [by_name[x] for x in layer.node_names]
    inside = set(nodes)
    costs: dict[str, NodeFacts] = {n.name: NodeFacts() for n in nodes}
    saved_shared: set[str] = set()
    with FakeTensorMode(allow_non_fake_inputs=True):
        env: dict[fx.Node, object] = {}
        not_mine: dict = {}  # storage -> shared input name, or None for parameters
        for n in nodes:
            for a in n.all_input_nodes:
                if a in inside or a in env or a.op == "get_attr":
                    continue
                env[a] = _materialize(a.meta.get("val"), rg.get(a, False))
                if isinstance(env[a], torch.Tensor) and (a.name in param_nodes or a.name in shared):
                    not_mine[_storage_key(cast(torch.Tensor, env[a]))] = a.name if a.name in shared else None

        seen: set = set()
        current: list[str] = [""]

        def pack(t: torch.Tensor):
            key = _storage_key(t)
            if key in not_mine:
                if not_mine[key] is not None:
                    saved_shared.add(not_mine[key])
            elif key not in seen:
                seen.add(key)
                costs[current[0]].saved_bytes += t.untyped_storage().nbytes()
            return t

        # 1. forward of the whole layer, in order, with saved-tensor accounting
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for n in nodes:
                if n.op == "get_attr":
                    env[n] = _getattr(gm, cast(str, n.target))
                    continue
                current[0] = n.name
                args, kwargs = _resolve(n.args, env, gm), _resolve(n.kwargs, env, gm)
                try:
                    with CostCounter() as cc:
                        out = _call(n, args, kwargs)
                    flops, nbytes = cc.flops, cc.bytes
                except Exception as e:
                    # an op that cannot run on these stand-ins (an integer histogram, which the
                    # CPU lacks, in a graph captured for another device): its captured value
                    # stands in, its cost is the bytes it reads and writes
                    failures.append(f"{n.format_node()} (forward): {type(e).__name__}: {str(e)[:200]}")
                    out = _materialize(n.meta.get("val"), rg.get(n, False))
                    flops, nbytes = 0, tensor_bytes(out) + sum(tensor_bytes(a) for a in tree_flatten((args, kwargs))[0]
                                                               if isinstance(a, torch.Tensor))
                env[n] = out
                c = costs[n.name]
                c.fwd_flops, c.fwd_bytes = flops, nbytes
                c.output_bytes = tensor_bytes(out) if not _is_view_node(n) else 0

        # 2. backward of each node in isolation (once per op and inputs alike: an unrolled loop's
        # steps repeat the same few)
        done: dict[tuple, tuple[int, int]] = {}
        for n in nodes:
            if n.op == "get_attr" or not rg.get(n, False):
                continue
            key = _backward_key(n, env, gm, rg)
            if key is not None and key in done:
                costs[n.name].bwd_flops, costs[n.name].bwd_bytes = done[key]
                continue
            try:
                flops, nbytes = _node_backward(n, env, gm, rg)
            except Exception as e:  # an op without a fake backward: recorded, not guessed
                failures.append(f"{n.format_node()}: {type(e).__name__}: {e}")
                continue
            costs[n.name].bwd_flops, costs[n.name].bwd_bytes = flops, nbytes
            if key is not None:
                done[key] = flops, nbytes

        # 3. the whole layer under each recomputation policy: memory kept, FLOPs redone
        ext = [a for a in env if a not in inside and not (isinstance(a, fx.Node) and a.op == "get_attr")]
        variants: dict[str, _Variant] = {}
        if any(rg.get(n, False) for n in nodes):
            run = layer_callable(nodes, ext, [by_name[o] for o in layer.output_names], gm, stand_ins=True)
            owned_inputs = sum(tensor_bytes(env[a]) for a in ext
                               if a.name not in param_nodes and a.name not in shared)
            # a layer that writes state in place (BatchNorm's running statistics) is never
            # recomputed (that would write it twice): its policies all keep what it keeps
            modes = list(Recompute) if not stateful else [Recompute.NONE]
            try:
                is_param = [a.name in param_nodes for a in ext]
                for mode in modes:
                    variants[str(mode)] = _measure_variant(run, [env[a] for a in ext], mode, owned_inputs, is_param)
                for mode in Recompute:
                    variants.setdefault(str(mode), variants[str(Recompute.NONE)])
            except Exception as e:
                failures.append(f"layer {layer.name} under recomputation: {type(e).__name__}: {e}")
                variants = {}
        saved_outputs = {o for o in layer.output_names
                         if isinstance(env.get(by_name[o]), torch.Tensor)
                         and _storage_key(cast(torch.Tensor, env[by_name[o]])) in seen}
    return costs, saved_shared, variants, saved_outputs


@dataclass
class _Variant:
    """One layer under one recomputation policy (see ``galvatron_fx.ir.recompute``)."""

    retained_bytes: int  # memory the layer keeps from its forward until its backward
    bwd_flops: int  # the whole layer's backward, recomputation included
    bwd_bytes: int
    bwd_transient_bytes: int = 0  # the backward's peak above the saved memory (LayerCosts)


def layer_callable(nodes: list[fx.Node], ext: list[fx.Node], outputs: list[fx.Node], gm: fx.GraphModule,
                   *, stand_ins: bool = False):
    """The layer as a function of its external inputs (parameters included), returning its
    outputs. ``stand_ins`` (measuring only, never tracing): a node that cannot run on the
    stand-in tensors yields a stand-in of its captured value."""

    def run(*xs):
        env: dict[fx.Node, object] = dict(zip(ext, xs))
        for n in nodes:
            if n.op == "get_attr":
                env[n] = _getattr(gm, n.target)
                continue
            args, kwargs = _resolve(n.args, env, gm), _resolve(n.kwargs, env, gm)
            try:
                env[n] = _call(n, args, kwargs)
            except _StopRecomputationError:  # (checkpoint's own early stop of a recomputation)
                raise
            except Exception:
                if not stand_ins or n.meta.get("val") is None:
                    raise
                grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in tree_flatten((args, kwargs))[0])
                env[n] = _materialize(n.meta["val"], grad)
        return tuple(env[o] for o in outputs)

    return run


class _LiveTracker(TorchDispatchMode):
    """The storages kernels create while active, and after each kernel the bytes of those still
    alive: the live set of a backward over time."""

    def __init__(self):
        super().__init__()
        self.nbytes: list[int] = []  # per created storage, in order of creation (its index)
        self.born: list[int] = []  # per created storage, the kernel that created it
        # storage key (an address, reused once the storage is freed) -> (index, ref), not yet seen dead
        self.live: dict[int, tuple[int, StorageWeakRef]] = {}
        self.totals: list[int] = []  # per kernel, the bytes of the created storages alive after it
        self._total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # only the live ones are checked (a long backward creates tens of thousands of storages);
        # the weak reference's own test, without its two Python frames (tens of millions of calls)
        expired = torch.UntypedStorage._expired
        for k in [k for k, (_, ref) in self.live.items() if expired(ref.cdata)]:
            self._total -= self.nbytes[self.live.pop(k)[0]]
        if not func.is_view:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    ref = StorageWeakRef(st)
                    if ref.cdata not in self.live:
                        self.live[ref.cdata] = (len(self.nbytes), ref)
                        self.nbytes.append(st.nbytes())
                        self.born.append(len(self.totals))
                        self._total += self.nbytes[-1]
        self.totals.append(self._total)
        return out

    def peak_bytes(self, excluded: set[int]) -> int:
        """The largest live total of created storages, those alive at the end whose key is in
        ``excluded`` left out (alive at the end, each is alive from its creation on)."""
        skip = sorted((self.born[i], self.nbytes[i]) for k, (i, ref) in self.live.items()
                      if k in excluded and not ref.expired())
        peak, left_out, j = 0, 0, 0
        for step, total in enumerate(self.totals):
            while j < len(skip) and skip[j][0] <= step:
                left_out += skip[j][1]
                j += 1
            peak = max(peak, total - left_out)
        return peak


class _StorageTracker(TorchDispatchMode):
    """Records every storage that kernels create, to see which survive the forward."""

    def __init__(self):
        super().__init__()
        self.created: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view of an existing storage (e.g. a transposed weight) creates none
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                self.created.setdefault(ref.cdata, (ref, st.nbytes()))
        return out


def _measure_variant(run, inputs: list, mode: Recompute, owned_input_bytes: int,
                     params: list[bool] | None = None) -> _Variant:
    """Run the layer forward under ``mode`` and measure what stays alive, then its backward
    (without recomputation, also the backward's transient: ``params`` marks which inputs are
    parameters, whose gradients are not transient)."""
    params = params or [False] * len(inputs)
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    is_param = [p for x, p in zip(inputs, params) if isinstance(x, torch.Tensor) and x.requires_grad]
    wrap = checkpoint_fn(mode)
    fn = wrap(run) if wrap is not None else run
    with _StorageTracker() as tracker:
        outs = fn(*inputs)
    out_keys = {_storage_key(o) for o in tree_flatten(outs)[0] if isinstance(o, torch.Tensor)}
    gc.collect(0)  # the young generation holds the forward's cycles; a full pass costs seconds
    alive = [(key, nbytes) for key, (ref, nbytes) in tracker.created.items()
             if key not in out_keys and not ref.expired()]
    log.debug("%s: %d storages alive after forward: %s", mode, len(alive), [b for _, b in alive])
    retained = sum(b for _, b in alive)
    # without recomputation the inputs the ops save are among the retained storages already; a
    # checkpoint holds every input until backward
    kept_inputs = 0 if mode == Recompute.NONE else owned_input_bytes
    grads_of = [o for o in tree_flatten(outs)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    bwd_flops = bwd_bytes = transient = 0
    if grads_of and leaves:
        tangents = [torch.empty_like(o) for o in grads_of]
        # the transient is the plain backward's (LayerCosts keeps that one): the others are not tracked
        track = _LiveTracker() if mode == Recompute.NONE else contextlib.nullcontext()
        with CostCounter() as cc, track:
            grads = torch.autograd.grad(grads_of, leaves, tangents, allow_unused=True)
        bwd_flops, bwd_bytes = cc.flops, cc.bytes
        if isinstance(track, _LiveTracker):
            param_grads = {_storage_key(g) for g, p in zip(grads, is_param) if p and g is not None}
            transient = sum(tensor_bytes(t) for t in tangents) + track.peak_bytes(param_grads)
    return _Variant(retained_bytes=int(retained + kept_inputs), bwd_flops=bwd_flops, bwd_bytes=bwd_bytes,
                    bwd_transient_bytes=int(transient))


def _shared_values(mg, by_name: dict[str, fx.Node]) -> set[str]:
    """Non-parameter values read by two or more layers other than their producer's
    (rotary tables, attention masks, an encoder output read by every decoder block)."""
    readers: dict[str, set[str]] = defaultdict(set)
    for layer in mg.layers:
        for x in layer.input_names:
            readers[x].add(layer.name)
    return {x for x, ls in readers.items() if len(ls - {facts(by_name[x]).layer}) >= 2}


def _views_a_placeholder(n: fx.Node) -> bool:
    """Whether ``n`` is a chain of views ending at a placeholder (shares its storage)."""
    while _is_view_node(n) and n.args and isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return n.op == "placeholder"


def _is_view_node(n: fx.Node) -> bool:
    if n.target is operator.getitem:
        return True
    return isinstance(n.target, torch._ops.OpOverload) and n.target.is_view


def _backward_key(n: fx.Node, env, gm, rg) -> tuple | None:
    """All that :func:`_node_backward` reads of ``n``: its op, its arguments' structure, each
    tensor's shape, strides, dtype and whether it carries gradient, every other argument's value.
    Two nodes with one key have one backward cost. None where an argument is not hashable."""
    def part(a):
        if not isinstance(a, fx.Node):
            return a
        v = env[a] if a.op != "get_attr" else _getattr(gm, a.target)
        g = rg.get(a, False)
        vals = v if isinstance(v, (list, tuple)) else (v,)
        return (type(v).__name__, g) + tuple((tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor)
                                             else x for x in vals)

    flat, spec = tree_flatten((n.args, n.kwargs))
    key = (n.target, str(spec), tuple(part(a) for a in flat))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _node_backward(n: fx.Node, env, gm, rg) -> tuple[int, int]:
    leaves: list[torch.Tensor] = []
    # an in-place op (a router's ``weights /= weights.sum()``) writes a non-leaf copy of its input
    in_place = isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable

    def fresh(a):
        if isinstance(a, fx.Node):
            v = env[a] if a.op != "get_attr" else _getattr(gm, a.target)
            if isinstance(v, torch.Tensor):
                t = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                if rg.get(a, False) and t.is_floating_point():
                    t.requires_grad_(True)
                    leaves.append(t)
                    if in_place:
                        return t.clone()
                return t
            if isinstance(v, (list, tuple)):
                out = []
                for x in v:
                    if isinstance(x, torch.Tensor):
                        t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                        if rg.get(a, False) and t.is_floating_point():
                            t.requires_grad_(True)
                            leaves.append(t)
                        out.append(t)
                    else:
                        out.append(x)
                return type(v)(out)
            return v
        return a

    args = tree_map(fresh, n.args, is_leaf=lambda x: isinstance(x, fx.Node))
    kwargs = tree_map(fresh, n.kwargs, is_leaf=lambda x: isinstance(x, fx.Node))
    if not leaves:
        return 0, 0
    out = _call(n, args, kwargs)
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        return 0, 0
    grads = [torch.empty_like(o) for o in outs]
    with CostCounter() as cc:
        torch.autograd.grad(outs, leaves, grads, allow_unused=True)
    return cc.flops, cc.bytes


def _sum_layer(layer: LayerInfo, by_name: dict[str, fx.Node], param_numel: dict[str, tuple[int, int]],
               variants: dict[str, _Variant]) -> LayerCosts:
    tot = defaultdict(int)
    if variants:
        base = variants["none"]
        tot["bwd_transient_bytes"] = base.bwd_transient_bytes
        for mode in ("selective", "full"):
            v = variants[mode]
            tot[f"activation_bytes_{mode}"] = v.retained_bytes
            tot[f"recompute_flops_{mode}"] = max(0, v.bwd_flops - base.bwd_flops)
            tot[f"recompute_bytes_{mode}"] = max(0, v.bwd_bytes - base.bwd_bytes)
    for name in layer.node_names:
        f = facts(by_name[name])
        for k in ("fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes"):
            tot[k] += getattr(f, k)
        tot["activation_bytes"] += f.saved_bytes
    for mode in ("selective", "full"):  # a policy that is not applied (a layer writing state) keeps it all
        if variants and variants[mode] is variants["none"]:
            tot[f"activation_bytes_{mode}"] = tot["activation_bytes"]
    tot["output_bytes"] = sum(tensor_bytes(by_name[o].meta.get("val")) for o in layer.output_names)
    tot["output_bytes"] = int(_concrete_bytes(tot["output_bytes"]))
    for fqn in layer.param_names:
        if fqn in param_numel:  # trainable parameters, charged to the first layer reading them
            numel, nbytes = param_numel[fqn]
            tot["num_params"] += numel
            tot["param_bytes"] += nbytes
    return LayerCosts(**tot)


def _concrete_bytes(x) -> int:
    return _concrete(x) if isinstance(x, torch.SymInt) else int(x)


@graph_pass(requires=("layers",), produces=("costs",))
def annotate_costs_pass(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    """Annotate every node and layer of ``ctx.graph`` with measured costs (see module doc)."""
    mg = ctx.graph
    by_name = {n.name: n for n in gm.graph.nodes}
    trainable = {n for p in mg.params.values() if p.requires_grad for n in p.nodes}
    param_nodes = {n for p in mg.params.values() for n in p.nodes}
    rg = _requires_grad(gm, trainable)
    for n, r in rg.items():
        facts(n).requires_grad = r
    failures: list[str] = []
    shared = _shared_values(mg, by_name)
    shared_saved: set[str] = set()
    held: set[str] = set()  # layer outputs their producer saves itself: no reader holds them again
    variants: dict[str, dict[str, _Variant]] = {}
    writes = written_through(gm)
    for _kind, layers in mg.kinds().items():
        first = layers[0]
        costs, saved, kind_variants, own = _measure_layer(first, gm, by_name, rg, param_nodes, shared | held,
                                                          failures, stateful=writes_state(gm, set(first.node_names),
                                                                                          writes))
        variants.update({layer.name: kind_variants for layer in layers})
        # the same inputs and outputs, by position, of every layer of this kind
        pos = [first.input_names.index(x) for x in saved]
        out_pos = [first.output_names.index(x) for x in own]
        for layer in layers:
            shared_saved.update(layer.input_names[i] for i in pos)
            held.update(layer.output_names[i] for i in out_pos)
        for name, c in costs.items():
            f = facts(by_name[name])
            for k in cost_field_names():
                setattr(f, k, int(getattr(c, k)))
        for other in layers[1:]:
            for a, b in zip(first.node_names, other.node_names):
                copy_costs(by_name[a], by_name[b])
    if failures:
        log.warning("no backward cost for %d node(s) (their ops have no fake backward); first: %s",
                    len(failures), failures[0])
    # a shared value that some reader saves is held once, by the layer that produced it
    # (unless it is a view of a parameter, buffer or input: then it holds no memory of its own)
    for x in sorted(shared_saved - held):
        producer = by_name[x]
        if facts(producer).layer is not None and not _views_a_placeholder(producer):
            facts(producer).saved_bytes += int(_concrete_bytes(tensor_bytes(producer.meta.get("val"))))
    param_numel = {p.name: (p.numel, p.nbytes) for p in mg.params.values()
                   if not p.is_buffer and p.requires_grad}
    owner = {p.name: p.layers[0] for p in mg.params.values() if p.layers}
    for layer in mg.layers:
        mine = {f for f in layer.param_names if owner.get(f) == layer.name}
        layer_numel = {f: v for f, v in param_numel.items() if f in mine}
        layer.costs = _sum_layer(layer, by_name, layer_numel, variants.get(layer.name, {}))
    return gm
