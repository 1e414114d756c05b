"""Checkpoints on real gloo ranks: save under one plan and world size, load under another.

Two spawns, each running many cases; checks run in the parent. World 4 trains gpt-tiny 10 steps
under a dp2×tp2 plan with ZeRO-3, ZeRO-2 and DDP layers (the tied embedding/head weight ZeRO-3 on
two meshes, one of them ``_StridedShard``), saves, and trains 3 more steps (the uninterrupted
run). World 2 loads that checkpoint into a different plan (tp2 and ZeRO-2/3 dp2 layers) with a
fresh optimizer and trains the same 3 steps: losses and parameters must equal the uninterrupted
world-4 run and a single-process model trained on the same batches (fp32). World 2 also checks a
same-plan round trip (into a fresh module and in place), atomicity (a save that fails before its
manifest, or between its two renames, leaves the previous checkpoint loadable), damaged
checkpoints refused with the same error on every rank, ``load_state_dict`` from a plain
model, parameters the graph never reads (an unused submodule, tied under two names, and a buffer)
kept in ``state_dict()`` and checkpoints, and a save over another model's checkpoint refused
unless ``overwrite=True``. ``GFX_CKPT_ONLY=case,case`` selects world-2 cases.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from harness import assert_ok, config_error, init_gloo, run_jobs, spawn
from test_parallel_module import PARAM_TOL, TOL, T, _batches
from test_zero_runtime import _plan

GBS = 4
BEFORE, AFTER = 10, 3  # steps before the save, steps after the load
NUM_BATCHES = BEFORE + AFTER + 2  # the round trip trains two more
# (dp, tp, dp_type) for [embedding, blocks.0..3, head, loss]
PLAN4 = [(4, 1, "zero3"), (2, 2, "zero3"), (2, 2, "ddp"), (4, 1, "ddp"), (2, 2, "zero2"), (2, 2, "zero3"),
         (2, 2, "ddp")]
PLAN2 = [(1, 2, "ddp"), (2, 1, "zero2"), (1, 2, "ddp"), (2, 1, "zero3"), (2, 1, "ddp"), (1, 2, "ddp"),
         (2, 1, "zero2")]


# ---- helpers run by the workers -----------------------------------------------------------------

def _snapshot(pm, opt) -> dict:
    """Full tensors of every parameter and optimizer state entry, by FQN, from the first copy
    (copies: ``full_tensor()`` of a replicated DTensor is the live local tensor)."""
    import torch

    from galvatron_fx.runtime.checkpoint import slots as cks

    out = {}
    for s in cks.all_slots(pm):
        if s.copy:
            continue
        out[f"model.{s.fqn}"] = cks.slot_view(s, s.param).full_tensor().clone()
        for name, v in opt.state.get(s.param, {}).items():
            out[f"optim.{s.fqn}.{name}"] = (cks.slot_view(s, v).full_tensor() if v.ndim else v).clone()
    assert all(isinstance(v, torch.Tensor) for v in out.values())
    return out


def _max_diff(a: dict, b: dict) -> float:
    return _diff_at(a, b)[0]


def _diff_at(a: dict, b: dict) -> tuple[float, str]:
    """The largest difference between two snapshots, and where."""
    assert set(a) == set(b), sorted(set(a) ^ set(b))[:6]
    errs = {k: (a[k].double() - b[k].double()).abs().max().item() for k in a}
    at = max(errs, key=errs.get, default="")
    return errs.get(at, 0.0), at


def _tied_diff(pm, opt) -> tuple[int, float]:
    """Number of tied copies and the largest difference between a copy and the first one
    (parameters and optimizer state)."""
    from galvatron_fx.runtime.checkpoint import slots as cks

    first = {s.fqn: s for s in cks.all_slots(pm) if s.copy == 0}
    n, worst = 0, 0.0
    for s in cks.all_slots(pm):
        if not s.copy:
            continue
        n += 1
        f = first[s.fqn]
        pairs = [(cks.slot_view(f, f.param), cks.slot_view(s, s.param))]
        pairs += [(cks.slot_view(f, v), cks.slot_view(s, opt.state[s.param][k])) if v.ndim else (v, opt.state[s.param][k])
                  for k, v in opt.state.get(f.param, {}).items()]
        for a, b in pairs:
            a = a.full_tensor() if hasattr(a, "full_tensor") else a
            b = b.full_tensor() if hasattr(b, "full_tensor") else b
            worst = max(worst, (a - b).abs().max().item())
    return n, worst


def _module(name: str, cache: dict):
    """A ParallelModule of gpt-tiny (seed 0) under the plan ``name`` made by the parent."""
    import copy

    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.runtime.parallel_module import ParallelModule

    if "model" not in cache:
        cache["model"], inputs = zoo.build("gpt-tiny", batch_size=GBS, seq_len=T, device="cpu", seed=0)
        cache["mg"] = gfx.capture(cache["model"], inputs, annotate=False)  # costs: the plans are made
    return ParallelModule(copy.deepcopy(cache["model"]), cache["mg"], cache["plans"][name])


# ---- world 4: train, save, keep training -------------------------------------------------------

def _train_save_case(tmp: Path, cache: dict) -> dict:
    import torch
    import torch.distributed as dist

    pm = _module("plan4", cache)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    batches = _batches(GBS, NUM_BATCHES)
    losses = [pm.train_step(b, opt) for b in batches[:BEFORE]]
    pm.save(tmp / "ck4", opt, step=BEFORE, extra={"losses": losses, "seed": torch.arange(3)})
    snap = _snapshot(pm, opt)
    losses += [pm.train_step(b, opt) for b in batches[BEFORE:BEFORE + AFTER]]
    final = pm.state_dict()
    if dist.get_rank() == 0:
        torch.save(snap, tmp / "snapshot4.pt")
        torch.save(final, tmp / "final4.pt")
    strided = any("StridedShard" in type(pl).__name__ for ex in pm.executors for p in ex.parameters()
                  if hasattr(p, "placements") for pl in p.placements)
    return {"losses": losses, "strided": strided, "fsdp": [bool(ex.fsdp) for ex in pm.executors],
            "tied": _tied_diff(pm, opt)[0]}


def _worker4(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    cache: dict = {"plans": pickle.loads((Path(tmp) / "plans.pkl").read_bytes())}
    run_jobs(rank, tmp, [("train_save", lambda: _train_save_case(Path(tmp), cache))])


# ---- world 2 -----------------------------------------------------------------------------------

def _resume_case(ck4: Path, tmp: Path, cache: dict) -> dict:
    """Load the world-4 checkpoint into another plan with a fresh optimizer; train on."""
    import torch
    import torch.distributed as dist

    pm = cache["pm"] = _module("plan2", cache)
    opt = cache["opt"] = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    info = pm.load(ck4, opt)
    out = {"step": info.step, "world_size": info.world_size, "resharded": info.resharded,
           "extra_losses": info.extra["losses"], "extra_seed": info.extra["seed"].tolist()}
    out["load_err"], out["load_err_at"] = _diff_at(_snapshot(pm, opt), torch.load(ck4.parent / "snapshot4.pt"))
    out["num_tied"], out["tied_err"] = _tied_diff(pm, opt)
    batches = _batches(GBS, NUM_BATCHES)
    out["losses"] = [pm.train_step(b, opt) for b in batches[BEFORE:BEFORE + AFTER]]
    final = pm.state_dict()
    if dist.get_rank() == 0:
        torch.save(final, tmp / "final2.pt")
    return out


def _roundtrip_case(tmp: Path, cache: dict) -> dict:
    """Same plan, same world: save, train 2 steps; load into a fresh module (and in place into
    the trained one): state equal, the same 2 losses."""
    import torch

    pm, opt = cache["pm"], cache["opt"]
    batches = _batches(GBS, NUM_BATCHES)[-2:]
    pm.save(tmp / "ck2", opt, step=13)
    saved = _snapshot(pm, opt)
    want = [pm.train_step(b, opt) for b in batches]
    fresh = cache["fresh"] = _module("plan2", cache)
    fresh_opt = cache["fresh_opt"] = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    info = fresh.load(tmp / "ck2", fresh_opt)
    out = {"step": info.step, "resharded": info.resharded, "want": want,
           "fresh_err": _max_diff(_snapshot(fresh, fresh_opt), saved), "tied_err": _tied_diff(fresh, fresh_opt)[1]}
    out["fresh_losses"] = [fresh.train_step(b, fresh_opt) for b in batches]
    pm.load(tmp / "ck2", opt)  # in place, over a trained module and a non-empty optimizer state
    out["inplace_err"] = _max_diff(_snapshot(pm, opt), saved)
    out["inplace_losses"] = [pm.train_step(b, opt) for b in batches]
    return out


def _atomic_case(tmp: Path, cache: dict) -> dict:
    """A save that fails after its shards are written, or between its two renames, leaves the
    previous checkpoint loadable; the next save cleans up."""
    import torch.distributed as dist

    from galvatron_fx.runtime import checkpoint as ck
    from galvatron_fx.runtime.checkpoint import files as ckf

    pm, opt = cache["fresh"], cache["fresh_opt"]
    path = tmp / "ckA"
    batch = _batches(GBS, 1)[0]
    pm.save(path, opt, step=100)
    saved = _snapshot(pm, opt)
    pm.train_step(batch, opt)
    out: dict = {}

    def crash(*_a, **_k):
        raise RuntimeError("simulated crash before the manifest")

    real = ckf._write_manifest
    ckf._write_manifest = crash
    try:
        out["crash_error"] = config_error(lambda: pm.save(path, opt, step=101))
    finally:
        ckf._write_manifest = real
    out["step_after_crash"] = ck.read_manifest(path)["step"]
    out["tmp_left"] = [p.name.split("-")[0] for p in tmp.glob(".ckA.tmp-*")]
    info = pm.load(path, opt)
    out["crash_load_step"], out["crash_load_err"] = info.step, _max_diff(_snapshot(pm, opt), saved)
    dist.barrier()

    # the disk fills while rank 1 writes its shard: named, the unfinished save removed, the previous one kept
    import errno

    import torch.distributed.checkpoint.filesystem as dcp_fs

    real_item = dcp_fs._write_item

    def full(*a, **k):
        if dist.get_rank() == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_item(*a, **k)

    out["tmp_before_full"] = sorted(p.name for p in tmp.glob(".ckA.tmp-*"))  # (the crash's, which the next save clears)
    dcp_fs._write_item = full
    try:
        out["full_error"] = config_error(lambda: pm.save(path, opt, step=104))
    finally:
        dcp_fs._write_item = real_item
    dist.barrier()
    out["tmp_after_full"] = sorted(p.name for p in tmp.glob(".ckA.tmp-*"))
    out["step_after_full"] = ck.read_manifest(path)["step"]

    # killed between ``path -> .old`` and ``tmp -> path``
    pm.train_step(batch, opt)

    def half_swap(tmp_dir, final, token):
        import os

        os.rename(final, final.parent / f".{final.name}.old-{token}")
        raise RuntimeError("simulated crash between the renames")

    real_swap = ckf._swap
    ckf._swap = half_swap
    try:
        out["swap_error"] = config_error(lambda: pm.save(path, opt, step=102))
    finally:
        ckf._swap = real_swap
    out["path_exists_after_swap_crash"] = path.exists()
    info = pm.load(path, opt)
    out["fallback_dir"] = info.path.name.split("-")[0]
    out["fallback_step"], out["fallback_err"] = info.step, _max_diff(_snapshot(pm, opt), saved)
    dist.barrier()

    pm.save(path, opt, step=103)
    out["step_after_good_save"] = ck.read_manifest(path)["step"]
    out["left_after_good_save"] = sorted(p.name for p in tmp.iterdir() if p.name.startswith(".ckA"))
    out["verify_ok"] = ck.verify(path)["step"]
    return out


def _damaged_case(tmp: Path, cache: dict) -> dict:
    """Truncated, altered and unfinished checkpoints and other FQNs: the same ConfigError on
    every rank, and the module untouched."""
    import shutil

    import torch.distributed as dist

    pm, opt = cache["fresh"], cache["fresh_opt"]
    good = tmp / "ck2"
    if dist.get_rank() == 0:
        for name in ("trunc", "flip", "unfinished"):
            shutil.copytree(good, tmp / name)
        f = tmp / "trunc" / "__1_0.distcp"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        f = tmp / "flip" / "__0_0.distcp"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
        (tmp / "unfinished" / "manifest.json").unlink()
    dist.barrier()
    before = _snapshot(pm, opt)
    out = {name: config_error(lambda name=name: pm.load(tmp / name, opt)) for name in ("trunc", "flip", "unfinished")}
    out["nowhere"] = config_error(lambda: pm.load(tmp / "nowhere", opt))
    ex = pm.executors[1]
    key = next(iter(ex.fqn_of_key))
    real = ex.fqn_of_key[key]
    ex.fqn_of_key[key] = "renamed.weight"  # a module with other FQNs
    try:
        out["fqns"] = config_error(lambda: pm.load(good, opt))
    finally:
        ex.fqn_of_key[key] = real
    out["untouched_err"] = _max_diff(_snapshot(pm, opt), before)
    (tmp / "notckpt").mkdir(exist_ok=True)
    dist.barrier()
    if dist.get_rank() == 0:
        (tmp / "notckpt" / "data.txt").write_text("user data")
    dist.barrier()
    out["replace_foreign"] = config_error(lambda: pm.save(tmp / "notckpt", opt))
    out["bad_extra"] = config_error(lambda: pm.save(tmp / "ckX", opt, extra={"scheduler": object()}))
    out["bad_extra_left"] = sorted(p.name for p in tmp.iterdir() if "ckX" in p.name)
    return out


def _load_state_dict_case(cache: dict) -> dict:
    """A plain model's state dict reproduces its loss; bad dicts are refused."""
    import torch

    from galvatron_fx import zoo

    pm = cache["fresh"]
    plain, _ = zoo.build("gpt-tiny", batch_size=GBS, seq_len=T, device="cpu", seed=1)
    sd = plain.state_dict()
    r = pm.load_state_dict(sd)
    out = {"missing": r.missing_keys, "unexpected": r.unexpected_keys, "has_alias": "lm_head.weight" in sd}
    batch = _batches(GBS, 1)[0]
    with torch.no_grad():
        out["loss_err"] = abs(pm(*batch).item() - plain(*batch).item())
        out["moved"] = abs(pm(*batch).item() - cache["model"](*batch).item())
    got = pm.state_dict()
    out["param_err"] = max((got[k] - v).abs().max().item() for k, v in sd.items())
    out["num_tied"], out["tied_err"] = _tied_diff(pm, cache["fresh_opt"])
    dropped = {k: v for k, v in sd.items() if k != "blocks.0.attn.qkv.weight"} if "blocks.0.attn.qkv.weight" in sd \
        else dict(list(sd.items())[1:])
    out["drop_key"] = sorted(set(sd) - set(dropped))[0]
    out["missing_error"] = config_error(lambda: pm.load_state_dict(dropped))
    out["missing_lenient"] = pm.load_state_dict(dropped, strict=False).missing_keys
    out["unexpected_error"] = config_error(lambda: pm.load_state_dict(sd | {"bogus.weight": torch.zeros(2)}))
    k0 = next(k for k, v in sd.items() if v.ndim == 2)
    out["shape_error"] = config_error(lambda: pm.load_state_dict(sd | {k0: sd[k0][:-1]}))
    out["tied_error"] = config_error(lambda: pm.load_state_dict(sd | {"lm_head.weight": sd["lm_head.weight"] + 1}))
    return out


