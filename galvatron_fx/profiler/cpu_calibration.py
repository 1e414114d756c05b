"""CPU runtime calibration: measure this machine and fit the constants of the CPU runtime cost model.

Contract: :func:`calibrate` measures this machine (a few minutes; once: the result is cached as
JSON under ``default_cache_dir()``, keyed by :func:`machine_fingerprint`, a fingerprint of the
CPU, its core count, the torch version, the probe and the schema) and returns a
:class:`~galvatron_fx.cost_models.cpu_runtime.CPURuntimeCalibration`, which
:func:`galvatron_fx.cost_models.cpu_runtime.cost_model` turns into a cost model. Nothing it
measures is a plan of the model being planned: only the *probe* model
(:data:`~galvatron_fx.cost_models.cpu_runtime.PROBE`) — its single layers, its training steps
through the runtime in one-rank groups, all-reduces between its steps, and its own DDP, ZeRO-3
and tensor-parallel plans at N ranks.

Terms: those of :mod:`galvatron_fx.cost_models.cpu_runtime` (rates, runtime overhead, optimizer
step, slowdown, in-step collective, overlap, FSDP and tensor-parallel factors); a *measurement*
is one run of steps 1–4, a calibration the field by field median of a few (:func:`combine`).

Algorithm
---------
1–4. :func:`measure_once`: the probe's rates, runtime overhead and optimizer step, the slowdown of
   N processes and the in-step collectives and probe plan steps at N ranks, as
   :mod:`galvatron_fx.profiler.cpu_probe` measures them. :func:`calibrate` logs a warning when the
   machine is busy and records its load average; a cached calibration that lacks some process
   counts is extended by steps 3–4 for those alone.
4b. (on every :func:`calibrate`, from the cached steps) The FSDP and tensor-parallel factors: the
   probe plans priced by the cost model with both factors 1, against their measured steps.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence

from galvatron_fx.cluster.spec import default_local_cpu
from galvatron_fx.cost_models.cpu_runtime import (
    CPURuntimeCalibration,
    CPURuntimeCostModel,
    cache_path,
    machine_fingerprint,
    read_cache,
)
from galvatron_fx.profiler.cpu_probe import (
    PROBE_PLANS,
    _probe_model,
    fit_rates,
    fit_runtime_overhead,
    measure_collectives,
    measure_slowdown,
    probe_plan_space,
)

logger = logging.getLogger(__name__)

__all__ = ["cache_path", "calibrate", "combine", "machine_fingerprint", "measure_once", "with_current_slowdown",
           "with_fsdp_factor"]


def fit_fsdp_factor(cal: CPURuntimeCalibration) -> tuple[dict[int, float], dict[int, float], dict]:
    """Per N with the probe plans measured: the FSDP and the tensor-parallel factors (module doc,
    step 4b), from the probe's plans priced by ``cal``'s cost model (both factors 1) on
    ``default_local_cpu(N)``: ``1 + (measured − predicted difference to DDP) / the priced
    collectives of the class``."""
    import galvatron_fx as gfx
    from galvatron_fx.frontend.capture import capture
    from galvatron_fx.search.price_plan import price_plan

    fsdp: dict[int, float]
    tp: dict[int, float]
    fsdp, tp, raw = {}, {}, {}
    for n in sorted({int(k.split("/")[0]) for k in cal.plan_step_s}):
        have = [name for name in PROBE_PLANS if f"{n}/{name}" in cal.plan_step_s]
        if "ddp" not in have:
            continue
        cl = default_local_cpu(n)
        cm = CPURuntimeCostModel(cl, dataclasses.replace(cal, fsdp_factor={n: 1.0}, tp_factor={n: 1.0}))
        mg = capture(*_probe_model(4 * n))
        # the very plans the ranks ran (galvatron_fx.compile plans with the analytic model), priced here
        pred = {name: price_plan(gfx.plan(mg, cl, global_batch_size=4 * n, search=probe_plan_space(name, n),
                                          baselines=False), mg, cm).predicted for name in have}
        meas = {name: cal.plan_step_s[f"{n}/{name}"] for name in have}
        # the priced seconds of the class: FSDP's exposed collectives, the layers' own collectives
        priced = {"zero3": pred["zero3"].breakdown.get("dp_sync", 0.0) if "zero3" in pred else 0.0,
                  "tp": (pred["tp"].breakdown.get("comm", 0.0) - pred["tp"].breakdown.get("dp_sync", 0.0))
                  if "tp" in pred else 0.0}
        for name, out in (("zero3", fsdp), ("tp", tp)):
            if name in pred and priced[name] > 0:
                diff = (meas[name] - meas["ddp"]) - (pred[name].step_time_s - pred["ddp"].step_time_s)
                out[n] = max(0.0, 1.0 + diff / priced[name])
        raw[str(n)] = {"measured_step_s": meas, "predicted_step_s": {k: p.step_time_s for k, p in pred.items()},
                       "priced_s": priced}
    return fsdp, tp, raw


# ---------------------------------------------------------------- entry point
def measure_once(worlds: Sequence[int], *, batch_sizes: Sequence[int] = (2, 4, 8), repeats: int = 9,
                 say=lambda msg: None) -> CPURuntimeCalibration:
    """One independent measurement of everything (module doc, steps 1–4: :mod:`galvatron_fx.profiler.cpu_probe`)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    try:
        say("timing the probe's layers ...")
        flops_s, bytes_s, layer_overhead_s, measured = fit_rates(batch_sizes, repeats=repeats)
        say("timing the probe through the runtime (one rank) ...")
        overhead_s, (opt_el, opt_t, opt_dt), rt = fit_runtime_overhead(flops_s, bytes_s,
                                                                       [b for b in batch_sizes if b > 2] or batch_sizes)
        say(f"timing {', '.join(map(str, sorted(set(worlds) - {1})))} processes at once ...")
        slow, raw = measure_slowdown(worlds)
        say("timing all-reduces between steps of computing ranks, and the probe's DDP and ZeRO-3 plans ...")
        coll, close, ov, plans, steps, craw = measure_collectives(worlds)
    finally:
        torch.set_num_threads(threads)
    measured |= rt | {"slowdown": raw, "collectives": craw, "loadavg_before": load,
                      "loadavg_after": os.getloadavg()[0], "wall_s": time.perf_counter() - t0}
    return CPURuntimeCalibration(
        fingerprint=machine_fingerprint(), cores=os.cpu_count() or 1, flops_s=flops_s, bytes_s=bytes_s,
        overhead_s=overhead_s, layer_overhead_s=layer_overhead_s,
        optimizer_s_per_element=opt_el,
        optimizer_s_per_tensor=opt_t, optimizer_s_per_dtensor=opt_dt,
        slowdown=slow, collective_s=coll, collective_close_s=close, probe_step_s=steps, overlap=ov,
        plan_step_s=plans, measured=measured,
        source=f"measured {time.strftime('%Y-%m-%d %H:%M')}")


