"""Bucketed collectives: many small tensors reduced in a few large messages.

Contract: :func:`all_reduce_coalesced` sums each tensor in place over a process group, exactly as
one ``all_reduce`` per tensor would, in at most ``ceil(total bytes / bucket_bytes)`` collectives
per dtype (a tensor larger than a bucket goes alone). Buckets fill in the given order, so callers
that pass tensors in the order backward produces them get buckets that are ready together.

This is the "fuse small communications" pass for what neither FSDP2 (which already coalesces a
layer's reduce-scatter) nor the per-layer DTensor graph buckets: the data-parallel gradient sums
of plain (DDP-flavour) parameters, which the runtime collects across *all* layers that share a
data-parallel group (:meth:`ParallelModule.sync_grads`). Every bucket is launched before the
first is waited on, so the transfers queue back to back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_BUCKET_BYTES", "all_reduce_coalesced", "plan_buckets"]

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


def plan_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Indices of ``tensors`` grouped into buckets: same dtype, in order, at most
    ``bucket_bytes`` each (a larger tensor is a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    open_: dict[torch.dtype, tuple[list[int], int]] = {}
    out: list[list[int]] = []
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        idx, size = open_.get(t.dtype, ([], 0))
        if idx and size + nbytes > bucket_bytes:
            out.append(idx)
            idx, size = [], 0
        idx.append(i)
        open_[t.dtype] = (idx, size + nbytes)
    out.extend(idx for idx, _ in open_.values() if idx)
    return out


@torch.no_grad()
def all_reduce_coalesced(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None = None,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Sum ``tensors`` in place over ``group`` in buckets; returns the number of collectives."""
    tensors = list(tensors)
    if not tensors:
        return 0
    pending = []
    for idx in plan_buckets(tensors, bucket_bytes):
        if len(idx) == 1:
            t = tensors[idx[0]]
            flat = t if t.is_contiguous() else t.contiguous()
        else:
            flat = torch.cat([tensors[i].reshape(-1) for i in idx])
        pending.append((idx, flat, dist.all_reduce(flat, group=group, async_op=True)))
    for idx, flat, work in pending:
        work.wait()
        if len(idx) == 1 and flat is tensors[idx[0]]:
            continue
        offset = 0
        for i in idx:
            t = tensors[i]
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
    return len(pending)
