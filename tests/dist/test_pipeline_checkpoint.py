"""Checkpoints of pipelined modules on real gloo ranks: saved by a pipelined plan, loaded by
another pipeline shape or a plan without stages, and the reverse.

One world-2 spawn runs every case in order; checks run in the parent. A pp2 1F1B plan of gpt-tiny
(its tied embedding/head weight on both stages) trains ``BEFORE`` AdamW steps, saves, and trains
``AFTER`` more (the uninterrupted run). A fresh pp2 module with a fresh optimizer loads the
checkpoint and trains the same steps; so does a world-2 plan without stages (tp2 and ZeRO-2/3 dp2
layers), which then saves; a pp2 interleaved plan (both tied copies on stage 0, in two chunks)
loads first the pipelined checkpoint, then that one, and trains on. Losses must equal the
uninterrupted run and a single-process model; every loaded tensor (each parameter and optimizer
state, every tied copy on every rank) must be bit-equal to the saved one. Also: damaged
checkpoints and problems on one rank only raise the same ``ConfigError`` on every rank, and
``load_state_dict`` of a plain model's weights, and buffers (llama-tiny's rope tables) loaded into
every chunk. A world-4 spawn: pp2×dp2 with ZeRO-2/3 layers (DTensors on stage sub-meshes, dp
replicas) saves; dp4 and an interleaved pp2×dp2 load it. ``GFX_PPCK_ONLY=case,case`` selects
world-2 cases.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from harness import assert_ok, config_error, init_gloo, run_jobs, spawn
from test_parallel_module import TOL, T, _batches, build, make_plan

GBS, M = {2: 4, 4: 8}, 2  # global batch by world size, micro-batches: graphs captured at GBS // M samples
BEFORE, AFTER, MORE = 4, 3, 2  # steps before the save, after the load, after the second save
NUM_BATCHES = BEFORE + AFTER + MORE
PP = (1, 1, "none", "none")
Z3, Z2, DP = (2, 1, "none", "none", "zero3"), (2, 1, "none", "none", "zero2"), (2, 1, "none", "none")
TP = (1, 2, "none", "none")
# name -> (model, world, pp, chunk starts, schedule, per-layer spec for embedding, blocks.0-3, head, loss)
PLANS = {
    "pp": ("gpt-tiny", 2, 2, (0, 4), "1f1b", PP),
    "flat": ("gpt-tiny", 2, 1, (0,), "1f1b", [Z3, TP, Z2, TP, DP, TP, DP]),
    "inter": ("gpt-tiny", 2, 2, (0, 2, 4, 6), "interleaved_1f1b", PP),
    "llama_inter": ("llama-tiny", 2, 2, (0, 2, 4, 6), "interleaved_1f1b", PP),
    "llama_dp": ("llama-tiny", 2, 1, (0,), "1f1b", DP),
    # world 4
    "pp_dp": ("gpt-tiny", 4, 2, (0, 4), "1f1b", [Z3, DP, Z2, Z3, DP, Z3, DP]),
    "dp4": ("gpt-tiny", 4, 1, (0,), "1f1b", [(4, 1, "none", "none", "zero3")] * 3 + [(4, 1, "none", "none")] * 4),
    "inter_dp": ("gpt-tiny", 4, 2, (0, 2, 4, 6), "interleaved_1f1b", [DP, Z2, DP, Z3, Z3, DP, DP]),
}


# ---- helpers run by the workers -----------------------------------------------------------------

def _module(name: str, cache: dict):
    """A fresh module of the plan's model (seed 0) under plan ``name`` and a fresh AdamW over it."""
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule
    from galvatron_fx.runtime.pipeline import PipelineModule

    model_name, world = PLANS[name][:2]
    if model_name not in cache:
        cache[model_name] = build(model_name, GBS[world] // M)[:2]
    model, mg = cache[model_name]
    plan = cache["plans"][name]
    cls = PipelineModule if plan.pp > 1 else ParallelModule
    pm = cls(copy.deepcopy(model), mg, plan)
    return pm, torch.optim.AdamW(pm.parameters(), lr=1e-3)


def _digest(pm, opt) -> dict[str, list[str]]:
    """Per parameter (``model.<fqn>``) and optimizer state entry (``optim.<fqn>.<name>``) this
    rank holds: the sha256 of the full tensor of each of its copies. Layout-independent, so
    digests of different plans compare bit for bit."""
    import hashlib

    from galvatron_fx.runtime.checkpoint import slots as cks

    def sha(t) -> str:
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:16]

    out: dict[str, list[str]] = {}
    for s in cks.all_slots(pm):
        out.setdefault(f"model.{s.fqn}", []).append(sha(cks.slot_view(s, s.param)))
        for name, v in opt.state.get(s.param, {}).items():
            t = cks.slot_view(s, v) if cks.is_elementwise(s.param, v) else v
            out.setdefault(f"optim.{s.fqn}.{name}", []).append(sha(t))
    return out


