"""Recomputation in a lowered layer's graphs: two passes.

tag_recompute — before the partition: takes a :class:`~galvatron_fx.ir.program.LayerGraphs`
holding its joint graph; a layer whose strategy is ``selective``
(:mod:`galvatron_fx.ir.recompute`) has its forward ops tagged with the policy
(:func:`~galvatron_fx.ir.recompute.tag_selective`: ``node.meta["recompute"]``, one
``ac_graph_id``), which :mod:`~galvatron_fx.passes.partition_graphs` honours: the forward saves
what the policy keeps and the backward graph makes the rest again, tagged (its printed code shows
``recompute: PREFER_RECOMPUTE``). That backward is what runs: no ``torch.utils.checkpoint``
around the layer, and its collectives are those its graph issues (kept, not repeated). Other
layers are passed through.

mark_recompute — the backward of a fully recomputed layer as it runs: its forward again, then its
backward. Takes a layer whose strategy is ``full``; sets ``recompute_bw``: one graph taking the
layer's parameters and inputs, then the output gradients, that runs the forward's ops again (each
tagged as fx tags a recomputed node, ``node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE``)
and feeds what they make to the backward in place of the saved tensors; ``recompute`` (the mode,
for every layer); and the forward's collectives again at the head of ``bw_collectives``. ``fw``
and ``bw`` are not changed: the runtime runs them under ``torch.utils.checkpoint``, which does
the same.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from galvatron_fx.ir.recompute import Recompute, tag_selective
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["mark_recompute_pass", "recompute_backward", "tag_recompute_pass"]


def recompute_backward(fw: fx.GraphModule, bw: fx.GraphModule, num_outputs: int) -> fx.GraphModule:
    """``bw`` preceded by ``fw``'s ops (see module doc)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    fw_nodes = list(fw.graph.nodes)
    for n in fw_nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
            env[n].meta = dict(n.meta)
    bw_ph = [n for n in bw.graph.nodes if n.op == "placeholder"]
    (fw_out,) = [n for n in fw_nodes if n.op == "output"]
    saved = list(fw_out.args[0])[num_outputs:]
    tangents = bw_ph[len(saved):]
    for n in tangents:
        env[n] = g.placeholder(n.name)
        env[n].meta = dict(n.meta)
    for n in fw_nodes:
        if n.op in ("placeholder", "output") or n in env:
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
        env[n].meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
    for ph, value in zip(bw_ph, saved):
        env[ph] = env[value] if isinstance(value, fx.Node) else value
    for n in bw.graph.nodes:
        if n.op == "placeholder":
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    g.eliminate_dead_code(is_impure_node=lambda n: getattr(n.target, "namespace", "") == "_c10d_functional"
                          or n.op in ("placeholder", "output"))
    return fx.GraphModule(torch.nn.Module(), g)


@graph_pass(requires=("joint",), produces=("recompute_tags",))
def tag_recompute_pass(prog, ctx: PassContext):
    if Recompute(getattr(prog.strategy, "recompute", Recompute.NONE)) == Recompute.SELECTIVE:
        tag_selective(prog.trace.joint)
    return prog


@graph_pass(requires=("hoisted",), produces=("recompute",))
def mark_recompute_pass(prog, ctx: PassContext):
    mode = Recompute(getattr(prog.strategy, "recompute", Recompute.NONE))
    prog.recompute = str(mode)
    if mode == Recompute.FULL:
        # the forward's collectives run again in backward (checkpointing reruns the forward)
        prog.bw_collectives = [dataclasses.replace(r, phase="bwd") for r in prog.fw_collectives] + \
            list(prog.bw_collectives)
        if prog.simple:
            prog.recompute_bw = recompute_backward(prog.fw, prog.bw, len(prog.trace.out_grad))
    return prog
