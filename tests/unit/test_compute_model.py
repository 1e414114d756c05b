"""Compute cost model (roofline + efficiencies) and the model profiler (calibration) on gpt-tiny.

Timing tolerance: on this 2-core machine shared with other processes, medians of the gpt-tiny layers
(0.2-8 ms) timed in two runs a few seconds apart differ by up to 35% when the load changes. So the
held-out batch is timed in the same interleaved run as the calibration batches (load hits all
alike) and left out of the fit. Measured so, the calibrated model predicts held-out batch 2 (fit on
1 and 4) within 2% for the whole step and 6% for the block, 30% for the 0.2 ms embedding (two runs);
the step total (what the planner sums) and the block (most of it) must be within 25%, each small
overhead-bound layer within 60%.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cluster import Cluster
from galvatron_fx.cost_models.compute import (
    CPU_DEFAULT,
    GPU_DEFAULT,
    ComputeEfficiency,
    ComputeModel,
    default_efficiency,
)
from galvatron_fx.errors import ConfigError
from galvatron_fx.profiler import model as model_profiler
from galvatron_fx.profiler.model import profile_model, time_layers_s

SEQ = 128
CALIBRATE = (1, 4)
HELD_OUT = 2


@pytest.fixture(scope="module")
def graphs():
    cache: dict[int, gfx.ModelGraph] = {}

    def factory(b: int):
        if b not in cache:
            model, inputs = zoo.build("gpt-tiny", batch_size=b, seq_len=SEQ)
            cache[b] = gfx.capture(model, inputs)
        return cache[b]

    return factory


@pytest.fixture(scope="module")
def calibrated(graphs, tmp_path_factory):
    """Time batch sizes 1, 2 and 4 in one interleaved run (so that load from other processes hits
    them alike), then fit from the cache on 1 and 4 only: batch 2 is held out."""
    torch.set_num_threads(1)
    cache_dir = tmp_path_factory.mktemp("gfx-cache")
    cluster = Cluster.local_cpu(1, cache_dir=cache_dir)
    profile_model(graphs, batch_sizes=sorted((*CALIBRATE, HELD_OUT)), repeats=9, warmup=2, cluster=cluster,
                  cache_dir=cache_dir, progress=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_profiler, "_time_jobs", _no_timing)
        eff = profile_model(graphs, batch_sizes=CALIBRATE, cluster=cluster, cache_dir=cache_dir, progress=False)
    return cluster, eff, cache_dir


def _no_timing(*args, **kwargs):
    raise AssertionError("profile_model re-timed layers that were cached")


# ---------------------------------------------------------------- roofline arithmetic
def test_roofline_matmul_vs_memory_bound_on_h200():
    cluster = Cluster.preset("h200")
    eff = ComputeEfficiency(matmul=0.5, memory=0.8, overhead_s=4e-6)
    cm = ComputeModel(cluster, eff, dtype="bfloat16")
    n = 8192
    mm_flops, mm_bytes = 2 * n**3, 3 * n * n * 2
    want = mm_flops / (989e12 * 0.5) + 4e-6  # compute-bound: 1.1 ms >> 0.4 MB / 3.84 TB/s
    assert cm.node_time_s(mm_flops, mm_bytes) == pytest.approx(want, rel=1e-12)
    # an elementwise add of two 1 GiB tensors: memory-bound
    nbytes = 3 * 2**30
    want = nbytes / (4.8e12 * 0.8) + 4e-6
    assert cm.node_time_s(2**29, nbytes) == pytest.approx(want, rel=1e-12)
    assert cm.node_time_s(0, 0) == 0.0  # views are free
    # fp32 matmuls run on TF32 tensor cores (494.5 TF) where the cluster allows it, as NVIDIA
    # presets do; without TF32 the float32 peak is 67 TF: the same GEMM is ~15x slower
    assert cluster.allow_tf32
    tf32 = ComputeModel(cluster, eff, dtype="float32").node_time_s(mm_flops, mm_bytes)
    assert tf32 == pytest.approx(mm_flops / (494.5e12 * 0.5) + 4e-6, rel=1e-12)
    strict = dataclasses.replace(cluster, allow_tf32=False)
    assert ComputeModel(strict, eff, dtype="float32").node_time_s(mm_flops, mm_bytes) > 10 * cm.node_time_s(mm_flops, mm_bytes)
    assert not Cluster.local_cpu(1).allow_tf32


def test_defaults_by_device_kind():
    a100 = default_efficiency(Cluster.preset("dgx-a100-80g").device(0))  # with the preset's fixed costs
    assert (a100.matmul, a100.memory, a100.async_launch) == (GPU_DEFAULT.matmul, GPU_DEFAULT.memory, True)
    assert a100.layer_overhead_s == Cluster.preset("dgx-a100-80g").device(0).layer_overhead_s > 0
    assert 0.6 <= GPU_DEFAULT.matmul <= 0.7 and GPU_DEFAULT.memory == pytest.approx(0.8)
    assert default_efficiency(Cluster.local_cpu(1).device(0)) is CPU_DEFAULT


# ---------------------------------------------------------------- layer times
def test_layer_times_scale_with_batch_and_tp(graphs):
    mg = graphs(4)
    block = mg.blocks()[0]
    cluster = Cluster.preset("h200")
    no_oh = ComputeModel(cluster, ComputeEfficiency(matmul=0.6, memory=0.8, overhead_s=0.0))
    f1, b1 = no_oh.layer_times_s(mg, block)
    fh, bh = no_oh.layer_times_s(mg, block, batch_fraction=0.5)
    ft, bt = no_oh.layer_times_s(mg, block, tp_fraction=0.25)
    assert (fh, bh) == pytest.approx((f1 / 2, b1 / 2), rel=1e-12)
    assert (ft, bt) == pytest.approx((f1 / 4, b1 / 4), rel=1e-12)
    assert b1 > 1.5 * f1  # backward does about twice the forward's FLOPs
    # with overheads: linear in the fraction, overhead not scaled
    cm = ComputeModel(cluster, ComputeEfficiency(matmul=0.6, memory=0.8, overhead_s=5e-6))
    t = [cm.layer_times_s(mg, block, batch_fraction=s)[0] for s in (0.0, 0.5, 1.0)]
    assert t[0] > 0 and t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
    assert t[2] == pytest.approx(f1 + t[0], rel=1e-9)
    # the sum of per-node rooflines, by hand
    from galvatron_fx.cost_models.compute import node_sums

    hand = sum(max(ff / (494.5e12 * 0.6), fb / (4.8e12 * 0.8)) for ff, fb, _, _ in node_sums(mg, block) if ff or fb)
    assert f1 == pytest.approx(hand, rel=1e-12)


def test_bytes_priced_in_the_compute_dtype_and_fixed_costs(graphs):
    mg = graphs(4)  # captured in fp32
    block = mg.blocks()[0]
    cluster = Cluster.preset("h200")
    eff = ComputeEfficiency(matmul=1e6, memory=0.8, overhead_s=0.0)  # FLOPs free: all memory-bound
    f32, b32 = ComputeModel(cluster, eff, dtype="float32").layer_times_s(mg, block)
    f16, b16 = ComputeModel(cluster, eff, dtype="bfloat16").layer_times_s(mg, block)
    assert (f16, b16) == pytest.approx((f32 / 2, b32 / 2), rel=1e-6)  # a bf16 plan moves half the bytes
    # a fixed cost per layer call in each direction, not scaled by the batch
    fixed = dataclasses.replace(eff, layer_overhead_s=1e-3)
    cm = ComputeModel(cluster, fixed, dtype="float32")
    f, b = cm.layer_times_s(mg, block)
    assert (f, b) == pytest.approx((f32 + 1e-3, b32 + 1e-3), rel=1e-9)
    fh, _ = cm.layer_times_s(mg, block, batch_fraction=0.5)
    assert fh == pytest.approx(f32 / 2 + 1e-3, rel=1e-9)
    _, bre = cm.layer_times_s(mg, block, recompute="full")  # the recomputed forward is a call too
    _, bre0 = ComputeModel(cluster, eff, dtype="float32").layer_times_s(mg, block, recompute="full")
    assert bre == pytest.approx(bre0 + 2e-3, rel=1e-9)
    # launched asynchronously (a GPU), the host's fixed work overlaps the kernels: the longer wins
    asy = ComputeModel(cluster, dataclasses.replace(fixed, async_launch=True), dtype="float32")
    assert asy.layer_times_s(mg, block) == pytest.approx((max(f32, 1e-3), max(b32, 1e-3)), rel=1e-9)
    assert GPU_DEFAULT.async_launch and not CPU_DEFAULT.async_launch
    # a device spec's measured fixed costs replace the defaults
    dev = dataclasses.replace(cluster.device(0), kernel_overhead_s=7e-6, layer_overhead_s=2e-4)
    d = default_efficiency(dev)
    assert (d.overhead_s, d.layer_overhead_s) == (7e-6, 2e-4) and d.matmul == GPU_DEFAULT.matmul


def test_recompute_adds_backward_time(graphs):
    mg = graphs(4)
    block = mg.blocks()[0]
    cm = ComputeModel(Cluster.preset("dgx-h100"))
    f0, b0 = cm.layer_times_s(mg, block)
    fs, bs = cm.layer_times_s(mg, block, recompute="selective")
    ff, bf = cm.layer_times_s(mg, block, recompute="full")
    assert f0 == fs == ff
    assert b0 < bs < bf
    assert bf - b0 <= 1.5 * f0  # full recomputation redoes about one forward
    assert bf - b0 >= 0.5 * f0


@pytest.mark.timing
def test_layer_times_are_cheap_after_first_call(graphs):
    mg = graphs(4)
    cm = ComputeModel(Cluster.preset("h200"))
    for layer in mg.layers:
        cm.layer_times_s(mg, layer)
    t0 = time.perf_counter()
    for i in range(10_000):
        layer = mg.layers[i % len(mg.layers)]
        cm.layer_times_s(mg, layer, batch_fraction=0.5, tp_fraction=0.5, recompute="full")
    per_call_s = (time.perf_counter() - t0) / 10_000
    assert per_call_s < 20e-6, per_call_s


def test_layer_without_costs_says_what_to_do(graphs):
    import dataclasses

    mg = graphs(4)
    bare = dataclasses.replace(mg.layers[1], costs=None, kind="no-costs")
    with pytest.raises(ConfigError, match="annotate"):
        ComputeModel(Cluster.preset("h200")).layer_times_s(mg, bare)


# ---------------------------------------------------------------- JSON
def test_efficiency_json_round_trip(tmp_path):
    eff = ComputeEfficiency(matmul=0.61, memory=0.77, overhead_s=6e-6, per_kind={"abc": (1.1, 0.9)}, source="x")
    assert ComputeEfficiency.from_json(eff.to_json()) == eff
    p = tmp_path / "eff.json"
    model_profiler.save_efficiency(eff, p)
    back = model_profiler.load_efficiency(p)
    assert back == eff and back.per_kind == {"abc": (1.1, 0.9)}
    with pytest.raises(ConfigError, match="unknown key"):
        ComputeEfficiency.from_dict({**eff.to_dict(), "matmull": 1})
    with pytest.raises(ConfigError, match="matmul"):
        ComputeEfficiency(matmul=0.0)


# ---------------------------------------------------------------- calibration
@pytest.mark.timing
def test_calibrated_model_predicts_held_out_batch(graphs, calibrated):
    cluster, eff, cache_dir = calibrated
    assert eff.matmul > 0 and eff.memory > 0 and 1e-6 < eff.overhead_s < 1e-3
    ref = graphs(CALIBRATE[-1])
    assert all(layer.kind in eff.per_kind for layer in ref.layers)
    cm = ComputeModel(cluster, eff)
    held = graphs(HELD_OUT)
    (path,) = cache_dir.glob("compute-*-float32.json")
    cached = model_profiler.load_measurements(path)
    measured = {layer.name: (cached[layer.kind]["fwd_s"], cached[layer.kind]["bwd_s"]) for layer in held.layers}
    step_meas = step_pred = 0.0
    errors = {}
    for i, layer in enumerate(held.layers):
        first = held.kinds()[layer.kind][0]
        pred = cm.layer_times_s(ref, ref.layers[i], batch_fraction=HELD_OUT / CALIBRATE[-1])
        meas = measured[first.name]
        step_meas += sum(meas)
        step_pred += sum(pred)
        if first is layer:
            errors[layer.name] = (pred[0] / meas[0] - 1, pred[1] / meas[1] - 1, sum(meas))
    step_err = step_pred / step_meas - 1
    report = f"step {step_err:+.2f}; " + ", ".join(f"{k} {f:+.2f}/{b:+.2f}" for k, (f, b, _) in errors.items())
    assert abs(step_err) <= 0.25, report
    for name, (fe, be, _total_s) in errors.items():
        # wall-clock timing on 2 shared cores: one layer's fwd or bwd alone wanders more than
        # the whole step does
        tol = 0.35 if name.startswith("blocks") else 0.6
        assert abs(fe) <= tol and abs(be) <= tol, report


@pytest.mark.timing
def test_calibration_is_cached(graphs, calibrated, monkeypatch):
    cluster, eff, cache_dir = calibrated

    monkeypatch.setattr(model_profiler, "_time_jobs", _no_timing)
    again = profile_model(graphs, batch_sizes=CALIBRATE, cluster=cluster, cache_dir=cache_dir, progress=False)
    assert again == eff
    files = list(cache_dir.glob("compute-*-float32.json"))
    assert len(files) == 1
    assert set(model_profiler.load_measurements(files[0])) == {
        layer.kind for b in (*CALIBRATE, HELD_OUT) for layer in graphs(b).layers
    }


def test_time_layers_s_times_real_tensors(graphs):
    mg = graphs(1)
    out = time_layers_s(mg, [mg.layers[0], mg.layers[-1]], repeats=2, warmup=1)
    assert set(out) == {mg.layers[0].name, mg.layers[-1].name}
    assert all(0 < f < 1 and 0 < b < 1 for f, b in out.values())
