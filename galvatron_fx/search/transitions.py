"""Between consecutive layers' choices: the reshard of the hidden state from one choice's output
layout to the next one's input layout (:func:`transition_s`, and per pair of choice lists
:func:`transition_matrix`, priced once per layout pair), and the pruning of choices another with
the same layouts beats or ties in time and memory (:func:`prune_dominated`) — the edges and the
nodes the inter-layer DP walks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.reshard import Layout, Replicate, Shard
from galvatron_fx.ir.placements import parse_placement
from galvatron_fx.search.candidates import LayerChoice

__all__ = ["prune_dominated", "transition_matrix", "transition_s"]


def transition_s(cm: CostModel, a: LayerChoice, b: LayerChoice, nbytes: int, ndim: int,
                 ranks: Sequence[int]) -> float:
    """Forward + backward seconds to reshard the hidden state from choice ``a`` to ``b``."""
    if (a.dp, a.strategy.tp, a.out_layout) == (b.dp, b.strategy.tp, b.in_layout):
        return 0.0
    src = Layout((a.dp, a.strategy.tp), (Shard(0), _tp_placement(a.out_layout)))
    dst = Layout((b.dp, b.strategy.tp), (Shard(0), _tp_placement(b.in_layout)))
    fwd = cm.reshard_time_s(nbytes, src, dst, list(ranks), max(ndim, 2))
    bwd = cm.reshard_time_s(nbytes, dst, src, list(ranks), max(ndim, 2))
    return fwd + bwd


def _tp_placement(s: str):
    p = parse_placement(s)
    return p if isinstance(p, Shard) else Replicate()


def transition_matrix(cm: CostModel, prev: list[LayerChoice], cur: list[LayerChoice], nbytes: int,
                      ndim: int, ranks: Sequence[int], num_microbatches: int) -> np.ndarray:
    """Per-step transition seconds between every pair of choices (computed once per layout pair)."""
    memo: dict[tuple, float] = {}
    out = np.zeros((len(prev), len(cur)))
    for i, a in enumerate(prev):
        ka = (a.dp, a.strategy.tp, a.out_layout)
        for j, b in enumerate(cur):
            kb = (b.dp, b.strategy.tp, b.in_layout)
            if (ka, kb) not in memo:
                memo[(ka, kb)] = num_microbatches * transition_s(cm, a, b, nbytes, ndim, ranks)
            out[i, j] = memo[(ka, kb)]
    return out


def prune_dominated(choices: list[LayerChoice], m: int, in_flight: int) -> list[LayerChoice]:
    """Drop every choice that another with the same layouts beats or ties in time, memory and
    temporary memory (so no optimum is lost)."""
    keep: list[LayerChoice] = []
    by_layout: dict[tuple, list[LayerChoice]] = {}
    for c in choices:
        by_layout.setdefault((c.dp, c.strategy.tp, c.in_layout, c.out_layout), []).append(c)
    for group in by_layout.values():
        pts = [(c.step_time_s(m), c.mem_bytes(in_flight), c.memory.temp_bytes, i) for i, c in enumerate(group)]
        for t, mb, tmp, i in pts:
            dominated = any(t2 <= t and m2 <= mb and tmp2 <= tmp and ((t2, m2, tmp2) != (t, mb, tmp) or j < i)
                            for t2, m2, tmp2, j in pts if j != i)
            if not dominated:
                keep.append(group[i])
    return keep
