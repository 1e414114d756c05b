"""The composed analytic cost model: protocol conformance and expert-sane trade-offs."""

from __future__ import annotations

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models import AnalyticCostModel, CostModel
from galvatron_fx.cost_models.pipeline import StageCost
from galvatron_fx.cost_models.reshard import Layout, Replicate, Shard
from galvatron_fx.ir.strategy import DPType, LayerStrategy


@pytest.fixture(scope="module")
def gpt2():
    model, inputs = zoo.build("gpt2-small", batch_size=8, seq_len=1024, device="meta")
    return gfx.capture(model, inputs)


@pytest.fixture(scope="module")
def cm():
    return AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g", nodes=1))


def test_analytic_model_satisfies_the_protocol(cm):
    assert isinstance(cm, CostModel)


def _dp_step_s(cm, mg, dp: int) -> float:
    """Compute at 1/dp of the batch, then one all-reduce of every gradient (no overlap)."""
    compute = sum(sum(cm.layer_times_s(mg, l, batch_fraction=1 / dp)) for l in mg.layers)
    grads = sum(l.costs.param_bytes for l in mg.layers)
    return compute + cm.collective_time_s("all_reduce", grads, list(range(dp)))


def test_data_parallel_speeds_up_and_pays_the_all_reduce(cm, gpt2):
    one, eight = _dp_step_s(cm, gpt2, 1), _dp_step_s(cm, gpt2, 8)
    assert eight < one / 3, "8-way data parallel on NVLink should be several times faster"
    assert eight > one / 8, "... but not free: the gradient all-reduce costs time"


def test_sharded_data_parallel_lowers_persistent_memory_and_recompute_activations(cm, gpt2):
    block = gpt2.blocks()[0]
    mem = {t: cm.layer_memory(block.costs, LayerStrategy(dp_type=t), dp=8, micro_batch=1, captured_batch=8)
           for t in DPType}
    assert mem[DPType.ZERO3].persistent_bytes < mem[DPType.ZERO2].persistent_bytes < mem[DPType.DDP].persistent_bytes
    assert mem[DPType.ZERO3].activation_bytes == mem[DPType.DDP].activation_bytes
    full = cm.layer_memory(block.costs, LayerStrategy(recompute="full"), dp=8, micro_batch=1, captured_batch=8)
    assert full.activation_bytes < mem[DPType.DDP].activation_bytes / 5
    fwd, bwd = cm.layer_times_s(gpt2, block, recompute="full")
    fwd0, bwd0 = cm.layer_times_s(gpt2, block)
    assert fwd == fwd0 and bwd > bwd0, "recomputation costs backward time"


def test_pipeline_from_layer_times(cm, gpt2):
    times = [cm.layer_times_s(gpt2, l, batch_fraction=1 / 8) for l in gpt2.layers]
    half = len(times) // 2
    stages = [StageCost(fwd_s=sum(f for f, _ in part), bwd_s=sum(b for _, b in part), p2p_s=1e-5)
              for part in (times[:half], times[half:])]
    res = cm.simulate_pipeline("1f1b", stages, 8)
    serial = sum(s.fwd_s + s.bwd_s for s in stages) * 8
    assert serial / 2 < res.step_time_s < serial
    assert res.bubble_fraction > 0


def test_reshard_goes_through_the_comm_model(cm):
    src, dst = Layout((8,), (Shard(0),)), Layout((8,), (Replicate(),))
    assert cm.reshard_time_s(2**26, src, dst, range(8), 3) == pytest.approx(
        cm.collective_time_s("all_gather", 2**26, list(range(8))))
