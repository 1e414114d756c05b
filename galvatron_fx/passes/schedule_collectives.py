"""Schedule a layer's collectives: issue each as soon as its inputs exist, wait for it as late
as its result is needed, so that the ops in between run while it is in flight.

Contract: requires ``"hoisted"`` (a :class:`~galvatron_fx.ir.program.LayerGraphs` whose
forward and backward are cleaned functional graphs); produces ``"scheduled"``: both graphs hold
the same nodes, reordered — never an op added, removed or changed, so the numerics are those of
the unscheduled graphs. A functional collective (``_c10d_functional.*``) returns at once and
its ``wait_tensor`` blocks until it is done; traced graphs put the wait right after the
collective. This pass moves

1. each collective, with the ops that compute its input and come after the last one it needs
   from elsewhere (its *cone*: e.g. a loss's count of targets, made from the labels alone), up
   to just after the latest input the cone reads — when the cone holds no matmul (a
   tensor-parallel all-reduce of a matmul's output stays where it is: moving the matmul would
   only reorder compute); and
2. each ``wait_tensor`` down to just before the first op that reads its result.

A mean loss over data-parallel ranks whose count of targets is not folded
(:mod:`~galvatron_fx.passes.fold_input_reductions`), for instance, all-reduces that count while
its log-softmax runs, instead of before it.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from galvatron_fx.passes.clean_up_graphs import recompiled
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["schedule_collectives", "schedule_collectives_pass"]

_COLLECTIVE_NS = ("_c10d_functional", "c10d_functional")
_HEAVY = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
          torch.ops.aten.baddbmm.default, torch.ops.aten.convolution.default}


def _is_collective(n: fx.Node) -> bool:
    t = n.target
    return n.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.namespace in _COLLECTIVE_NS \
        and t._overloadpacket is not torch.ops._c10d_functional.wait_tensor


def _is_wait(n: fx.Node) -> bool:
    return n.op == "call_function" and n.target is torch.ops._c10d_functional.wait_tensor.default


def _cone(c: fx.Node, order: dict[fx.Node, int], floor: int) -> list[fx.Node] | None:
    """The ops after position ``floor`` that ``c`` depends on, in graph order (None when one of
    them is heavy, a collective, a wait or mutates)."""
    seen: set[fx.Node] = set()
    stack = list(c.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in seen or order[n] <= floor or n.op != "call_function":
            continue
        t = n.target
        if t in _HEAVY or _is_collective(n) or _is_wait(n) or \
                (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable):
            return None
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return sorted(seen, key=order.__getitem__)


def schedule_collectives(gm: fx.GraphModule) -> int:
    """Reorder ``gm`` as the module doc says; returns how many nodes moved."""
    moved = 0
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    anchor = max((n for n in nodes if n.op == "placeholder"), key=order.__getitem__, default=None)
    if anchor is None:
        return 0
    for c in [n for n in nodes if _is_collective(n)]:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        # the earliest place: after the latest input its cone reads from before the anchor
        cone = _cone(c, order, order[anchor])
        if cone is None:
            continue
        outside = [a for n in (*cone, c) for a in n.all_input_nodes if a not in cone]
        after = max(outside + [anchor], key=order.__getitem__)
        group = [*cone, c]
        if all(order[n] == order[after] + 1 + i for i, n in enumerate(group)):
            continue  # already there
        at = after
        for n in group:
            at.append(n)
            at = n
            moved += 1
    for w in [n for n in gm.graph.nodes if _is_wait(n)]:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        users = sorted(w.users, key=order.__getitem__)
        if users and order[users[0]] > order[w] + 1:
            users[0].prepend(w)
            moved += 1
    return recompiled(gm, moved)


@graph_pass(requires=("hoisted",), produces=("scheduled",))
def schedule_collectives_pass(prog, ctx: PassContext):
    """Both graphs of a lowered layer with their collectives scheduled (see module doc)."""
    for gm in (prog.fw, prog.bw):
        if gm is not None:
            schedule_collectives(gm)
    return prog
