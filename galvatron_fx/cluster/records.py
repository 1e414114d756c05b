"""The records a cluster is made of: collectives and link tiers by name, a fitted collective cost,
a device's datasheet figures and fixed costs, a tier of links; each record's JSON form, checked.

Terms
-----
- *tier*: a class of links. ``intra_node`` joins devices of one node (NVLink, PCIe, shared memory),
  ``inter_node`` joins nodes (InfiniBand, Ethernet). A group of ranks pays the slowest tier it spans.
- *bus bandwidth* (``LinkTier.bandwidth_bytes_s``): per-device achievable bandwidth in the
  nccl-tests sense, so a ring all-reduce of ``S`` bytes over ``n`` devices takes
  ``latency_s + 2 (n-1)/n * S / bandwidth_bytes_s``.
- *fit*: ``CollectiveFit(alpha_s, beta_s_per_byte)``, ``time_s = alpha_s + beta_s_per_byte * nbytes``
  for one (collective, group size) on one tier, measured by ``galvatron_fx.profiler.profile_hardware``.
  ``nbytes`` follows the convention of ``galvatron_fx.cost_models.communication`` (the full,
  unsharded tensor size).
- *overlap slowdown*: factor (>= 1) by which compute and communication each slow down when they run
  at the same time (shared memory bandwidth, SMs spent on communication kernels).

The JSON form is strict: unknown keys, missing fields and negative or zero sizes raise
``ConfigError`` naming the field (``cluster.device_specs['A100-80GB'].memory_bytes``). Every
number of a cluster, however built, lies within the sane ranges of :mod:`galvatron_fx.cluster.limits`
(:mod:`galvatron_fx.cluster.checks` lists them). This host's facts, fingerprints and the cache
directory are :mod:`galvatron_fx.cluster.host`'s.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import galvatron_fx.cluster.limits as limits
from galvatron_fx.cluster.checks import check_keys, read_number
from galvatron_fx.errors import ConfigError

GiB = 2**30
MiB = 2**20


class Collective(StrEnum):
    """The collectives the cost model knows."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    P2P = "p2p"
    BROADCAST = "broadcast"


class TierName(StrEnum):
    """Link tiers, fastest first."""

    INTRA_NODE = "intra_node"
    INTER_NODE = "inter_node"


