"""What the planner knows about the machines: devices, link tiers and fitted collective costs.

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
number of a cluster, however built, lies within the sane ranges of :mod:`galvatron_fx.limits`
(:mod:`galvatron_fx.cluster_checks` lists them). This host's facts, fingerprints and the cache
directory are :mod:`galvatron_fx.host`'s.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from galvatron_fx import cluster_presets, limits
from galvatron_fx.cluster_checks import check_keys, read_number, validate_cluster
from galvatron_fx.errors import ConfigError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
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


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes × devices per node, device kinds, link tiers and overlap slowdown.

    Ranks are numbered node-major: rank ``r`` lives on node ``r // devices_per_node``.
    ``node_kinds[i]`` names the ``DeviceSpec`` of node ``i`` (nodes may differ).
    """

    name: str
    num_nodes: int
    devices_per_node: int
    device_specs: dict[str, DeviceSpec] = field(hash=False)
    node_kinds: tuple[str, ...]
    intra_node: LinkTier
    inter_node: LinkTier
    overlap_slowdown: float = 1.0
    backend: str = "nccl"
    # DTensor redistributes Shard(i)->Shard(j) with all-gather + chunk on CPU meshes.
    all_to_all_via_all_gather: bool = False
    # fp32 matmuls run on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32, as NGC
    # containers set it): priced at the device's "tfloat32" peak
    allow_tf32: bool = False
    fingerprint: str | None = None
    schema_version: int = SCHEMA_VERSION
    # node pairs whose link carries only a share of the inter-node bandwidth: (a, b, factor)
    # (:mod:`galvatron_fx.topology`; measured by the profiler's slow-link detection)
    slow_links: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self) -> None:
        from galvatron_fx.topology import check_slow_links

        validate_cluster(self)
        object.__setattr__(self, "slow_links", check_slow_links(self.slow_links, self.num_nodes))

    # ---------------------------------------------------------------- topology helpers
    @property
    def world_size(self) -> int:
        """Total number of devices (ranks)."""
        return self.num_nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        """Index of the node holding ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside the cluster (world size {self.world_size})")
        return rank // self.devices_per_node

    def device(self, rank: int) -> DeviceSpec:
        """The device spec of ``rank``."""
        return self.device_specs[self.node_kinds[self.node_of(rank)]]

    def memory_bytes(self, rank: int) -> int:
        """Device memory of ``rank`` in bytes."""
        return self.device(rank).memory_bytes

    def min_memory_bytes(self) -> int:
        """Smallest device memory in the cluster (what a uniform plan must fit in)."""
        return min(self.device_specs[k].memory_bytes for k in set(self.node_kinds))

    def tier_of(self, ranks: Iterable[int]) -> LinkTier:
        """The slowest tier a group of ranks spans (a slow link between its nodes slows it)."""
        from galvatron_fx.topology import link_factor, slowed

        nodes = {self.node_of(r) for r in ranks}
        return self.intra_node if len(nodes) <= 1 else slowed(self.inter_node, link_factor(self, nodes))

    def tier(self, name: TierName | str) -> LinkTier:
        """A tier by name."""
        return self.intra_node if TierName(name) is TierName.INTRA_NODE else self.inter_node

    def describe_source(self) -> str:
        """Where this cluster's figures come from, in a sentence: a measured profile (its links
        carry fitted collective times), a preset's datasheet figures, or this machine's
        conservative CPU defaults, with what to run to measure."""
        measured = any(t.fits for t in (self.intra_node, self.inter_node))
        if measured:
            return f"measured hardware profile {self.name!r}" + (f" (fingerprint {self.fingerprint})"
                                                                 if self.fingerprint else "")
        how = f"torchrun --nproc-per-node {self.devices_per_node} -m galvatron_fx.cli profile"
        if self.fingerprint:  # this host's processes, as one node or several: one host's profile
            how = f"torchrun --nproc-per-node {self.world_size} -m galvatron_fx.cli profile"
            return f"no hardware profile for this machine: conservative CPU defaults (measure: {how})"
        return f"{self.name!r}: datasheet figures, not measured (measure the real machine: {how})"

    @property
    def is_heterogeneous(self) -> bool:
        """True when nodes hold different device kinds."""
        return len(set(self.node_kinds)) > 1

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (the inverse of ``from_dict``)."""
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "num_nodes": self.num_nodes,
            "devices_per_node": self.devices_per_node,
            "device_specs": {k: _device_to_dict(v) for k, v in self.device_specs.items()},
            "node_kinds": list(self.node_kinds),
            "intra_node": _tier_to_dict(self.intra_node),
            "inter_node": _tier_to_dict(self.inter_node),
            "overlap_slowdown": self.overlap_slowdown,
            "backend": self.backend,
            "all_to_all_via_all_gather": self.all_to_all_via_all_gather,
            "allow_tf32": self.allow_tf32,
            "fingerprint": self.fingerprint,
            **({"slow_links": [list(x) for x in self.slow_links]} if self.slow_links else {}),
        }

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cluster:
        """Build from the JSON form, checking every field."""
        return _cluster_from_dict(data)

    @classmethod
    def from_json(cls, path_or_str: str | os.PathLike) -> Cluster:
        """Load from a JSON file path or a JSON string.

        A hardware-profile file (``galvatron-fx profile --out``) is accepted too: its ``cluster``
        section is used, after checking its fingerprint against this machine only when loaded
        through ``galvatron_fx.profiler.hardware_profile.load_profile``.
        """
        text, source = read_json_arg(path_or_str, "cluster")
        data = limits.load_json(text, source, hint="check the file or regenerate it")
        if isinstance(data, dict) and "measurements" in data and "cluster" in data:
            data = data["cluster"]
        return _cluster_from_dict(data)

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_spec(cls, spec: str | os.PathLike | None, nodes: int | None = None) -> Cluster:
        """A preset name (``nodes`` of them, default 1) or a cluster JSON file (which describes its
        own nodes: ``nodes`` is then an error rather than silently ignored). ``None`` is
        ``dgx-a100-80g``. The command line's ``--cluster``/``--nodes``."""
        spec = "dgx-a100-80g" if spec is None else str(spec)
        if spec.lower() in cluster_presets.CLUSTERS:
            return cls.preset(spec, nodes=1 if nodes is None else nodes)
        if spec.endswith(".json") or Path(spec).is_file():
            if nodes is not None:
                raise ConfigError(f"--nodes {nodes} next to the cluster file {spec}: a cluster JSON describes its own "
                                  "nodes; drop --nodes or edit the file")
            return cls.from_json(spec)
        raise ConfigError(f"--cluster {spec!r}: neither a preset ({', '.join(PRESET_NAMES)}) nor a cluster JSON file")

    @classmethod
    def preset(cls, name: str, nodes: int = 1) -> Cluster:
        """A cluster of ``nodes`` identical nodes from datasheet figures.

        Names: ``dgx-a100-80g``, ``dgx-h100``, ``h200``, ``rtx4090-pcie``.
        """
        key = name.lower()
        if key not in cluster_presets.CLUSTERS:
            raise ConfigError(f"unknown cluster preset {name!r}; choose one of {list(PRESET_NAMES)}")
        if nodes < 1:
            raise ConfigError(f"nodes must be >= 1, got {nodes}")
        limits.DEGREE.check(nodes, "nodes")
        return _preset(key, nodes)

    @classmethod
    def local_cpu(cls, world_size: int | None = None, *, nodes: int = 1, devices_per_node: int | None = None,
                  cache_dir: str | os.PathLike | None = None) -> Cluster:
        """This machine as a gloo "cluster" of ``world_size`` CPU processes on one node, or on
        ``nodes`` nodes of ``devices_per_node`` processes each (``world_size`` is then their
        product): several torchrun agents on this host acting as nodes, or a description to plan
        for. Links between such nodes are this host's own, so the inter-node tier takes the
        intra-node figures; the plan still keeps tensor parallelism within a node and shows
        which groups cross one.

        If a cached hardware profile (``galvatron-fx profile``) with this machine's fingerprint for
        ``world_size`` exists in ``cache_dir`` (default ``$GFX_CACHE_DIR`` or
        ``~/.cache/galvatron_fx``), its measured fits, compute rates and overlap slowdown are used.
        Otherwise conservative defaults are used (shared-memory gloo: 50 µs latency, 1 GB/s bus
        bandwidth, 20 GFLOP/s per process, slowdown 1.5) and an INFO log line says so.
        """
        from galvatron_fx.local_cluster import local_cpu

        return local_cpu(world_size, nodes=nodes, devices_per_node=devices_per_node, cache_dir=cache_dir)

    def with_fits(
        self,
        tier: TierName | str,
        fits: Mapping[Collective, Mapping[int, CollectiveFit]],
        **changes: Any,
    ) -> Cluster:
        """A copy with ``fits`` merged into ``tier`` (and other fields replaced by ``changes``)."""
        old = self.tier(tier)
        merged = {c: dict(v) for c, v in old.fits.items()}
        for c, per_size in fits.items():
            merged.setdefault(Collective(c), {}).update(per_size)
        new_tier = dataclasses.replace(old, fits=merged)
        key = "intra_node" if new_tier.name is TierName.INTRA_NODE else "inter_node"
        return dataclasses.replace(self, **cast(dict[str, Any], {key: new_tier}), **changes)