# gpt-tiny with a submodule its forward never calls (under two names: a tied pair) and a buffer it
# never reads
UNUSED = ("unused.weight", "unused.bias", "unused_alias.weight", "unused_alias.bias", "unused_buf")


def _unused_model():
    """gpt-tiny (seed 0) with the unused parts of ``UNUSED``, the same on every rank."""
    import torch

    from galvatron_fx import zoo

    model, inputs = zoo.build("gpt-tiny", batch_size=GBS, seq_len=T, device="cpu", seed=0)
    g = torch.Generator().manual_seed(7)
    model.unused = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for p in model.unused.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model.unused_alias = model.unused
    model.register_buffer("unused_buf", torch.randn(5, generator=g))
    return model, inputs


def _max_err(a: dict, b: dict, keys) -> float | None:
    """The largest difference of ``keys`` between two state dicts; None if a key is missing."""
    if any(k not in a or k not in b for k in keys):
        return None
    return max((a[k].double() - b[k].double()).abs().max().item() for k in keys)


def _unused_case(tmp: Path, cache: dict) -> dict:
    """Unused parameters and buffer: in ``state_dict()`` bit-equal to the user's model, untouched
    by training, saved, loaded back under another plan (ZeRO-3: the used parameters sharded) over
    other values, and taken by ``load_state_dict``."""
    import copy

    import torch

    import galvatron_fx as gfx
    from galvatron_fx.runtime import checkpoint as ck
    from galvatron_fx.runtime.parallel_module import ParallelModule

    model, inputs = _unused_model()
    mg = gfx.capture(model, inputs, annotate=False)
    # the two plans name the model differently: a checkpoint belongs to the parameters, not the name
    plans = {t: _plan(mg, 2, (2, 1, t), gbs=GBS, m=1, name=f"gpt-tiny+unused/{t}") for t in ("ddp", "zero3")}
    user = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pm = cache["unused_pm"] = ParallelModule(copy.deepcopy(model), mg, plans["ddp"])
    sd = pm.state_dict()
    out: dict = {"missing": sorted(set(user) - set(sd)), "extra": sorted(set(sd) - set(user)),
                 "unused_err": _max_err(sd, user, UNUSED)}
    opt = cache["unused_opt"] = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    for b in _batches(GBS, 2):
        pm.train_step(b, opt)
    sd = pm.state_dict()
    out["trained_unused_err"] = _max_err(sd, user, UNUSED)
    out["trained_used_moved"] = _max_err(sd, user, ["blocks.0.attn.qkv.weight"])
    out["lsd_own"] = config_error(lambda: pm.load_state_dict(sd))
    pm.save(tmp / "ckU", opt, step=2)
    out["saved_keys"] = sorted(k for k in ck.read_dcp_metadata(tmp / "ckU").state_dict_metadata if "unused" in k)

    other = copy.deepcopy(model)
    with torch.no_grad():
        for t in (*other.unused.parameters(), other.unused_buf):
            t.add_(1.0)
    fresh = cache["unused_fresh"] = ParallelModule(other, mg, plans["zero3"])
    fresh_opt = cache["unused_fresh_opt"] = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    out["before_load_err"] = _max_err(fresh.state_dict(), user, UNUSED)
    info = fresh.load(tmp / "ckU", fresh_opt)
    got = fresh.state_dict()
    out["load_resharded"] = info.resharded
    out["load_keys_equal"] = set(got) == set(sd)
    out["load_err"] = _max_err(got, sd, sd)
    out["load_unused_err"] = _max_err(got, user, UNUSED)

    shifted = {k: v + 2.0 if k in UNUSED else v for k, v in user.items()}
    out["lsd"] = config_error(lambda: fresh.load_state_dict(shifted))
    out["lsd_unused_err"] = _max_err(fresh.state_dict(), shifted, UNUSED)
    split = shifted | {"unused_alias.weight": shifted["unused.weight"] + 1}
    out["lsd_tied_error"] = config_error(lambda: fresh.load_state_dict(split))
    out["lsd_missing_error"] = config_error(lambda: fresh.load_state_dict(
        {k: v for k, v in user.items() if not k.startswith("unused.") and not k.startswith("unused_alias.")}))
    return out


