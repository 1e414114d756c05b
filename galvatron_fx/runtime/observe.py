"""What a running plan measures about itself, cheaply: the closed loop's observations.

Contract: :func:`start` arms a :class:`~galvatron_fx.runtime.parallel_module.ParallelModule` or
:class:`~galvatron_fx.runtime.pipeline.PipelineModule` to record its next ``steps`` calls of
``train_step``; once they ran, :func:`finish` (collective: every rank calls it) gathers every
rank's records into :class:`Observations` (identical on every rank) and disarms the module.
Between the two, each observed step costs a clock read (a CUDA event on GPUs) at each layer call's
start and end, at each layer's backward start (a gradient hook on its outputs), around the
gradient sync and the optimizer step — no profiler trace. The first observed step of a
``ParallelModule`` that runs one micro-batch also measures the peak of tensor memory
(``torch.cuda.max_memory_allocated`` on GPUs; on CPUs ``MemTracker``, whose bookkeeping slows that
step, so it is left out of the times). :func:`probe_links` times all-reduces on the plan's own
data- and tensor-parallel groups (``LINK_PROBE_BYTES``), what the refit fits link rates from.

Attribution: the marks of one step, in the order they were taken, cut it into intervals; each
interval belongs to the mark that opens it — a layer's forward (from its call to its return), its
backward (from the gradient reaching its outputs to the next mark: the gradient reaching the
previous layer's outputs, the next micro-batch's forward, or the gradient sync), the sync, the
optimizer, or the loop between them (resharding between layers, the loss, Python). Per layer and
step the seconds of all micro-batches add up, as the plan's per-layer ``fwd_s``/``bwd_s`` do.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from galvatron_fx.runtime.hooks import Hooks
from galvatron_fx.runtime.meshes import device_type

__all__ = ["LINK_PROBE_BYTES", "Observations", "finish", "probe_links", "start"]

LINK_PROBE_BYTES = (1 << 16, 1 << 22)
_PROBE_REPEATS = 9


@dataclass(frozen=True)
class Observations:
    """What ``steps`` observed steps of a plan measured, over all ranks: per layer name its
    forward and backward seconds per step (median over steps, the slowest rank holding it), the
    gradient sync's and the optimizer's seconds per step, the step's wall seconds (each rank's
    median over the steps, the slowest rank's), the peak tensor bytes of the hungriest rank (None when not
    measured), and the all-reduces timed on the plan's groups as ``(op, bytes, ranks, seconds)``."""

    plan_hash: str
    steps: int
    layer_s: dict[str, tuple[float, float]]
    sync_s: float
    optimizer_s: float
    step_s: float
    peak_bytes: int | None
    collectives: tuple[tuple[str, int, tuple[int, ...], float], ...] = ()
    step_times_s: tuple[float, ...] = field(default=())  # per observed step, the slowest rank's

    def check(self) -> Observations:
        """Itself when every figure is a finite number >= 0 (seconds, bytes), else a
        ``ConfigError`` naming each that is not: a NaN or negative time would fit a cost model
        that predicts NaN or negative steps."""
        import math

        from galvatron_fx.errors import ConfigError

        bad = []

        def see(name: str, v) -> None:
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                                  or v < 0):
                bad.append(f"{name} = {v!r}")

        for k, (f, b) in self.layer_s.items():
            see(f"layer_s[{k!r}] forward", f)
            see(f"layer_s[{k!r}] backward", b)
        for name in ("sync_s", "optimizer_s", "step_s", "peak_bytes"):
            see(name, getattr(self, name))
        for i, c in enumerate(self.collectives):
            see(f"collectives[{i}] bytes", c[1])
            see(f"collectives[{i}] seconds", c[3])
        for i, t in enumerate(self.step_times_s):
            see(f"step_times_s[{i}]", t)
        if bad:
            raise ConfigError(f"observations of plan {self.plan_hash[:12] or '?'} hold figures that are not finite "
                              f"numbers >= 0: {', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''}; observe the "
                              "steps again (pm.observe) instead of refitting on them")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"plan_hash": self.plan_hash, "steps": self.steps,
                "layer_s": {k: list(v) for k, v in self.layer_s.items()}, "sync_s": self.sync_s,
                "optimizer_s": self.optimizer_s, "step_s": self.step_s, "peak_bytes": self.peak_bytes,
                "collectives": [list(c[:2]) + [list(c[2]), c[3]] for c in self.collectives],
                "step_times_s": list(self.step_times_s)}


