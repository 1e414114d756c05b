"""Inter-layer dynamic program: one strategy per layer of a chain, least time within a memory budget.

Contract
--------
Input: a `ChainProblem` — a chain of ``L`` layers; layer ``i`` has ``K_i`` candidate *choices* (a
choice is one per-layer strategy, e.g. a `LayerStrategy`; this module only sees its index). Choice
``c`` of layer ``i`` costs ``time_s[i][c]`` seconds and ``mem_bytes[i][c]`` bytes per rank; moving
from choice ``a`` of layer ``i-1`` to choice ``b`` of layer ``i`` costs ``trans_s[i][a, b]`` seconds
(e.g. resharding the activation between the two layouts). ``inf`` in ``time_s`` or ``trans_s``
forbids a choice or a transition. Optionally ``extra_max_bytes[i][c]`` is temporary memory of which
only the largest counts (the peak of per-layer scratch buffers).

Output: a `ChainSolution` — the optimal choice per layer, its time and memory, or "infeasible" with
the least memory any allowed assignment needs (``min_mem_bytes``), so that the caller can say "the
smallest needs X GiB". No torch; numpy only. This module never raises for an infeasible budget.

Terms
-----
assignment  ``c = (c_0, ..., c_{L-1})``, one choice per layer.
time        ``T(c) = Σ_i time_s[i][c_i] + Σ_{i≥1} trans_s[i][c_{i-1}, c_i]``.
memory      ``M(c) = Σ_i mem_bytes[i][c_i]  (+ max_i extra_max_bytes[i][c_i])``.
allowed     ``T(c) < inf``.
frontier    a set of (memory, time) points none of which is dominated (another point with
            ≤ memory and ≤ time); stored sorted by memory ascending, so time strictly decreases.
group       choices of layer ``i`` whose outgoing transition rows ``trans_s[i+1][c, :]`` are equal;
            the future cost of a partial assignment depends on its last choice only through that
            row, so one frontier per group suffices (all choices of the last layer form one group).

The DP
------
State after layer ``i``: for each group ``g`` of layer ``i`` the frontier ``F_i(g)`` of the
(memory, time) points of all allowed partial assignments ``(c_0..c_i)`` with ``c_i ∈ g``, each point
remembering its last choice ``c_i`` and its predecessor point (back-pointer). ::

    F_0(g)   = Pareto{ (m_0[c], t_0[c])                                   : c ∈ g }
    F_i(g')  = Pareto{ (m + m_i[c'], t + R_i[c, c'] + t_i[c'])  : c' ∈ g', (m, t; c) ∈ ∪_g F_{i-1}(g) }
    prune    (a) time inf; (b) m + S_i[c'] > B, where S_i[c'] is the least memory layers i+1..L-1
             can add after c' (a backward min-plus pass); (c) `solve_chain` only: the bound
             t + h_λ[i][c'] − λ·(B − m) > UB for some λ in a small set Λ (chain_bounds)
    answer   the point of F_{L-1}(all) with the least time; walk the back-pointers for the choices.

Bound (c) — Lagrangian branch-and-bound inside the DP — is derived in
:mod:`galvatron_fx.search.chain_bounds`.

Why it is exact: both objectives are sums along the chain, and the cost of any completion of a
partial assignment depends only on its last choice's outgoing row. If two partial assignments end
in the same group and one has ≤ memory and ≤ time, every completion of the other is matched by the
same completion of the first with ≤ memory and ≤ time, so dropping the other loses no optimum.
Pruning (b) drops only points that cannot complete within budget, (c) only points whose every
fitting completion is slower than an assignment already in hand (with a 1e-9 relative margin for
float round-off). Exact equality of transition rows is used for grouping, so merging never changes
the answer. `pareto_frontier` uses (a) and (b) only, since it wants every frontier point.

Pareto pruning is vectorised (:mod:`galvatron_fx.search.chain_frontier`).

With ``extra_max_bytes`` the objective is not additive; `solve_chain` enumerates the threshold
``θ`` over the distinct extra values ``θ_1 < ... < θ_D``: forbid choices with extra > θ, solve the
additive problem with budget ``budget − θ``, keep the best. The optimum ``c*`` is found exactly at
``θ = max_i extra(c*_i)``, and every solution of every run is feasible (its real max ≤ θ).

``mem_resolution_bytes = r > 0`` is epsilon-dominance: points are compared by memory bucket
``⌊m / r⌋`` (each bucket keeps its fastest point), so frontiers hold at most ``budget / r + 1``
points per group. Points keep their true memory and the budget is checked on it, so the answer
always fits (conservative), and its time is no worse than the exact optimum for budget
``budget − L·r`` (each layer's merge can trade a point for one < r bytes larger). Rounding each
choice's memory up to the grid instead would charge up to ``L·r`` bytes on every answer; this
charges only where points actually merged. Exactness holds only at ``r = 0``.

Complexity
----------
Let ``F`` be the largest frontier and ``G_i`` the number of groups of layer ``i``. Layer ``i`` makes
``N_i = Σ_g |F_{i-1}(g)| ≤ G_{i-1}·F`` points times ``K_i`` candidates and sorts them:
``O(Σ_i G_{i-1} F K_i log(G_{i-1} F K_i))`` time, ``O(Σ_i |frontier_i|)`` memory for back-pointers.
``F`` is at most the number of distinct memory sums below budget (``≤ budget / r + 1`` with
rounding); real layer stacks have few layouts (small ``G``) and frontiers of tens to hundreds.
The min-memory pass is ``O(Σ_i K_{i-1} K_i)``, each λ pass ``O(|Λ_batch| Σ_i K_{i-1} K_i)`` (a
14-point grid plus up to 40 secant steps; usually < 10). With ``extra_max_bytes`` everything is
multiplied by the number ``D`` of distinct extra values (at most ``Σ_i K_i``, few in practice); the
runs after the first are capped by the best time so far, so they prune harder.

Its speed is tested (tests/unit/test_layer_dp.py::test_speed) and measured as part of the
search (``benchmarks/search_speed.py``, figures in ``benchmarks/results/``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from dataclasses import dataclass
from typing import cast

import numpy as np

from galvatron_fx.search.chain_bounds import _Bounds, _lagrangian_bounds
from galvatron_fx.search.chain_frontier import _BIG, _groups, _min_mem, _pareto_keep, _suffix_min_mem

logger = logging.getLogger(__name__)

__all__ = [
    "ChainProblem",
    "ChainSolution",
    "brute_force",
    "chain_cost",
    "pareto_frontier",
    "solve_chain",
]

# A frontier this large means seconds per layer: say so once and suggest rounding.
_WARN_FRONTIER = 200_000


@dataclass(frozen=True, eq=False)
class ChainProblem:
    """A chain of layers, each with candidate choices; see the module docstring for the terms.

    Arrays are validated and normalised on construction (times to float64, memories to int64);
    a malformed problem raises `ValueError` saying which layer and which array is wrong.
    """

    time_s: list[np.ndarray]  # per layer, shape (K_i,); inf forbids the choice
    mem_bytes: list[np.ndarray]  # per layer, shape (K_i,), int64, >= 0
    trans_s: list[np.ndarray | None]  # per layer, shape (K_{i-1}, K_i); None for layer 0
    extra_max_bytes: list[np.ndarray] | None = None  # per layer (K_i,): only the max counts

    def __post_init__(self) -> None:
        num_layers = len(self.time_s)
        if num_layers == 0:
            raise ValueError("ChainProblem needs at least one layer; got an empty time_s")
        if len(self.mem_bytes) != num_layers or len(self.trans_s) != num_layers:
            raise ValueError(
                f"ChainProblem lists disagree in length: time_s has {num_layers} layers, mem_bytes "
                f"{len(self.mem_bytes)}, trans_s {len(self.trans_s)} (trans_s[0] must be None)"
            )
        times = [_as_times(t, f"time_s[{i}]") for i, t in enumerate(self.time_s)]
        mems = [_as_bytes(m, f"mem_bytes[{i}]", times[i].shape) for i, m in enumerate(self.mem_bytes)]
        if self.trans_s[0] is not None:
            raise ValueError("trans_s[0] must be None: layer 0 has no previous layer")
        trans: list[np.ndarray | None] = [None]
        for i in range(1, num_layers):
            if self.trans_s[i] is None:
                raise ValueError(f"trans_s[{i}] is None; give a ({times[i - 1].size}, {times[i].size}) matrix (zeros for free)")
            r = np.array(self.trans_s[i], dtype=np.float64) + 0.0  # + 0.0 turns -0.0 into 0.0
            want = (times[i - 1].size, times[i].size)
            if r.shape != want:
                raise ValueError(f"trans_s[{i}] has shape {r.shape}; layers {i - 1} and {i} have {want[0]} and {want[1]} choices, so it must be {want}")
            if np.isnan(r).any() or (r == -np.inf).any():
                raise ValueError(f"trans_s[{i}] contains NaN or -inf; use +inf to forbid a transition")
            trans.append(r)
        extra = None
        if self.extra_max_bytes is not None:
            if len(self.extra_max_bytes) != num_layers:
                raise ValueError(f"extra_max_bytes has {len(self.extra_max_bytes)} layers, time_s has {num_layers}")
            extra = [_as_bytes(e, f"extra_max_bytes[{i}]", times[i].shape) for i, e in enumerate(self.extra_max_bytes)]
        object.__setattr__(self, "time_s", times)
        object.__setattr__(self, "mem_bytes", mems)
        object.__setattr__(self, "trans_s", trans)
        object.__setattr__(self, "extra_max_bytes", extra)

    @property
    def num_layers(self) -> int:
        return len(self.time_s)

    @property
    def num_choices(self) -> tuple[int, ...]:
        return tuple(t.size for t in self.time_s)


@dataclass(frozen=True)
class ChainSolution:
    """The DP's answer. When infeasible, ``choices == ()`` and ``time_s == inf``.

    ``min_mem_bytes`` is the least memory any allowed assignment needs (always filled; ``-1`` when
    no assignment is allowed at any memory). ``frontier_sizes[i]`` is the number of (memory, time)
    points kept after layer ``i`` over all its groups (the largest over the threshold runs when
    ``extra_max_bytes`` is given; 0 after the DP stopped early).
    """

    feasible: bool
    choices: tuple[int, ...]
    time_s: float
    mem_bytes: int
    min_mem_bytes: int
    frontier_sizes: tuple[int, ...]


def solve_chain(problem: ChainProblem, budget_bytes: int, *, mem_resolution_bytes: int = 0) -> ChainSolution:
    """Least-time assignment with memory ≤ ``budget_bytes`` (exact when ``mem_resolution_bytes == 0``).

    ``mem_resolution_bytes > 0`` compares memory in buckets of that size (epsilon-dominance):
    faster on huge frontiers, still within budget, but only guaranteed as good as the exact optimum
    for ``budget − L·mem_resolution_bytes`` (see the module docstring). The reported ``mem_bytes``
    is always the true memory of the returned assignment; ``min_mem_bytes`` is always exact.
    """
    budget = _as_budget(budget_bytes)
    if mem_resolution_bytes < 0:
        raise ValueError(f"mem_resolution_bytes must be >= 0, got {mem_resolution_bytes}")
    mems, res = problem.mem_bytes, int(mem_resolution_bytes)
    if problem.extra_max_bytes is None:
        min_mem = _min_mem(problem.time_s, problem.mem_bytes, problem.trans_s)
        run = _run_dp(problem.time_s, mems, problem.trans_s, budget, bound=True, resolution=res)
        return _solution(problem, run, min_mem)

    min_mem = _min_mem_with_extra(problem)
    sizes = np.zeros(problem.num_layers, dtype=np.int64)
    if min_mem < 0 or min_mem > budget:  # nothing fits: no DP needed to say so
        return ChainSolution(False, (), math.inf, 0, min_mem, tuple(int(s) for s in sizes))
    best: _DPRun | None = None
    best_key = (math.inf, math.inf)
    for theta, times in _threshold_problems(problem):
        if theta > budget:
            break
        run = _run_dp(times, mems, problem.trans_s, budget - theta, bound=True, time_cap_s=best_key[0], resolution=res)
        sizes = np.maximum(sizes, run.frontier_sizes)
        if run.choices is None:
            continue
        t, m = chain_cost(problem, run.choices)
        if (t, m) < best_key:
            best, best_key = run, (t, m)
    if best is None:
        return ChainSolution(False, (), math.inf, 0, min_mem, tuple(int(s) for s in sizes))
    # best is only a run with choices (the loop skips the others)
    return ChainSolution(True, cast(tuple[int, ...], best.choices), best_key[0], int(best_key[1]), min_mem,
                         tuple(int(s) for s in sizes))


def pareto_frontier(
    problem: ChainProblem, *, budget_bytes: int | None = None, mem_resolution_bytes: int = 0
) -> list[tuple[int, float]]:
    """The whole (memory, time) frontier of the chain, memory ascending, time strictly decreasing.

    Each point is the least time reachable with at most that much memory, i.e. what every extra
    byte buys (useful when splitting memory between pipeline stages). Empty when nothing is allowed.
    ``budget_bytes`` drops points above it. No Lagrangian pruning here (every point is wanted), so
    on long chains with many distinct memory sums the frontier can hold ~(memory range / gcd)
    points; ``mem_resolution_bytes`` caps it by epsilon-dominance: every returned point is then a
    real assignment's (memory, time), but points of the exact frontier may be missing.
    """
    if mem_resolution_bytes < 0:
        raise ValueError(f"mem_resolution_bytes must be >= 0, got {mem_resolution_bytes}")
    budget = _BIG if budget_bytes is None else _as_budget(budget_bytes)
    mems, res = problem.mem_bytes, int(mem_resolution_bytes)
    if problem.extra_max_bytes is None:
        run = _run_dp(problem.time_s, mems, problem.trans_s, budget, resolution=res)
        m, t = run.final_mem, run.final_time
        keep = _pareto_keep(m, t, np.zeros(m.size, dtype=np.int64), 1)  # a no-op unless res > 0
        return [(int(a), float(b)) for a, b in zip(m[keep], t[keep])]
    all_m, all_t = [], []
    for theta, times in _threshold_problems(problem):
        if theta > budget:
            break
        run = _run_dp(times, mems, problem.trans_s, budget - theta, resolution=res)
        all_m.append(run.final_mem + theta)
        all_t.append(run.final_time)
    if not all_m:
        return []
    m, t = np.concatenate(all_m), np.concatenate(all_t)
    keep = _pareto_keep(m, t, np.zeros(m.size, dtype=np.int64), 1)
    return [(int(a), float(b)) for a, b in zip(m[keep], t[keep])]


def chain_cost(problem: ChainProblem, choices: tuple[int, ...] | list[int]) -> tuple[float, int]:
    """(time, memory) of one assignment, summed in layer order (memory includes the max extra)."""
    if len(choices) != problem.num_layers:
        raise ValueError(f"need one choice per layer ({problem.num_layers}), got {len(choices)}")
    t = 0.0
    m = 0
    for i, c in enumerate(choices):
        t += float(problem.time_s[i][c])
        if i:
            t += float(cast(np.ndarray, problem.trans_s[i])[choices[i - 1], c])
        m += int(problem.mem_bytes[i][c])
    if problem.extra_max_bytes is not None:
        m += max(int(problem.extra_max_bytes[i][c]) for i, c in enumerate(choices))
    return t, m


def brute_force(problem: ChainProblem, budget_bytes: int, *, max_assignments: int = 2_000_000) -> ChainSolution:
    """Test oracle: try every assignment (``itertools.product``). Only for small chains.

    Ties in time are broken by less memory, then by the first assignment in product order.
    """
    budget = _as_budget(budget_bytes)
    num = math.prod(problem.num_choices)
    if num > max_assignments:
        raise ValueError(f"brute_force would try {num} assignments (> {max_assignments}); use solve_chain")
    assign = np.array(list(itertools.product(*(range(k) for k in problem.num_choices))), dtype=np.int64)
    assign = assign.reshape(num, problem.num_layers)
    times = np.zeros(num)
    mems = np.zeros(num, dtype=np.int64)
    for i in range(problem.num_layers):
        times += problem.time_s[i][assign[:, i]]
        if i:
            times += cast(np.ndarray, problem.trans_s[i])[assign[:, i - 1], assign[:, i]]
        mems += problem.mem_bytes[i][assign[:, i]]
    if problem.extra_max_bytes is not None:
        extra = np.stack([problem.extra_max_bytes[i][assign[:, i]] for i in range(problem.num_layers)], axis=1)
        mems += extra.max(axis=1)
    allowed = np.isfinite(times)
    min_mem = int(mems[allowed].min()) if allowed.any() else -1
    ok = np.flatnonzero(allowed & (mems <= budget))
    if ok.size == 0:
        return ChainSolution(False, (), math.inf, 0, min_mem, ())
    best = ok[np.lexsort((mems[ok], times[ok]))[0]]
    return ChainSolution(True, tuple(int(c) for c in assign[best]), float(times[best]), int(mems[best]), min_mem, ())


# --------------------------------------------------------------------------------------------------
# The DP


@dataclass(frozen=True)
class _DPRun:
    choices: tuple[int, ...] | None  # None when infeasible
    final_mem: np.ndarray  # the last layer's frontier, memory ascending
    final_time: np.ndarray
    frontier_sizes: np.ndarray


def _run_dp(
    times: list[np.ndarray],
    mems: list[np.ndarray],
    trans: list[np.ndarray | None],
    budget: int,
    *,
    bound: bool = False,
    time_cap_s: float = math.inf,
    resolution: int = 0,
) -> _DPRun:
    """Additive DP (no max term) over frontiers; see the module docstring for the recurrence.

    ``bound=True`` prunes with Lagrangian bounds (exact for the least-time point, not for the
    whole frontier); ``time_cap_s`` additionally drops points that cannot finish at or below it.
    """
    num_layers = len(times)
    sizes = np.zeros(num_layers, dtype=np.int64)
    empty = _DPRun(None, np.zeros(0, dtype=np.int64), np.zeros(0), sizes)
    budget = min(int(budget), _BIG)
    if budget < 0:
        return empty
    suffix = _suffix_min_mem(times, mems, trans)
    if int(np.where(np.isfinite(times[0]), mems[0] + suffix[0], _BIG).min()) > budget:
        return empty
    if not bound:
        return _forward(times, mems, trans, budget, suffix, None, resolution)
    bounds = _lagrangian_bounds(times, mems, trans, budget, time_cap_s)
    # Iterative deepening on the time cap: a cap just above the dual bound keeps a thin band of
    # points; if the optimum lies below the cap it survives (its prefixes' bounds are ≤ its time), so
    # the first attempt that finds anything has found the optimum. Else widen, and end at the
    # incumbent's time. Each failed attempt is cheap because its band is thin.
    gap = bounds.ub_s - bounds.dual_s
    sizes = np.zeros(num_layers, dtype=np.int64)
    if math.isfinite(gap) and gap > 1e-9 * (abs(bounds.ub_s) + 1e-30):
        for frac in (1 / 64, 1 / 8):
            trial = dataclasses.replace(bounds, ub_s=bounds.dual_s + frac * gap, incumbent=None)
            run = _forward(times, mems, trans, budget, suffix, trial, resolution)
            sizes = np.maximum(sizes, run.frontier_sizes)
            if run.choices is not None:
                return dataclasses.replace(run, frontier_sizes=sizes)
    run = _forward(times, mems, trans, budget, suffix, bounds, resolution)
    return dataclasses.replace(run, frontier_sizes=np.maximum(sizes, run.frontier_sizes))


def _forward(
    times: list[np.ndarray],
    mems: list[np.ndarray],
    trans: list[np.ndarray | None],
    budget: int,
    suffix: list[np.ndarray],
    bounds: _Bounds | None,
    resolution: int,
) -> _DPRun:
    """One forward sweep of the DP with the given pruning; back-pointers give the choices."""
    num_layers = len(times)
    sizes = np.zeros(num_layers, dtype=np.int64)
    empty = _DPRun(None, np.zeros(0, dtype=np.int64), np.zeros(0), sizes)
    back_choice: list[np.ndarray] = []  # per layer: the choice c_i of each kept point
    back_prev: list[np.ndarray] = []  # per layer: index of the predecessor point in layer i-1
    # Layer 0: one candidate per choice.
    cand_c = np.arange(times[0].size)
    ok = np.isfinite(times[0]) & (mems[0] + suffix[0] <= budget)
    if bounds is not None:
        ok &= ~bounds.prune(0, mems[0], times[0], cand_c)
    cand_c = cand_c[ok]
    cur_m, cur_t = mems[0][cand_c], times[0][cand_c]
    cur_p = np.full(cand_c.size, -1, dtype=np.int64)
    cur_c = cand_c
    for i in range(num_layers):
        if i:
            # (N,) points x (K_i,) next choices -> (N, K_i) candidates.
            cand_t = cur_t[:, None] + cast(np.ndarray, trans[i])[cur_c, :] + times[i][None, :]
            cand_m = cur_m[:, None] + mems[i][None, :]
            ok = np.isfinite(cand_t) & (cand_m + suffix[i][None, :] <= budget)
            p_idx, cand_c = np.nonzero(ok)
            cur_t, cur_m, cur_p = cand_t[ok], cand_m[ok], p_idx
            if bounds is not None:
                live = ~bounds.prune(i, cur_m, cur_t, cand_c)
                cur_t, cur_m, cur_p, cand_c = cur_t[live], cur_m[live], cur_p[live], cand_c[live]
        group_of, num_groups = _groups(trans[i + 1] if i + 1 < num_layers else None, times[i].size)
        keep = _pareto_keep(cur_m, cur_t, group_of[cand_c], num_groups, resolution)
        cur_m, cur_t, cur_p, cur_c = cur_m[keep], cur_t[keep], cur_p[keep], cand_c[keep]
        back_choice.append(cur_c)
        back_prev.append(cur_p)
        sizes[i] = cur_m.size
        if cur_m.size > _WARN_FRONTIER and sizes[:i].max(initial=0) <= _WARN_FRONTIER:
            logger.warning(
                "layer DP frontier grew to %d points at layer %d of %d; pass mem_resolution_bytes "
                "(e.g. 64 MiB) to cap it at the price of exactness",
                cur_m.size, i, num_layers,
            )
        if cur_m.size == 0:
            if bounds is not None and bounds.incumbent is not None:
                # Only reachable through float round-off on a tie: the incumbent is then optimal.
                return _DPRun(bounds.incumbent, empty.final_mem, empty.final_time, sizes)
            return empty
    # The last layer is one group: memory (bucket) ascending, time strictly decreasing; the best is last.
    idx = cur_m.size - 1
    choices = [0] * num_layers
    for i in range(num_layers - 1, -1, -1):
        choices[i] = int(back_choice[i][idx])
        idx = int(back_prev[i][idx])
    return _DPRun(tuple(choices), cur_m, cur_t, sizes)





def min_memory(problem: ChainProblem) -> int:
    """The least memory (Σ memory + the largest extra) of any allowed assignment of the chain,
    ``-1`` when none is allowed: whether it fits a budget, without the DP."""
    if problem.extra_max_bytes is None:
        return _min_mem(problem.time_s, problem.mem_bytes, problem.trans_s)
    return _min_mem_with_extra(problem)


def _min_mem_with_extra(problem: ChainProblem) -> int:
    """Least Σ memory + max extra of an allowed assignment (``-1`` if none), by the θ loop."""
    floor = _min_mem(problem.time_s, problem.mem_bytes, problem.trans_s)
    if floor < 0:
        return -1
    best = _BIG
    for theta, times in _threshold_problems(problem):
        if theta + floor >= best:
            break  # later θ only add more on top of a Σ that is at least `floor`
        m = _min_mem(times, problem.mem_bytes, problem.trans_s)
        if m >= 0:
            best = min(best, theta + m)
    return -1 if best >= _BIG else int(best)


def _threshold_problems(problem: ChainProblem):
    """Yield (θ, times with every choice whose extra > θ forbidden), θ ascending over distinct extras."""
    extra = problem.extra_max_bytes
    assert extra is not None
    values = np.unique(np.concatenate([e[np.isfinite(t)] for e, t in zip(extra, problem.time_s)]))
    for theta in values:
        theta = int(theta)
        yield theta, [np.where(e <= theta, t, np.inf) for e, t in zip(extra, problem.time_s)]


def _solution(problem: ChainProblem, run: _DPRun, min_mem: int) -> ChainSolution:
    sizes = tuple(int(s) for s in run.frontier_sizes)
    if run.choices is None:
        return ChainSolution(False, (), math.inf, 0, min_mem, sizes)
    t, m = chain_cost(problem, run.choices)
    return ChainSolution(True, run.choices, t, m, min_mem, sizes)


# --------------------------------------------------------------------------------------------------
# Validation


def _as_times(x, name: str) -> np.ndarray:
    a = np.array(x, dtype=np.float64) + 0.0
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array (one entry per choice), got shape {a.shape}")
    if np.isnan(a).any() or (a == -np.inf).any():
        raise ValueError(f"{name} contains NaN or -inf; use +inf to forbid a choice")
    return a


def _as_bytes(x, name: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}; the layer has {shape[0]} choices, so it must be {shape}")
    if a.dtype.kind not in "iu" and (a.dtype.kind != "f" or not np.all(np.isfinite(a)) or not np.all(a == np.floor(a))):
        raise ValueError(f"{name} must hold whole byte counts (ints), got {a.dtype} values {a.tolist()[:4]}...")
    a = a.astype(np.int64)
    if (a < 0).any():
        raise ValueError(f"{name} has negative memory {a.min()} bytes; memory per rank must be >= 0")
    if (a >= _BIG // 1024).any():
        raise ValueError(f"{name} has {a.max()} bytes, beyond what the DP can sum safely")
    return a


def _as_budget(budget_bytes: int | float) -> int:
    if isinstance(budget_bytes, float):
        if math.isinf(budget_bytes) and budget_bytes > 0:
            return _BIG
        if not budget_bytes.is_integer():
            raise ValueError(f"budget_bytes must be a whole number of bytes, got {budget_bytes}")
    return min(int(budget_bytes), _BIG)
