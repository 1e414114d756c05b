"""mark_recompute — the backward of a recomputed layer as it runs: its forward again, then its backward.

Contract: takes a :class:`~galvatron_fx.ir.program.LayerGraphs` whose strategy recomputes
(``full`` or ``selective``, :mod:`galvatron_fx.ir.recompute`); sets ``recompute_bw``: one graph
taking the layer's parameters and inputs (``full``; ``selective`` also the outputs of the
kernels it keeps, placeholders named ``kept_<node>``), then the output gradients, that runs the
forward's ops again (each tagged as fx tags a recomputed node, ``node.meta["recompute"] =
CheckpointPolicy.PREFER_RECOMPUTE``, which its printed code shows) and feeds what they make to
the backward in place of the saved tensors; ``recompute`` (the mode); and the forward's
collectives again at the head of ``bw_collectives``. ``fw`` and ``bw`` are
not changed: the runtime runs them under ``torch.utils.checkpoint``, which does the same.
Layers that do not recompute are passed through.

Terms: *kept* kernels are those whose outputs selective recomputation saves
(:data:`galvatron_fx.ir.recompute.SAVE_OUTPUTS_OF`: matmuls, convolutions, attention).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from galvatron_fx.ir.recompute import SAVE_OUTPUTS_OF, Recompute
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["mark_recompute_pass", "recompute_backward"]


def _kept(n: fx.Node) -> bool:
    return n.op == "call_function" and getattr(n.target, "_overloadpacket", None) in SAVE_OUTPUTS_OF


def recompute_backward(fw: fx.GraphModule, bw: fx.GraphModule, num_outputs: int, mode: str) -> fx.GraphModule:
    """``bw`` preceded by ``fw``'s ops (see module doc)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    fw_nodes = list(fw.graph.nodes)
    for n in fw_nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
            env[n].meta = dict(n.meta)
    kept = [n for n in fw_nodes if mode == Recompute.SELECTIVE and _kept(n)]
    for n in kept:
        env[n] = g.placeholder(f"kept_{n.name}")
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


@graph_pass(requires=("hoisted",), produces=("recompute",))
def mark_recompute_pass(prog, ctx: PassContext):
    mode = Recompute(getattr(prog.strategy, "recompute", Recompute.NONE))
    prog.recompute = str(mode)
    if mode != Recompute.NONE:
        # the forward's collectives run again in backward (checkpointing reruns the forward)
        prog.bw_collectives = [dataclasses.replace(r, phase="bwd") for r in prog.fw_collectives] + \
            list(prog.bw_collectives)
        if prog.simple:
            prog.recompute_bw = recompute_backward(prog.fw, prog.bw, len(prog.trace.out_grad), mode)
    return prog