def read_json_arg(path_or_str: str | os.PathLike, what: str) -> tuple[str, str]:
    """``(text, source)`` of an argument that is a JSON file's path or JSON text itself: text
    when it starts like a JSON object or list, or when no file of that name exists and it parses
    as JSON; else the file's contents (``ConfigError`` when it is missing or unreadable)."""
    text = str(path_or_str)
    if isinstance(path_or_str, str) and text.lstrip()[:1] in ("{", "["):
        return text, f"{what} JSON"
    p = Path(path_or_str)
    try:
        return limits.read_text(p, what=f"{what} file"), f"{what} file {str(p)!r}"
    except FileNotFoundError:
        if isinstance(path_or_str, str):
            try:
                json.loads(text)
                return text, f"{what} JSON"
            except (ValueError, RecursionError):
                pass
        raise ConfigError(f"{what} file {str(p)!r} does not exist; pass a path or a JSON string") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} file {str(p)!r} cannot be read: {e}") from None


# -------------------------------------------------------------------- presets
def _preset(name: str, nodes: int) -> Cluster:
    """Preset ``name`` (:mod:`galvatron_fx.cluster_presets`' figures) on ``nodes`` 8-GPU nodes."""
    c = cluster_presets.CLUSTERS[name]
    spec = DeviceSpec(kind=c["device"], **cluster_presets.DEVICES[c["device"]])
    (intra_lat, intra_bw), (inter_lat, inter_bw) = c["intra"], c["inter"]
    return Cluster(
        name=name if nodes == 1 else f"{name}x{nodes}",
        num_nodes=nodes,
        devices_per_node=8,
        device_specs={spec.kind: spec},
        node_kinds=(spec.kind,) * nodes,
        intra_node=LinkTier(name=TierName.INTRA_NODE, latency_s=intra_lat, bandwidth_bytes_s=intra_bw),
        inter_node=LinkTier(name=TierName.INTER_NODE, latency_s=inter_lat, bandwidth_bytes_s=inter_bw),
        overlap_slowdown=c["overlap_slowdown"],
        backend="nccl",
        allow_tf32=True,
    )


