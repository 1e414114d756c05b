"""Inter-layer DP (`galvatron_fx.search.layer_dp`): exact against brute force, and fast.

The property tests draw hundreds of small chains (≤ 8 layers, ≤ 6 choices, some forbidden choices
and transitions, tied costs, budgets from infeasible to unconstrained) and demand the DP's answer
equal an exhaustive search. Medium chains, out of brute force's reach, check the pruned solver
against the unpruned whole frontier.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from galvatron_fx.search.layer_dp import (
    ChainProblem,
    ChainSolution,
    brute_force,
    chain_cost,
    pareto_frontier,
    solve_chain,
)

MiB = 1 << 20


def _random_problem(rng: np.random.Generator, *, extra: bool = False, max_assignments: int = 4096) -> ChainProblem:
    num_layers = int(rng.integers(1, 9))
    cap = max(1, min(6, int(round(max_assignments ** (1 / num_layers)))))
    ks = [int(rng.integers(1, cap + 1)) for _ in range(num_layers)]
    p_inf = float(rng.choice([0.0, 0.1, 0.3]))
    tied = rng.random() < 0.3  # small integer costs make ties in time and memory common

    def times(shape):
        t = rng.integers(0, 4, shape).astype(float) if tied else rng.random(shape)
        return np.where(rng.random(shape) < p_inf, np.inf, t)

    time_s = [times(k) for k in ks]
    mem = [rng.integers(0, 6 if tied else 50, k) * 1000 for k in ks]
    trans = [None] + [times((a, b)) * 0.5 for a, b in zip(ks, ks[1:])]
    extra_b = [rng.integers(0, 4, k) * 1500 for k in ks] if extra else None
    return ChainProblem(time_s, mem, trans, extra_b)


def _random_budget(rng: np.random.Generator, problem: ChainProblem) -> int:
    top = sum(int(m.max()) for m in problem.mem_bytes)
    if problem.extra_max_bytes is not None:
        top += max(int(e.max()) for e in problem.extra_max_bytes)
    return int(rng.integers(-1000, top + 2000))


def _check_against_brute_force(problem: ChainProblem, budget: int) -> None:
    got = solve_chain(problem, budget)
    want = brute_force(problem, budget)
    assert got.feasible == want.feasible, (budget, got, want)
    assert got.min_mem_bytes == want.min_mem_bytes, (budget, got, want)
    assert len(got.frontier_sizes) == problem.num_layers
    if not want.feasible:
        assert got.choices == () and got.time_s == math.inf
        return
    assert abs(got.time_s - want.time_s) <= 1e-9, (budget, got, want)
    # The reported numbers are those of the reported assignment, which fits.
    t, m = chain_cost(problem, got.choices)
    assert t == got.time_s and m == got.mem_bytes <= budget
    assert got.mem_bytes >= got.min_mem_bytes


def test_solve_chain_equals_brute_force_on_random_chains():
    rng = np.random.default_rng(20240601)
    num_feasible = num_infeasible = 0
    for _ in range(300):
        problem = _random_problem(rng)
        for _ in range(2):
            budget = _random_budget(rng, problem)
            _check_against_brute_force(problem, budget)
            feasible = brute_force(problem, budget).feasible
            num_feasible += feasible
            num_infeasible += not feasible
    # the draw covers both outcomes well
    assert num_feasible > 150 and num_infeasible > 60, (num_feasible, num_infeasible)


def test_solve_chain_with_extra_max_equals_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(200):
        problem = _random_problem(rng, extra=True)
        for _ in range(2):
            _check_against_brute_force(problem, _random_budget(rng, problem))


def _brute_frontier(problem: ChainProblem) -> list[tuple[int, float]]:
    """Independent oracle: every assignment in pure Python, then the non-dominated points."""
    points = []
    for a in itertools.product(*(range(k) for k in problem.num_choices)):
        t = sum(problem.time_s[i][c] for i, c in enumerate(a))
        t += sum(problem.trans_s[i][a[i - 1], a[i]] for i in range(1, len(a)))
        m = sum(int(problem.mem_bytes[i][c]) for i, c in enumerate(a))
        if problem.extra_max_bytes is not None:
            m += max(int(problem.extra_max_bytes[i][c]) for i, c in enumerate(a))
        if math.isfinite(t):
            points.append((m, t))
    points.sort(key=lambda p: (p[0], p[1]))
    frontier, best = [], math.inf
    for m, t in points:
        if t < best - 1e-12:
            frontier.append((m, t))
            best = t
    return frontier


@pytest.mark.parametrize("extra", [False, True])
def test_pareto_frontier_equals_brute_force_frontier(extra):
    rng = np.random.default_rng(11 + extra)
    for _ in range(100):
        problem = _random_problem(rng, extra=extra, max_assignments=1000)
        got = pareto_frontier(problem)
        want = _brute_frontier(problem)
        assert [m for m, _ in got] == [m for m, _ in want], (got, want)
        assert np.allclose([t for _, t in got], [t for _, t in want], rtol=0, atol=1e-9)
        assert all(t1 > t2 for (_, t1), (_, t2) in zip(got, got[1:]))


def test_pruned_solver_matches_whole_frontier_on_medium_chains():
    """30–60 layers: the Lagrangian-pruned answer equals the best point of the unpruned frontier."""
    rng = np.random.default_rng(3)
    for trial in range(12):
        num_layers, k = int(rng.integers(30, 61)), int(rng.integers(3, 7))
        time_s = [np.where(rng.random(k) < 0.05, np.inf, rng.random(k)) for _ in range(num_layers)]
        mem = [rng.integers(1, 40, k) * MiB for _ in range(num_layers)]
        trans = [None] + [rng.random((k, k)) * 0.3 for _ in range(num_layers - 1)]
        problem = ChainProblem(time_s, mem, trans)
        frontier = pareto_frontier(problem)
        lo, hi = frontier[0][0], frontier[-1][0]
        for frac in (-0.01, 0.0, 0.05, 0.3, 0.5, 0.8, 1.0):
            budget = int(lo + frac * (hi - lo))
            sol = solve_chain(problem, budget)
            fits = [t for m, t in frontier if m <= budget]
            assert sol.min_mem_bytes == lo
            assert sol.feasible == bool(fits), (trial, frac)
            if fits:
                assert abs(sol.time_s - min(fits)) <= 1e-9 * max(1.0, sol.time_s), (trial, frac, sol.time_s, min(fits))
                assert sol.mem_bytes <= budget


def _switch_problem(trans_cost_s: float) -> ChainProblem:
    # Two layouts: choice 0 is fast on layer 0 only, choice 1 is fast on layers 1 and 2.
    time_s = [np.array([1.0, 2.0]), np.array([2.0, 1.0]), np.array([2.0, 1.0])]
    mem = [np.array([5, 5])] * 3
    switch = np.array([[0.0, trans_cost_s], [trans_cost_s, 0.0]])
    return ChainProblem(time_s, mem, [None, switch, switch])


def test_dp_pays_a_transition_when_switching_is_worth_it():
    sol = solve_chain(_switch_problem(0.5), 100)
    assert sol.choices == (0, 1, 1)
    assert sol.time_s == pytest.approx(1.0 + 0.5 + 1.0 + 1.0)


def test_dp_keeps_one_layout_when_switching_is_not_worth_it():
    sol = solve_chain(_switch_problem(1.5), 100)
    assert sol.choices == (1, 1, 1)
    assert sol.time_s == pytest.approx(4.0)


def _ddp_or_zero3(num_layers: int = 4) -> ChainProblem:
    # choice 0 = replicated (fast, 10 bytes), choice 1 = sharded (slower, 4 bytes); changing layout
    # between layers costs 0.05 s, so a memory squeeze should shard a block at one end of the chain.
    time_s = [np.array([1.0, 1.2])] * num_layers
    mem = [np.array([10, 4])] * num_layers
    switch = np.array([[0.0, 0.05], [0.05, 0.0]])
    return ChainProblem(time_s, mem, [None] + [switch] * (num_layers - 1))


@pytest.mark.parametrize(
    ("budget", "num_sharded", "time_s"),
    [(40, 0, 4.0), (34, 1, 4.25), (28, 2, 4.45), (16, 4, 4.8)],
)
def test_memory_squeeze_shards_a_contiguous_run_at_the_chain_end(budget, num_sharded, time_s):
    sol = solve_chain(_ddp_or_zero3(), budget)
    assert sol.feasible and sol.time_s == pytest.approx(time_s)
    assert sum(sol.choices) == num_sharded
    # one layout change at most: the sharded layers sit together at one end
    assert sum(a != b for a, b in zip(sol.choices, sol.choices[1:])) <= 1
    assert sol.mem_bytes <= budget


def test_infeasible_budget_reports_the_least_memory():
    sol = solve_chain(_ddp_or_zero3(), 15)
    assert not sol.feasible and sol.choices == () and sol.time_s == math.inf
    assert sol.min_mem_bytes == 16


def test_forbidden_choices_and_transitions_are_respected():
    time_s = [np.array([1.0, 5.0]), np.array([np.inf, 1.0]), np.array([1.0, 1.0])]
    mem = [np.array([10, 1]), np.array([1, 3]), np.array([1, 7])]
    trans = [None, np.array([[0.0, np.inf], [0.0, 0.0]]), np.array([[0.0, 0.0], [0.0, np.inf]])]
    problem = ChainProblem(time_s, mem, trans)
    # layer 1 must take choice 1, which only choice 1 of layer 0 may precede, and only 0 follow
    sol = solve_chain(problem, 100)
    assert sol.choices == (1, 1, 0) and sol.time_s == 7.0 and sol.mem_bytes == 5
    assert sol.min_mem_bytes == 5
    everything_forbidden = ChainProblem([np.array([np.inf])], [np.array([3])], [None])
    sol = solve_chain(everything_forbidden, 100)
    assert not sol.feasible and sol.min_mem_bytes == -1
    assert pareto_frontier(everything_forbidden) == []


def test_extra_max_counts_only_the_largest_scratch_buffer():
    # choice 1 saves resident memory but needs a big scratch buffer; two of them share one peak
    time_s = [np.array([1.0, 1.0])] * 3
    mem = [np.array([10, 2])] * 3
    extra = [np.array([0, 12])] * 3
    problem = ChainProblem(time_s, mem, [None] + [np.zeros((2, 2))] * 2, extra)
    assert solve_chain(problem, 18).min_mem_bytes == 18  # 3 × 2 + max(12)
    sol = solve_chain(problem, 18)
    assert sol.feasible and sol.choices == (1, 1, 1) and sol.mem_bytes == 18
    assert not solve_chain(problem, 17).feasible
    assert pareto_frontier(problem) == [(18, 3.0)]


def test_mem_resolution_is_conservative_and_exact_on_its_grid():
    rng = np.random.default_rng(5)
    for _ in range(40):
        problem = _random_problem(rng)
        budget = _random_budget(rng, problem)
        exact = solve_chain(problem, budget)
        coarse = solve_chain(problem, budget, mem_resolution_bytes=4000)
        if coarse.feasible:  # what rounding finds fits, and is never better than the optimum
            assert exact.feasible and coarse.mem_bytes <= budget
            assert coarse.time_s >= exact.time_s - 1e-9
            assert chain_cost(problem, coarse.choices) == (coarse.time_s, coarse.mem_bytes)
        assert coarse.min_mem_bytes == exact.min_mem_bytes  # always the true least memory
        # every memory here is a multiple of 1000: rounding to 1000 changes nothing
        on_grid = solve_chain(problem, budget, mem_resolution_bytes=1000)
        assert on_grid.feasible == exact.feasible
        if exact.feasible:
            assert on_grid.time_s == pytest.approx(exact.time_s, abs=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(time_s=[], mem_bytes=[], trans_s=[]), "at least one layer"),
        (dict(time_s=[[1.0]], mem_bytes=[[1], [1]], trans_s=[None]), "disagree in length"),
        (dict(time_s=[[1.0, 2.0]], mem_bytes=[[1]], trans_s=[None]), r"mem_bytes\[0\] has shape"),
        (dict(time_s=[[1.0]], mem_bytes=[[-1]], trans_s=[None]), "negative memory"),
        (dict(time_s=[[1.0]], mem_bytes=[[1.5]], trans_s=[None]), "whole byte counts"),
        (dict(time_s=[[np.nan]], mem_bytes=[[1]], trans_s=[None]), "NaN"),
        (dict(time_s=[[1.0]], mem_bytes=[[1]], trans_s=[np.zeros((1, 1))]), "trans_s\\[0\\] must be None"),
        (dict(time_s=[[1.0], [1.0, 2.0]], mem_bytes=[[1], [1, 1]], trans_s=[None, np.zeros((2, 1))]), r"must be \(1, 2\)"),
        (dict(time_s=[[1.0], [1.0]], mem_bytes=[[1], [1]], trans_s=[None, None]), r"trans_s\[1\] is None"),
        (dict(time_s=[[1.0]], mem_bytes=[[1]], trans_s=[None], extra_max_bytes=[[1, 2]]), "extra_max_bytes"),
    ],
)
def test_malformed_problems_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ChainProblem(**kwargs)


def _dense_chain(num_layers: int, num_choices: int, seed: int) -> ChainProblem:
    rng = np.random.default_rng(seed)
    time_s = [rng.random(num_choices) for _ in range(num_layers)]
    mem = [rng.integers(1, 1000, num_choices) * MiB for _ in range(num_layers)]
    trans = [None] + [rng.random((num_choices, num_choices)) * 0.2 for _ in range(num_layers - 1)]
    return ChainProblem(time_s, mem, trans)


def _layout_chain(num_layers: int, *, jitter: float = 0.0, seed: int = 0) -> ChainProblem:
    """A transformer-like stack: embedding, alternating attention / MLP blocks, head. 24 strategies
    per layer = tp {1,2,4,8} × dp {ddp, zero2, zero3} × recompute {no, yes}; 4 layouts (the tp
    degree), reshard cost between layouts. ``jitter`` scales each layer's costs by 1 ± jitter."""
    rng = np.random.default_rng(seed)
    tps = (1, 2, 4, 8)
    options = [(tp, dp, rc) for tp in tps for dp in ("ddp", "zero2", "zero3") for rc in (0, 1)]
    layout = np.array([tps.index(tp) for tp, _, _ in options])
    reshard = np.array([[0.0 if a == b else 2e-3 * (1 + abs(a - b)) for b in range(4)] for a in range(4)])
    # (param bytes, activation bytes, compute seconds) per layer kind
    kinds = {"embed": (800 * MiB, 100 * MiB, 2e-3), "attn": (200 * MiB, 1200 * MiB, 0.015), "mlp": (400 * MiB, 600 * MiB, 0.02), "head": (800 * MiB, 900 * MiB, 0.01)}
    names = ["embed"] + [("attn", "mlp")[i % 2] for i in range(num_layers - 2)] + ["head"]
    time_s, mem = [], []
    for name in names[:num_layers]:
        params, act, compute = kinds[name]
        s = 1 + jitter * rng.standard_normal()
        t, m = [], []
        for tp, dp, rc in options:
            dp_size = 8 // tp
            param_factor = {"ddp": 8.0, "zero2": 2 + 6 / dp_size, "zero3": 8 / dp_size}[dp]
            m.append(int(s * (params / tp * param_factor + act / tp * (0.1 if rc else 1.0))))
            t.append(s * (compute / tp * (1.33 if rc else 1.0) + 2e-3 * math.log2(tp) + {"ddp": 1e-3, "zero2": 1.2e-3, "zero3": 2e-3}[dp]))
        time_s.append(np.array(t))
        mem.append(np.array(m, dtype=np.int64))
    return ChainProblem(time_s, mem, [None] + [reshard[layout][:, layout]] * (num_layers - 1))


