"""More Hugging Face families train like one process: mixture-of-experts, vision, batch-coupled.

Spawned once per world size (2, and 4: slow); every rank runs every case; checks in the parent,
with ``test_hf_models``' tolerances (fp32: every step's loss within 1e-5 relative, every
parameter and buffer within 1e-4 after 3 AdamW steps). Families (``hf_tiny``): Mixtral, Qwen2-MoE,
DeepSeek-V3 (Moonlight's shape: latent attention, a shared expert, a dense first block), OLMoE;
Swin, ConvNeXt, ResNet (BatchNorm: against ``DistributedDataParallel``), CLIP (a contrastive loss:
one micro-batch per step); BLOOM, Mamba. Also: a custom op DTensor has no rule for trains at tp 2
(run replicated) and under ZeRO-3 (plain local ops); a cumulative sum along a dim tensor
parallelism would shard keeps the one-process loss; a pipeline stage whose layers cannot be
built is a ``PlanError`` on every rank naming the error.
"""

from __future__ import annotations

import copy
import time

import hf_tiny
import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_hf_models import (
    SPECS,
    _backend_case,
    _batches,
    _captured,
    _check,
    _compile_case,
    _ddp_case,
    _param_errors,
    _plan_case,
    _sgd,
    _train,
)
from test_parallel_module import make_plan

# world 2: per family the strategies that reach what is new in it (experts under tp, ZeRO and
# pipeline stages; windows, depthwise convolutions, batch statistics)
CASES2 = {
    "mixtral": ("dp2", "tp2", "zero3", "pp2-1f1b"),
    "qwen2moe": ("dp2", "tp2", "zero3", "pp2-1f1b"),
    "deepseekv3": ("dp2", "tp2", "zero3", "pp2-1f1b"),
    "olmoe": ("dp2", "tp2", "zero3", "pp2-1f1b"),
    "swin": ("dp2", "tp2", "zero3", "pp2-1f1b"),
    "convnext": ("dp2", "tp2", "zero3", "pp2-1f1b"),
    "resnet": ("ddp-dp2", "ddp-zero3", "tp2", "pp2-1f1b"),
    "clip": ("dp2", "tp2", "zero3"),
    "bloom": ("dp2", "tp2"),
    "mamba": ("dp2", "tp2"),
}
COMPILED2 = ("mixtral", "qwen2moe", "deepseekv3", "olmoe", "clip")  # the search's own plan at world 2
BACKEND2 = ("swin", "bloom", "mamba")  # (Mamba under Dynamo: its associative scan, vmap levels and all)
SGD_FAMILIES = ("clip",)  # (CLIP's text keys: see _coupled_case)
# world 4 (slow): the mixture-of-experts blocks on 2-D meshes (with sequence parallelism and
# ZeRO-3; layers on different meshes and strategies), in two pipeline stages of two ranks (tensor
# parallel or ZeRO-3 inside each), and the search's own plan
CASES4 = {"mixtral": ("dp2tp2", "dp2tp2-sp-zero3", "pp2-1f1b-tp2"), "deepseekv3": ("dp2tp2", "mixed", "pp2-1f1b-zero3")}
COMPILED4 = ("mixtral",)


def _case(family: str, spec: str, world: int, cache: dict) -> dict:
    if spec.startswith("ddp-"):
        return _ddp_case(family, spec[4:], world, cache)
    if family in SGD_FAMILIES:
        return _sgd_case(family, spec, world, cache)
    return _plan_case(family, spec, world, cache)


def _sgd_case(family: str, spec: str, world: int, cache: dict) -> dict:
    """As ``_plan_case``, stepped by SGD: CLIP's text tower has key-projection gradients of
    fp32-noise size (a causal first token attends to itself alone), which AdamW's first step
    turns into ``lr``-sized updates whatever the runtime does (as ``test_hf_models._sgd`` says
    of T5)."""
    from galvatron_fx.runtime.parallel_module import ParallelModule

    model, mg = _captured(family, 1, cache)
    plan = make_plan(mg, world, SPECS[spec], gbs=4, m=1, name=f"{family}-{spec}")
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    opt = _sgd(pm.parameters())
    res = _train(model, lambda b: pm.train_step(b, opt), _batches(family, 4), optim=_sgd)
    return _param_errors(res, pm.state_dict())


