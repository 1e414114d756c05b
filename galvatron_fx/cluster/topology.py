"""Where each rank of a plan sits: slow links between nodes, and the node order that keeps the
groups a plan communicates most in off them.

Contract
    ``Cluster.slow_links`` lists node pairs whose link is slower than the inter-node tier, each
    as ``(node a, node b, factor)`` with ``factor`` in (0, 1] the share of the inter-node bandwidth
    that link carries (``galvatron-fx profile`` measures them; a cluster JSON may state them).
    :func:`link_factor` is what a group spanning some nodes gets of the inter-node bandwidth (its
    slowest link's factor); :func:`slowed` the tier it is priced on. :func:`stage_nodes` lays the
    nodes on pipeline stages: the order the plan records (``ParallelPlan.stage_ranks``) and the
    runtime builds its meshes from.

Terms
    *stage nodes*: with ``pp`` stages over ``N`` nodes and ``pp ≤ N``, each stage spans ``N / pp``
    whole nodes (only layouts the pipeline runtime can run: :func:`runnable`) and every data-parallel group of a stage (tensor parallelism stays inside a node)
    spans all of them, so a slow link inside a stage slows its gradient sums every step, while a
    slow link between two stages carries only the pipeline's activations. With ``pp > N`` each
    stage lies inside one node and no choice remains.

Algorithm
    :func:`stage_nodes` searches the runnable partitions of the nodes into ``pp`` equal groups
    for the best by, in order: the fewest stages spanning device kinds (heterogeneous clusters,
    ``Cluster.node_kinds``: such a stage computes every micro-batch at its slowest member's pace
    and holds its smallest memory, while a slow link inside a stage slows only its gradient
    sums), the fastest slowest in-stage link, the fewest slow in-stage pairs, then the node-major
    order. The search is exhaustive over the assignments of the nodes that matter (every node
    when kinds differ, else those on a slow link; others fill the remaining places in order)
    when there are at most 50,000, else pairwise swaps from the best of the node-major, the
    round-robin and the grouped-by-kind layouts (kinds in order of their first node, nodes
    ascending within a kind). Without slow links or several kinds, or without whole nodes per
    stage, the stages are contiguous blocks of ranks (node-major); a stage left spanning kinds
    is priced by the planner at its slowest member and smallest memory.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from galvatron_fx.errors import ConfigError

if TYPE_CHECKING:
    from galvatron_fx.cluster.spec import Cluster
from galvatron_fx.cluster.records import LinkTier

_EXHAUSTIVE = 50_000  # assignments of slow-link nodes to stages searched exhaustively; more: greedily


def check_slow_links(links: Sequence, num_nodes: int) -> tuple[tuple[int, int, float], ...]:
    """``links`` as sorted ``(a, b, factor)`` triples with ``a < b``; ``ConfigError`` naming the
    entry when a node is outside the cluster, a pair repeats or a factor is not in (0, 1]."""
    out: dict[tuple[int, int], float] = {}
    for i, link in enumerate(links):
        w = f"cluster.slow_links[{i}]"
        if not isinstance(link, (list, tuple)) or len(link) != 3:
            raise ConfigError(f"{w}: expected [node a, node b, factor], got {link!r}")
        a, b, f = link
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (a, b)) or not (0 <= a < num_nodes and
                                                                                   0 <= b < num_nodes) or a == b:
            raise ConfigError(f"{w}: nodes must be two different integers in [0, {num_nodes - 1}], got {a!r}, {b!r}")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ConfigError(f"{w}: factor must be in (0, 1], the share of the inter-node bandwidth the link "
                              f"carries (0.1: ten times slower), got {f!r}")
        key = (min(a, b), max(a, b))
        if key in out:
            raise ConfigError(f"{w}: the link between nodes {key[0]} and {key[1]} is listed twice")
        out[key] = float(f)
    return tuple((a, b, f) for (a, b), f in sorted(out.items()))


def link_factor(cluster: Cluster, nodes: Iterable[int]) -> float:
    """The share of the inter-node bandwidth a group spanning ``nodes`` gets: its slowest link's."""
    if not cluster.slow_links:
        return 1.0
    span = set(nodes)
    return min((f for a, b, f in cluster.slow_links if a in span and b in span), default=1.0)


def slowed(tier: LinkTier, factor: float) -> LinkTier:
    """``tier`` with ``factor`` of its bandwidth: the formula's bandwidth and every fit's per-byte
    cost scaled, latencies kept."""
    if factor >= 1.0:
        return tier
    fits = {c: {n: dataclasses.replace(fit, beta_s_per_byte=fit.beta_s_per_byte / factor) for n, fit in per.items()}
            for c, per in tier.fits.items()}
    return dataclasses.replace(tier, bandwidth_bytes_s=tier.bandwidth_bytes_s * factor, fits=fits)


def stage_ranks(cluster: Cluster, pp: int) -> tuple[tuple[int, ...], ...]:
    """The ranks of each of ``pp`` stages (``pp`` divides the world): contiguous blocks, unless
    slow links or nodes of several kinds, with whole nodes per stage (``pp`` dividing the nodes),
    leave a choice (module doc); then each stage's nodes' ranks, node by node."""
    n, dpn, k = cluster.num_nodes, cluster.devices_per_node, cluster.world_size // pp
    kinds = tuple(cluster.node_kinds)
    mixed = len(set(kinds)) > 1
    if not (cluster.slow_links or mixed) or pp >= n or n % pp:
        return tuple(tuple(range(s * k, (s + 1) * k)) for s in range(pp))
    groups = _best_partition(n, pp, tuple(cluster.slow_links), kinds if mixed else ())
    return tuple(tuple(r for node in g for r in range(node * dpn, (node + 1) * dpn)) for g in groups)


