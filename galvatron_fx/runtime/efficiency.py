"""Measured efficiency of a training step: compute density (the time this rank computes over the
step's wall time) from one profiled step, and MFU from the plan's model FLOPs.

Contract: :func:`profiled` runs ``fn`` once under ``torch.profiler`` and returns its result with
the seconds this process spent computing and the step's wall seconds. Computing is the union of
the intervals of the operators that ran (on GPUs: the CUDA kernels; on CPU: the ``aten::``
operators), less the union of the communication ones inside them (collectives, their waits,
point-to-point sends and receives: names matching :data:`COMM_MARKERS`). Time blocked outside
any operator (a ``Work.wait()``, Python, the optimizer's host loop on a GPU) is not computing.
A step under the profiler runs somewhat slower than without; the density is the ratio of two
times measured in that same step. :func:`stage_density` gathers every rank's figure and gives
each pipeline stage's busiest rank's, as the plan predicts it (``PlanPrediction.compute_density``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from typing import Any, Callable

import torch

__all__ = ["COMM_MARKERS", "busy_seconds", "profiled", "stage_density"]

# an operator or kernel whose name matches moves or waits for data between processes
COMM_MARKERS = re.compile(r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
                          r"record_param_comms|wait_tensor|\bwait\b|send|recv|barrier", re.IGNORECASE)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def busy_seconds(compute: list[tuple[float, float]], comm: list[tuple[float, float]]) -> float:
    """Length of the union of ``compute`` intervals less the union of ``comm`` ones (same unit)."""
    total = 0.0
    holes = _union(comm)
    for s, e in _union(compute):
        total += e - s
        for hs, he in holes:
            if he > s and hs < e:
                total -= min(e, he) - max(s, hs)
    return max(total, 0.0)


_SEEN = [0]  # profiled calls in this process


@contextlib.contextmanager
def _native_stderr_off(off: bool):
    """Standard error's file descriptor pointed at the null device inside (``off``): what C++
    code writes there (the profiler's start and stop lines) is dropped; Python's own stream is
    flushed first and left as it was."""
    if not off:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profiled(fn: Callable[[], Any], trace: str | os.PathLike | None = None) -> tuple[Any, float, float]:
    """``(fn(), compute seconds, wall seconds)`` of one call of ``fn`` under the profiler;
    ``trace``: also write what it recorded there as a Chrome trace (``chrome://tracing``,
    Perfetto)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=acts)
    # the profiler's own start/stop lines (USDT: ...): shown the first time, by the first rank only
    import torch.distributed as dist

    first_rank = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    quiet = _SEEN[0] > 0 or not first_rank
    _SEEN[0] += 1
    with _native_stderr_off(quiet):
        prof.__enter__()
    try:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        with _native_stderr_off(quiet):
            prof.__exit__(None, None, None)
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    compute: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    for e in prof.events():
        on_gpu = e.device_type == DeviceType.CUDA
        if cuda != on_gpu or (not cuda and not e.name.startswith(("aten::", "_c10d", "c10d", "gloo"))):
            continue
        span = (float(e.time_range.start), float(e.time_range.end))
        (comm if COMM_MARKERS.search(e.name) else compute).append(span)
    busy = busy_seconds(compute, comm) / 1e6  # the profiler's microseconds
    return out, min(busy, wall), wall


def stage_density(density: float, stage_ranks) -> list[float] | None:
    """Every rank's ``density`` gathered (a collective: every rank calls it); on rank 0 each
    stage's busiest rank's, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [density]
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, float(density))
    if dist.get_rank() != 0:
        return None
    return [max(got[r] for r in ranks) for ranks in stage_ranks]