def _foreign_target_case(tmp: Path, cache: dict) -> dict:
    """A save into a directory holding another model's checkpoint is refused on every rank with
    nothing written, unless ``overwrite=True``; a newer checkpoint of the same model (under
    another plan) replaces it as before. Runs after ``unused`` (its modules)."""
    import torch.distributed as dist

    from galvatron_fx.runtime import checkpoint as ck

    gpt, gpt_opt = cache["fresh"], cache["fresh_opt"]
    pm, opt = cache["unused_pm"], cache["unused_opt"]
    path = tmp / "ckF"
    gpt.save(path, gpt_opt, step=1)
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir())
    out: dict = {"refused": config_error(lambda: pm.save(path, opt, step=2))}
    dist.barrier()
    out["kept"] = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()) == files
    out["left"] = sorted(p.name for p in tmp.iterdir() if p.name.startswith(".ckF"))
    out["kept_loads"] = gpt.load(path, gpt_opt).step
    pm.save(path, opt, step=3, overwrite=True)
    out["overwritten"] = [ck.read_manifest(path)[k] for k in ("plan_model", "step")]
    cache["unused_fresh"].save(path, cache["unused_fresh_opt"], step=4)  # the same model, another plan
    out["same_model"] = [ck.read_manifest(path)[k] for k in ("plan_model", "step")]
    out["refused_back"] = config_error(lambda: gpt.save(path, gpt_opt, step=5))
    out["final_step"] = ck.read_manifest(path)["step"]
    return out


