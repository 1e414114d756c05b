"""CPU runtime calibration: what the analytic cost model misses when gloo ranks share a few cores.

Contract: :func:`calibrate` measures this machine in a few seconds (once; the result is cached as
JSON under ``default_cache_dir()`` by a fingerprint of the CPU, its core count and the torch
version) and returns a :class:`CPURuntimeCalibration`; :func:`cost_model` turns it into an
``AnalyticCostModel`` for a ``Cluster`` of gloo CPU processes on this host. Nothing it measures
is a plan or the model being planned: only a *probe* model's single layers and its eager step.

Terms
-----
- *probe*: a small GPT-family model (``PROBE``: 2 blocks, width 96, 3 heads, vocabulary 320,
  64 tokens), shaped unlike the zoo's models so the calibration never sees what is planned.
- *rates*: ``flops_s`` and ``bytes_s`` (achieved FLOP/s and bytes/s of one process with one thread
  on the per-node roofline) and ``overhead_s`` (each kernel's Python, dispatcher and autograd
  cost), fitted by :func:`galvatron_fx.profiler.model.fit_efficiency` on the probe's layers,
  forward and backward, at ``batch_sizes``. They are absolute, so that :func:`efficiency` can
  express them relative to any cluster's peaks (a profiled cluster's measured peaks, or the
  defaults) — the ``ComputeEfficiency`` defaults for CPUs are relative to
  ``default_local_cpu``'s 20 GFLOP/s and overstate a profiled cluster's compute by its peak over
  that (about 5× here).
- *slowdown(N)*: the probe's eager training step timed with ``N`` processes running it at once,
  over the same with one process (medians). Up to the core count it stays near 1; beyond, each
  process gets ``cores / N`` of a core, and what the other tenants of the machine take.

Algorithm
---------
1. In this process (one thread): capture the probe at each batch size, time its layers
   (``profiler.model``'s interleaved timing, medians of ``repeats``) and fit the rates.
2. For every ``N > 1`` in ``worlds``: spawn ``N`` processes that each build the probe; in a few
   rounds, process 0 runs ``steps`` eager forward+backward steps alone (the others asleep at a
   barrier), then all ``N`` run ``steps`` at once. The slowdown is the median over rounds of the
   together phase (first start to last end: a synchronous step waits for its slowest rank) over
   the median alone phase. Interleaving the two keeps slow changes of the machine's load from
   biasing the ratio.
3. :func:`efficiency` for a cluster of ``N`` processes per host: ``matmul = flops_s / (peak ·
   slowdown(N))``, ``memory = bytes_s / (bandwidth · slowdown(N))``, ``overhead_s ·
   slowdown(N)`` — every compute second is stretched alike; the communication fits of a profile
   were measured with the N processes and stay as they are. World sizes not measured take the
   nearest measured ``N`` scaled by ``N / N'`` above the core count.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from galvatron_fx.cluster import Cluster, cpu_model, default_cache_dir, make_fingerprint
from galvatron_fx.cost_models.base import AnalyticCostModel
from galvatron_fx.cost_models.compute import ComputeEfficiency
from galvatron_fx.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["CPURuntimeCalibration", "PROBE", "calibrate", "cost_model", "efficiency", "cache_path"]

SCHEMA_VERSION = 1
# The probe: GPT-family, shaped unlike every zoo configuration (widths 96, 3 heads, 320 tokens).
PROBE: dict[str, Any] = {"family": "gpt-tiny", "overrides": {"n_layers": 2, "d_model": 96, "n_heads": 3,
                                                              "vocab_size": 320, "max_seq_len": 64},
                         "seq_len": 64}
REFERENCE_FLOPS, REFERENCE_BYTES_S = 20e9, 10e9  # the fit's reference peaks (any positive values do)


@dataclass(frozen=True, kw_only=True)
class CPURuntimeCalibration:
    """Measured compute rates of one process and the slowdown of N processes sharing the cores."""

    fingerprint: str
    cores: int
    flops_s: float  # achieved FLOP/s of one process, one thread (per-node roofline)
    bytes_s: float  # achieved bytes/s
    overhead_s: float  # per kernel
    slowdown: dict[int, float] = field(default_factory=dict)  # processes -> step time / one process's
    batch_sizes: tuple[int, ...] = ()
    measured: dict[str, Any] = field(default_factory=dict, hash=False)  # raw figures, for reports
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("flops_s", "bytes_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"CPURuntimeCalibration.{name} must be positive, got {v!r}; re-run calibrate()")
        if not (math.isfinite(self.overhead_s) and self.overhead_s >= 0):
            raise ConfigError(f"CPURuntimeCalibration.overhead_s must be >= 0, got {self.overhead_s!r}")
        for n, s in self.slowdown.items():
            if n < 1 or not (math.isfinite(s) and s > 0):
                raise ConfigError(f"CPURuntimeCalibration.slowdown[{n}] = {s!r} is not a positive factor")

    def slowdown_for(self, processes: int) -> float:
        """The measured slowdown of ``processes`` processes (see module doc for unmeasured ones)."""
        if processes in self.slowdown:
            return self.slowdown[processes]
        if not self.slowdown:
            return max(1.0, processes / max(self.cores, 1))
        near = min(self.slowdown, key=lambda n: (abs(n - processes), n))
        scale = max(processes, self.cores) / max(near, self.cores)
        return self.slowdown[near] * scale

    def summary(self) -> str:
        sl = ", ".join(f"{n} proc ×{s:.2f}" for n, s in sorted(self.slowdown.items()))
        return (f"one process {self.flops_s / 1e9:.1f} GFLOP/s, {self.bytes_s / 1e9:.1f} GB/s, "
                f"{self.overhead_s * 1e6:.1f} µs per kernel; slowdown {sl} ({self.source})")

    def describe(self) -> str:
        """One sentence on what the calibration does to a prediction."""
        return ("compute priced at the probe-fitted one-process rates (per-node roofline + per-kernel overhead) "
                "stretched by the measured slowdown of N processes sharing the cores; communication from the "
                "profiled fits unchanged")

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "fingerprint": self.fingerprint, "cores": self.cores,
                "flops_s": self.flops_s, "bytes_s": self.bytes_s, "overhead_s": self.overhead_s,
                "slowdown": {str(n): s for n, s in sorted(self.slowdown.items())},
                "batch_sizes": list(self.batch_sizes), "probe": PROBE, "measured": self.measured,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CPURuntimeCalibration:
        if not isinstance(d, Mapping) or d.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError("CPU runtime calibration: wrong schema; re-run calibrate(use_cache=False)")
        try:
            return cls(fingerprint=str(d["fingerprint"]), cores=int(d["cores"]), flops_s=float(d["flops_s"]),
                       bytes_s=float(d["bytes_s"]), overhead_s=float(d["overhead_s"]),
                       slowdown={int(n): float(s) for n, s in d.get("slowdown", {}).items()},
                       batch_sizes=tuple(int(b) for b in d.get("batch_sizes", ())),
                       measured=dict(d.get("measured", {})), source=str(d.get("source", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"CPU runtime calibration JSON is malformed ({e}); re-run calibrate(use_cache=False)") from e


def machine_fingerprint() -> str:
    """What the calibration depends on: CPU model, cores, torch version, the probe."""
    import torch

    return make_fingerprint({"cpu": cpu_model(), "cores": os.cpu_count() or 1, "torch": torch.__version__,
                             "probe": PROBE, "schema": SCHEMA_VERSION})


def cache_path(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(default_cache_dir(cache_dir)) / f"cpu-runtime-{machine_fingerprint()}.json"


def efficiency(cal: CPURuntimeCalibration, cluster: Cluster, *, rank: int = 0) -> ComputeEfficiency:
    """The calibration as a ``ComputeEfficiency`` relative to ``cluster``'s device peaks, with the
    slowdown of the cluster's processes per host (module doc, step 3)."""
    dev = cluster.device(rank)
    s = cal.slowdown_for(cluster.devices_per_node)
    return ComputeEfficiency(matmul=cal.flops_s / (dev.flops("float32") * s),
                             memory=cal.bytes_s / (dev.memory_bandwidth_bytes_s * s),
                             overhead_s=cal.overhead_s * s, source=f"cpu_runtime:{cal.fingerprint}:×{s:.2f}")


