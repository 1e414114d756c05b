"""Gradient communication in the plan: 16-bit sums and PowerSGD are priced by their bytes, chosen
only where the caller allows them and they pay, recorded in the plan's JSON and shown by explain."""

from __future__ import annotations

import dataclasses
import json

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.cost_models.grad_sync import bucket_time_s, bucketed_sync_s
from galvatron_fx.ir.grad_comm import GradComm, compressible, grad_comm_options
from galvatron_fx.ir.strategy import Precision

DDP = {"max_tp": 1, "pp": (1,), "dp_types": ("ddp",), "recompute": ("none",)}
BF16 = {"reduce_dtypes": ("float32", "bfloat16")}
PSGD = {"powersgd_ranks": (0, 4)}


@pytest.fixture(scope="module")
def gpt2():
    model, inputs = zoo.build("gpt2-small", batch_size=1, seq_len=512, device="meta")
    return gfx.capture(model, inputs, name="gpt2-small")


def _cluster(name: str, nodes: int, inter_bw: float | None = None) -> gfx.Cluster:
    c = gfx.Cluster.preset(name, nodes=nodes)
    if inter_bw is not None:  # a slow network between the nodes (e.g. 8 Gbit/s Ethernet)
        c = dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node, bandwidth_bytes_s=inter_bw))
    return c


def _plan(mg, cluster, **search):
    return gfx.plan(mg, cluster, global_batch_size=32, precision="bf16", baselines=False, search={**DDP, **search})


def test_options_are_listed_least_lossy_first_and_checked():
    opts = grad_comm_options(("bfloat16", "float32"), (4, 0))
    assert [o.short() for o in opts] == ["fp32", "bf16", "fp32+powersgd4", "bf16+powersgd4"]
    assert opts[0].lossless and not opts[1].lossless
    with pytest.raises(gfx.ConfigError, match="float8"):
        grad_comm_options(("float8",), (0,))
    with pytest.raises(gfx.ConfigError, match="powersgd_ranks"):
        gfx.SearchSpace(powersgd_ranks=(-1,))
    assert gfx.SearchSpace.coerce({"reduce_dtypes": "bfloat16"}).grad_comm == GradComm(reduce_dtype="bfloat16")
    assert gfx.SearchSpace().grad_comm.lossless  # lossy choices are off by default


def test_powersgd_compresses_only_matrices_it_halves():
    assert compressible((768, 3072), 4) == (768, 3072)
    assert compressible((64, 3, 3, 64), 4) == (64, 3 * 3 * 64)  # a conv kernel: (out, rest)
    assert compressible((3, 12288), 4) is None  # rank 3 would hold it whole: nothing saved
    assert compressible((768,), 4) is None  # vectors are summed whole
    assert compressible((8, 8), 4) is None  # (8 + 8)·4 > 64 / 2
    g = GradComm(reduce_dtype="bfloat16", powersgd_rank=4)
    assert g.wire_bytes((768, 3072)) == (0, 4 * 768 * 4, 4 * 3072 * 4)
    assert g.wire_bytes((768,)) == (768 * 2, 0, 0)


def test_wire_bytes_price_the_bucket():
    cm = AnalyticCostModel(_cluster("dgx-a100-80g", 2), precision=Precision.bf16())
    ranks = list(range(16))
    whole = [(100 * 2**20, 0.0)]
    half = [(100 * 2**20, 0.0, 50 * 2**20, 0, 0, 0.0)]
    t32, t16 = bucket_time_s(cm, whole, ranks), bucket_time_s(cm, half, ranks)
    assert t16 < 0.55 * t32 and t16 > 0.45 * t32  # half the bytes: about half the time (plus latency)
    # the buckets are cut by the stored bytes, not the wire bytes: same count of collectives
    assert bucketed_sync_s(cm, half * 3, ranks, 0.0) == pytest.approx(3 * t16, rel=1e-6)


def test_default_plan_is_lossless_and_keeps_the_old_json(gpt2):
    p = _plan(gpt2, _cluster("dgx-a100-80g", 2))
    assert p.grad_comm.lossless
    assert "grad_comm" not in p.to_dict()  # plans without lossy choices read as before
    d = p.to_dict()
    assert gfx.ParallelPlan.from_dict(d) == p


