"""CPU runtime calibration: what the analytic cost model misses when gloo ranks share a few cores.

Contract: :func:`calibrate` measures this machine in about three and a half minutes on 2 cores
(once: the result is cached as JSON under ``default_cache_dir()``, keyed by a fingerprint of the
CPU, its core count, the torch version, the probe and the schema) and returns a
:class:`CPURuntimeCalibration`; :func:`cost_model` turns it
into a :class:`CPURuntimeCostModel` for a ``Cluster`` of gloo CPU processes on this host (a
profiled ``Cluster.local_cpu`` or the defaults). Nothing it measures is a plan of the model being
planned: only a *probe* model — its single layers, its training steps through the runtime in
one-rank groups, all-reduces between its steps, and its own DDP, ZeRO-3 and tensor-parallel
plans at N ranks.

Terms
-----
- *probe*: a small GPT-family model (``PROBE``: 2 blocks, width 96, 3 heads, vocabulary 320,
  64 tokens), shaped unlike the zoo's models so the calibration never sees what is planned.
- *rates*: ``flops_s`` and ``bytes_s``, the achieved FLOP/s and bytes/s of one process with one
  thread on the compute model's per-node roofline, fitted (with an eager per-kernel overhead,
  ``layer_overhead_s``, kept for reference) by :func:`galvatron_fx.profiler.model.fit_efficiency`
  on the probe's layers, forward and backward. They are absolute, so :func:`efficiency` can state
  them relative to any cluster's peaks: the ``ComputeEfficiency`` defaults for CPUs are relative
  to ``default_local_cpu``'s 20 GFLOP/s and overstate a profiled cluster's compute by its
  measured peak over that (about 5× here).
- *runtime overhead* ``overhead_s``: per kernel, what a training step through galvatron_fx's
  runtime costs beyond the roofline (DTensor dispatch, layer executors, autograd, hooks): the
  probe compiled by ``galvatron_fx.compile`` in a one-rank gloo group at a few batch sizes,
  ``(step − optimizer step − roofline) / kernels``, median over batch sizes; and
  ``interpreted_overhead_s``, the same for layers the runtime runs op by op through DTensor
  (selective recomputation needs the per-op dispatch): the probe compiled with selective
  recomputation, its remaining lowered kernels (the loss) at ``overhead_s``.
- *optimizer step*: AdamW (PyTorch's CPU default, one tensor at a time) over the probe's
  parameters in the same process, over one flat tensor of as many elements, and over the
  parameters as DTensors (FSDP's shards are): seconds per element (the flat tensor) and per
  tensor, plain and DTensor (the rest over the tensor count; a DTensor pays DTensor's dispatch
  on each of the step's dozen kernels).
- *slowdown(N)*: wall time of the probe's runtime steps run by ``N`` processes at once over the
  same steps by one process. Up to the core count it stays near 1; beyond it, each process gets
  a share of a core; lasting load from other tenants shows up in it too.
- *in-step collective*: the seconds an all-reduce of ``b`` bytes adds to a step when every rank
  also computes (``collective_s[(N, g)][b]``, all contiguous groups of ``g`` of the ``N`` ranks at
  once): the rank skew it waits out and the cores it shares, which a hardware profile's
  back-to-back timing does not see (2–3 ms here whatever the size, 2–10× its fits); its *excess*
  is that less the cluster's all-reduce seconds of the same bytes. A collective that follows the
  previous sync closely waits out less skew: the excess *right after a sync*
  (``collective_close_s``) is measured with two all-reduces per probe step, one after its forward
  and one after its backward (their sum less one after the step), and the excess of a collective
  grows linearly from it to the after-a-step one with the compute since the previous sync, up to
  a whole probe step (``probe_step_s[N]``); and *overlap*: the slowdown of the same
  all-reduce launched asynchronously before a step and waited for after it, in
  ``CommModel.overlapped_s``'s sense (both at once / the longer alone).
- *FSDP factor* ``fsdp_factor[N]``: the seconds going from DDP to ZeRO-3 adds to the probe's
  steps at ``N`` ranks (both compiled by ``galvatron_fx.compile``, timed in the same processes)
  beyond what this model predicts for that change, over the FSDP collectives it prices, plus 1:
  1 when FSDP's all-gathers and reduce-scatters add exactly their in-step seconds (on gloo the
  main thread waits for each: nothing is overlapped), above 1 when FSDP's hooks and copies add
  more, below when less (0.8–0.9 here). *Tensor-parallel factor* ``tp_factor[N]``: the same for
  the probe's tensor-parallel plan over all ``N`` ranks against its DDP plan, over the
  collectives inside its layers (about 0.7 here).

Algorithm
---------
1. In this process (one thread): capture the probe at each batch size, time each layer kind
   (``profiler.model``'s interleaved timing, medians of ``repeats``), fit the rates.
2. In a spawned one-rank gloo group: compile the probe at each batch size, time ``steps``
   training steps after warm-up and as many optimizer steps; fit the runtime overhead.
3. For every ``N > 1`` in ``worlds``: ``N`` spawned processes, each with the probe compiled in its
   own one-rank group; in a few rounds process 0 runs ``steps`` steps alone (the others asleep at
   a barrier), then all ``N`` run ``steps`` at once. The slowdown is the median over rounds of the
   together phase (first start to last end: a synchronous step waits for its slowest rank) over
   the alone phase just before it, so a burst of other load spoils one round, not the ratio.
   ``calibrate`` logs a warning when the machine is busy and records its load average.
4. For every ``N > 1``: ``N`` gloo ranks run eager probe steps alone, each followed by an
   all-reduce, and each overlapping one, for each group size and message size (interleaved over
   rounds; medians); the in-step time is the difference to the steps alone. The same ranks then
   compile the probe as a DDP, a ZeRO-3 and a tensor-parallel plan over all ``N`` and time their
   steps (interleaved over rounds; medians).
4b. (on every :func:`calibrate`, from the cached steps) The FSDP and tensor-parallel factors: the
   probe plans priced by this model with both factors 1, against their measured steps.
5. :class:`CPURuntimeCostModel` for a cluster of ``N`` processes on one host, ``s = slowdown(N)``:
   compute at ``matmul = flops_s / (peak · s)``, ``memory = bytes_s / (bandwidth · s)``,
   ``overhead_s · s`` (``interpreted_overhead_s · s`` for a layer under selective
   recomputation; every compute second stretched alike; process counts not measured take
   the nearest measured one, scaled by ``N / N'`` beyond the core count); every collective of a
   group of ``g`` ranks (data-parallel syncs, tensor-parallel redistributions, reshards, sends)
   the cluster's seconds plus the excess measured for groups of ``g`` (a wait per collective,
   whatever it moves: interpolated in log bytes between the measured sizes, held beyond them; by
   the compute since the previous sync where the search knows it: a tensor-parallel layer's
   collectives share its forward's or backward's compute, FSDP's its layer's; a whole step for
   the rest);
   overlap with the measured slowdown of the whole-world group,
   except FSDP's collectives: their priced seconds times the FSDP factor, none hidden;
   the optimizer step at the measured per-element and per-tensor seconds, stretched by ``s``;
   pipelines simulated at the unstretched speed (a rank waiting in a bubble frees its core) and
   never shorter than the busiest rank's stretched work, ``max(simulated(stages / s), m · Σ its
   chunks' costs)``. Tensor-parallel layers are priced by the runtime's own collectives and
   saved activations (``traces_runtime``: :mod:`galvatron_fx.search.runtime_trace`): gloo has
   no reduce-scatter of its own (it all-reduces) and pays milliseconds per small collective, so
   the ILP's one-all-reduce-per-gradient rule is far off here; each of those collectives at its
   seconds times the tensor-parallel factor.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import socket
import statistics
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from galvatron_fx.cluster import Cluster, Collective, cpu_model, default_cache_dir, default_local_cpu, make_fingerprint
from galvatron_fx.cost_models import pipeline as _pipeline
from galvatron_fx.cost_models.base import AnalyticCostModel
from galvatron_fx.cost_models.communication import CommModel
from galvatron_fx.cost_models.compute import ComputeEfficiency, ComputeModel
from galvatron_fx.cost_models.pipeline import PipelineResult, StageCost
from galvatron_fx.errors import ConfigError
from galvatron_fx.limits import load_json

logger = logging.getLogger(__name__)

__all__ = ["CPURuntimeCalibration", "CPURuntimeCostModel", "PROBE", "calibrate", "cost_model", "efficiency",
           "cache_path", "with_current_slowdown"]

SCHEMA_VERSION = 7  # 7: tensor-parallel gradients summed where a value is made (runtime); 6: collectives close to a sync; 5: optimizer per element / tensor / DTensor; op-by-op overhead; probe plans at N ranks
# The probe: GPT-family, shaped unlike every zoo configuration (width 96, 3 heads, 320 tokens).
PROBE: dict[str, Any] = {"family": "gpt-tiny", "overrides": {"n_layers": 2, "d_model": 96, "n_heads": 3,
                                                              "vocab_size": 320, "max_seq_len": 64},
                         "seq_len": 64}
REFERENCE_FLOPS, REFERENCE_BYTES_S = 20e9, 10e9  # the fits' reference peaks (any positive values do)


@dataclass(frozen=True, kw_only=True)
class CPURuntimeCalibration:
    """Measured compute rates of one process, the runtime's per-kernel overhead and the slowdown
    of N processes sharing the cores (see the module doc)."""

    fingerprint: str
    cores: int
    flops_s: float  # achieved FLOP/s of one process, one thread (per-node roofline)
    bytes_s: float  # achieved bytes/s
    overhead_s: float  # per kernel, a step through the runtime (lowered layers)
    interpreted_overhead_s: float = 0.0  # per kernel, layers run op by op through DTensor (selective recompute)
    layer_overhead_s: float = 0.0  # per kernel, eager single layers (reference only)
    optimizer_s_per_element: float = 0.0  # AdamW step, one process: seconds per parameter element
    optimizer_s_per_tensor: float = 0.0  # ... and per plain parameter tensor
    optimizer_s_per_dtensor: float = 0.0  # ... and per DTensor parameter (FSDP's shards)
    slowdown: dict[int, float] = field(default_factory=dict)  # processes -> wall time / one process's
    # (processes, group size) -> {all-reduce bytes -> seconds it adds to a step of computing ranks}
    collective_s: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    # (processes, group size) -> {bytes -> seconds of an all-reduce right after another sync}
    collective_close_s: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    probe_step_s: dict[int, float] = field(default_factory=dict)  # processes -> the probe's eager step there
    # (processes, group size) -> overlap slowdown of an all-reduce launched during a step
    overlap: dict[tuple[int, int], float] = field(default_factory=dict)
    # "N/ddp", "N/zero3" -> seconds per step of the probe compiled with that plan at N ranks
    plan_step_s: dict[str, float] = field(default_factory=dict)
    fsdp_factor: dict[int, float] = field(default_factory=dict)  # processes -> (module doc)
    tp_factor: dict[int, float] = field(default_factory=dict)  # processes -> (module doc)
    measured: dict[str, Any] = field(default_factory=dict, hash=False)  # raw figures, for reports
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("flops_s", "bytes_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"CPURuntimeCalibration.{name} must be positive, got {v!r}; re-run calibrate()")
        for name in ("overhead_s", "interpreted_overhead_s", "layer_overhead_s", "optimizer_s_per_element",
                     "optimizer_s_per_tensor",
                     "optimizer_s_per_dtensor"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"CPURuntimeCalibration.{name} must be >= 0, got {v!r}; re-run calibrate()")
        for n, s in self.slowdown.items():
            if n < 1 or not (math.isfinite(s) and s > 0):
                raise ConfigError(f"CPURuntimeCalibration.slowdown[{n}] = {s!r} is not a positive factor")
        for (n, g), per in self.collective_s.items():
            if g < 2 or n % g or any(not (math.isfinite(t) and t >= 0) or b <= 0 for b, t in per.items()):
                raise ConfigError(f"CPURuntimeCalibration.collective_s[{n}, {g}] = {per!r}: groups of g >= 2 "
                                  "dividing n, positive sizes and seconds >= 0")
        for key, v in self.overlap.items():
            if not (math.isfinite(v) and v >= 1.0):
                raise ConfigError(f"CPURuntimeCalibration.overlap[{key}] = {v!r} must be >= 1")
        for key, v in {**self.plan_step_s, **{f"fsdp {n}": f for n, f in self.fsdp_factor.items()},
                       **{f"tp {n}": f for n, f in self.tp_factor.items()}}.items():
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"CPURuntimeCalibration: plan step / FSDP factor {key} = {v!r} must be >= 0")

    def fsdp_factor_for(self, processes: int) -> float:
        """The measured FSDP factor of ``processes`` (the nearest measured count; 1 when none is)."""
        return _nearest(self.fsdp_factor, processes, 1.0)

    def tp_factor_for(self, processes: int) -> float:
        """The measured tensor-parallel factor of ``processes`` (as :meth:`fsdp_factor_for`)."""
        return _nearest(self.tp_factor, processes, 1.0)

    def optimizer_s(self, numel: int, tensors: int, *, dtensor: bool = False) -> float:
        """Seconds of one AdamW step of one process over ``tensors`` tensors of ``numel`` elements."""
        per = self.optimizer_s_per_dtensor if dtensor else self.optimizer_s_per_tensor
        return numel * self.optimizer_s_per_element + tensors * per

    def slowdown_for(self, processes: int) -> float:
        """The measured slowdown of ``processes`` processes (module doc, step 5, for unmeasured ones)."""
        if processes in self.slowdown:
            return self.slowdown[processes]
        if not self.slowdown:
            return max(1.0, processes / max(self.cores, 1))
        near = min(self.slowdown, key=lambda n: (abs(n - processes), n))
        return self.slowdown[near] * max(processes, self.cores) / max(near, self.cores)

    def summary(self) -> str:
        sl = ", ".join(f"{n} ×{s:.2f}" for n, s in sorted(self.slowdown.items()))
        ar = ", ".join(f"{n} procs/groups of {g}: {statistics.median(per.values()) * 1e3:.1f} ms"
                       for (n, g), per in sorted(self.collective_s.items()) if per)
        ov = ", ".join(f"{n}/{g} ×{v:.2f}" for (n, g), v in sorted(self.overlap.items()))
        fs = ", ".join(f"{n} ×{v:.2f}" for n, v in sorted(self.fsdp_factor.items()))
        tpf = ", ".join(f"{n} ×{v:.2f}" for n, v in sorted(self.tp_factor.items()))
        return (f"one process {self.flops_s / 1e9:.1f} GFLOP/s, {self.bytes_s / 1e9:.1f} GB/s, runtime "
                f"{self.overhead_s * 1e6:.1f} µs per kernel ({self.interpreted_overhead_s * 1e6:.1f} op by op through "
                f"DTensor; eager layers {self.layer_overhead_s * 1e6:.1f}); "
                f"AdamW {self.optimizer_s_per_element * 1e9:.2f} ns per element + "
                f"{self.optimizer_s_per_tensor * 1e6:.0f} µs per tensor ({self.optimizer_s_per_dtensor * 1e6:.0f} "
                f"per DTensor); slowdown by processes {sl}; in-step all-reduce {ar or '-'}; overlap {ov or '-'}; "
                f"FSDP factor {fs or '-'}; tensor-parallel factor {tpf or '-'} ({self.source})")

    def describe(self) -> str:
        """One sentence on what the calibration does to a prediction."""
        return ("compute at the probe's one-process roofline rates plus the runtime's per-kernel overhead (the "
                "probe through galvatron_fx.compile on one rank), stretched by the measured slowdown of N processes "
                "sharing the cores; collectives at the profiled fits plus the measured in-step excess of their "
                "group size; overlap at the measured in-step slowdown, FSDP's collectives not "
                "overlapped, times the FSDP factor measured on the probe's ZeRO-3 against DDP steps; the optimizer "
                "step per element and per (D)tensor as measured; tensor-parallel layers priced by the runtime's "
                "traced collectives and saved activations; pipelines simulated unstretched and bounded below by "
                "the busiest rank's stretched work")

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "fingerprint": self.fingerprint, "cores": self.cores,
                "flops_s": self.flops_s, "bytes_s": self.bytes_s, "overhead_s": self.overhead_s,
                "interpreted_overhead_s": self.interpreted_overhead_s,
                "layer_overhead_s": self.layer_overhead_s, "optimizer_s_per_element": self.optimizer_s_per_element,
                "optimizer_s_per_tensor": self.optimizer_s_per_tensor,
                "optimizer_s_per_dtensor": self.optimizer_s_per_dtensor,
                "plan_step_s": dict(sorted(self.plan_step_s.items())),
                "fsdp_factor": {str(n): v for n, v in sorted(self.fsdp_factor.items())},
                "tp_factor": {str(n): v for n, v in sorted(self.tp_factor.items())},
                "slowdown": {str(n): s for n, s in sorted(self.slowdown.items())},
                "collective_s": {f"{n}x{g}": {str(b): t for b, t in sorted(per.items())}
                                 for (n, g), per in sorted(self.collective_s.items())},
                "collective_close_s": {f"{n}x{g}": {str(b): t for b, t in sorted(per.items())}
                                       for (n, g), per in sorted(self.collective_close_s.items())},
                "probe_step_s": {str(n): t for n, t in sorted(self.probe_step_s.items())},
                "overlap": {f"{n}x{g}": v for (n, g), v in sorted(self.overlap.items())}, "probe": PROBE,
                "measured": self.measured, "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CPURuntimeCalibration:
        if not isinstance(d, Mapping) or d.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError("CPU runtime calibration: wrong schema version; re-run calibrate(use_cache=False)")
        try:
            return cls(fingerprint=str(d["fingerprint"]), cores=int(d["cores"]), flops_s=float(d["flops_s"]),
                       bytes_s=float(d["bytes_s"]), overhead_s=float(d["overhead_s"]),
                       layer_overhead_s=float(d.get("layer_overhead_s", 0.0)),
                       interpreted_overhead_s=float(d.get("interpreted_overhead_s", 0.0)),
                       optimizer_s_per_element=float(d.get("optimizer_s_per_element", 0.0)),
                       optimizer_s_per_tensor=float(d.get("optimizer_s_per_tensor", 0.0)),
                       optimizer_s_per_dtensor=float(d.get("optimizer_s_per_dtensor", 0.0)),
                       plan_step_s={str(k): float(v) for k, v in d.get("plan_step_s", {}).items()},
                       fsdp_factor={int(n): float(v) for n, v in d.get("fsdp_factor", {}).items()},
                       tp_factor={int(n): float(v) for n, v in d.get("tp_factor", {}).items()},
                       slowdown={int(n): float(s) for n, s in d.get("slowdown", {}).items()},
                       collective_s={tuple(int(x) for x in k.split("x")): {int(b): float(t) for b, t in per.items()}
                                     for k, per in d.get("collective_s", {}).items()},
                       collective_close_s={tuple(int(x) for x in k.split("x")): {int(b): float(t) for b, t in
                                                                                per.items()}
                                           for k, per in d.get("collective_close_s", {}).items()},
                       probe_step_s={int(n): float(t) for n, t in d.get("probe_step_s", {}).items()},
                       overlap={tuple(int(x) for x in k.split("x")): float(v) for k, v in d.get("overlap", {}).items()},
                       measured=dict(d.get("measured", {})), source=str(d.get("source", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"CPU runtime calibration JSON is malformed ({e}); "
                              "re-run calibrate(use_cache=False)") from e


def _nearest(table: Mapping[int, float], n: int, default: float) -> float:
    return table[min(table, key=lambda k: (abs(k - n), k))] if table else default


def machine_fingerprint() -> str:
    """What the calibration depends on: CPU model, cores, torch version, the probe."""
    import torch

    return make_fingerprint({"cpu": cpu_model(), "cores": os.cpu_count() or 1, "torch": torch.__version__,
                             "probe": PROBE, "schema": SCHEMA_VERSION})


def cache_path(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(default_cache_dir(cache_dir)) / f"cpu-runtime-{machine_fingerprint()}.json"


# ---------------------------------------------------------------- the cost model
def efficiency(cal: CPURuntimeCalibration, cluster: Cluster, *, rank: int = 0) -> ComputeEfficiency:
    """The calibration as a ``ComputeEfficiency`` relative to ``cluster``'s device peaks, stretched
    by the slowdown of the cluster's processes per host (module doc, step 5)."""
    dev = cluster.device(rank)
    s = cal.slowdown_for(cluster.devices_per_node)
    return ComputeEfficiency(matmul=cal.flops_s / (dev.flops("float32") * s),
                             memory=cal.bytes_s / (dev.memory_bandwidth_bytes_s * s),
                             overhead_s=cal.overhead_s * s, source=f"cpu_runtime:{cal.fingerprint}:x{s:.2f}")


