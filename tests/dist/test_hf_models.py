"""Hugging Face models train under planned strategies like the same model in one process.

Spawned once per world size; every rank runs every case. Per case: a tiny ``transformers``
model built from a config (``hf_tiny``), its batch passed by name as a Hugging Face loop passes
it (labels included: the model computes its own loss), 3 AdamW steps of ``train_step`` against a
plain copy: every step's loss within 1e-5 relative, every parameter within 1e-4 after the steps
(fp32). Strategies are hand-made plans (``make_plan``: the ILP's memory-lean placements, every
matrix weight sharded at tp > 1) and the plan ``compile()`` searches itself; the loss path
``loss_fn=`` on the model's logits is checked too.
"""

from __future__ import annotations

import copy
import time

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_parallel_module import make_plan

import hf_tiny

LOSS_RTOL = 1e-5
PARAM_TOL = 1e-4
STEPS = 3

# strategy -> (dp, tp, sp, recompute, dp_type) at world 2 (every layer alike)
SPECS = {
    "dp2": (2, 1, "none", "none", "ddp"),
    "tp2": (1, 2, "none", "none", "ddp"),
    "tp2-sp": (1, 2, "megatron", "none", "ddp"),
    "dp2-full": (2, 1, "none", "full", "ddp"),
    "tp2-selective": (1, 2, "none", "selective", "ddp"),
    "zero2": (2, 1, "none", "none", "zero2"),
    "zero3": (2, 1, "none", "none", "zero3"),
}
# Not yet: Megatron sequence parallelism for blocks whose output is made by an op that cannot
# produce a sequence-sharded layout (OPT's block ends in a view from (B*T, C); T5's blocks return
# their position bias too): the placement ILP forbids those outputs instead of paying a reshard.
SKIP = {("opt", "tp2-sp"), ("t5", "tp2-sp")}
CASES = {2: [(f, s) for f in hf_tiny.FAMILIES for s in SPECS if (f, s) not in SKIP]}


def _train(model, run_step, batches) -> dict:
    """``run_step(batch) -> loss`` for 3 steps against a plain copy of ``model`` with AdamW."""
    import torch

    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res = {"loss_rel": [], "step_s": []}
    for b in batches:
        t0 = time.perf_counter()
        got = run_step(b)
        res["step_s"].append(time.perf_counter() - t0)
        want = ref(**b).loss
        want.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        res["loss_rel"].append(abs(got - want.item()) / abs(want.item()))
    res["ref_sd"] = ref.state_dict()
    return res


def _param_errors(res: dict, sd: dict) -> dict:
    ref_sd = res.pop("ref_sd")
    errs = {k: (sd[k] - v).abs().max().item() for k, v in ref_sd.items() if k in sd}
    res["param_err"] = max(errs.values())
    res["param_err_at"] = max(errs, key=errs.get)
    res["missing"] = sorted(set(ref_sd) - set(sd))
    res["step_s"] = sorted(res["step_s"])[len(res["step_s"]) // 2]
    return res


def _batches(family: str, n: int) -> list[dict]:
    return [hf_tiny.batch(family, n, seed=10 + i) for i in range(STEPS)]


def _plan_case(family: str, spec: str, world: int, cache: dict) -> dict:
    import torch

    import galvatron_fx as gfx
    from galvatron_fx.runtime.parallel_module import ParallelModule

    if family not in cache:
        model, batch = hf_tiny.build(family)
        cache[family] = (model, gfx.capture(model, (), example_kwargs=batch))
    model, mg = cache[family]
    dp, tp, sp, rc, dpt = SPECS[spec]
    plan = make_plan(mg, world, (dp, tp, sp, rc, dpt), gbs=4, m=1, name=f"{family}-{spec}")
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    res = _train(model, lambda b: pm.train_step(b, opt), _batches(family, 4))
    return _param_errors(res, pm.state_dict())


def _compile_case(family: str, world: int) -> dict:
    """The plan ``compile()`` searches (on rank 0, broadcast), two micro-batches of a batch of 8."""
    import torch

    import galvatron_fx as gfx

    model, batch = hf_tiny.build(family)
    pm = gfx.compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), batch, global_batch_size=8,
                     search={"pp": (1,), "num_microbatches": (2,)})
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)

    res = {"plan": [f"dp{lp.dp} tp{lp.strategy.tp} {lp.strategy.dp_type} {lp.strategy.recompute}"
                    for lp in pm.plan.layers]}
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res["loss_rel"] = []
    for b in _batches(family, 8):
        got = pm.train_step(b, opt)
        want = 0.0
        for half in (0, 1):
            loss = ref(**{k: v.chunk(2)[half] for k, v in b.items()}).loss
            (loss / 2).backward()
            want += loss.item() / 2
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        res["loss_rel"].append(abs(got - want) / abs(want))
    res["ref_sd"] = ref.state_dict()
    res["step_s"] = [0.0]
    return _param_errors(res, pm.state_dict())