PRESET_NAMES: tuple[str, ...] = tuple(sorted(cluster_presets.CLUSTERS))


def heterogeneous(name: str, nodes: list[Cluster]) -> Cluster:
    """Join single-kind clusters (same devices per node) into one cluster, nodes in order.

    Links are taken from the first cluster, except the inter-node tier, which takes the slowest
    inter-node bandwidth among them.
    """
    if not nodes:
        raise ConfigError("heterogeneous() needs at least one cluster")
    dpn = {c.devices_per_node for c in nodes}
    if len(dpn) != 1:
        raise ConfigError(f"heterogeneous() needs equal devices per node, got {sorted(dpn)}")
    specs: dict[str, DeviceSpec] = {}
    kinds: list[str] = []
    for c in nodes:
        specs.update(c.device_specs)
        kinds.extend(c.node_kinds)
    slowest = min((c.inter_node for c in nodes), key=lambda t: t.bandwidth_bytes_s)
    return dataclasses.replace(
        nodes[0],
        name=name,
        num_nodes=len(kinds),
        device_specs=specs,
        node_kinds=tuple(kinds),
        inter_node=slowest,
        fingerprint=None,
    )


# -------------------------------------------------------------------- JSON (checked by cluster_checks)
def _tier_to_dict(t: LinkTier) -> dict[str, Any]:
    return {
        "name": str(t.name),
        "latency_s": t.latency_s,
        "bandwidth_bytes_s": t.bandwidth_bytes_s,
        "fits": {
            str(c): {str(n): _fit_to_dict(f) for n, f in sorted(per.items())}
            for c, per in sorted(t.fits.items())
        },
    }


