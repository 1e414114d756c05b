"""Bad input is refused where it is read, with a ConfigError (or, for a search that cannot
succeed, a PlanError) naming the field, its sane range or the real constraint, and what to change:
placement strings in plans, absurd numbers and hostile JSON in plan and cluster files, the
planner's arguments, and batches that no parallel layout can split."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cluster import Cluster, CollectiveFit
from galvatron_fx.cluster.spec import default_local_cpu
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.placements import parse_placement
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.passes.decompose_layer import decompose_layer
from galvatron_fx.search.candidates import SearchSpace
from galvatron_fx.search.price_plan import price_plan

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def tiny():
    model, inputs = zoo.build("gpt-tiny", batch_size=2, seq_len=32)
    return gfx.capture(model, inputs, name="gpt-tiny")


@pytest.fixture(scope="module")
def cpu2() -> Cluster:
    return default_local_cpu(2)


@pytest.fixture(scope="module")
def tp2(tiny, cpu2) -> ParallelPlan:
    return gfx.plan(tiny, cpu2, global_batch_size=4, baselines=False, search={"tp": (2,), "pp": (1,)})


def _edit(plan: ParallelPlan, path: tuple, value) -> str:
    d = json.loads(plan.to_json())
    at = d
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return json.dumps(d)


def _param_node(plan: ParallelPlan, layer: int = 1) -> str:
    """A placeholder of ``layer`` that the plan shards (a weight): ``->S(d)``."""
    return next(n for n, s in plan.layers[layer].placements.items() if s.startswith("->S("))


# ---- case 6: placement strings ------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["S(x)->R", "->S(x)", "S(0)R", "R,Q->R", "->S(64)", "S(0)->", "R->R->R", "->",
                                 "->S(-1)", "->S(01)"])
def test_malformed_placement_is_refused_at_load(tp2, tmp_path, bad):
    node = _param_node(tp2)
    path = tmp_path / "plan.json"
    path.write_text(_edit(tp2, ("layers", 1, "placements", node), bad))
    with pytest.raises(ConfigError) as e:
        ParallelPlan.load(path)
    msg = str(e.value)
    assert f"layers[1].placements['{node}']" in msg and "layer blocks.0" in msg and f"node {node}" in msg, msg
    assert repr(bad) in msg and "e.g. 'S(1),R->S(2)'" in msg and "plan.json" in msg, msg


def test_malformed_placement_is_refused_when_built_by_hand(tp2):
    lp = tp2.layers[2]
    bad = dataclasses.replace(lp, placements=lp.placements | {_param_node(tp2, 2): "S(x)"})
    with pytest.raises(ConfigError, match=r"layers\[2\]\.placements\['arg\d+_1'\] = 'S\(x\)' \(layer blocks\.1"):
        dataclasses.replace(tp2, layers=(*tp2.layers[:2], bad, *tp2.layers[3:]))


def test_parse_placement_refuses_with_a_config_error():
    assert str(parse_placement("S(2)")) == "S(2)"
    with pytest.raises(ConfigError, match=r"not a placement: 'S\(x\)'"):
        parse_placement("S(x)")


def test_shard_dim_beyond_the_tensor_rank_is_refused_against_the_graph(tiny, cpu2, tp2):
    node = _param_node(tp2)
    from galvatron_fx.passes.decompose_layer import check_placements

    plan = ParallelPlan.from_json(_edit(tp2, ("layers", 1, "placements", node), "->S(9)"))  # syntax is fine
    with pytest.raises(ConfigError) as e:
        check_placements(plan, tiny)
    msg = str(e.value)
    assert "plan layer 'blocks.0'" in msg and f"node '{node}'" in msg and "'->S(9)'" in msg, msg
    assert "dim 9" in msg and "has 2 dims" in msg and "e.g. 'S(1),R->S(2)'" in msg, msg
    # price_plan (the plan meets the graph) checks them first too: before, a PlanError "not a strategy"
    with pytest.raises(ConfigError, match=r"dim 9"):
        price_plan(plan, tiny, AnalyticCostModel(cpu2))


def test_placement_for_the_wrong_number_of_inputs_is_refused(tiny, tp2):
    from galvatron_fx.ir.placements import check_layer_placements

    layer = tiny.layers[1]
    dl = decompose_layer(tiny, layer)
    placements = dict(tp2.layers[1].placements)
    node, s = next((n, s) for n, s in placements.items() if s.count(",") >= 1 and s.index(",") < s.index("->"))
    placements[node] = "R->" + s.split("->")[1]
    with pytest.raises(ConfigError, match=rf"node '{node}' has placement 'R->.*' for 1 input, but it takes \d tensors"):
        check_layer_placements(layer.name, placements, dl.gm)


def test_searched_plans_pass_the_graph_check(tiny, cpu2, tp2):
    from galvatron_fx.passes.decompose_layer import check_placements

    check_placements(tp2, tiny)
    sp = gfx.plan(tiny, cpu2, global_batch_size=4, baselines=False,
                  search={"tp": (2,), "pp": (1,), "sp": ("megatron",)})
    check_placements(sp, tiny)


# ---- case 8: hostile JSON and absurd numbers ----------------------------------------------------

def test_deeply_nested_plan_json_is_a_config_error(tp2, tmp_path):
    with pytest.raises(ConfigError, match="nests deeper than 64 levels"):
        ParallelPlan.from_json(DEEP)
    path = tmp_path / "deep.json"
    path.write_text(_edit(tp2, ("solver_stats", "x"), json.loads("[" * 200 + "]" * 200)))
    with pytest.raises(ConfigError, match=r"plan file .*deep\.json.* nests deeper than 64"):
        ParallelPlan.load(path)


def test_deeply_nested_cluster_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cluster JSON nests deeper than 64 levels"):
        Cluster.from_json(DEEP)
    with pytest.raises(ConfigError, match="cluster JSON nests deeper"):
        Cluster.from_json('{"name": ' + DEEP + "}")
    path = tmp_path / "c.json"
    path.write_text(DEEP)
    with pytest.raises(ConfigError, match=r"cluster file .*c\.json.* nests deeper"):
        Cluster.from_json(path)
    from galvatron_fx.profiler.hardware_profile import load_profile

    with pytest.raises(ConfigError, match=r"hardware profile .*c\.json.* nests deeper"):
        load_profile(path)


def test_cluster_json_that_is_not_an_object_is_not_a_missing_file():
    for text in ("[]", "[1, 2]", "3", "null"):
        with pytest.raises(ConfigError, match=r"cluster: expected a JSON object, got") as e:
            Cluster.from_json(text)
        assert "does not exist" not in str(e.value)


def test_huge_integer_literal_is_a_config_error():
    with pytest.raises(ConfigError, match="cluster JSON holds a value Python cannot read"):
        Cluster.from_json('{"num_nodes": ' + "9" * 5000 + "}")


def _cluster_dict() -> dict:
    c = Cluster.preset("dgx-a100-80g").with_fits("intra_node", {"all_reduce": {
        2: CollectiveFit(alpha_s=1e-5, beta_s_per_byte=1e-10, points=((4096, 2e-5), (65536, 5e-5)))}})
    return json.loads(c.to_json())


_SPEC = ("device_specs", "A100-SXM-80GB")
_FIT = ("intra_node", "fits", "all_reduce", "2")
# (where, absurd value, the field the message must name, the range it must state)
CLUSTER_BAD = [
    (("num_nodes",), 2**21, "cluster.num_nodes", "[1, 2**20]"),
    (("devices_per_node",), 2**21, "cluster.devices_per_node", "[1, 2**20]"),
    ((*_SPEC, "memory_bytes"), 10**40, "memory_bytes", "[2**20, 2**60] bytes"),
    ((*_SPEC, "memory_bytes"), 1e40, "memory_bytes", "[2**20, 2**60] bytes"),
    ((*_SPEC, "memory_bytes"), 1000, "memory_bytes", "[2**20, 2**60] bytes"),
    ((*_SPEC, "peak_flops", "bfloat16"), 1e-300, "peak_flops.bfloat16", "[1e+06, 1e+21] FLOP/s"),
    ((*_SPEC, "peak_flops", "float32"), 1e30, "peak_flops.float32", "[1e+06, 1e+21] FLOP/s"),
    ((*_SPEC, "peak_flops", "float32"), 10**400, "peak_flops", "[1e+06, 1e+21] FLOP/s"),
    ((*_SPEC, "memory_bandwidth_bytes_s"), 1e30, "memory_bandwidth_bytes_s", "[1e+06, 1e+16] bytes/s"),
    (("intra_node", "latency_s"), 1e9, "intra_node.latency_s", "[0, 10] s"),
    (("inter_node", "bandwidth_bytes_s"), 1e-5, "inter_node.bandwidth_bytes_s", "[1e+06, 1e+16] bytes/s"),
    ((*_FIT, "alpha_s"), 1e6, "alpha_s", "[0, 10] s"),
    ((*_FIT, "beta_s_per_byte"), 1.0, "beta_s_per_byte", "[0, 0.001] s/byte"),
    ((*_FIT, "points"), [[4096, 2e-5], [2**70, 5e-5]], "points[1][0]", "[1, 2**60] bytes"),
    (("overlap_slowdown",), 1e9, "cluster.overlap_slowdown", "[1, 100]"),
]


@pytest.mark.timing
@pytest.mark.parametrize("where,value,field,rng", CLUSTER_BAD, ids=[f"{b[2]}={b[1]!r}"[:40] for b in CLUSTER_BAD])
def test_absurd_cluster_numbers_name_the_field_and_its_range(where, value, field, rng):
    d = _cluster_dict()
    at = d
    for k in where[:-1]:
        at = at[k]
    at[where[-1]] = value
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        Cluster.from_json(json.dumps(d))
    msg = str(e.value)
    assert field in msg and rng in msg, msg
    assert time.perf_counter() - t0 < 5


def test_absurd_cluster_numbers_are_refused_however_the_cluster_is_built():
    c = Cluster.preset("dgx-a100-80g")
    spec = next(iter(c.device_specs.values()))
    with pytest.raises(ConfigError, match=r"peak_flops\['float32'\] = 1e-300 is outside its sane range"):
        dataclasses.replace(c, device_specs={spec.kind: dataclasses.replace(spec, peak_flops={"float32": 1e-300})})
    with pytest.raises(ConfigError, match=r"world size\) = 1048578 is outside its sane range \[1, 2\*\*20\]"):
        dataclasses.replace(Cluster.preset("dgx-a100-80g", nodes=2), devices_per_node=2**19 + 1)
    with pytest.raises(ConfigError, match=r"nodes = 2097152 is outside its sane range"):
        Cluster.preset("dgx-a100-80g", nodes=2**21)


# (where, absurd value, the field the message must name, the range it must state)
PLAN_BAD = [
    (("world_size",), 2**21, "world_size", "[1, 2**20]"),
    (("world_size",), 1e10, "world_size", "[1, 2**20]"),
    (("pp",), 2**21, "pp", "[1, 2**20]"),
    (("num_microbatches",), 2**21, "num_microbatches", "[1, 2**20] micro-batches"),
    (("global_batch_size",), 2**31, "global_batch_size", "[1, 2**30] samples"),
    (("micro_batch_size",), 2**31, "micro_batch_size", "[1, 2**30] samples"),
    (("layers", 0, "dp"), 2**21, "layers[0].dp", "[1, 2**20]"),
    (("layers", 0, "strategy", "tp"), 2**21, "layers[0].strategy.tp", "[1, 2**20]"),
    (("layers", 0, "predicted", "fwd_s"), 1e300, "layers[0].predicted.fwd_s", "[0, 1e+12] s"),
    (("layers", 0, "predicted", "memory_bytes"), 2**61, "layers[0].predicted.memory_bytes", "[0, 2**60] bytes"),
    (("predicted", "step_time_s"), 9e307, "predicted.step_time_s", "[0, 1e+12] s"),
    (("predicted", "peak_memory_bytes"), [2**61], "predicted.peak_memory_bytes[0]", "[0, 2**60] bytes"),
    (("predicted", "memory_budget_bytes"), 10**40, "predicted.memory_budget_bytes", "[0, 2**60] bytes"),
    (("stage_ranks",), [[0, 2**40]], "stage_ranks[0][1]", "[0, 2**20]"),
]


@pytest.mark.timing
@pytest.mark.parametrize("where,value,field,rng", PLAN_BAD, ids=[f"{b[2]}={b[1]!r}"[:40] for b in PLAN_BAD])
def test_absurd_plan_numbers_name_the_field_and_its_range(tp2, where, value, field, rng):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        ParallelPlan.from_json(_edit(tp2, where, value))
    msg = str(e.value)
    assert f"{field} " in msg and rng in msg, msg
    assert time.perf_counter() - t0 < 5


@pytest.mark.timing
def test_a_plan_built_for_a_huge_world_is_refused_before_any_work(tp2):
    # (at 10**10, the set of all ranks the invariants built exhausted memory; 2**21 shows the
    # check without that risk)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"world_size = 2097152 is outside its sane range \[1, 2\*\*20\]"):
        dataclasses.replace(tp2, world_size=2**21)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("budget", [math.nan, math.inf, -1.0, 0, 0.5, 1e40, 2**61, "16GiB", True])
def test_bad_memory_budget_is_refused_before_any_work(cpu2, budget):
    # nothing is captured: the model is not a model at all
    with pytest.raises(ConfigError, match=r"memory_budget .*\[1, 2\*\*60\] bytes.*16 \* 2\*\*30"):
        gfx.plan(object(), cpu2, [], global_batch_size=4, memory_budget=budget)


@pytest.mark.parametrize("gb", [0, 4.0, 2**31, True, [], [4, 0], list(range(1, 1000))])
def test_bad_global_batch_is_refused_before_any_work(cpu2, gb):
    with pytest.raises(ConfigError, match=r"global_batch_size"):
        gfx.plan(object(), cpu2, [], global_batch_size=gb)


@pytest.mark.parametrize("search,match", [
    ({"max_microbatches": 2**30}, r"search.max_microbatches = 1073741824 is outside its sane range \[1, 2\*\*20\] micro-batches"),
    ({"tp": (2**21,)}, r"search.tp\[0\] = 2097152 is outside its sane range"),
    ({"num_microbatches": (0,)}, r"search.num_microbatches\[0\] = 0 is outside its sane range"),
    ({"max_tp": 2.5}, r"search.max_tp must be an integer"),
])
def test_absurd_search_space_is_refused(search, match):
    with pytest.raises(ConfigError, match=match):
        SearchSpace.coerce(search)
    with pytest.raises(ConfigError, match="search.pp must be a tuple of integers"):
        SearchSpace(pp=3)


# ---- case 9: the batch, not memory ---------------------------------------------------------------

def test_batch_no_data_parallel_degree_divides_says_so(tiny, cpu2):
    with pytest.raises(PlanError) as e:
        gfx.plan(tiny, cpu2, global_batch_size=3, baselines=False, search={"max_tp": 1, "pp": (1,)})
    msg = str(e.value)
    assert "no plan fits" not in msg and "GiB" not in msg, msg
    assert "global batch of 3 does not split evenly" in msg and "data-parallel degree 2, which does not divide 3" in msg
    assert "multiple of 2 (e.g. 4)" in msg, msg


def test_batch_too_small_for_the_devices_says_so(tiny, cpu2):
    huge = dataclasses.replace(cpu2, devices_per_node=10**6)
    with pytest.raises(PlanError) as e:
        gfx.plan(tiny, huge, global_batch_size=4, baselines=False)
    msg = str(e.value)
    assert "no plan fits" not in msg and "GiB" not in msg, msg
    assert "global batch of 4 is too small for 1000000 devices" in msg and "more ways than it can be split" in msg
    assert "fewer devices" in msg, msg


def test_batch_smaller_than_the_pipeline_depth_says_so(tiny):
    cpu8 = default_local_cpu(8)
    with pytest.raises(PlanError) as e:
        gfx.plan(tiny, cpu8, global_batch_size=2, baselines=False, search={"pp": (4,)})
    msg = str(e.value)
    assert "no plan fits" not in msg, msg
    assert "global batch 2 is smaller than pp = 4" in msg and "'gpipe'" in msg and "lower the pipeline degree" in msg
    with pytest.raises(PlanError, match=r"search.num_microbatches=\(8,\): 8 does not divide 4"):
        gfx.plan(tiny, cpu8, global_batch_size=4, baselines=False, search={"pp": (2,), "num_microbatches": (8,)})


def test_no_pipeline_degree_to_search_says_so(tiny, cpu2):
    with pytest.raises(PlanError, match=r"no pipeline degree to search: search.pp=\(3,\).*world size 2.*choose from 1, 2"):
        gfx.plan(tiny, cpu2, global_batch_size=4, baselines=False, search={"pp": (3,)})


def test_memory_is_still_named_when_memory_is_the_cause(tiny, cpu2):
    with pytest.raises(PlanError, match=r"no plan fits in 1\.00 MiB per device: the smallest needs"):
        gfx.plan(tiny, cpu2, global_batch_size=4, baselines=False, memory_budget=2**20)
