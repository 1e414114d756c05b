"""local_inputs — each rank passes only its data-parallel share of the batch (``inputs="local"``).

Contract: :class:`LocalInputs` is a base of ``ParallelModule`` and ``PipelineModule``; it reads
the host's ``plan`` and ``guard``. With ``compile(..., inputs="local")`` (or
:meth:`LocalInputs.set_inputs`) every rank passes ``global_batch_size / data_parallel_size``
samples, and ranks with the same :attr:`~LocalInputs.data_parallel_rank` pass the same ones (as
with ``DistributedDataParallel``, each replica loads its own share: :meth:`LocalInputs.sampler`
is the ``DistributedSampler`` over the replicas). The default ``"global"`` keeps the contract of
``train_step``: every rank passes the whole global batch.

Terms: a *replica* is a set of ranks of one stage that read the same samples. Every layer splits
its stage's ``S`` ranks row-major into ``dp × tp``; with ``D`` the greatest common divisor of the
layers' ``dp``, the stage's ranks in positions ``[k·S/D, (k+1)·S/D)`` are replica ``k`` for every
layer at once (a layer's data-parallel index ``p // tp`` over ``dp / D`` consecutive indices).

Algorithm: the shares are all-gathered over the world (token ids and labels: bytes beside a
step's activations) and concatenated in replica order into the global batch, which then runs
as in ``"global"`` mode, so every plan (mixed meshes, pipelines, coupled losses) trains as it
does on that global batch. The batch guard compares shapes and dtypes, not values, on every
step in this mode (a share of another shape would make the gather fail).

``inputs="rank"`` is the contract of ``DistributedDataParallel`` and of the loops and trainers
written for it (Hugging Face ``Trainer``, ``accelerate``): every rank passes
``global_batch_size / world_size`` samples of its own (a ``DistributedSampler`` over all ranks:
:meth:`LocalInputs.sampler` in this mode), and the global batch is every rank's, in rank order,
whatever the plan's data-parallel degrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from galvatron_fx.errors import ConfigError

if TYPE_CHECKING:
    from galvatron_fx.ir.plan import ParallelPlan
    from galvatron_fx.runtime.guard import StepGuard

__all__ = ["LocalInputs", "MODES", "check_inputs_mode"]

MODES = ("global", "local", "rank")


def check_inputs_mode(mode: str) -> None:
    """A :class:`ConfigError` saying what to pass where ``mode`` is none of :data:`MODES`."""
    if mode not in MODES:
        raise ConfigError(f"inputs={mode!r}: use 'global' (every rank passes the whole global batch), 'local' "
                          "(each rank passes its data-parallel share: pm.sampler(dataset)) or 'rank' (every rank "
                          "passes samples of its own, as under DistributedDataParallel)")


class LocalInputs:
    """The inputs contract of a parallel module (see the module doc)."""

    inputs_mode = "global"

    if TYPE_CHECKING:  # set by the host module
        plan: ParallelPlan
        guard: StepGuard

    def set_inputs(self, mode: str) -> None:
        """``"global"`` (every rank passes the whole global batch), ``"local"`` (its replica's
        share) or ``"rank"`` (a share of its own)."""
        check_inputs_mode(mode)
        self.__dict__["inputs_mode"] = mode
        self.guard.values = mode == "global"
        self.guard.mode = mode

    @property
    def data_parallel_size(self) -> int:
        """How many replicas read different samples (1 where some layer has ``dp == 1``)."""
        return math.gcd(*(lp.dp for lp in self.plan.layers))

    @property
    def data_parallel_rank(self) -> int:
        """This rank's replica: ranks with the same one pass the same samples."""
        stage = next(s for s in self.plan.stage_ranks if dist.get_rank() in s)
        return stage.index(dist.get_rank()) // (len(stage) // self.data_parallel_size)

    def sampler(self, dataset, shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        """A ``DistributedSampler`` of ``dataset`` over the data-parallel replicas (for a
        ``DataLoader`` with ``batch_size = global_batch_size // data_parallel_size`` in
        ``inputs="local"`` mode; call its ``set_epoch`` each epoch)."""
        from torch.utils.data.distributed import DistributedSampler

        if self.inputs_mode == "rank":  # every rank reads samples of its own
            return DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(),
                                      shuffle=shuffle, seed=seed, drop_last=drop_last)
        return DistributedSampler(dataset, num_replicas=self.data_parallel_size, rank=self.data_parallel_rank,
                                  shuffle=shuffle, seed=seed, drop_last=drop_last)

    def _global_inputs(self, tensors: Sequence) -> list:
        """The global batch from every rank's share (``"local"``), or ``tensors`` as given."""
        if self.inputs_mode == "global":
            return list(tensors)
        if self.inputs_mode == "rank":  # every rank's own samples, in rank order
            readers = list(range(dist.get_world_size()))
        else:
            d = self.data_parallel_size
            first = self.plan.stage_ranks[0]
            readers = [first[k * (len(first) // d)] for k in range(d)]  # one rank of each replica
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        out = []
        for x in tensors:
            if not isinstance(x, torch.Tensor) or x.ndim == 0:
                out.append(x)
                continue
            y = x.contiguous() if device is None else x.to(device).contiguous()
            y = y.view(torch.uint8) if y.dtype == torch.bool else y  # (gloo gathers no bool)
            parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, y)
            whole = torch.cat([parts[r] for r in readers])
            out.append((whole.view(torch.bool) if x.dtype == torch.bool else whole).to(x.device))
        return out
