"""choice_costs — the time terms of one priced layer choice (:mod:`~galvatron_fx.search.candidates`):
its collectives after their share of compute, the optimizer step, the slowest member of a stage
spanning device kinds, the data-parallel gradient wire and bucket share, and FSDP's exposed
gathers and reduce-scatters."""

from __future__ import annotations

from collections.abc import Sequence

from galvatron_fx.cluster import Collective
from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.grad_sync import wire_entry
from galvatron_fx.ir.grad_comm import GradComm
from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.strategy import DPType


def comm_s(cm: CostModel, events, frac: float, ranks: list[int], *, again_fwd: bool,
            compute_s: dict[str, float]) -> float:
    """Seconds per micro-batch of a layer's collectives at ``frac`` of the captured batch (a
    parameter's own at its size), each after its share of the forward's or backward's compute
    (``compute_s``); recomputation (``again_fwd``) repeats the forward's."""
    tp_price = getattr(cm, "tp_collective_time_s", None)  # optional for older cost models
    count = {d: sum(e.direction == d for e in events) for d in ("fwd", "bwd")}
    total = 0.0
    for e in events:
        nbytes = int(e.nbytes * frac) if e.per_sample else e.nbytes
        gap = compute_s.get(e.direction, 0.0) / max(count.get(e.direction, 1), 1)
        if nbytes <= 0:
            t = 0.0
        elif tp_price is not None:
            t = tp_price(e.collective, nbytes, ranks, gap_s=gap)
        else:
            t = cm.collective_time_s(e.collective, nbytes, ranks)
        total += t * (2 if again_fwd and e.direction == "fwd" else 1)
    return total


def optimizer_s(cm: CostModel, numel: int, tensors: int, *, dtensor: bool, rank: int = 0) -> float:
    step = getattr(cm, "optimizer_step_s", None)  # optional for cost models written before it
    if step is None or tensors <= 0:
        return 0.0
    return step(numel, tensors, dtensor=dtensor, **at_rank(rank))


def at_rank(rank: int) -> dict:
    """``rank=`` for a cost model's call where it is not rank 0 (the default, which cost models
    written for clusters of one kind may not take as an argument)."""
    return {"rank": rank} if rank else {}


def slowest(cm: CostModel, mg: ModelGraph, layer: LayerInfo, frac: float, ranks: Sequence[int]
             ) -> tuple[int, tuple[float, float]]:
    """The rank of ``ranks`` whose device runs ``layer`` slowest, and its (forward, backward)
    seconds: one rank per device kind is asked (a cluster of one kind: the first rank only)."""
    cluster = getattr(cm, "cluster", None)
    if cluster is None or not cluster.is_heterogeneous or not ranks:  # every device alike: rank 0's
        return 0, cm.layer_times_s(mg, layer, batch_fraction=frac)
    reps: dict[str, int] = {}
    for r in ranks:
        reps.setdefault(cluster.device(r).kind, r)
    timed = [(r, cm.layer_times_s(mg, layer, batch_fraction=frac, rank=r)) for r in reps.values()]
    return max(timed, key=lambda x: sum(x[1]))


def ddp_wire(cm: CostModel, p, share: float, gc: GradComm, grad_size: int | None) -> tuple[int, int, int, int, float]:
    """``(stored bytes, wire bytes, P bytes, Q bytes, compute s)`` of one DDP parameter's local
    gradient (:func:`~galvatron_fx.cost_models.grad_sync.wire_entry`); a tensor-parallel shard
    (``share`` < 1) is taken as split on its first dim."""
    numel = int(p.numel * share)
    shape = (max(1, int(p.shape[0] * share)), *p.shape[1:]) if p.shape else (numel,)
    stored = grad_size if grad_size else max(1, p.nbytes // max(p.numel, 1))
    _, wire, pb, qb, extra = wire_entry(cm, numel, shape, gc, stored_bytes=stored)
    nbytes = int(p.numel * stored * share)
    if gc.reduce_dtype == "float32" and not pb:
        wire = nbytes  # summed as stored
    return nbytes, wire, pb, qb, extra


def bucket_share_s(cm: CostModel, wires: Sequence[tuple], ranks: list[int]) -> float:
    """A DDP layer's share of its group's bucketed all-reduces: the all-reduce of its wire bytes
    (each round of PowerSGD's factors too) less that of one byte (the per-collective latency is
    paid per bucket, by the stage), plus PowerSGD's compute."""
    if len(ranks) <= 1 or not wires:
        return 0.0
    one = cm.collective_time_s(Collective.ALL_REDUCE, 1, ranks)
    total = sum(w[4] for w in wires)
    for k in (1, 2, 3):
        nbytes = sum(w[k] for w in wires)
        if nbytes > 0:
            total += max(0.0, cm.collective_time_s(Collective.ALL_REDUCE, nbytes, ranks) - one)
    return total


def fsdp_comm_s(cm: CostModel, dpt: DPType, gather_bytes: int, reduce_bytes: int, ranks: list[int], m: int, *,
                 compute_s: float) -> float:
    """Seconds per step of FSDP's collectives for parameters of ``gather_bytes`` (gradients of
    ``reduce_bytes``): per micro-batch a reduce-scatter of the gradients, and one all-gather of
    the parameters (ZeRO-2, kept from forward to backward) or two (ZeRO-3, gathered again for the
    backward); each after its share of the layer's ``compute_s`` per micro-batch since the
    previous one."""
    if len(ranks) <= 1 or gather_bytes == 0:
        return 0.0
    n = 2 if dpt == DPType.ZERO2 else 3
    gap = compute_s / n
    rs = cm.collective_time_s(Collective.REDUCE_SCATTER, reduce_bytes, ranks, gap_s=gap)
    ag = cm.collective_time_s(Collective.ALL_GATHER, gather_bytes, ranks, gap_s=gap)
    return m * (rs + (n - 1) * ag)