def _loss_fn_case(family: str, world: int) -> dict:
    """``loss_fn=`` on the logits of a model called without labels (target last, positional)."""
    import torch
    import torch.nn.functional as F

    import galvatron_fx as gfx

    model, batch = hf_tiny.build(family)

    def loss_fn(out, target):
        return F.cross_entropy(out.logits.flatten(0, 1), target.flatten())

    ids = batch["input_ids"]
    pm = gfx.compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), (ids, ids.roll(-1, 1)), loss_fn=loss_fn,
                     global_batch_size=4, search={"pp": (1,), "tp": (2,)} if world == 2 else {"pp": (1,)})
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res = {"loss_rel": [], "plan": [f"dp{lp.dp} tp{lp.strategy.tp}" for lp in pm.plan.layers]}
    for b in _batches(family, 4):
        x, y = b["input_ids"], b["input_ids"].roll(-1, 1)
        got = pm.train_step((x, y), opt)
        want = loss_fn(ref(x), y)
        want.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        res["loss_rel"].append(abs(got - want.item()) / abs(want.item()))
    res["ref_sd"] = ref.state_dict()
    res["step_s"] = [0.0]
    return _param_errors(res, pm.state_dict())


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    import torch

    torch.manual_seed(0)
    cache: dict = {}
    jobs = [(f"{f}/{s}", (lambda f=f, s=s: _plan_case(f, s, world, cache))) for f, s in CASES[world]]
    jobs += [(f"{f}/compiled", (lambda f=f: _compile_case(f, world))) for f in ("gpt2", "llama", "vit")]
    jobs += [(f"{f}/loss_fn", (lambda f=f: _loss_fn_case(f, world))) for f in ("gpt2", "qwen2")]
    run_jobs(rank, tmp, jobs, only_env="GFX_HF_CASES")


@pytest.fixture(scope="module")
def results2(tmp_path_factory):
    pytest.importorskip("transformers")
    return spawn(_worker, 2, tmp_path_factory.mktemp("hf2"))


def _check(res: dict) -> None:
    assert max(res["loss_rel"]) < LOSS_RTOL, res
    assert res["param_err"] < PARAM_TOL, res
    assert not res["missing"], res


@pytest.mark.parametrize("family,spec", CASES[2])
def test_hf_family_trains_like_one_process(results2, family, spec):
    _check(assert_ok(results2, f"{family}/{spec}"))


@pytest.mark.parametrize("family", ["gpt2", "llama", "vit"])
def test_hf_compiled_plan_trains_like_one_process(results2, family):
    res = assert_ok(results2, f"{family}/compiled")
    _check(res)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_hf_loss_fn_on_logits_trains_like_one_process(results2, family):
    res = assert_ok(results2, f"{family}/loss_fn")
    _check(res)
    assert any("tp2" in p for p in res["plan"]), res["plan"]  # the tp cap is a real tensor-parallel plan
