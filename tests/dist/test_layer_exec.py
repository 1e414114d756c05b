"""LayerExecutor on real gloo ranks: one planned block equals the single-process block.

Spawned once per world size; every rank runs every case and writes its figures; checks run in
the parent. Per case: forward output, input gradient and parameter gradients against the
decomposed graph run on plain tensors (fp32), the runtime's forward collectives against the
plan's, and the output placements DTensor chose against the plan's.
"""

from __future__ import annotations

import time

import pytest
from harness import init_gloo, run_jobs, spawn

B, T = 4, 16  # runtime micro-batch (global); the model is captured at this shape
TOL = 1e-5

# (model, dp, tp, sp) per world size
CASES = {
    2: [("gpt-tiny", 2, 1, "none"), ("gpt-tiny", 1, 2, "none"), ("gpt-tiny", 1, 2, "megatron"),
        ("llama-tiny", 2, 1, "none"), ("llama-tiny", 1, 2, "none"), ("llama-tiny", 1, 2, "megatron")],
    4: [("gpt-tiny", 2, 2, "none"), ("gpt-tiny", 2, 2, "megatron"), ("llama-tiny", 2, 2, "megatron")],
}
TIMED = ("gpt-tiny", 1, 2, "none")  # per-step time against the plain block, world 2 (reported, not asserted)



def _collective_name(op) -> str:
    s = str(op)
    for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        if name in s:
            return name
    return s


