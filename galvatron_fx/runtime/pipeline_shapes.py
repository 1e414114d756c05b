"""The schedules of a pipelined plan, for its planned batch and for batches of other shapes.

Contract: :class:`PipelineShapes` is a base of ``PipelineModule`` (which has ``plan``, ``mg``,
``chunks`` — its ``_Chunk`` modules, one per chunk on this rank, ``_mine`` their indices —,
``device``, ``pp_group``, ``scaler``, ``num_microbatches`` and the crossing/layout/example helpers);
:meth:`PipelineShapes._schedule_for` gives the schedule that runs a whole batch.

Algorithm: a batch splits into equal micro-batches as on one stage
(:class:`~galvatron_fx.runtime.shapes.BatchShapes`); at a micro-batch shape other than the
captured one, the model is captured once more, every chunk body lowers its own layers of that
capture (:meth:`~galvatron_fx.runtime.shapes.ShapeVariants._add_variant`; the values crossing the
chunk boundaries must be the same), and a schedule for that shape and micro-batch count is built
over the same chunks with static shapes from that capture. ``Schedule1F1B`` needs at least as
many micro-batches as stages and ``ScheduleInterleaved1F1B`` whole rounds of them: a smaller batch
runs in GPipe order (``ScheduleGPipe``, ``ScheduleLoopedBFS``), which computes the same.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.runtime.shapes import BatchShapes, _signature

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining.stage import _PipelineStageBase

    from galvatron_fx.runtime.precision import LossScaler

log = logging.getLogger(__name__)


class _Chunk(Protocol):
    """What this module reads of the host's chunks (``runtime.pipeline._Chunk``, whose module
    imports this one): their body (a ``ParallelModule`` with its shape variants), the values they
    take and give, and their layout."""

    body: Any
    layout: dict
    in_names: list[str]
    out_names: list[str]
    is_last: bool

__all__ = ["PipelineShapes"]


class PipelineShapes(BatchShapes):
    """A pipeline's schedules by micro-batch shape and count (module doc)."""

    if TYPE_CHECKING:  # set or defined by the host ``PipelineModule``
        chunks: nn.ModuleList
        _mine: list[int]
        device: torch.device
        pp_group: dist.ProcessGroup
        scaler: LossScaler | None
        num_microbatches: int
        schedule: Any
        _schedules: dict[tuple, Any]
        _active: tuple | None
        _base_layout: dict[str, tuple]

        def _example(self, mg: ModelGraph, name: str, layout: dict) -> torch.Tensor: ...

        def _crossing(self, bounds: list[int], mg: ModelGraph | None = None) -> list[list[str]]: ...

        def _layout(self, mg: ModelGraph | None = None) -> dict[str, tuple]: ...

    def _make_schedule(self, mg: ModelGraph, m: int):
        """The plan's schedule over this rank's chunks for ``m`` micro-batches shaped as ``mg``
        captured them (static shapes: no inference forward on uninitialised tensors, whose integer
        inputs such as targets would hold garbage). Fewer micro-batches than a 1F1B schedule
        takes (``m`` < stages, or not whole rounds of the interleaved one: a smaller batch) run
        as GPipe, which computes the same."""
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleLoopedBFS,
        )

        nchunks = len(self.plan.chunk_layers())
        stages: list[_PipelineStageBase] = []
        for c, chunk in zip(self._mine, cast("list[_Chunk]", self.chunks)):
            ins = tuple(self._example(mg, n, chunk.layout) for n in chunk.in_names)
            outs = (torch.empty(1, device=self.device, requires_grad=True),) if chunk.is_last else \
                tuple(self._example(mg, n, chunk.layout) for n in chunk.out_names)
            stages.append(PipelineStage(cast("nn.Module", chunk), c, nchunks, self.device, input_args=ins, output_args=outs,
                                        group=self.pp_group))

        def loss_fn(out, _target):
            scale = self.scaler.scale if self.scaler is not None else 1.0
            return out.float().sum() * (scale / m)

        pp, kind = self.plan.pp, self.plan.schedule
        if kind == "interleaved_1f1b":
            rounds = max(1, m // pp)
            if m % rounds == 0:
                return ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn, scale_grads=False)
            return ScheduleLoopedBFS(stages, m, loss_fn=loss_fn, scale_grads=False)
        (stage,) = stages
        cls = ScheduleGPipe if kind == "gpipe" or m < pp else Schedule1F1B
        return cls(stage, m, loss_fn=loss_fn, scale_grads=False)

    def _schedule_for(self, args: tuple):
        """The schedule that runs ``args`` (a whole global batch, on every rank): the plan's for
        its own shape, else one for the micro-batches it splits into
        (:meth:`~galvatron_fx.runtime.shapes.BatchShapes._micro_batches`), at a new shape after
        capturing the model there once and lowering every chunk's layers under the plan
        (collective: every rank sees the same shapes). Returns ``(schedule, micro-batches)``."""
        micro = self._micro_batches(list(args))
        m, sig = len(micro), _signature(micro[0])
        key = None if self._is_base(sig) else sig
        if key is not None and key not in self._variants:
            with torch.enable_grad():  # (an evaluation's first call: the program has a backward all the same)
                self._build_pipeline_variant(key, micro[0])
        self._use(key)
        if (key, m) == (None, self.num_microbatches):
            return self.schedule, m
        if (key, m) not in self._schedules:
            self._schedules[(key, m)] = self._make_schedule(self._variants[key]["mg"] if key else self.mg, m)
        return self._schedules[(key, m)], m

    def _build_pipeline_variant(self, sig: tuple, inputs) -> None:
        t0 = time.perf_counter()
        mg = self._recapture_checked(sig, inputs)
        bounds = [r.start for r in self.plan.chunk_layers()] + [len(mg.layers)]
        crossing = self._crossing(bounds, mg)
        if crossing != self._crossing(bounds):
            raise PlanError(f"{self.mg.name} at shapes {[list(s[0]) for s in sig if s]} passes other values between "
                            "pipeline stages than at the planned shape: re-plan at this shape")
        for chunk in cast("list[_Chunk]", self.chunks):
            chunk.body._add_variant(sig, mg)
        self._variants[sig] = {"mg": mg, "layout": self._layout(mg)}
        while len(self._variants) > self.shape_cache_limit:
            old, _ = self._variants.popitem(last=False)
            for chunk in cast("list[_Chunk]", self.chunks):
                chunk.body._variants.pop(old, None)
            self.__dict__["_schedules"] = {k: v for k, v in self._schedules.items() if k[0] != old}
        log.info("galvatron_fx: micro-batches of shapes %s captured and lowered under the plan's stages in %.1f s",
                 [list(s[0]) for s in sig if s], time.perf_counter() - t0)

    def _use(self, key: tuple | None) -> None:
        """Switch every chunk to the variant ``key`` (None: the planned shape)."""
        if key == self._active:
            return
        if key is not None:
            self._variants.move_to_end(key)
        layout = self._variants[key]["layout"] if key is not None else self._base_layout
        for chunk in cast("list[_Chunk]", self.chunks):
            chunk.body._use_variant(key)
            chunk.layout = layout
        self.__dict__["_active"] = key

