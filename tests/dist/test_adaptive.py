"""The closed loop on real gloo ranks: observe, refit, re-plan and switch in place.

One spawn at world 2 and one at world 4. On each, the cluster's link is measured first (all-reduces
on the world group, rank 0's figures broadcast) and described two ways: as measured (the correct
model) and with a 100× lower bandwidth (a deliberately wrong one; 100× higher where the measured
link is itself so slow that both pick the same plan). A zoo GPT compiled on the
wrong cluster gets another plan, one the correct model prices worse; after warm-up it observes a
few steps, refits the link rates alone (``fit=("links",)``: compute is priced alike in both
models, so the link is what was wrong) and re-plans. It must switch, in place, every rank to the
same plan, its losses — before, across and after the switch — equal to an uninterrupted
single-process run's within fp32 rounding; the refitted link's time for the largest probe must be
the measured one's to within the load's noise (not 100× off), and the new plan the one the model with the link as the
refit measured it picks (its latency and bandwidth, timed again under four busy ranks on two
cores, can be several times the spawn's first measure: which plan is right moves with them).
``compile(adapt=True)`` does the same by itself, but refits compute and the optimizer too, so its
re-plan is checked by the switch and the recovered link.
A Hugging Face Llama switches between hand-made plans with ZeRO-3 and DDP layers and then to a
longer context (``replan(seq_len=...)``), its AdamW state carried over: losses equal one
process's. The full refit's prediction of the running plan is checked on later steps.
"""

from __future__ import annotations

import math

import hf_tiny
import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn

from galvatron_fx.runtime.observe import LINK_PROBE_BYTES

# this module refits step and link times from what it measures, and checks their predictions:
# `make test` runs it alone, not beside the unit tests
pytestmark = pytest.mark.timing

LOSS_TOL = 2e-5  # |loss − one process's|, fp32 (sums in another order)
SLOW = 100.0
BATCHES = 3


_MEASURED: dict = {}