def _worker2(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    tmp_p = Path(tmp)
    cache: dict = {"plans": pickle.loads((tmp_p / "plans.pkl").read_bytes())}
    ck4 = Path((tmp_p / "ck4.txt").read_text())
    run_jobs(rank, tmp, [("resume", lambda: _resume_case(ck4, tmp_p, cache)),
                         ("roundtrip", lambda: _roundtrip_case(tmp_p, cache)),
                         ("atomic", lambda: _atomic_case(tmp_p, cache)),
                         ("damaged", lambda: _damaged_case(tmp_p, cache)),
                         ("load_state_dict", lambda: _load_state_dict_case(cache)),
                         ("unused", lambda: _unused_case(tmp_p, cache)),
                         ("foreign_target", lambda: _foreign_target_case(tmp_p, cache))],
             only_env="GFX_CKPT_ONLY")


# ---- fixtures and checks ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plans() -> bytes:
    """The two plans, pickled, made once here (capture and intra-layer ILPs) for every rank (hand-made
    plans predict nothing, which their JSON loader refuses)."""
    import galvatron_fx as gfx
    from galvatron_fx import zoo

    model, inputs = zoo.build("gpt-tiny", batch_size=GBS, seq_len=T, device="cpu", seed=0)
    mg = gfx.capture(model, inputs)
    return pickle.dumps({"plan4": _plan(mg, 4, PLAN4, gbs=GBS, m=1, name="plan4"),
                         "plan2": _plan(mg, 2, PLAN2, gbs=GBS, m=1, name="plan2")})


@pytest.fixture(scope="module")
def world4(tmp_path_factory, plans) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("ckpt4")
    (tmp / "plans.pkl").write_bytes(plans)
    return spawn(_worker4, 4, tmp), tmp


@pytest.fixture(scope="module")
def world2(tmp_path_factory, plans, world4) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("ckpt2")
    (tmp / "plans.pkl").write_bytes(plans)
    (tmp / "ck4.txt").write_text(str(world4[1] / "ck4"))
    return spawn(_worker2, 2, tmp), tmp


@pytest.fixture(scope="module")
def reference() -> dict:
    """The uninterrupted single-process run: the plain model, AdamW, the same batches."""
    import torch

    from galvatron_fx import zoo

    model, _ = zoo.build("gpt-tiny", batch_size=GBS, seq_len=T, device="cpu", seed=0)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for b in _batches(GBS, BEFORE + AFTER):
        loss = model(*b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "final": {k: v.detach().clone() for k, v in model.state_dict().items()}, "init": init}


def _ok(results: dict, key: str) -> dict:
    if key not in results[0]:
        pytest.skip(f"{key} not selected (GFX_CKPT_ONLY)")
    return assert_ok(results, key)


def test_world4_run_trains_like_one_process_and_saves(world4, reference):
    results, tmp = world4
    r = assert_ok(results, "train_save")
    assert r["strided"], "the world-4 plan should hold a _StridedShard (ZeRO-3 over a tp-sharded dim)"
    assert sum(r["fsdp"]) >= 3 and r["tied"] == 1
    errs = [abs(a - b) for a, b in zip(r["losses"], reference["losses"])]
    assert len(errs) == BEFORE + AFTER and max(errs) <= TOL, errs
    manifest = json.loads((tmp / "ck4" / "manifest.json").read_text())
    assert manifest["world_size"] == 4 and manifest["step"] == BEFORE
    assert {"plan.json", "trainer_state.pt", ".metadata"} <= set(manifest["files"])
    assert sum(n.endswith(".distcp") for n in manifest["files"]) == 4


def test_world4_checkpoint_resumes_at_world2_under_another_plan(world2, world4, reference):
    """The headline: a dp2×tp2/ZeRO checkpoint, loaded at world 2 under tp2/ZeRO-2/3 with a fresh
    optimizer, continues exactly like the uninterrupted runs."""
    import torch

    results, tmp = world2
    _ok(results, "resume")
    w4 = assert_ok(world4[0], "train_save")
    for rank, by_case in results.items():
        c = by_case["resume"]
        assert c["load_err"] == 0.0, \
            f"rank {rank}: loaded state differs from the saved one by {c['load_err']} at {c['load_err_at']}"
        assert c["num_tied"] == 1 and c["tied_err"] == 0.0, (rank, c["tied_err"])
        assert c["step"] == BEFORE and c["world_size"] == 4 and c["resharded"]
        assert c["extra_losses"] == w4["losses"][:BEFORE] and c["extra_seed"] == [0, 1, 2]
        vs_w4 = [abs(a - b) for a, b in zip(c["losses"], w4["losses"][BEFORE:])]
        vs_ref = [abs(a - b) for a, b in zip(c["losses"], reference["losses"][BEFORE:])]
        assert max(vs_w4) <= TOL, f"rank {rank}: resumed losses vs uninterrupted world 4: {vs_w4}"
        assert max(vs_ref) <= TOL, f"rank {rank}: resumed losses vs one process: {vs_ref}"
    final2, final4 = torch.load(tmp / "final2.pt"), torch.load(world4[1] / "final4.pt")
    ref, init = reference["final"], reference["init"]
    assert set(final2) >= set(ref)
    assert max((final2[k] - final4[k]).abs().max().item() for k in ref) <= PARAM_TOL
    assert max((final2[k] - v).abs().max().item() for k, v in ref.items()) <= PARAM_TOL
    assert max((v - init[k]).abs().max().item() for k, v in ref.items()) > 10 * PARAM_TOL  # the test can fail


def test_round_trip_at_world2(world2):
    results, _ = world2
    _ok(results, "roundtrip")
    for rank, by_case in results.items():
        c = by_case["roundtrip"]
        assert c["step"] == 13 and not c["resharded"]
        assert c["fresh_err"] == 0.0 and c["inplace_err"] == 0.0 and c["tied_err"] == 0.0, (rank, c)
        # a fresh interpreted module vs the lowered one that saved: the same ops, float-equal in practice
        errs = [abs(x - y) for x, y in zip(c["fresh_losses"], c["want"])]
        assert len(errs) == 2 and max(errs) <= 1e-6, (rank, c["fresh_losses"], c["want"])
        assert c["inplace_losses"] == c["want"], (rank, c["inplace_losses"], c["want"])


def test_failed_save_keeps_the_previous_checkpoint(world2):
    results, tmp = world2
    _ok(results, "atomic")
    for rank, by_case in results.items():
        c = by_case["atomic"]
        assert c["crash_error"].startswith("ConfigError") and "simulated crash" in c["crash_error"], (rank, c)
        assert "previous checkpoint" in c["crash_error"] and "intact" in c["crash_error"]
        assert c["step_after_crash"] == 100 and c["tmp_left"] == [".ckA.tmp"], (rank, c)
        assert c["crash_load_step"] == 100 and c["crash_load_err"] == 0.0
        assert "the disk holding it is full" in c["full_error"] and "intact" in c["full_error"], (rank, c["full_error"])
        assert c["tmp_after_full"] == c["tmp_before_full"] and c["step_after_full"] == 100, (rank, c)
        assert c["swap_error"].startswith("ConfigError") and not c["path_exists_after_swap_crash"]
        assert c["fallback_dir"] == ".ckA.old" and c["fallback_step"] == 100 and c["fallback_err"] == 0.0
        assert c["step_after_good_save"] == 103 and c["verify_ok"] == 103
        assert c["left_after_good_save"] == [], f"stale directories left: {c['left_after_good_save']}"
    assert not any(p.name.startswith(".ckA") for p in tmp.iterdir())


def test_damaged_checkpoints_are_refused_on_every_rank(world2):
    results, _ = world2
    _ok(results, "damaged")
    msgs = {}
    for rank, by_case in results.items():
        c = by_case["damaged"]
        assert c["untouched_err"] == 0.0, "a refused load changed the module"
        assert "__1_0.distcp" in c["trunc"] and "truncated" in c["trunc"] and "earlier checkpoint" in c["trunc"]
        assert "__0_0.distcp" in c["flip"] and "sha256" in c["flip"]
        assert "manifest.json" in c["unfinished"] and "did not finish" in c["unfinished"]
        assert "does not exist" in c["nowhere"]
        assert "renamed.weight" in c["fqns"] and "missing" in c["fqns"] and "unexpected" in c["fqns"]
        assert "refusing to replace" in c["replace_foreign"]
        assert "extra" in c["bad_extra"] and "state_dict()" in c["bad_extra"] and c["bad_extra_left"] == []
        for k in ("trunc", "flip", "unfinished", "nowhere", "fqns", "replace_foreign", "bad_extra"):
            assert c[k].startswith("ConfigError"), (rank, k, c[k])
            msgs.setdefault(k, set()).add(c[k])
    assert all(len(v) == 1 for v in msgs.values()), "ranks raised different errors"


def test_load_state_dict_from_a_plain_model(world2):
    results, _ = world2
    r = _ok(results, "load_state_dict")
    for rank, by_case in results.items():
        c = by_case["load_state_dict"]
        assert c["missing"] == [] and c["unexpected"] == [] and c["has_alias"]
        assert c["loss_err"] <= TOL and c["moved"] > 100 * TOL, (rank, c["loss_err"], c["moved"])
        assert c["param_err"] == 0.0 and c["num_tied"] == 1 and c["tied_err"] == 0.0
        assert c["missing_error"].startswith("ConfigError") and c["drop_key"] in c["missing_error"]
        assert c["missing_lenient"] == [c["drop_key"]]
        assert "bogus.weight" in c["unexpected_error"]
        assert "shape" in c["shape_error"] and "tied" in c["tied_error"]
    assert r["missing_error"].count("missing") >= 1


def test_unused_parameters_are_kept_in_state_dict_and_checkpoints(world2):
    """Parameters and a buffer no layer reads: every key of the user's model is in
    ``state_dict()``, bit-equal and untouched by training, saved, restored by a load under
    another plan over other values, and taken (and checked) by ``load_state_dict``."""
    results, _ = world2
    _ok(results, "unused")
    for rank, by_case in results.items():
        c = by_case["unused"]
        assert c["missing"] == [] and c["extra"] == [], (rank, c["missing"], c["extra"])
        assert c["unused_err"] == 0.0 and c["trained_unused_err"] == 0.0, (rank, c)
        assert c["trained_used_moved"] > 0.0, "training did not move the used weights: the check cannot fail"
        assert c["lsd_own"] == "no error", (rank, c["lsd_own"])
        assert c["saved_keys"] == ["model.unused.bias", "model.unused.weight", "model.unused_buf"], c["saved_keys"]
        assert abs(c["before_load_err"] - 1.0) < 1e-6, "the module to load into should start with other unused values"
        assert c["load_resharded"] and c["load_keys_equal"], (rank, c)
        assert c["load_err"] == 0.0 and c["load_unused_err"] == 0.0, (rank, c["load_err"], c["load_unused_err"])
        assert c["lsd"] == "no error" and c["lsd_unused_err"] == 0.0, (rank, c["lsd"], c["lsd_unused_err"])
        assert "unused.weight and unused_alias.weight" in c["lsd_tied_error"], (rank, c["lsd_tied_error"])
        assert c["lsd_missing_error"].startswith("ConfigError") and "unused.weight" in c["lsd_missing_error"], \
            (rank, c["lsd_missing_error"])


def test_saving_over_another_models_checkpoint_needs_overwrite(world2):
    results, _ = world2
    _ok(results, "foreign_target")
    msgs = set()
    for rank, by_case in results.items():
        c = by_case["foreign_target"]
        msg = c["refused"]
        assert msg.startswith("ConfigError") and "refusing to replace" in msg and "overwrite=True" in msg, (rank, msg)
        assert "'plan2'" in msg and "'gpt-tiny+unused/ddp'" in msg, f"both models should be named: {msg}"
        assert "this model has unused_buf, which that checkpoint lacks" in msg, msg
        assert c["kept"] and c["left"] == [] and c["kept_loads"] == 1, (rank, c)
        assert c["overwritten"] == ["gpt-tiny+unused/ddp", 3], (rank, c["overwritten"])
        assert c["same_model"] == ["gpt-tiny+unused/zero3", 4], (rank, c["same_model"])
        back = c["refused_back"]
        assert back.startswith("ConfigError") and "'gpt-tiny+unused/zero3' (step 4)" in back and "'plan2'" in back, back
        assert "that checkpoint has unused.bias, unused.weight, unused_buf, which this model lacks" in back, back
        assert c["final_step"] == 4
        msgs |= {msg, c["refused_back"]}
    assert len(msgs) == 2, "ranks raised different errors"
