"""In-place writes in a graph: which arguments ops write (the schema's, and those batch norm's
hides), the views they reach them through, and which layers write state made outside them.

Read by the DTensor interpreter (values written through are passed as they are), the local
trace (buffers a layer writes are handed back), the placement ILP (no partial strategy for a
written value) and recomputation (a layer writing state is never recomputed: that would write
it twice).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from galvatron_fx.ir.graph import ModelGraph

aten = torch.ops.aten

__all__ = ["HIDDEN_WRITES", "stateful_kinds", "writes_state", "written_through"]


# ops whose schema hides a write: (index of the ``training`` flag, indices of the arguments
# written when it is set) — batch norm's running statistics
HIDDEN_WRITES = {aten.native_batch_norm.default: (5, (3, 4)), aten._native_batch_norm_legit.default: (5, (3, 4)),
                 aten.batch_norm.default: (5, (3, 4)), aten.instance_norm.default: (5, (3, 4))}


def written_through(gm: fx.GraphModule) -> set[tuple[fx.Node, fx.Node]]:
    """``(op, argument)`` pairs the interpreter must pass as they are: an argument an op writes in
    place, and along its chain of views the base each view reads. Redistributing any of them
    would hand the op a copy, and the write would be lost (``ids.new_zeros(...)`` filled through
    ``[..., 1:] = labels[..., :-1]``: T5's decoder-input shift)."""
    out: set[tuple[fx.Node, fx.Node]] = set()
    for n in gm.graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
            continue
        hidden = HIDDEN_WRITES.get(t)
        for i, (a, arg) in enumerate(zip(n.args, t._schema.arguments)):
            writes = arg.alias_info is not None and arg.alias_info.is_write
            if hidden is not None and i in hidden[1] and len(n.args) > hidden[0] and n.args[hidden[0]] is True:
                writes = True
            if not (isinstance(a, fx.Node) and writes):
                continue
            user, base = n, a
            while True:
                out.add((user, base))
                bt = base.target
                if base.op != "call_function" or not isinstance(bt, torch._ops.OpOverload) or not bt.is_view \
                        or not base.args or not isinstance(base.args[0], fx.Node):
                    break
                user, base = base, base.args[0]
    return out


def writes_state(gm: fx.GraphModule, names: set[str], writes: set | None = None) -> bool:
    """Whether the nodes ``names`` (a layer's) write in place a value made outside them (a
    buffer, a parameter, another layer's output), directly or through a view of it: running
    them twice (recomputation) would write it twice. ``writes``: ``written_through(gm)``, where
    the caller has it."""
    writes = written_through(gm) if writes is None else writes
    return any(op.name in names and base.name not in names for op, base in writes)


def stateful_kinds(mg: ModelGraph) -> frozenset[str]:
    """The layer kinds that write state in place (:func:`writes_state`), cached on the graph."""
    cached = mg.gm.meta.get("gfx_stateful_kinds")
    if cached is not None and cached[0] == len(mg.layers):
        return cached[1]
    writes = written_through(mg.gm)
    kinds = frozenset(layer.kind for layer in mg.layers if writes_state(mg.gm, set(layer.node_names), writes))
    mg.gm.meta["gfx_stateful_kinds"] = (len(mg.layers), kinds)
    return kinds