def _by_kind(kinds: Sequence[str], pp: int) -> tuple[tuple[int, ...], ...] | None:
    """Nodes grouped by device kind and cut into ``pp`` equal stages, in pipeline order (module
    doc), when the pipeline can run that; else None."""
    first = {k: kinds.index(k) for k in kinds}
    order = sorted(range(len(kinds)), key=lambda i: (first[kinds[i]], i))
    k = len(kinds) // pp
    groups = tuple(sorted(tuple(sorted(order[s * k:(s + 1) * k])) for s in range(pp)))
    return groups if runnable(groups) else None


def stage_nodes(cluster: Cluster, pp: int) -> tuple[tuple[int, ...], ...]:
    """The nodes each of ``pp`` stages runs on (:func:`stage_ranks`)."""
    dpn = cluster.devices_per_node
    return tuple(tuple(sorted({r // dpn for r in ranks})) for ranks in stage_ranks(cluster, pp))


def _score(groups: Sequence[Sequence[int]], links: tuple[tuple[int, int, float], ...],
           kinds: tuple[str, ...]) -> tuple[int, float, int]:
    """(stages spanning device kinds, −the slowest in-stage link's factor, slow pairs inside
    stages): smaller is better."""
    worst, count = 1.0, 0
    for g in groups:
        span = set(g)
        for a, b, f in links:
            if a in span and b in span:
                worst, count = min(worst, f), count + 1
    mixed = sum(len({kinds[i] for i in g}) > 1 for g in groups) if kinds else 0
    return (mixed, -worst, count)


@lru_cache(maxsize=256)
def _best_partition(n: int, pp: int, links: tuple[tuple[int, int, float], ...],
                    kinds: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    k = n // pp
    identity = tuple(tuple(range(s * k, (s + 1) * k)) for s in range(pp))
    best, best_key = identity, (_score(identity, links, kinds), 0)
    # the nodes whose stage matters: every node when kinds differ, else those on a slow link
    touched = list(range(n)) if kinds else sorted({x for a, b, _ in links for x in (a, b)})
    if pp ** len(touched) > _EXHAUSTIVE:
        return _greedy(n, pp, links, kinds, best)
    rest = [x for x in range(n) if x not in touched]
    # every assignment of the touched nodes to stages (stage capacity k), the others filling in order
    for stages in itertools.product(range(pp), repeat=len(touched)):
        if any(stages.count(s) > k for s in range(pp)):
            continue
        groups = [[t for t, s in zip(touched, stages) if s == g] for g in range(pp)]
        fill = iter(rest)
        for g in groups:
            while len(g) < k:
                g.append(next(fill))
        cand = tuple(sorted(tuple(sorted(g)) for g in groups))  # stages by first node, nodes ascending
        if not runnable(cand):
            continue
        key = (_score(cand, links, kinds), _moved(cand, identity))
        if key < best_key:
            best, best_key = cand, key
    return best


def runnable(stages: Sequence[Sequence[int]]) -> bool:
    """Whether the pipeline runtime can run stages laid this way (nodes or ranks): each stage's in
    ascending order, and the ``j``-th of every stage above the ``j``-th of the stage before.
    ``torch.distributed.pipelining`` puts stage ``s`` on rank ``s`` of its pipeline group, and a
    process group numbers its ranks in ascending order; a mesh axis whose ranks ascend has
    coordinates equal to its group's ranks."""
    return all(list(g) == sorted(g) for g in stages) and all(
        a < b for s in range(len(stages) - 1) for a, b in zip(stages[s], stages[s + 1]))


def _moved(groups: Sequence[Sequence[int]], identity: Sequence[Sequence[int]]) -> int:
    """Nodes placed off their node-major stage (a tie-break towards the usual layout)."""
    return sum(len(set(g) - set(i)) for g, i in zip(groups, identity))


def _greedy(n: int, pp: int, links: tuple[tuple[int, int, float], ...], kinds: tuple[str, ...],
            start: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Many choices: the best of the node-major layout, the round-robin one (stage ``s`` on nodes
    ``s, s + pp, …``: neighbours apart) and the nodes grouped by kind, then swaps of two nodes
    between stages while the score improves and the pipeline can run the result."""
    strided = tuple(tuple(range(s, n, pp)) for s in range(pp))
    starts = [start, strided] + ([g] if kinds and (g := _by_kind(kinds, pp)) else [])
    best = min(starts, key=lambda g: _score(g, links, kinds))
    improved = True
    while improved:
        improved = False
        for s, t in itertools.combinations(range(pp), 2):
            for i, j in itertools.product(range(len(best[s])), range(len(best[t]))):
                groups = [list(g) for g in best]
                groups[s][i], groups[t][j] = groups[t][j], groups[s][i]
                cand = tuple(sorted(tuple(sorted(g)) for g in groups))
                if runnable(cand) and _score(cand, links, kinds) < _score(best, links, kinds):
                    best, improved = cand, True
    return best