def _link_time(nbytes: int) -> float:
    """An all-reduce of ``nbytes`` on the world group: the fastest of 15 after 3 warm-ups, as the
    refit's probes take it (rank 0's figure, broadcast)."""
    import time

    import torch
    import torch.distributed as dist

    x = torch.ones(nbytes // 4)
    for _ in range(3):
        dist.all_reduce(x)
    ts = []
    for _ in range(15):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        ts.append(time.perf_counter() - t0)
    box = [min(ts)]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _measured_cluster(world: int):
    """``Cluster.local_cpu(world)`` with its links set to what an all-reduce measures here (rank
    0's figures, measured once per spawn)."""
    if world in _MEASURED:
        return _MEASURED[world]

    import galvatron_fx as gfx

    cl = gfx.Cluster.local_cpu(world)
    (b0, t0), (b1, t1) = sorted((n, _link_time(n)) for n in LINK_PROBE_BYTES)
    factor = 2 * (world - 1) / world
    bw = factor * (b1 - b0) / max(t1 - t0, 1e-6)
    lat = max(t0 - factor * b0 / bw, 1e-6)
    _MEASURED[world] = right = _described(cl, lat, bw)
    return right


def _wrong_cluster(right, mg, correct) -> tuple[object, float]:
    """``right`` with its bandwidth ``SLOW``× too low, or, where that gives the plan the correct
    model gives (a link measured so slow under load that both avoid it), ``SLOW``× too high; with
    the factor the bandwidth was divided by. The bandwidth is wrong, the latency right: the bytes a
    plan moves decide."""
    import galvatron_fx as gfx

    t = right.intra_node
    for factor in (SLOW, 1 / SLOW):
        wrong = _described(right, t.latency_s, t.bandwidth_bytes_s / factor)
        if _signature(gfx.plan(mg, wrong, global_batch_size=8)) != _signature(correct):
            return wrong, factor
    return wrong, factor  # (the check of the first plan names it)


def _described(cl, latency_s: float, bandwidth_bytes_s: float):
    """``cl`` with both link tiers at ``latency_s`` and ``bandwidth_bytes_s`` (α-β, no fits)."""
    import dataclasses

    def tier(t):
        return dataclasses.replace(t, latency_s=latency_s, bandwidth_bytes_s=bandwidth_bytes_s, fits={})

    return dataclasses.replace(cl, intra_node=tier(cl.intra_node), inter_node=tier(cl.inter_node))


def _as_priced(fit) -> tuple[float, float]:
    """A link fit ``(a, b, a0, b0)`` as the refitted model prices the link: its all-reduce's
    latency and seconds per byte (a slope fitted as 0, the larger probe no faster than the
    smaller under load, takes the latency's factor, as the model does)."""
    from galvatron_fx.cost_models.refit import link_scales

    _a, _b, a0, b0 = fit
    ka, kb = link_scales(fit)
    return a0 * ka, b0 * kb


def _signature(plan) -> dict:
    """A plan's layout: pipeline degree and each layer's dp and strategy (the micro-batch count,
    a near tie on this machine, is left out)."""
    return {"pp": plan.pp, "layers": [(lp.dp, lp.strategy.short()) for lp in plan.layers]}


def _reference(model, batches, steps: int) -> list[float]:
    import copy

    import torch

    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    out = []
    for i in range(steps):
        loss = ref(*batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def _wrong_link(adapt: bool) -> dict:
    """The zoo GPT on a cluster whose link is 100× too slow (or too fast: :func:`_wrong_cluster`):
    refit the links, re-plan, switch."""
    import copy

    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx import zoo

    world = dist.get_world_size()
    right = _measured_cluster(world)
    model, inputs = zoo.build("gpt-tiny", batch_size=8, seq_len=64, device="cpu", seed=0)
    batches = [tuple(t.roll(i, dims=1) for t in inputs) for i in range(BATCHES)]
    mg = gfx.capture(model, inputs)
    correct = gfx.plan(mg, right, global_batch_size=8)
    wrong, factor = _wrong_cluster(right, mg, correct)
    warmup, observe, after = 2, 3, 3
    # threshold 0: the test asks which plan the refitted model picks (the 5% rule of a switch
    # that pays is the benchmark's and the demo's)
    pm = gfx.compile(copy.deepcopy(model), wrong, inputs, global_batch_size=8,
                     adapt={"warmup": warmup, "steps": observe, "threshold": 0.0} if adapt else False)
    first = pm.plan
    opt = torch.optim.AdamW(pm.named_parameters(), lr=1e-3)  # (by name: replan keeps the names right)
    losses, res = [], {}
    steps = warmup + observe + (0 if adapt else 1) + after
    for i in range(steps):
        if not adapt and i == warmup:
            pm.observe(observe)
        if not adapt and i == warmup + observe + 1:
            fit = pm.refit(fit=("links",))
            r = pm.replan(opt, refit=fit, threshold=0.0)
            res.update(switched=r.switched, reason=r.reason, refit=fit.lines(), links=fit.factors.links,
                       old_s=r.old_predicted_s, new_s=r.new_predicted_s)
            # the cluster described with the link as the refit measured it (a + b·bytes all-reduces)
            a, b = _as_priced(fit.factors.links["intra_node"])
            as_measured = _described(right, a, 2 * (world - 1) / world / b)
            # the largest probe's all-reduce timed again now, under the load the refit's probes met
            res["link_now_s"] = _link_time(max(LINK_PROBE_BYTES))
        losses.append(pm.train_step(batches[i % BATCHES], opt))
    if adapt:
        fit, r = pm.adapt_report
        res.update(switched=r.switched, reason=r.reason, refit=fit.lines(), links=fit.factors.links,
                   old_s=r.old_predicted_s, new_s=r.new_predicted_s)
    hashes = [None] * world
    dist.all_gather_object(hashes, pm.plan.plan_hash())
    # the loop is the session's, above the module: nothing of the module patched, the session's module is it
    res["session_ok"] = [pm.closed_loop.module is pm, sorted({"train_step", "sync_grads"} & set(vars(pm))),
                         [getattr(h, "__self__", None) is pm._recorder for h in pm.hooks.step]]
    (group,) = opt.state_dict()["param_groups"]
    res["names_ok"] = len(group["param_names"]) == len(group["params"]) and \
        sorted(group["param_names"]) == sorted(n for n, _ in pm.named_parameters())
    ref = _reference(model, batches, steps)
    # the first plan under the correct model (how much worse it is than that model's own choice)
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.search.price_plan import price_plan

    first_s = price_plan(first, mg, AnalyticCostModel(right)).predicted.step_time_s
    if not adapt:  # the choice of the model whose link is as measured, and the re-plan under it
        choice = gfx.plan(mg, as_measured, global_batch_size=8)
        res.update(measured_choice=_signature(choice), measured_choice_s=choice.predicted.step_time_s,
                   now_measured_s=price_plan(pm.plan, mg, AnalyticCostModel(as_measured)).predicted.step_time_s)
    return {**res, "first": _signature(first), "correct": _signature(correct), "now": _signature(pm.plan),
            "correct_s": correct.predicted.step_time_s, "first_s": first_s, "factor": factor,
            "hashes": hashes, "loss_err": max(abs(a - b) for a, b in zip(losses, ref)), "losses": losses}


def _hf_switch_and_longer_context() -> dict:
    """A HF Llama: switch between hand-made plans (ZeRO-3 / DDP layers, then a pipeline at world
    4), then to a longer context; AdamW state carried over; losses against one process."""
    import copy
    import dataclasses

    import torch
    import torch.distributed as dist
    from test_parallel_module import make_plan

    import galvatron_fx as gfx

    world = dist.get_world_size()
    model, _ = hf_tiny.build("llama")
    short = [hf_tiny.batch("llama", 4, seed=10 + i) for i in range(2)]
    seq = short[0]["input_ids"].shape[1]
    long = [{k: v.repeat(1, 2) for k, v in b.items()} for b in short]  # twice the context
    pm = gfx.compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), short[0], global_batch_size=4,
                     search={"pp": (1,)})
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    errs, plans = [], []

    def both(b):
        got = pm.train_step(b, opt)
        loss = ref(**b).loss
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        errs.append(abs(got - loss.item()))

    for i in range(2):
        both(short[i % 2])
    plans.append(_signature(pm.plan))
    spec = [(world, 1, "none", "none", "zero3" if i % 2 else "ddp") for i in range(len(pm.mg.layers))]
    hand = make_plan(pm.mg, world, spec, gbs=4, m=2 if world == 2 else 1, name="llama-hand")
    hand = dataclasses.replace(hand, cluster=pm.plan.cluster)
    pm.switch_to(hand, opt)
    for i in range(2):
        both(short[i % 2])
    plans.append(_signature(pm.plan))
    from galvatron_fx.errors import ConfigError

    refused = []
    for bad in (-1, 0):  # nonsense lengths: named, before any search or collective
        try:
            pm.replan(opt, seq_len=bad)
        except ConfigError as e:
            refused.append(str(e))
    r = pm.replan(opt, seq_len=2 * seq)
    for i in range(2):
        both(long[i % 2])
    plans.append(_signature(pm.plan))
    return {"loss_err": max(errs), "plans": plans, "switched": r.switched, "seq_after": 2 * seq, "refused": refused,
            "params_on_optimizer": sum(len(g["params"]) for g in opt.param_groups),
            "params_of_module": len(list(pm.parameters()))}


