"""The closed loop's refit: a plan's cost model corrected by what running it measured.

``refit(plan, observations, mg=..., cost_model=...)`` fits the bounded factors of
:mod:`galvatron_fx.cost_models.refit` (compute per layer kind, links per tier, optimizer,
activation memory) from the :class:`~galvatron_fx.runtime.observe.Observations` of training
``plan`` — the compute factors from each layer's measured seconds less the collectives inside its
calls, priced by the link-refitted model (:func:`in_call_comm_s`) —, prices the plan under the
refitted model with
:func:`~galvatron_fx.search.price_plan.price_plan`, and takes what the measured step holds beyond
that price as a constant step overhead (bounded to ``[-½, 1] ×`` the measured step). The
activation-memory factor starts at the ratio of the measured peak's variable part to the
predicted one and is corrected (a few re-pricings) until the priced stage peak — a max over the
step's phases, not a sum — meets the measured peak within ½%, as far as the factor's bounds
allow. It returns a
:class:`~galvatron_fx.cost_models.refit.Refit`: the refitted model (what ``plan`` and the search
take as ``cost_model=``), the factors, and the observed plan's predicted, refitted and measured
step time and peak memory. This is ``galvatron_fx.refit``.
"""

from __future__ import annotations

import dataclasses

from galvatron_fx.cost_models.refit import FITS, Refit, RefitCostModel, fit_factors, peak_split
from galvatron_fx.ir.plan_report import group_ranks
from galvatron_fx.search.price_plan import price_plan

__all__ = ["in_call_comm_s", "refit"]

MEMORY_ITERATIONS = 6
MEMORY_TOLERANCE = 0.005


def refit(plan, observations, *, mg, cost_model=None, fit: tuple[str, ...] = FITS) -> Refit:
    """Refit ``cost_model`` (the model ``plan`` was priced by; default the planner's analytic model
    of the plan's cluster and precision) from ``observations`` of running ``plan`` on the graph
    ``mg`` (``pm.mg``; see the module doc). ``fit``: which factors to fit (of
    :data:`~galvatron_fx.cost_models.refit.FITS`; the others stay 1)."""
    if cost_model is None:
        from galvatron_fx.cluster import Cluster
        from galvatron_fx.cost_models.base import AnalyticCostModel
        from galvatron_fx.ir.strategy import Precision

        cost_model = AnalyticCostModel(Cluster.from_dict(plan.cluster), precision=Precision.named(plan.precision))
    obs = observations.check()  # (NaN, infinite or negative figures: refused, named)
    links = fit_factors(plan, obs, cost_model, ("links",) if "links" in fit else ())
    linked = RefitCostModel(cost_model, links)
    comm = in_call_comm_s(price_plan(plan, mg, linked), linked)
    factors = fit_factors(plan, obs, cost_model, tuple(fit), comm_s=comm)
    model = RefitCostModel(cost_model, factors)
    priced = price_plan(plan, mg, model)
    peak, fixed, _ = peak_split(plan)
    if obs.peak_bytes and "memory" in fit:
        # the stage peak is a max over phases, not F + V: correct the activation factor until the
        # priced peak meets the measured one (monotone in the factor; a few steps on its variable part)
        for _ in range(MEMORY_ITERATIONS):
            got = max(priced.predicted.peak_memory_bytes)
            if abs(got - obs.peak_bytes) <= MEMORY_TOLERANCE * obs.peak_bytes or got <= fixed:
                break
            k = min(10.0, max(0.1, factors.memory * (obs.peak_bytes - fixed) / (got - fixed)))
            if k == factors.memory:
                break
            factors = dataclasses.replace(factors, memory=k)
            model = RefitCostModel(cost_model, factors)
            priced = price_plan(plan, mg, model)
    overhead = obs.step_s - priced.predicted.step_time_s
    overhead = min(obs.step_s, max(-0.5 * obs.step_s, overhead))
    return Refit(cost_model=model, factors=factors, overhead_s=overhead, measured_step_s=obs.step_s,
                 predicted_step_s=plan.predicted.step_time_s,
                 refitted_step_s=priced.predicted.step_time_s + overhead,
                 measured_peak_bytes=obs.peak_bytes, predicted_peak_bytes=peak,
                 refitted_peak_bytes=max(priced.predicted.peak_memory_bytes))


def in_call_comm_s(plan, cost_model) -> dict[str, tuple[float, float]]:
    """Per layer of ``plan`` (priced by ``cost_model``), the seconds per step its collectives add
    inside its forward and its backward calls: tensor-parallel collectives and FSDP's gathers and
    reduce-scatters, not a DDP layer's bucketed all-reduce (the gradient sync runs it). That is
    the layer's priced (exposed) ``comm_s`` less the full price of its once-a-step collectives,
    split between the phases as the full prices of their collectives (``LayerPlan.collectives``,
    per micro-batch, on the stage's tp or dp group)."""
    out = {}
    m = plan.num_microbatches
    for lp in plan.layers:
        groups = group_ranks(plan, lp)
        full = {"fwd": 0.0, "bwd": 0.0, "step": 0.0}
        for c in lp.collectives:
            if c.group_size > 1 and c.bytes > 0 and c.phase in full:
                t = cost_model.collective_time_s(c.op, c.bytes, groups[c.axis][0])
                full[c.phase] += t if c.phase == "step" else m * t
        inside = full["fwd"] + full["bwd"]
        if inside <= 0:
            continue
        exposed = min(max(lp.predicted.comm_s - full["step"], 0.0), inside)
        out[lp.name] = (exposed * full["fwd"] / inside, exposed * full["bwd"] / inside)
    return out