def _case(name: str, dp: int, tp: int, sp: str, world: int, prepared: dict) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.passes.decompose_layer import decompose_layer
    from galvatron_fx.runtime.layer_exec import LayerExecutor
    from galvatron_fx.search.intra_layer import solve_intra_layer

    if name not in prepared:
        model, inputs = zoo.build(name, batch_size=B, seq_len=T, device="cpu", seed=0)
        mg = gfx.capture(model, inputs)
        layer = mg.blocks()[1]
        prepared[name] = (model, mg, layer, decompose_layer(mg, layer))
    model, mg, layer, dl = prepared[name]
    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))
    # the memory-lean variant shards every matrix weight: at these tiny shapes the time-optimal
    # plan may replicate everything, which would leave nothing for the runtime to show
    option = solve_intra_layer(mg, layer, tp, sp, cm, decomposed=dl, shard_params=tp > 1)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    ex = LayerExecutor.from_model(mg, layer, option, mesh, model, decomposed=dl)

    # reference: the decomposed graph on plain tensors, same inputs on every rank
    g = torch.Generator().manual_seed(1)
    fqns = {node: fqn for fqn, p in mg.params.items() for node in p.nodes}
    named = dict(model.named_parameters())
    ref_args, acts = [], []
    for ph, in_name, role in zip(dl.inputs, dl.input_names, dl.input_roles):
        if role == "param":
            ref_args.append(named[fqns[in_name]].detach().clone().requires_grad_())
        else:
            v = ph.meta["val"]
            x = torch.randn(tuple(v.shape), generator=g, dtype=v.dtype)
            acts.append(x)
            ref_args.append(x.clone().requires_grad_(role == "activation"))
    ref_out = dl.gm(*ref_args)[0]
    grad_out = torch.randn(ref_out.shape, generator=g)
    ref_out.backward(grad_out)

    xs = [x.requires_grad_(role == "activation")
          for x, (_, role) in zip(ex.distribute_inputs(*acts), ex._inputs)]
    with CommDebugMode() as comm:
        out = ex(*xs)[0]
    fwd_comm = sorted(_collective_name(op) for op, c in comm.get_comm_counts().items() for _ in range(c))
    go = torch.distributed.tensor.distribute_tensor(grad_out, mesh, list(out.placements))
    out.backward(go)
    ex.sync_grads()

    res = {"out_err": (out.full_tensor() - ref_out).abs().max().item(),
           "fwd_comm": fwd_comm, "plan_fwd_comm": [str(c) for c in option.collectives("fwd")],
           "mismatches": sorted(ex.mismatches), "param_errs": {}, "grad_placements_ok": True}
    i_act = next(i for i, r in enumerate(dl.input_roles) if r == "activation")
    x_act = xs[[r for _, r in ex._inputs].index("activation")]
    res["in_grad_err"] = (x_act.grad.full_tensor() - ref_args[i_act].grad).abs().max().item()
    for _ph, in_name, role, ra in zip(dl.inputs, dl.input_names, dl.input_roles, ref_args):
        if role != "param":
            continue
        p = ex.params[fqns[in_name].replace(".", "__")]
        assert isinstance(p, DTensor)
        res["grad_placements_ok"] &= tuple(p.grad.placements) == tuple(p.placements)
        res["param_errs"][fqns[in_name]] = (p.grad.full_tensor() - ra.grad).abs().max().item()
    res["param_placements"] = {k: str(tuple(p.placements)) for k, p in ex.params.items()}

    if (name, dp, tp, sp) == TIMED and world == 2:
        block = model.get_submodule(layer.name)
        x_plain = acts[0].clone().requires_grad_()

        def step_ref():
            block(x_plain).backward(grad_out)

        def step_ex():
            ex(*xs)[0].backward(go)
            ex.sync_grads()

        for label, fn in (("ref_step_s", step_ref), ("exec_step_s", step_ex)):
            fn()
            torch.distributed.barrier()
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            res[label] = (time.perf_counter() - t0) / 5
    return res


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    prepared: dict = {}
    run_jobs(rank, tmp, [("/".join(map(str, case)), lambda case=case: _case(*case, world, prepared))
                         for case in CASES[world]])


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("lx2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("lx4"))


def _check(results: dict, key: str) -> dict:
    for rank, by_case in results.items():
        r = by_case[key]
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
        assert r["out_err"] <= TOL, f"rank {rank}: forward differs by {r['out_err']}"
        assert r["in_grad_err"] <= TOL, f"rank {rank}: input grad differs by {r['in_grad_err']}"
        bad = {k: e for k, e in r["param_errs"].items() if not e <= TOL}
        assert not bad, f"rank {rank}: parameter grads differ: {bad}"
        assert r["param_errs"], "no parameter gradients compared"
        assert r["grad_placements_ok"], "sync_grads left a grad in another layout than its parameter"
        assert r["mismatches"] == [], f"DTensor chose other output placements than the plan: {r['mismatches']}"
    return results[0][key]


@pytest.mark.parametrize("case", CASES[2], ids=["/".join(map(str, c)) for c in CASES[2]])
def test_world2_matches_single_process(world2, case):
    r = _check(world2, "/".join(map(str, case)))
    _, dp, tp, sp = case
    if tp == 2:  # the tp-sharded weights really are sharded
        assert any("Shard" in p for p in r["param_placements"].values())


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_forward_collectives_equal_the_plan(world2, name):
    for sp in ("none", "megatron"):
        r = _check(world2, f"{name}/1/2/{sp}")
        assert r["fwd_comm"] == sorted(r["plan_fwd_comm"]), (sp, r["fwd_comm"], r["plan_fwd_comm"])
    if name == "gpt-tiny":  # the plan is Megatron's: two forward all-reduces
        assert world2[0][f"{name}/1/2/none"]["fwd_comm"] == ["all_reduce", "all_reduce"]


def test_data_parallel_issues_no_forward_collectives(world2):
    assert world2[0]["gpt-tiny/2/1/none"]["fwd_comm"] == []


def test_step_time_is_recorded(world2):
    r = world2[0]["/".join(map(str, TIMED))]
    assert r["exec_step_s"] > 0 and r["ref_step_s"] > 0
    print(f"per-step fwd+bwd, world 2 tp=2: executor {r['exec_step_s'] * 1e3:.1f} ms, "
          f"plain block {r['ref_step_s'] * 1e3:.1f} ms")


@pytest.mark.parametrize("case", CASES[4], ids=["/".join(map(str, c)) for c in CASES[4]])
def test_world4_matches_single_process(world4, case):
    r = _check(world4, "/".join(map(str, case)))
    if case[3] == "none":
        assert r["fwd_comm"] == sorted(r["plan_fwd_comm"])
