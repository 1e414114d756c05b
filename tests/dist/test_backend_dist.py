"""``torch.compile(model, backend="galvatron_fx")`` on real gloo ranks: the ordinary training loop
(``loss = cmodel(idx, tgt); loss.backward(); opt.step()`` with AdamW over the user's own
parameters) trains like the single-process model.

Spawned once (world 2); every rank runs every case. Per case: the loss of 3 steps, the user's
gradients after the first backward and the user's parameters after 3 AdamW steps against a plain
copy of the model (fp32). Cases: hand-made plans (a ZeRO-3 data-parallel plan, which the backend
runs as DDP; tensor parallel with selective recompute, whose lowered graphs recompute; Llama
with Megatron sequence parallelism), a plan searched by the backend itself (with ``dump_dir``),
and the errors that must reach every rank.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_parallel_module import PARAM_TOL, STEPS, TOL, _batches, build, make_plan

WORLD = 2
GBS = 4

# name -> (model, (dp, tp, sp, recompute) for every layer, dp_type)
CASES = {
    "dp2-zero3": ("gpt-tiny", (2, 1, "none", "none"), "zero3"),
    "tp2-selective": ("gpt-tiny", (1, 2, "none", "selective"), "ddp"),
    "llama-tp2-sp": ("llama-tiny", (1, 2, "megatron", "none"), "ddp"),
}


def _compare(model, options: dict, batches) -> dict:
    """Train a compiled copy and a plain copy of ``model`` side by side; record differences."""
    import torch

    from galvatron_fx.frontend.backend import parallel_modules

    torch._dynamo.reset()  # a fresh compile per case (and no recompile limit across cases)
    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    cmodel = torch.compile(mine, backend="galvatron_fx", options=options)
    opt = torch.optim.AdamW(mine.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res: dict = {"loss_errs": []}
    for step, batch in enumerate(batches):
        loss = cmodel(*batch)
        loss.backward()
        want = ref(*batch)
        want.backward()
        res["loss_errs"].append(abs(loss.item() - want.item()))
        if step == 0:
            got = dict(mine.named_parameters())
            errs = {k: (got[k].grad - p.grad).abs().max().item() for k, p in ref.named_parameters()
                    if got[k].grad is not None}
            res["grad_err"] = max(errs.values())
            res["grad_err_at"] = max(errs, key=errs.get)
            res["grads_compared"] = len(errs)
            res["num_params"] = sum(1 for _ in ref.parameters())
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
    got = dict(mine.named_parameters())
    errs = {k: (got[k] - p).abs().max().item() for k, p in ref.named_parameters()}
    res["param_err"] = max(errs.values())
    res["param_err_at"] = max(errs, key=errs.get)
    res["param_moved"] = max((p - q).abs().max().item() for p, q in zip(ref.parameters(), model.parameters()))
    pm = parallel_modules()[-1]
    res["option_source"] = pm.option_source
    res["layers"] = [f"{lp.name} dp{lp.dp} tp{lp.strategy.tp} {lp.strategy.sp} {lp.strategy.dp_type} "
                     f"{lp.strategy.recompute}" for lp in pm.plan.layers]
    res["plan_hash"] = pm.plan.plan_hash()
    res["own_copies_released"] = all(p.numel() == 0 for p in pm.parameters())
    return res


def _planned_case(cache: dict, tmp: str) -> dict:
    import torch.distributed as dist

    import galvatron_fx as gfx

    model, _, _ = cache.setdefault("gpt-tiny", build("gpt-tiny", GBS))
    res = _compare(model, {"cluster": gfx.Cluster.local_cpu(WORLD), "dump_dir": f"{tmp}/dump"}, _batches(GBS, STEPS))
    dist.barrier()  # rank 0 wrote the dump
    saved = gfx.ParallelPlan.load(f"{tmp}/dump/graph_0_0/plan.json")
    res["saved_hash"] = saved.plan_hash()
    return res


def _errors_case(cache: dict) -> dict:
    """Errors raised at compile time or at the first call, the same on every rank."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import galvatron_fx as gfx

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, y):
            h = self.a(x)
            torch._dynamo.graph_break()
            return F.mse_loss(self.b(h), y)

    def first_call_error(model, inputs, options) -> str:
        torch._dynamo.reset()
        try:
            torch.compile(model, backend="galvatron_fx", options=options)(*inputs)
        except Exception as e:  # Dynamo wraps the backend's error; report the root one
            inner = getattr(e, "inner_exception", e)
            return f"{type(inner).__name__}: {inner}"
        return "no error"

    model, mg, _ = cache.setdefault("gpt-tiny", build("gpt-tiny", GBS))
    batch = _batches(GBS, 1)[0]
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    cluster = gfx.Cluster.local_cpu(WORLD)
    out = {
        "graph_break": first_call_error(Broken(), (x, y), {"cluster": cluster}),
        "no_cluster": first_call_error(copy.deepcopy(model), batch, None),
        "other_world": first_call_error(copy.deepcopy(model), batch,
                                        {"plan": make_plan(mg, 4, (4, 1, "none", "none"), gbs=GBS, m=1)}),
        "batch": first_call_error(copy.deepcopy(model), batch, {"cluster": cluster, "global_batch_size": 8}),
    }
    torch.distributed.barrier()  # nobody is left waiting in a collective
    return out


