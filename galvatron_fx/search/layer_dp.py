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
             t + h_λ[i][c'] − λ·(B − m) > UB for some λ in a small set Λ (below)
    answer   the point of F_{L-1}(all) with the least time; walk the back-pointers for the choices.

Bound (c): for λ ≥ 0, ``h_λ[i][c]`` is the least ``Σ_{j>i} (t_j + R_j + λ·m_j)`` after choice c
(no memory limit; one backward min-plus pass, vectorised over λ). A completion that fits adds at
most ``B − m`` bytes, so no completion of the point finishes faster than the bound. ``UB`` is the
time of a known fitting assignment (the incumbent): the best λ-minimiser that fits, or a splice of
the two λ-minimisers that bracket the budget. Λ = {0} ∪ the two λ with the best dual value
``min_c (T + λM) − λB``; secant steps on λ walk the lower convex hull of the frontier to the
dual-optimal λ. The sweep first runs with UB = D + gap/64, then D + gap/8 (D the best dual value,
gap = incumbent − D): whatever survives a cap at or above the optimum includes the optimum, so the
first sweep that finds anything is exact, and thin bands are cheap; the last sweep uses the
incumbent. This is Lagrangian branch-and-bound inside the DP; it makes the 128×24 and 1000×8
chains below keep tens to a few thousand points instead of ~10^5. It cannot help when many layers
share one time/memory slope (near-ties everywhere, a subset-sum in disguise): the exact frontier
then grows to ~10^5 points and a warning suggests ``mem_resolution_bytes``.

Why it is exact: both objectives are sums along the chain, and the cost of any completion of a
partial assignment depends only on its last choice's outgoing row. If two partial assignments end
in the same group and one has ≤ memory and ≤ time, every completion of the other is matched by the
same completion of the first with ≤ memory and ≤ time, so dropping the other loses no optimum.
Pruning (b) drops only points that cannot complete within budget, (c) only points whose every
fitting completion is slower than an assignment already in hand (with a 1e-9 relative margin for
float round-off). Exact equality of transition rows is used for grouping, so merging never changes
the answer. `pareto_frontier` uses (a) and (b) only, since it wants every frontier point.

Pareto pruning is vectorised: candidates are sorted by (group, memory, time) with one
``np.lexsort``; a point survives iff its time is strictly below the running minimum of its group's
earlier points (``np.minimum.accumulate`` over integer time ranks offset per group, so one pass
does all groups).

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

Measured (2-core shared CPU, numpy 2.4; budgets from 10% to 90% of the way between the least and
the unconstrained memory; tests/unit/test_layer_dp.py::test_speed): 128 layers × 24 choices with
dense random transitions 15–50 ms; a transformer-like 128 × 24 with 4 layouts 15–40 ms; 1000 layers
× 8 choices dense 80–540 ms.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "ChainProblem",
    "ChainSolution",
    "brute_force",
    "chain_cost",
    "pareto_frontier",
    "solve_chain",
]

# "Unreachable" memory: far above any real byte count, far enough below int64's max that sums of a
# few of them cannot overflow.
_BIG = np.iinfo(np.int64).max // 8
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

    best: _DPRun | None = None
    best_key = (math.inf, math.inf)
    sizes = np.zeros(problem.num_layers, dtype=np.int64)
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
    min_mem = _min_mem_with_extra(problem)
    if best is None:
        return ChainSolution(False, (), math.inf, 0, min_mem, tuple(int(s) for s in sizes))
    return ChainSolution(True, best.choices, best_key[0], int(best_key[1]), min_mem, tuple(int(s) for s in sizes))


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
            t += float(problem.trans_s[i][choices[i - 1], c])
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
            times += problem.trans_s[i][assign[:, i - 1], assign[:, i]]
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
    for i in range(num_layers):
        if i:
            # (N,) points x (K_i,) next choices -> (N, K_i) candidates.
            cand_t = cur_t[:, None] + trans[i][cur_c, :] + times[i][None, :]
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


