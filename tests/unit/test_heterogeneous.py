"""Heterogeneous clusters in the planner: stages on nodes of one device kind, each priced at its
own speed and held to its own memory, the pipeline split unevenly the way an expert would, and
the plan naming each stage's device."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cluster import heterogeneous, topology
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.ir.strategy import Precision
from galvatron_fx.search.price_plan import price_plan
from galvatron_fx.search.stage_split import min_max_split

GiB = 2**30


def _capture(name: str, seq_len: int = 1024):
    model, inputs = zoo.build(name, batch_size=1, seq_len=seq_len, device="meta")
    return gfx.capture(model, inputs, name=name)


@pytest.fixture(scope="module")
def gpt2():
    return _capture("gpt2-small")


@pytest.fixture(scope="module")
def a100():
    return gfx.Cluster.preset("dgx-a100-80g")


@pytest.fixture(scope="module")
def mixed(gpt2, a100):
    """The plan on one A100 node and one H100 node (two pipeline stages), and the plan made
    under the homogeneous assumption (every node an A100, as the search priced stages before)."""
    het = heterogeneous("a100+h100", [a100, gfx.Cluster.preset("dgx-h100")])
    kw = dict(global_batch_size=64, precision="bf16", baselines=False, search={"pp": (2,)})
    return het, gfx.plan(gpt2, het, **kw), gfx.plan(gpt2, heterogeneous("a100x2", [a100, a100]), **kw)


def _layers_per_stage(plan) -> list[int]:
    return [sum(lp.stage == s for lp in plan.layers) for s in range(plan.pp)]


def _smaller(cluster, gib: int, kind: str):
    """``cluster`` with its device's memory set to ``gib`` GiB, named ``kind``."""
    spec = dataclasses.replace(cluster.device(0), kind=kind, memory_bytes=gib * GiB)
    return dataclasses.replace(cluster, name=kind, device_specs={kind: spec}, node_kinds=(kind,) * cluster.num_nodes)


def test_h100_stage_takes_more_layers_and_beats_the_homogeneous_plan(gpt2, mixed):
    het, plan, homogeneous = mixed
    assert plan.stage_devices == ("A100-SXM-80GB", "H100-SXM-80GB")
    a_layers, h_layers = _layers_per_stage(plan)
    assert h_layers > a_layers, (a_layers, h_layers)
    # the homogeneous assumption splits by layer count alone: the A100 stage keeps as many or more
    assert _layers_per_stage(homogeneous)[0] >= _layers_per_stage(homogeneous)[1]
    # priced under the true (heterogeneous) cost model, the homogeneous plan is slower
    true_cm = AnalyticCostModel(het, precision=Precision.named("bf16"))
    priced = price_plan(homogeneous, gpt2, true_cm)
    ratio = priced.predicted.step_time_s / plan.predicted.step_time_s
    assert ratio > 1.1, ratio
    # and the plan's own prediction is what the same cost model says of it
    again = price_plan(plan, gpt2, true_cm)
    assert again.predicted.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-6)


def test_80gb_stage_holds_more_layers_and_no_stage_exceeds_its_memory(a100):
    gpt2xl = _capture("gpt2-xl")
    small = _smaller(a100, 40, "A100-SXM-40GB")
    het = heterogeneous("40g+80g", [small, a100])
    # replicated weights (DDP), no recomputation and four micro-batches: memory decides the split
    space = {"pp": (2,), "max_tp": 1, "dp_types": ("ddp",), "recompute": ("none",), "schedules": ("1f1b",),
             "num_microbatches": (4,)}
    kw = dict(global_batch_size=512, precision="bf16", baselines=False, search=space)
    plan = gfx.plan(gpt2xl, het, **kw)
    small_layers, big_layers = _layers_per_stage(plan)
    assert big_layers > 2 * small_layers, (small_layers, big_layers)
    assert plan.predicted.stage_budget_bytes == (40 * GiB, 80 * GiB)
    for s, ranks in enumerate(plan.stage_ranks):
        assert plan.predicted.device_peak_bytes[s] <= het.memory_bytes(ranks[0])
    assert plan.predicted.device_peak_bytes[1] > 40 * GiB  # the 80 GB stage uses what the 40 GB one lacks
    # the homogeneous assumption (every device held to the smallest memory) finds no plan at all
    with pytest.raises(gfx.PlanError, match="no plan fits"):
        gfx.plan(gpt2xl, heterogeneous("40g x2", [small, small]), **kw)
    # a user budget caps every device: at 40 GiB the 80 GB stage is held to 40 GiB too
    with pytest.raises(gfx.PlanError, match="each stage is held to its own devices' memory under the 40.00 GiB"):
        gfx.plan(gpt2xl, het, memory_budget=40 * GiB, **kw)


