"""Pipeline schedule simulator: step time and per-rank peak memory of GPipe, 1F1B and interleaved 1F1B.

Contract
    ``simulate(schedule, stages, num_microbatches, virtual_stages=v)`` takes one ``StageCost`` per
    (virtual) stage, in pipeline order, and returns a ``PipelineResult``: the step time, the bubble
    fraction, and per rank the busy time, the peak memory and the most micro-batches in flight.
    It is an event simulation of the exact per-rank operation order that
    ``torch.distributed.pipelining`` runs, not a closed-form estimate, so unbalanced stages,
    p2p latency and the schedule's own idle slots all show up in the result. Pure Python over
    integer-keyed arrays, O(p·m·v) work, no torch import: the planner calls it inside its search.

Terms
    p = ``num_stages`` = number of pipeline ranks; v = ``virtual_stages`` (chunks per rank; 1 unless
    interleaved); m = ``num_microbatches``. There are S = p·v *virtual stages* numbered 0..S-1 in
    pipeline order; virtual stage ``s`` lives on rank ``s % p`` as its chunk ``s // p`` (round-robin,
    as in Megatron and ``ScheduleInterleaved1F1B``: rank r holds stages r, r+p, r+2p, ...).
    F(s, i) / B(s, i) = forward / backward of micro-batch i on virtual stage s.
    ``stages[s].p2p_s`` is the time to send stage s's output activation to stage s+1;
    ``stages[s].p2p_bwd_s`` (default: ``p2p_s``) the time to send the gradient from stage s+1 back to
    stage s. The last stage's p2p fields are unused. A p2p transfer is paid only when the two
    stages sit on different ranks, and it does not occupy either rank (sends are asynchronous).

Algorithm
    1. Each rank gets its operation list in the schedule's fixed order (the order *is* the schedule):
       GPipe: F(0..m-1) then B(0..m-1) (``ScheduleGPipe``).
       1F1B: w = p-r-1 warm-up forwards, then m-w pairs (F, B), then w cool-down backwards
       (``Schedule1F1B``; peak in flight on rank r is min(p-r, m)).
       Interleaved 1F1B: ``ScheduleInterleaved1F1B._calculate_single_rank_operations`` of
       torch 2.13 with its no-op slots dropped: rounds = max(1, m // p), per_round = m / rounds,
       warm-up w_r = min((v-1)·per_round + 2·(p-1-r), m·v); step k's forward chunk is
       (k // per_round) % v, its backward chunk v-1 - ((k - w_r) // per_round) % v; each (chunk)
       takes micro-batches in increasing order.
    2. List scheduling: an operation starts at max(its rank is free, every dependency's end + p2p):
       F(s, i) needs F(s-1, i); B(s, i) needs F(s, i) and B(s+1, i) (the last stage only F(s, i)).
       Each rank advances through its list while its next operation's dependencies are scheduled;
       a rank that blocks is parked on the operation it waits for and woken when that operation is
       scheduled. Every operation is scheduled once, so the loop is linear in the number of
       operations. If ranks remain parked with no runnable rank, the order deadlocks: raise.
    3. Memory depends only on the order: a micro-batch's activation of a stage is held from the
       start of its forward to the end of its backward, so walking a rank's list (F adds, B removes
       after it runs) gives the exact maximum over time.

    step_time_s = the last operation's end (the first starts at 0).
    bubble_fraction = mean over ranks of (step_time_s - busy_s[r]) / step_time_s; with uniform stages
    and no p2p this is the textbook (p-1)/(m+p-1) for GPipe and 1F1B.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import NamedTuple

from galvatron_fx.errors import ConfigError

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10 fallback
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


logger = logging.getLogger(__name__)

__all__ = [
    "PipelineEvent",
    "PipelineResult",
    "ScheduleKind",
    "StageCost",
    "rank_orders",
    "simulate",
    "textbook_bubble_fraction",
    "textbook_step_time_s",
]

_F = 0
_B = 1


class ScheduleKind(StrEnum):
    """The pipeline schedules simulated (names match the plan's ``schedule`` field)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"


@dataclass(frozen=True, kw_only=True)
class StageCost:
    """Costs of one (virtual) pipeline stage for one micro-batch.

    ``activation_bytes`` is held per micro-batch in flight on this stage; ``static_bytes`` (params,
    grads, optimizer state) is held all the time. ``p2p_s`` sends this stage's output to the next
    stage; ``p2p_bwd_s`` (``None`` = same as ``p2p_s``) sends the next stage's input-gradient back.
    """

    fwd_s: float
    bwd_s: float
    activation_bytes: int = 0
    static_bytes: int = 0
    p2p_s: float = 0.0
    p2p_bwd_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("fwd_s", "bwd_s", "p2p_s", "activation_bytes", "static_bytes"):
            value = getattr(self, name)
            if not value >= 0:  # also rejects NaN
                raise ConfigError(
                    f"StageCost.{name} must be >= 0, got {value!r}; check the stage's cost estimate"
                )
        if self.p2p_bwd_s is not None and not self.p2p_bwd_s >= 0:
            raise ConfigError(f"StageCost.p2p_bwd_s must be >= 0 or None, got {self.p2p_bwd_s!r}")


class PipelineEvent(NamedTuple):
    """One executed operation, for drawing a timeline."""

    rank: int
    kind: str  # "F" or "B"
    microbatch: int
    chunk: int  # local chunk index on the rank (virtual stage = chunk * num_stages + rank)
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PipelineResult:
    """Outcome of one simulated training step; per-rank tuples are indexed by pipeline rank."""

    schedule: ScheduleKind
    num_stages: int
    num_microbatches: int
    virtual_stages: int
    step_time_s: float
    bubble_fraction: float  # mean over ranks of idle / step_time_s
    busy_s: tuple[float, ...]
    peak_memory_bytes: tuple[int, ...]  # static + peak in-flight activations
    max_in_flight: tuple[int, ...]  # most (micro-batch, chunk) activations held at once
    timeline: tuple[PipelineEvent, ...] | None = None


def textbook_step_time_s(p: int, m: int, f: float, b: float) -> float:
    """Closed form (m + p - 1)(f + b) for GPipe/1F1B on uniform stages without p2p (tests and docs only)."""
    return (m + p - 1) * (f + b)


def textbook_bubble_fraction(p: int, m: int) -> float:
    """Closed form (p - 1) / (m + p - 1) of the GPipe/1F1B bubble on uniform stages (tests and docs only)."""
    return (p - 1) / (m + p - 1)


def _schedule_kind(schedule: ScheduleKind | str) -> ScheduleKind:
    try:
        return ScheduleKind(schedule)
    except ValueError:
        names = ", ".join(repr(k.value) for k in ScheduleKind)
        raise ConfigError(f"unknown pipeline schedule {schedule!r}; use one of {names}") from None


def _validate(schedule: ScheduleKind, num_total: int, m: int, v: int) -> int:
    """Check the configuration and return the number of ranks p."""
    if num_total < 1:
        raise ConfigError("a pipeline needs at least one stage; got an empty stage list")
    if m < 1:
        raise ConfigError(f"num_microbatches must be >= 1, got {m}")
    if v < 1:
        raise ConfigError(f"virtual_stages must be >= 1, got {v}")
    if schedule is not ScheduleKind.INTERLEAVED_1F1B and v != 1:
        raise ConfigError(
            f"schedule {schedule.value!r} runs one stage per rank, but virtual_stages={v}; "
            "use 'interleaved_1f1b' for several chunks per rank, or virtual_stages=1"
        )
    if num_total % v:
        raise ConfigError(
            f"{num_total} stage costs cannot be split into {v} virtual stages per rank; "
            f"pass num_stages * virtual_stages costs (a multiple of {v})"
        )
    p = num_total // v
    if schedule is ScheduleKind.ONE_F_ONE_B and m < p:
        raise ConfigError(
            f"1F1B needs num_microbatches >= num_stages, got {m} micro-batches for {p} stages "
            "(torch's Schedule1F1B refuses it too); use at least "
            f"{p} micro-batches, fewer stages, or the 'gpipe' schedule"
        )
    if schedule is ScheduleKind.INTERLEAVED_1F1B:
        # torch 2.13 ScheduleInterleaved1F1B: rounds = max(1, m // p), needs m % rounds == 0.
        rounds = max(1, m // p)
        if m % rounds:
            raise ConfigError(
                f"interleaved 1F1B needs num_microbatches to be a multiple of its number of rounds "
                f"max(1, m // num_stages) = {rounds}, got m={m} with {p} stages "
                "(torch's ScheduleInterleaved1F1B refuses it too); use a multiple of num_stages, "
                f"e.g. m={p * rounds} or m={p * (rounds + 1)}"
            )
    return p


def rank_orders(
    schedule: ScheduleKind | str, num_stages: int, num_microbatches: int, *, virtual_stages: int = 1
) -> list[list[tuple[str, int, int]]]:
    """Per-rank operation order as lists of ``(kind 'F'/'B', virtual_stage, microbatch)``.

    The same order that ``simulate`` executes; useful for checking against torch and for display.
    """
    schedule = _schedule_kind(schedule)
    _validate(schedule, num_stages * virtual_stages, num_microbatches, virtual_stages)
    names = ("F", "B")
    orders = [
        _rank_order(schedule, num_stages, num_microbatches, virtual_stages, r) for r in range(num_stages)
    ]
    return [[(names[k], s, i) for k, s, i in order] for order in orders]


def _rank_order(schedule: ScheduleKind, p: int, m: int, v: int, rank: int) -> list[tuple[int, int, int]]:
    """Operations of one rank, in execution order, as (kind, virtual stage, micro-batch)."""
    if schedule is ScheduleKind.GPIPE:
        return [(_F, rank, i) for i in range(m)] + [(_B, rank, i) for i in range(m)]
    if schedule is ScheduleKind.ONE_F_ONE_B:
        warmup = min(p - rank - 1, m)
        ops = [(_F, rank, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops.append((_F, rank, warmup + i))
            ops.append((_B, rank, i))
        ops.extend((_B, rank, i) for i in range(m - warmup, m))
        return ops
    # Interleaved 1F1B, transcribed from torch 2.13 ScheduleInterleaved1F1B (no-op slots dropped).
    rounds = max(1, m // p)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    total_mb_ops = m * v
    fwd_next = [0] * v  # next micro-batch per local chunk
    bwd_next = [0] * v
    ops = []
    for step in range(total_mb_ops + warmup):
        if step < total_mb_ops:  # warm-up and steady phases run a forward
            chunk = (step // per_round) % v
            ops.append((_F, chunk * p + rank, fwd_next[chunk]))
            fwd_next[chunk] += 1
        if step >= warmup:  # steady and cool-down phases run a backward
            chunk = v - 1 - ((step - warmup) // per_round) % v
            ops.append((_B, chunk * p + rank, bwd_next[chunk]))
            bwd_next[chunk] += 1
    return ops


def simulate(
    schedule: ScheduleKind | str,
    stages: list[StageCost] | tuple[StageCost, ...],
    num_microbatches: int,
    *,
    virtual_stages: int = 1,
    record_timeline: bool = False,
) -> PipelineResult:
    """Simulate one training step of a pipeline schedule and return its time and memory.

    ``stages`` holds one ``StageCost`` per virtual stage in pipeline order (``num_stages *
    virtual_stages`` of them; virtual stage s runs on rank s % num_stages). Raises ``ConfigError`` on
    impossible configurations (1F1B with fewer micro-batches than stages, interleaved 1F1B with a
    micro-batch count torch refuses, negative costs) and ``AssertionError`` if an order deadlocks.
    See the module docstring for the exact semantics.
    """
    schedule = _schedule_kind(schedule)
    stages = tuple(stages)
    m = num_microbatches
    v = virtual_stages
    num_total = len(stages)
    p = _validate(schedule, num_total, m, v)

    fwd = [st.fwd_s for st in stages]
    bwd = [st.bwd_s for st in stages]
    # Latency into stage s's forward (from s-1) and into stage s's backward (from s+1); zero on the
    # same rank (only possible when p == 1).
    fwd_in = [0.0] * num_total
    bwd_in = [0.0] * num_total
    if p > 1:
        for s in range(1, num_total):
            fwd_in[s] = stages[s - 1].p2p_s
        for s in range(num_total - 1):
            st = stages[s]
            bwd_in[s] = st.p2p_s if st.p2p_bwd_s is None else st.p2p_bwd_s

    orders = [_rank_order(schedule, p, m, v, r) for r in range(p)]
    num_ops = 2 * num_total * m
    # Operation key: (kind * S + stage) * m + microbatch; end[key] < 0 means "not scheduled yet".
    end = [-1.0] * num_ops
    b_base = num_total * m
    pos = [0] * p
    free_at = [0.0] * p
    waiting: dict[int, int] = {}  # op key -> rank parked on it
    ready = list(range(p - 1, -1, -1))
    events: list[PipelineEvent] | None = [] if record_timeline else None
    last_stage = num_total - 1

    while ready:
        r = ready.pop()
        order = orders[r]
        n = len(order)
        k = pos[r]
        t_free = free_at[r]
        while k < n:
            kind, s, i = order[k]
            if kind == _F:
                if s:
                    dep = (s - 1) * m + i
                    dep_end = end[dep]
                    if dep_end < 0.0:
                        waiting[dep] = r
                        break
                    start = dep_end + fwd_in[s]
                    if start < t_free:
                        start = t_free
                else:
                    start = t_free
                key = s * m + i
                t_free = start + fwd[s]
            else:
                dep = s * m + i  # own forward
                dep_end = end[dep]
                if dep_end < 0.0:
                    waiting[dep] = r
                    break
                start = t_free if t_free > dep_end else dep_end
                if s != last_stage:
                    dep = b_base + (s + 1) * m + i
                    dep_end = end[dep]
                    if dep_end < 0.0:
                        waiting[dep] = r
                        break
                    dep_end += bwd_in[s]
                    if dep_end > start:
                        start = dep_end
                key = b_base + s * m + i
                t_free = start + bwd[s]
            end[key] = t_free
            if events is not None:
                events.append(PipelineEvent(r, "FB"[kind], i, s // p, start, t_free))
            woken = waiting.pop(key, None)
            if woken is not None:
                ready.append(woken)
            k += 1
        pos[r] = k
        free_at[r] = t_free

    if waiting or any(pos[r] != len(orders[r]) for r in range(p)):
        stuck = {
            r: ("FB"[orders[r][pos[r]][0]], orders[r][pos[r]][1], orders[r][pos[r]][2])
            for r in range(p)
            if pos[r] < len(orders[r])
        }
        raise AssertionError(
            f"pipeline order deadlocks ({schedule.value}, p={p}, m={m}, v={v}): "
            f"ranks are stuck at (kind, virtual stage, micro-batch) {stuck}"
        )

    step_time_s = max(free_at)
    busy = [0.0] * p
    static = [0] * p
    for s, st in enumerate(stages):
        busy[s % p] += m * (st.fwd_s + st.bwd_s)
        static[s % p] += st.static_bytes
    peak_bytes = []
    max_in_flight = []
    act = [st.activation_bytes for st in stages]
    for r in range(p):
        held = held_bytes = top = top_bytes = 0
        for kind, s, _ in orders[r]:
            if kind == _F:
                held += 1
                held_bytes += act[s]
                if held > top:
                    top = held
                if held_bytes > top_bytes:
                    top_bytes = held_bytes
            else:
                held -= 1
                held_bytes -= act[s]
        max_in_flight.append(top)
        peak_bytes.append(static[r] + top_bytes)
    bubble = sum(step_time_s - b for b in busy) / (p * step_time_s) if step_time_s > 0.0 else 0.0
    timeline = None
    if events is not None:
        events.sort(key=lambda e: (e.start_s, e.rank))
        timeline = tuple(events)
    return PipelineResult(
        schedule=schedule,
        num_stages=p,
        num_microbatches=m,
        virtual_stages=v,
        step_time_s=step_time_s,
        bubble_fraction=bubble,
        busy_s=tuple(busy),
        peak_memory_bytes=tuple(peak_bytes),
        max_in_flight=tuple(max_in_flight),
        timeline=timeline,
    )