class _Timeline:
    """Marks taken in order: host clock reads, or CUDA events resolved after the step."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list[tuple[tuple, Any]] = []

    def mark(self, label: tuple) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((label, e))
        else:
            self.marks.append((label, time.perf_counter()))

    def intervals(self) -> list[tuple[tuple, float]]:
        if self.cuda:
            torch.cuda.synchronize()
            return [(a[0], a[1].elapsed_time(b[1]) / 1e3) for a, b in zip(self.marks, self.marks[1:])]
        return [(a[0], b[1] - a[1]) for a, b in zip(self.marks, self.marks[1:])]


def _tensors(outs) -> list[torch.Tensor]:
    items = outs if isinstance(outs, (tuple, list)) else [outs]
    out = []
    for v in items:
        t = getattr(v, "local", v)  # a lowered layer's LocalValue
        if isinstance(t, torch.Tensor) and t.requires_grad:
            out.append(t)
    return out


class _Recorder:
    """The instruments of one module (see the module doc), on the module's hook lists
    (:class:`~galvatron_fx.runtime.hooks.Hooks`): a step hook from the first use on; while armed
    for a number of steps, a layer-call hook and a sync hook too."""

    def __init__(self, pm):
        self.pm = pm
        self.left = 0
        self.cuda = device_type() == "cuda"
        self.tl = _Timeline(self.cuda)
        self.records: list[dict] = []
        self.peak_bytes: int | None = None
        # MemTracker follows one module's layers in one micro-batch: not a pipeline's chunks
        self.can_track_memory = pm.bodies() == [pm]
        self.memory_next = False
        pm.hooks.step.append(self._step)

    # ---- arming ----
    def arm(self, steps: int, memory: bool = True) -> None:
        self.left, self.records, self.peak_bytes = steps, [], None
        self.memory_next = memory and self.can_track_memory and self.pm.num_microbatches == 1
        self._wrap(True)

    def _wrap(self, on: bool) -> None:
        hooks = self.pm.hooks
        for hook, where in ((self._layer, hooks.layer), (self._sync, hooks.sync)):
            if on and hook not in where:
                where.append(hook)
            elif not on:
                Hooks.remove(where, hook)

    @property
    def armed(self) -> bool:
        return self.left > 0

    def _layer(self, name: str, call, *xs):
        tl = self.tl
        tl.mark(("fwd", name))
        outs = call(*xs)
        tl.mark(("loop",))
        for t in _tensors(outs):
            t.register_hook(lambda g, name=name: tl.mark(("bwd", name)))
        return outs

    def _sync(self, call) -> None:
        self.tl.mark(("sync",))
        call()
        self.tl.mark(("loop",))

    # ---- a step ----
    def _step(self, call, batch, optimizer, **kw):
        if not self.armed:
            return call(batch, optimizer, **kw)
        if self.memory_next:  # one step for memory, not timed
            self.memory_next = False
            return self._memory_step(call, batch, optimizer, **kw)
        return self._timed_step(call, batch, optimizer, **kw)

    def _timed_step(self, call, batch, optimizer, **kw):
        tl = self.tl
        tl.marks.clear()
        orig = optimizer.step

        def step(*a, **k):
            tl.mark(("optim",))
            r = orig(*a, **k)
            tl.mark(("loop",))
            return r

        optimizer.step = step
        try:
            if self.cuda:
                torch.cuda.reset_peak_memory_stats()
            tl.mark(("loop",))
            loss = call(batch, optimizer, **kw)
            tl.mark(("end",))
        finally:
            del optimizer.step
        rec: dict[str, Any] = {"layers": {}, "sync": 0.0, "optim": 0.0, "step": 0.0}
        for label, dt in tl.intervals():
            rec["step"] += dt
            if label[0] in ("fwd", "bwd"):
                f, b = rec["layers"].get(label[1], (0.0, 0.0))
                rec["layers"][label[1]] = (f + dt, b) if label[0] == "fwd" else (f, b + dt)
            elif label[0] in ("sync", "optim"):
                rec[label[0]] += dt
        if self.cuda:
            self.peak_bytes = max(self.peak_bytes or 0, torch.cuda.max_memory_allocated())
        self.records.append(rec)
        self.left -= 1
        if self.left == 0:
            self._wrap(False)
        return loss

    def _memory_step(self, call, batch, optimizer, **kw):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            loss = call(batch, optimizer, **kw)
            self.peak_bytes = torch.cuda.max_memory_allocated()
            return loss
        from torch.distributed._tools.mem_tracker import MemTracker

        self._wrap(False)  # MemTracker follows the plain module
        try:
            tracker = MemTracker()
            tracker.track_external(self.pm, optimizer, *[x for x in self.pm.mg.bind_inputs(batch)
                                                          if isinstance(x, torch.Tensor)])
            with tracker:
                loss = call(batch, optimizer, **kw)
            snap = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
            kinds = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
            self.peak_bytes = kinds.get("Total") or None
        finally:
            self._wrap(True)
        return loss


def recorder(pm) -> _Recorder:
    """``pm``'s recorder, installed on first use."""
    rec = pm._recorder
    if rec is None:
        rec = pm._recorder = _Recorder(pm)
    return rec


