"""Hoist the all-reduces of small saved tensors out of a layer's backward graph, so that they
run from forward (see :func:`hoist_saved_all_reduces`).

Contract: edits a backward graph in place and returns what it took out; the runtime
(:class:`galvatron_fx.runtime.lowered._RunGraphs`) launches those all-reduces after the forward
and waits for them at the start of backward. :func:`hoist_saved_collectives_pass` does this to
a lowered layer (:class:`~galvatron_fx.ir.program.LayerGraphs`) whose graphs have the simple
form the runtime runs (:func:`simple_form`), and records what it hoisted in ``hoisted``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.fx as fx

from galvatron_fx.ir.program import HoistedReduce
from galvatron_fx.passes.clean_up_graphs import recompiled
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["HOIST_MAX_BYTES", "hoist_saved_all_reduces", "hoist_saved_collectives_pass", "simple_form"]


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT}
HOIST_MAX_BYTES = 64 * 2**10  # larger saved tensors are not held reduced from forward to backward


def hoist_saved_all_reduces(bw: fx.GraphModule, num_saved: int) -> list[HoistedReduce]:
    """Take out of ``bw`` (a backward graph whose first ``num_saved`` placeholders are tensors
    its forward saved) every functional all-reduce of a small saved tensor that only the
    all-reduce reads; its wait's readers read the placeholder instead. Returns ``(saved index,
    reduce op, group name)`` per all-reduce taken out: :class:`_RunGraphs` launches them
    asynchronously as soon as the forward made the tensor, and waits at the start of backward.

    Such a collective depends on forward values only, yet in the backward graph it blocks: each
    rank waits there for the slowest (DTensor's ``nll_loss_backward`` sums the loss's
    ``total_weight`` over dp this way, once per step). Launched from forward, it runs while the
    forward goes on, and backward waits only for what is not done yet. Every rank runs the same
    forward, so the collectives keep one order."""
    saved = [n for n in bw.graph.nodes if n.op == "placeholder"][:num_saved]
    index = {n: i for i, n in enumerate(saved)}
    hoisted: list[HoistedReduce] = []
    for n in list(bw.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops._c10d_functional.all_reduce.default:
            continue
        src, op, group = n.args[:3]
        val = src.meta.get("val") if isinstance(src, fx.Node) else None
        if src not in index or len(src.users) != 1 or op not in _REDUCE_OPS or len(n.users) != 1 \
                or not isinstance(val, torch.Tensor) or val.numel() * val.element_size() > HOIST_MAX_BYTES:
            continue
        (wait,) = n.users
        if wait.target is not torch.ops._c10d_functional.wait_tensor.default:
            continue
        wait.replace_all_uses_with(src)
        bw.graph.erase_node(wait)
        bw.graph.erase_node(n)
        hoisted.append(HoistedReduce(index[src], _REDUCE_OPS[op], group))
    recompiled(bw, len(hoisted))
    return hoisted


def simple_form(fw: fx.GraphModule, bw: fx.GraphModule, out_grad: list[bool]) -> bool:
    """Whether a layer's graphs have the form the runtime calls directly: the forward returns
    the outputs then the saved tensors, the backward takes the saved tensors then one tangent
    per output that requires grad (no input mutations, no outputs AOTAutograd regenerates, no
    saved symbolic sizes)."""
    (fw_out,) = [n for n in fw.graph.nodes if n.op == "output"]
    returned = len(fw_out.args[0])
    ph = [n for n in bw.graph.nodes if n.op == "placeholder"]
    tangents = [n for n in ph if n.name.startswith("tangents")]
    saved = ph[:len(ph) - len(tangents)]
    return (ph[len(saved):] == tangents
            and all(isinstance(n.meta.get("val"), torch.Tensor) for n in saved)
            and returned - len(saved) == len(out_grad)
            and len(tangents) == sum(out_grad))


@graph_pass(requires=("cleaned",), produces=("hoisted",))
def hoist_saved_collectives_pass(prog, ctx: PassContext):
    out_grad = prog.trace.out_grad
    prog.simple = simple_form(prog.fw, prog.bw, out_grad)
    if prog.simple:
        num_saved = sum(1 for n in prog.bw.graph.nodes if n.op == "placeholder") - sum(out_grad)
        prog.hoisted = hoist_saved_all_reduces(prog.bw, num_saved)
    return prog