def cost_model(cluster: Cluster, cal: CPURuntimeCalibration) -> AnalyticCostModel:
    """An ``AnalyticCostModel`` for ``cluster`` (gloo CPU processes here) with the calibration."""
    return AnalyticCostModel(cluster, efficiency=efficiency(cal, cluster))


# ---------------------------------------------------------------- measuring
def _probe_model(batch: int):
    from galvatron_fx import zoo

    return zoo.build(PROBE["family"], batch_size=batch, seq_len=PROBE["seq_len"], overrides=PROBE["overrides"],
                     device="cpu", seed=0)


def fit_rates(batch_sizes: Sequence[int] = (2, 4, 8), *, repeats: int = 5, warmup: int = 1,
              progress: bool = False) -> tuple[float, float, float, dict[str, Any]]:
    """``(flops_s, bytes_s, overhead_s, measured)`` from the probe's single layers (module doc, 1)."""
    import numpy as np

    from galvatron_fx.capture import capture
    from galvatron_fx.profiler import model as mp

    graphs = {b: capture(*_probe_model(b)) for b in batch_sizes}
    jobs, where = [], []
    for b, mg in graphs.items():
        for layers in mg.kinds().values():
            jobs.append(mp._layer_job(mg, layers[0], mp.torch.device("cpu")))
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
    return m * REFERENCE_FLOPS, e * REFERENCE_BYTES_S, o, {"layers": rows, "fit_rel_errors": err}


