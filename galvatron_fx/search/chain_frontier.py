"""Frontier primitives of the inter-layer DP (:mod:`galvatron_fx.search.layer_dp`): Pareto pruning
per group, transition-row groups and the least-memory suffix pass.

Contract
    numpy arrays in, numpy arrays out; no torch. Memory is int64 bytes, ``_BIG`` stands for
    "unreachable" (far above any real byte count, far enough below int64's max that sums of a few
    of them cannot overflow); time is float seconds, ``inf`` forbids.

Terms
    *frontier*, *group*: as in :mod:`galvatron_fx.search.layer_dp` (non-dominated (memory, time)
    points; choices whose outgoing transition rows are equal).

Algorithm
    Pareto pruning is vectorised: candidates are sorted by (group, memory, time) with one
    ``np.lexsort``; a point survives iff its time is strictly below the running minimum of its group's
    earlier points (``np.minimum.accumulate`` over integer time ranks offset per group, so one pass
    does all groups).
    The least-memory suffix ``S[i][c]`` is one backward min-plus pass over allowed transitions.
"""

from __future__ import annotations

from typing import cast

import numpy as np

# "Unreachable" memory: far above any real byte count, far enough below int64's max that sums of a
# few of them cannot overflow.
_BIG = np.iinfo(np.int64).max // 8


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
        allowed = np.isfinite(cast(np.ndarray, trans[i]))  # (K_{i-1}, K_i)
        suffix[i - 1] = np.where(allowed, enter[None, :], _BIG).min(axis=1)
    return suffix


def _min_mem(times: list[np.ndarray], mems: list[np.ndarray], trans: list[np.ndarray | None]) -> int:
    """Least Σ memory of an allowed assignment (``-1`` if none). Exact: a min-plus path DP."""
    suffix = _suffix_min_mem(times, mems, trans)
    total = np.where(np.isfinite(times[0]), mems[0] + suffix[0], _BIG)
    best = int(total.min())
    return -1 if best >= _BIG else best
