"""Per-layer CPU offload (``LayerStrategy.offload``) on real gloo ranks, against one process.

One spawn at world 2 and one at world 4 (dp2 × tp2 layers, and tp4 layers at dp 1). Plans mix
offloaded DDP layers (host masters, device working copies), offloaded ZeRO-2/ZeRO-3 layers
(FSDP2's ``CPUOffloadPolicy``) and layers without offload, on gpt-tiny (its tied embedding/head
offloaded alike or one of them only) and on a Hugging Face Llama built from a config. Per plan
(fp32, AdamW): every step's loss, the first step's synced gradients and the parameters after
``STEPS`` steps against the single-process model within the ZeRO/DDP runtime tests' tolerances,
and bit for bit against the same plan without offload (on CPU host and device are one: the
working copies change where tensors live, not one rounding). Where state lives: the optimizer
holds the host masters (never a working copy), their states match the masters', working copies
share no storage with them and hold no gradient after the sync; offloaded FSDP units (only those)
run FSDP's offload. Checkpoints: saved after two steps under an offloaded plan and resumed under a
plan without offload in another layout, and the reverse, into modules built from other weights;
the resumed steps' losses equal the uninterrupted run's. ``GFX_OFFLOAD_ONLY=case,case`` selects
cases.
"""

from __future__ import annotations

import hf_tiny
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
    compare_training,
    compare_user_loop,
    make_plan,
)

N, Y = "none", True  # spec shorthand: no sp / no recompute; offload on

