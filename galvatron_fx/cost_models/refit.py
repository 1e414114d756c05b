"""A cost model refitted from what a run measured (the closed loop's fit).

Contract: :func:`galvatron_fx.search.refit.refit` (``galvatron_fx.refit``) takes a plan, the
:class:`~galvatron_fx.runtime.observe.Observations` of training it (per-layer forward and
backward seconds per step, the gradient sync and optimizer seconds, all-reduces timed on the
plan's own process groups, the step's wall time and, where measured, the peak of tensor memory)
and the cost model the plan was priced by, and returns a :class:`Refit`: a
:class:`RefitCostModel` — the base model with bounded correction factors — and the plan's
prediction under it. This module fits the factors (:func:`fit_factors`) and wraps the model;
the search's module prices the plan under it. Nothing is executed from the observations; they
are numbers.

The fit (every factor bounded to ``[1/FACTOR_BOUND, FACTOR_BOUND]``, a link's to
``[1/LINK_FACTOR_BOUND, LINK_FACTOR_BOUND]``; a factor the observations do not inform stays 1):

- *compute*, per layer kind and direction: the measured seconds of the kind's layers, less the
  collectives that ran inside their calls (``comm_s``: tensor-parallel collectives, FSDP's gathers
  and reduce-scatters, as the link-refitted model prices them; what is left is at least
  ``MIN_COMPUTE_SHARE`` of the measured), over their predicted ``fwd_s`` / ``bwd_s`` (sums over
  the kind's layers on the observed ranks: a ratio of sums, so small layers weigh little). The
  plan prices those collectives apart from the compute, so leaving them in would count them twice.
  Kinds not observed (another plan's layer kinds are the same model's) take the median factor;
  ``node_time_s`` (the intra-layer ILP's operator prices) takes the median too.
- *links*, per tier (intra-node, inter-node): the measured all-reduces as ``a + b·bytes`` and
  the cost model's seconds for the same bytes and ranks as ``a0 + b0·bytes`` (least squares over
  the probed sizes). Every collective, redistribution and send the model prices on that tier is
  split into its latency part (its intercept in the bytes), scaled by ``a / a0``, and the rest,
  scaled by ``b / b0``: the link's measured latency and bandwidth against the modelled ones,
  whatever the collective (an all-gather of ``n`` bytes moves half an all-reduce's). A link the
  model thinks 10× (or 200×) slower than it is comes back to its measured rate at every size and
  for every collective (exactly, for the analytic α-β model).
- *optimizer*: the measured optimizer step over the plan's predicted optimizer seconds.
- *memory*: the measured peak tensor bytes ``M`` against the predicted stage peak ``P`` split
  into what the memory model knows exactly (parameters, gradients, optimizer states: ``F``,
  checked to the byte against ``MemTracker``) and the rest (activations and temporaries: ``V``):
  activations and temporaries are scaled by ``(M - F) / V``.
- *step overhead*: what the step's wall time holds beyond the priced parts after the factors
  (the training loop's own seconds: guards, Python between layers, waits the model does not
  price), a constant per step added to every plan's prediction (``Refit.overhead_s``; bounded to
  ``[-½, 1] ×`` the measured step).

The refitted prediction of the observed plan is :func:`~galvatron_fx.search.price_plan.price_plan`
under the refitted model plus the overhead; another plan is priced the same way by the search.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from galvatron_fx.cluster import TierName
from galvatron_fx.cost_models.memory import LayerMemory

__all__ = ["FACTOR_BOUND", "FITS", "LATENCY_PROBE_BYTES", "LINK_FACTOR_BOUND", "MIN_COMPUTE_SHARE", "Factors",
           "Refit", "RefitCostModel", "fit_factors", "link_scales", "peak_split"]

FACTOR_BOUND = 50.0
# a described link can be off by more than compute: NVLink's rate taken for Ethernet's is ~200×
# (the probes time the link itself, where a layer's interval holds other work)
LINK_FACTOR_BOUND = 1000.0
# a price's intercept in the bytes (its latency part) is taken from this size and twice it
LATENCY_PROBE_BYTES = 1 << 16
# a layer's measured seconds less its priced in-call collectives keep at least this share of the
# measured: a price over the interval says the link fit is off there, not that the layer is free
MIN_COMPUTE_SHARE = 0.1


def _bounded(x: float, bound: float = FACTOR_BOUND) -> float:
    if not math.isfinite(x) or x <= 0:
        return 1.0
    return min(bound, max(1.0 / bound, x))


@dataclass(frozen=True)
class Factors:
    """The correction factors of a refit (see the module doc)."""

    fwd: Mapping[str, float] = field(default_factory=dict)  # layer kind -> factor
    bwd: Mapping[str, float] = field(default_factory=dict)
    # tier name -> (a, b, a0, b0): the measured all-reduce time a + b·bytes and the base model's
    # a0 + b0·bytes over the probed sizes: a price's latency part is scaled by a / a0, the rest by
    # b / b0 (latency and bandwidth may be off by different factors)
    links: Mapping[str, tuple[float, float, float, float]] = field(default_factory=dict)
    optimizer: float = 1.0
    memory: float = 1.0
    # layer name -> the observed kind: a graph captured at another shape names its kinds anew
    kind_of: Mapping[str, str] = field(default_factory=dict)

    @property
    def compute_default(self) -> float:
        vals = [*self.fwd.values(), *self.bwd.values()]
        return statistics.median(vals) if vals else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"fwd": dict(self.fwd), "bwd": dict(self.bwd), "links": dict(self.links),
                "optimizer": self.optimizer, "memory": self.memory}


class RefitCostModel:
    """``base`` with :class:`Factors` applied (see the module doc); every other attribute is the
    base model's."""

    def __init__(self, base, factors: Factors):
        self.base, self.factors = base, factors

    def __getattr__(self, name: str):  # cluster, precision, compute, traces_runtime, ...
        return getattr(self.__dict__["base"], name)

    # ---- compute ----
    def layer_times_s(self, mg, layer, **kw):
        f, b = self.base.layer_times_s(mg, layer, **kw)
        fs, bs = self.factors.fwd, self.factors.bwd
        kind = layer.kind if layer.kind in fs else self.factors.kind_of.get(layer.name)
        d = self.factors.compute_default
        return f * fs.get(kind, d), b * bs.get(kind, d)

    def node_time_s(self, flops, nbytes, *, rank=0):
        return self.base.node_time_s(flops, nbytes, rank=rank) * self.factors.compute_default

    def optimizer_step_s(self, numel, tensors, *, dtensor=False, rank=0):
        return self.base.optimizer_step_s(numel, tensors, dtensor=dtensor, rank=rank) * self.factors.optimizer

    # ---- communication ----
    def _tier_fit(self, ranks):
        ranks = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
        tier = self.base.cluster.tier_of(ranks).name if len(ranks) > 1 else TierName.INTRA_NODE
        return self.factors.links.get(str(tier))

    def _scaled(self, price, nbytes, ranks) -> float:
        """``price(nbytes)`` with its latency part (its intercept in the bytes) scaled by the
        tier's measured over modelled latency and the rest by the measured over modelled seconds
        per byte."""
        fit = self._tier_fit(ranks)
        full = price(nbytes)
        if not fit:
            return full
        scales = link_scales(fit)
        if scales is None:  # one probe size only: the ratio of the times there
            a, b, a0, b0 = fit
            return full * _bounded((a + b * nbytes) / max(a0 + b0 * nbytes, 1e-12), LINK_FACTOR_BOUND)
        ka, kb = scales
        # the latency part: the price's intercept, from two sizes (a price of one byte can be 0:
        # a collective or redistribution splitting its bytes among ranks then sends nothing)
        m = LATENCY_PROBE_BYTES
        lat = min(max(2 * price(m) - price(2 * m), 0.0), full)
        return lat * ka + (full - lat) * kb

    def collective_time_s(self, collective, nbytes, ranks, *, gap_s=None):
        kw = {} if gap_s is None else {"gap_s": gap_s}
        return self._scaled(lambda n: self.base.collective_time_s(collective, n, ranks, **kw), nbytes, ranks)

    def tp_collective_time_s(self, collective, nbytes, ranks, *, gap_s=None):
        price = getattr(self.base, "tp_collective_time_s", None)
        if price is None:
            return self.collective_time_s(collective, nbytes, ranks)
        return self._scaled(lambda n: price(collective, n, ranks, gap_s=gap_s), nbytes, ranks)

    def reshard_time_s(self, nbytes, src, dst, ranks, ndim):
        return self._scaled(lambda n: self.base.reshard_time_s(n, src, dst, ranks, ndim), nbytes, ranks)

    # ---- memory ----
    def layer_memory(self, costs, strategy, **kw) -> LayerMemory:
        m = self.base.layer_memory(costs, strategy, **kw)
        k = self.factors.memory
        if k == 1.0:
            return m
        return dataclasses.replace(m, activation_bytes=int(m.activation_bytes * k), temp_bytes=int(m.temp_bytes * k))


