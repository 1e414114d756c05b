"""Data-parallel gradient sums as the runtime issues them: bucketed all-reduces of the plain
(DDP-flavour) gradients of every layer that shares a data-parallel group.

Contract: :func:`bucketed_sync_s` prices, with any :class:`~galvatron_fx.cost_models.base.CostModel`,
the seconds the gradient sums of one data-parallel group add to a step; :func:`plan_buckets`
groups gradients exactly as :func:`galvatron_fx.runtime.buckets.plan_buckets` does (same caps,
same order), so the model counts the collectives the runtime launches.

Terms: *entries* are ``(bytes, ready_s)`` per gradient in the order the runtime lists them (last
layer first; a weight tied across layers once, with its first reader); ``ready_s`` is when the
last micro-batch's backward has produced it, from the start of that backward (``backward_s`` in
all). A bucket is launched when its last entry is ready (*armed*: as
:meth:`ParallelModule.train_step` does for a plan without pipeline stages) or, unarmed, all after
the backward (a pipeline schedule drives the backward; ``sync_grads`` then launches them).

Model: the collectives of one group run one after another (one process group orders them), each
taking the cost model's all-reduce seconds of its bytes; while backward compute still runs, a
collective is hidden but slows the compute it overlaps (``overlapped_s(h, h) − h`` for ``h``
seconds overlapped); what finishes after the backward is exposed. The result is the exposed
seconds plus that slowdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from galvatron_fx.cluster import Collective

__all__ = ["DEFAULT_BUCKET_BYTES", "FIRST_BUCKET_BYTES", "bucketed_sync_s", "plan_buckets"]

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


def bucketed_sync_s(cm, entries: Sequence[tuple[int, float]], ranks: Sequence[int], backward_s: float, *,
                    armed: bool = True, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                    first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> float:
    """Seconds the bucketed gradient all-reduces over ``ranks`` add to a step (see module doc)."""
    entries = [(int(b), float(t)) for b, t in entries if b > 0]
    if len(ranks) <= 1 or not entries:
        return 0.0
    buckets = plan_buckets([b for b, _ in entries], bucket_bytes, first_bucket_bytes)
    free_at = 0.0  # when the group finishes its previous collective
    hidden = 0.0
    for idx in buckets:
        ready = max(entries[i][1] for i in idx) if armed else backward_s
        start = max(ready, free_at)
        dur = cm.collective_time_s(Collective.ALL_REDUCE, sum(entries[i][0] for i in idx), list(ranks))
        free_at = start + dur
        hidden += max(0.0, min(free_at, backward_s) - start)
    exposed = max(0.0, free_at - backward_s)
    slowdown = max(0.0, cm.overlapped_s(hidden, hidden) - hidden) if hidden > 0 else 0.0
    return exposed + slowdown
