"""The closed loop's refit on the planner alone (no processes): observations built from a known
"true" cost model — a link the planned model thinks 20× slower, layers twice as slow, more
activation memory — and what the refit recovers from them."""

from __future__ import annotations

import dataclasses
import re

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.cost_models.refit import (
    FACTOR_BOUND,
    LINK_FACTOR_BOUND,
    Factors,
    RefitCostModel,
    fit_factors,
    link_scales,
    peak_split,
)
from galvatron_fx.runtime.observe import LINK_PROBE_BYTES, Observations
from galvatron_fx.search.refit import in_call_comm_s

WORLD = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, inputs = zoo.build("gpt-tiny", batch_size=8, seq_len=64, device="cpu", seed=0)
    mg = gfx.capture(model, inputs)
    # the α-β defaults (no cached profile's measured fits: those are not affine in the bytes)
    cl = gfx.Cluster.local_cpu(WORLD, cache_dir=tmp_path_factory.mktemp("nocache"))
    assert not cl.intra_node.fits

    def tier(t, k):
        return dataclasses.replace(t, bandwidth_bytes_s=t.bandwidth_bytes_s / k, fits={})

    wrong = dataclasses.replace(cl, intra_node=tier(cl.intra_node, 20.0), inter_node=tier(cl.inter_node, 20.0))
    return mg, cl, wrong


def _observe(plan, mg, true_model, *, compute=1.0, peak_bytes=None, step_s=None, sizes=LINK_PROBE_BYTES):
    """What running ``plan`` would measure if ``true_model`` were the machine, layers ``compute``×
    the plan's own figures, plus the collectives inside their calls at the true model's price."""
    ranks = tuple(range(WORLD))
    coll = tuple(("all_reduce", n, ranks, true_model.collective_time_s("all_reduce", n, list(ranks))) for n in sizes)
    comm = in_call_comm_s(gfx.price_plan(plan, mg, true_model), true_model)
    layer_s = {lp.name: (compute * lp.predicted.fwd_s + comm.get(lp.name, (0, 0))[0],
                         compute * lp.predicted.bwd_s + comm.get(lp.name, (0, 0))[1]) for lp in plan.layers}
    return Observations(plan_hash=plan.plan_hash(), steps=3, layer_s=layer_s, sync_s=0.0,
                        optimizer_s=plan.predicted.breakdown.get("optimizer", 0.0),
                        step_s=step_s if step_s is not None else plan.predicted.step_time_s,
                        peak_bytes=peak_bytes, collectives=coll)


def _price(plan, mg, cl):
    return gfx.price_plan(plan, mg, AnalyticCostModel(cl)).predicted.step_time_s


def test_a_link_20x_too_slow_comes_back_to_its_measured_rate_and_the_plan_to_the_correct_ones(setup):
    mg, right, wrong = setup
    true = AnalyticCostModel(right)
    first = gfx.plan(mg, wrong, global_batch_size=8, progress=False)
    correct = gfx.plan(mg, right, global_batch_size=8, progress=False)
    assert _price(first, mg, right) > 1.05 * correct.predicted.step_time_s  # the wrong model's plan is worse
    fit = gfx.refit(first, _observe(first, mg, true), mg=mg, cost_model=AnalyticCostModel(wrong), fit=("links",))
    # the refitted link prices every size as the true one does (exact at the probed sizes, affine
    # between and beyond them)
    for n in (*LINK_PROBE_BYTES, 256 * 1024, 16 * 2**20):
        got = fit.cost_model.collective_time_s("all_reduce", n, list(range(WORLD)))
        want = true.collective_time_s("all_reduce", n, list(range(WORLD)))
        assert got == pytest.approx(want, rel=0.02), n
    assert fit.factors.fwd == {} and fit.factors.optimizer == 1.0 and fit.factors.memory == 1.0
    again = gfx.plan(mg, wrong, global_batch_size=8, progress=False, cost_model=fit.cost_model)
    assert _price(again, mg, right) <= 1.01 * correct.predicted.step_time_s
    # the refit predicts the running plan's measured step (the overhead takes what the parts miss)
    assert fit.refitted_step_s == pytest.approx(fit.measured_step_s, rel=1e-6)
    assert any("links:" in line for line in fit.lines())