def combine(cals: Sequence[CPURuntimeCalibration], source: str = "") -> CPURuntimeCalibration:
    """Field by field medians of independent measurements (each figure over the runs that have
    it); the runs' raw figures are kept under ``measured["runs"]``."""

    def med(values):
        return statistics.median(values)

    def keyed(get):
        keys = {k for c in cals for k in get(c)}
        return {k: med([get(c)[k] for c in cals if k in get(c)]) for k in sorted(keys)}

    first = cals[0]
    coll_keys = {k for c in cals for k in c.collective_s}
    close_keys = {k for c in cals for k in c.collective_close_s}
    return CPURuntimeCalibration(
        fingerprint=first.fingerprint, cores=first.cores,
        flops_s=med([c.flops_s for c in cals]), bytes_s=med([c.bytes_s for c in cals]),
        overhead_s=med([c.overhead_s for c in cals]), layer_overhead_s=med([c.layer_overhead_s for c in cals]),
        optimizer_s_per_element=med([c.optimizer_s_per_element for c in cals]),
        optimizer_s_per_tensor=med([c.optimizer_s_per_tensor for c in cals]),
        optimizer_s_per_dtensor=med([c.optimizer_s_per_dtensor for c in cals]),
        slowdown=keyed(lambda c: c.slowdown),
        collective_s={k: keyed(lambda c, k=k: c.collective_s.get(k, {})) for k in sorted(coll_keys)},
        collective_close_s={k: keyed(lambda c, k=k: c.collective_close_s.get(k, {})) for k in sorted(close_keys)},
        probe_step_s=keyed(lambda c: c.probe_step_s),
        overlap=keyed(lambda c: c.overlap),
        plan_step_s=keyed(lambda c: c.plan_step_s),
        measured={"runs": [dict(c.measured, summary=c.summary()) for c in cals]},
        source=source or f"median of {len(cals)} measurement(s)")


