"""partition_graphs — split a lowered layer's joint graph into its forward and its backward.

Contract: takes a :class:`~galvatron_fx.ir.program.LayerGraphs` holding the joint forward-backward
graph :mod:`~galvatron_fx.passes.apply_placements` traced; sets ``fw`` (takes the parameters'
local shards and the inputs' local tensors; returns the outputs, then the tensors saved for
backward) and ``bw`` (takes the saved tensors, then one gradient per output that requires
grad; returns one gradient per parameter and input). The joint graph is not changed.

Algorithm: AOTAutograd's default partitioner, the one its own runtime uses, so that the graphs
are those a first eager step would trace: every forward op stays in forward, and the backward
keeps what the forward computed — except what selective recomputation tagged
(:mod:`~galvatron_fx.passes.mark_recompute`, ``tag_recompute``), which the backward makes again.
"""

from __future__ import annotations

from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["partition_graphs_pass"]


@graph_pass(requires=("joint", "recompute_tags"), produces=("partitioned",))
def partition_graphs_pass(prog, ctx: PassContext):
    from torch._functorch.partitioners import default_partition

    tr = prog.trace
    prog.fw, prog.bw = default_partition(tr.joint, tr.joint_inputs, num_fwd_outputs=tr.num_fwd_outputs)
    return prog
