"""Bucketed collectives: many small tensors reduced in a few large messages.

Contract: :func:`all_reduce_coalesced` sums each tensor in place over a process group, exactly as
one ``all_reduce`` per tensor would, in at most ``ceil(total bytes / bucket_bytes)`` collectives
per dtype (a tensor larger than a bucket goes alone). Buckets fill in the given order, so callers
that pass tensors in the order backward produces them get buckets that are ready together.

The buckets are those :func:`~galvatron_fx.passes.bucket_gradients.plan_buckets` makes (the
lowering's ``bucket_gradients`` pass names them in the program). This fuses the communication of
what neither FSDP2 (which already coalesces a layer's reduce-scatter) nor the per-layer DTensor
graph buckets: the data-parallel gradient sums of plain (DDP-flavour) parameters, which the runtime
collects across *all* layers that share a data-parallel group (:meth:`ParallelModule.sync_grads`).
Every bucket is launched before the first is waited on, so the transfers queue back to back.

The plan's gradient communication (:class:`~galvatron_fx.ir.grad_comm.GradComm`) applies here:
a bucket is summed in ``reduce_dtype`` (cast from the gradients' fp32, summed, cast back into
them: only the sum is rounded) or, under PowerSGD, as low-rank factors
(:class:`~galvatron_fx.runtime.powersgd.PowerSGD`, after its plain first steps: its first round
launched when the bucket is ready, its second in :meth:`GradBucketer.finish`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

from galvatron_fx.passes.bucket_gradients import DEFAULT_BUCKET_BYTES, FIRST_BUCKET_BYTES, plan_buckets
from galvatron_fx.runtime.powersgd import PowerSGD

__all__ = ["DEFAULT_BUCKET_BYTES", "GradBucketer", "all_reduce_coalesced", "plan_buckets"]


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


class GradBucketer:
    """Data-parallel gradient sums launched *during* backward, bucket by bucket (as DDP does).

    Contract: ``entries`` are plain local parameters whose gradients are summed over ``group``,
    listed in the order backward is expected to finish them (last layer first); an entry may be
    a list of tied copies (the same weight read by several layers, each a parameter of its own,
    all stored whole): their gradients are summed locally into the first, the sum is reduced
    once, and every copy receives it. While :meth:`arm`-ed, a post-accumulate-grad hook marks
    each parameter ready; an entry is ready when all its copies are, and a bucket whose entries
    are all ready is flattened and its all-reduce launched at once, overlapping the rest of
    backward. :meth:`finish` launches what is left (parameters that got no gradient are skipped —
    every rank uses the same parameters, so all ranks launch the same buckets), waits, makes each
    ``.grad`` a view of its reduced bucket (no copy back) and disarms. Unarmed (earlier micro-batches of an
    accumulation, or a backward the caller drives), hooks do nothing and :meth:`finish` reduces
    everything after backward.
    """

    def __init__(self, entries: Sequence[torch.nn.Parameter | Sequence[torch.nn.Parameter]],
                 group: dist.ProcessGroup | None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES, *, reduce_dtype: torch.dtype | None = None,
                 powersgd: PowerSGD | None = None):
        self.entries: list[list[torch.nn.Parameter]] = [
            list(e) if isinstance(e, (list, tuple)) else [cast(torch.nn.Parameter, e)] for e in entries]
        self.group = group
        self.reduce_dtype = reduce_dtype  # None: sum in the gradients' own dtype
        self.powersgd = powersgd
        self.buckets = plan_buckets([e[0] for e in self.entries], bucket_bytes, first_bucket_bytes)
        self._entry_of = {id(p): i for i, e in enumerate(self.entries) for p in e}
        self._bucket_of_entry = {i: b for b, idx in enumerate(self.buckets) for i in idx}
        self._armed = False
        self._fired: list[int] = [0] * len(self.entries)
        self._summed: set[int] = set()
        self._ready: list[int] = [0] * len(self.buckets)
        # (owners, flat buffer or None under PowerSGD, (wire, work) or PowerSGD's round)
        self._pending: dict[int, tuple[list[torch.nn.Parameter], torch.Tensor | None, Any]] = {}
        self._launched: set[int] = set()
        self._extra: torch.Tensor | None = None  # see arm()
        self._extra_at: tuple | None = None  # (bucket, numel, shape) of the extra in its flat buffer
        self.extra_sum: torch.Tensor | None = None
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                         for e in self.entries for p in e if p.requires_grad]

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for e in self.entries for p in e]

    def arm(self, extra: torch.Tensor | None = None) -> None:
        """Launch buckets from the hooks of the next backward. ``extra``: a small float tensor of
        the buckets' dtype (a step's loss) summed over the group with the last bucket, so that it
        costs no collective of its own; :attr:`extra_sum` holds the sum after :meth:`finish`."""
        self._armed = True
        self._fired = [0] * len(self.entries)
        self._summed.clear()
        self._ready = [0] * len(self.buckets)
        self._extra = extra
        self.extra_sum = None

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        i = self._entry_of[id(p)]
        self._fired[i] += 1
        if self._fired[i] == len(self.entries[i]):
            if self._fired[i] > 1:
                self._sum_copies(i)
            b = self._bucket_of_entry[i]
            self._ready[b] += 1
            if self._ready[b] == len(self.buckets[b]):
                self._launch(b)

    @torch.no_grad()
    def _sum_copies(self, i: int) -> None:
        """Tied copies: the sum of their gradients in the first copy's ``.grad``."""
        if i in self._summed:
            return
        self._summed.add(i)
        copies = self.entries[i]
        if len(copies) == 1:
            return
        grads = cast("list[torch.Tensor]", [p.grad for p in copies if p.grad is not None])
        if not grads:
            return
        total = grads[0] if copies[0].grad is grads[0] else grads[0].clone()
        for g in grads[1:]:
            total += g
        copies[0].grad = total

    def _wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a gradient of ``dtype`` is summed in."""
        return self.reduce_dtype if self.reduce_dtype is not None and dtype.is_floating_point else dtype

    def _launch(self, b: int) -> None:
        owners = [p for p in (self.entries[i][0] for i in self.buckets[b]) if p.grad is not None]
        grads = cast("list[torch.Tensor]", [p.grad for p in owners])  # (owners: those with a gradient)
        self._launched.add(b)
        if self.powersgd is not None and self.powersgd.compressing:
            if grads:
                ids = [id(p) for p in owners]
                self._pending[b] = (owners, None, self.powersgd.start(ids, grads))
            return
        last = len(self._launched) == len(self.buckets)  # the same bucket on every rank
        # the loss rides in the last bucket when it is summed in the loss's own dtype (never rounded)
        extra = self._extra if last and self._extra is not None and (
            not grads or self._wire_dtype(grads[0].dtype) == self._extra.dtype) else None
        if not grads and extra is None:
            return
        parts = [g.reshape(-1) for g in grads] + ([extra.reshape(-1)] if extra is not None else [])
        flat = grads[0].contiguous() if len(parts) == 1 and grads else torch.cat(parts)
        if extra is not None:
            self._extra = None
        wire = flat.to(self._wire_dtype(flat.dtype))  # flat itself when no cast
        self._pending[b] = (owners, flat, (wire, dist.all_reduce(wire, group=self.group, async_op=True)))
        if extra is not None:
            self._extra_at = (b, extra.numel(), extra.shape)

    @torch.no_grad()
    def finish(self) -> int:
        """Reduce every gradient (see class doc); returns the number of collectives."""
        flat: torch.Tensor | None
        for i, e in enumerate(self.entries):
            if len(e) > 1:
                self._sum_copies(i)
        for b in range(len(self.buckets)):
            if b not in self._launched:
                self._launch(b)
        if self._extra is not None:  # the last bucket had another dtype, or no gradient
            flat = self._extra.reshape(-1).clone()
            self._pending[-1] = ([], flat, (flat, dist.all_reduce(flat, group=self.group, async_op=True)))
            self._extra_at, self._extra = (-1, flat.numel(), self._extra.shape), None
        n = len(self._pending)
        for b in sorted(self._pending):
            owners, flat, work = self._pending[b]
            if flat is None:  # PowerSGD: its second round, the sums written into the gradients
                cast(PowerSGD, self.powersgd).finish(work)
                continue
            wire, work = work
            work.wait()
            if wire is not flat:
                flat.copy_(wire)  # back to the gradients' dtype
            if self._extra_at is not None and self._extra_at[0] == b:
                _, k, shape = self._extra_at
                self.extra_sum = flat[flat.numel() - k:].reshape(shape).clone()
            if len(owners) == 1 and flat is owners[0].grad:
                continue
            offset = 0
            for p in owners:  # the gradients become views of the reduced buffer: no copy back
                size = cast(torch.Tensor, p.grad).numel()
                p.grad = flat[offset:offset + size].view_as(cast(torch.Tensor, p.grad))
                offset += size
        for e in self.entries:
            if len(e) > 1 and e[0].grad is not None:
                for p in e[1:]:
                    p.grad = e[0].grad.clone()
        if self.powersgd is not None:
            self.powersgd.step_done()
        self._pending.clear()
        self._summed.clear()
        self._launched.clear()
        self._extra, self._extra_at = None, None
        self._armed = False
        return n

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