def _fit_to_dict(f: CollectiveFit) -> dict[str, Any]:
    d: dict[str, Any] = {"alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte}
    if f.points:
        d["points"] = [[s, t] for s, t in f.points]
    return d


def _tier_from_dict(d: Any, where: str, expect: TierName) -> LinkTier:
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


_CLUSTER_REQUIRED = {"name", "num_nodes", "devices_per_node", "device_specs", "node_kinds", "intra_node", "inter_node"}
_CLUSTER_OPTIONAL = {"schema_version", "overlap_slowdown", "backend", "all_to_all_via_all_gather", "allow_tf32",
                     "fingerprint", "slow_links"}


_HOST_KEYS = ("host_memory_bytes", "host_link_bytes_s", "host_optimizer_params_s")
_DEVICE_OPTIONAL = ("kernel_overhead_s", "layer_overhead_s", "context_bytes", "comm_buffer_bytes", "allocator_factor",
                    *_HOST_KEYS)


def _device_to_dict(spec: DeviceSpec) -> dict[str, Any]:
    """A device spec's JSON form; the host tier's fields only when known (so clusters without
    one keep their JSON and hash)."""
    d = dataclasses.asdict(spec)
    return {k: v for k, v in d.items() if not (k in _HOST_KEYS and v is None)}


def _device_optional(s: Mapping[str, Any], sw: str) -> dict[str, Any]:
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


def _cluster_from_dict(d: Any) -> Cluster:
    w = "cluster"
    check_keys(d, w, _CLUSTER_REQUIRED, _CLUSTER_OPTIONAL)
    version = d.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ConfigError(f"{w}.schema_version: this galvatron_fx reads version {SCHEMA_VERSION}, got {version!r}")
    if not isinstance(d["name"], str):
        raise ConfigError(f"{w}.name: expected a string")
    num_nodes = read_number(d, "num_nodes", w, integer=True, rng=limits.DEGREE)
    dpn = read_number(d, "devices_per_node", w, integer=True, rng=limits.DEGREE)
    specs_raw = d["device_specs"]
    if not isinstance(specs_raw, Mapping) or not specs_raw:
        raise ConfigError(f"{w}.device_specs: expected a non-empty object of device kind -> spec")
    specs: dict[str, DeviceSpec] = {}
    for kind, s in specs_raw.items():
        sw = f"{w}.device_specs[{kind!r}]"
        check_keys(s, sw, {"memory_bytes", "peak_flops", "memory_bandwidth_bytes_s"}, {"kind", *_DEVICE_OPTIONAL})
        if s.get("kind", kind) != kind:
            raise ConfigError(f"{sw}.kind: {s['kind']!r} differs from its key {kind!r}")
        pf = s["peak_flops"]
        if not isinstance(pf, Mapping) or not pf:
            raise ConfigError(f"{sw}.peak_flops: expected a non-empty object of dtype -> FLOP/s")
        specs[kind] = DeviceSpec(
            kind=kind,
            memory_bytes=int(read_number(s, "memory_bytes", sw, integer=True, rng=limits.DEVICE_MEMORY)),
            peak_flops={str(k): float(read_number(pf, k, f"{sw}.peak_flops", rng=limits.FLOPS)) for k in pf},
            memory_bandwidth_bytes_s=float(read_number(s, "memory_bandwidth_bytes_s", sw, rng=limits.BYTES_S)),
            **_device_optional(s, sw),
        )
    kinds = d["node_kinds"]
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"{w}.node_kinds: expected a list of device kind names")
    slowdown = float(read_number(d, "overlap_slowdown", w)) if "overlap_slowdown" in d else 1.0
    fp = d.get("fingerprint")
    if fp is not None and not isinstance(fp, str):
        raise ConfigError(f"{w}.fingerprint: expected a string or null")
    via = d.get("all_to_all_via_all_gather", False)
    if not isinstance(via, bool):
        raise ConfigError(f"{w}.all_to_all_via_all_gather: expected true or false")
    tf32 = d.get("allow_tf32", False)
    if not isinstance(tf32, bool):
        raise ConfigError(f"{w}.allow_tf32: expected true or false")
    return Cluster(
        name=d["name"],
        num_nodes=num_nodes,
        devices_per_node=dpn,
        device_specs=specs,
        node_kinds=tuple(kinds),
        intra_node=_tier_from_dict(d["intra_node"], f"{w}.intra_node", TierName.INTRA_NODE),
        inter_node=_tier_from_dict(d["inter_node"], f"{w}.inter_node", TierName.INTER_NODE),
        overlap_slowdown=slowdown,
        backend=str(d.get("backend", "nccl")),
        all_to_all_via_all_gather=via,
        allow_tf32=tf32,
        fingerprint=fp,
        schema_version=version,
        slow_links=_slow_links_from(d.get("slow_links", []), w),
    )


def _slow_links_from(raw: Any, w: str) -> tuple:
    if not isinstance(raw, list):
        raise ConfigError(f"{w}.slow_links: expected a list of [node a, node b, factor]")
    return tuple(tuple(x) if isinstance(x, list) else x for x in raw)