@dataclass(frozen=True)
class CollectiveFit:
    """``time_s = alpha_s + beta_s_per_byte * nbytes`` for one collective and group size.

    ``points`` optionally keeps the measured ``(nbytes, time_s)`` the fit came from, sorted by
    size. Inside their range, time is interpolated log-log between them: real links change regime
    (caches, protocols, chunking) between 4 KiB and 64 MiB in ways one straight line cannot follow.
    Outside it, the alpha-beta line is used (above the largest point, its slope continues from it).
    """

    alpha_s: float
    beta_s_per_byte: float
    points: tuple[tuple[int, float], ...] = ()

    def time_s(self, nbytes: int) -> float:
        """Predicted time of one collective moving ``nbytes`` (see the module's convention)."""
        pts = self.points
        if len(pts) >= 2 and pts[0][0] <= nbytes <= pts[-1][0]:
            i = bisect.bisect_left([s for s, _ in pts], nbytes)
            if pts[i][0] == nbytes:
                return pts[i][1]
            (s0, t0), (s1, t1) = pts[i - 1], pts[i]
            w = math.log(nbytes / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
        if len(pts) >= 2 and nbytes > pts[-1][0]:
            return pts[-1][1] + self.beta_s_per_byte * (nbytes - pts[-1][0])
        return self.alpha_s + self.beta_s_per_byte * nbytes


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One kind of accelerator (or CPU socket share)."""

    kind: str
    memory_bytes: int
    # dtype name ("float32", "tfloat32", "bfloat16", "float16") -> dense peak FLOP/s
    peak_flops: dict[str, float] = field(hash=False)
    memory_bandwidth_bytes_s: float
    # fixed costs (None: the compute efficiency's defaults): seconds per kernel launch, and per
    # layer call in each direction (Python, autograd, allocator, launch gaps between kernels)
    kernel_overhead_s: float | None = None
    layer_overhead_s: float | None = None
    # memory held beside the tensors: the runtime context (CUDA context, cuBLAS/cuDNN
    # workspaces), buffers per communicator (NCCL), and the caching allocator's reserve at the
    # peak as a factor on the tensor peak (reserved / allocated)
    context_bytes: int = 0
    comm_buffer_bytes: int = 0
    allocator_factor: float = 1.0
    # the host tier (CPU offload, :mod:`galvatron_fx.cost_models.offload`): the host memory one
    # device's process may use (its node's share; None: none beside the device — a CPU "device"
    # is host memory already, so nothing moves off it), the host link's bandwidth in each
    # direction per device (PCIe, C2C; None: PCIe 4.0 x16's achievable figure) and the AdamW
    # parameter updates per second of one device's share of the host's cores (None: an estimate)
    host_memory_bytes: int | None = None
    host_link_bytes_s: float | None = None
    host_optimizer_params_s: float | None = None

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (a torch dtype name such as ``"bfloat16"``)."""
        name = str(dtype).removeprefix("torch.")
        if name in self.peak_flops:
            return self.peak_flops[name]
        if "float32" in self.peak_flops:
            return self.peak_flops["float32"]
        raise ConfigError(
            f"device {self.kind!r} has no peak FLOP/s for {name!r} (known: {sorted(self.peak_flops)}); "
            "add it to the cluster's device_specs"
        )


@dataclass(frozen=True, kw_only=True)
class LinkTier:
    """A class of links with a default latency/bandwidth and fitted collective costs."""

    name: TierName
    latency_s: float
    bandwidth_bytes_s: float  # per-device bus bandwidth (nccl-tests "busbw")
    # collective -> group size -> fit
    fits: dict[Collective, dict[int, CollectiveFit]] = field(default_factory=dict, hash=False)

    def fit(self, collective: Collective | str, group_size: int) -> CollectiveFit | None:
        """The fitted cost of ``collective`` on ``group_size`` ranks, or None if not profiled."""
        return self.fits.get(Collective(collective), {}).get(group_size)



# -------------------------------------------------------------------- JSON (checked by cluster.checks)
def tier_to_dict(t: LinkTier) -> dict[str, Any]:
    return {
        "name": str(t.name),
        "latency_s": t.latency_s,
        "bandwidth_bytes_s": t.bandwidth_bytes_s,
        "fits": {
            str(c): {str(n): fit_to_dict(f) for n, f in sorted(per.items())}
            for c, per in sorted(t.fits.items())
        },
    }


def fit_to_dict(f: CollectiveFit) -> dict[str, Any]:
    d: dict[str, Any] = {"alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte}
    if f.points:
        d["points"] = [[s, t] for s, t in f.points]
    return d


def tier_from_dict(d: Any, where: str, expect: TierName) -> LinkTier:
    check_keys(d, where, {"latency_s", "bandwidth_bytes_s"}, {"name", "fits"})
    if d.get("name", str(expect)) != str(expect):
        raise ConfigError(f"{where}.name: expected {str(expect)!r}, got {d['name']!r}")
    fits: dict[Collective, dict[int, CollectiveFit]] = {}
    raw = d.get("fits", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.fits: expected an object")
    for cname, per in raw.items():
        try:
            coll = Collective(cname)
        except ValueError:
            raise ConfigError(f"{where}.fits: unknown collective {cname!r}; known: {[str(c) for c in Collective]}") from None
        if not isinstance(per, Mapping):
            raise ConfigError(f"{where}.fits[{cname!r}]: expected an object keyed by group size")
        for n_s, f in per.items():
            fw = f"{where}.fits[{cname!r}][{n_s!r}]"
            try:
                n = int(n_s)
            except ValueError:
                raise ConfigError(f"{fw}: group size must be an integer") from None
            check_keys(f, fw, {"alpha_s", "beta_s_per_byte"}, {"points"})
            points = f.get("points", [])
            ok = isinstance(points, list) and all(
                isinstance(q, list) and len(q) == 2 and isinstance(q[0], int) and q[0] > 0
                and isinstance(q[1], (int, float)) and q[1] > 0
                for q in points
            )
            if not ok or [q[0] for q in points] != sorted({q[0] for q in points}):
                raise ConfigError(f"{fw}.points: expected [[nbytes > 0, time_s > 0], ...] with increasing nbytes")
            fits.setdefault(coll, {})[n] = CollectiveFit(
                alpha_s=float(read_number(f, "alpha_s", fw, positive=False, rng=limits.LATENCY_S)),
                beta_s_per_byte=float(read_number(f, "beta_s_per_byte", fw, positive=False, rng=limits.SECONDS_PER_BYTE)),
                points=tuple((int(a), float(b)) for a, b in points),
            )
    return LinkTier(
        name=expect,
        latency_s=float(read_number(d, "latency_s", where, positive=False, rng=limits.LATENCY_S)),
        bandwidth_bytes_s=float(read_number(d, "bandwidth_bytes_s", where, rng=limits.BYTES_S)),
        fits=fits,
    )


HOST_KEYS = ("host_memory_bytes", "host_link_bytes_s", "host_optimizer_params_s")
DEVICE_OPTIONAL = ("kernel_overhead_s", "layer_overhead_s", "context_bytes", "comm_buffer_bytes", "allocator_factor",
                    *HOST_KEYS)


def device_to_dict(spec: DeviceSpec) -> dict[str, Any]:
    """A device spec's JSON form; the host tier's fields only when known (so clusters without
    one keep their JSON and hash)."""
    d = dataclasses.asdict(spec)
    return {k: v for k, v in d.items() if not (k in HOST_KEYS and v is None)}


def device_optional(s: Mapping[str, Any], sw: str) -> dict[str, Any]:
    """A device spec's optional fixed costs and memory terms, checked."""
    out: dict[str, Any] = {}
    for key in ("kernel_overhead_s", "layer_overhead_s"):
        if s.get(key) is not None:
            out[key] = float(read_number(s, key, sw, positive=False, rng=limits.LATENCY_S))
    for key in ("context_bytes", "comm_buffer_bytes"):
        if key in s:
            out[key] = int(read_number(s, key, sw, positive=False, integer=True, rng=limits.BYTES))
    if "allocator_factor" in s:
        out["allocator_factor"] = float(read_number(s, "allocator_factor", sw, rng=limits.FACTOR))
    if s.get("host_memory_bytes") is not None:
        out["host_memory_bytes"] = int(read_number(s, "host_memory_bytes", sw, positive=False, integer=True,
                                                   rng=limits.BYTES))
    for key in ("host_link_bytes_s", "host_optimizer_params_s"):
        if s.get(key) is not None:
            out[key] = float(read_number(s, key, sw, rng=limits.BYTES_S))
    return out


