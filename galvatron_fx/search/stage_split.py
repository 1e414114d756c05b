"""Stage boundaries for the outer search: the split of the layers into pipeline stages (or
chunks) that minimises the largest stage's fastest time.

Contract: :class:`StageSplit` is a base of the outer search's ``_Search`` and reads its
``layers``, ``world``, ``hetero``, ``choices``, ``ranks_of`` and ``stage_budget``.
:meth:`StageSplit.balanced_bounds` returns stage starts: on one device kind a binary search on the
cap with greedy packing (exact for contiguous partitions); on a heterogeneous cluster
:func:`min_max_split`, an exact DP with each stage at its own speed and, given the chunks'
micro-batches in flight, within its own memory where some split allows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    from galvatron_fx.ir.graph import LayerInfo, ModelGraph
    from galvatron_fx.search.candidates import LayerChoice

__all__ = ["StageSplit", "min_max_split"]


class StageSplit:
    """The stage-split methods of the outer search (see the module doc)."""

    if TYPE_CHECKING:  # what the outer search's ``_Search`` provides
        mg: ModelGraph
        layers: list[LayerInfo]
        world: int
        hetero: bool
        _trains: np.ndarray

        def ranks_of(self, pp: int, s: int) -> tuple[int, ...] | None: ...

        def stage_budget(self, ranks: tuple[int, ...] | None) -> int: ...

        def choices(self, i: int, devices: int, samples: int, m: int, ranks: tuple[int, ...] | None = None
                    ) -> list[LayerChoice]: ...

    def trains(self) -> np.ndarray:
        """Per layer, whether it reads a parameter that trains: every pipeline chunk holds one,
        so that every rank has parameters to step (a stage of only the loss, on a slow node,
        would leave its ranks' optimizers with nothing)."""
        if getattr(self, "_trains", None) is None:
            params = self.mg.params
            self._trains = np.array([any(f in params and params[f].requires_grad for f in layer.param_names)
                                     for layer in self.layers], dtype=bool)
        return self._trains

    def splits_params(self, bounds: list[int]) -> bool:
        """Every chunk of ``bounds`` (starts) holds a layer that trains (:meth:`trains`)."""
        t = self.trains()
        if not t.any():  # (a model without trained parameters: nothing to require)
            return True
        edges = list(bounds) + [len(self.layers)]
        return all(t[edges[k]:edges[k + 1]].any() for k in range(len(bounds)))

    def stage_weights(self, n_chunks: int, devices: int, samples: int, m: int) -> np.ndarray:
        """``(n_chunks, layers)``: each layer's fastest step time on each chunk's stage (its own
        ranks and device kind; heterogeneous clusters only)."""
        pp = self.world // devices
        rows = {}
        out = np.empty((n_chunks, len(self.layers)))
        for c in range(n_chunks):
            ranks = self.ranks_of(pp, c % pp)
            if ranks not in rows:
                rows[ranks] = [min(x.step_time_s(m) for x in self.choices(i, devices, samples, m, ranks))
                               for i in range(len(self.layers))]
            out[c] = rows[ranks]
        return out

    def stage_room(self, devices: int, samples: int, m: int, in_flight: list[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``(need, room)``: each layer's least memory on each chunk's stage with that chunk's
        micro-batches in flight, ``(n_chunks, layers)``, and each chunk's share of its stage's
        budget — a chunk whose layers' least memories add up beyond it cannot fit (a necessary
        condition: heterogeneous clusters only)."""
        n_chunks = len(in_flight)
        pp, v = self.world // devices, n_chunks // (self.world // devices)
        need = np.empty((n_chunks, len(self.layers)))
        room = np.empty(n_chunks)
        for c in range(n_chunks):
            ranks = self.ranks_of(pp, c % pp)
            need[c] = [min(x.mem_bytes(in_flight[c]) for x in self.choices(i, devices, samples, m, ranks))
                       for i in range(len(self.layers))]
            room[c] = self.stage_budget(ranks) // v
        return need, room

    def balanced_bounds(self, pp: int, devices: int, samples: int, m: int,
                        in_flight: list[int] | None = None) -> list[int] | None:
        """Stage starts minimising the largest stage's fastest time (binary search on the cap,
        greedy packing — exact for contiguous partitions). On a heterogeneous cluster each stage
        at its own speed and, given the chunks' micro-batches ``in_flight``, within its own
        memory where some split allows (:func:`min_max_split`)."""
        n = len(self.layers)
        if pp > n:
            return None
        trains = self.trains() if self.trains().any() else None
        if self.hetero:
            stage_w = self.stage_weights(pp, devices, samples, m)
            if in_flight is not None:
                bounds = min_max_split(stage_w, *self.stage_room(devices, samples, m, in_flight), trains=trains)
                if bounds is not None:
                    return bounds
            return min_max_split(stage_w, trains=trains)
        w = [min(c.step_time_s(m) for c in self.choices(i, devices, samples, m)) for i in range(n)]

        def pack(cap: float) -> list[int] | None:
            starts, acc = [0], 0.0
            for i, x in enumerate(w):
                if acc + x > cap and acc > 0:
                    starts.append(i)
                    acc = 0.0
                acc += x
            return starts if len(starts) <= pp else None

        lo, hi = max(w), sum(w)
        for _ in range(60):
            mid = (lo + hi) / 2
            if pack(mid) is None:
                lo = mid
            else:
                hi = mid
        starts = pack(hi) or [0]
        # split the longest stages until there are exactly pp (each non-empty)
        while len(starts) < pp:
            edges = starts + [n]
            sizes = [(edges[k + 1] - edges[k], k) for k in range(len(starts))]
            size, k = max(sizes)
            if size < 2:
                return None
            starts.insert(k + 1, edges[k] + size // 2)
        if not self.splits_params(starts):  # the exact split under that rule, every stage alike
            return min_max_split(np.tile(np.asarray(w, dtype=float), (pp, 1)), trains=trains)
        return starts


def min_max_split(w: np.ndarray, need: np.ndarray | None = None, room: np.ndarray | None = None, *,
                  trains: np.ndarray | None = None) -> list[int] | None:
    """Starts of the contiguous split of layers ``0..n`` into ``k = len(w)`` non-empty stages,
    stage ``s`` costing ``Σ w[s, its layers]``, that minimises the largest stage: the DP
    ``best[s][j] = min_i max(best[s−1][i], W_s[j] − W_s[i])`` over prefix sums ``W_s``, one
    vectorised row per (stage, end). With ``need`` (like ``w``) and ``room`` (per stage), only
    splits whose every stage keeps ``Σ need[s, its layers] ≤ room[s]``; with ``trains`` (per layer),
    only splits whose every stage holds a layer that trains; None when none does."""
    k, n = w.shape
    prefix = np.concatenate([np.zeros((k, 1)), np.cumsum(w, axis=1)], axis=1)  # (k, n+1)
    held = None if need is None else np.concatenate([np.zeros((k, 1)), np.cumsum(need, axis=1)], axis=1)
    count = None if trains is None else np.concatenate([[0], np.cumsum(np.asarray(trains, dtype=np.int64))])

    def cost_of(s: int, j: int, lo: int, prev: np.ndarray) -> np.ndarray:  # stage s takes layers i..j-1, i ≥ lo
        cost = np.maximum(prev, prefix[s, j] - prefix[s, lo:j])
        if held is not None:
            cost[held[s, j] - held[s, lo:j] > cast(np.ndarray, room)[s]] = np.inf  # room comes with need
        if count is not None:
            cost[count[j] - count[lo:j] == 0] = np.inf
        return cost

    best = np.full(n + 1, np.inf)
    best[1:] = prefix[0, 1:]  # the first stage ends at j
    if held is not None:
        best[1:][held[0, 1:] > cast(np.ndarray, room)[0]] = np.inf
    if count is not None:
        best[1:][count[1:] == 0] = np.inf
    arg = np.zeros((k, n + 1), dtype=np.int64)
    for s in range(1, k):
        new = np.full(n + 1, np.inf)
        for j in range(s + 1, n - (k - 1 - s) + 1):  # leave a layer for every later stage
            cost = cost_of(s, j, s, best[s:j])
            i = int(np.argmin(cost))
            new[j], arg[s, j] = cost[i], s + i
        best = new
    if not np.isfinite(best[n]):
        return None
    starts, j = [], n
    for s in range(k - 1, 0, -1):
        j = int(arg[s, j])
        starts.append(j)
    return [0] + starts[::-1]
