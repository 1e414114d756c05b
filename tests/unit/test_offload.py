"""CPU offload as a per-layer choice: the host tier of a cluster, the memory and time model of an
offloaded layer, and the search choosing offload only when memory forces it, within the host
budget (the runtime's numerics: tests/dist/test_offload_runtime.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cluster import Cluster
from galvatron_fx.cost_models.memory import layer_memory
from galvatron_fx.cost_models.offload import HOST_COPY_LATENCY_S, can_offload, offload_cost
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.graph import LayerCosts
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.strategy import DPType, LayerStrategy, Precision
from galvatron_fx.search.baselines import baseline_spaces
from galvatron_fx.search.candidates import SearchSpace

GiB, MiB = 2**30, 2**20
# gpt2-small at sequence 128, batch 8, on 8 RTX 4090s: its smallest plan without offload needs
# about 0.23 GiB of tensors, which a 2.2 GiB device budget leaves (2.2 GiB less the runtime's
# context and communicator buffers) and a 2.0 GiB one does not (0.2 GiB of tensors)
ROOMY, TIGHT, TOO_TIGHT = int(2.2 * GiB), int(2.0 * GiB), int(1.87 * GiB)


@pytest.fixture(scope="module")
def gpt2():
    model, inputs = zoo.build("gpt2-small", batch_size=1, seq_len=128, device="meta")
    return gfx.capture(model, inputs, name="gpt2-small")


@pytest.fixture(scope="module")
def rtx():
    return Cluster.preset("rtx4090-pcie")


def _plan(mg, cluster, budget, **search):
    return gfx.plan(mg, cluster, global_batch_size=8, memory_budget=budget, search=search or None, baselines=False)


# ---- the strategy and the cluster's host tier -----------------------------------------------------
def test_offload_is_absent_from_the_json_when_off_and_round_trips_when_on():
    assert "offload" not in LayerStrategy().to_dict()
    on = LayerStrategy(dp_type="zero3", offload=True)
    assert on.to_dict()["offload"] is True and LayerStrategy.from_dict(on.to_dict()) == on
    assert on.short() == "tp1·zero3·offload"
    with pytest.raises(ValueError, match="offload"):
        LayerStrategy(offload="yes")


def test_the_host_tier_round_trips_and_is_absent_from_clusters_without_one(rtx):
    spec = rtx.device_specs["RTX4090-24GB"]
    assert spec.host_memory_bytes == 64 * GiB and spec.host_link_bytes_s == 25e9 and can_offload(spec)
    back = Cluster.from_dict(json.loads(rtx.to_json()))
    assert back.device_specs == rtx.device_specs
    cpu = Cluster.local_cpu(2)
    assert not can_offload(cpu.device(0))  # a CPU process's memory is host memory already
    for spec_json in json.loads(cpu.to_json())["device_specs"].values():
        assert not {"host_memory_bytes", "host_link_bytes_s", "host_optimizer_params_s"} & set(spec_json)
    bad = json.loads(rtx.to_json())
    bad["device_specs"]["RTX4090-24GB"]["host_link_bytes_s"] = -1
    with pytest.raises(ConfigError, match="host_link_bytes_s"):
        Cluster.from_dict(bad)


# ---- memory and time ------------------------------------------------------------------------------
COSTS = LayerCosts(fwd_flops=10**9, bwd_flops=2 * 10**9, fwd_bytes=10**6, bwd_bytes=2 * 10**6, activation_bytes=4 * MiB,
                   output_bytes=MiB, num_params=1_000_000)


@pytest.mark.parametrize("dpt", ["ddp", "zero2", "zero3"])
def test_offload_moves_the_optimizer_and_under_zero_the_shards_to_the_host(dpt):
    kw = dict(dp=4, micro_batch=2, captured_batch=2, precision=Precision.bf16())
    on = layer_memory(COSTS, LayerStrategy(dp_type=dpt, offload=True), **kw)
    off = layer_memory(COSTS, LayerStrategy(dp_type=dpt), **kw)
    assert on.optimizer_bytes == 0
    assert on.activation_bytes == off.activation_bytes
    assert on.host_bytes == off.param_bytes + off.grad_bytes + off.optimizer_bytes
    if dpt == "ddp":  # the device keeps working parameters and gradients
        assert (on.param_bytes, on.grad_bytes, on.temp_bytes) == (off.param_bytes, off.grad_bytes, off.temp_bytes)
    else:  # the device keeps no shard, only the gathered copies and a shard while it is copied in
        assert on.param_bytes == on.grad_bytes == 0
        assert on.unsharded_param_bytes == off.unsharded_param_bytes
        assert on.temp_bytes == off.temp_bytes + off.param_bytes
    assert on.persistent_bytes < off.persistent_bytes
    assert "host_bytes" not in off.to_dict() and on.to_dict()["host_bytes"] == on.host_bytes


def test_offload_is_priced_by_the_host_link_and_the_host_optimizer(rtx):
    spec = rtx.device_specs["RTX4090-24GB"]
    n = 10_000_000
    ddp = offload_cost(spec, DPType.DDP, local_numel=n, sharded=False, m=4)
    # gradients down and parameters up (fp32), then the host's AdamW: none of it overlapped
    assert ddp.exposed_s == pytest.approx(8 * n / 25e9 + 2 * HOST_COPY_LATENCY_S + n / 1.25e8)
    assert ddp.overlappable_s == 0 and ddp.optimizer_s == pytest.approx(n / 1.25e8)
    z3 = offload_cost(spec, DPType.ZERO3, local_numel=n, sharded=True, m=4)
    z2 = offload_cost(spec, DPType.ZERO2, local_numel=n, sharded=True, m=4)
    assert z3.exposed_s == z2.exposed_s == pytest.approx(n / 1.25e8)
    # per micro-batch: a shard in per gather (ZeRO-3 gathers twice) and a gradient shard out
    assert z3.overlappable_s == pytest.approx(4 * (12 * n / 25e9 + 3 * HOST_COPY_LATENCY_S))
    assert z2.overlappable_s == pytest.approx(4 * (8 * n / 25e9 + 2 * HOST_COPY_LATENCY_S))
    fast = dataclasses.replace(spec, host_link_bytes_s=50e9, host_optimizer_params_s=2.5e8)
    assert offload_cost(fast, DPType.DDP, local_numel=n, sharded=False, m=4).exposed_s < ddp.exposed_s


# ---- the search -----------------------------------------------------------------------------------
def test_the_search_offloads_only_when_memory_forces_it(gpt2, rtx):
    roomy = _plan(gpt2, rtx, ROOMY)
    assert not any(lp.strategy.offload for lp in roomy.layers)
    assert roomy.predicted.host_memory_bytes == () and "host memory" not in roomy.explain()
    with pytest.raises(PlanError, match=r"allow CPU offload \(search offload=\(False, True\)\)"):
        _plan(gpt2, rtx, TIGHT, offload=(False,))
    tight = _plan(gpt2, rtx, TIGHT)
    offloaded = [lp for lp in tight.layers if lp.strategy.offload]
    assert offloaded, "nothing fits without offload, so some layer must offload"
    assert len(offloaded) < len([lp for lp in tight.layers if lp.predicted.memory_breakdown.get("optimizer", 0)
                                 or lp.strategy.offload]), "offload is per layer: not every layer with parameters"
    assert max(tight.predicted.peak_memory_bytes) <= tight.predicted.tensor_budget_bytes
    assert tight.predicted.step_time_s > roomy.predicted.step_time_s
    # the plan shows host memory per rank and per node, and every offloaded layer's host bytes
    p = tight.predicted
    assert p.host_memory_bytes[0] == sum(lp.predicted.host_bytes for lp in tight.layers) > 0
    assert p.host_node_bytes == (8 * p.host_memory_bytes[0],)
    assert p.host_budget_bytes == 8 * 64 * GiB
    assert all(lp.predicted.host_bytes > 0 for lp in offloaded)
    text = tight.explain()
    assert f"CPU offload of {len(offloaded)} of {len(tight.layers)} layers" in text and "host budget" in text
    assert "·offload" in text
    back = ParallelPlan.from_json(tight.to_json())
    assert back == tight and back.plan_hash() == tight.plan_hash()
    with pytest.raises(PlanError):
        _plan(gpt2, rtx, TOO_TIGHT)


def test_the_host_budget_is_respected(gpt2, rtx):
    free = _plan(gpt2, rtx, TIGHT)
    need = max(free.predicted.host_node_bytes)
    # a budget under what the unconstrained plan keeps: the search offloads less (or fails),
    # never over the budget
    budget = int(need * 0.8)
    try:
        held = _plan(gpt2, rtx, TIGHT, host_memory_budget=budget)
    except PlanError as e:
        assert "host budget" in str(e)
    else:
        assert max(held.predicted.host_node_bytes) <= budget
        assert held.predicted.host_budget_bytes == budget
    with pytest.raises(PlanError, match="raise search.host_memory_budget"):
        _plan(gpt2, rtx, TIGHT, host_memory_budget=MiB)


def test_offload_everywhere_and_the_offload_baselines(gpt2, rtx):
    every = _plan(gpt2, rtx, ROOMY, offload=(True,))
    assert all(lp.strategy.offload for lp in every.layers if lp.predicted.host_bytes or lp.strategy.offload)
    assert every.predicted.step_time_s > _plan(gpt2, rtx, ROOMY).predicted.step_time_s
    names = set(baseline_spaces(rtx))
    assert {"fsdp+offload", "fsdp+recompute+offload"} <= names
    assert not {n for n in baseline_spaces(rtx, SearchSpace(offload=(False,))) if "offload" in n}
    assert not {n for n in baseline_spaces(Cluster.local_cpu(2)) if "offload" in n}
    with pytest.raises(ConfigError, match="no host memory beside their own"):
        gfx.plan(gpt2, Cluster.local_cpu(8), global_batch_size=8, search={"offload": (True,)})
    with pytest.raises(ConfigError, match="search.offload"):
        SearchSpace(offload="yes")
