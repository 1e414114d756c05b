"""measure_lowered — what a lowered layer keeps for backward and the peak its backward adds, read
off its graphs; and its collectives as the cost model's records.

Contract: takes a :class:`~galvatron_fx.ir.program.LayerGraphs` after the layer passes (fake
values in ``node.meta["val"]``); reads its graphs, changes nothing, runs nothing.

Terms: *saved* bytes are the storages the forward returns for backward (each once; parameters and
their views excluded), on one rank at the lowered shape. The *backward transient* is the peak,
over the backward graph in order, of the bytes its ops allocate (views and in-place results
allocate nothing; a value is freed after its last use; the gradients of parameters, which the
step keeps, are not counted); the saved tensors stay alive to its end (the runtime's autograd
node holds them until the backward returns).

Algorithm: a liveness walk over the graph (the order fx's generated code runs it in).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from galvatron_fx.ir.layer_option import CommEvent
from galvatron_fx.ir.program import each_collective

__all__ = ["backward_transient_bytes", "comm_events", "saved_bytes"]


def _storage_key(v):
    try:
        return id(v.untyped_storage())
    except Exception:  # a fake tensor without storage: its own bytes
        return id(v)


def _bytes(v) -> int:
    if not isinstance(v, torch.Tensor):
        return 0
    try:
        return int(v.untyped_storage().nbytes())
    except Exception:
        return int(v.numel() * v.element_size())


def _outputs(gm: fx.GraphModule) -> list:
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return list(out.args[0])


def saved_bytes(lg) -> int:
    """Bytes of the tensors ``lg``'s forward saves for backward (see module doc)."""
    fw = lg.fw
    num_params = len(lg.param_names)
    ph = [n for n in fw.graph.nodes if n.op == "placeholder"]
    param_storages = {_storage_key(n.meta.get("val")) for n in ph[:num_params] if isinstance(n.meta.get("val"), torch.Tensor)}
    seen: set[int] = set()
    total = 0
    for n in _outputs(fw)[len(lg.trace.out_grad):]:
        v = n.meta.get("val") if isinstance(n, fx.Node) else None
        if not isinstance(v, torch.Tensor):
            continue
        key = _storage_key(v)
        if key in param_storages or key in seen or _reads_only_params(n, set(ph[:num_params])):
            continue
        seen.add(key)
        total += _bytes(v)
    return total


def _reads_only_params(n: fx.Node, params: set[fx.Node]) -> bool:
    """A value computed from parameters alone by views (a transposed weight): not an activation."""
    while n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.is_view:
        if not n.args or not isinstance(n.args[0], fx.Node):
            return False
        n = n.args[0]
    return n in params


def _allocates(n: fx.Node) -> bool:
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return False
    return not t.is_view and not any(r.alias_info is not None for r in t._schema.returns)


def backward_transient_bytes(lg) -> int:
    """The peak the backward of ``lg`` adds above what the forward saved (see module doc)."""
    bw = lg.bw
    nodes = list(bw.graph.nodes)
    ph = [n for n in nodes if n.op == "placeholder"]
    outs = _outputs(bw)
    num_params = len(lg.param_names)
    param_grads = {n for n in outs[:num_params] if isinstance(n, fx.Node)}
    last_use: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            last_use[a] = n
    kept = set(n for n in outs if isinstance(n, fx.Node))
    num_tangents = sum(lg.trace.out_grad)
    saved = ph[:len(ph) - num_tangents]
    live = sum(_bytes(n.meta.get("val")) for n in ph[len(saved):])  # the output gradients arrive
    peak = live
    frees: dict[fx.Node, list[fx.Node]] = {}
    for v, user in last_use.items():
        if v not in kept:
            frees.setdefault(user, []).append(v)
    allocated: set[fx.Node] = set()
    for n in nodes:
        if n.op == "call_function" and _allocates(n) and n not in param_grads:
            live += _bytes(n.meta.get("val")) if isinstance(n.meta.get("val"), torch.Tensor) else \
                sum(_bytes(x) for x in (n.meta.get("val") or ()) if isinstance(x, torch.Tensor))
            allocated.add(n)
        peak = max(peak, live)
        for v in frees.get(n, ()):
            if v in allocated:
                live -= _bytes(v.meta.get("val")) if isinstance(v.meta.get("val"), torch.Tensor) else 0
    return max(0, int(peak))


def _batch_free(lg) -> tuple[set, set]:
    """Nodes of the forward and the backward graph computed from parameters and factories
    alone (a position embedding's lookup, a weight's slice): their bytes do not grow with the
    batch."""
    fw_free: set = set()
    ph = [n for n in lg.fw.graph.nodes if n.op == "placeholder"]
    fw_free |= set(ph[:len(lg.param_names)])
    for n in lg.fw.graph.nodes:
        if n.op == "call_function" and all(a in fw_free for a in n.all_input_nodes):
            fw_free.add(n)
    (out,) = [n for n in lg.fw.graph.nodes if n.op == "output"]
    saved = list(out.args[0])[len(lg.trace.out_grad):]
    bw_ph = [n for n in lg.bw.graph.nodes if n.op == "placeholder"]
    bw_free = {p for p, v in zip(bw_ph, saved) if v in fw_free}
    for n in lg.bw.graph.nodes:
        if n.op == "call_function" and all(a in bw_free for a in n.all_input_nodes):
            bw_free.add(n)
    return fw_free, bw_free


def _param_grad_only(lg) -> set:
    """Backward nodes that only parameters' gradients are computed from (not the inputs'):
    a weight gradient's all-reduce moves the weight's bytes, whatever the batch."""
    (out,) = [n for n in lg.bw.graph.nodes if n.op == "output"]
    outs = list(out.args[0])
    n_params = len(lg.param_names)

    def ancestors(roots) -> set:
        seen, stack = set(), [r for r in roots if isinstance(r, fx.Node)]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(n.all_input_nodes)
        return seen

    return ancestors(outs[:n_params]) - ancestors(outs[n_params:])


def comm_events(lg) -> tuple[CommEvent, ...]:
    """``lg``'s collectives forward and backward (hoisted ones in backward, where DTensor put
    them) as the cost model's records. A collective is *per sample* unless its tensor is
    computed from parameters and factories alone, feeds only parameters' gradients, or is a
    scalar."""
    fw_free, bw_free = _batch_free(lg)
    bw_free = bw_free | _param_grad_only(lg)
    out = []
    for (phase, gm), fixed in zip((("fwd", lg.fw), ("bwd", lg.bw)), (fw_free, bw_free)):
        for n, x, op, _size, nbytes in each_collective(gm):
            per_sample = x not in fixed and n not in fixed and x.meta["val"].numel() > 1
            out.append(CommEvent(phase, f"lowered:{n.target._opname}{list(x.meta['val'].shape)}", op, int(nbytes),
                                 0.0, per_sample=per_sample))
    for i, _op, _group in lg.hoisted:
        out.append(CommEvent("bwd", f"lowered:hoisted[{i}]", "all_reduce", _hoisted_bytes(lg, i), 0.0, per_sample=False))
    return tuple(out)


def _hoisted_bytes(lg, i: int) -> int:
    (out,) = [n for n in lg.fw.graph.nodes if n.op == "output"]
    v = out.args[0][len(lg.trace.out_grad) + i].meta.get("val")
    return int(v.numel() * v.element_size()) if isinstance(v, torch.Tensor) else 0