def _step_worker(idx: int, barrier, queue, batch: int, rounds: int, steps: int) -> None:
    """Alternate, ``rounds`` times: ``steps`` probe steps by process 0 alone (the others wait at
    the barrier, asleep), then ``steps`` by every process at once; record each phase's
    (start, end) on the system-wide monotonic clock."""
    import torch

    torch.set_num_threads(1)
    model, inputs = _probe_model(batch)
    model(*inputs).backward()  # warm-up
    alone, together = [], []

    def run() -> tuple[float, float]:
        t0 = time.monotonic()
        for _ in range(steps):
            model(*inputs).backward()
        return t0, time.monotonic()

    for _ in range(rounds):
        barrier.wait()
        if idx == 0:
            alone.append(run())
        barrier.wait()
        together.append(run())
    queue.put((idx, alone, together))


def time_concurrent(processes: int, *, batch: int = 16, rounds: int = 3,
                    steps: int = 5) -> tuple[list[float], list[float]]:
    """Seconds of ``steps`` probe steps by one process alone, and by all ``processes`` at once
    (from the first start to the last end: a synchronous step waits for its slowest rank), per
    round; rounds interleave the two so slow changes of the machine's load hit both alike."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_step_worker, args=(i, barrier, queue, batch, rounds, steps))
             for i in range(processes)]
    for p in procs:
        p.start()
    out = {i: (a, t) for i, a, t in (queue.get(timeout=600) for _ in procs)}
    for p in procs:
        p.join()
    alone = [e - s for s, e in out[0][0]]
    together = [max(out[i][1][r][1] for i in out) - min(out[i][1][r][0] for i in out) for r in range(rounds)]
    return alone, together


def measure_slowdown(worlds: Sequence[int], *, batch: int = 16, rounds: int = 3,
                     steps: int = 5) -> tuple[dict[int, float], dict]:
    """Slowdown of each N in ``worlds`` over one process (module doc, step 2)."""
    out, raw = {1: 1.0}, {}
    for n in sorted(set(worlds) - {1}):
        alone, together = time_concurrent(n, batch=batch, rounds=rounds, steps=steps)
        out[n] = statistics.median(together) / statistics.median(alone)
        raw[str(n)] = {"alone_s": alone, "together_s": together, "steps": steps, "batch": batch}
    return out, raw


def calibrate(*, worlds: Sequence[int] = (2, 4), cache_dir: str | os.PathLike | None = None,
              use_cache: bool = True, batch_sizes: Sequence[int] = (2, 4, 8), repeats: int = 5,
              progress: bool = False) -> CPURuntimeCalibration:
    """The cached calibration of this machine, or a new one (a few seconds) that is cached.

    A cached calibration that lacks the slowdown of some of ``worlds`` is extended and saved."""
    import torch

    path = cache_path(cache_dir)
    cal = None
    if use_cache and path.exists():
        try:
            cal = CPURuntimeCalibration.from_dict(json.loads(path.read_text()))
        except (ConfigError, json.JSONDecodeError) as e:
            logger.warning("cpu_runtime: ignoring unreadable calibration %s (%s)", path, e)
    missing = sorted({1, *worlds} - set(cal.slowdown) if cal else set())
    if cal is not None and not missing:
        return cal
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        if cal is None:
            if progress:
                print("cpu_runtime: timing the probe's layers ...", file=sys.stderr, flush=True)
            flops_s, bytes_s, overhead_s, measured = fit_rates(batch_sizes, repeats=repeats, progress=False)
            if progress:
                print(f"cpu_runtime: timing {', '.join(map(str, sorted(set(worlds) | {1})))} concurrent "
                      "process(es) ...", file=sys.stderr, flush=True)
            slow, raw = measure_slowdown(worlds)
            measured["slowdown"] = raw
            cal = CPURuntimeCalibration(
                fingerprint=machine_fingerprint(), cores=os.cpu_count() or 1, flops_s=flops_s, bytes_s=bytes_s,
                overhead_s=overhead_s, slowdown=slow, batch_sizes=tuple(batch_sizes), measured=measured,
                source=f"measured {time.strftime('%Y-%m-%d %H:%M')} in {time.perf_counter() - t0:.1f} s")
        else:
            slow, raw = measure_slowdown(missing)
            cal = dataclasses.replace(cal, slowdown={**cal.slowdown, **slow},
                                      measured={**cal.measured, "slowdown_more": raw})
    finally:
        torch.set_num_threads(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    os.replace(tmp, path)
    logger.info("cpu_runtime: calibration cached at %s: %s", path, cal.summary())
    return cal