def comm_excess(cal: CPURuntimeCalibration, cluster: Cluster) -> dict[int, list[tuple[int, float, float]]]:
    """Group size -> ``[(bytes, excess after a whole step, excess right after a sync)]``, by size:
    the measured in-step all-reduce seconds less the ``cluster``'s all-reduce seconds of as many
    bytes (never below 0), for the cluster's processes per host (module doc, step 5)."""
    n = cluster.devices_per_node
    base = CommModel(cluster)
    out = {}
    for (procs, g), per in cal.collective_s.items():
        if procs != n or not per:
            continue
        close = cal.collective_close_s.get((procs, g), {})
        rows = []
        for b, t in sorted(per.items()):
            fit = base.time_s(Collective.ALL_REDUCE, b, g)
            after = max(0.0, t - fit)
            rows.append((b, after, min(after, max(0.0, close[b] - fit)) if b in close else after))
        out[g] = rows
    return out


class _InStepComm(CommModel):
    """The cluster's collectives plus the measured in-step excess of their group size (the
    nearest measured one; none when none is): between its floor, right after another sync, and
    its value after a whole probe step, by the compute since the previous sync (``gap_s``; a
    whole step when not given), interpolated in log bytes between the measured sizes and held
    beyond them; compute and communication overlapped with the measured slowdown (the cluster's
    when none was measured)."""

    def __init__(self, cluster: Cluster, excess: Mapping[int, list[tuple[int, float, float]]],
                 overlap_slowdown: float | None, step_s: float | None = None):
        super().__init__(cluster)
        self.excess = {g: list(v) for g, v in excess.items() if v}
        self.overlap_slowdown = overlap_slowdown if overlap_slowdown is not None else cluster.overlap_slowdown
        self.step_s = step_s

    def overlapped_s(self, compute_s: float, comm_s: float) -> float:
        both = max(compute_s, comm_s) * self.overlap_slowdown
        return min(max(both, compute_s, comm_s), compute_s + comm_s)

    def excess_s(self, nbytes: int, group_size: int, gap_s: float | None = None) -> float:
        """Seconds a collective of ``nbytes`` over ``group_size`` ranks adds beyond its fit, after
        ``gap_s`` seconds of compute since the previous sync (None: a whole step)."""
        if not self.excess:
            return 0.0
        pts = self.excess[min(self.excess, key=lambda g: (abs(g - group_size), g))]
        if nbytes <= pts[0][0]:
            after, floor = pts[0][1], pts[0][2]
        elif nbytes >= pts[-1][0]:
            after, floor = pts[-1][1], pts[-1][2]
        else:
            (b0, a0, f0), (b1, a1, f1) = next((p, q) for p, q in zip(pts, pts[1:]) if nbytes <= q[0])
            w = math.log(nbytes / b0) / math.log(b1 / b0)
            after, floor = a0 + w * (a1 - a0), f0 + w * (f1 - f0)
        if gap_s is None or not self.step_s:
            return after
        return floor + (after - floor) * min(1.0, max(0.0, gap_s) / self.step_s)

    def time_s(self, collective, nbytes, ranks, *, gap_s: float | None = None):
        t = super().time_s(collective, nbytes, ranks)
        if t <= 0:
            return t
        n = ranks if isinstance(ranks, int) else len(list(ranks))
        return t + self.excess_s(nbytes, n, gap_s)