def _mid_budgets(problem: ChainProblem) -> list[int]:
    least = solve_chain(problem, 0).min_mem_bytes
    unconstrained = solve_chain(problem, 1 << 60).mem_bytes
    return [int(least + f * (unconstrained - least)) for f in (0.1, 0.3, 0.6, 0.9)]


@pytest.mark.parametrize(
    ("name", "make", "limit_s"),
    [
        ("128x24 dense", lambda: _dense_chain(128, 24, seed=1), 1.0),
        ("128x24 layouts", lambda: _layout_chain(128), 1.0),
        ("1000x8 dense", lambda: _dense_chain(1000, 8, seed=3), 3.0),
    ],
)
@pytest.mark.timing
def test_speed(name, make, limit_s):
    problem = make()
    worst = 0.0
    for budget in _mid_budgets(problem):
        start = time.perf_counter()
        sol = solve_chain(problem, budget)
        worst = max(worst, time.perf_counter() - start)
        assert sol.feasible and sol.mem_bytes <= budget
    print(f"layer DP {name}: worst {worst * 1e3:.0f} ms over 4 budgets")
    assert worst < limit_s, f"{name}: {worst:.2f} s"


def test_solution_record_is_frozen():
    sol = solve_chain(_switch_problem(0.5), 100)
    assert isinstance(sol, ChainSolution)
    with pytest.raises(AttributeError):
        sol.time_s = 0.0  # type: ignore[misc]


@pytest.mark.timing
def test_mem_resolution_caps_a_degenerate_frontier():
    """Jitter that scales a layer's time and memory together gives every layer the same trade-off
    slopes: the exact frontier then holds ~10^5 near-tied points (a subset-sum in disguise) and no
    bound prunes them. Epsilon-dominance keeps it small and still answers within budget."""
    problem = _layout_chain(128, jitter=0.05, seed=2)
    budgets = _mid_budgets(problem)
    answers = {}
    for res in (256 * MiB, 16 * MiB):
        for budget in budgets:
            start = time.perf_counter()
            sol = solve_chain(problem, budget, mem_resolution_bytes=res)
            elapsed = time.perf_counter() - start
            assert sol.feasible and sol.mem_bytes <= budget
            assert max(sol.frontier_sizes) <= 4 * (budget // res + 1)
            assert elapsed < 1.0, f"{res // MiB} MiB: {elapsed:.2f} s"
            answers[res, budget] = sol.time_s
    # a finer grid is never worse by more than round-off on these budgets, and usually better
    for budget in budgets:
        assert answers[16 * MiB, budget] <= answers[256 * MiB, budget] * (1 + 1e-3)
