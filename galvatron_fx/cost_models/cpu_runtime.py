"""CPU runtime cost model: what the analytic cost model misses when gloo ranks share a few cores.

Contract: :func:`cost_model` turns a :class:`CPURuntimeCalibration` (this machine's fitted
constants, measured and cached by :func:`galvatron_fx.profiler.cpu_calibration.calibrate`) into
a :class:`CPURuntimeCostModel` for a ``Cluster`` of gloo CPU processes on this host (a profiled
``Cluster.local_cpu`` or the defaults). Nothing here measures anything; the record's fields were
measured on a *probe* model (``PROBE``), never on the model being planned.

Terms
-----
- *probe*: a small GPT-family model (``PROBE``: 2 blocks, width 96, 3 heads, vocabulary 320,
  64 tokens), shaped unlike the zoo's models so the calibration never sees what is planned.
- *rates*: ``flops_s`` and ``bytes_s``, the achieved FLOP/s and bytes/s of one process with one
  thread on the compute model's per-node roofline (with an eager per-kernel overhead,
  ``layer_overhead_s``, kept for reference). They are absolute, so :func:`efficiency` can state
  them relative to any cluster's peaks: the ``ComputeEfficiency`` defaults for CPUs are relative
  to ``default_local_cpu``'s 20 GFLOP/s and overstate a profiled cluster's compute by its
  measured peak over that.
- *runtime overhead* ``overhead_s``: per kernel, what a training step through galvatron_fx's
  runtime costs beyond the roofline (DTensor dispatch, layer executors, autograd, hooks).
- *optimizer step*: AdamW (PyTorch's CPU default, one tensor at a time): seconds per element and
  per tensor, plain and DTensor (a DTensor pays DTensor's dispatch on each of the step's dozen
  kernels; FSDP's shards are DTensors).
- *slowdown(N)*: wall time of the probe's runtime steps run by ``N`` processes at once over the
  same steps by one process. Up to the core count it stays near 1; beyond it, each process gets
  a share of a core; lasting load from other tenants shows up in it too.
- *in-step collective*: the seconds an all-reduce of ``b`` bytes adds to a step when every rank
  also computes (``collective_s[(N, g)][b]``, all contiguous groups of ``g`` of the ``N`` ranks at
  once): the rank skew it waits out and the cores it shares, which a hardware profile's
  back-to-back timing does not see; its *excess* is that less the cluster's all-reduce seconds of
  the same bytes. A collective that follows the previous sync closely waits out less skew: the
  excess *right after a sync* (``collective_close_s``), and the excess of a collective grows
  linearly from it to the after-a-step one with the compute since the previous sync, up to a
  whole probe step (``probe_step_s[N]``); and *overlap*: the slowdown of an all-reduce launched
  asynchronously before a step and waited for after it, in ``CommModel.overlapped_s``'s sense
  (both at once / the longer alone).
- *FSDP factor* ``fsdp_factor[N]``: the seconds going from DDP to ZeRO-3 adds to the probe's
  steps at ``N`` ranks beyond what this model predicts for that change, over the FSDP
  collectives it prices, plus 1: 1 when FSDP's all-gathers and reduce-scatters add exactly their
  in-step seconds (on gloo the main thread waits for each: nothing is overlapped), above 1 when
  FSDP's hooks and copies add more, below when less. *Tensor-parallel factor* ``tp_factor[N]``:
  the same for the probe's tensor-parallel plan over all ``N`` ranks against its DDP plan, over
  the collectives inside its layers.

Algorithm
---------
(Steps 1–4b, the measurement, are :mod:`galvatron_fx.profiler.cpu_calibration`'s.)

5. :class:`CPURuntimeCostModel` for a cluster of ``N`` processes on one host, ``s = slowdown(N)``:
   compute at ``matmul = flops_s / (peak · s)``, ``memory = bytes_s / (bandwidth · s)``,
   ``overhead_s · s`` (every compute second stretched alike; process counts not measured take
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
   chunks' costs)``. Tensor-parallel layers are priced by their lowered program's collectives and
   saved activations (``traces_runtime``: :mod:`galvatron_fx.search.lowered_prices`): gloo has
   no reduce-scatter of its own (it all-reduces) and pays milliseconds per small collective, so
   the ILP's one-all-reduce-per-gradient rule is far off here; each of those collectives at its
   seconds times the tensor-parallel factor.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from galvatron_fx.cluster import Cluster, Collective
from galvatron_fx.cost_models import pipeline as _pipeline
from galvatron_fx.cost_models.base import AnalyticCostModel
from galvatron_fx.cost_models.communication import CommModel
from galvatron_fx.cost_models.compute import ComputeEfficiency
from galvatron_fx.cost_models.pipeline import PipelineResult
from galvatron_fx.errors import ConfigError

__all__ = ["CPURuntimeCalibration", "CPURuntimeCostModel", "PROBE", "SCHEMA_VERSION", "cache_path", "cached",
           "calibrated_cost_model", "comm_excess", "cost_model", "efficiency", "machine_fingerprint", "read_cache"]

SCHEMA_VERSION = 8  # 8: kernel bytes without metadata queries, in the compute dtype; 7: tensor-parallel gradients summed where a value is made (runtime); 6: collectives close to a sync; 5: optimizer per element / tensor / DTensor; op-by-op overhead; probe plans at N ranks
# The probe: GPT-family, shaped unlike every zoo configuration (width 96, 3 heads, 320 tokens).
PROBE: dict[str, Any] = {"family": "gpt-tiny", "overrides": {"n_layers": 2, "d_model": 96, "n_heads": 3,
                                                              "vocab_size": 320, "max_seq_len": 64},
                         "seq_len": 64}


@dataclass(frozen=True, kw_only=True)
class CPURuntimeCalibration:
    """Measured compute rates of one process, the runtime's per-kernel overhead and the slowdown
    of N processes sharing the cores (see the module doc)."""

    fingerprint: str
    cores: int
    flops_s: float  # achieved FLOP/s of one process, one thread (per-node roofline)
    bytes_s: float  # achieved bytes/s
    overhead_s: float  # per kernel, a step through the runtime (lowered layers)
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
        for name in ("overhead_s", "layer_overhead_s", "optimizer_s_per_element", "optimizer_s_per_tensor",
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
        for name, v in {**self.plan_step_s, **{f"fsdp {n}": f for n, f in self.fsdp_factor.items()},
                       **{f"tp {n}": f for n, f in self.tp_factor.items()}}.items():
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"CPURuntimeCalibration: plan step / FSDP factor {name} = {v!r} must be >= 0")

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
                f"{self.overhead_s * 1e6:.1f} µs per kernel (eager layers {self.layer_overhead_s * 1e6:.1f}); "
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
                       optimizer_s_per_element=float(d.get("optimizer_s_per_element", 0.0)),
                       optimizer_s_per_tensor=float(d.get("optimizer_s_per_tensor", 0.0)),
                       optimizer_s_per_dtensor=float(d.get("optimizer_s_per_dtensor", 0.0)),
                       plan_step_s={str(k): float(v) for k, v in d.get("plan_step_s", {}).items()},
                       fsdp_factor={int(n): float(v) for n, v in d.get("fsdp_factor", {}).items()},
                       tp_factor={int(n): float(v) for n, v in d.get("tp_factor", {}).items()},
                       slowdown={int(n): float(s) for n, s in d.get("slowdown", {}).items()},
                       collective_s={_pair(k): {int(b): float(t) for b, t in per.items()}
                                     for k, per in d.get("collective_s", {}).items()},
                       collective_close_s={_pair(k): {int(b): float(t) for b, t in
                                                                                per.items()}
                                           for k, per in d.get("collective_close_s", {}).items()},
                       probe_step_s={int(n): float(t) for n, t in d.get("probe_step_s", {}).items()},
                       overlap={_pair(k): float(v) for k, v in d.get("overlap", {}).items()},
                       measured=dict(d.get("measured", {})), source=str(d.get("source", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"CPU runtime calibration JSON is malformed ({e}); "
                              "re-run calibrate(use_cache=False)") from e


def _pair(key: str) -> tuple[int, int]:
    """``"NxG"`` as ``(N, G)`` (a ValueError otherwise)."""
    n, g = key.split("x")
    return int(n), int(g)


def _nearest(table: Mapping[int, float], n: int, default: float) -> float:
    return table[min(table, key=lambda k: (abs(k - n), k))] if table else default


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


# ---- this machine's cached calibration ------------------------------------------------------------
def machine_fingerprint() -> str:
    """What a calibration depends on: CPU model, cores, torch version, the probe."""
    import os

    import torch

    from galvatron_fx.cluster.host import cpu_model, make_fingerprint

    return make_fingerprint({"cpu": cpu_model(), "cores": os.cpu_count() or 1, "torch": torch.__version__,
                             "probe": PROBE, "schema": SCHEMA_VERSION})


def cache_path(cache_dir=None):
    """Where this machine's calibration is cached (``default_cache_dir``)."""
    from pathlib import Path

    from galvatron_fx.cluster.host import default_cache_dir

    return Path(default_cache_dir(cache_dir)) / f"cpu-runtime-{machine_fingerprint()}.json"


