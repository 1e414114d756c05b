"""bucket_gradients — the program's fused data-parallel communication, as named regions.

Contract: a program pass over a :class:`~galvatron_fx.ir.program.LoweredProgram` whose layers are
lowered. Sets ``program.buckets`` (per stage and data-parallel group shape: the DDP gradient
buckets, each the parameters one all-reduce sums, in the order backward finishes them, and the
layer whose backward completes it) and, per layer, ``fw_dp``/``bw_dp`` (FSDP's collectives per
micro-batch: the all-gather of the layer's parameters before its forward; ZeRO-3 gathers them
again for the backward; the reduce-scatter of their gradients) and ``step_dp`` (a DDP layer's gradient bytes in the
buckets, once per step). The graphs are not changed; the runtime builds its buckets with the
same :func:`plan_buckets` (:class:`~galvatron_fx.runtime.buckets.GradBucketer`) and its FSDP
units with ``fully_shard``.

Terms: a parameter's *local* bytes are its tensor-parallel shard's, in its storage dtype (gradients
are kept in fp32 under mixed precision and summed in the plan's reduce dtype, fp32 unless
``plan.grad_comm`` says otherwise; FSDP gathers parameters in the compute dtype). A DDP layer's
``step_dp`` counts the bytes its gradients put on the wire (half under a 16-bit sum; a
PowerSGD-compressed matrix its two factors, :meth:`~galvatron_fx.ir.grad_comm.GradComm.wire_bytes`);
the buckets are cut by the gradients' stored bytes, as the runtime cuts them. A tied weight read by
several layers joins once, where backward finishes it (its first reader in forward order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from galvatron_fx.ir.program import CollectiveRecord, GradBucket
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["DEFAULT_BUCKET_BYTES", "FIRST_BUCKET_BYTES", "bucket_gradients_pass", "plan_buckets"]

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket


def plan_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int | None = None) -> list[list[int]]:
    """Indices of ``tensors`` grouped into buckets: same dtype, in order, at most
    ``bucket_bytes`` each (a larger tensor is a bucket of its own); the first bucket of each
    dtype holds at most ``first_bucket_bytes`` (default ``bucket_bytes``), so that the first
    collective starts early in backward."""
    if bucket_bytes <= 0 or (first_bucket_bytes is not None and first_bucket_bytes <= 0):
        raise ValueError(f"bucket sizes must be positive, got {bucket_bytes}, {first_bucket_bytes}")
    open_: dict[torch.dtype, tuple[list[int], int]] = {}
    started: set[torch.dtype] = set()
    out: list[list[int]] = []
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        idx, size = open_.get(t.dtype, ([], 0))
        cap = bucket_bytes if t.dtype in started or first_bucket_bytes is None else first_bucket_bytes
        if idx and size + nbytes > cap:
            out.append(idx)
            started.add(t.dtype)
            idx, size = [], 0
        idx.append(i)
        open_[t.dtype] = (idx, size + nbytes)
    out.extend(idx for idx, _ in open_.values() if idx)
    return out


def _local_shape(shape, tp_placement: str, tp: int) -> tuple[int, ...]:
    shape = list(shape)
    if tp_placement.startswith("S("):
        d = int(tp_placement[2:-1]) % len(shape)
        shape[d] = math.ceil(shape[d] / tp)
    return tuple(shape)


@graph_pass(requires=("lowered",), produces=("buckets",))
def bucket_gradients_pass(program, ctx: PassContext):
    plan = program.plan
    gc = plan.grad_comm
    reduce_dtype = getattr(torch, gc.reduce_dtype)
    groups: dict[tuple[int, int, int], list] = {}  # (stage, dp, tp) -> [(fqn, meta tensor, layer)]
    seen: set[str] = set()
    for lay in program.layers:
        st, g = lay.strategy, lay.graphs
        if lay.dp <= 1:
            continue
        # this layer's own parameter names, in the (shared) graphs' order
        trainable = [m._replace(fqn=fqn) for fqn, m in zip(lay.param_names, g.param_meta) if m.trainable]
        if str(st.dp_type) != "ddp":
            cdt = g.compute_dtype
            gathered = reduced = 0
            for _fqn, tp_p, shape, dtype, _ in trainable:
                numel = math.prod(_local_shape(shape, tp_p, st.tp))
                gathered += numel * (cdt if cdt is not None and dtype.is_floating_point else dtype).itemsize
                reduced += numel * (reduce_dtype if dtype.is_floating_point else dtype).itemsize
            if gathered:
                lay.fw_dp = [CollectiveRecord("fwd", "all_gather", lay.dp, gathered)]
                regather = str(st.dp_type) == "zero3"
                lay.bw_dp = ([CollectiveRecord("bwd", "all_gather", lay.dp, gathered)] if regather else []) + \
                    [CollectiveRecord("bwd", "reduce_scatter", lay.dp, reduced)]
            continue
        mine = 0
        for fqn, tp_p, shape, dtype, _ in trainable:
            if fqn in seen:
                continue
            seen.add(fqn)
            grad_dtype = torch.float32 if dtype.is_floating_point else dtype
            t = torch.empty(_local_shape(shape, tp_p, st.tp), dtype=grad_dtype, device="meta")
            mine += sum(gc.wire_bytes(tuple(t.shape), t.element_size())) if dtype.is_floating_point else \
                t.numel() * t.element_size()
            groups.setdefault((lay.stage, lay.dp, st.tp), []).append((fqn, t, lay.name))
        if mine:
            lay.step_dp = [CollectiveRecord("step", "all_reduce", lay.dp, mine)]
    program.buckets = []
    for (stage, dp, _tp), entries in groups.items():
        entries.reverse()  # the order backward finishes them: last layer first
        for idx in plan_buckets([t for _, t, _ in entries], DEFAULT_BUCKET_BYTES, FIRST_BUCKET_BYTES):
            program.buckets.append(GradBucket(
                stage=stage, group_size=dp, bytes=sum(entries[i][1].numel() * entries[i][1].element_size() for i in idx),
                params=[entries[i][0] for i in idx], after_layer=entries[idx[-1]][2]))
    return program
