"""split_stages — per pipeline stage, the step graph: the layers' forward and backward calls in
order, with the sends and receives at the stage's boundaries and its data-parallel collectives.

Contract: a program pass over a :class:`~galvatron_fx.ir.program.LoweredProgram` whose gradient
buckets are named (:mod:`~galvatron_fx.passes.bucket_gradients`); sets ``program.stages``: stage
-> ``fx.GraphModule`` of one micro-batch's step on that stage, for reading (its nodes call the
markers of :mod:`galvatron_fx.ir.program`: ``layer_forward``, ``layer_backward``, ``send``,
``recv``, ``send_grad``, ``recv_grad``, ``fsdp_all_gather``, ``fsdp_reduce_scatter``,
``all_reduce_bucket``; ``layer_forward`` and ``layer_backward`` name the layer, whose graphs are
the program's). The runtime's pipeline (``torch.distributed.pipelining``) sends what the
graph's ``send`` nodes name, at the same boundaries.

Algorithm: walk the layers in order; a value a layer reads from a layer of another stage is
received (a user input is a placeholder), one read by another stage is sent after the layer that
makes it. The backward walks the stage's layers in reverse: a sent value's gradient is received
before its maker's backward, a received value's gradient sent after its reader's. FSDP gathers
precede a layer's forward (and, ZeRO-3, its backward), its reduce-scatter follows its backward;
a DDP bucket is all-reduced after the backward of the layer that completes it.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from galvatron_fx.ir import program as ops
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["split_stages_pass"]


@graph_pass(requires=("buckets",), produces=("stages",))
def split_stages_pass(program, ctx: PassContext):
    mg = ctx.graph
    by_name = {lay.name: lay for lay in program.layers}
    layers = [(info, by_name[info.name]) for info in mg.layers if info.name in by_name]
    params = {node for p in mg.params.values() for node in p.nodes}
    maker: dict[str, str] = {}  # value -> the layer that makes it
    for info, _ in layers:
        for v in info.output_names:
            maker[v] = info.name
    stage_of = {lay.name: lay.stage for _, lay in layers}
    readers: dict[str, set[int]] = {}
    for info, lay in layers:
        for a in mg.layer_inputs(info):
            if a.name not in params:
                readers.setdefault(a.name, set()).add(lay.stage)
    program.stages = {}
    for stage in sorted({lay.stage for _, lay in layers}):
        g = fx.Graph()
        env: dict[str, fx.Node] = {}
        received: list[tuple[str, int, str]] = []  # (value, from stage, reading layer)
        sent: list[tuple[str, int, str]] = []  # (value, to stage, making layer)
        mine = [(info, lay) for info, lay in layers if lay.stage == stage]
        for info, _ in mine:  # user inputs first: placeholders lead the graph
            for a in mg.layer_inputs(info):
                if a.name not in params and a.name not in maker and a.name not in env:
                    env[a.name] = g.placeholder(a.name)
        for info, lay in mine:
            args = []
            for a in mg.layer_inputs(info):
                if a.name in params:
                    continue
                if a.name not in env:  # made on another stage
                    src = stage_of[maker[a.name]]
                    env[a.name] = g.call_function(ops.recv, (a.name, src))
                    received.append((a.name, src, info.name))
                args.append(env[a.name])
            if lay.fw_dp:
                g.call_function(ops.fsdp_all_gather, (info.name, lay.fw_dp[0].bytes))
            out = g.call_function(ops.layer_forward, (info.name, *args))
            for k, v in enumerate(info.output_names):
                env[v] = out if len(info.output_names) == 1 else g.call_function(ops._getitem, (out, k))
                for dst in sorted(readers.get(v, set()) - {stage}):
                    g.call_function(ops.send, (env[v], dst))
                    sent.append((v, dst, info.name))
        buckets: dict[str, list[tuple[int, ops.GradBucket]]] = {}
        for i, b in enumerate(program.buckets):
            if b.stage == stage:
                buckets.setdefault(b.after_layer, []).append((i, b))
        for info, lay in reversed(mine):
            for v, dst, made_by in sent:
                if made_by == info.name:
                    g.call_function(ops.recv_grad, (v, dst))
            if any(r.op == "all_gather" for r in lay.bw_dp):
                g.call_function(ops.fsdp_all_gather, (info.name, lay.fw_dp[0].bytes))
            g.call_function(ops.layer_backward, (info.name,))
            if any(r.op == "reduce_scatter" for r in lay.bw_dp):
                g.call_function(ops.fsdp_reduce_scatter, (info.name, lay.bw_dp[-1].bytes))
            for i, b in buckets.get(info.name, []):
                g.call_function(ops.all_reduce_bucket, (i, b.bytes, len(b.params)))
            for v, src, read_by in received:
                if read_by == info.name:
                    g.call_function(ops.send_grad, (v, src))
        g.output(None)
        program.stages[stage] = fx.GraphModule(torch.nn.Module(), g)
    return program
