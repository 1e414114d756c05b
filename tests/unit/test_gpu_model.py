"""What a GPU plan predicts beside the kernels: the device memory beside the tensors, the
backward's transient, the host's fixed costs from a profile."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models.memory import BUDGET_COMMUNICATORS, reserved_bytes, tensor_budget_bytes
from galvatron_fx.passes.lower_program import lower
from galvatron_fx.passes.measure_lowered import backward_transient_bytes

GiB, MiB = 2**30, 2**20


def test_reserved_memory_arithmetic_and_the_budget_it_leaves():
    cl = gfx.Cluster.preset("dgx-h100")
    d = cl.device(0)
    assert (d.context_bytes, d.comm_buffer_bytes, d.allocator_factor) == (512 * MiB, GiB, 1.25)
    assert reserved_bytes(40 * GiB, d, 3) == 512 * MiB + 3 * GiB + 50 * GiB
    budget = tensor_budget_bytes(80 * GiB, cl)
    assert reserved_bytes(budget, d, BUDGET_COMMUNICATORS) <= 80 * GiB < reserved_bytes(budget + 2, d, BUDGET_COMMUNICATORS)
    cpu = gfx.Cluster.local_cpu(2)  # no context, no NCCL, no caching allocator: the budget is the tensors'
    assert tensor_budget_bytes(10 * MiB, cpu) == 10 * MiB


def test_gpu_plans_show_and_respect_the_device_peak():
    model, inputs = zoo.build("gpt2-small", batch_size=1, seq_len=1024, device="meta")
    mg = gfx.capture(model, inputs)
    cl = gfx.Cluster.preset("rtx4090-pcie")
    p = gfx.plan(mg, cl, global_batch_size=64, memory_budget=8 * GiB, precision="bf16", baselines=False)
    pred = p.predicted
    assert len(pred.reserved_peak_bytes) == p.pp
    for tensors, device in zip(pred.peak_memory_bytes, pred.reserved_peak_bytes):
        assert device > 1.25 * tensors and device <= 8 * GiB
    assert "device in use at the peak" in p.explain()
    again = gfx.ParallelPlan.from_json(p.to_json())
    assert again.predicted.reserved_peak_bytes == pred.reserved_peak_bytes
    # a plan written before the device peak was predicted still loads; its budget is the tensors'
    d = p.to_dict()
    del d["predicted"]["reserved_peak_bytes"]
    old = gfx.ParallelPlan.from_dict(d)
    assert old.predicted.device_peak_bytes == old.predicted.peak_memory_bytes


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_backward_transient_of_the_capture_matches_the_lowered_graph(name):
    model, inputs = zoo.build(name, batch_size=2, seq_len=64, device="cpu", seed=0)
    mg = gfx.capture(model, inputs)
    plan = gfx.plan(mg, gfx.Cluster.local_cpu(1), global_batch_size=2, baselines=False)
    prog = lower(mg, plan)
    lowered = {lg.name: backward_transient_bytes(lg) for lg in prog.layer_graphs.values()}
    checked = 0
    for layer in mg.layers:
        if layer.name in lowered and layer.role in ("block", "embedding", "loss"):
            captured = layer.costs.bwd_transient_bytes
            assert captured > 0
            assert captured == pytest.approx(lowered[layer.name], rel=0.05), layer.name
            checked += 1
    assert checked == 3  # one block (the others share its graphs), the embedding, the loss


def test_a_gpu_profile_records_fixed_costs_and_memory_terms(monkeypatch):
    from galvatron_fx.profiler import hardware_profile as hp

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(total_memory=80 * GiB))
    rows = [dict(op="matmul", size=4096, dtype="bfloat16", time_s=1e-4, flops_s=7e14),
            dict(op="kernel_launch", size=100, dtype="float32", time_s=4e-6),
            dict(op="layer_call", size=5, dtype="float32", time_s=1.5e-4),
            dict(op="device_memory", size=0, dtype="", time_s=0.0, context_bytes=500 * MiB, comm_buffer_bytes=600 * MiB)]
    cl = hp.build_cluster([], rows, 3e12, {}, backend="nccl", device=torch.device("cuda", 0), num_nodes=1, dpn=8,
                          fingerprint="f", hosts=["h"], colls_supported=[])
    d = cl.device(0)
    assert (d.kernel_overhead_s, d.layer_overhead_s) == (4e-6, 1.5e-4)
    assert (d.context_bytes, d.comm_buffer_bytes, d.allocator_factor) == (500 * MiB, 600 * MiB, hp.GPU_ALLOCATOR_FACTOR)
    assert gfx.Cluster.from_dict(cl.to_dict()) == cl
    from galvatron_fx.cost_models.compute import default_efficiency

    eff = default_efficiency(d)
    assert (eff.overhead_s, eff.layer_overhead_s, eff.async_launch) == (4e-6, 1.5e-4, True)


def test_device_spec_fields_are_checked():
    d = gfx.Cluster.preset("dgx-a100-80g").to_dict()
    spec = next(iter(d["device_specs"].values()))
    spec["allocator_factor"] = 0.5
    with pytest.raises(gfx.ConfigError, match="allocator_factor"):
        gfx.Cluster.from_dict(d)
    spec["allocator_factor"] = 1.2
    spec["layer_overhead_s"] = -1.0
    with pytest.raises(gfx.ConfigError, match="layer_overhead_s"):
        gfx.Cluster.from_dict(d)
    d2 = gfx.Cluster.preset("dgx-a100-80g").to_dict()
    d2["allow_tf32"] = "yes"
    with pytest.raises(gfx.ConfigError, match="allow_tf32"):
        gfx.Cluster.from_dict(d2)
    assert dataclasses.replace(gfx.Cluster.preset("h200"), allow_tf32=False).to_dict()["allow_tf32"] is False
