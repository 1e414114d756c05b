"""Mixed precision on real gloo ranks: bf16 and fp16 plans train within their noise of fp32.

One spawn at world 2. Per model (gpt-tiny, llama-tiny), one mixed plan (dp2 DDP, dp2 ZeRO-3,
tp2 + Megatron SP, dp2 ZeRO-2 with full recompute, tp2, ...) is run in fp32, bf16 and fp16 for
``STEPS`` AdamW steps on the same batches; the runtime graph is captured from the model in the
compute dtype, as ``compile`` does. Also: activations really are in the compute dtype, FSDP
gathers in it, and fp16's loss scaler skips an overflowing step on every rank without touching
the parameters.
"""

from __future__ import annotations

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_parallel_module import _batches, build, make_plan

STEPS = 10
NOISE = {"bf16": 0.05, "fp16": 0.01}  # largest |loss - fp32 loss| over the steps (loss ≈ 4.5–6.3)
SPEC = [(2, 1, "none", "none"), (2, 1, "none", "none", "zero3"), (1, 2, "megatron", "none"),
        (2, 1, "none", "full", "zero2"), (1, 2, "none", "none"), (1, 2, "none", "none"), (2, 1, "none", "none")]


def _case(name: str, tmp: str) -> dict:
    import copy
    import dataclasses

    import torch

    import galvatron_fx as gfx
    from galvatron_fx.build import _runtime_model
    from galvatron_fx.runtime.parallel_module import ParallelModule
    from galvatron_fx.runtime.precision import LossScaler

    gbs, m = 8, 2
    model, mg, inputs = build(name, gbs // m)
    plan = make_plan(mg, 2, SPEC, gbs=gbs, m=m, name=name)
    batches = _batches(gbs, STEPS)
    res: dict = {}
    for prec in ("fp32", "bf16", "fp16"):
        mgp = gfx.capture(_runtime_model(model, prec), inputs)
        pm = ParallelModule(copy.deepcopy(model), mgp, dataclasses.replace(plan, precision=prec))
        seen = {}

        def record(_m, _a, out, seen=seen):
            seen.setdefault("block_out", str((out[0] if isinstance(out, tuple) else out).dtype))

        hook = pm.executors[1].register_forward_hook(record)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        res[prec] = [pm.train_step(b, opt) for b in batches]
        hook.remove()
        res[f"{prec}_block_out_dtype"] = seen["block_out"]
        res[f"{prec}_param_dtype"] = str(next(pm.parameters()).dtype)
        if prec == "fp16":
            res["fp16_skipped"] = pm.scaler.skipped
            # an overflowing scale: the step is skipped and nothing moves
            pm.scaler = LossScaler(init_scale=2.0**24)
            before = {k: v.clone() for k, v in pm.state_dict().items()}
            loss = pm.train_step(batches[0], opt)
            after = pm.state_dict()
            res["overflow_skipped"] = pm.scaler.skipped
            res["overflow_scale"] = pm.scaler.scale
            res["overflow_loss"] = loss
            res["overflow_moved"] = max((after[k] - v).abs().max().item() for k, v in before.items())
            # the loss scale travels with a checkpoint
            pm.save(f"{tmp}/{name}-fp16-ckpt", opt, step=1)
            fresh = ParallelModule(copy.deepcopy(model), mgp, dataclasses.replace(plan, precision=prec))
            fresh.load(f"{tmp}/{name}-fp16-ckpt", torch.optim.AdamW(fresh.parameters(), lr=1e-3))
            res["loaded_scaler"] = fresh.scaler.state_dict()
            # the user's own loop: forward_backward leaves no gradient after an overflow, so the
            # optimizer step that follows moves nothing
            pm.scaler = LossScaler(init_scale=2.0**24)
            before = {k: v.clone() for k, v in pm.state_dict().items()}
            pm.forward_backward(batches[0])
            res["fb_overflow_grads"] = sum(p.grad is not None for p in pm.parameters())
            res["fb_overflow_norm"] = float(pm.clip_grad_norm_(1.0))
            opt.step()
            opt.zero_grad()
            res["fb_overflow_moved"] = max((pm.state_dict()[k] - v).abs().max().item() for k, v in before.items())
            pm.scaler = LossScaler()
            res["fb_good_grads"] = (pm.forward_backward(batches[1]).item(),
                                    sum(p.grad is not None for p in pm.parameters()))
    return res


def _pipeline_case() -> dict:
    """The same comparison for a pipelined plan (pp2, 1F1B, two micro-batches), llama-tiny."""
    import copy
    import dataclasses

    import torch

    import galvatron_fx as gfx
    from galvatron_fx.build import _runtime_model
    from galvatron_fx.runtime.pipeline import PipelineModule

    gbs, m = 8, 2
    model, mg, inputs = build("llama-tiny", gbs // m)
    plan = make_plan(mg, 2, (1, 1, "none", "none"), gbs=gbs, m=m, pp=2, boundaries=(0, 4))
    res = {}
    for prec in ("fp32", "bf16", "fp16"):
        mgp = gfx.capture(_runtime_model(model, prec), inputs)
        pm = PipelineModule(copy.deepcopy(model), mgp, dataclasses.replace(plan, precision=prec))
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        res[prec] = [pm.train_step(b, opt) for b in _batches(gbs, STEPS)]
    return res


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    jobs = [(n, lambda n=n: _case(n, tmp)) for n in ("gpt-tiny", "llama-tiny")] + [("llama-pp2", _pipeline_case)]
    run_jobs(rank, tmp, jobs, only_env="GFX_MP_ONLY")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("mp2"))


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_mixed_precision_loss_within_noise_of_fp32(world2, name):
    import math

    r = assert_ok(world2, name)
    for rank in world2:
        assert world2[rank][name]["fp32"] == r["fp32"], "ranks report different losses"
    assert r["fp32"][-1] < r["fp32"][0] - 1.0, "fp32 did not train: the comparison cannot fail"
    for prec, noise in NOISE.items():
        diffs = [abs(a - b) for a, b in zip(r[prec], r["fp32"])]
        assert all(math.isfinite(x) for x in r[prec]), f"{prec}: non-finite loss {r[prec]}"
        assert max(diffs) <= noise, f"{prec} differs from fp32 by up to {max(diffs):.4f} (> {noise})"
        assert max(diffs) > 0.0, f"{prec} equals fp32 exactly: it did not run in {prec}"
    assert r["fp32_block_out_dtype"] == "torch.float32"
    assert r["bf16_block_out_dtype"] == "torch.bfloat16" and r["fp16_block_out_dtype"] == "torch.float16"
    assert r["bf16_param_dtype"] == "torch.float32", "parameters (the optimizer's copy) must stay fp32"


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_fp16_loss_scaler_skips_an_overflowing_step(world2, name):
    r = assert_ok(world2, name)
    assert r["fp16_skipped"] == 0, "a well-scaled fp16 run skipped steps"
    assert r["overflow_skipped"] == 1 and r["overflow_scale"] == 2.0**23
    assert r["overflow_moved"] == 0.0, "a skipped step changed the parameters"
    assert r["loaded_scaler"] == {"scale": 2.0**23, "good_steps": 0, "skipped": 1, "overflows_at_min_scale": 0}, \
        "the loss scale was not restored"
    assert r["fb_overflow_grads"] == 0 and r["fb_overflow_norm"] == 0.0 and r["fb_overflow_moved"] == 0.0, \
        "forward_backward left an overflowed step's gradients for the user's optimizer"
    assert r["fb_good_grads"][1] > 0, "forward_backward left no gradient after a good step"


def test_pipelined_mixed_precision_within_noise_of_fp32(world2):
    r = assert_ok(world2, "llama-pp2")
    assert r["fp32"][-1] < r["fp32"][0] - 0.5
    for prec, noise in NOISE.items():
        diffs = [abs(a - b) for a, b in zip(r[prec], r["fp32"])]
        assert 0.0 < max(diffs) <= noise, f"pipelined {prec} differs from fp32 by up to {max(diffs):.4f}"
