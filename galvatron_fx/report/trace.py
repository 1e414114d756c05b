"""plan_trace — a plan's predicted step as a Chrome trace (``chrome://tracing``, Perfetto).

Contract: :func:`predicted_timeline` simulates one step of the plan's schedule from each chunk's
predicted forward and backward time per micro-batch (the sums of its layers' predicted times per
step over the micro-batches; communication, transitions and the optimizer are not in it), as the
HTML report draws it; :func:`chrome_trace` turns it into the trace-event JSON both viewers read:
one process ("predicted step"), one thread per pipeline stage, one complete event (``"ph": "X"``)
per forward or backward of a micro-batch on a chunk, in microseconds. A profiled step of a real
run (``torch.profiler``'s own export, :func:`galvatron_fx.runtime.efficiency.profiled`) opens in
the same viewers beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["chrome_trace", "predicted_timeline", "write_chrome_trace"]


def predicted_timeline(plan):
    """``(schedule name, simulation result with its timeline)`` of one step of ``plan``."""
    from galvatron_fx.cost_models.pipeline import StageCost, simulate

    m = plan.num_microbatches  # a layer's predicted times are per step: all its micro-batches
    costs = [StageCost(fwd_s=sum(plan.layers[i].predicted.fwd_s for i in rng) / m,
                       bwd_s=sum(plan.layers[i].predicted.bwd_s for i in rng) / m) for rng in plan.chunk_layers()]
    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    return schedule, simulate(schedule, costs, m, virtual_stages=plan.virtual_stages, record_timeline=True)


def chrome_trace(plan) -> dict[str, Any]:
    """The trace-event JSON of ``plan``'s predicted step (see the module doc)."""
    schedule, res = predicted_timeline(plan)
    pid = 0
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"predicted step: {plan.model}"}}]
    for r in range(res.num_stages):
        ranks = plan.stage_ranks[r] if r < len(plan.stage_ranks) else []
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": r,
                       "args": {"name": f"stage {r} (ranks {ranks[0]}–{ranks[-1]})" if ranks else f"stage {r}"}})
    for ev in res.timeline or ():
        kind = "forward" if ev.kind == "F" else "backward"
        events.append({"name": f"{ev.kind}{ev.microbatch}" + (f" chunk {ev.chunk}" if plan.virtual_stages > 1 else ""),
                       "cat": kind, "ph": "X", "pid": pid, "tid": ev.rank, "ts": ev.start_s * 1e6,
                       "dur": max(ev.end_s - ev.start_s, 0.0) * 1e6,
                       "args": {"micro-batch": ev.microbatch, "chunk": ev.chunk, "kind": kind}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"model": plan.model, "schedule": schedule, "num_microbatches": plan.num_microbatches,
                          "predicted_step_s": plan.predicted.step_time_s,
                          "bubble_fraction": res.bubble_fraction,
                          "note": "compute only: communication, transitions and the optimizer step are not drawn"}}


def write_chrome_trace(plan, path: str | os.PathLike) -> Path:
    """Write :func:`chrome_trace` of ``plan`` to ``path`` (JSON); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(chrome_trace(plan)))
    return p