@dataclass(frozen=True)
class _Bounds:
    """Lagrangian pruning for `_run_dp` (exact: it only drops points that cannot beat ``ub_s``).

    For a multiplier ``λ ≥ 0`` let ``h_λ[i][c]`` be the least ``Σ (time + λ·memory)`` that layers
    i+1.. add after choice c (a min-plus pass, no memory limit). A completion that fits must add at
    most ``B − m`` bytes, so a point (m, t) at layer i ending in c finishes no faster than
    ``t + h_λ[i][c] − λ·(B − m)``. Points above ``ub_s`` (the time of a known feasible assignment,
    or a caller's cap) are dropped. λ = 0 gives the memory-blind suffix bound.
    """

    lams: np.ndarray  # (n,)
    h: list[np.ndarray]  # per layer, (n, K_i)
    budget: int
    ub_s: float
    incumbent: tuple[int, ...] | None  # the assignment whose time is ub_s, if any
    dual_s: float  # max over λ of min(T + λM) − λB: a lower bound on the optimum

    def prune(self, i: int, m: np.ndarray, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        if not math.isfinite(self.ub_s):
            return np.zeros(m.size, dtype=bool)
        slack = (self.budget - m).astype(np.float64)
        out = np.zeros(m.size, dtype=bool)
        for lam, h in zip(self.lams, self.h[i]):
            # the margin absorbs round-off: sums taken in another order than the incumbent's
            tol = 1e-9 * (abs(self.ub_s) + lam * self.budget) + 1e-300
            out |= t + h[c] - lam * slack > self.ub_s + tol
        return out


def _lagrangian_pass(
    times: list[np.ndarray], mems: list[np.ndarray], trans: list[np.ndarray | None], lams: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """For each λ: suffix tables h, and the assignment minimising Σ time + λ·memory with its (T, M).

    Returns (h per layer (n, K_i), choices (n, L), T (n,), M (n,)). Vectorised over λ.
    """
    num_layers = len(times)
    lam = lams[:, None]
    enter: list[np.ndarray] = [np.zeros(0)] * num_layers  # (n, K_i): cost of taking choice c at i onwards
    h: list[np.ndarray] = [np.zeros(0)] * num_layers
    h[-1] = np.zeros((lams.size, times[-1].size))
    for i in range(num_layers - 1, -1, -1):
        enter[i] = times[i][None, :] + lam * mems[i][None, :] + h[i]
        if i:
            # (n, 1, K_i) + (K_{i-1}, K_i) -> min over K_i -> (n, K_{i-1})
            h[i - 1] = (enter[i][:, None, :] + trans[i][None, :, :]).min(axis=2)
    rows = np.arange(lams.size)
    choice = np.zeros((lams.size, num_layers), dtype=np.int64)
    c = enter[0].argmin(axis=1)
    total_t = times[0][c].copy()
    total_m = mems[0][c].copy()
    choice[:, 0] = c
    for i in range(1, num_layers):
        step = trans[i][c, :]  # (n, K_i)
        nxt = (step + enter[i]).argmin(axis=1)
        total_t += times[i][nxt] + step[rows, nxt]
        total_m += mems[i][nxt]
        c = nxt
        choice[:, i] = c
    return h, choice, total_t, total_m


def _lagrangian_bounds(
    times: list[np.ndarray], mems: list[np.ndarray], trans: list[np.ndarray | None], budget: int, time_cap_s: float
) -> _Bounds:
    """Multipliers and an incumbent for `_Bounds`.

    A log grid of λ brackets the budget: λ_lo's minimiser uses too much memory, λ_hi's fits. Then
    secant steps λ = (T_hi − T_lo) / (M_lo − M_hi) walk the lower convex hull of the (M, T) frontier
    to the two hull vertices around the budget; that λ maximises the dual ``min(T + λM) − λB``, the
    tightest single-λ bound. The incumbent is the best fitting λ-minimiser or splice of the two
    bracketing assignments (a prefix of one, the suffix of the other). Each step is one
    O(Σ K_{i-1} K_i) min-plus pass.
    """
    t_span = sum(float(np.ptp(t[np.isfinite(t)])) if np.isfinite(t).any() else 0.0 for t in times)
    m_span = sum(int(np.ptp(m)) for m in mems)
    lam0 = max(t_span, 1e-12) / max(m_span, 1)
    # The last λ makes one byte outweigh every time difference: its minimiser uses the least memory,
    # so an incumbent exists whenever anything fits.
    lam_big = 4.0 * (t_span + sum(float(np.ptp(r[np.isfinite(r)])) if np.isfinite(r).any() else 0.0 for r in trans[1:]) + 1.0)
    lams = [np.concatenate([[0.0], lam0 * np.logspace(-3, 3, 13), [max(lam_big, lam0 * 1e4)]])]
    h, choice, tt, mm = _lagrangian_pass(times, mems, trans, lams[0])
    hs, choices, tts, mms = [h], [choice], [tt], [mm]
    feas = np.isfinite(tt) & (mm <= budget)
    if feas.any() and not feas[0] and budget < _BIG:
        j = int(np.argmax(feas))  # memory falls as λ grows: the first λ that fits
        lo = (choice[j - 1], float(tt[j - 1]), int(mm[j - 1]))
        hi = (choice[j], float(tt[j]), int(mm[j]))
        for _ in range(40):
            if lo[2] <= hi[2] or not math.isfinite(lo[1]):
                break
            lam = (hi[1] - lo[1]) / (lo[2] - hi[2])
            h1, c1, t1, m1 = _lagrangian_pass(times, mems, trans, np.array([max(lam, 0.0)]))
            hs.append(h1), choices.append(c1), tts.append(t1), mms.append(m1), lams.append(np.array([max(lam, 0.0)]))
            new = (c1[0], float(t1[0]), int(m1[0]))
            value_new = new[1] + lam * new[2]
            value_lo = lo[1] + lam * lo[2]
            if value_new >= value_lo - 1e-12 * (abs(value_lo) + 1e-30):
                break  # lo and hi are adjacent hull vertices: λ is dual-optimal
            if new[2] <= budget:
                hi = new
            else:
                lo = new
        splice = _splice(times, mems, trans, lo[0], hi[0], budget)
        if splice is not None:
            choices.append(splice[0][None, :]), tts.append(np.array([splice[1]])), mms.append(np.array([splice[2]]))
    grid = np.concatenate(lams)
    h = [np.concatenate([x[i] for x in hs]) for i in range(len(times))]
    choice, tt, mm = np.concatenate(choices), np.concatenate(tts), np.concatenate(mms)
    feas = np.isfinite(tt) & (mm <= budget)
    ub, incumbent = time_cap_s, None
    if feas.any():
        k = int(np.flatnonzero(feas)[np.argmin(tt[feas])])
        if tt[k] <= ub:
            ub, incumbent = float(tt[k]), tuple(int(c) for c in choice[k])
    # Dual value of each λ (how tight its bound is at the root); keep λ = 0 and the two best.
    root = (times[0][None, :] + grid[:, None] * mems[0][None, :] + h[0]).min(axis=1)
    dual = root - grid * float(budget)
    best_two = [int(k) for k in np.argsort(-dual, kind="stable")[:2]]
    pick = sorted({0, *best_two})
    if len(pick) == 3 and grid[pick[1]] == grid[pick[2]]:
        pick = pick[:2]
    dual_best = float(dual[best_two[0]]) if np.isfinite(dual[best_two[0]]) else -math.inf
    return _Bounds(grid[pick], [hh[pick] for hh in h], budget, ub, incumbent, dual_best)


def _splice(
    times: list[np.ndarray], mems: list[np.ndarray], trans: list[np.ndarray | None], a: np.ndarray, b: np.ndarray, budget: int
) -> tuple[np.ndarray, float, int] | None:
    """Best fitting assignment among a[:k] + b[k:] and b[:k] + a[k:] over all k (None if none fits)."""
    num_layers = len(times)
    if num_layers < 2:
        return None
    idx = np.arange(num_layers)
    best = None
    for x, y in ((a, b), (b, a)):
        # per-layer own costs, transitions inside x and inside y, and the cross transition x->y at k
        tx = np.array([times[i][x[i]] for i in idx])
        ty = np.array([times[i][y[i]] for i in idx])
        rx = np.array([0.0] + [trans[i][x[i - 1], x[i]] for i in idx[1:]])
        ry = np.array([0.0] + [trans[i][y[i - 1], y[i]] for i in idx[1:]])
        cross = np.array([trans[k][x[k - 1], y[k]] for k in idx[1:]])  # k = 1..L-1
        mx = np.array([mems[i][x[i]] for i in idx], dtype=np.int64)
        my = np.array([mems[i][y[i]] for i in idx], dtype=np.int64)
        pre_t = np.cumsum(tx + rx)[:-1]  # layers < k from x, k = 1..L-1
        suf_t = np.cumsum((ty + ry)[::-1])[::-1][1:] - ry[1:]  # layers >= k from y, without y's entry
        total_t = pre_t + cross + suf_t
        total_m = np.cumsum(mx)[:-1] + np.cumsum(my[::-1])[::-1][1:]
        ok = np.isfinite(total_t) & (total_m <= budget)
        if ok.any():
            k = int(np.flatnonzero(ok)[np.argmin(total_t[ok])])
            if best is None or total_t[k] < best[1]:
                best = (np.concatenate([x[: k + 1], y[k + 1 :]]), float(total_t[k]), int(total_m[k]))
    return best


def _pareto_keep(m: np.ndarray, t: np.ndarray, group: np.ndarray, num_groups: int, resolution: int = 0) -> np.ndarray:
    """Indices of the non-dominated points of each group, ordered by (group, memory ascending).

    Sorted by (group, memory, time), a point is kept iff its time is strictly below every earlier
    time of its group. To do all groups in one ``minimum.accumulate``, times become dense integer
    ranks offset by ``(num_groups - 1 - group) * N``: every earlier group's keys are then larger
    than all of this group's, so they never win the running minimum.
    """
    if m.size == 0:
        return np.zeros(0, dtype=np.int64)
    if resolution > 0:
        m = m // resolution  # epsilon-dominance: compare memory buckets, keep true memory outside
    if num_groups == 1:
        order = np.lexsort((t, m))
        ts = t[order]
        prev_min = np.empty_like(ts)
        prev_min[0] = np.inf
        np.minimum.accumulate(ts[:-1], out=prev_min[1:])
        return order[ts < prev_min]
    order = np.lexsort((t, m, group))
    # Rank times; equal times keep their sorted order, so a later point never beats an equal one.
    rank = np.empty(order.size, dtype=np.int64)
    rank[np.argsort(t[order], kind="stable")] = np.arange(order.size)
    key = rank + (num_groups - 1 - group[order]) * order.size
    prev_min = np.empty_like(key)
    prev_min[0] = np.iinfo(np.int64).max
    np.minimum.accumulate(key[:-1], out=prev_min[1:])
    return order[key < prev_min]


def _groups(next_trans: np.ndarray | None, num_choices: int) -> tuple[np.ndarray, int]:
    """Group id per choice: choices with equal outgoing transition rows share a frontier."""
    if next_trans is None:
        return np.zeros(num_choices, dtype=np.int64), 1
    ids: dict[bytes, int] = {}
    group = np.array([ids.setdefault(row.tobytes(), len(ids)) for row in next_trans], dtype=np.int64)
    return group, len(ids)


def _suffix_min_mem(times: list[np.ndarray], mems: list[np.ndarray], trans: list[np.ndarray | None]) -> list[np.ndarray]:
    """``S[i][c]``: least memory layers i+1.. add after choice c at layer i (``_BIG`` if none allowed)."""
    num_layers = len(times)
    suffix = [np.zeros(0, dtype=np.int64)] * num_layers
    suffix[-1] = np.zeros(times[-1].size, dtype=np.int64)
    for i in range(num_layers - 1, 0, -1):
        # cost of entering choice c' of layer i: its memory plus what follows it
        enter = np.where(np.isfinite(times[i]), np.minimum(mems[i] + suffix[i], _BIG), _BIG)
        allowed = np.isfinite(trans[i])  # (K_{i-1}, K_i)
        suffix[i - 1] = np.where(allowed, enter[None, :], _BIG).min(axis=1)
    return suffix


def _min_mem(times: list[np.ndarray], mems: list[np.ndarray], trans: list[np.ndarray | None]) -> int:
    """Least Σ memory of an allowed assignment (``-1`` if none). Exact: a min-plus path DP."""
    suffix = _suffix_min_mem(times, mems, trans)
    total = np.where(np.isfinite(times[0]), mems[0] + suffix[0], _BIG)
    best = int(total.min())
    return -1 if best >= _BIG else best


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
    if a.dtype.kind not in "iu":
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or not np.all(a == np.floor(a)):
            raise ValueError(f"{name} must hold whole byte counts (ints), got {a.dtype} values {a.tolist()[:4]}...")
    a = a.astype(np.int64)
    if (a < 0).any():
        raise ValueError(f"{name} has negative memory {a.min()} bytes; memory per rank must be >= 0")
    if (a >= _BIG // 1024).any():
        raise ValueError(f"{name} has {a.max()} bytes, beyond what the DP can sum safely")
    return a


def _as_budget(budget_bytes: int) -> int:
    if isinstance(budget_bytes, float):
        if math.isinf(budget_bytes) and budget_bytes > 0:
            return _BIG
        if not budget_bytes.is_integer():
            raise ValueError(f"budget_bytes must be a whole number of bytes, got {budget_bytes}")
    return min(int(budget_bytes), _BIG)