def test_plan_json_round_trips_and_explain_names_each_stage_device(mixed, tmp_path):
    _, plan, homogeneous = mixed
    path = plan.save(tmp_path / "plan.json")
    d = json.loads(path.read_text())
    assert d["stage_devices"] == ["A100-SXM-80GB", "H100-SXM-80GB"]
    assert d["predicted"]["stage_budget_bytes"] == [80 * GiB, 80 * GiB]
    assert gfx.ParallelPlan.load(path) == plan
    text = plan.explain()
    assert "(8 devices on A100-SXM-80GB)" in text and "(8 devices on H100-SXM-80GB)" in text
    first = next(lp for lp in plan.layers if lp.stage == 1)
    assert "(H100-SXM-80GB)" in plan.explain(layer=first.name).splitlines()[0]
    # a cluster of one kind records neither (plans written before read alike)
    hd = homogeneous.to_dict()
    assert "stage_devices" not in hd and "stage_budget_bytes" not in hd["predicted"]
    assert gfx.ParallelPlan.from_dict(hd).stage_devices == ()
    with pytest.raises(gfx.ConfigError, match="stage_devices"):
        gfx.ParallelPlan.from_dict({**d, "stage_devices": ["A100-SXM-80GB"]})


def test_a_slowed_cpu_node_gets_fewer_layers(tmp_path):
    """Two CPU "nodes", the first running at half the speed (the rates a profile of a node with
    half its threads gives): the plan moves blocks onto the other node."""
    mg = _capture("gpt-tiny", seq_len=256)
    cpu = gfx.Cluster.local_cpu(nodes=2, devices_per_node=2, cache_dir=tmp_path)
    spec = cpu.device(0)
    slow = dataclasses.replace(spec, kind=f"{spec.kind} (half threads)",
                               peak_flops={k: v / 2 for k, v in spec.peak_flops.items()},
                               memory_bandwidth_bytes_s=spec.memory_bandwidth_bytes_s / 2)
    slowed = dataclasses.replace(cpu, device_specs={spec.kind: spec, slow.kind: slow},
                                 node_kinds=(slow.kind, spec.kind))
    kw = dict(global_batch_size=8, baselines=False, search={"pp": (2,), "schedules": ("1f1b",)})
    even = gfx.plan(mg, cpu, **kw)
    plan = gfx.plan(mg, slowed, **kw)
    assert plan.stage_devices == (slow.kind, spec.kind)
    assert _layers_per_stage(plan)[0] < _layers_per_stage(even)[0]
    assert _layers_per_stage(plan)[0] < _layers_per_stage(plan)[1]
    # and it is faster on that cluster than the split made for equal nodes
    priced = price_plan(even, mg, AnalyticCostModel(slowed))
    assert plan.predicted.step_time_s < priced.predicted.step_time_s


def test_stages_keep_to_one_device_kind_where_the_pipeline_can_run():
    a, h = gfx.Cluster.preset("dgx-a100-80g"), gfx.Cluster.preset("dgx-h100")
    alternating = heterogeneous("a-h-a-h", [a, h, a, h])
    assert topology.stage_nodes(alternating, 2) == ((0, 2), (1, 3))
    assert topology.stage_nodes(alternating, 4) == ((0,), (1,), (2,), (3,))
    # A H H A: grouping by kind cannot run as a pipeline (stage 1's nodes must follow stage 0's)
    assert topology.stage_nodes(heterogeneous("a-h-h-a", [a, h, h, a]), 2) == ((0, 1), (2, 3))
    # a cluster of one kind keeps the node-major blocks
    assert topology.stage_nodes(gfx.Cluster.preset("dgx-a100-80g", nodes=4), 2) == ((0, 1), (2, 3))