class CPURuntimeCostModel(AnalyticCostModel):
    """``AnalyticCostModel`` with the calibrated compute, in-step collectives, FSDP and optimizer
    terms and shared-core pipelines; tensor-parallel layers priced by the runtime's trace
    (module doc)."""

    traces_runtime = True

    def __init__(self, cluster: Cluster, cal: CPURuntimeCalibration, **kw):
        super().__init__(cluster, efficiency=efficiency(cal, cluster), **kw)
        self.calibration = cal
        self.stretch = cal.slowdown_for(cluster.devices_per_node)
        n = cluster.devices_per_node
        ov = [v for (p, g), v in cal.overlap.items() if p == n]
        self.comm = _InStepComm(cluster, comm_excess(cal, cluster),
                                cal.overlap.get((n, n), max(ov) if ov else None), cal.probe_step_s.get(n))
        self.fsdp_factor = cal.fsdp_factor_for(n)
        self.tp_factor = cal.tp_factor_for(n)
        # selective recomputation runs its layers op by op through DTensor: their own overhead
        self.interpreted = ComputeModel(cluster, dataclasses.replace(
            efficiency(cal, cluster), overhead_s=(cal.interpreted_overhead_s or cal.overhead_s) * self.stretch),
            dtype=self.precision.compute_dtype)

    def layer_times_s(self, mg, layer, *, batch_fraction=1.0, tp_fraction=1.0, recompute="none", rank=0):
        model = self.interpreted if str(recompute) == "selective" else self.compute
        return model.layer_times_s(mg, layer, batch_fraction=batch_fraction, tp_fraction=tp_fraction,
                                   recompute=recompute, rank=rank)

    def collective_time_s(self, collective, nbytes, ranks, *, gap_s=None):
        return self.comm.time_s(collective, nbytes, ranks, gap_s=gap_s)

    def tp_collective_time_s(self, collective, nbytes, ranks, *, gap_s=None):
        # inside a layer, close to the previous sync; times the probe's tensor-parallel factor
        return self.collective_time_s(collective, nbytes, ranks, gap_s=gap_s) * self.tp_factor

    def optimizer_step_s(self, numel, tensors, *, dtensor=False, rank=0):
        return self.stretch * self.calibration.optimizer_s(numel, tensors, dtensor=dtensor)

    def exposed_fsdp_s(self, compute_s, comm_s):
        # gloo: the main thread waits for each of FSDP's collectives (module doc, step 5)
        return comm_s * self.fsdp_factor

    def simulate_pipeline(self, schedule, stages, num_microbatches, *, virtual_stages=1) -> PipelineResult:
        stages = list(stages)
        s = self.stretch
        if s <= 1.0:
            return super().simulate_pipeline(schedule, stages, num_microbatches, virtual_stages=virtual_stages)
        fast = [dataclasses.replace(st, fwd_s=st.fwd_s / s, bwd_s=st.bwd_s / s) for st in stages]
        res = _pipeline.simulate(schedule, fast, num_microbatches, virtual_stages=virtual_stages)
        pp = len(stages) // max(virtual_stages, 1)
        busy = tuple(sum(st.fwd_s + st.bwd_s for st in stages[r::pp]) * num_microbatches for r in range(pp))
        busiest = max(busy)
        if busiest <= res.step_time_s:
            return res
        bubble = sum(busiest - b for b in busy) / (pp * busiest)
        return dataclasses.replace(res, step_time_s=busiest, bubble_fraction=bubble, busy_s=busy)


