"""Lagrangian pruning bounds for the inter-layer DP (:mod:`galvatron_fx.search.layer_dp`): prune (c).

Contract
    ``_lagrangian_bounds(times, mems, trans, budget, time_cap_s)`` returns a ``_Bounds``: a few
    multipliers λ with their suffix tables, an upper bound ``ub_s`` (the time of a known fitting
    assignment, the *incumbent*, or the caller's cap) and the best dual value. ``_Bounds.prune``
    marks the points that cannot finish at or below ``ub_s``; it never drops a point that could
    (a 1e-9 relative margin absorbs float round-off). numpy only.

Terms
    *λ*: a Lagrange multiplier on memory, in seconds per byte; *dual value*
    ``min_c (T + λM) − λB``, a lower bound on the optimum for every λ ≥ 0; *splice*: a prefix of
    one assignment followed by the suffix of another.

Algorithm
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
    chains measured in :mod:`galvatron_fx.search.layer_dp` keep tens to a few thousand points
    instead of ~10^5. It cannot help when many layers share one time/memory slope (near-ties
    everywhere, a subset-sum in disguise): the exact frontier then grows to ~10^5 points and a
    warning suggests ``mem_resolution_bytes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np

from galvatron_fx.search.chain_frontier import _BIG


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
            h[i - 1] = (enter[i][:, None, :] + cast(np.ndarray, trans[i])[None, :, :]).min(axis=2)
    rows = np.arange(lams.size)
    choice = np.zeros((lams.size, num_layers), dtype=np.int64)
    c = enter[0].argmin(axis=1)
    total_t = times[0][c].copy()
    total_m = mems[0][c].copy()
    choice[:, 0] = c
    for i in range(1, num_layers):
        step = cast(np.ndarray, trans[i])[c, :]  # (n, K_i); only the first layer has no transition
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
    lam_big = 4.0 * (t_span + sum(float(np.ptp(r[np.isfinite(r)])) if np.isfinite(r).any() else 0.0
                                  for r in cast(list[np.ndarray], trans[1:])) + 1.0)
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
            hs.append(h1)
            choices.append(c1)
            tts.append(t1)
            mms.append(m1)
            lams.append(np.array([max(lam, 0.0)]))
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
            choices.append(splice[0][None, :])
            tts.append(np.array([splice[1]]))
            mms.append(np.array([splice[2]]))
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