def test_stages_keep_to_one_kind_first_and_off_slow_links_among_those():
    a, h = gfx.Cluster.preset("dgx-a100-80g"), gfx.Cluster.preset("dgx-h100")

    def slow(cluster, *pairs):
        return dataclasses.replace(cluster, slow_links=tuple((x, y, 0.1) for x, y in pairs))

    # A A H H with a slow link inside the A pair: splitting it would put both kinds in each stage
    assert topology.stage_nodes(slow(heterogeneous("aahh", [a, a, h, h]), (0, 1)), 2) == ((0, 1), (2, 3))
    # four stages of two: every layout of one kind per stage is tried, and the slow links
    # (0-1 among the A100s, 4-5 among the H100s) are left between stages
    four = slow(heterogeneous("a4h4", [a] * 4 + [h] * 4), (0, 1), (4, 5))
    assert topology.stage_nodes(four, 4) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert topology.stage_nodes(dataclasses.replace(four, slow_links=()), 4) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_min_max_split_is_exact_with_per_stage_speeds_and_memory():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 4))
        n = int(rng.integers(k, 8))
        w, need, room = rng.random((k, n)), rng.random((k, n)), rng.random(k) * 3
        best = None
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = [0, *cuts, n]
            if any(need[s, edges[s]:edges[s + 1]].sum() > room[s] for s in range(k)):
                continue
            cost = max(w[s, edges[s]:edges[s + 1]].sum() for s in range(k))
            best = cost if best is None else min(best, cost)
        got = min_max_split(w, need, room)
        if best is None:
            assert got is None
            continue
        edges = got + [n]
        assert max(w[s, edges[s]:edges[s + 1]].sum() for s in range(k)) == pytest.approx(best)
        assert all(need[s, edges[s]:edges[s + 1]].sum() <= room[s] for s in range(k))


def test_min_max_split_gives_every_stage_a_layer_that_trains():
    """With ``trains``, the exact split among those whose every stage holds a trained layer."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        k = int(rng.integers(1, 4))
        n = int(rng.integers(k, 8))
        w, trains = rng.random((k, n)), rng.random(n) < 0.5
        best = None
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = [0, *cuts, n]
            if not all(trains[edges[s]:edges[s + 1]].any() for s in range(k)):
                continue
            cost = max(w[s, edges[s]:edges[s + 1]].sum() for s in range(k))
            best = cost if best is None else min(best, cost)
        got = min_max_split(w, trains=trains)
        if best is None:
            assert got is None
            continue
        edges = got + [n]
        assert max(w[s, edges[s]:edges[s + 1]].sum() for s in range(k)) == pytest.approx(best)
        assert all(trains[edges[s]:edges[s + 1]].any() for s in range(k))


def test_a_very_slow_node_still_gets_parameters_to_train():
    """A node so slow that the fastest split would leave it only the loss (no parameters, so its
    ranks' optimizers would have nothing to step) gets the cheapest stage that trains instead."""
    from galvatron_fx.cluster.spec import local_cpu

    base = local_cpu(4, nodes=2, devices_per_node=2)
    k = next(iter(base.device_specs))
    fast = dataclasses.replace(base.device_specs[k], peak_flops={"float32": 110e9}, memory_bandwidth_bytes_s=10e9)
    slow = dataclasses.replace(fast, kind=f"{k} @node1", peak_flops={"float32": 1e9}, memory_bandwidth_bytes_s=1e7,
                               kernel_overhead_s=0.1)
    cl = dataclasses.replace(base, device_specs={k: fast, slow.kind: slow}, node_kinds=(k, slow.kind))
    model, inputs = zoo.build("gpt-tiny", batch_size=8, seq_len=32, device="cpu")
    mg = gfx.capture(model, inputs)
    plan = gfx.plan(mg, cl, global_batch_size=8, search={"pp": (2,), "tp": (1,), "dp_types": ("ddp",)})
    slow_stage = next(s for s, kind in enumerate(plan.stage_devices) if kind == slow.kind)
    held = [lp.name for lp in plan.layers if lp.stage == slow_stage]
    trained = {p for name in held for p in next(l for l in mg.layers if l.name == name).param_names}
    assert any(mg.params[p].requires_grad for p in trained if p in mg.params), held