def cost_model(cluster: Cluster, cal: CPURuntimeCalibration) -> CPURuntimeCostModel:
    """The calibrated cost model for ``cluster`` (gloo CPU processes on this host)."""
    return CPURuntimeCostModel(cluster, cal)


# ---------------------------------------------------------------- 1. rates from single layers
def _probe_model(batch: int):
    from galvatron_fx import zoo

    return zoo.build(PROBE["family"], batch_size=batch, seq_len=PROBE["seq_len"], overrides=PROBE["overrides"],
                     device="cpu", seed=0)


def fit_rates(batch_sizes: Sequence[int] = (2, 4, 8), *, repeats: int = 5, warmup: int = 1,
              progress: bool = False) -> tuple[float, float, float, dict[str, Any]]:
    """``(flops_s, bytes_s, eager overhead_s, measured)`` from the probe's layers (module doc, 1)."""
    import numpy as np
    import torch

    from galvatron_fx.capture import capture
    from galvatron_fx.profiler import model as mp

    graphs = {b: capture(*_probe_model(b)) for b in batch_sizes}
    jobs, where = [], []
    for b, mg in graphs.items():
        for layers in mg.kinds().values():
            jobs.append(mp._layer_job(mg, layers[0], torch.device("cpu")))
            where.append((b, layers[0]))
    res = mp._time_jobs(jobs, repeats=repeats, warmup=warmup, labels=[f"{l.name} b={b}" for b, l in where],
                        progress=progress)
    points, rows = [], []
    for (b, layer), (f, bk, _, _) in zip(where, res):
        rows.append({"layer": layer.name, "batch": b, "fwd_s": f, "bwd_s": bk})
        for d, t in (("fwd", f), ("bwd", bk)):
            fl, nb, n = mp._point_arrays(graphs[b], layer, d)
            if n and t > 0:
                points.append((0, d, fl, nb, n, float(t)))
    m, e, o = mp.fit_efficiency(points, REFERENCE_FLOPS, REFERENCE_BYTES_S)
    pred = mp._predict(np.log([m, e, o]), points, REFERENCE_FLOPS, REFERENCE_BYTES_S)
    err = [float(p / pt[5] - 1) for p, pt in zip(pred, points)]
    return m * REFERENCE_FLOPS, e * REFERENCE_BYTES_S, o, {"layers": rows, "layer_fit_rel_errors": err}


