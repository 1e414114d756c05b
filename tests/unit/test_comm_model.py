"""CommModel: formulas, fits, hierarchy across nodes, gloo all-to-all; fitting and slow links."""

from __future__ import annotations

import pytest

from galvatron_fx.cluster import Cluster, Collective, CollectiveFit, TierName
from galvatron_fx.cost_models.communication import CommModel, bandwidth_factor
from galvatron_fx.errors import ConfigError
from galvatron_fx.profiler.hardware_profile import detect_slow_links, fit_alpha_beta

MiB = 2**20


def test_formula_matches_ring_model() -> None:
    c = Cluster.preset("dgx-a100-80g")
    m = CommModel(c)
    s = 256 * MiB
    assert m.time_s("all_reduce", s, 8) == pytest.approx(10e-6 + 2 * 7 / 8 * s / 240e9)
    assert m.time_s(Collective.ALL_GATHER, s, range(4)) == pytest.approx(10e-6 + 3 / 4 * s / 240e9)
    assert m.time_s("reduce_scatter", s, [1, 3]) == pytest.approx(10e-6 + 1 / 2 * s / 240e9)
    assert m.time_s("all_to_all", s, 4) == pytest.approx(10e-6 + 3 / 16 * s / 240e9)
    assert m.time_s("p2p", s, [0, 5]) == pytest.approx(10e-6 + s / 240e9)
    assert m.time_s("all_reduce", s, [3]) == 0.0
    # all-reduce = reduce-scatter + all-gather in bandwidth terms
    assert bandwidth_factor("all_reduce", 8) == pytest.approx(2 * bandwidth_factor("all_gather", 8))
    with pytest.raises(ConfigError, match="unknown collective"):
        m.time_s("allreduce", 1, 2)


def test_hierarchical_across_nodes() -> None:
    c = Cluster.preset("dgx-h100", nodes=2)
    m = CommModel(c)
    s = 1024 * MiB
    intra, inter = c.intra_node, c.inter_node
    t16 = m.time_s("all_reduce", s, 16)
    expect = (
        intra.latency_s + 7 / 8 * s / intra.bandwidth_bytes_s
        + inter.latency_s + 2 * 1 / 2 * (s // 8) / inter.bandwidth_bytes_s
        + intra.latency_s + 7 / 8 * s / intra.bandwidth_bytes_s
    )
    assert t16 == pytest.approx(expect)
    assert t16 > m.time_s("all_reduce", s, 8)
    # a flat all-reduce over IB would be far slower than the hierarchical one
    assert t16 < inter.latency_s + 2 * 15 / 16 * s / inter.bandwidth_bytes_s
    # one rank per node: pure inter tier
    assert m.time_s("all_reduce", s, [0, 8]) == pytest.approx(inter.latency_s + s / inter.bandwidth_bytes_s)
    # strided group (dp across nodes) pays IB, contiguous (tp inside a node) NVLink
    assert m.time_s("all_gather", s, [0, 8]) > 5 * m.time_s("all_gather", s, [0, 1])


def test_fit_wins_and_is_rescaled_for_other_group_sizes() -> None:
    c = Cluster.preset("rtx4090-pcie")
    fit = CollectiveFit(alpha_s=1e-3, beta_s_per_byte=1e-9)
    c = c.with_fits(TierName.INTRA_NODE, {Collective.ALL_GATHER: {2: fit}})
    m = CommModel(c)
    assert m.time_s("all_gather", MiB, [0, 1]) == pytest.approx(1e-3 + 1e-9 * MiB)
    assert m.fit_source("all_gather", [0, 1]) == "fit"
    # group of 4: beta scaled by (3/4)/(1/2)
    assert m.time_s("all_gather", MiB, 4) == pytest.approx(1e-3 + 1.5e-9 * MiB)
    assert m.fit_source("all_gather", range(4)) == "rescaled_fit"
    assert m.fit_source("all_reduce", range(4)) == "formula"


def test_gloo_all_to_all_costed_as_all_gather(tmp_path) -> None:
    c = Cluster.local_cpu(4, cache_dir=tmp_path)
    m = CommModel(c)
    assert m.time_s("all_to_all", 8 * MiB, 4) == m.time_s("all_gather", 8 * MiB, 4)
    assert m.time_s("all_to_all", 8 * MiB, 4) > 2 * CommModel(Cluster.preset("h200")).time_s("all_to_all", 8 * MiB, 4)


def test_overlap_bounds() -> None:
    m = CommModel(Cluster.preset("dgx-a100-80g"))  # slowdown 1.2
    assert m.overlapped_s(1.0, 0.5) == pytest.approx(1.2)
    assert m.overlapped_s(1.0, 0.1) == pytest.approx(1.1)  # never worse than serial
    assert m.overlapped_s(0.0, 0.3) == pytest.approx(0.3)


def test_fit_alpha_beta_recovers_line_and_weighs_small_sizes() -> None:
    sizes = [4096 * 4**i for i in range(8)]
    times = [50e-6 + 1e-9 * s for s in sizes]
    f = fit_alpha_beta(sizes, times, keep_points=False)
    assert f.alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert f.beta_s_per_byte == pytest.approx(1e-9, rel=1e-6)
    # the largest size 10% slow: relative weighting keeps the small-message latency right
    times[-1] *= 1.1
    g = fit_alpha_beta(sizes, times, keep_points=False)
    assert g.time_s(sizes[0]) == pytest.approx(times[0], rel=0.05)


def test_fit_points_interpolate_log_log() -> None:
    f = CollectiveFit(alpha_s=0.0, beta_s_per_byte=1e-9, points=((1000, 1e-3), (4000, 4e-3)))
    assert f.time_s(2000) == pytest.approx(2e-3)  # log-log line through both points
    assert f.time_s(1000) == 1e-3
    assert f.time_s(8000) == pytest.approx(4e-3 + 1e-9 * 4000)
    assert f.time_s(10) == pytest.approx(1e-8)


def _links(num_nodes: int) -> tuple[dict, list[str]]:
    ranks = range(2 * num_nodes)
    bw = {(a, b): (100e9 if a // 2 == b // 2 else 10e9) for a in ranks for b in ranks if a < b}
    return bw, [f"host{r // 2}:{r % 2}" for r in ranks]


def test_detect_slow_links_names_the_slow_pair() -> None:
    bw, names = _links(4)
    bw[(2, 5)] = 2e9  # one bad cable
    report = detect_slow_links(bw, names, lambda r: r // 2)
    assert len(report) == 1 and report[0].startswith("slow link host1:0 <-> host2:1: 2 GB/s")
    # fast intra-node pairs are compared among themselves, not with the inter-node median
    bw[(0, 1)] = 40e9
    report = detect_slow_links(bw, names, lambda r: r // 2)
    assert any("host0:0 <-> host0:1" in r for r in report)
    assert detect_slow_links({(0, 1): 5e9, (0, 2): 5.1e9, (1, 2): 4.9e9}, ["a", "b", "c"]) == []


def test_detect_slow_links_names_the_slow_node() -> None:
    bw, names = _links(6)
    for a, b in bw:
        if 5 in (a // 2, b // 2) and a // 2 != b // 2:
            bw[(a, b)] = 1e9
    report = detect_slow_links(bw, names, lambda r: r // 2)
    assert report[-1].startswith("slow node 5 (host5): inter-node 1 GB/s")
    assert len(report) == 20 + 1  # every inter-node link of node 5, then the node