def _pp_at_case(family: str, boundary: int, world: int, cache: dict) -> dict:
    """Two pipeline stages cut at layer ``boundary`` (T5: between decoder blocks, so that the
    second stage receives the decoder's mask and position bias from the first)."""
    import torch

    from galvatron_fx.runtime.pipeline import PipelineModule

    model, mg = _captured(family, 2, cache)
    plan = make_plan(mg, world, (1, 1, "none", "none", "ddp"), gbs=4, m=2, name=f"{family}-pp@{boundary}", pp=2,
                     boundaries=(0, boundary), schedule="1f1b")
    pm = PipelineModule(copy.deepcopy(model), mg, plan)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    res = _train(model, lambda b: pm.train_step(b, opt), _batches(family, 4), micro=2)
    return _param_errors(res, pm.state_dict())


def _shapes_case(world: int) -> dict:
    """``torch.compile(backend="galvatron_fx")`` called with another batch and sequence length
    than its first call (Dynamo's default, automatic dynamic shapes): each shape is planned and
    runs, its loss the eager model's."""
    import torch

    import galvatron_fx as gfx

    torch._dynamo.reset()
    model, _ = hf_tiny.build("llama")
    cmodel = torch.compile(copy.deepcopy(model), backend="galvatron_fx",
                           options={"cluster": gfx.Cluster.local_cpu(world)})
    out = {}
    for n, seq in ((4, 16), (2, 32)):
        ids = torch.randint(1, hf_tiny.VOCAB, (n, seq), generator=torch.Generator().manual_seed(n))
        got, want = cmodel(input_ids=ids, labels=ids).loss.item(), model(input_ids=ids, labels=ids).loss.item()
        out[f"{n}x{seq}"] = abs(got - want) / abs(want)
    return out


def _coupled_case(world: int, cache: dict) -> dict:
    """CLIP's loss couples the samples of its batch: captured as coupled, a pipelined plan of
    two micro-batches is refused naming the coupling, and the search keeps one micro-batch."""
    import galvatron_fx as gfx
    from galvatron_fx.runtime.pipeline import PipelineModule

    model, mg = _captured("clip", 1, cache)
    res: dict = {"coupled": mg.coupled()}
    plan = make_plan(mg, world, (1, 1, "none", "none", "ddp"), gbs=4, m=2, name="clip-pp2", pp=2,
                     boundaries=(0, len(mg.layers) // 2), schedule="1f1b")
    try:
        PipelineModule(copy.deepcopy(model), mg, plan)
        res["refused"] = ""
    except gfx.PlanError as e:
        res["refused"] = str(e)
    found = gfx.plan(mg, gfx.Cluster.local_cpu(world), global_batch_size=8)
    res["searched_m"], res["notes"] = found.num_microbatches, list(found.notes)
    try:
        gfx.plan(mg, gfx.Cluster.local_cpu(world), global_batch_size=8, search={"num_microbatches": (2,)})
        res["asked_m2"] = ""
    except gfx.ConfigError as e:
        res["asked_m2"] = str(e)
    return res


def _clip_compiled(world: int) -> dict:
    """The search's own plan for CLIP (one micro-batch: the loss couples samples), by SGD."""
    import galvatron_fx as gfx

    model, batch = hf_tiny.build("clip")
    pm = gfx.compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), batch, global_batch_size=4,
                     search={"pp": (1,)})
    opt = _sgd(pm.parameters())
    res = _train(model, lambda b: pm.train_step(b, opt), _batches("clip", 4), optim=_sgd)
    res["m"] = pm.num_microbatches
    return _param_errors(res, pm.state_dict())


# ---- a custom op without a sharding rule, a scan along a sharded dim ------------------------------

def _custom_ops():
    """``gfx_test::gated`` (``gelu(x) * g``, a custom op DTensor knows nothing of), registered once
    per process with its fake and its autograd."""
    import torch
    import torch.nn.functional as F

    if hasattr(torch.ops, "gfx_test") and hasattr(torch.ops.gfx_test, "gated"):
        return torch.ops.gfx_test.gated

    @torch.library.custom_op("gfx_test::gated", mutates_args=(), schema="(Tensor x, Tensor g) -> Tensor")
    def gated(x, g):
        return F.gelu(x) * g

    @gated.register_fake
    def _(x, g):
        return torch.empty_like(x)

    def backward(ctx, grad):
        x, g = ctx.saved_tensors
        with torch.enable_grad():
            xx = x.detach().requires_grad_()
            y = F.gelu(xx)
            (dx,) = torch.autograd.grad(y, xx, grad * g)
        return dx, grad * y.detach()

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    gated.register_autograd(backward, setup_context=setup)
    return torch.ops.gfx_test.gated


