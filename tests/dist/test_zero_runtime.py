"""ZeRO-2/ZeRO-3 layers (FSDP2 ``fully_shard`` per executor) train like one process.

Spawned once per world size (2 and 4); every rank runs every case and writes its figures; checks
run in the parent. Per plan (gpt-tiny, fp32): the loss of each step, full gradients after the
first step's backward and ``sync_grads``, and parameters after 3 AdamW steps against the plain
model. Also the memory saving: a ZeRO-3 layer's local parameter shards hold ~1/dp of the bytes a
DDP layer holds. ``GFX_ZERO_ONLY=case,case`` selects cases.
"""

from __future__ import annotations

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_parallel_module import (
    LOOP_STEPS,
    PARAM_TOL,
    STEPS,
    TOL,
    T,
    _batches,
    check_user_loop,
    compare_training,
    compare_user_loop,
)

# name -> (global batch, num_microbatches, spec); spec: (dp, tp, dp_type) for every layer, or a
# list for [embedding, blocks..., head, loss] (gpt-tiny: 4 blocks)
CASES = {
    2: {
        "ddp": (4, 1, (2, 1, "ddp")),
        "zero2": (4, 1, (2, 1, "zero2")),
        "zero3": (4, 1, (2, 1, "zero3")),
        "zero3-m2": (8, 2, (2, 1, "zero3")),  # grad accumulation over micro-batches
        # the tied embedding/head weight under two flavours; DDP and ZeRO-3 blocks interleaved
        "mixed": (4, 1, [(2, 1, "ddp"), (2, 1, "zero3"), (2, 1, "ddp"), (2, 1, "zero2"), (2, 1, "zero3"),
                         (2, 1, "zero3"), (2, 1, "ddp")]),
    },
    4: {
        "zero3-dp2tp2": (4, 1, (2, 2, "zero3")),
        "zero2-dp4": (4, 1, (4, 1, "zero2")),
        "mixed-meshes": (4, 1, [(4, 1, "zero3"), (2, 2, "zero3"), (1, 4, "ddp"), (4, 1, "ddp"),
                                (2, 2, "zero2"), (2, 2, "zero3"), (2, 2, "ddp")]),
    },
}



_OPTIONS: dict = {}


def _plan(mg, world: int, spec, *, gbs: int, m: int, name: str):
    """A hand-made pp=1 plan: per layer (dp, tp, dp_type); tp>1 placements from the ILP with every
    matrix weight sharded."""
    import galvatron_fx as gfx
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.ir.plan import LayerPlan, LayerPrediction, ParallelPlan, PlanPrediction, graph_hash
    from galvatron_fx.ir.strategy import LayerStrategy
    from galvatron_fx.passes.decompose_layer import decompose_layer
    from galvatron_fx.search.intra_layer import solve_intra_layer

    spec = spec if isinstance(spec, list) else [spec] * len(mg.layers)
    assert len(spec) == len(mg.layers)
    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))
    layers = []
    for layer, (dp, tp, dp_type) in zip(mg.layers, spec):
        assert dp * tp == world
        placements = {}
        if tp > 1:
            key = (id(mg), layer.kind, tp)
            if key not in _OPTIONS:
                _OPTIONS[key] = solve_intra_layer(mg, layer, tp, "none", cm, decomposed=decompose_layer(mg, layer),
                                                  shard_params=True)
            placements = _OPTIONS[key].placements
        layers.append(LayerPlan(name=layer.name, kind=layer.kind, role=layer.role, stage=0,
                                strategy=LayerStrategy(tp=tp, sp="none", dp_type=dp_type, recompute="none"), dp=dp,
                                placements=placements, predicted=LayerPrediction(fwd_s=0.0, bwd_s=0.0)))
    return ParallelPlan(model=name, graph_hash=graph_hash(mg), cluster_hash="c" * 64, world_size=world, pp=1,
                        num_microbatches=m, schedule="1f1b", global_batch_size=gbs,
                        micro_batch_size=gbs // m // max(d for d, *_ in spec), stage_boundaries=(0,),
                        stage_ranks=(tuple(range(world)),), layers=tuple(layers),
                        predicted=PlanPrediction(step_time_s=0.0, throughput_samples_s=0.0, peak_memory_bytes=(0,),
                                                 memory_budget_bytes=0),
                        solver_stats={"search_s": 0.0})