def test_a_link_off_by_more_than_the_compute_bound_is_refitted_exactly_up_to_its_own_bound(setup):
    """A described link 200× too slow (fast links taken for Ethernet) comes back to its measured
    rate, past ``FACTOR_BOUND``; one off by more than ``LINK_FACTOR_BOUND`` stops there."""
    mg, right, _ = setup
    ranks = list(range(WORLD))
    plan = gfx.plan(mg, right, global_batch_size=8, progress=False)
    described = AnalyticCostModel(right)
    lat = described.collective_time_s("all_reduce", 1, ranks)

    def faster(n, k):  # the described link's latency, its bandwidth k× higher
        return lat + (described.collective_time_s("all_reduce", n, ranks) - lat) / k

    n = 16 * 2**20
    assert 1e5 > LINK_FACTOR_BOUND > 200.0 > FACTOR_BOUND  # one case past each bound
    for k in (200.0, 1e5):
        obs = Observations(plan_hash="", steps=1, layer_s={}, sync_s=0.0, optimizer_s=0.0, step_s=0.0,
                           peak_bytes=None,
                           collectives=tuple(("all_reduce", b, tuple(ranks), faster(b, k)) for b in LINK_PROBE_BYTES))
        m = RefitCostModel(described, fit_factors(plan, obs, described, fit=("links",)))
        want = faster(n, min(k, LINK_FACTOR_BOUND))
        assert m.collective_time_s("all_reduce", n, ranks) == pytest.approx(want, rel=1e-3), k


def test_probes_whose_larger_size_is_no_slower_scale_the_whole_link_by_their_one_ratio(setup):
    """Two probes under load can time the larger size no slower than the smaller: the fitted slope
    is 0. The refitted model then scales latency and bandwidth alike by the measured over modelled
    latency (never an infinitely fast link), and ``link_scales`` says so to whoever reads the fit."""
    mg, right, _ = setup
    ranks = list(range(WORLD))
    plan = gfx.plan(mg, right, global_batch_size=8, progress=False)
    described = AnalyticCostModel(right)
    t_small = described.collective_time_s("all_reduce", min(LINK_PROBE_BYTES), ranks)
    flat = 3.0 * t_small  # every probe 3x the model's smallest, the larger ones no slower
    obs = Observations(plan_hash="", steps=1, layer_s={}, sync_s=0.0, optimizer_s=0.0, step_s=0.0, peak_bytes=None,
                       collectives=tuple(("all_reduce", b, tuple(ranks), flat) for b in LINK_PROBE_BYTES))
    f = fit_factors(plan, obs, described, fit=("links",))
    (fit,) = f.links.values()
    a, b, a0, b0 = fit
    assert b == 0.0 and a == pytest.approx(flat) and a0 > 0 and b0 > 0
    ka, kb = link_scales(fit)
    assert ka == kb == pytest.approx(a / a0)
    m = RefitCostModel(described, f)
    for n in (*LINK_PROBE_BYTES, 16 * 2**20):
        want = described.collective_time_s("all_reduce", n, ranks) * ka
        assert m.collective_time_s("all_reduce", n, ranks) == pytest.approx(want, rel=1e-6), n
    assert link_scales((0.0, 0.0, a0, b0)) is None


