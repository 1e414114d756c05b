"""PipelineModule on real gloo ranks: pipelined plans train like the single-process model.

Spawned once per world size; every rank runs every case. Per case: the mean loss of each of
``STEPS`` AdamW steps, every gradient this rank holds after the first step's backward (full
tensors, against the plain model's), and all parameters after the last step, against the plain
model trained on the same batches (fp32). World 8 (pp2 × dp2 × tp2) is marked slow.
"""

from __future__ import annotations

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_parallel_module import (
    LOOP_STEPS,
    PARAM_TOL,
    STEPS,
    TOL,
    _batches,
    build,
    check_user_loop,
    compare_user_loop,
    make_plan,
)

Z3 = (2, 1, "none", "none", "zero3")
Z2 = (2, 1, "none", "none", "zero2")
DP = (2, 1, "none", "none")

# name -> (model, global batch, micro-batches, schedule, chunk starts, per-layer spec or one spec)
# gpt-tiny's layers: embedding, blocks.0-3, head, loss
CASES = {
    2: {
        "pp2-1f1b": ("gpt-tiny", 8, 4, "1f1b", (0, 4), (1, 1, "none", "none")),
        "pp2-gpipe-recompute": ("gpt-tiny", 8, 2, "gpipe", (0, 3), (1, 1, "none", "full")),
        "pp2-interleaved": ("gpt-tiny", 8, 4, "interleaved_1f1b", (0, 2, 4, 6), (1, 1, "none", "none")),
        "llama-pp2-1f1b": ("llama-tiny", 4, 2, "1f1b", (0, 3), (1, 1, "none", "none")),
    },
    4: {
        "pp2dp2-mixed-zero": ("gpt-tiny", 8, 2, "1f1b", (0, 4), [DP, Z3, Z2, (2, 1, "none", "full"), DP, Z3, DP]),
        "pp2tp2-sp": ("gpt-tiny", 4, 2, "1f1b", (0, 4), (1, 2, "megatron", "none")),
        # four one-device nodes with a slow link 0-1: stages on nodes {0, 2} and {1, 3}
        "pp2dp2-off-a-slow-link": ("gpt-tiny", 8, 2, "1f1b", (0, 4), [DP, Z3, DP, (2, 1, "none", "full"), DP, DP, DP]),
    },
    8: {
        "pp2dp2tp2": ("gpt-tiny", 8, 2, "1f1b", (0, 4), [(2, 2, "none", "none"), (2, 2, "none", "none", "zero3"),
                                                          (2, 2, "megatron", "none"), (4, 1, "none", "none"),
                                                          (2, 2, "none", "full"), (2, 2, "none", "none"),
                                                          (4, 1, "none", "none")]),
    },
}


# stage ranks other than contiguous blocks (the planner's topology-aware layouts)
LAYOUTS = {"pp2dp2-off-a-slow-link": ((0, 2), (1, 3))}


def _stage_of(key: str, rank: int, world: int) -> int:
    layout = LAYOUTS.get(key)
    return next(s for s, r in enumerate(layout) if rank in r) if layout else rank // (world // 2)