def _small_model(kind: str):
    """Two blocks of ``Linear -> op -> Linear`` with a residual, a head and an MSE loss; ``op`` is
    the custom op (``"custom"``) or a cumulative sum over the features (``"cumsum"``)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    op = _custom_ops() if kind == "custom" else None

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)
            self.g = nn.Parameter(torch.rand(32) + 0.5)

        def forward(self, x):
            h = self.up(x)
            h = op(h, self.g.expand_as(h)) if op is not None else torch.cumsum(h, dim=-1) / 8.0
            return x + self.down(h)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 16)
            self.blocks = nn.ModuleList(Block() for _ in range(2))
            self.out = nn.Linear(16, 4)

        def forward(self, x, y):
            h = self.inp(x)
            for b in self.blocks:
                h = b(h)
            return F.mse_loss(self.out(h), y)

    torch.manual_seed(0)
    return Net()


def _small_case(kind: str, spec: str, world: int) -> dict:
    import torch

    import galvatron_fx as gfx
    from galvatron_fx.runtime.parallel_module import ParallelModule

    model = _small_model(kind)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(4, 6, 8, generator=g), torch.randn(4, 6, 4, generator=g)) for _ in range(3)]
    mg = gfx.capture(model, batches[0])
    plan = make_plan(mg, world, SPECS[spec], gbs=4, m=1, name=f"{kind}-{spec}")
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res = {"loss_rel": [], "step_s": [0.0]}
    for x, y in batches:
        got = pm.train_step((x, y), opt)
        loss = ref(x, y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        res["loss_rel"].append(abs(got - loss.item()) / abs(loss.item()))
    res["ref_sd"] = ref.state_dict()
    # where the op ran: every placement of its nodes at tp 2 is whole (the only strategy offered)
    res["op_placements"] = sorted({v for lp in plan.layers for k, v in lp.placements.items()
                                   if "gated" in k or "cumsum" in k})
    res["local"] = [lay.graphs.local for lay in pm.program.layers]
    return _param_errors(res, pm.state_dict())


def _build_failure_case(world: int) -> dict:
    """A pipeline stage whose layers cannot be built (planted in the last rank's lowering) is a
    ``PlanError`` on every rank, naming the error: no rank waits for the failed one."""
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx.runtime import pipeline

    model, batch = hf_tiny.build("gpt2")
    mg = gfx.capture(model, (), example_kwargs={k: v[:2] for k, v in batch.items()})
    plan = make_plan(mg, world, (world // 2, 1, "none", "none"), gbs=4, m=2, pp=2,
                     boundaries=(0, len(mg.layers) // 2), schedule="1f1b")
    real = pipeline.ParallelModule

    def failing(*args, **kwargs):
        if dist.get_rank() == world - 1:
            raise RuntimeError("planted lowering failure")
        return real(*args, **kwargs)

    pipeline.ParallelModule = failing
    t0 = time.perf_counter()
    try:
        pipeline.PipelineModule(copy.deepcopy(model), mg, plan)
        outcome = "no error"
    except gfx.PlanError as e:
        outcome = f"PlanError: {e}"
    finally:
        pipeline.ParallelModule = real
    dist.barrier()
    return {"outcome": outcome, "seconds": time.perf_counter() - t0}


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    import torch
    import transformers  # noqa: F401

    torch.manual_seed(0)
    cache: dict = {}
    cases = CASES2 if world == 2 else CASES4
    jobs = [(f"{f}/{s}", (lambda f=f, s=s: _case(f, s, world, cache))) for f, specs in cases.items() for s in specs]
    for f in COMPILED2 if world == 2 else COMPILED4:
        jobs.append((f"{f}/compiled", (lambda f=f: _clip_compiled(world) if f == "clip" else _compile_case(f, world))))
    if world == 2:
        jobs += [(f"{f}/backend", (lambda f=f: _backend_case(f, world))) for f in BACKEND2]
        jobs.append(("clip/coupled", lambda: _coupled_case(world, cache)))
        jobs.append(("llama/backend-shapes", lambda: _shapes_case(world)))
        jobs.append(("t5/pp2-decoder-cut", lambda: _pp_at_case("t5", 5, world, cache)))
        jobs += [(f"{k}/{s}", (lambda k=k, s=s: _small_case(k, s, world)))
                 for k, s in (("custom", "tp2"), ("custom", "zero3"), ("cumsum", "tp2"))]
        jobs.append(("build_failure", lambda: _build_failure_case(world)))
    run_jobs(rank, tmp, jobs, only_env="GFX_HF_CASES")


@pytest.fixture(scope="module")
def results2(tmp_path_factory):
    pytest.importorskip("transformers")
    return spawn(_worker, 2, tmp_path_factory.mktemp("hff2"))


@pytest.fixture(scope="module")
def results4(tmp_path_factory):
    pytest.importorskip("transformers")
    return spawn(_worker, 4, tmp_path_factory.mktemp("hff4"))


@pytest.mark.parametrize("family,spec", [(f, s) for f, specs in CASES2.items() for s in specs])
def test_family_trains_like_one_process(results2, family, spec):
    r = assert_ok(results2, f"{family}/{spec}")
    _check(r)
    if "runs_program" in r:  # the executors ran the lowered program, not a trace of their own
        assert r["runs_program"] and all(r["runs_program"]), (family, spec, r["runs_program"])


@pytest.mark.parametrize("family", COMPILED2)
def test_family_under_the_searched_plan_trains_like_one_process(results2, family):
    res = assert_ok(results2, f"{family}/compiled")
    _check(res)
    if family == "clip":
        assert res["m"] == 1, res


@pytest.mark.parametrize("family", BACKEND2)
def test_family_under_torch_compile_backend_trains_like_one_process(results2, family):
    res = assert_ok(results2, f"{family}/backend")
    _check(res)
    assert res["logits_err"] < 1e-5, res


def test_a_pipeline_cut_between_decoder_blocks_trains_like_one_process(results2):
    _check(assert_ok(results2, "t5/pp2-decoder-cut"))


def test_the_backend_runs_a_new_batch_and_sequence_length(results2):
    res = assert_ok(results2, "llama/backend-shapes")
    assert res["4x16"] < 1e-5 and res["2x32"] < 1e-5, res


def test_a_loss_that_couples_samples_keeps_one_micro_batch(results2):
    res = assert_ok(results2, "clip/coupled")
    assert "head" in res["coupled"], res
    assert "couples samples" in res["refused"] and "micro-batches" in res["refused"], res
    assert res["searched_m"] == 1 and any("couples samples" in n for n in res["notes"]), res
    assert "couples samples" in res["asked_m2"] and "num_microbatches=(1,)" in res["asked_m2"], res


@pytest.mark.parametrize("kind,spec", [("custom", "tp2"), ("custom", "zero3"), ("cumsum", "tp2")])
def test_an_op_without_a_rule_or_a_scan_trains_like_one_process(results2, kind, spec):
    res = assert_ok(results2, f"{kind}/{spec}")
    _check(res)
    if spec == "tp2" and kind == "custom":  # its only strategy: inputs gathered, the op run whole
        assert res["op_placements"] and all(p == "R,R->R" for p in res["op_placements"]), res
    elif spec == "tp2":  # never split along the scanned (last) dim
        assert res["op_placements"] and not any("S(2)" in p for p in res["op_placements"]), res
    else:  # ZeRO-3 at tp 1: every layer as plain local ops, but the loss (a mean over the samples)
        assert all(res["local"][:-1]) and not res["local"][-1], res


def test_a_pipeline_stage_that_cannot_be_built_is_an_error_on_every_rank(results2):
    for rank in (0, 1):
        res = results2[rank]["build_failure"]
        assert "error" not in res, res
        assert res["outcome"].startswith("PlanError") and "planted lowering failure" in res["outcome"], res
        assert res["seconds"] < 60, res


@pytest.mark.slow
@pytest.mark.parametrize("family,spec", [(f, s) for f, specs in CASES4.items() for s in specs])
def test_family_trains_like_one_process_at_world_4(results4, family, spec):
    _check(assert_ok(results4, f"{family}/{spec}"))


@pytest.mark.slow
@pytest.mark.parametrize("family", COMPILED4)
def test_family_under_the_searched_plan_at_world_4(results4, family):
    _check(assert_ok(results4, f"{family}/compiled"))