def _train(pm, opt, first: int, n: int) -> list[float]:
    gbs = pm.plan.global_batch_size
    return [pm.train_step(b, opt) for b in _batches(gbs, NUM_BATCHES)[first:first + n]]


# ---- world 2 -----------------------------------------------------------------------------------

def _pp_save_case(tmp: Path, cache: dict) -> dict:
    """The uninterrupted pipelined run: BEFORE steps, save, AFTER steps."""
    pm, opt = _module("pp", cache)
    losses = _train(pm, opt, 0, BEFORE)
    pm.save(tmp / "ck_pp", opt, step=BEFORE, extra={"losses": losses})
    out = {"digest": _digest(pm, opt), "stage": pm.stage}
    cache["pp"] = (pm, opt)
    out["losses"] = losses + _train(pm, opt, BEFORE, AFTER)
    return out


def _pp_resume_case(tmp: Path, cache: dict) -> dict:
    """A fresh pp module and optimizer load the pipelined checkpoint and train on."""
    pm, opt = _module("pp", cache)
    info = pm.load(tmp / "ck_pp", opt)
    out = {"step": info.step, "resharded": info.resharded, "extra_losses": info.extra["losses"],
           "digest": _digest(pm, opt)}
    out["losses"] = _train(pm, opt, BEFORE, AFTER)
    return out


def _flat_resume_case(tmp: Path, cache: dict) -> dict:
    """A plan without stages loads the pipelined checkpoint, trains on, saves and trains MORE."""
    pm, opt = _module("flat", cache)
    info = pm.load(tmp / "ck_pp", opt)
    out = {"step": info.step, "resharded": info.resharded, "digest": _digest(pm, opt)}
    out["losses"] = _train(pm, opt, BEFORE, AFTER)
    pm.save(tmp / "ck_flat", opt, step=BEFORE + AFTER)
    out["saved_digest"] = _digest(pm, opt)
    out["more_losses"] = _train(pm, opt, BEFORE + AFTER, MORE)
    return out


def _inter_case(tmp: Path, cache: dict) -> dict:
    """An interleaved pp2 module (another pipeline shape) loads the pipelined checkpoint, then
    (in place) the one saved without stages, and trains on."""
    pm, opt = _module("inter", cache)
    pm.load(tmp / "ck_pp", opt)
    out = {"pp_digest": _digest(pm, opt), "chunks": len(pm.chunks)}
    info = pm.load(tmp / "ck_flat", opt)
    out |= {"step": info.step, "resharded": info.resharded, "digest": _digest(pm, opt)}
    out["losses"] = _train(pm, opt, BEFORE + AFTER, MORE)
    return out