# ---------------------------------------------------------------- 2. the runtime's overhead
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runtime_worker(port: int, batch_sizes: Sequence[int], steps: int, queue) -> None:
    """One gloo rank: the probe compiled by galvatron_fx at each batch size; median step and
    optimizer-step seconds."""
    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    out = {}
    try:
        cluster = default_local_cpu(1)
        for b, rc in ((b, rc) for b in batch_sizes for rc in ("none", "selective")):
            model, inputs = _probe_model(b)
            # recompute none: every layer lowered; selective: run op by op through DTensor
            pm = gfx.compile(model, cluster, inputs, global_batch_size=b,
                             search={"pp": (1,), "tp": (1,), "recompute": (rc,), "uniform": True})
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
            for _ in range(2):
                pm.train_step(inputs, opt)
            step, optim = [], []
            for _ in range(steps):
                t0 = time.perf_counter()
                pm.train_step(inputs, opt)
                step.append(time.perf_counter() - t0)
                for p in pm.parameters():
                    p.grad = torch.zeros_like(p)
                t0 = time.perf_counter()
                opt.step()
                optim.append(time.perf_counter() - t0)
                opt.zero_grad(set_to_none=True)
            nparams = sum(p.numel() for p in pm.parameters())
            out[(b, rc)] = {"step_s": statistics.median(step), "optimizer_s": statistics.median(optim),
                            "params": nparams, "recompute": [str(lp.strategy.recompute) for lp in pm.plan.layers]}
        out["optimizer"] = _time_optimizer([p.detach() for p in pm.parameters()], steps)
    finally:
        dist.destroy_process_group()
        queue.put(out)