# name -> (global batch, num_microbatches, spec for [embedding, blocks.0-3, head, loss], exact):
# spec (dp, tp, sp, recompute, dp_type[, offload]); exact: bit for bit the plan without offload
# (not where the tied embedding/head are ZeRO-3 units that differ in offload: without offload one
# unit, whose parameter's two uses autograd sums before the reduce-scatter; with, two units whose
# reduce-scattered gradients the sync sums: another order of the same four terms)
CASES = {
    2: {
        # the tied embedding/head both offloaded under DDP (one master); ZeRO-3 and ZeRO-2 offloaded
        "gpt-mixed": (4, 1, [(2, 1, N, N, "ddp", Y), (2, 1, N, N, "zero3", Y), (2, 1, N, N, "ddp"),
                             (2, 1, N, N, "zero2", Y), (2, 1, N, N, "zero3"), (2, 1, N, N, "ddp", Y),
                             (2, 1, N, N, "ddp")], True),
        # gradient accumulation over 2 micro-batches, with full recompute in an offloaded ZeRO-3 block
        "gpt-m2": (8, 2, [(2, 1, N, N, "ddp", Y), (2, 1, N, N, "ddp", Y), (2, 1, N, "full", "zero3", Y),
                          (2, 1, N, N, "zero2", Y), (2, 1, N, N, "ddp"), (2, 1, N, N, "ddp", Y),
                          (2, 1, N, N, "ddp")], True),
        # the tied weight offloaded in one DDP layer only: two copies, summed in one bucket entry
        # (exact all the same: a sum of two is the same in either order)
        "gpt-ddp-tied-split": (4, 1, [(2, 1, N, N, "ddp"), (2, 1, N, N, "zero3", Y), (2, 1, N, N, "ddp", Y),
                                      (2, 1, N, N, "ddp"), (2, 1, N, N, "ddp", Y), (2, 1, N, N, "ddp", Y),
                                      (2, 1, N, N, "ddp")], True),
        # the tied weight in two ZeRO-3 units that differ in offload (never one unit)
        "gpt-zero-tied-split": (4, 1, [(2, 1, N, N, "zero3", Y), (2, 1, N, N, "zero3"), (2, 1, N, N, "ddp", Y),
                                       (2, 1, N, N, "zero2"), (2, 1, N, N, "zero3", Y), (2, 1, N, N, "zero3"),
                                       (2, 1, N, N, "ddp")], False),
    },
    4: {
        "gpt-dp2tp2": (4, 1, [(2, 2, N, N, "ddp", Y), (2, 2, N, N, "zero3", Y), (2, 2, N, N, "ddp"),
                              (1, 4, N, N, "zero3", Y), (2, 2, "megatron", N, "zero2", Y), (2, 2, N, N, "ddp", Y),
                              (2, 2, N, N, "ddp")], True),
        "gpt-dp2tp2-m2": (8, 2, [(4, 1, N, N, "ddp", Y), (2, 2, N, N, "ddp", Y), (2, 2, N, N, "zero2", Y),
                                 (2, 2, N, "full", "zero3", Y), (2, 2, N, N, "ddp"), (1, 4, N, N, "ddp", Y),
                                 (2, 2, N, N, "ddp")], True),
    },
}
HF_STEPS = 4
# the resume check: plans (offloaded, not offloaded in another layout) per world
RESUME = {
    2: ([(2, 1, N, N, "ddp", Y), (2, 1, N, N, "zero3", Y), (2, 1, N, N, "zero2", Y), (2, 1, N, N, "ddp", Y),
         (2, 1, N, N, "zero3"), (2, 1, N, N, "ddp", Y), (2, 1, N, N, "ddp")],
        [(2, 1, N, N, "zero3"), (2, 1, N, N, "ddp"), (2, 1, N, N, "ddp"), (2, 1, N, N, "zero2"),
         (2, 1, N, N, "ddp"), (2, 1, N, N, "zero2"), (2, 1, N, N, "ddp")]),
    4: ([(2, 2, N, N, "ddp", Y), (2, 2, N, N, "zero3", Y), (1, 4, N, N, "ddp", Y), (2, 2, N, N, "zero2", Y),
         (4, 1, N, N, "zero3", Y), (2, 2, N, N, "ddp", Y), (2, 2, N, N, "ddp")],
        [(4, 1, N, N, "ddp"), (2, 2, N, N, "ddp"), (2, 2, N, N, "zero3"), (4, 1, N, N, "zero2"),
         (2, 2, N, N, "ddp"), (4, 1, N, N, "ddp"), (4, 1, N, N, "ddp")]),
}
RESUME_AT, RESUME_STEPS = 2, 4
# world 2, pp 2 (chunks [0, 4), [4, 7)), 1F1B over 4 micro-batches: the tied embedding/head offloaded
# on both stages (summed across them after each stage's sync moved its gradient to the host), a
# ZeRO-3 block at dp 1 offloaded as a DDP one
PIPELINE = [(1, 1, N, N, "ddp", Y), (1, 1, N, N, "zero3", Y), (1, 1, N, N, "ddp"), (1, 1, N, N, "ddp", Y),
            (1, 1, N, N, "ddp"), (1, 1, N, N, "ddp", Y), (1, 1, N, N, "ddp")]


def _without_offload(spec: list) -> list:
    return [tuple(s[:5]) for s in spec]


def _placement_report(pm, opt) -> dict:
    """Where the offloaded layers' state lives (see module doc)."""
    import torch

    res = {"master_ok": True, "not_in_optimizer": True, "states_ok": True, "shares_storage": False,
           "working_grads_left": 0, "fsdp_offload": [], "want_fsdp_offload": [], "num_masters": 0}
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    for lp, ex in zip(pm.plan.layers, pm.executors):
        fsdp_off = None
        if ex.fsdp:
            fsdp_off = all(fp.offload_to_cpu for fp in ex._get_fsdp_state()._fsdp_param_group.fsdp_params)
        res["fsdp_offload"].append(fsdp_off)
        res["want_fsdp_offload"].append(lp.strategy.offload if ex.fsdp else None)
        if ex.fsdp:
            assert not ex._offloaded, lp.name
            continue
        if lp.strategy.offload != (set(ex._offloaded) == set(ex.params.keys())) and len(ex.params):
            res["master_ok"] = False
    for w in pm._working:
        res["num_masters"] += 1
        m, c = w.master, w.copy
        res["master_ok"] &= m.device.type == "cpu" and id(m) in in_opt and m.dtype == torch.float32
        res["not_in_optimizer"] &= id(c) not in in_opt and c not in opt.state
        res["shares_storage"] |= m.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
        res["working_grads_left"] += c.grad is not None
        st = opt.state.get(m, {})
        res["states_ok"] &= bool(st) and all(v.device.type == "cpu" and v.shape == m.shape
                                             for k, v in st.items() if k != "step")
    return res