def _damaged_case(tmp: Path, cache: dict) -> dict:
    """A truncated shard file, FQNs changed on one rank only and an optimizer with a foreign
    parameter on one rank only: the same ConfigError on every rank, nothing touched or written."""
    import shutil

    import torch
    import torch.distributed as dist

    pm, opt = cache["pp"]
    rank = dist.get_rank()
    if rank == 0:
        shutil.copytree(tmp / "ck_pp", tmp / "trunc")
        f = tmp / "trunc" / "__1_0.distcp"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    dist.barrier()
    before = _digest(pm, opt)
    out = {"trunc": config_error(lambda: pm.load(tmp / "trunc", opt))}
    ex = pm.chunks[0].body.executors[0]
    key = next(iter(ex.fqn_of_key))
    real = ex.fqn_of_key[key]
    if rank == 1:  # a module whose last stage has other FQNs
        ex.fqn_of_key[key] = "renamed.weight"
    try:
        out["fqns"] = config_error(lambda: pm.load(tmp / "ck_pp", opt))
    finally:
        ex.fqn_of_key[key] = real
    out["untouched"] = _digest(pm, opt) == before
    params = list(pm.parameters()) + ([torch.nn.Parameter(torch.zeros(3))] if rank == 1 else [])
    foreign = torch.optim.AdamW(params, lr=1e-3)
    out["foreign"] = config_error(lambda: pm.save(tmp / "ck_bad", foreign))
    out["foreign_written"] = sorted(p.name for p in tmp.iterdir() if "ck_bad" in p.name)
    return out