def _refit_predicts_later_steps() -> dict:
    """The full refit of a running plan, against steps measured after it."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx import zoo

    model, inputs = zoo.build("gpt-tiny", batch_size=8, seq_len=64, device="cpu", seed=0)
    pm = gfx.compile(model, gfx.Cluster.local_cpu(dist.get_world_size()), inputs, global_batch_size=8,
                     search={"pp": (1,), "num_microbatches": (1,)})
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    for _ in range(5):  # the first steps of a process run slower for a while: past them
        pm.train_step(inputs, opt)
    pm.observe(6)
    for _ in range(7):  # one more: the step MemTracker measures memory on
        pm.train_step(inputs, opt)
    fit = pm.refit()
    later = []
    for _ in range(8):
        t0 = time.perf_counter()
        pm.train_step(inputs, opt)
        later.append(time.perf_counter() - t0)
    box = [statistics.median(later)]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, box[0])
    measured = max(every)
    return {"before": abs(fit.predicted_step_s - measured) / measured,
            "after": abs(fit.refitted_step_s - measured) / measured,
            "memory_after": abs(fit.refitted_peak_bytes - fit.measured_peak_bytes) / fit.measured_peak_bytes,
            "measured_peak": fit.measured_peak_bytes, "lines": fit.lines()}


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    jobs = [("wrong_link", lambda: _wrong_link(False)), ("adapt", lambda: _wrong_link(True)),
            ("hf", _hf_switch_and_longer_context)]
    if world == 2:
        jobs.append(("refit", _refit_predicts_later_steps))
    run_jobs(rank, tmp, jobs)


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("adapt2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("adapt4"))


def _check_wrong_link(res: dict) -> None:
    for key in ("wrong_link", "adapt"):
        x = assert_ok(res, key)
        assert x["first"] != x["correct"], "a link 100× too slow or too fast should give another first plan"
        assert x["first_s"] > 1.1 * x["correct_s"], x  # ... a worse one, under the correct model
        # it switches exactly when the refitted model prices the searched plan faster (threshold 0).
        # Whether it does depends on the load the probes met: the link recovered within 10× (below)
        # may make the first plan the refitted model's choice too (CI once kept it at "1.000× faster")
        # (or switched back: adapt=True measures the new plan and keeps it only if it is faster)
        kept_rightly = x["new_s"] >= x["old_s"] * (1 - 1e-6) or x["reason"].startswith(
            ("the search chose the running plan again", "switched back"))
        assert (x["new_s"] < x["old_s"]) if x["switched"] else kept_rightly, (x["reason"], x["old_s"], x["new_s"])
        # the link is recovered to within the load's noise, not 100× off (nearer the right time than the
        # wrong one, whichever way the wrong link erred): judged by the time of an
        # all-reduce of the largest probe (the size the fit measured). The slope alone is not: two
        # probes on a loaded 2-core machine trade latency for bandwidth (CI once fitted 1.5 ms +
        # 47 GB/s for a 0.1 ms + 3 GB/s link: the same 4 MiB time, a 15× slope)
        big = max(LINK_PROBE_BYTES)
        for a, b, a0, b0 in x["links"].values():
            fa, fb = _as_priced((a, b, a0, b0))
            t, right, wrong = fa + fb * big, a0 + b0 / x["factor"] * big, a0 + b0 * big
            # (or within 10× of the same all-reduce timed again just after the refit: four ranks on
            # two cores once measured every probe near 1 s, and the refit is right to price what is)
            near = [r for r in (right, x.get("link_now_s")) if r and r / 10 < t < r * 10]
            assert near and abs(math.log(t / near[0])) < abs(math.log(t / wrong)), (t, right, wrong, x)
        if key == "wrong_link":
            # refitting the links alone, the re-plan is the plan of the model whose link is as the
            # refit measured it, or one that model prices within 1% of it. (adapt=True refits compute
            # and the optimizer too: its choice is checked by the switch and the link.)
            assert x["now"] == x["measured_choice"] or x["now_measured_s"] <= 1.01 * x["measured_choice_s"], \
                (x["now"], x["measured_choice"], x["refit"])
        assert len(set(x["hashes"])) == 1
        for r in res.values():
            assert r[key]["loss_err"] < LOSS_TOL, r[key]["losses"]
            assert r[key]["names_ok"], "the optimizer's param_names no longer name its parameters"
            assert r[key]["session_ok"][0], "the session does not hold the running module"
            assert not r[key]["session_ok"][1], "the closed loop patched the module's methods"
            if key == "wrong_link":  # (adapt=True's hook stays while it measures the new plan: past these steps)
                assert all(r[key]["session_ok"][2]), "a hook other than the observer's was left on the module"


def test_a_wrong_link_is_refitted_and_the_plan_switches_in_place(world2):
    _check_wrong_link(world2)


@pytest.mark.slow
def test_a_wrong_link_is_refitted_and_the_plan_switches_in_place_world4(world4):
    _check_wrong_link(world4)


def test_switches_and_a_longer_context_keep_a_hugging_face_models_training(world2):
    assert_ok(world2, "hf")
    for x in (r["hf"] for r in world2.values()):
        assert x["loss_err"] < LOSS_TOL
        assert len(x["refused"]) == 2 and all("give a whole number >= 1" in e for e in x["refused"]), x["refused"]
        assert len({str(p) for p in x["plans"]}) >= 2 and x["switched"]
        assert x["params_on_optimizer"] == x["params_of_module"]


@pytest.mark.slow
def test_switches_and_a_longer_context_at_world4(world4):
    assert_ok(world4, "hf")
    for x in (r["hf"] for r in world4.values()):
        assert x["loss_err"] < LOSS_TOL


def test_the_refitted_model_predicts_the_later_steps(world2):
    x = assert_ok(world2, "refit")
    # a loaded 2-core machine: the step time wanders; the demo's figure is the stated one
    assert x["after"] < 0.3, x
    assert x["after"] < x["before"], x
    assert x["memory_after"] < 0.05, x
