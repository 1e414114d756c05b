"""Clean up a layer's lowered graphs: drop the ops nothing reads, and the views that change nothing.

Contract: ``gm`` is a functional ATen graph (AOTAutograd's forward or backward of one layer,
see :mod:`galvatron_fx.passes.partition_graphs`); each function edits it in place, lints and recompiles
it when it changed something, and returns how many nodes it removed. Collectives and mutating
ops are never removed. Run :func:`drop_identity_views` before :func:`drop_unused_ops`. :func:`clean_up_graphs_pass`
runs both on a lowered layer's forward and backward.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from galvatron_fx.passes.runner import PassContext, graph_pass

aten = torch.ops.aten

__all__ = ["clean_up_graphs_pass", "drop_identity_views", "drop_unused_ops", "recompiled"]


def recompiled(gm: fx.GraphModule, changed: int) -> int:
    """Lint and regenerate ``gm``'s code after ``changed`` edits (none: nothing to do)."""
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def drop_unused_ops(gm: fx.GraphModule) -> int:
    """Remove ATen ops whose results nothing reads; returns how many.

    fx's own dead-code elimination keeps ops tagged ``nondeterministic_seeded``, and AOTAutograd's
    backward graph can hold such a leftover: the CPU flash-attention forward (its dropout makes it
    "seeded" even at ``dropout_p=0``), recomputed and discarded in every attention layer's
    backward. Mutating ops and collectives are kept."""
    removed = 0
    for n in reversed(list(gm.graph.nodes)):
        t = n.target
        if n.op != "call_function" or n.users or not isinstance(t, torch._ops.OpOverload):
            continue
        if t._schema.is_mutable or t.namespace in ("_c10d_functional", "c10d_functional", "_dtensor"):
            continue
        gm.graph.erase_node(n)
        removed += 1
    return recompiled(gm, removed)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def drop_identity_views(gm: fx.GraphModule) -> int:
    """Replace views to a tensor's own shape and strides (AOTAutograd's graphs hold one per
    parameter and layer boundary, each a dispatched op at run time), and double transposes, by
    their input; returns how many. The graphs are functional (no op mutates a view), so the alias
    is safe. Run :func:`drop_unused_ops` after it."""
    removed = 0
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is aten.t.default and isinstance(n.args[0], fx.Node) \
                and n.args[0].op == "call_function" and n.args[0].target is aten.t.default:
            n.replace_all_uses_with(n.args[0].args[0])  # t(t(x)) is x (a weight gradient's double transpose)
            gm.graph.erase_node(n)
            removed += 1
            continue
        if n.op != "call_function" or n.target not in _VIEWS or not isinstance(n.args[0], fx.Node):
            continue
        src, out = n.args[0].meta.get("val"), n.meta.get("val")
        if isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.shape == out.shape \
                and src.stride() == out.stride() and src.dtype == out.dtype:
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
            removed += 1
    return recompiled(gm, removed)


@graph_pass(requires=("partitioned",), produces=("cleaned",))
def clean_up_graphs_pass(prog, ctx: PassContext):
    """Both graphs of a lowered layer (:class:`~galvatron_fx.ir.program.LayerGraphs`) without
    identity views and dead ops; its collectives (:func:`~galvatron_fx.ir.program.collectives_of`)
    recorded as the program issues them."""
    from galvatron_fx.ir.program import collectives_of

    for gm in (prog.fw, prog.bw):
        drop_unused_ops(gm)
        if drop_identity_views(gm):
            drop_unused_ops(gm)
    prog.fw_collectives = collectives_of(prog.fw, "fwd")
    prog.bw_collectives = collectives_of(prog.bw, "bwd")
    return prog