def _case(key: str, world: int, cache: dict) -> dict:
    import copy

    import torch

    from galvatron_fx.runtime.pipeline import PipelineModule

    name, gbs, m, schedule, bounds, spec = CASES[world][key]
    if (name, gbs // m) not in cache:
        cache[(name, gbs // m)] = build(name, gbs // m)
    model, mg, _ = cache[(name, gbs // m)]
    plan = make_plan(mg, world, spec, gbs=gbs, m=m, name=key, pp=2, boundaries=bounds, schedule=schedule)
    if key in LAYOUTS:
        import dataclasses

        plan = dataclasses.replace(plan, stage_ranks=LAYOUTS[key])
    pm = PipelineModule(copy.deepcopy(model), mg, plan)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res: dict = {"loss_errs": [], "losses": []}
    for step, batch in enumerate(_batches(gbs, STEPS)):
        total = 0.0
        for i in range(m):
            loss = ref(*(x.chunk(m)[i] for x in batch))
            (loss / m).backward()
            total += loss.item()
        if step == 0:  # gradients first, then the same step's update
            got = pm.train_step(batch, None)
            ref_grads = {k: p.grad for k, p in ref.named_parameters()}
            errs, held = {}, set()
            for ch in pm.chunks:
                for ex in ch.body.executors:
                    for k, fqn in ex.fqn_of_key.items():
                        g = ex.full_grad(k)
                        if g is not None:
                            held.add(fqn)
                            errs[fqn] = max(errs.get(fqn, 0.0), (g - ref_grads[fqn]).abs().max().item())
            res["grad_err"] = max(errs.values())
            res["grad_err_at"] = max(errs, key=errs.get)
            res["grads_held"] = sorted(held)
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            got = pm.train_step(batch, opt)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        res["losses"].append(got)
        res["loss_errs"].append(abs(got - total / m))
    state = pm.state_dict()
    ref_state = ref.state_dict()
    res["missing_keys"] = sorted(set(ref_state) - set(state))
    diffs = {k: (state[k] - v).abs().max().item() for k, v in ref_state.items() if k in state}
    res["param_err"] = max(diffs.values())
    res["param_err_at"] = max(diffs, key=diffs.get)
    res["param_moved"] = max((v - model.state_dict()[k]).abs().max().item() for k, v in ref_state.items()
                             if v.is_floating_point())
    res["stage"] = pm.stage
    res["chunks"] = len(pm.chunks)
    return res


# the user-owned loop on pipelined plans: a weight tied across the two stages (gpt-tiny's
# embedding and head), interleaved chunks, ZeRO and recompute inside a stage, tp 2 with SP
LOOP_CASES = {2: ("pp2-1f1b", "pp2-interleaved", "accum-pp2-1f1b"), 4: ("pp2dp2-mixed-zero", "pp2tp2-sp", "local-pp2dp2-mixed-zero")}


def _loop_case(key: str, world: int, cache: dict) -> dict:
    import copy

    import torch

    from galvatron_fx.errors import ConfigError, PlanError
    from galvatron_fx.runtime.pipeline import PipelineModule

    local, accum = key.startswith("local-"), key.startswith("accum-")
    key = key.removeprefix("local-").removeprefix("accum-")
    name, gbs, m, schedule, bounds, spec = CASES[world][key]
    if (name, gbs // m) not in cache:
        cache[(name, gbs // m)] = build(name, gbs // m)
    model, mg, _ = cache[(name, gbs // m)]
    plan = make_plan(mg, world, spec, gbs=gbs, m=m, name=key, pp=2, boundaries=bounds, schedule=schedule)
    pm = PipelineModule(copy.deepcopy(model), mg, plan)
    res = compare_user_loop(model, pm, _batches(gbs, LOOP_STEPS), m, local=local, accumulate=2 if accum else 1)
    try:  # a loop written for DDP cannot drive a pipeline's schedule: told what to call instead
        pm(*_batches(gbs, 1)[0]).backward()
        res["call_error"] = "no error"
    except PlanError as e:
        res["call_error"] = str(e)
    try:  # a longer sequence than captured needs memory the plan did not price: refused on every rank
        share = tuple(x.chunk(pm.data_parallel_size)[pm.data_parallel_rank] if local else x for x in _batches(gbs, 1)[0])
        pm.forward_backward(tuple(torch.cat([x, x], dim=1) for x in share))
        res["shape_error"] = "no error"
    except ConfigError as e:
        res["shape_error"] = str(e)
    return res


def _errors_case(world: int, cache: dict) -> dict:
    """A plan whose stages do not split the ranks evenly, or that puts stage 0 above stage 1, is
    refused on every rank."""
    import dataclasses

    from galvatron_fx.errors import PlanError
    from galvatron_fx.runtime.pipeline import PipelineModule

    model, mg, _ = cache.get(("gpt-tiny", 4)) or build("gpt-tiny", 4)
    plan = make_plan(mg, world, (1, 1, "none", "none"), gbs=8, m=2, pp=2, boundaries=(0, 4))
    out = {}
    uneven = dataclasses.replace(plan)
    object.__setattr__(uneven, "stage_ranks", ((0, 1), ()))  # (the plan's own checks refuse it when built)
    swapped = dataclasses.replace(plan, stage_ranks=tuple(reversed(plan.stage_ranks)))
    for name, bad in (("uneven", uneven), ("swapped", swapped)):
        try:
            PipelineModule(model, mg, bad)
            out[name] = ""
        except PlanError as e:
            out[name] = str(e)
    return out


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    cache: dict = {}
    jobs = [(key, lambda key=key: _case(key, world, cache)) for key in CASES[world]]
    jobs += [(f"loop-{key}", lambda key=key: _loop_case(key, world, cache)) for key in LOOP_CASES.get(world, ())]
    if world == 2:
        jobs.append(("errors", lambda: _errors_case(world, cache)))
    run_jobs(rank, tmp, jobs, only_env="GFX_PP_ONLY")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("pp2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("pp4"))


@pytest.fixture(scope="module")
def world8(tmp_path_factory) -> dict:
    return spawn(_worker, 8, tmp_path_factory.mktemp("pp8"))


def _check(results: dict, key: str, world: int) -> None:
    r = assert_ok(results, key)
    for rank, by_case in results.items():
        c = by_case[key]
        assert c["stage"] == _stage_of(key, rank, world)
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ by {c['loss_errs']}"
        assert c["grad_err"] <= TOL, f"rank {rank}: gradients differ by {c['grad_err']} at {c['grad_err_at']}"
        assert c["param_err"] <= PARAM_TOL, f"rank {rank}: parameters differ by {c['param_err']} at {c['param_err_at']}"
        assert c["missing_keys"] == [], f"state_dict lacks {c['missing_keys']}"
    # every parameter's gradient is held by some stage
    held = set().union(*(set(by_case[key]["grads_held"]) for by_case in results.values()))
    assert any(k.startswith("blocks.0") for k in held) and any(k.startswith("blocks.3") for k in held)
    assert set(results[0][key]["grads_held"]) != held, "stage 0 holds every parameter: no pipeline split"
    assert r["param_moved"] > 10 * PARAM_TOL, "the optimizer did not move the parameters: the test cannot fail"


@pytest.mark.parametrize("key", list(CASES[2]))
def test_world2_pipeline_trains_like_one_process(world2, key):
    _check(world2, key, 2)
    if "interleaved" in key:
        assert world2[0][key]["chunks"] == 2


@pytest.mark.parametrize("key", list(CASES[4]))
def test_world4_pipeline_trains_like_one_process(world4, key):
    _check(world4, key, 4)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CASES[8]))
def test_world8_pipeline_trains_like_one_process(world8, key):
    _check(world8, key, 8)


@pytest.mark.parametrize("world,key", [(w, k) for w, ks in LOOP_CASES.items() for k in ks])
def test_the_user_owned_loop_clips_and_schedules_pipelines_like_one_process(request, world, key):
    """forward_backward + clip_grad_norm_ over both stages + AdamW + warmup-cosine LambdaLR."""
    results = request.getfixturevalue(f"world{world}")
    assert_ok(results, f"loop-{key}")
    check_user_loop(results, f"loop-{key}")
    for by_case in results.values():
        assert "pm.forward_backward(batch)" in by_case[f"loop-{key}"]["call_error"], by_case[f"loop-{key}"]["call_error"]
        assert "larger than this plan runs" in by_case[f"loop-{key}"]["shape_error"], \
            by_case[f"loop-{key}"]["shape_error"]


def test_stages_the_pipeline_cannot_run_are_refused(world2):
    for rank in world2:
        r = assert_ok({0: world2[rank]}, "errors")
        assert "do not split the 2 ranks into 2 stages of 1" in r["uneven"] and "re-plan" in r["uneven"]
        # stage 0 on rank 1: torch.distributed.pipelining runs stage s on its group's rank s
        assert "must ascend" in r["swapped"] and "re-plan" in r["swapped"]
