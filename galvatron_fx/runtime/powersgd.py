"""PowerSGD: a bucket's gradient matrices summed over data parallelism as low-rank factors, with
error feedback (Vogels et al., 2019; the algorithm of ``torch.distributed.algorithms.
ddp_comm_hooks.powerSGD_hook``, here on the runtime's own buckets).

Contract: :class:`PowerSGD` holds the state of one data-parallel group's buckets (per gradient: its
error and its warm-started ``Q``) and counts the steps: until ``start_step`` the caller sums plainly
(:attr:`PowerSGD.compressing` is false), then a bucket is summed in two calls: :meth:`start` (during
backward, when the bucket is ready) launches the first round and returns a :class:`_Round`;
:meth:`PowerSGD.finish` (after backward) completes it, leaving in every gradient the same value on
every rank: the sum of the rank-``r`` approximation of each compressible matrix, and the exact sum
(in ``reduce_dtype``) of every other gradient.

Terms (per compressible gradient, viewed as ``M`` of ``n × m``, :func:`~galvatron_fx.ir.grad_comm.compressible`;
``W`` ranks in the group; sums over ranks written ``Σ``):

1. ``M ← M + E`` (error feedback: what earlier steps' approximations missed on this rank);
2. ``P = M Q``; all-reduce ``P`` (``ΣP``); orthonormalise its columns (reduced QR);
3. ``Q = Mᵀ P``; all-reduce ``Q`` (``ΣQ = (ΣM)ᵀ P``);
4. the summed gradient is ``S = P (ΣQ)ᵀ = P Pᵀ ΣM`` on every rank;
5. ``E ← M − S / W`` (this rank's share of what ``S`` missed: the errors sum to ``ΣM − S``);
   ``Q ← ΣQ / W`` starts the next step (warm start: one power iteration per step converges
   over steps).

``Q`` starts as the same seeded Gaussian on every rank. All factors of a bucket travel in one
fp32 all-reduce per round; the other gradients go in one all-reduce in ``reduce_dtype`` with
the first round. ``error_feedback=False`` drops the residual (plain low-rank sums: they lose
what the rank cannot hold, step after step — kept for the tests that show why it is on).
The state lives in the process only: checkpoints do not hold it, so a resumed run sums plainly
for ``start_step`` steps again and then starts from zero errors and fresh ``Q``s (the residual of
the last step before the checkpoint is lost, the power iteration warms up again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist

from galvatron_fx.ir.grad_comm import compressible

__all__ = ["PowerSGD"]


@dataclass
class _Round:
    """A bucket between :meth:`PowerSGD.start` and :meth:`PowerSGD.finish`."""

    grads: list[torch.Tensor]
    mats: list[tuple[int, int, torch.Tensor, torch.Tensor]]  # (index in grads, key, M (n, m), Q (m, r))
    p_flat: torch.Tensor | None
    p_work: dist.Work | None
    rest: list[int]  # indices of gradients summed whole
    rest_flat: torch.Tensor | None
    rest_work: dist.Work | None


class PowerSGD:
    """Rank-``rank`` PowerSGD sums over ``group`` (see module doc)."""

    def __init__(self, rank: int, group: dist.ProcessGroup | None, *, reduce_dtype: torch.dtype | None = None,
                 start_step: int = 0, error_feedback: bool = True, seed: int = 0):
        if rank < 1:
            raise ValueError(f"PowerSGD needs a rank >= 1, got {rank}")
        self.rank, self.group = rank, group
        self.start_step = start_step
        self.steps = 0  # steps summed so far (:meth:`step_done`)
        self.reduce_dtype = reduce_dtype
        self.error_feedback = error_feedback
        self.world = dist.get_world_size(group)
        self._gen = torch.Generator().manual_seed(seed)
        self.errors: dict[int, torch.Tensor] = {}
        self.qs: dict[int, torch.Tensor] = {}

    @property
    def compressing(self) -> bool:
        """Whether this step's buckets are compressed (``start_step`` steps sum plainly first)."""
        return self.steps >= self.start_step

    def step_done(self) -> None:
        """One more step's gradients are summed."""
        self.steps += 1

    def state_bytes(self) -> int:
        """Bytes of the state kept between steps (errors and Qs)."""
        return sum(t.numel() * t.element_size() for t in (*self.errors.values(), *self.qs.values()))

    @torch.no_grad()
    def start(self, keys: Sequence[int], grads: Sequence[torch.Tensor]) -> _Round:
        """Launch the first round for ``grads`` (``keys``: a stable id per gradient's parameter)."""
        grads = list(grads)
        mats, rest = [], []
        for i, (key, g) in enumerate(zip(keys, grads)):
            nm = compressible(tuple(g.shape), self.rank) if g.is_floating_point() else None
            if nm is None:
                rest.append(i)
                continue
            n, m = nm
            r = min(self.rank, n, m)
            mat = g.reshape(n, m).float()
            if mat.data_ptr() == g.data_ptr():
                mat = mat.clone()  # the gradient itself is overwritten with the sum in finish()
            if self.error_feedback and key in self.errors:
                mat += self.errors[key]
            if key not in self.qs:  # the same Gaussian on every rank: one generator, same order
                self.qs[key] = torch.randn(m, r, generator=self._gen).to(mat.device)
            mats.append((i, key, mat, self.qs[key]))
        p_flat = p_work = None
        if mats:
            p_flat = torch.cat([(mat @ q).reshape(-1) for _, _, mat, q in mats])
            p_work = dist.all_reduce(p_flat, group=self.group, async_op=True)
        rest_flat = rest_work = None
        if rest:
            rest_flat = torch.cat([grads[i].reshape(-1) for i in rest])
            if self.reduce_dtype is not None and rest_flat.is_floating_point():
                rest_flat = rest_flat.to(self.reduce_dtype)
            rest_work = dist.all_reduce(rest_flat, group=self.group, async_op=True)
        return _Round(grads, mats, p_flat, p_work, rest, rest_flat, rest_work)

    @torch.no_grad()
    def finish(self, rnd: _Round) -> None:
        """The second round and the sums written into the gradients (see module doc)."""
        if rnd.mats:
            cast(dist.Work, rnd.p_work).wait()
            ps, offset = [], 0
            for _, _, mat, q in rnd.mats:
                k = mat.shape[0] * q.shape[1]
                p = cast(torch.Tensor, rnd.p_flat)[offset:offset + k].view(mat.shape[0], q.shape[1])
                offset += k
                ps.append(torch.linalg.qr(p, mode="reduced").Q)
            q_flat = torch.cat([(mat.T @ p).reshape(-1) for (_, _, mat, _), p in zip(rnd.mats, ps)])
            dist.all_reduce(q_flat, group=self.group)
            offset = 0
            for (i, key, mat, q), p in zip(rnd.mats, ps):
                k = q.numel()
                q_sum = q_flat[offset:offset + k].view_as(q)
                offset += k
                total = p @ q_sum.T  # (n, m): the summed approximation
                if self.error_feedback:
                    self.errors[key] = mat - total / self.world
                self.qs[key] = q_sum / self.world
                g = rnd.grads[i]
                g.copy_(total.view_as(g))
        if rnd.rest:
            cast(dist.Work, rnd.rest_work).wait()
            offset = 0
            for i in rnd.rest:
                g = rnd.grads[i]
                g.copy_(cast(torch.Tensor, rnd.rest_flat)[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