@dataclass(frozen=True)
class Refit:
    """A refit's result: the refitted model, its factors, the step overhead, and the observed
    plan's predictions before and after against what was measured."""

    cost_model: RefitCostModel
    factors: Factors
    overhead_s: float
    measured_step_s: float
    predicted_step_s: float  # the plan's own prediction (before the refit)
    refitted_step_s: float  # under the refitted model, overhead included
    measured_peak_bytes: int | None
    predicted_peak_bytes: int
    refitted_peak_bytes: int

    def lines(self) -> list[str]:
        """What the refit changed, in sentences."""
        f = self.factors
        out = [f"measured step {self.measured_step_s * 1e3:.1f} ms; predicted {self.predicted_step_s * 1e3:.1f} ms "
               f"before the refit, {self.refitted_step_s * 1e3:.1f} ms after"]
        if self.measured_peak_bytes:
            out.append(f"measured peak {self.measured_peak_bytes / 2**20:.2f} MiB; predicted "
                       f"{self.predicted_peak_bytes / 2**20:.2f} MiB before, {self.refitted_peak_bytes / 2**20:.2f} MiB after")
        kinds = sorted(set(f.fwd) | set(f.bwd))
        if kinds:
            out.append("compute × " + ", ".join(f"{k[:12]} fwd {f.fwd.get(k, 1):.2f} bwd {f.bwd.get(k, 1):.2f}"
                                                for k in kinds))
        if f.links:
            out.append("links: " + ", ".join(
                f"{t} {a * 1e6:.0f} µs + {_gbs(b)} measured, {a0 * 1e6:.0f} µs + {_gbs(b0)} modelled"
                for t, (a, b, a0, b0) in sorted(f.links.items())))
        out.append(f"optimizer × {f.optimizer:.2f}; activation memory × {f.memory:.2f}; step overhead "
                   f"{self.overhead_s * 1e3:+.1f} ms")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"factors": self.factors.to_dict(), "overhead_s": self.overhead_s,
                "measured_step_s": self.measured_step_s, "predicted_step_s": self.predicted_step_s,
                "refitted_step_s": self.refitted_step_s, "measured_peak_bytes": self.measured_peak_bytes,
                "predicted_peak_bytes": self.predicted_peak_bytes, "refitted_peak_bytes": self.refitted_peak_bytes}