def _time_optimizer(params: list, steps: int) -> dict[str, float]:
    """Median seconds of an AdamW step (PyTorch's defaults) over ``params`` as plain tensors, over
    one flat tensor of as many elements, and over ``params`` as DTensors sharded on a one-rank
    mesh (as FSDP's are); with the element and tensor counts (module doc, optimizer step)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    numel = sum(p.numel() for p in params)
    sets = {"plain": [p.clone() for p in params], "flat": [torch.zeros(numel)],
            "dtensor": [distribute_tensor(p.clone(), mesh, [Shard(0)]) for p in params]}
    out: dict[str, float] = {"numel": float(numel), "tensors": float(len(params))}
    for name, ts in sets.items():
        ps = [torch.nn.Parameter(t) for t in ts]
        for p in ps:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(ps, lr=1e-3)
        times = []
        for i in range(steps + 2):
            t0 = time.perf_counter()
            opt.step()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = statistics.median(times)
    return out


def fit_runtime_overhead(flops_s: float, bytes_s: float, batch_sizes: Sequence[int] = (4, 8), *,
                         steps: int = 9) -> tuple[tuple[float, float], tuple[float, float, float], dict[str, Any]]:
    """``((overhead_s per kernel, lowered and interpreted), (optimizer seconds per element, per
    tensor, per DTensor), measured)`` (module doc, 2)."""
    import torch.multiprocessing as tmp

    from galvatron_fx.capture import capture

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_runtime_worker, args=(_free_port(), tuple(batch_sizes), steps, queue))
    p.start()
    runs = queue.get(timeout=600)
    p.join()
    if not runs or "optimizer" not in runs:
        raise ConfigError("cpu_runtime: the runtime micro-run failed (see the log); re-run calibrate()")
    opt = runs.pop("optimizer")
    per_element = opt["flat_s"] / opt["numel"]
    per_tensor = max(0.0, opt["plain_s"] - opt["flat_s"]) / opt["tensors"]
    per_dtensor = max(0.0, opt["dtensor_s"] - opt["flat_s"]) / opt["tensors"]
    cl = default_local_cpu(1)
    rows, per_kernel, per_interp = [], [], []
    roof = ComputeModel(cl, ComputeEfficiency(matmul=flops_s / REFERENCE_FLOPS, memory=bytes_s / REFERENCE_BYTES_S,
                                              overhead_s=0.0))
    unit = ComputeModel(cl, ComputeEfficiency(matmul=1e12, memory=1e12, overhead_s=1.0))
    graphs = {b: capture(*_probe_model(b)) for b in sorted({b for b, _ in runs})}
    for rc in ("none", "selective"):  # the lowered overhead first: the interpreted fit subtracts it
        for (b, mode), r in sorted(runs.items()):
            if mode != rc:
                continue
            mg = graphs[b]
            roofline = kernels = lowered = 0.0
            for layer, lrc in zip(mg.layers, r["recompute"]):
                roofline += sum(roof.layer_times_s(mg, layer, recompute=lrc))
                k = sum(unit.layer_times_s(mg, layer, recompute=lrc))
                kernels += k if lrc == "selective" or rc == "none" else 0.0
                lowered += k if lrc != "selective" and rc != "none" else 0.0
            rest = r["step_s"] - r["optimizer_s"] - roofline
            if rc == "none":
                per_kernel.append(max(rest, 0.0) / kernels)
            else:
                per_interp.append(max(rest - lowered * statistics.median(per_kernel), 0.0) / kernels)
            rows.append({"batch": b, "recompute": rc, **{k: v for k, v in r.items() if k != "recompute"},
                         "roofline_s": roofline, "kernels": round(kernels), "lowered_kernels": round(lowered)})
    return ((statistics.median(per_kernel), statistics.median(per_interp)), (per_element, per_tensor, per_dtensor),
            {"runtime_steps": rows, "optimizer": opt})


# ---------------------------------------------------------------- 3. processes sharing the cores
def _step_worker(idx: int, port: int, barrier, queue, batch: int, rounds: int, steps: int) -> None:
    """Alternate, ``rounds`` times: ``steps`` training steps of the probe through the runtime (in
    this process's own one-rank gloo group) by process 0 alone, the others asleep at the barrier,
    then ``steps`` by every process at once; record each phase's (start, end) on the system-wide
    monotonic clock."""
    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    try:
        model, inputs = _probe_model(batch)
        pm = gfx.compile(model, default_local_cpu(1), inputs, global_batch_size=batch, search={"pp": (1,)})
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        pm.train_step(inputs, opt)  # warm-up
        alone, together = [], []

        def run() -> tuple[float, float]:
            t0 = time.monotonic()
            for _ in range(steps):
                pm.train_step(inputs, opt)
            return t0, time.monotonic()

        for _ in range(rounds):
            barrier.wait()
            if idx == 0:
                alone.append(run())
            barrier.wait()
            together.append(run())
        queue.put((idx, alone, together))
    finally:
        dist.destroy_process_group()


def time_concurrent(processes: int, *, batch: int = 16, rounds: int = 5,
                    steps: int = 5) -> tuple[list[float], list[float]]:
    """Seconds of ``steps`` probe steps by one process alone, and by all ``processes`` at once
    (first start to last end), per round (module doc, step 3)."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_step_worker, args=(i, _free_port(), barrier, queue, batch, rounds, steps))
             for i in range(processes)]
    for p in procs:
        p.start()
    out = {i: (a, t) for i, a, t in (queue.get(timeout=600) for _ in procs)}
    for p in procs:
        p.join()
    alone = [e - s for s, e in out[0][0]]
    together = [max(out[i][1][r][1] for i in out) - min(out[i][1][r][0] for i in out) for r in range(rounds)]
    return alone, together


