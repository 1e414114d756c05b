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

Algorithm
---------
Because each node's FLOPs and bytes scale by the same fraction ``s``,
``max(s·f/P, s·b/B) = s · max(f/P, b/B)``: the per-node roofline sum of a layer is linear in ``s``.
So for each (layer kind, device kind) the model sums once, over the layer's nodes, the roofline
time and the kernel count of forward and backward, and a query is

    fwd_s = k_fwd · (s · R_fwd + n_fwd · overhead_s)
    bwd_s = k_bwd · (s · (R_bwd + R_re) + (n_bwd + n_re) · overhead_s)

with ``k`` the per-kind factors (1 when uncalibrated). Recomputation adds the layer's measured
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

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from galvatron_fx.cluster import Cluster, DeviceSpec, read_json_arg
from galvatron_fx.errors import ConfigError
from galvatron_fx.limits import load_json
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
    # layer kind hash -> (fwd_factor, bwd_factor), multiplicative, from calibration
    per_kind: dict[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    source: str = "default"  # "default", or where the figures came from (a calibration)

    def __post_init__(self) -> None:
        for name in ("matmul", "memory"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"ComputeEfficiency.{name} must be a positive finite number, got {v!r}")
        if not (math.isfinite(self.overhead_s) and self.overhead_s >= 0):
            raise ConfigError(f"ComputeEfficiency.overhead_s must be >= 0, got {self.overhead_s!r}")
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
            "per_kind": {k: [f, b] for k, (f, b) in sorted(self.per_kind.items())},
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComputeEfficiency:
        """Build from the JSON form; unknown keys or a wrong schema raise ``ConfigError``."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"compute efficiency: expected a JSON object, got {type(data).__name__}")
        allowed = {"schema_version", "matmul", "memory", "overhead_s", "per_kind", "source"}
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


# profile_model on gpt-tiny (batch 1/2/4, seq 128, one thread), relative to default_local_cpu's
# conservative peaks (20 GFLOP/s, 10 GB/s), hence above 1: GEMMs and cache-resident tensors run
# several times faster than those peaks, and each node pays tens of µs of Python, dispatcher and
# autograd bookkeeping.
CPU_DEFAULT = ComputeEfficiency(matmul=3.7, memory=9.5, overhead_s=43e-6, source="default:cpu")
GPU_DEFAULT = ComputeEfficiency(matmul=0.65, memory=0.8, overhead_s=5e-6, source="default:gpu")


def default_efficiency(device: DeviceSpec) -> ComputeEfficiency:
    """Uncalibrated efficiencies for a device kind (CPU kinds start with ``cpu``; others are GPUs)."""
    return CPU_DEFAULT if device.kind.lower().startswith("cpu") else GPU_DEFAULT


@dataclass(frozen=True, slots=True)
class _KindSums:
    fwd_roof_s: float  # per-node roofline sum at fraction 1
    bwd_roof_s: float
    fwd_kernels: int
    bwd_kernels: int
    fwd_matmul_kernels: int
    fwd_agg_ratio: float  # fwd per-node sum / aggregate roofline (>= 1)


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
            r = (1.0 / (dev.flops(self.dtype) * eff.matmul), 1.0 / (dev.memory_bandwidth_bytes_s * eff.memory), eff)
            self._rates[dev.kind] = r
        return r

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
        fwd = s * sums.fwd_roof_s + sums.fwd_kernels * eff.overhead_s
        bwd = s * sums.bwd_roof_s + sums.bwd_kernels * eff.overhead_s
        if recompute != "none":
            costs = layer.costs
            rf, rb = costs.recompute_flops_for(recompute), costs.recompute_bytes_for(recompute)
            if rf or rb:
                agg = max(rf * s_per_flop, rb * s_per_byte)
                n_re = sums.fwd_kernels if recompute == "full" else sums.fwd_kernels - sums.fwd_matmul_kernels
                bwd += s * agg * sums.fwd_agg_ratio + n_re * eff.overhead_s
        return kf * fwd, kb * bwd

    def _kind_sums(self, mg: ModelGraph, layer: LayerInfo, s_per_flop: float, s_per_byte: float) -> _KindSums:
        if layer.costs is None:
            raise ConfigError(
                f"layer {layer.name} has no costs: capture with annotate=True (or run annotate_costs_pass) "
                "before asking the compute model"
            )
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
        return _KindSums(fr, br, nf, nb, nmm, ratio)