def calibrate(*, worlds: Sequence[int] = (2, 4), cache_dir: str | os.PathLike | None = None,
              use_cache: bool = True, runs: int = 3, batch_sizes: Sequence[int] = (2, 4, 8), repeats: int = 9,
              progress: bool = False) -> CPURuntimeCalibration:
    """The cached calibration of this machine, or a new one that is then cached: the field by
    field median of ``runs`` independent measurements (under a minute each on a small machine), since one
    measurement on a shared machine can be ±20% off.

    A cached calibration that lacks some of ``worlds`` is extended (measured ``runs`` times) and
    saved."""
    path = cache_path(cache_dir)
    cal = read_cache(cache_dir) if use_cache else None
    say = (lambda msg: print(f"cpu_runtime: {msg}", file=sys.stderr, flush=True)) if progress else (lambda m: None)
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1) and (cal is None or not set(worlds) <= set(cal.slowdown)):
        logger.warning("cpu_runtime: the machine is busy (load average %.1f on %d cores): the calibration will "
                       "see the other load; re-run calibrate(use_cache=False) when it is idle", load,
                       os.cpu_count() or 1)
    t0 = time.perf_counter()
    if cal is not None:
        missing = sorted(set(worlds) - (set(cal.slowdown) & {n for n, _ in cal.collective_s}) - {1})
        if not missing:
            return with_fsdp_factor(cal)
        parts = []
        for _ in range(max(runs, 1)):
            slow, raw = measure_slowdown(missing)
            coll, close, ov, plans, steps, craw = measure_collectives(missing)
            parts.append(dataclasses.replace(cal, slowdown=slow, collective_s=coll, collective_close_s=close,
                                             probe_step_s=steps, overlap=ov, plan_step_s=plans,
                                             measured={"slowdown": raw, "collectives": craw}))
        more = combine(parts)
        cal = dataclasses.replace(cal, slowdown={**cal.slowdown, **more.slowdown},
                                  collective_s={**cal.collective_s, **more.collective_s},
                                  collective_close_s={**cal.collective_close_s, **more.collective_close_s},
                                  probe_step_s={**cal.probe_step_s, **more.probe_step_s},
                                  overlap={**cal.overlap, **more.overlap},
                                  plan_step_s={**cal.plan_step_s, **more.plan_step_s},
                                  measured={**cal.measured, f"runs_for_{'_'.join(map(str, missing))}":
                                            more.measured["runs"]})
    else:
        cals = []
        for i in range(max(runs, 1)):
            say(f"measurement {i + 1} of {runs}")
            cals.append(measure_once(worlds, batch_sizes=batch_sizes, repeats=repeats, say=say))
        cal = combine(cals, source=f"median of {len(cals)} measurements, {time.strftime('%Y-%m-%d %H:%M')}, "
                                   f"{time.perf_counter() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    os.replace(tmp, path)
    logger.info("cpu_runtime: calibration cached at %s: %s", path, cal.summary())
    return with_fsdp_factor(cal)


def with_current_slowdown(cal: CPURuntimeCalibration, worlds: Sequence[int], *, rounds: int = 7,
                          steps: int = 5) -> CPURuntimeCalibration:
    """``cal`` with the slowdown of each N in ``worlds`` measured again now (:func:`~galvatron_fx.profiler.cpu_probe.measure_slowdown`):
    on a machine shared with other work the load of the other tenants, which the slowdown
    includes, changes from hour to hour, while the rest of a calibration holds. About 10 s per N;
    the earlier figures are kept under ``measured["cached_slowdown"]``, the new ones are not
    cached."""
    slow, raw = measure_slowdown(worlds, rounds=rounds, steps=steps)
    return dataclasses.replace(cal, slowdown={**cal.slowdown, **slow},
                               measured={**cal.measured, "cached_slowdown": dict(cal.slowdown),
                                         "current_slowdown": raw})


def with_fsdp_factor(cal: CPURuntimeCalibration) -> CPURuntimeCalibration:
    """``cal`` with its FSDP factor derived from its probe plans' steps by this version of the
    model (module doc, step 4b; a few seconds: derived on every :func:`calibrate`, so that a
    cached measurement never carries a factor fitted against another model)."""
    fsdp, tp, raw = fit_fsdp_factor(cal)
    return dataclasses.replace(cal, fsdp_factor=fsdp, tp_factor=tp,
                               measured={**cal.measured, "class_factors": raw} if raw else cal.measured)