def _case(key: str, cache: dict) -> dict:
    name, spec, dp_type = CASES[key]
    if name not in cache:
        cache[name] = build(name, GBS)
    model, mg, _ = cache[name]
    plan = make_plan(mg, WORLD, spec, gbs=GBS, m=1, name=key)
    if dp_type != "ddp":
        plan = dataclasses.replace(plan, layers=tuple(
            dataclasses.replace(lp, strategy=dataclasses.replace(lp.strategy, dp_type=dp_type)) for lp in plan.layers))
    return _compare(model, {"plan": plan}, _batches(GBS, STEPS))


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    import galvatron_fx  # noqa: F401  (registers the backend)

    cache: dict = {}
    jobs = [(key, lambda key=key: _case(key, cache)) for key in CASES]
    jobs += [("planned", lambda: _planned_case(cache, tmp)), ("errors", lambda: _errors_case(cache)),
             ("hosts", _hosts_case)]
    run_jobs(rank, tmp, jobs, only_env="GFX_BACKEND_ONLY")


def _hosts_case() -> dict:
    """compile()'s host check: two ranks on one node of the cluster but (as the check sees them)
    on two hosts are warned about; as two one-rank nodes, or on one host, they are not."""
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx.build import check_hosts
    from galvatron_fx.cluster import host

    same = check_hosts(gfx.Cluster.local_cpu(2))
    real = host.hostname
    host.hostname = lambda: f"host{dist.get_rank()}"
    try:
        split = check_hosts(gfx.Cluster.local_cpu(2))
        as_nodes = check_hosts(gfx.Cluster.local_cpu(nodes=2, devices_per_node=1))
    finally:
        host.hostname = real
    return {"same": same, "split": split, "as_nodes": as_nodes}


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, WORLD, tmp_path_factory.mktemp("backend2"))


def _check_numerics(results: dict, key: str) -> dict:
    r = assert_ok(results, key)
    for rank, by_case in results.items():
        c = by_case[key]
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ by {c['loss_errs']}"
        assert c["grad_err"] <= TOL, f"rank {rank}: gradients differ by {c['grad_err']} at {c['grad_err_at']}"
        assert c["param_err"] <= PARAM_TOL, f"rank {rank}: parameters differ by {c['param_err']} at {c['param_err_at']}"
        assert c["grads_compared"] == c["num_params"], "some of the user's parameters got no gradient"
        assert c["own_copies_released"], "the executors still hold parameter copies"
    return r


@pytest.mark.parametrize("key", list(CASES))
def test_hand_made_plans_train_like_one_process(world2, key):
    r = _check_numerics(world2, key)
    assert r["param_moved"] > 10 * PARAM_TOL, "the optimizer did not move the parameters: the test cannot fail"
    assert "re-solved" not in r["option_source"], "the saved placements must name the backend's graph nodes"
    if key == "dp2-zero3":
        assert all(" ddp " in l for l in r["layers"]), r["layers"]  # ZeRO runs as DDP under the backend
    if "tp2" in key:
        assert all(" tp2 " in l for l in r["layers"]), r["layers"]


def test_searched_plan_trains_and_is_dumped(world2):
    r = _check_numerics(world2, "planned")
    assert r["saved_hash"] == r["plan_hash"], "plan.json is not the plan that ran"
    assert all(" ddp " in l for l in r["layers"]), r["layers"]
    print("searched plan:", "; ".join(r["layers"]))


def test_case_times_are_recorded(world2):
    print("wall s per case, rank 0:", {k: round(v["wall_s"], 1) for k, v in world2[0].items()})


def test_errors_reach_every_rank(world2):
    assert_ok(world2, "errors")
    for rank in world2:
        r = world2[rank]["errors"]
        assert r["graph_break"].startswith("CaptureError") and "graph break" in r["graph_break"], r["graph_break"]
        assert "fullgraph=True" in r["graph_break"] and "galvatron_fx.compile" in r["graph_break"]
        assert r["no_cluster"].startswith("ConfigError") and "cluster" in r["no_cluster"], r["no_cluster"]
        assert r["other_world"].startswith("PlanError") and "world size 4" in r["other_world"], r["other_world"]
        assert r["batch"].startswith("ConfigError") and "whole global batch" in r["batch"], r["batch"]


def test_ranks_of_one_node_on_two_hosts_are_warned_about(world2):
    r = assert_ok(world2, "hosts")
    assert r["same"] == [] and r["as_nodes"] == []
    assert len(r["split"]) == 1 and "ranks 0-1 form node 0" in r["split"][0] and "host0, host1" in r["split"][0]