def test_bf16_sums_are_taken_when_allowed_and_halve_the_priced_bytes(gpt2, tmp_path):
    cluster = _cluster("dgx-a100-80g", 2)
    fp32 = _plan(gpt2, cluster)
    bf16 = _plan(gpt2, cluster, **BF16)
    assert bf16.grad_comm == GradComm(reduce_dtype="bfloat16")
    assert bf16.predicted.step_time_s < fp32.predicted.step_time_s
    assert bf16.predicted.breakdown["dp_sync"] < fp32.predicted.breakdown["dp_sync"]
    assert any("bf16" in n and "fp32" in n for n in bf16.notes)  # what the other option predicted
    for a, b in zip(fp32.layers, bf16.layers):
        steps32 = [c["bytes"] for c in a.collectives if c.get("phase") == "step"]
        steps16 = [c["bytes"] for c in b.collectives if c.get("phase") == "step"]
        assert [x // 2 for x in steps32] == steps16, a.name
    assert "summed in bf16" in bf16.explain()
    assert fp32.diff_dict(bf16)["plan"]["grad_comm"] == ["fp32", "bf16"] and "grad_comm: fp32 -> bf16" in fp32.diff(bf16)
    path = bf16.save(tmp_path / "plan.json")
    assert json.loads(path.read_text())["grad_comm"] == {"reduce_dtype": "bfloat16", "powersgd_rank": 0}
    assert gfx.ParallelPlan.load(path) == bf16
    # re-priced as it is (its gradient communication too), the plan predicts the same step
    from galvatron_fx.search.price_plan import price_plan

    cm = AnalyticCostModel(cluster, precision=Precision.bf16())
    again = price_plan(bf16, gpt2, cm)
    assert again.grad_comm == bf16.grad_comm
    assert again.predicted.step_time_s == pytest.approx(bf16.predicted.step_time_s, rel=1e-9)
    # forced: the only option allowed
    assert _plan(gpt2, cluster, reduce_dtypes=("bfloat16",)).grad_comm.reduce_dtype == "bfloat16"


def test_a_plan_without_data_parallel_gradients_keeps_fp32(gpt2):
    one = gfx.Cluster.preset("dgx-a100-80g", nodes=1)
    p = gfx.plan(gpt2, one, global_batch_size=8, precision="bf16", baselines=False,
                 search={"tp": (8,), "pp": (1,), **BF16, **PSGD})
    assert all(lp.dp == 1 for lp in p.layers)
    assert p.grad_comm.lossless  # a tie: the lossless option wins


def test_powersgd_only_when_allowed_and_the_network_is_slow(gpt2):
    slow = _cluster("dgx-a100-80g", 2, inter_bw=1e9)
    assert _plan(gpt2, slow).grad_comm.powersgd_rank == 0  # not allowed: never
    assert _plan(gpt2, slow, **BF16).grad_comm.powersgd_rank == 0
    chosen = _plan(gpt2, slow, **PSGD)
    assert chosen.grad_comm.powersgd_rank == 4
    assert chosen.grad_comm.powersgd_start_step == 1000  # plain sums first, as torch's PowerSGD hook
    assert chosen.to_dict()["grad_comm"] == {"reduce_dtype": "float32", "powersgd_rank": 4, "powersgd_start_step": 1000}
    assert gfx.ParallelPlan.from_dict(chosen.to_dict()) == chosen
    assert _plan(gpt2, slow, **PSGD, powersgd_start_step=0).grad_comm.powersgd_start_step == 0
    assert chosen.predicted.step_time_s < 0.5 * _plan(gpt2, slow).predicted.step_time_s
    assert "PowerSGD" in chosen.explain() and "from step 1000" in chosen.explain()
    # a fast network: its compute and rounds do not pay
    fast = gfx.Cluster.preset("dgx-h100", nodes=1)
    assert _plan(gpt2, fast, **PSGD).grad_comm.powersgd_rank == 0
    assert _plan(gpt2, fast, **BF16, **PSGD).grad_comm.powersgd_rank == 0


def test_powersgd_prices_its_error_feedback_memory(gpt2):
    slow = _cluster("dgx-a100-80g", 2, inter_bw=1e9)
    plain = _plan(gpt2, slow)
    psgd = _plan(gpt2, slow, powersgd_ranks=(4,))
    block = next(i for i, lp in enumerate(plain.layers) if lp.role == "block")
    grads = lambda p: p.layers[block].predicted.memory_breakdown["grads"]  # noqa: E731
    # one more fp32 copy of every compressed matrix (the error) and its Q
    assert grads(psgd) > 1.9 * grads(plain)


@pytest.mark.parametrize("bad", [{"reduce_dtype": "int8"}, {"powersgd_rank": -2}, {"rank": 4},
                                 {"powersgd_rank": 4, "powersgd_start_step": -1}])
def test_bad_grad_comm_in_json_names_the_field(gpt2, bad):
    d = _plan(gpt2, _cluster("dgx-a100-80g", 2)).to_dict()
    d["grad_comm"] = bad
    with pytest.raises(gfx.ConfigError, match="grad_comm"):
        gfx.ParallelPlan.from_dict(d)