def _gbs(seconds_per_byte: float) -> str:
    return f"{1 / seconds_per_byte / 1e9:.2g} GB/s" if seconds_per_byte > 0 else "∞ GB/s"


def link_scales(fit: tuple[float, float, float, float]) -> tuple[float, float] | None:
    """The factors a link fit ``(a, b, a0, b0)`` applies to a price's latency part and to the
    rest (bounded to ``LINK_FACTOR_BOUND``). A fit whose slope came out 0 (the larger probe no
    slower than the smaller: noise on a loaded machine) or whose intercept did scales both parts
    by the one ratio it has; ``None`` where it has neither."""
    a, b, a0, b0 = fit
    kb = _bounded(b / b0, LINK_FACTOR_BOUND) if b0 > 0 and b > 0 else None
    ka = _bounded(a / a0, LINK_FACTOR_BOUND) if a0 > 0 and a > 0 else None
    if ka is None:
        return None if kb is None else (kb, kb)
    return ka, kb if kb is not None else ka


def _affine(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``t = a + b·n`` through ``(n, t)`` points (least squares; ``a, b >= 0``)."""
    if len(points) == 1:
        n, t = points[0]
        return 0.0, t / max(n, 1)
    mn = sum(n for n, _ in points) / len(points)
    mt = sum(t for _, t in points) / len(points)
    var = sum((n - mn) ** 2 for n, _ in points)
    b = max(sum((n - mn) * (t - mt) for n, t in points) / var, 0.0) if var > 0 else 0.0
    a = max(mt - b * mn, 0.0)
    if a == 0.0 and b == 0.0:
        b = mt / max(mn, 1)
    return a, b


def peak_split(plan) -> tuple[int, int, int]:
    """The plan's largest stage peak ``P``, and of it the exactly known part ``F`` (parameters,
    gradients, optimizer states) and the rest ``V`` (activations held and the largest temporary)."""
    stage = max(range(plan.pp), key=lambda s: plan.predicted.peak_memory_bytes[s])
    layers = [lp for lp in plan.layers if lp.stage == stage]
    fixed = sum(lp.predicted.memory_breakdown.get(k, 0) for lp in layers for k in ("params", "grads", "optimizer"))
    peak = plan.predicted.peak_memory_bytes[stage]
    return peak, min(fixed, peak), max(peak - fixed, 0)


FITS = ("compute", "links", "optimizer", "memory")


def fit_factors(plan, observations, cost_model, fit: tuple[str, ...] = FITS,
                comm_s: Mapping[str, tuple[float, float]] | None = None) -> Factors:
    """The bounded correction :class:`Factors` of ``cost_model`` (the model ``plan`` was priced
    by) from ``observations`` of running ``plan`` (see the module doc; the step overhead needs the
    refitted price and is :func:`galvatron_fx.search.refit.refit`'s). ``fit``: which factors to
    fit (of :data:`FITS`; the others stay 1). ``comm_s``: per layer name, the seconds per step of
    the collectives inside its forward and backward calls, taken off its measured seconds (none
    when not given)."""
    unknown = set(fit) - set(FITS)
    if unknown:
        raise ValueError(f"refit fit={fit!r}: unknown {sorted(unknown)}; choose from {FITS}")
    obs = observations
    by_name = {lp.name: lp for lp in plan.layers}
    kind_of = {lp.name: lp.kind for lp in plan.layers}
    sums: dict[str, list[float]] = {}
    for name, (f, b) in obs.layer_s.items():
        lp = by_name.get(name)
        if lp is None:
            continue
        cf, cb = (comm_s or {}).get(name, (0.0, 0.0))
        acc = sums.setdefault(kind_of[name], [0.0, 0.0, 0.0, 0.0])
        acc[0] += max(f - cf, MIN_COMPUTE_SHARE * f)
        acc[1] += max(b - cb, MIN_COMPUTE_SHARE * b)
        acc[2] += lp.predicted.fwd_s
        acc[3] += lp.predicted.bwd_s
    compute = "compute" in fit
    fwd = {k: _bounded(a[0] / a[2]) for k, a in sums.items() if a[2] > 0 and compute}
    bwd = {k: _bounded(a[1] / a[3]) for k, a in sums.items() if a[3] > 0 and compute}
    measured: dict[str, list[tuple[int, float]]] = {}
    modelled: dict[str, list[tuple[int, float]]] = {}
    for op, nbytes, ranks, seconds in obs.collectives:
        pred = cost_model.collective_time_s(op, nbytes, list(ranks))
        if pred > 0 and seconds > 0:
            tier = str(cost_model.cluster.tier_of(ranks).name)
            measured.setdefault(tier, []).append((int(nbytes), seconds))
            modelled.setdefault(tier, []).append((int(nbytes), pred))
    links = {t: (*_affine(measured[t]), *_affine(modelled[t])) for t in measured} if "links" in fit else {}
    pred_optim = plan.predicted.breakdown.get("optimizer", 0.0)
    optimizer = _bounded(obs.optimizer_s / pred_optim) if pred_optim > 0 and obs.optimizer_s > 0 \
        and "optimizer" in fit else 1.0
    _, fixed, variable = peak_split(plan)
    memory = 1.0
    if obs.peak_bytes and variable > 0 and "memory" in fit:
        memory = min(10.0, max(0.1, (obs.peak_bytes - fixed) / variable))
    return Factors(fwd=fwd, bwd=bwd, links=links, optimizer=optimizer, memory=memory, kind_of=kind_of)
