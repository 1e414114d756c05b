"""Data-parallel gradient sums as the runtime issues them: bucketed all-reduces of the plain
(DDP-flavour) gradients of every layer that shares a data-parallel group.

Contract: :func:`bucketed_sync_s` prices, with any :class:`~galvatron_fx.cost_models.base.CostModel`,
the seconds the gradient sums of one data-parallel group add to a step; :func:`plan_buckets`
groups gradients exactly as :func:`galvatron_fx.runtime.buckets.plan_buckets` does (same caps,
same order), so the model counts the collectives the runtime launches.

Terms: *entries* are ``(bytes, ready_s)`` per gradient in the order the runtime lists them (last
layer first; a weight tied across layers once, with its first reader); ``ready_s`` is when the last
micro-batch's backward has produced it, from the start of that backward (``backward_s`` in all).
``bytes`` is the gradient's size as stored (fp32), which decides the buckets; an entry may add what
it puts on the wire, ``(bytes, ready_s, wire_bytes, p_bytes, q_bytes, extra_s)``
(:func:`wire_entry`): ``wire_bytes`` summed whole (in the plan's reduce dtype: half ``bytes`` in
bf16), and under PowerSGD the factors ``P`` and ``Q`` summed in two further rounds after it, with
``extra_s`` of compression compute (:class:`~galvatron_fx.ir.grad_comm.GradComm`). A bucket is
launched when its last entry is ready (*armed*: as :meth:`ParallelModule.train_step` does for a plan
without pipeline stages) or, unarmed, all after the backward (a pipeline schedule drives the
backward; ``sync_grads`` then launches them).

Model: the collectives of one group run one after another (one process group orders them), each
taking the cost model's all-reduce seconds of its bytes (a bucket: its whole gradients' wire bytes,
then under PowerSGD its ``P`` round and its ``Q`` round; the compression's compute runs on the
device the backward uses, so it is added to the step in full); while backward compute still runs, a
collective is hidden but slows the compute it overlaps (``overlapped_s(h, h) − h`` for ``h``
seconds overlapped); what finishes after the backward is exposed. The result is the exposed
seconds plus that slowdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from galvatron_fx.cluster import Collective

__all__ = ["DEFAULT_BUCKET_BYTES", "FIRST_BUCKET_BYTES", "bucket_time_s", "bucketed_sync_s", "plan_buckets",
           "powersgd_compute_s", "wire_entry"]

# galvatron_fx.runtime.buckets' caps (DDP's defaults); a unit test keeps the two equal
DEFAULT_BUCKET_BYTES = 25 * 2**20
FIRST_BUCKET_BYTES = 2**20


def plan_buckets(sizes: Sequence[int], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Indices of ``sizes`` grouped into buckets, in order: the first holds at most
    ``first_bucket_bytes``, the others ``bucket_bytes``; a larger entry is a bucket of its own."""
    out: list[list[int]] = []
    idx: list[int] = []
    size = 0
    for i, nbytes in enumerate(sizes):
        cap = first_bucket_bytes if not out else bucket_bytes
        if idx and size + nbytes > cap:
            out.append(idx)
            idx, size = [], 0
        idx.append(i)
        size += nbytes
    if idx:
        out.append(idx)
    return out


def wire_entry(cm, numel: int, shape: Sequence[int], grad_comm, *,
               stored_bytes: int = 4) -> tuple[int, int, int, int, float]:
    """``(bytes, wire_bytes, p_bytes, q_bytes, extra_s)`` of one DDP gradient of ``numel``
    elements (local ``shape``) under ``grad_comm`` (None: fp32, uncompressed): stored at
    ``stored_bytes`` per element, and what it puts on the wire
    (:meth:`~galvatron_fx.ir.grad_comm.GradComm.wire_bytes`) with PowerSGD's compute."""
    nbytes = numel * stored_bytes
    if grad_comm is None:
        return nbytes, nbytes, 0, 0, 0.0
    wire, p, q = grad_comm.wire_bytes(shape, stored_bytes)
    if not p:
        return nbytes, wire, 0, 0, 0.0
    r = p // 4 // int(shape[0])
    return nbytes, 0, p, q, powersgd_compute_s(cm, int(shape[0]), numel // int(shape[0]), r)


def powersgd_compute_s(cm, n: int, m: int, r: int) -> float:
    """Seconds of one PowerSGD round trip on an ``n × m`` fp32 gradient at rank ``r``: adding the
    error, ``P = M Q``, orthogonalising ``P`` (QR), ``Q = Mᵀ P``, ``P Qᵀ``, the new error and the
    sum written into the gradient — three matmuls of ``2·n·m·r`` FLOPs and ten passes over the
    ``n·m`` matrix (memory-bound for any small rank)."""
    if cm is None:
        return 0.0
    flops = 6.0 * n * m * r + 4.0 * n * r * r
    nbytes = 4.0 * (10 * n * m + 3 * (n + m) * r)
    return cm.node_time_s(flops, nbytes)


def bucket_time_s(cm, entries: Sequence[tuple], ranks: Sequence[int]) -> float:
    """Seconds of the collectives of one bucket of ``entries`` (``(bytes, ready_s[, wire_bytes,
    p_bytes, q_bytes, extra_s])``, see module doc) over ``ranks`` (its compute not included)."""
    wire = p = q = 0
    for e in entries:
        w = _wire(e)
        wire, p, q = wire + w[0], p + w[1], q + w[2]
    ranks = list(ranks)
    t = 0.0
    for nbytes in (wire, p, q):
        if nbytes > 0:
            t += cm.collective_time_s(Collective.ALL_REDUCE, nbytes, ranks)
    return t


def _wire(e: tuple) -> tuple[int, int, int, float]:
    return (int(e[0]), 0, 0, 0.0) if len(e) == 2 else (int(e[2]), int(e[3]), int(e[4]), float(e[5]))


def bucketed_sync_s(cm, entries: Sequence[tuple], ranks: Sequence[int], backward_s: float, *,
                    armed: bool = True, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                    first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> float:
    """Seconds the bucketed gradient all-reduces over ``ranks`` add to a step (see module doc)."""
    entries = [tuple(e) for e in entries if e[0] > 0]
    if len(ranks) <= 1 or not entries:
        return 0.0
    buckets = plan_buckets([int(e[0]) for e in entries], bucket_bytes, first_bucket_bytes)
    free_at = 0.0  # when the group finishes its previous collective
    hidden = 0.0
    for idx in buckets:
        ready = max(float(entries[i][1]) for i in idx) if armed else backward_s
        start = max(ready, free_at)
        dur = bucket_time_s(cm, [entries[i] for i in idx], ranks)
        free_at = start + dur
        hidden += max(0.0, min(free_at, backward_s) - start)
    exposed = max(0.0, free_at - backward_s)
    slowdown = max(0.0, cm.overlapped_s(hidden, hidden) - hidden) if hidden > 0 else 0.0
    return exposed + slowdown + sum(_wire(e)[3] for e in entries)