def start(pm, steps: int, memory: bool = True) -> _Recorder:
    """Arm ``pm`` to observe its next ``steps`` training steps (see the module doc); ``memory``:
    measure the peak too (on CPUs one more step, under ``MemTracker``)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"observe at least one step, got {steps!r}")
    rec = recorder(pm)
    rec.arm(steps, memory)
    return rec


def probe_links(pm) -> list[tuple[str, int, tuple[int, ...], float]]:
    """All-reduces timed on the whole world and on this stage's data- and tensor-parallel groups
    (collective over each group; every rank calls it): ``(op, bytes, the group's ranks, seconds)``
    per group and size — the fastest of :data:`_PROBE_REPEATS` after three warm-ups: what the link
    can do, the figure that repeats from run to run (contention in a step is the step's to show)."""
    from galvatron_fx.runtime.checkpoint.slots import bodies_of

    out = []
    device = torch.device("cuda", torch.cuda.current_device()) if device_type() == "cuda" else torch.device("cpu")
    groups = []
    if dist.get_world_size() > 1:  # the whole world: the links another plan's groups would use
        groups.append(dist.group.WORLD)
    body = bodies_of(pm)[0]
    for dp, tp in sorted({(lp.dp, lp.strategy.tp) for lp in body.plan.layers
                          if lp.stage == body.plan.layers[body.layer_ids[0]].stage}):
        mesh = body.mesh(dp, tp)
        groups += [mesh.get_group(axis) for axis, size in (("dp", dp), ("tp", tp)) if size > 1]
    seen = set()
    for group in groups:
        ranks = tuple(dist.get_process_group_ranks(group))
        if ranks in seen:
            continue
        seen.add(ranks)
        for nbytes in LINK_PROBE_BYTES:
            x = torch.ones(nbytes // 4, device=device)
            for _ in range(3):  # warm-up
                dist.all_reduce(x, group=group)
            times = []
            for _ in range(_PROBE_REPEATS):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                dist.all_reduce(x, group=group)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            out.append(("all_reduce", nbytes, ranks, min(times)))
    return out


def finish(pm, links: bool = True) -> Observations:
    """Gather what ``pm``'s observer recorded into :class:`Observations` (collective); with
    ``links``, time the plan's groups first (:func:`probe_links`)."""
    rec = pm._recorder
    if rec is None or not rec.records:
        raise RuntimeError("nothing observed: call pm.observe(steps) and train those steps first")
    if rec.armed:
        rec.left = 0
        rec._wrap(False)
    colls = probe_links(pm) if links else []
    mine = {"records": rec.records, "peak": rec.peak_bytes, "colls": colls}
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    steps = min(len(r["records"]) for r in every)
    layer_s: dict[str, tuple[float, float]] = {}
    names = {n for r in every for rec_ in r["records"] for n in rec_["layers"]}
    for n in sorted(names):
        per_rank = []
        for r in every:
            vals = [s["layers"][n] for s in r["records"][:steps] if n in s["layers"]]
            if vals:
                per_rank.append((statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)))
        layer_s[n] = (max(v[0] for v in per_rank), max(v[1] for v in per_rank))
    step_times = [max(r["records"][i]["step"] for r in every) for i in range(steps)]

    def med(key: str) -> float:  # the slowest rank's median (a rank's own steps, then the ranks)
        return max(statistics.median(x[key] for x in r["records"][:steps]) for r in every)

    peaks = [r["peak"] for r in every if r["peak"]]
    seen: dict[tuple, float] = {}
    for r in every:
        for op, nbytes, ranks, s in r["colls"]:
            seen[(op, nbytes, tuple(ranks))] = max(seen.get((op, nbytes, tuple(ranks)), 0.0), s)
    rec.records = []
    return Observations(plan_hash=pm.plan.plan_hash(), steps=steps, layer_s=layer_s, sync_s=med("sync"),
                        optimizer_s=med("optim"), step_s=med("step"),
                        peak_bytes=max(peaks) if peaks else None,
                        collectives=tuple((k[0], k[1], k[2], v) for k, v in sorted(seen.items())),
                        step_times_s=tuple(step_times))