def test_compute_memory_and_optimizer_factors_are_the_measured_ratios(setup):
    mg, right, _ = setup
    plan = gfx.plan(mg, right, global_batch_size=8, progress=False)
    cm = AnalyticCostModel(right)
    peak, fixed, variable = peak_split(plan)
    assert 0 < fixed < peak and variable > 0
    # the machine: layers computing twice as slow as the plan's figures, the optimizer three times
    kinds = {lp.kind: 2.0 for lp in plan.layers}
    machine = RefitCostModel(cm, Factors(fwd=kinds, bwd=kinds, optimizer=3.0))
    step_s = gfx.price_plan(plan, mg, machine).predicted.step_time_s
    obs = _observe(plan, mg, cm, compute=2.0, peak_bytes=fixed + 2 * variable, step_s=step_s)
    obs = dataclasses.replace(obs, optimizer_s=3 * obs.optimizer_s)
    assert any(sum(obs.layer_s[n]) > 2 * sum(lp.predicted.fwd_s + lp.predicted.bwd_s for lp in plan.layers
                                              if lp.name == n) for n in obs.layer_s)  # collectives in the calls
    f = fit_factors(plan, obs, cm)  # the calls' collectives left in: the compute factors carry them
    assert max(f.fwd.values()) > 2.0 and f.optimizer == pytest.approx(3.0) and f.memory == pytest.approx(2.0)
    fit = gfx.refit(plan, obs, mg=mg, cost_model=cm)
    f = fit.factors  # taken off: the compute factors are the layers' own
    assert f.fwd and all(v == pytest.approx(2.0) for v in [*f.fwd.values(), *f.bwd.values()])
    assert fit.refitted_peak_bytes == pytest.approx(obs.peak_bytes, rel=0.01)
    assert fit.refitted_step_s == pytest.approx(obs.step_s, rel=1e-6)
    assert abs(fit.overhead_s) < 1e-3 * obs.step_s  # the parts price the whole step: nothing is counted twice
    # layers twice as slow: the refitted layer figures are twice the base ones
    layer = mg.layers[1]
    base_f, base_b = cm.layer_times_s(mg, layer, batch_fraction=0.5)
    got_f, got_b = fit.cost_model.layer_times_s(mg, layer, batch_fraction=0.5)
    assert (got_f, got_b) == (pytest.approx(2 * base_f), pytest.approx(2 * base_b))
    # a layer kind the run did not see takes the median factor
    assert fit.factors.compute_default == pytest.approx(2.0)


def test_factors_are_bounded_and_a_bad_fit_name_says_what_to_choose(setup):
    mg, right, _ = setup
    plan = gfx.plan(mg, right, global_batch_size=8, progress=False)
    cm = AnalyticCostModel(right)
    f = fit_factors(plan, _observe(plan, mg, cm, compute=1e6), cm)
    assert max(f.fwd.values()) == FACTOR_BOUND
    obs = _observe(plan, mg, cm)
    f = fit_factors(plan, dataclasses.replace(obs, layer_s={n: (0.0, 0.0) for n in obs.layer_s}), cm)
    # nothing measured: no correction
    assert set(f.fwd.values()) == {1.0}
    with pytest.raises(ValueError, match="choose from"):
        fit_factors(plan, _observe(plan, mg, cm), cm, fit=("links", "speed"))
    # a tier no collective was timed on keeps its price
    m = RefitCostModel(cm, Factors())
    assert m.collective_time_s("all_reduce", 2**20, [0, 1]) == cm.collective_time_s("all_reduce", 2**20, [0, 1])


def test_observations_that_are_not_finite_or_negative_are_refused(setup):
    from galvatron_fx.errors import ConfigError

    mg, right, _ = setup
    plan = gfx.plan(mg, right, global_batch_size=8, progress=False)
    obs = _observe(plan, mg, AnalyticCostModel(right))
    name = plan.layers[1].name
    for bad, expect in [(dataclasses.replace(obs, step_s=float("nan")), "step_s = nan"),
                        (dataclasses.replace(obs, optimizer_s=-1.0), "optimizer_s = -1.0"),
                        (dataclasses.replace(obs, layer_s={**obs.layer_s, name: (float("inf"), 0.1)}),
                         f"layer_s['{name}'] forward = inf"),
                        (dataclasses.replace(obs, peak_bytes=-5), "peak_bytes = -5")]:
        with pytest.raises(ConfigError, match=re.escape(expect)):
            gfx.refit(plan, bad, mg=mg)
    assert gfx.refit(plan, obs, mg=mg).refitted_step_s > 0  # the finite ones fit as before
