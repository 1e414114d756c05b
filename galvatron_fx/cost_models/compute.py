"""Compute time of a node and of a layer: a roofline on the per-node facts, corrected by measured
efficiencies.

Contract: needs a ``ModelGraph`` annotated by ``annotate_costs_pass`` (per-node ``fwd_flops``,
``fwd_bytes``, ``bwd_flops``, ``bwd_bytes``; per-layer ``LayerCosts``) and a ``Cluster`` (peak FLOP/s
per dtype and memory bandwidth per device). Produces seconds; never touches the graph.

Terms
-----
- *roofline time* of one node: ``max(flops / (peak · matmul), bytes / (bandwidth · memory))``: the
  kernel is bound either by arithmetic or by memory traffic, whichever is slower.
- *kernel*: a node that does work in a direction (non-zero FLOPs or bytes there); views and
  ``getitem`` are free. Each kernel pays ``overhead_s`` (launch latency, Python/dispatcher cost).
- *efficiency* (:class:`ComputeEfficiency`): ``matmul`` is the fraction of dense peak FLOP/s that
  the kernels reach, ``memory`` the fraction of memory bandwidth, ``overhead_s`` the per-kernel
  cost; ``per_kind`` maps a layer kind hash to multiplicative ``(fwd_factor, bwd_factor)``
  corrections fitted by ``galvatron_fx.profiler.model.profile_model``.
- *fractions*: ``batch_fraction`` (micro-batch / captured batch) and ``tp_fraction`` (1 / tensor
  parallel degree) scale every node's FLOPs and bytes, not its kernel count.
- *dtypes*: bytes were counted in the dtype the graph was captured in; a layer's bytes are priced
  in the plan's compute dtype (× compute bytes / captured bytes: a bf16 plan of an fp32 capture
  moves half). FLOPs run at the device's peak for the compute dtype, fp32 at the ``tfloat32``
  peak where ``Cluster.allow_tf32`` is set (:func:`matmul_dtype`).
- *fixed costs*: ``overhead_s`` per kernel and ``layer_overhead_s`` per layer call in each
  direction: the host's work (Python, dispatcher, autograd, allocator, the launch itself). Where
  launches are asynchronous (``async_launch``, GPUs) it overlaps the device's kernels and a layer
  takes the longer of the two — a small micro-batch is bound by the host, which is why a GPU
  step barely grows from micro-batch 1 to 2; on a CPU the same thread does both and they add. A
  device spec's ``kernel_overhead_s`` and ``layer_overhead_s`` (measured by the hardware
  profiler, or a preset's) replace the defaults.

Algorithm
---------
Because each node's FLOPs and bytes scale by the same fraction ``s``,
``max(s·f/P, s·b/B) = s · max(f/P, b/B)``: the per-node roofline sum of a layer is linear in ``s``.
So for each (layer kind, device kind) the model sums once, over the layer's nodes, the roofline
time and the kernel count of forward and backward, and a query is

    fwd_s = k_fwd · (s · R_fwd  ⊕  n_fwd · overhead_s + layer_overhead_s)
    bwd_s = k_bwd · (s · (R_bwd + R_re)  ⊕  (n_bwd + n_re) · overhead_s + (1 + re) · layer_overhead_s)

with ``⊕`` the max under ``async_launch`` and the sum otherwise,

``k`` the per-kind factors (1 when uncalibrated) and ``re`` 1 under recomputation. Recomputation adds the layer's measured
recompute FLOPs/bytes (``LayerCosts.recompute_*_for``), costed as the aggregate roofline of those
totals times the layer forward's ratio (per-node sum / aggregate roofline), since what is
recomputed is a part of that forward; it adds the forward's kernels (``full``) or its non-matmul
kernels (``selective``). A query is then a dictionary lookup and a few multiplications.

Default efficiencies (used when none are given, chosen by device kind, see ``default_efficiency``):
GPUs reach ~0.6–0.7 of dense peak on the transformer GEMMs and ~0.8 of HBM bandwidth on
elementwise kernels, with a few µs of eager launch cost per kernel. The CPU defaults come from
``profile_model`` on gpt-tiny (one thread), relative to ``default_local_cpu``'s 20 GFLOP/s and
10 GB/s; profile your own machine for better ones.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from galvatron_fx.cluster import Cluster, DeviceSpec, read_json_arg
from galvatron_fx.cluster.limits import load_json
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.meta import facts

logger = logging.getLogger(__name__)

__all__ = ["ComputeEfficiency", "ComputeModel", "default_efficiency", "node_sums"]

EFFICIENCY_SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ComputeEfficiency:
    """Achieved fractions of a device's peaks, the per-kernel overhead and per-kind corrections."""

    matmul: float = 0.65  # fraction of dense peak FLOP/s
    memory: float = 0.8  # fraction of memory bandwidth
    overhead_s: float = 5e-6  # per kernel launch
    layer_overhead_s: float = 0.0  # per layer call, in each direction
    # kernels are launched asynchronously (GPUs): the host's launch work overlaps the device's
    # kernels, and a layer takes the longer of the two; else (CPUs) the same thread does both
    async_launch: bool = False
    # layer kind hash -> (fwd_factor, bwd_factor), multiplicative, from calibration
    per_kind: dict[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    source: str = "default"  # "default", or where the figures came from (a calibration)

    def __post_init__(self) -> None:
        for name in ("matmul", "memory"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"ComputeEfficiency.{name} must be a positive finite number, got {v!r}")
        for name in ("overhead_s", "layer_overhead_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"ComputeEfficiency.{name} must be >= 0, got {v!r}")
        for k, fb in self.per_kind.items():
            if len(fb) != 2 or not all(math.isfinite(x) and x > 0 for x in fb):
                raise ConfigError(f"ComputeEfficiency.per_kind[{k!r}] must be (fwd_factor > 0, bwd_factor > 0), got {fb!r}")

    def factors(self, kind: str) -> tuple[float, float]:
        """``(fwd_factor, bwd_factor)`` of a layer kind, ``(1, 1)`` when it was not calibrated."""
        return self.per_kind.get(kind, (1.0, 1.0))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (the inverse of ``from_dict``)."""
        return {
            "schema_version": EFFICIENCY_SCHEMA_VERSION,
            "matmul": self.matmul,
            "memory": self.memory,
            "overhead_s": self.overhead_s,
            "layer_overhead_s": self.layer_overhead_s,
            "async_launch": self.async_launch,
            "per_kind": {k: [f, b] for k, (f, b) in sorted(self.per_kind.items())},
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComputeEfficiency:
        """Build from the JSON form; unknown keys or a wrong schema raise ``ConfigError``."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"compute efficiency: expected a JSON object, got {type(data).__name__}")
        allowed = {"schema_version", "matmul", "memory", "overhead_s", "layer_overhead_s", "async_launch", "per_kind",
                   "source"}
        unknown = set(data) - allowed
        if unknown:
            raise ConfigError(f"compute efficiency: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        version = data.get("schema_version", EFFICIENCY_SCHEMA_VERSION)
        if version != EFFICIENCY_SCHEMA_VERSION:
            raise ConfigError(
                f"compute efficiency: schema_version {version!r} is not {EFFICIENCY_SCHEMA_VERSION}; "
                "re-run profile_model to regenerate it"
            )
        try:
            per_kind = {str(k): (float(v[0]), float(v[1])) for k, v in data.get("per_kind", {}).items()}
            return cls(
                matmul=float(data["matmul"]),
                memory=float(data["memory"]),
                overhead_s=float(data["overhead_s"]),
                layer_overhead_s=float(data.get("layer_overhead_s", 0.0)),
                async_launch=bool(data.get("async_launch", False)),
                per_kind=per_kind,
                source=str(data.get("source", "default")),
            )
        except (KeyError, TypeError, IndexError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"compute efficiency JSON is malformed ({type(e).__name__}: {e}); regenerate it") from e

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1, sort_keys=True)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_str: str | os.PathLike) -> ComputeEfficiency:
        """Load from a JSON file path or a JSON string."""
        text, source = read_json_arg(path_or_str, "compute efficiency")
        return cls.from_dict(load_json(text, source))


# profile_model on gpt-tiny (batch 1/2/4, seq 128, one thread; the median of five fits on a
# 2-core machine), relative to default_local_cpu's conservative peaks (20 GFLOP/s, 10 GB/s):
# GEMMs run faster than that peak, elementwise kernels somewhat slower than that bandwidth, and
# each node pays tens of µs of Python, dispatcher and autograd bookkeeping.
CPU_DEFAULT = ComputeEfficiency(matmul=2.5, memory=0.7, overhead_s=54e-6, source="default:cpu")
GPU_DEFAULT = ComputeEfficiency(matmul=0.65, memory=0.8, overhead_s=5e-6, async_launch=True, source="default:gpu")


def default_efficiency(device: DeviceSpec) -> ComputeEfficiency:
    """Uncalibrated efficiencies for a device kind (CPU kinds start with ``cpu``; others are GPUs),
    with the fixed costs the device spec gives (``kernel_overhead_s``, ``layer_overhead_s``)."""
    base = CPU_DEFAULT if device.kind.lower().startswith("cpu") else GPU_DEFAULT
    changes: dict[str, Any] = {}
    if device.kernel_overhead_s is not None:
        changes["overhead_s"] = device.kernel_overhead_s
    if device.layer_overhead_s is not None:
        changes["layer_overhead_s"] = device.layer_overhead_s
    return dataclasses.replace(base, source=f"{base.source}+{device.kind}", **changes) if changes else base


def matmul_dtype(cluster: Cluster, dtype: str) -> str:
    """The peak FLOP/s entry a ``dtype`` matmul runs at: fp32 on TF32 tensor cores where the
    cluster allows TF32 (``Cluster.allow_tf32``) and the device has that peak."""
    name = str(dtype).removeprefix("torch.")
    return "tfloat32" if name == "float32" and cluster.allow_tf32 else name


def captured_float_bytes(mg: ModelGraph) -> int:
    """Bytes per element of the floating dtype the graph was captured in (the one holding most
    parameter bytes; 4 when it has no floating parameters)."""
    by_dtype: dict[str, int] = {}
    for p in mg.params.values():
        if p.dtype in _FLOAT_BYTES:
            by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.nbytes
    return _FLOAT_BYTES[max(by_dtype, key=by_dtype.__getitem__)] if by_dtype else 4


_FLOAT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class _KindSums:
    fwd_roof_s: float  # per-node roofline sum at fraction 1
    bwd_roof_s: float
    fwd_kernels: int
    bwd_kernels: int
    fwd_matmul_kernels: int
    fwd_agg_ratio: float  # fwd per-node sum / aggregate roofline (>= 1)
    byte_scale: float  # compute dtype bytes / captured dtype bytes


def node_sums(mg: ModelGraph, layer: LayerInfo) -> list[tuple[int, int, int, int]]:
    """``(fwd_flops, fwd_bytes, bwd_flops, bwd_bytes)`` of every node of ``layer``, in order."""
    by_name = mg.nodes_by_name()
    out = []
    for name in layer.node_names:
        f = facts(by_name[name])
        out.append((int(f.fwd_flops), int(f.fwd_bytes), int(f.bwd_flops), int(f.bwd_bytes)))
    return out


class ComputeModel:
    """Compute time of nodes and layers on a cluster's devices (see the module docstring).

    ``efficiency`` is one ``ComputeEfficiency`` for every device, a mapping from device kind to
    one, or None for ``default_efficiency`` of each device kind. ``dtype`` picks the peak FLOP/s.
    """

    def __init__(
        self,
        cluster: Cluster,
        efficiency: ComputeEfficiency | Mapping[str, ComputeEfficiency] | None = None,
        dtype: str = "float32",
    ) -> None:
        self.cluster = cluster
        self.dtype = str(dtype).removeprefix("torch.")
        self.precision_bytes = _FLOAT_BYTES.get(self.dtype, 4)
        self._efficiency = efficiency
        # device kind -> (seconds per FLOP, seconds per byte, efficiency)
        self._rates: dict[str, tuple[float, float, ComputeEfficiency]] = {}
        # (layer kind, device kind) -> sums; a kind hash fixes ops and shapes, hence the facts
        self._sums: dict[tuple[str, str], _KindSums] = {}

    # ---------------------------------------------------------------- per device
    def efficiency(self, rank: int = 0) -> ComputeEfficiency:
        """The efficiencies used for ``rank``'s device."""
        return self._rate(rank)[2]

    def _rate(self, rank: int) -> tuple[float, float, ComputeEfficiency]:
        dev = self.cluster.device(rank)
        r = self._rates.get(dev.kind)
        if r is None:
            eff = self._efficiency
            if isinstance(eff, Mapping):
                eff = eff.get(dev.kind)
            if eff is None:
                eff = default_efficiency(dev)
            peak = dev.flops(matmul_dtype(self.cluster, self.dtype))
            r = (1.0 / (peak * eff.matmul), 1.0 / (dev.memory_bandwidth_bytes_s * eff.memory), eff)
            self._rates[dev.kind] = r
        return r

    def matmul_flops(self, rank: int = 0) -> float:
        """The FLOP/s this model prices a matmul on ``rank``'s device at (its peak times the
        matmul efficiency): above the stated peak where that peak is a conservative figure
        (this machine's CPU defaults)."""
        return 1.0 / self._rate(rank)[0]

    # ---------------------------------------------------------------- nodes
    def node_time_s(self, flops: float, nbytes: float, *, rank: int = 0) -> float:
        """Roofline time of one kernel doing ``flops`` and moving ``nbytes``, plus its overhead.

        A node with neither FLOPs nor bytes (a view) costs nothing.
        """
        if flops <= 0 and nbytes <= 0:
            return 0.0
        s_per_flop, s_per_byte, eff = self._rate(rank)
        return max(flops * s_per_flop, nbytes * s_per_byte) + eff.overhead_s

    # ---------------------------------------------------------------- layers
    def layer_times_s(
        self,
        mg: ModelGraph,
        layer: LayerInfo,
        *,
        batch_fraction: float = 1.0,
        tp_fraction: float = 1.0,
        recompute: str = "none",
        rank: int = 0,
    ) -> tuple[float, float]:
        """``(fwd_s, bwd_s)`` of one layer on ``rank``'s device (see the module docstring).

        ``batch_fraction`` and ``tp_fraction`` scale FLOPs and bytes (not kernel overheads);
        ``recompute`` (none / selective / full) adds the recomputed forward to the backward.
        """
        s_per_flop, s_per_byte, eff = self._rate(rank)
        dev_kind = self.cluster.device(rank).kind
        key = (layer.kind, dev_kind)
        sums = self._sums.get(key)
        if sums is None:
            sums = self._sums[key] = self._kind_sums(mg, layer, s_per_flop, s_per_byte)
        s = batch_fraction * tp_fraction
        kf, kb = eff.per_kind.get(layer.kind, (1.0, 1.0))
        dev_f, host_f = s * sums.fwd_roof_s, sums.fwd_kernels * eff.overhead_s + eff.layer_overhead_s
        dev_b, host_b = s * sums.bwd_roof_s, sums.bwd_kernels * eff.overhead_s + eff.layer_overhead_s
        if recompute != "none":
            costs = layer.costs
            if costs is None:
                raise ValueError(f"layer {layer.name} has no measured costs: capture it with annotate=True")
            rf, rb = costs.recompute_flops_for(recompute), costs.recompute_bytes_for(recompute)
            if rf or rb:
                agg = max(rf * s_per_flop, rb * s_per_byte * sums.byte_scale)
                n_re = sums.fwd_kernels if recompute == "full" else sums.fwd_kernels - sums.fwd_matmul_kernels
                dev_b += s * agg * sums.fwd_agg_ratio
                host_b += n_re * eff.overhead_s + eff.layer_overhead_s
        if eff.async_launch:
            return kf * max(dev_f, host_f), kb * max(dev_b, host_b)
        return kf * (dev_f + host_f), kb * (dev_b + host_b)

    def _kind_sums(self, mg: ModelGraph, layer: LayerInfo, s_per_flop: float, s_per_byte: float) -> _KindSums:
        if layer.costs is None:
            raise ConfigError(
                f"layer {layer.name} has no costs: capture with annotate=True (or run annotate_costs_pass) "
                "before asking the compute model"
            )
        scale = self.precision_bytes / captured_float_bytes(mg)  # bytes in the plan's compute dtype
        s_per_byte *= scale
        fr = br = 0.0
        nf = nb = nmm = 0
        tf = tb = 0
        for ff, fb, bf, bb in node_sums(mg, layer):
            if ff or fb:
                fr += max(ff * s_per_flop, fb * s_per_byte)
                nf += 1
                nmm += ff > 0
                tf += ff
                tb += fb
            if bf or bb:
                br += max(bf * s_per_flop, bb * s_per_byte)
                nb += 1
        agg = max(tf * s_per_flop, tb * s_per_byte)
        ratio = fr / agg if agg > 0 else 1.0
        return _KindSums(fr, br, nf, nb, nmm, ratio, scale)