def _local_bytes(ex) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in ex.parameters())


def _full_bytes(ex) -> int:
    import math

    return sum(math.prod(ex._meta[k][1]) * p.element_size() for k, p in ex.params.items())


def _ideal_bytes(ex) -> float:
    """Bytes if every sharded mesh axis split each parameter evenly."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out = 0.0
    for k, p in ex.params.items():
        placements = (ex._meta[k][0],) if k in ex._local else tuple(p.placements)
        axes = (1,) if k in ex._local else range(len(placements))
        ways = 1
        for i, pl in zip(axes, placements):
            ways *= ex.mesh.size(i) if isinstance(pl, (Shard, _StridedShard)) else 1
        out += _full_bytes_one(ex, k, p) / ways
    return out


def _full_bytes_one(ex, k, p) -> int:
    import math

    return math.prod(ex._meta[k][1]) * p.element_size()


def _captured(cache: dict, micro: int):
    """gpt-tiny and its capture at a micro-batch of ``micro`` samples (built once per rank)."""
    import galvatron_fx as gfx
    from galvatron_fx import zoo

    if micro not in cache:
        model, inputs = zoo.build("gpt-tiny", batch_size=micro, seq_len=T, device="cpu", seed=0)
        cache[micro] = (model, gfx.capture(model, inputs))
    return cache[micro]


def _case(key: str, world: int, cache: dict) -> dict:
    import copy

    from torch.distributed.fsdp import FSDPModule

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs, m, spec = CASES[world][key]
    model, mg = _captured(cache, gbs // m)
    plan = _plan(mg, world, spec, gbs=gbs, m=m, name=key)
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    batches = _batches(gbs, STEPS)

    def tied(res: dict) -> None:  # tied copies (embedding / head) hold equal grads in their layouts
        res["tied_grad_err"] = max([(ps[0][0].full_grad(ps[0][1]) - ex.full_grad(k)).abs().max().item()
                                    for ps in pm._tied for ex, k in ps[1:]] or [0.0])

    res, _, _ = compare_training(model, pm, batches, m, on_first_grads=tied)
    res["fsdp"] = [isinstance(ex, FSDPModule) for ex in pm.executors]
    res["want_fsdp"] = [str(lp.strategy.dp_type) != "ddp" and lp.dp > 1 and any(True for _ in ex.parameters())
                        for lp, ex in zip(plan.layers, pm.executors)]
    # after the step: per-executor local (this rank's) vs full parameter bytes
    res["local_bytes"] = [_local_bytes(ex) for ex in pm.executors]
    res["full_bytes"] = [_full_bytes(ex) for ex in pm.executors]
    res["ideal_bytes"] = [_ideal_bytes(ex) for ex in pm.executors]
    res["dp"] = [lp.dp for lp in plan.layers]
    res["tp"] = [lp.strategy.tp for lp in plan.layers]
    return res


# the user-owned loop (forward_backward, clip_grad_norm_, the user's optimizer and LR schedule)
# on the plans above whose parameters live most differently: plain replicas, FSDP shards, a
# tied weight in two flavours, tp-sharded local shards beside ZeRO-3 over 2-D meshes
# ("short-": the same loop as train_step(batch, opt, max_norm=, scheduler=))
# ("local-": each rank passes only its data-parallel share, inputs="local")
LOOP_CASES = {2: ("ddp", "zero3-m2", "mixed", "short-mixed", "local-zero3-m2", "accum-mixed",
                  "ddp-local-zero3-m2"),
              4: ("zero3-dp2tp2", "mixed-meshes", "local-zero3-dp2tp2")}


def _loop_case(key: str, world: int, cache: dict) -> dict:
    import copy

    from galvatron_fx.runtime.parallel_module import ParallelModule

    backward = key.startswith("ddp-")  # a DDP loop: loss = pm(batch); loss.backward()
    key = key.removeprefix("ddp-") if backward else key
    short, local, accum = key.startswith("short-"), key.startswith("local-"), key.startswith("accum-")
    key = key.removeprefix("short-").removeprefix("local-").removeprefix("accum-")
    gbs, m, spec = CASES[world][key]
    model, mg = _captured(cache, gbs // m)
    pm = ParallelModule(copy.deepcopy(model), mg, _plan(mg, world, spec, gbs=gbs, m=m, name=key))
    return compare_user_loop(model, pm, _batches(gbs, LOOP_STEPS), m, short_form=short, local=local,
                             accumulate=2 if accum else 1, backward=backward)


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    cache: dict = {}
    jobs = [(key, lambda key=key: _case(key, world, cache)) for key in CASES[world]]
    jobs += [(f"loop-{key}", lambda key=key: _loop_case(key, world, cache)) for key in LOOP_CASES[world]]
    run_jobs(rank, tmp, jobs, only_env="GFX_ZERO_ONLY")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("zero2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("zero4"))


def _ok(results: dict, key: str) -> dict:
    if key not in results[0]:
        pytest.skip(f"{key} not selected (GFX_ZERO_ONLY)")
    return assert_ok(results, key)


def _check_numerics(results: dict, key: str) -> dict:
    r = _ok(results, key)
    for rank, by_case in results.items():
        c = by_case[key]
        assert c["fsdp"] == c["want_fsdp"], f"rank {rank}: FSDP on layers {c['fsdp']}, planned {c['want_fsdp']}"
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ by {c['loss_errs']}"
        assert c["grad_err"] <= TOL, f"rank {rank}: gradients differ by {c['grad_err']}"
        assert c["tied_grad_err"] <= TOL, f"rank {rank}: tied copies' grads differ by {c['tied_grad_err']}"
        assert c["param_err"] <= PARAM_TOL, \
            f"rank {rank}: parameters after {STEPS} steps differ by {c['param_err']} at {c['param_err_at']}"
        assert c["grads_compared"] == c["num_ref_params"], "some parameters got no gradient"
        assert c["missing_keys"] == [] and c["shapes_ok"], f"state_dict lacks {c['missing_keys']} or is sharded"
    assert r["param_moved"] > 10 * PARAM_TOL, "the optimizer did not move the parameters: the test cannot fail"
    return r


@pytest.mark.parametrize("key", list(CASES[2]))
def test_world2_zero_trains_like_one_process(world2, key):
    _check_numerics(world2, key)


@pytest.mark.parametrize("key", list(CASES[4]))
def test_world4_zero_trains_like_one_process(world4, key):
    _check_numerics(world4, key)


@pytest.mark.parametrize("world,key", [(w, k) for w, ks in LOOP_CASES.items() for k in ks])
def test_the_user_owned_loop_clips_and_schedules_like_one_process(request, world, key):
    """forward_backward + clip_grad_norm_ + AdamW (weight decay) + warmup-cosine LambdaLR, five
    steps that all clip: losses and total norms within 1e-5, parameters within PARAM_TOL."""
    results = request.getfixturevalue(f"world{world}")
    _ok(results, f"loop-{key}")
    check_user_loop(results, f"loop-{key}")


def test_zero3_shards_parameter_memory(world2, world4):
    """A ZeRO-3 block's local parameter bytes are ~1/dp of a DDP block's (FSDP2 splits dim 0 in
    ``ceil(dim0/dp)`` rows, so a rank holds at most one padded row more per parameter)."""
    ddp, z3 = _ok(world2, "ddp"), _ok(world2, "zero3")
    block = 1  # blocks.0
    assert ddp["local_bytes"][block] == ddp["full_bytes"][block]
    for rank in world2:
        got = world2[rank]["zero3"]["local_bytes"][block]
        assert abs(got - ddp["local_bytes"][block] / 2) <= 0.02 * ddp["local_bytes"][block], (rank, got)
    assert sum(world2[r]["zero3"]["local_bytes"][block] for r in world2) == z3["full_bytes"][block]
    # dp2 x tp2: 1/2 of the tp shard (matrices 1/4 of the block; LayerNorm weights stay whole on tp)
    for rank in world4:
        c = world4[rank]["zero3-dp2tp2"]
        got, ideal, full = c["local_bytes"][block], c["ideal_bytes"][block], c["full_bytes"][block]
        assert abs(got - ideal) <= 0.02 * ideal and got < 0.3 * full, (rank, got, ideal, full)
    print(f"gpt-tiny blocks.0 per-rank parameter bytes: DDP {ddp['local_bytes'][block]}, "
          f"ZeRO-3 dp2 {[world2[r]['zero3']['local_bytes'][block] for r in world2]}, "
          f"ZeRO-3 dp2xtp2 {[world4[r]['zero3-dp2tp2']['local_bytes'][block] for r in world4]}")
