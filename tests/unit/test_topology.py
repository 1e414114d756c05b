"""Topology-aware stages: slow links between nodes priced, the stages laid so that their
data-parallel groups stay off them, the layout recorded in the plan and explained."""

from __future__ import annotations

import dataclasses
import json

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cluster import Collective, topology
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.cost_models.communication import CommModel
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.strategy import Precision
from galvatron_fx.profiler.hardware_profile import slow_node_links
from galvatron_fx.search.price_plan import price_plan


def _slow(nodes: int, *links, preset="dgx-a100-80g"):
    return dataclasses.replace(gfx.Cluster.preset(preset, nodes=nodes), slow_links=tuple(links))


@pytest.fixture(scope="module")
def xl():
    model, inputs = zoo.build("gpt2-xl", batch_size=1, seq_len=1024, device="meta")
    return gfx.capture(model, inputs, name="gpt2-xl")


def _node_major(plan):
    k = len(plan.stage_ranks[0])
    return dataclasses.replace(plan, stage_ranks=tuple(tuple(range(s * k, (s + 1) * k)) for s in range(plan.pp)))


def _stage_nodes(plan, dpn=8):
    return [sorted({r // dpn for r in ranks}) for ranks in plan.stage_ranks]


@pytest.mark.parametrize("links, match", [
    ([(0, 4, 0.5)], "nodes must be two different integers in \\[0, 3\\]"),
    ([(1, 1, 0.5)], "two different integers"),
    ([(0, 1, 0.0)], "factor must be in \\(0, 1\\]"),
    ([(0, 1, 1.5)], "factor must be in"),
    ([(0, 1, 0.5), (1, 0, 0.2)], "listed twice"),
    ([(0, 1)], "expected \\[node a, node b, factor\\]"),
])
def test_slow_links_are_checked(links, match):
    with pytest.raises(ConfigError, match=match):
        _slow(4, *links)


def test_slow_links_round_trip_and_leave_other_clusters_alone():
    c = _slow(4, (1, 0, 0.25))
    assert c.slow_links == ((0, 1, 0.25),)  # pairs sorted
    d = json.loads(c.to_json())
    assert d["slow_links"] == [[0, 1, 0.25]] and gfx.Cluster.from_json(c.to_json()) == c
    assert "slow_links" not in json.loads(gfx.Cluster.preset("dgx-a100-80g", nodes=4).to_json())


def test_a_group_across_a_slow_link_pays_its_bandwidth():
    fast, slow = CommModel(gfx.Cluster.preset("dgx-a100-80g", nodes=4)), CommModel(_slow(4, (0, 1, 0.1)))
    nbytes = 1 << 30
    across, around = [0, 8], [0, 16]  # nodes 0,1 (the slow link) and nodes 0,2
    t_fast, t_slow = fast.time_s(Collective.ALL_REDUCE, nbytes, across), slow.time_s(Collective.ALL_REDUCE, nbytes, across)
    assert 9.0 < t_slow / t_fast <= 10.0  # the bandwidth term is 10× (the latency is not)
    assert slow.time_s(Collective.ALL_REDUCE, nbytes, around) == fast.time_s(Collective.ALL_REDUCE, nbytes, around)
    assert slow.time_s(Collective.P2P, nbytes, across) > 9 * fast.time_s(Collective.P2P, nbytes, across)
    assert slow.time_s(Collective.ALL_REDUCE, nbytes, list(range(8))) == fast.time_s(Collective.ALL_REDUCE, nbytes,
                                                                                     list(range(8)))


@pytest.mark.parametrize("nodes, pp, links", [
    (4, 2, [(0, 1, 0.1)]), (4, 2, [(0, 1, 0.1), (2, 3, 0.1)]), (4, 4, [(0, 1, 0.1)]),
    (8, 2, [(0, 1, 0.1), (2, 3, 0.2), (4, 7, 0.3)]), (8, 4, [(0, 1, 0.1), (0, 2, 0.1), (1, 2, 0.1)]),
])
def test_stages_keep_slow_links_between_them(nodes, pp, links):
    groups = topology.stage_nodes(_slow(nodes, *links), pp)
    assert sorted(n for g in groups for n in g) == list(range(nodes)) and len({len(g) for g in groups}) == 1
    assert not any(a in g and b in g for g in groups for a, b, _ in links), groups
    assert topology.runnable(groups)  # the pipeline runtime can run it (stage s on its groups' rank s)


def test_stages_without_whole_nodes_stay_contiguous_and_many_links_are_placed_greedily():
    odd = dataclasses.replace(gfx.Cluster.preset("dgx-a100-80g", nodes=3), devices_per_node=4,
                              slow_links=((0, 1, 0.1),))
    for pp in (2, 4, 12):  # 3 nodes: stages of 6 and 3 ranks straddle nodes, 12 lie inside them
        k = 12 // pp
        assert topology.stage_ranks(odd, pp) == tuple(tuple(range(s * k, (s + 1) * k)) for s in range(pp))
    links = [(a, a + 1, 0.1) for a in range(0, 16, 2)]  # 16 nodes, 8 slow pairs: greedy
    groups = topology.stage_nodes(_slow(16, *links), 8)
    assert topology.runnable(groups) and sorted(n for g in groups for n in g) == list(range(16))
    assert not any(a in g and b in g for g in groups for a, b, _ in links), groups


def test_only_layouts_the_pipeline_runs_count():
    assert topology.runnable(((0, 2), (1, 3))) and topology.runnable(((0, 1), (2, 3)))
    assert not topology.runnable(((1,), (0,)))  # stage 0 above stage 1
    assert not topology.runnable(((0, 3), (1, 2)))  # 3 above 2 at the second place
    assert not topology.runnable(((2, 0), (3, 1)))  # a stage's ranks descending


def test_without_slow_links_stages_are_node_major():
    c = gfx.Cluster.preset("dgx-a100-80g", nodes=4)
    assert topology.stage_ranks(c, 2) == (tuple(range(16)), tuple(range(16, 32)))
    assert topology.stage_ranks(c, 8) == tuple(tuple(range(4 * s, 4 * s + 4)) for s in range(8))
    # a slow link between all pairs leaves no better choice than the usual layout
    everywhere = _slow(2, (0, 1, 0.1))
    assert topology.stage_ranks(everywhere, 2) == (tuple(range(8)), tuple(range(8, 16)))


def test_the_plan_lays_its_stages_off_a_slow_link(xl):
    fast = gfx.Cluster.preset("dgx-a100-80g", nodes=4)
    slow = _slow(4, (0, 1, 0.05))
    p_fast = gfx.plan(xl, fast, global_batch_size=256, precision="bf16", baselines=False)
    p = gfx.plan(xl, slow, global_batch_size=256, precision="bf16", baselines=False)
    # without the slow link one stage spans the four nodes; with it, two stages on nodes the link
    # does not join, so no data-parallel group crosses it (the pipeline's sends do)
    assert p_fast.pp == 1 and p.pp == 2
    assert not any({0, 1} <= set(ns) for ns in _stage_nodes(p)), p.stage_ranks
    # the same plan laid out node-major is slower under the same cost model
    cm = AnalyticCostModel(slow, precision=Precision.bf16())
    again = price_plan(p, xl, cm)
    assert again.predicted.step_time_s == pytest.approx(p.predicted.step_time_s, rel=1e-9)
    assert price_plan(_node_major(p), xl, cm).predicted.step_time_s > 1.05 * p.predicted.step_time_s
    # ... and the slow link costs the plan something, but less than leaving it inside a stage
    assert p.predicted.step_time_s > p_fast.predicted.step_time_s
    text = p.explain()
    assert "slow links: nodes 0↔1 at 5% of the inter-node bandwidth; stages laid on nodes 0,2 | 1,3" in text
    assert "every stage's data-parallel groups stay off them" in text
    assert gfx.ParallelPlan.from_json(p.to_json()) == p


def test_two_nodes_with_a_slow_link_pipeline_across_it(xl):
    fast = gfx.Cluster.preset("dgx-a100-80g", nodes=2)
    slow = _slow(2, (0, 1, 0.02))
    p_fast = gfx.plan(xl, fast, global_batch_size=128, precision="bf16", baselines=False)
    p = gfx.plan(xl, slow, global_batch_size=128, precision="bf16", baselines=False)
    # one node per stage: only the pipeline's sends cross the slow link
    assert p_fast.pp == 1 and p.pp % 2 == 0 and all(len(set(ns)) == 1 for ns in _stage_nodes(p))


def test_the_profiler_reports_slow_node_pairs():
    node_of = lambda r: r // 2  # noqa: E731  (4 nodes of 2 ranks)
    bw = {(a, b): 10e9 for a in range(8) for b in range(a + 1, 8) if a // 2 != b // 2}
    for a in (0, 1):
        for b in (2, 3):
            bw[(a, b)] = 1e9  # nodes 0 and 1
    assert slow_node_links(bw, node_of) == ((0, 1, 0.1),)
    assert slow_node_links({k: 10e9 for k in bw}, node_of) == ()
    c = _slow(4, *slow_node_links(bw, node_of))
    assert topology.link_factor(c, {0, 1, 2}) == 0.1 and topology.link_factor(c, {0, 2}) == 1.0