def cached(cluster: Cluster, cache_dir=None) -> CPURuntimeCalibration | None:
    """This machine's cached calibration when ``cluster`` is this host's gloo CPU processes
    (``Cluster.local_cpu``: profiled or the defaults; its fingerprint is this host's), else None.
    An unreadable cache file is ignored (with a warning)."""
    from galvatron_fx.cluster.host import local_fingerprint

    if cluster.backend != "gloo" or not all(k.lower().startswith("cpu") for k in cluster.device_specs) \
            or cluster.fingerprint != local_fingerprint(cluster.world_size):
        return None
    return read_cache(cache_dir)


def read_cache(cache_dir=None) -> CPURuntimeCalibration | None:
    """The calibration cached at :func:`cache_path`, read bounded; None when there is none or it
    cannot be read (said once, as a warning)."""
    import logging

    from galvatron_fx.cluster.limits import read_json

    path = cache_path(cache_dir)
    if not path.exists():
        return None
    try:
        return CPURuntimeCalibration.from_dict(read_json(path, what="calibration"))
    except (ConfigError, OSError, KeyError, TypeError, ValueError) as e:
        logging.getLogger(__name__).warning("cpu_runtime: ignoring unreadable calibration %s (%s)", path, e)
        return None


def calibrated_cost_model(cluster: Cluster, precision="fp32") -> CPURuntimeCostModel | None:
    """The planner's default on this machine's CPU processes: the calibrated model when a
    calibration of this machine is cached (``galvatron_fx.profiler.cpu_calibration.calibrate``;
    ``make demo`` measures one) and the plan computes in fp32 (what the probe measured), else None
    (the analytic model)."""
    compute = getattr(precision, "compute_dtype", precision)
    if str(compute).removeprefix("torch.") not in ("fp32", "float32"):
        return None
    cal = cached(cluster)
    return cost_model(cluster, cal) if cal is not None else None