def measure_slowdown(worlds: Sequence[int], *, batch: int = 16, rounds: int = 7,
                     steps: int = 5) -> tuple[dict[int, float], dict]:
    """Slowdown of each N in ``worlds`` over one process (module doc, step 3)."""
    out, raw = {1: 1.0}, {}
    for n in sorted(set(worlds) - {1}):
        alone, together = time_concurrent(n, batch=batch, rounds=rounds, steps=steps)
        out[n] = statistics.median(t / a for a, t in zip(alone, together))
        raw[str(n)] = {"alone_s": alone, "together_s": together, "steps": steps, "batch": batch}
    return out, raw


# ---------------------------------------------------------------- 4. collectives inside a step
COLLECTIVE_SIZES = (4096, 262144, 1048576)
AFTER, OVERLAPPED, SPLIT = 0, 1, 2  # when the timed all-reduce runs (see _collective_worker)


PROBE_PLANS = ("ddp", "zero3", "tp")  # the probe's plans timed at N ranks


def probe_plan_space(name: str, world: int) -> dict:
    """The search space of probe plan ``name`` at ``world`` ranks, no pipeline, no recomputation:
    every layer data-parallel over all ranks (``ddp``, ``zero3``), or tensor-parallel over all
    (``tp``, the intra-layer ILP's placements)."""
    dp_type, tp = {"ddp": ("ddp", 1), "zero3": ("zero3", 1), "tp": ("ddp", world)}[name]
    return {"tp": (tp,), "sp": ("none",), "dp_types": (dp_type,), "recompute": ("none",), "pp": (1,),
            "uniform": True}