def _train(model, mg, plan, batches, m: int):
    """``plan``'s module trained over ``batches`` (train_step, AdamW lr 1e-3): (losses, state)."""
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule

    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    return [pm.train_step(b, opt) for b in batches], pm.state_dict()


def _case(key: str, world: int, cache: dict) -> dict:
    import copy

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs, m, spec, exact = CASES[world][key]
    if gbs // m not in cache:
        cache[gbs // m] = build("gpt-tiny", gbs // m)
    model, mg, _ = cache[gbs // m]
    plan = make_plan(mg, world, spec, gbs=gbs, m=m, name=key)
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    batches = _batches(gbs, STEPS)
    seen: dict = {}

    def first_grads(res: dict) -> None:  # after the first sync: gradients are on the masters
        seen["working_grads"] = sum(w.copy.grad is not None for w in pm._working)
        seen["master_grads"] = sum(w.master.grad is not None for w in pm._working)

    res, _, opt = compare_training(model, pm, batches, m, on_first_grads=first_grads)
    res |= {f"first_{k}": v for k, v in seen.items()}
    res |= _placement_report(pm, opt)
    # the same plan without offload: bit for bit
    losses, sd = _train(model, mg, make_plan(mg, world, _without_offload(spec), gbs=gbs, m=m, name=key), batches, m)
    got_losses, got_sd = _train(model, mg, plan, batches, m)
    res["exact_loss_diff"] = max(abs(a - b) for a, b in zip(losses, got_losses))
    res["exact_param_diff"] = max((sd[k] - v).abs().max().item() for k, v in got_sd.items())
    res["exact"] = exact
    return res


def _hf_case(world: int) -> dict:
    """A Hugging Face Llama from a config, layers offloaded under DDP, ZeRO-2 and ZeRO-3 in turn."""
    import copy

    import torch

    import galvatron_fx as gfx
    from galvatron_fx.runtime.parallel_module import ParallelModule

    model, batch = hf_tiny.build("llama")
    mg = gfx.capture(model, (), example_kwargs={k: v[:4] for k, v in batch.items()})
    assert mg.batch_scaling is not None  # (the capture's probe: masks split on dp where read)
    dp, tp = (2, 1) if world == 2 else (2, 2)
    # embedding, blocks 0-1, norm and head, loss
    assert [layer.role for layer in mg.layers][1:3] == ["block", "block"] and len(mg.layers) == 5, mg.layers
    spec = [(dp, tp, N, N, "ddp"), (dp, tp, N, N, "ddp", Y), (dp, tp, N, N, "zero3", Y), (dp, tp, N, N, "zero2", Y),
            (dp, tp, N, N, "ddp")]
    plan = make_plan(mg, world, spec, gbs=4, m=1, name="llama-offload")
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    errs = []
    for i in range(HF_STEPS):
        b = hf_tiny.batch("llama", 4, seed=10 + i)
        got = pm.train_step(b, opt)
        loss = ref(**b).loss
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        errs.append(abs(got - loss.item()))
    sd, ref_sd = pm.state_dict(), ref.state_dict()
    res = {"loss_errs": errs, "param_err": max((sd[k] - v).abs().max().item() for k, v in ref_sd.items() if k in sd),
           "param_moved": max((v - model.state_dict()[k]).abs().max().item() for k, v in ref_sd.items()),
           "offloaded": [lp.strategy.offload for lp in plan.layers],
           "dp_types": [str(lp.strategy.dp_type) for lp in plan.layers]}
    res |= _placement_report(pm, opt)
    # the same plan without offload: bit for bit
    batches = [hf_tiny.batch("llama", 4, seed=10 + i) for i in range(HF_STEPS)]
    plain = make_plan(mg, world, _without_offload(spec), gbs=4, m=1, name="llama-plain")
    (want, want_sd), (got, got_sd) = (_train(model, mg, pl, batches, 1) for pl in (plain, plan))
    res["exact_loss_diff"] = max(abs(a - b) for a, b in zip(want, got))
    res["exact_param_diff"] = max((want_sd[k] - v).abs().max().item() for k, v in got_sd.items())
    return res


def _resume(world: int, tmp: str) -> dict:
    """Save after RESUME_AT steps under one plan, resume under the other (both ways); the resumed
    steps' losses and the final parameters against the uninterrupted run of the saving plan."""
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs = 4
    model, mg, _ = build("gpt-tiny", gbs)
    other, _, _ = build("gpt-tiny", gbs, seed=7)  # a resumed module starts from other weights
    batches = _batches(gbs, RESUME_STEPS)
    off, plain = (make_plan(mg, world, s, gbs=gbs, m=1, name=n) for s, n in zip(RESUME[world], ("off", "plain")))
    res: dict = {}
    for tag, save_plan, load_plan in (("off_to_plain", off, plain), ("plain_to_off", plain, off)):
        pm = ParallelModule(copy.deepcopy(model), mg, save_plan)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        want = []
        for i, b in enumerate(batches):
            if i == RESUME_AT:
                pm.save(f"{tmp}/{tag}", opt, step=i)
            want.append(pm.train_step(b, opt))
        want_sd = pm.state_dict()
        pm2 = ParallelModule(copy.deepcopy(other), mg, load_plan)
        opt2 = torch.optim.AdamW(pm2.parameters(), lr=1e-3)
        first = pm2.train_step(batches[0], opt2)  # a step on the other weights first: state to replace
        loaded = pm2.load(f"{tmp}/{tag}", opt2)
        got = [pm2.train_step(b, opt2) for b in batches[RESUME_AT:]]
        sd = pm2.state_dict()
        res[f"{tag}_loss_errs"] = [abs(a - b) for a, b in zip(got, want[RESUME_AT:])]
        res[f"{tag}_param_err"] = max((sd[k] - v).abs().max().item() for k, v in want_sd.items())
        res[f"{tag}_resharded"] = loaded.resharded
        res[f"{tag}_step"] = loaded.step
        res[f"{tag}_other_start"] = abs(first - want[0])  # the other weights really differ
    return res


def _pipeline_case() -> dict:
    """The PIPELINE plan against one process and, bit for bit, against itself without offload."""
    import copy

    import torch

    from galvatron_fx.runtime.pipeline import PipelineModule

    gbs, m = 8, 4
    model, mg, _ = build("gpt-tiny", gbs // m)
    batches = _batches(gbs, STEPS)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    want = []
    for batch in batches:
        total = 0.0
        for i in range(m):
            loss = ref(*(x.chunk(m)[i] for x in batch))
            (loss / m).backward()
            total += loss.item()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        want.append(total / m)
    ref_sd = ref.state_dict()
    runs = {}
    for tag, spec in (("off", PIPELINE), ("plain", _without_offload(PIPELINE))):
        plan = make_plan(mg, 2, spec, gbs=gbs, m=m, name=tag, pp=2, boundaries=(0, 4), schedule="1f1b")
        pm = PipelineModule(copy.deepcopy(model), mg, plan)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        runs[tag] = ([pm.train_step(b, opt) for b in batches], pm.state_dict(), pm)
    got, sd, pm = runs["off"]
    return {"loss_errs": [abs(a - b) for a, b in zip(got, want)],
            "param_err": max((sd[k] - v).abs().max().item() for k, v in ref_sd.items()),
            "exact_loss_diff": max(abs(a - b) for a, b in zip(got, runs["plain"][0])),
            "exact_param_diff": max((runs["plain"][1][k] - v).abs().max().item() for k, v in sd.items()),
            "num_masters": sum(len(ch.body._working) for ch in pm.chunks),
            "masters_on_host": all(w.master.device.type == "cpu" for ch in pm.chunks for w in ch.body._working)}


# the user-owned loop with offloaded layers: the norm reads the host masters' gradients
LOOP_CASES = {2: ("gpt-mixed",), 4: ()}


def _loop_case(key: str, world: int, cache: dict) -> dict:
    import copy

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs, m, spec, _ = CASES[world][key]
    if gbs // m not in cache:
        cache[gbs // m] = build("gpt-tiny", gbs // m)
    model, mg, _ = cache[gbs // m]
    pm = ParallelModule(copy.deepcopy(model), mg, make_plan(mg, world, spec, gbs=gbs, m=m, name=key))
    return compare_user_loop(model, pm, _batches(gbs, LOOP_STEPS), m)


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    cache: dict = {}
    jobs = [(key, lambda key=key: _case(key, world, cache)) for key in CASES[world]]
    jobs += [(f"loop-{key}", lambda key=key: _loop_case(key, world, cache)) for key in LOOP_CASES[world]]
    jobs += [("hf-llama", lambda: _hf_case(world)), ("resume", lambda: _resume(world, tmp))]
    if world == 2:
        jobs.append(("pipeline", _pipeline_case))
    run_jobs(rank, tmp, jobs, only_env="GFX_OFFLOAD_ONLY")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("offload2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("offload4"))


def _ok(results: dict, key: str) -> dict:
    if key not in results[0]:
        pytest.skip(f"{key} not selected (GFX_OFFLOAD_ONLY)")
    return assert_ok(results, key)


def _check_placement(c: dict, rank: int) -> None:
    assert c["num_masters"] > 0, f"rank {rank}: no offloaded DDP parameter: the plan does not test the masters"
    assert c["master_ok"], f"rank {rank}: an offloaded parameter is not a host fp32 master the optimizer holds"
    assert c["not_in_optimizer"], f"rank {rank}: the optimizer holds a working copy"
    assert c["states_ok"], f"rank {rank}: an offloaded master's optimizer states are missing or not on the host"
    assert not c["shares_storage"], f"rank {rank}: a working copy shares its master's storage"
    assert c["working_grads_left"] == 0, f"rank {rank}: working copies kept gradients after the step"
    assert c["fsdp_offload"] == c["want_fsdp_offload"], \
        f"rank {rank}: FSDP offload {c['fsdp_offload']}, planned {c['want_fsdp_offload']}"
    assert any(c["fsdp_offload"]), "the plan offloads no FSDP unit"


def _check_case(results: dict, key: str) -> None:
    r = _ok(results, key)
    for rank, by_case in results.items():
        c = by_case[key]
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ from one process by {c['loss_errs']}"
        assert c["grad_err"] <= TOL, f"rank {rank}: gradients differ by {c['grad_err']} at {c['grad_err_at']}"
        assert c["grads_compared"] == c["num_ref_params"], "some parameters got no gradient"
        assert c["param_err"] <= PARAM_TOL, \
            f"rank {rank}: parameters after {STEPS} steps differ by {c['param_err']} at {c['param_err_at']}"
        assert c["missing_keys"] == [] and c["shapes_ok"], f"state_dict lacks {c['missing_keys']} or is sharded"
        assert c["first_working_grads"] == 0 and c["first_master_grads"] == c["num_masters"], \
            f"rank {rank}: after the sync, {c['first_working_grads']} working copies hold gradients and " \
            f"{c['first_master_grads']} of {c['num_masters']} masters"
        _check_placement(c, rank)
        if c["exact"]:
            assert c["exact_loss_diff"] == 0.0 and c["exact_param_diff"] == 0.0, \
                f"rank {rank}: not bit for bit the plan without offload: losses {c['exact_loss_diff']}, " \
                f"parameters {c['exact_param_diff']}"
    assert r["param_moved"] > 10 * PARAM_TOL, "the optimizer did not move the parameters: the test cannot fail"


def _check_hf(results: dict) -> None:
    r = _ok(results, "hf-llama")
    assert True in r["offloaded"] and False in r["offloaded"]
    for rank, by_case in results.items():
        c = by_case["hf-llama"]
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ from one process by {c['loss_errs']}"
        assert c["param_err"] <= PARAM_TOL, f"rank {rank}: parameters differ by {c['param_err']}"
        _check_placement(c, rank)
        assert c["exact_loss_diff"] == 0.0 and c["exact_param_diff"] == 0.0, \
            f"rank {rank}: not bit for bit the plan without offload: {c['exact_loss_diff']}, {c['exact_param_diff']}"
    assert r["param_moved"] > 10 * PARAM_TOL


def _check_resume(results: dict) -> None:
    r = _ok(results, "resume")
    for rank, by_case in results.items():
        c = by_case["resume"]
        for tag in ("off_to_plain", "plain_to_off"):
            assert c[f"{tag}_resharded"] and c[f"{tag}_step"] == RESUME_AT, (rank, tag)
            assert max(c[f"{tag}_loss_errs"]) <= TOL, f"rank {rank}: {tag}: resumed losses {c[f'{tag}_loss_errs']}"
            assert c[f"{tag}_param_err"] <= PARAM_TOL, f"rank {rank}: {tag}: parameters {c[f'{tag}_param_err']}"
            assert c[f"{tag}_other_start"] > 100 * TOL, "the resumed module's own weights equal the saved ones"
    assert r["off_to_plain_step"] == RESUME_AT


@pytest.mark.parametrize("world,key", [(w, k) for w, ks in LOOP_CASES.items() for k in ks])
def test_the_user_owned_loop_clips_offloaded_gradients_like_one_process(request, world, key):
    """forward_backward + clip_grad_norm_ (host masters' gradients) + AdamW + warmup-cosine."""
    results = request.getfixturevalue(f"world{world}")
    assert_ok(results, f"loop-{key}")
    check_user_loop(results, f"loop-{key}")


@pytest.mark.parametrize("key", list(CASES[2]))
def test_world2_offload_trains_like_one_process(world2, key):
    _check_case(world2, key)


def test_world2_offload_hf_llama(world2):
    _check_hf(world2)


def test_world2_offload_checkpoint_resumes_across_plans(world2):
    _check_resume(world2)


def test_world2_offload_pipeline(world2):
    """Offloaded layers in both stages of a pipelined plan, the tied embedding/head across them."""
    r = _ok(world2, "pipeline")
    for rank, by_case in world2.items():
        c = by_case["pipeline"]
        assert c["num_masters"] > 0 and c["masters_on_host"], (rank, c["num_masters"])
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ from one process by {c['loss_errs']}"
        assert c["param_err"] <= PARAM_TOL, f"rank {rank}: parameters differ by {c['param_err']}"
        assert c["exact_loss_diff"] == 0.0 and c["exact_param_diff"] == 0.0, \
            f"rank {rank}: not bit for bit the plan without offload: {c['exact_loss_diff']}, {c['exact_param_diff']}"
    assert r["num_masters"] > 0


@pytest.mark.parametrize("key", list(CASES[4]))
def test_world4_offload_trains_like_one_process(world4, key):
    _check_case(world4, key)


def test_world4_offload_hf_llama(world4):
    _check_hf(world4)


def test_world4_offload_checkpoint_resumes_across_plans(world4):
    _check_resume(world4)
