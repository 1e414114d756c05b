"""Time of one collective on a given group of ranks, tier-aware and hierarchical.

Convention for ``nbytes`` — always the size of the *full, unsharded* logical tensor:

- ``all_reduce``: the tensor every rank holds (and gets back reduced).
- ``all_gather``: the gathered output (each rank contributes ``nbytes / n``).
- ``reduce_scatter``: the input every rank holds (each rank keeps ``nbytes / n``).
- ``all_to_all``: the global tensor; each rank holds ``nbytes / n`` and sends ``(n-1)/n`` of it.
- ``p2p``, ``broadcast``: the message.

Model, for a group of ``n`` ranks on one tier (latency ``a``, bus bandwidth ``B``):

    all_reduce      a + 2 (n-1)/n · S / B
    all_gather      a +   (n-1)/n · S / B
    reduce_scatter  a +   (n-1)/n · S / B
    all_to_all      a +   (n-1)/n · S / (n B)
    p2p, broadcast  a +             S / B

unless the tier holds a profiled ``CollectiveFit`` for (collective, n), which wins; with a fit for
another group size ``m`` only, its alpha is kept and its beta rescaled by the ratio of the factors
above. A group spanning ``k`` nodes with ``g`` ranks on each is costed hierarchically (NCCL-style):
all-reduce = intra reduce-scatter(S) + inter all-reduce(S/g over k) + intra all-gather(S); its
inter-node part at the bandwidth of the slowest link between its nodes
(``Cluster.slow_links``, :mod:`galvatron_fx.cluster.topology`).
On clusters whose ``all_to_all_via_all_gather`` is set (DTensor on CPU meshes), all-to-all is
costed as the all-gather of the same tensor.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

from galvatron_fx.cluster import Cluster, Collective, LinkTier
from galvatron_fx.cluster.topology import link_factor, slowed
from galvatron_fx.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["Collective", "CommModel", "bandwidth_factor"]


def bandwidth_factor(collective: Collective | str, n: int) -> float:
    """Bytes each rank moves over its link per byte of ``nbytes`` (the ring factor above)."""
    c = Collective(collective)
    if n <= 1:
        return 0.0
    if c is Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if c in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        return (n - 1) / n
    if c is Collective.ALL_TO_ALL:
        return (n - 1) / (n * n)
    return 1.0  # p2p, broadcast (pipelined)


class CommModel:
    """Communication cost model over a ``Cluster``.

    ``time_s(collective, nbytes, ranks)`` is the main entry point; ``ranks`` are global ranks.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._shapes: dict[tuple[int, ...], tuple[int, int, int, float]] = {}
        self._slow_tiers: dict[float, LinkTier] = {}

    # ------------------------------------------------------------------ public
    def time_s(self, collective: Collective | str, nbytes: int, ranks: Sequence[int] | int) -> float:
        """Predicted seconds for ``collective`` on ``nbytes`` (see module convention) over ``ranks``.

        ``ranks`` may be an int ``n`` meaning the contiguous group ``range(n)``.
        """
        try:
            coll = Collective(collective)
        except ValueError:
            raise ConfigError(f"unknown collective {collective!r}; use one of {[str(c) for c in Collective]}") from None
        if nbytes < 0:
            raise ConfigError(f"nbytes must be >= 0, got {nbytes}")
        n, k, g, factor = self._group_shape(tuple(range(ranks)) if isinstance(ranks, int) else tuple(ranks))
        if n <= 1 or nbytes == 0:
            return 0.0
        if coll is Collective.ALL_TO_ALL and self.cluster.all_to_all_via_all_gather:
            coll = Collective.ALL_GATHER
        if k == 1:
            return self.tier_time_s(self.cluster.intra_node, coll, nbytes, n)
        inter = self._inter(factor)
        intra = self.cluster.intra_node
        if coll is Collective.P2P:
            return self.tier_time_s(inter, coll, nbytes, 2)
        if g == 1:
            return self.tier_time_s(inter, coll, nbytes, k)
        if coll is Collective.ALL_REDUCE:
            return (
                self.tier_time_s(intra, Collective.REDUCE_SCATTER, nbytes, g)
                + self.tier_time_s(inter, Collective.ALL_REDUCE, nbytes // g, k)
                + self.tier_time_s(intra, Collective.ALL_GATHER, nbytes, g)
            )
        if coll is Collective.ALL_GATHER:
            return self.tier_time_s(inter, coll, nbytes // g, k) + self.tier_time_s(intra, coll, nbytes, g)
        if coll is Collective.REDUCE_SCATTER:
            return self.tier_time_s(intra, coll, nbytes, g) + self.tier_time_s(inter, coll, nbytes // g, k)
        if coll is Collective.ALL_TO_ALL:
            # off-node traffic: each rank sends (k-1)/k of its nbytes/n over the inter tier
            return self.tier_time_s(inter, coll, nbytes // g, k) + self.tier_time_s(intra, coll, nbytes // k, g)
        # broadcast: across nodes, then inside each node
        return self.tier_time_s(inter, coll, nbytes, k) + self.tier_time_s(intra, coll, nbytes, g)

    def _group_shape(self, group: tuple[int, ...]) -> tuple[int, int, int, float]:
        """``(ranks, nodes spanned, ranks on the busiest node, the share of the inter-node
        bandwidth its slowest link carries)`` of ``group`` (checked; cached: a search asks about
        the same few groups many times)."""
        shape = self._shapes.get(group)
        if shape is None:
            if len(set(group)) != len(group):
                raise ConfigError(f"ranks contain duplicates: {list(group)}")
            per_node = Counter(self.cluster.node_of(r) for r in group)
            # the busiest node sets the pace, the slowest link between its nodes the bandwidth
            shape = (len(group), len(per_node), max(per_node.values(), default=0), link_factor(self.cluster, per_node))
            if len(self._shapes) < 4096:
                self._shapes[group] = shape
        return shape

    def _inter(self, factor: float) -> LinkTier:
        """The inter-node tier at ``factor`` of its bandwidth (a group across a slow link)."""
        if factor >= 1.0:
            return self.cluster.inter_node
        if factor not in self._slow_tiers:
            self._slow_tiers[factor] = slowed(self.cluster.inter_node, factor)
        return self._slow_tiers[factor]

    def overlapped_s(self, compute_s: float, comm_s: float) -> float:
        """Wall time of ``compute_s`` and ``comm_s`` run concurrently (with the overlap slowdown).

        Never below either alone and never above running them one after the other.
        """
        both = max(compute_s, comm_s) * self.cluster.overlap_slowdown
        return min(max(both, compute_s, comm_s), compute_s + comm_s)

    def tier_time_s(self, tier: LinkTier, collective: Collective | str, nbytes: int, n: int) -> float:
        """Time of ``collective`` on ``n`` ranks all joined by ``tier`` (no hierarchy)."""
        coll = Collective(collective)
        if n <= 1 or nbytes <= 0:
            return 0.0
        fit = tier.fit(coll, n)
        if fit is not None:
            return fit.time_s(nbytes)
        near = self._nearest_fit(tier, coll, n)
        if near is not None:
            m, f = near
            scale = bandwidth_factor(coll, n) / bandwidth_factor(coll, m)
            return f.alpha_s + f.beta_s_per_byte * scale * nbytes
        return tier.latency_s + bandwidth_factor(coll, n) * nbytes / tier.bandwidth_bytes_s

    def fit_source(self, collective: Collective | str, ranks: Iterable[int]) -> str:
        """Where the estimate for this group comes from: ``fit``, ``rescaled_fit`` or ``formula``."""
        group = list(ranks)
        tier = self.cluster.tier_of(group)
        coll = Collective(collective)
        if tier.fit(coll, len(group)) is not None:
            return "fit"
        return "rescaled_fit" if self._nearest_fit(tier, coll, len(group)) else "formula"

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _nearest_fit(tier: LinkTier, coll: Collective, n: int):
        per = tier.fits.get(coll)
        if not per:
            return None
        m = min(per, key=lambda s: (abs(s - n), s))
        return m, per[m]
