"""Pipeline schedule simulator: exact step times against hand computation and torch's own orders."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from galvatron_fx.cost_models.pipeline import (
    PipelineEvent,
    ScheduleKind,
    StageCost,
    rank_orders,
    simulate,
    textbook_bubble_fraction,
    textbook_step_time_s,
)
from galvatron_fx.errors import ConfigError

# Dyadic times keep float sums exact, so the equalities below are exact, not approximate.
UNIFORM_CASES = [
    (1, 1, 1.0, 1.0),
    (2, 2, 1.0, 1.0),
    (2, 4, 1.0, 2.0),
    (4, 4, 0.5, 1.0),
    (4, 8, 1.0, 2.0),
    (8, 32, 0.25, 0.5),
]


def _uniform(p: int, f: float, b: float, **kw) -> list[StageCost]:
    return [StageCost(fwd_s=f, bwd_s=b, **kw) for _ in range(p)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m,f,b", UNIFORM_CASES)
def test_uniform_stages_match_textbook(schedule, p, m, f, b):
    res = simulate(schedule, _uniform(p, f, b), m)
    assert res.step_time_s == textbook_step_time_s(p, m, f, b)
    assert res.bubble_fraction == pytest.approx(textbook_bubble_fraction(p, m), abs=1e-12)
    assert res.busy_s == tuple(m * (f + b) for _ in range(p))


def test_schedule_kind_values():
    assert [k.value for k in ScheduleKind] == ["gpipe", "1f1b", "interleaved_1f1b"]
    assert ScheduleKind("1f1b") is ScheduleKind.ONE_F_ONE_B


@pytest.mark.parametrize("p,m", [(4, 4), (4, 10), (8, 32)])
def test_in_flight_and_peak_memory(p, m):
    act, static = 1000, 7
    stages = _uniform(p, 1.0, 2.0, activation_bytes=act, static_bytes=static)
    one = simulate("1f1b", stages, m)
    assert one.max_in_flight == tuple(min(p - s, m) for s in range(p))
    assert one.peak_memory_bytes == tuple(static + min(p - s, m) * act for s in range(p))
    gp = simulate("gpipe", stages, m)
    assert gp.max_in_flight == (m,) * p
    assert gp.peak_memory_bytes == (static + m * act,) * p


def test_p2p_adds_hand_computed_latency():
    # p=2, m=2, 1F1B, f=1, b=2. Critical path: F0@r0 [0,1] -> p2p -> F0@r1 [1.5,2.5], B0@r1 [2.5,4.5],
    # F1@r1 [4.5,5.5], B1@r1 [5.5,7.5] -> p2p -> B1@r0 [8,10]. Without p2p: (m+p-1)(f+b) = 9.
    assert simulate("1f1b", _uniform(2, 1.0, 2.0), 2).step_time_s == 9.0
    assert simulate("1f1b", _uniform(2, 1.0, 2.0, p2p_s=0.5), 2).step_time_s == 10.0
    # A cheaper backward link only shortens the last hop: B1@r0 starts at 7.5 + 0.25.
    assert simulate("1f1b", _uniform(2, 1.0, 2.0, p2p_s=0.5, p2p_bwd_s=0.25), 2).step_time_s == 9.75
    # The last stage's p2p leads nowhere and must not count.
    stages = [StageCost(fwd_s=1.0, bwd_s=2.0, p2p_s=0.5), StageCost(fwd_s=1.0, bwd_s=2.0, p2p_s=100.0)]
    assert simulate("gpipe", stages, 2).step_time_s == 10.0


def test_interleaved_hand_computed_small_case():
    # p=2, v=2, m=4, f=b=1 per chunk. Hand-traced from torch's order: rank 0 runs
    # F(s0,0) F(s0,1) F(s2,0) F(s2,1) | F(s0,2) B(s2,0) F(s0,3) B(s2,1) F(s2,2) B(s0,0) F(s2,3) B(s0,1) |
    # B(s2,2) B(s2,3) B(s0,2) B(s0,3); its last backward runs over [17, 18]. Each rank is busy 16.
    res = simulate("interleaved_1f1b", _uniform(4, 1.0, 1.0), 4, virtual_stages=2, record_timeline=True)
    assert res.step_time_s == 18.0
    assert res.busy_s == (16.0, 16.0)
    assert res.bubble_fraction == pytest.approx(2 / 18)
    assert res.max_in_flight == (5, 3)
    last = max(res.timeline, key=lambda e: e.end_s)
    assert last == PipelineEvent(rank=0, kind="B", microbatch=3, chunk=0, start_s=17.0, end_s=18.0)
    # The same model as 1F1B (two chunks fused per stage: f=b=2) takes (4+2-1)*4 = 20.
    plain = simulate("1f1b", _uniform(2, 2.0, 2.0), 4)
    assert plain.step_time_s == 20.0
    assert res.bubble_fraction < plain.bubble_fraction


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 32)])
def test_interleaved_has_smaller_bubble(p, m):
    v = 2
    inter = simulate("interleaved_1f1b", _uniform(p * v, 0.5, 1.0), m, virtual_stages=v)
    plain = simulate("1f1b", _uniform(p, 1.0, 2.0), m)
    assert inter.busy_s == plain.busy_s
    assert inter.step_time_s < plain.step_time_s
    assert inter.bubble_fraction < plain.bubble_fraction


def test_slowest_stage_dominates():
    # p=2, m=4, 1F1B, stage 1 is slow (f=2, b=4). Hand-traced: rank 1 runs its 8 ops back to back
    # from t=1 (F0 of stage 0) to t=25; stage 0's last backward runs over [25, 26].
    stages = [StageCost(fwd_s=1.0, bwd_s=1.0), StageCost(fwd_s=2.0, bwd_s=4.0)]
    res = simulate("1f1b", stages, 4)
    assert res.step_time_s == 26.0 == 1.0 + 4 * (2.0 + 4.0) + 1.0
    assert res.busy_s == (8.0, 24.0)
    # p=3, slow middle stage (hand-traced). GPipe: rank 1 finishes its forwards at 9 but B(s1,0) waits
    # for rank 2's forwards (done at 10) and its B(s2,0) [10, 11]; rank 1 then runs its 4 backwards
    # over [11, 27] and stage 0's last backward over [27, 28]. 1F1B hides stage 2 behind rank 1's
    # second forward (F(s1,1) over [3, 5] while stage 2 runs F, B of mb 0 over [3, 5]), so rank 1 never
    # idles after t=1: 1 + 24 + 1 = 26. A closed form "others once + slowest m times" (28) is wrong
    # for 1F1B.
    fast, slow = StageCost(fwd_s=1.0, bwd_s=1.0), StageCost(fwd_s=2.0, bwd_s=4.0)
    stages = [fast, slow, fast]
    assert simulate("gpipe", stages, 4).step_time_s == 28.0
    assert simulate("1f1b", stages, 4).step_time_s == 26.0


def test_errors():
    with pytest.raises(ConfigError, match="1F1B needs num_microbatches >= num_stages"):
        simulate("1f1b", _uniform(4, 1.0, 1.0), 3)
    assert simulate("gpipe", _uniform(4, 1.0, 1.0), 3).step_time_s == textbook_step_time_s(4, 3, 1.0, 1.0)
    with pytest.raises(ConfigError, match=">= 0"):
        StageCost(fwd_s=-1.0, bwd_s=1.0)
    with pytest.raises(ConfigError, match="p2p_bwd_s"):
        StageCost(fwd_s=1.0, bwd_s=1.0, p2p_bwd_s=-0.1)
    with pytest.raises(ConfigError, match="virtual_stages"):
        simulate("1f1b", _uniform(4, 1.0, 1.0), 4, virtual_stages=2)
    with pytest.raises(ConfigError, match="cannot be split"):
        simulate("interleaved_1f1b", _uniform(5, 1.0, 1.0), 4, virtual_stages=2)
    # torch: rounds = max(1, m // p) must divide m. p=4, m=6 -> rounds 1 (ok); m=9 -> rounds 2 (refused).
    simulate("interleaved_1f1b", _uniform(8, 1.0, 1.0), 6, virtual_stages=2)
    with pytest.raises(ConfigError, match="multiple of its number of rounds"):
        simulate("interleaved_1f1b", _uniform(8, 1.0, 1.0), 9, virtual_stages=2)
    with pytest.raises(ConfigError, match="unknown pipeline schedule 'zero_bubble'"):
        simulate("zero_bubble", _uniform(2, 1.0, 1.0), 2)


def _torch_orders(schedule: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """The per-rank order torch builds, without no-op slots and grad reductions."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    if schedule == "interleaved_1f1b":
        rounds = max(1, m // p)
        ns = SimpleNamespace(
            n_local_stages=v, pp_group_size=p, _n_microbatches=m, microbatches_per_round=m // rounds
        )
        raw = [sched.ScheduleInterleaved1F1B._calculate_single_rank_operations(ns, r) for r in range(p)]
    elif schedule == "gpipe":
        order = sched.ScheduleGPipe._get_pipeline_order(SimpleNamespace(_num_stages=p, _n_microbatches=m))
        raw = [order[r] for r in range(p)]
    else:
        # Schedule1F1B._get_pipeline_order (the IR used for display) numbers the last rank's forwards
        # from 1 in torch 2.13; the runtime (_step_microbatches) runs min(m, p - rank) forwards, then
        # alternates B, F, then drains the backwards. Transcribe the runtime.
        raw = []
        for r in range(p):
            warm = min(m, p - r)
            ops = [sched._Action(r, sched._ComputationType.FORWARD, i) for i in range(warm)]
            for i in range(m):
                ops.append(sched._Action(r, sched._ComputationType.FULL_BACKWARD, i))
                if warm + i < m:
                    ops.append(sched._Action(r, sched._ComputationType.FORWARD, warm + i))
            raw.append(ops)
    return [
        [
            (a.computation_type.value, a.stage_index, a.microbatch_index)
            for a in ops
            if a is not None and a.computation_type.value in ("F", "B")
        ]
        for ops in raw
    ]


@pytest.mark.parametrize(
    "schedule,p,m,v",
    [
        ("gpipe", 4, 6, 1),
        ("1f1b", 4, 4, 1),
        ("1f1b", 4, 9, 1),
        ("interleaved_1f1b", 2, 4, 2),
        ("interleaved_1f1b", 4, 8, 2),
        ("interleaved_1f1b", 4, 10, 3),
        ("interleaved_1f1b", 4, 3, 2),
        ("interleaved_1f1b", 3, 12, 4),
    ],
)
def test_order_matches_torch_and_completes(schedule, p, m, v):
    assert rank_orders(schedule, p, m, virtual_stages=v) == _torch_orders(schedule, p, m, v)
    res = simulate(schedule, _uniform(p * v, 1.0, 2.0), m, virtual_stages=v)
    assert res.busy_s == (v * m * 3.0,) * p


def test_timeline_respects_dependencies():
    p, m, v = 4, 8, 2
    stages = [StageCost(fwd_s=1.0 + s / 8, bwd_s=2.0, p2p_s=0.125) for s in range(p * v)]
    res = simulate("interleaved_1f1b", stages, m, virtual_stages=v, record_timeline=True)
    assert len(res.timeline) == 2 * p * v * m
    done = {(e.kind, e.chunk * p + e.rank, e.microbatch): e for e in res.timeline}
    for (kind, s, i), e in done.items():
        if kind == "F" and s:
            assert e.start_s >= done["F", s - 1, i].end_s + 0.125
        if kind == "B":
            assert e.start_s >= done["F", s, i].end_s
            if s < p * v - 1:
                assert e.start_s >= done["B", s + 1, i].end_s + 0.125
    by_rank = sorted(res.timeline, key=lambda e: (e.rank, e.start_s))
    for a, b in zip(by_rank, by_rank[1:]):
        assert a.rank != b.rank or a.end_s <= b.start_s  # one op at a time per rank
    assert max(e.end_s for e in res.timeline) == res.step_time_s


@pytest.mark.timing
def test_speed():
    stages = _uniform(8, 1.0, 2.0, p2p_s=0.1, activation_bytes=1 << 20)
    simulate("1f1b", stages, 64)  # warm up
    t0 = time.perf_counter()
    for _ in range(5):
        simulate("1f1b", stages, 64)
        simulate("interleaved_1f1b", stages * 2, 64, virtual_stages=2)
    per_call_s = (time.perf_counter() - t0) / 10
    assert per_call_s < 0.05, f"simulate took {per_call_s * 1e3:.1f} ms for p=8, m=64"