def _load_state_dict_case(cache: dict) -> dict:
    """A plain model's weights (seed 1) into the pipelined module: its state_dict and loss are
    the plain model's; a key held by the last stage only, missing, is refused on every rank."""
    import torch

    from galvatron_fx import zoo

    pm, _ = cache["pp"]
    plain, _ = zoo.build("gpt-tiny", batch_size=GBS[2] // M, seq_len=T, device="cpu", seed=1)
    sd = plain.state_dict()
    r = pm.load_state_dict(sd)
    out = {"missing": r.missing_keys, "unexpected": r.unexpected_keys}
    got = pm.state_dict()
    out["param_err"] = max((got[k] - v).abs().max().item() for k, v in sd.items() if k in got)
    out["missing_in_got"] = sorted(k for k in sd if k not in got)
    batch = _batches(GBS[2], 1)[0]
    with torch.no_grad():
        want = sum(plain(*(x.chunk(M)[i] for x in batch)).item() for i in range(M)) / M
    out["loss_err"] = abs(pm.train_step(batch, None) - want)
    last = "blocks.3.mlp.fc.weight"
    out["drop_key"] = last
    out["missing_error"] = config_error(lambda: pm.load_state_dict({k: v for k, v in sd.items() if k != last}))
    k0 = "blocks.3.attn.qkv.weight"  # on the last stage only
    out["shape_error"] = config_error(lambda: pm.load_state_dict(sd | {k0: sd[k0][:-1]}))
    return out


def _buffers_case(tmp: Path, cache: dict) -> dict:
    """llama-tiny (rope buffers, read by the embedding on stage 0): an interleaved pp2 module saves
    after one step; a dp2 module and a fresh interleaved one, their buffers zeroed in every body,
    load it: buffers, parameters and optimizer state restored, the next step's loss the same."""
    pm, opt = _module("llama_inter", cache)
    _train(pm, opt, 0, 1)
    pm.save(tmp / "ck_llama", opt, step=1)
    out = {"digest": _digest(pm, opt), "want": _train(pm, opt, 1, 1)}
    orig = dict(cache["llama-tiny"][0].named_buffers())
    for name in ("llama_dp", "llama_inter"):
        other, other_opt = _module(name, cache)
        bodies = [ch.body for ch in other.chunks] if hasattr(other, "chunks") else [other]
        for body in bodies:
            for b in body._buffers_full.values():
                b.zero_()
        other.load(tmp / "ck_llama", other_opt)
        out[f"{name}_bodies"] = len(bodies)
        out[f"{name}_buffers"] = sorted(orig)
        out[f"{name}_buffer_err"] = max((b - orig[k]).abs().max().item() for body in bodies
                                        for k, b in body._buffers_full.items())
        out[f"{name}_digest"] = _digest(other, other_opt)
        out[f"{name}_losses"] = _train(other, other_opt, 1, 1)
    return out


def _worker2(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    tmp_p = Path(tmp)
    cache: dict = {"plans": pickle.loads((tmp_p / "plans.pkl").read_bytes())}
    run_jobs(rank, tmp, [("pp_save", lambda: _pp_save_case(tmp_p, cache)),
                         ("pp_resume", lambda: _pp_resume_case(tmp_p, cache)),
                         ("flat_resume", lambda: _flat_resume_case(tmp_p, cache)),
                         ("inter", lambda: _inter_case(tmp_p, cache)),
                         ("damaged", lambda: _damaged_case(tmp_p, cache)),
                         ("load_state_dict", lambda: _load_state_dict_case(cache)),
                         ("buffers", lambda: _buffers_case(tmp_p, cache))],
             only_env="GFX_PPCK_ONLY")


# ---- world 4 ----------------------------------------------------------------------------------

def _world4_case(tmp: Path, cache: dict) -> dict:
    """pp2×dp2 (ZeRO-2/3, tied copies on both stages) saves; dp4 (ZeRO-3) and an interleaved
    pp2×dp2 load with fresh optimizers and train on."""
    pm, opt = _module("pp_dp", cache)
    out = {"losses": _train(pm, opt, 0, BEFORE)}
    pm.save(tmp / "ck4", opt, step=BEFORE)
    out["digest"] = _digest(pm, opt)
    out["losses"] += _train(pm, opt, BEFORE, AFTER)
    for name in ("dp4", "inter_dp"):
        other, other_opt = _module(name, cache)
        other.load(tmp / "ck4", other_opt)
        out[f"{name}_digest"] = _digest(other, other_opt)
        out[f"{name}_losses"] = _train(other, other_opt, BEFORE, AFTER)
    return out


def _worker4(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    tmp_p = Path(tmp)
    cache: dict = {"plans": pickle.loads((tmp_p / "plans.pkl").read_bytes())}
    run_jobs(rank, tmp, [("world4", lambda: _world4_case(tmp_p, cache))])


# ---- fixtures and checks ------------------------------------------------------------------------

def _plans(world: int) -> bytes:
    """The plans of ``world``, pickled, made once in the parent (tp2 placements from the ILP)."""
    mgs = {name: build(name, GBS[world] // M)[1] for name in sorted({p[0] for p in PLANS.values() if p[1] == world})}
    return pickle.dumps({name: make_plan(mgs[model], w, spec, gbs=GBS[world], m=M, name=name, pp=pp, boundaries=bounds,
                                         schedule=schedule)
                         for name, (model, w, pp, bounds, schedule, spec) in PLANS.items() if w == world})


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("ppck2")
    (tmp / "plans.pkl").write_bytes(_plans(2))
    return spawn(_worker2, 2, tmp), tmp


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("ppck4")
    (tmp / "plans.pkl").write_bytes(_plans(4))
    return spawn(_worker4, 4, tmp), tmp


def _reference(gbs: int) -> list[float]:
    """The single-process run: the plain model, AdamW, the same batches in M micro-batches."""
    import torch

    from galvatron_fx import zoo

    model, _ = zoo.build("gpt-tiny", batch_size=gbs // M, seq_len=T, device="cpu", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in _batches(gbs, NUM_BATCHES):
        total = 0.0
        for i in range(M):
            loss = model(*(x.chunk(M)[i] for x in batch))
            (loss / M).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / M)
    return losses


@pytest.fixture(scope="module")
def reference() -> list[float]:
    return _reference(GBS[2])


def _ok(results: dict, key: str) -> dict:
    if key not in results[0]:
        pytest.skip(f"{key} not selected (GFX_PPCK_ONLY)")
    return assert_ok(results, key)


def _merged(results: dict, key: str, field: str = "digest") -> dict[str, set[str]]:
    """Digests of every rank together: key -> the distinct hashes of all its copies."""
    out: dict[str, set[str]] = {}
    for by_case in results.values():
        for k, hashes in by_case[key][field].items():
            out.setdefault(k, set()).update(hashes)
    return out


def _assert_same_state(got: dict[str, set[str]], want: dict[str, set[str]], what: str) -> None:
    assert set(got) == set(want), f"{what}: keys differ: {sorted(set(got) ^ set(want))[:6]}"
    split = {k: v for k, v in want.items() if len(v) != 1}
    assert not split, f"the saved copies differ: {sorted(split)[:4]}"
    bad = sorted(k for k in want if got[k] != want[k])
    assert not bad, f"{what}: {len(bad)} tensors differ from the saved ones (or between copies): {bad[:6]}"


def _close(a: list[float], b: list[float], what: str, tol: float = TOL) -> None:
    errs = [abs(x - y) for x, y in zip(a, b)]
    assert len(a) == len(b) and max(errs) <= tol, f"{what}: {errs}"


def test_pipelined_run_trains_like_one_process_and_saves(world2, reference):
    results, tmp = world2
    _ok(results, "pp_save")
    for rank, by_case in results.items():
        c = by_case["pp_save"]
        assert c["stage"] == rank
        _close(c["losses"], reference[:BEFORE + AFTER], f"rank {rank}: pipelined run vs one process")
    saved = _merged(results, "pp_save")
    # the tied embedding/head weight lives on both stages; each rank holds part of the parameters
    assert any(len(set(by_case["pp_save"]["digest"]) ^ set(saved)) for by_case in results.values())
    assert all(len(v) == 1 for v in saved.values()), "tied copies differ across stages before the save"
    assert sum(n.endswith(".distcp") for n in os.listdir(tmp / "ck_pp")) == 2
    assert max(abs(a - b) for a, b in zip(reference, reference[1:])) > 100 * TOL  # the losses move


def test_pipelined_checkpoint_resumes_in_a_fresh_pipelined_module(world2, reference):
    results, _ = world2
    _ok(results, "pp_resume")
    want = assert_ok(results, "pp_save")["losses"]
    _assert_same_state(_merged(results, "pp_resume"), _merged(results, "pp_save"), "pp -> pp")
    for rank, by_case in results.items():
        c = by_case["pp_resume"]
        assert c["step"] == BEFORE and not c["resharded"] and c["extra_losses"] == want[:BEFORE]
        _close(c["losses"], want[BEFORE:], f"rank {rank}: resumed vs uninterrupted")
        _close(c["losses"], reference[BEFORE:BEFORE + AFTER], f"rank {rank}: resumed vs one process")


def test_pipelined_checkpoint_resumes_without_stages(world2, reference):
    results, _ = world2
    _ok(results, "flat_resume")
    want = assert_ok(results, "pp_save")["losses"]
    _assert_same_state(_merged(results, "flat_resume"), _merged(results, "pp_save"), "pp -> dp2/tp2")
    for rank, by_case in results.items():
        c = by_case["flat_resume"]
        assert c["step"] == BEFORE and c["resharded"]
        _close(c["losses"], want[BEFORE:], f"rank {rank}: resumed without stages vs uninterrupted")
        _close(c["more_losses"], reference[BEFORE + AFTER:], f"rank {rank}: after the second save vs one process")


def test_checkpoint_without_stages_loads_into_another_pipeline_shape(world2, reference):
    results, _ = world2
    _ok(results, "inter")
    flat = assert_ok(results, "flat_resume")
    _assert_same_state(_merged(results, "inter", "pp_digest"), _merged(results, "pp_save"), "pp -> interleaved")
    _assert_same_state(_merged(results, "inter"), _merged(results, "flat_resume", "saved_digest"),
                       "dp2/tp2 -> interleaved")
    # both tied copies on stage 0, in two chunks: rank 0 holds two copies of the weight
    assert any(len(h) == 2 for h in results[0]["inter"]["digest"].values())
    for rank, by_case in results.items():
        c = by_case["inter"]
        assert c["chunks"] == 2 and c["step"] == BEFORE + AFTER and c["resharded"]
        _close(c["losses"], flat["more_losses"], f"rank {rank}: interleaved vs the run without stages")
        _close(c["losses"], reference[BEFORE + AFTER:], f"rank {rank}: interleaved vs one process")


def test_damaged_and_one_rank_problems_are_refused_on_every_rank(world2):
    results, _ = world2
    _ok(results, "damaged")
    msgs: dict[str, set[str]] = {}
    for rank, by_case in results.items():
        c = by_case["damaged"]
        assert c["untouched"], f"rank {rank}: a refused load changed the module"
        assert "__1_0.distcp" in c["trunc"] and "truncated" in c["trunc"], (rank, c["trunc"])
        assert "renamed.weight" in c["fqns"] and "missing" in c["fqns"], (rank, c["fqns"])
        assert "not one of this module's" in c["foreign"] and c["foreign_written"] == [], (rank, c)
        for k in ("trunc", "fqns", "foreign"):
            assert c[k].startswith("ConfigError"), (rank, k, c[k])
            msgs.setdefault(k, set()).add(c[k])
    assert all(len(v) == 1 for v in msgs.values()), "ranks raised different errors"


def test_load_state_dict_into_a_pipelined_module(world2):
    results, _ = world2
    _ok(results, "load_state_dict")
    for rank, by_case in results.items():
        c = by_case["load_state_dict"]
        assert c["missing"] == [] and c["unexpected"] == [] and c["missing_in_got"] == [], (rank, c)
        assert c["param_err"] == 0.0 and c["loss_err"] <= TOL, (rank, c["param_err"], c["loss_err"])
        assert c["missing_error"].startswith("ConfigError") and c["drop_key"] in c["missing_error"], (rank, c)
        assert c["shape_error"].startswith("ConfigError") and "shape" in c["shape_error"], (rank, c)


def test_world4_pipelined_checkpoint_loads_into_dp4_and_interleaved(world4):
    results, _ = world4
    reference = _reference(GBS[4])
    r = assert_ok(results, "world4")
    saved = _merged(results, "world4")
    for name in ("dp4", "inter_dp"):
        _assert_same_state(_merged(results, "world4", f"{name}_digest"), saved, f"pp2×dp2 -> {name}")
    for rank, by_case in results.items():
        c = by_case["world4"]
        _close(c["losses"], reference[:BEFORE + AFTER], f"rank {rank}: pp2×dp2 vs one process")
        for name in ("dp4", "inter_dp"):
            _close(c[f"{name}_losses"], r["losses"][BEFORE:], f"rank {rank}: {name} resumed vs uninterrupted")


def test_buffers_load_into_every_body(world2):
    results, _ = world2
    _ok(results, "buffers")
    saved = _merged(results, "buffers")
    for name in ("llama_dp", "llama_inter"):
        _assert_same_state(_merged(results, "buffers", f"{name}_digest"), saved, f"llama pp2 -> {name}")
    for rank, by_case in results.items():
        c = by_case["buffers"]
        assert c["llama_dp_buffers"] == ["rope_cos", "rope_sin"] and c["llama_inter_bodies"] == 2, (rank, c)
        for name in ("llama_dp", "llama_inter"):
            assert c[f"{name}_buffer_err"] == 0.0, (rank, name, c[f"{name}_buffer_err"])
            _close(c[f"{name}_losses"], c["want"], f"rank {rank}: {name} resumed vs uninterrupted")