def _collective_worker(rank: int, world: int, port: int, sizes: Sequence[int], rounds: int, iters: int,
                       queue) -> None:
    """One of ``world`` gloo ranks: probe forward+backward steps, alone and each followed by an
    all-reduce of ``size`` bytes in every contiguous group of ``g`` ranks (all groups at once, as
    tensor- or data-parallel groups run), for every group size ``g >= 2`` dividing ``world``,
    interleaved over rounds; then the probe compiled as each of ``PROBE_PLANS`` over all ranks,
    its training steps interleaved over rounds; rank 0 reports the median seconds per step of each."""
    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        groups = {}
        for g in (g for g in range(2, world + 1) if world % g == 0):
            for start in range(0, world, g):  # every rank creates every group, in the same order
                pg = dist.new_group(list(range(start, start + g))) if g < world else dist.group.WORLD
                if start <= rank < start + g:
                    groups[g] = pg
        model, inputs = _probe_model(4)
        bufs = {b: torch.ones(b // 4) for b in sizes}
        # (group size, bytes, mode): 0 bytes = compute alone; AFTER: one all-reduce after each step;
        # OVERLAPPED: launched asynchronously before the step and waited for after it (as bucketed
        # data-parallel gradient sums overlap the backward); SPLIT: one after the forward and one
        # after the backward (each close to the previous sync)
        modes = [(0, 0, AFTER)] + [(g, b, mode) for g in groups for b in sizes for mode in (AFTER, OVERLAPPED, SPLIT)]
        times: dict[tuple[int, int, int], list[float]] = {m: [] for m in modes}
        model(*inputs).backward()
        for g, b, _ in modes[1:]:
            dist.all_reduce(bufs[b], group=groups[g])
        for _ in range(rounds):
            for g, b, mode in modes:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    work = dist.all_reduce(bufs[b], group=groups[g], async_op=True) if g and mode == OVERLAPPED \
                        else None
                    loss = model(*inputs)
                    if g and mode == SPLIT:
                        dist.all_reduce(bufs[b], group=groups[g])
                    loss.backward()
                    if work is not None:
                        work.wait()
                    elif g:
                        dist.all_reduce(bufs[b], group=groups[g])
                times[(g, b, mode)].append((time.perf_counter() - t0) / iters)
        res = {m: statistics.median(t) for m, t in times.items()}
        # the probe's DDP and ZeRO-3 plans over all ranks (4 samples per rank); FSDP's hooks warn
        # on every step on CPU
        warnings.filterwarnings("ignore", category=UserWarning)
        batch = 4 * world
        model, inputs = _probe_model(batch)
        live = {}
        for name in PROBE_PLANS:
            pm = gfx.compile(model, default_local_cpu(world), inputs, global_batch_size=batch,
                             search=probe_plan_space(name, world))
            live[name] = (pm, torch.optim.AdamW(pm.parameters(), lr=0.0))
            for _ in range(2):
                pm.train_step(inputs, live[name][1])
        steps: dict[str, list[float]] = {name: [] for name in live}
        for _ in range(rounds):
            for name, (pm, opt) in live.items():
                for _ in range(iters // 2):
                    dist.barrier()
                    t0 = time.perf_counter()
                    pm.train_step(inputs, opt)
                    steps[name].append(time.perf_counter() - t0)
        res |= {("plan", name): statistics.median(t) for name, t in steps.items()}
        if rank == 0:
            queue.put(res)
    finally:
        dist.destroy_process_group()


def measure_collectives(worlds: Sequence[int], *, sizes: Sequence[int] = COLLECTIVE_SIZES, rounds: int = 5,
                        iters: int = 6) -> tuple[dict, dict, dict, dict[str, float], dict[int, float], dict]:
    """Per N in ``worlds`` and group size: all-reduce bytes -> seconds it adds to a step when N
    ranks compute (after the step; close to the previous sync), the slowdown of overlapping it
    with the step; per N and probe plan, its step seconds (``"N/name"``); per N, the probe step
    alone (module doc, step 4)."""
    import torch.multiprocessing as tmp

    out, close, overlap, plans, steps, raw = {}, {}, {}, {}, {}, {}
    for n in sorted(set(worlds) - {1}):
        ctx = tmp.get_context("spawn")
        queue = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_collective_worker, args=(r, n, port, tuple(sizes), rounds, iters, queue))
                 for r in range(n)]
        for p in procs:
            p.start()
        res = queue.get(timeout=600)
        for p in procs:
            p.join()
        plans |= {f"{n}/{k[1]}": t for k, t in res.items() if k[0] == "plan"}
        res = {k: t for k, t in res.items() if k[0] != "plan"}
        base = steps[n] = res[(0, 0, AFTER)]
        for g in sorted({g for g, _, _ in res if g}):
            out[(n, g)] = {b: max(res[(g, b, AFTER)] - base, 0.0) for b in sizes}
            # two per step, after the forward and after the backward: the excess grows with the
            # compute since the previous sync, from a floor; the pair minus the one after the
            # step is one collective right after a sync (module doc, in-step collective)
            close[(n, g)] = {b: min(max(res[(g, b, SPLIT)] - res[(g, b, AFTER)], 0.0), out[(n, g)][b]) for b in sizes}
            # the overlap slowdown as CommModel.overlapped_s defines it: both at once / the longer
            slow = [res[(g, b, OVERLAPPED)] / max(base, res[(g, b, AFTER)] - base) for b in sizes]
            overlap[(n, g)] = max(1.0, statistics.median(slow))
        names = {AFTER: "", OVERLAPPED: "overlapped_", SPLIT: "split_"}
        raw[str(n)] = {"step_s": base, **{f"step_with_{names[mode]}all_reduce_{b}_in_groups_of_{g}_s": t
                                          for (g, b, mode), t in res.items() if g}}
    return out, close, overlap, plans, steps, raw


def fit_fsdp_factor(cal: CPURuntimeCalibration) -> tuple[dict[int, float], dict[int, float], dict]:
    """Per N with the probe plans measured: the FSDP and the tensor-parallel factors (module doc,
    step 4b), from the probe's plans priced by ``cal``'s cost model (both factors 1) on
    ``default_local_cpu(N)``: ``1 + (measured − predicted difference to DDP) / the priced
    collectives of the class``."""
    import galvatron_fx as gfx
    from galvatron_fx.capture import capture
    from galvatron_fx.search.planner import price_plan

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
    """One independent measurement of everything (module doc, steps 1–4)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    try:
        say("timing the probe's layers ...")
        flops_s, bytes_s, layer_overhead_s, measured = fit_rates(batch_sizes, repeats=repeats)
        say("timing the probe through the runtime (one rank) ...")
        (overhead_s, interp_s), (opt_el, opt_t, opt_dt), rt = fit_runtime_overhead(flops_s, bytes_s,
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
        overhead_s=overhead_s, interpreted_overhead_s=interp_s, layer_overhead_s=layer_overhead_s,
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
        interpreted_overhead_s=med([c.interpreted_overhead_s for c in cals]),
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
    field median of ``runs`` independent measurements (about 50 s each on 2 cores), since one
    measurement on a shared machine can be ±20% off.

    A cached calibration that lacks some of ``worlds`` is extended (measured ``runs`` times) and
    saved."""
    path = cache_path(cache_dir)
    cal = None
    if use_cache and path.exists():
        try:
            cal = CPURuntimeCalibration.from_dict(load_json(path.read_text(), f"calibration {str(path)!r}"))
        except (ConfigError, OSError, UnicodeDecodeError) as e:
            logger.warning("cpu_runtime: ignoring unreadable calibration %s (%s)", path, e)
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
    """``cal`` with the slowdown of each N in ``worlds`` measured again now (module doc, step 3):
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
