"""The cluster a plan runs on (:class:`Cluster`: its nodes, device kinds and link tiers, made of
:mod:`galvatron_fx.cluster.records`), its JSON form, the presets and mixes of node kinds, and this
machine as a cluster of gloo CPU processes (:meth:`Cluster.local_cpu`: from a cached hardware
profile when one matches this machine's fingerprint, else conservative defaults,
:func:`default_local_cpu`).

The JSON form is strict: unknown keys, missing fields and negative or zero sizes raise
``ConfigError`` naming the field (``cluster.device_specs['A100-80GB'].memory_bytes``). Every
number of a cluster, however built, lies within the sane ranges of :mod:`galvatron_fx.cluster.limits`
(:mod:`galvatron_fx.cluster.checks` lists them). This host's facts, fingerprints and the cache
directory are :mod:`galvatron_fx.cluster.host`'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import galvatron_fx.cluster.limits as limits
import galvatron_fx.cluster.presets as cluster_presets
from galvatron_fx.cluster.checks import check_keys, read_number, validate_cluster
from galvatron_fx.cluster.host import (
    cpu_model,
    default_cache_dir,
    fingerprint_fields,
    host_memory_bytes,
    local_fingerprint,
    make_fingerprint,
)
from galvatron_fx.cluster.records import (
    DEVICE_OPTIONAL,
    Collective,
    CollectiveFit,
    DeviceSpec,
    LinkTier,
    TierName,
    device_optional,
    device_to_dict,
    tier_from_dict,
    tier_to_dict,
)
from galvatron_fx.errors import ConfigError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


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
    # (:mod:`galvatron_fx.cluster.topology`; measured by the profiler's slow-link detection)
    slow_links: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self) -> None:
        from galvatron_fx.cluster.topology import check_slow_links

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
        from galvatron_fx.cluster.topology import link_factor, slowed

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
            "device_specs": {k: device_to_dict(v) for k, v in self.device_specs.items()},
            "node_kinds": list(self.node_kinds),
            "intra_node": tier_to_dict(self.intra_node),
            "inter_node": tier_to_dict(self.inter_node),
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
    """Preset ``name`` (:mod:`galvatron_fx.cluster.presets`' figures) on ``nodes`` 8-GPU nodes."""
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
_CLUSTER_REQUIRED = {"name", "num_nodes", "devices_per_node", "device_specs", "node_kinds", "intra_node", "inter_node"}
_CLUSTER_OPTIONAL = {"schema_version", "overlap_slowdown", "backend", "all_to_all_via_all_gather", "allow_tf32",
                     "fingerprint", "slow_links"}


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
        check_keys(s, sw, {"memory_bytes", "peak_flops", "memory_bandwidth_bytes_s"}, {"kind", *DEVICE_OPTIONAL})
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
            **device_optional(s, sw),
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
        intra_node=tier_from_dict(d["intra_node"], f"{w}.intra_node", TierName.INTRA_NODE),
        inter_node=tier_from_dict(d["inter_node"], f"{w}.inter_node", TierName.INTER_NODE),
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


# -------------------------------------------------------------------- this machine
def local_cpu(world_size: int | None = None, *, nodes: int = 1, devices_per_node: int | None = None,
              cache_dir: str | os.PathLike | None = None) -> Cluster:
    """``Cluster.local_cpu`` (see its documentation)."""
    if nodes < 1:
        raise ConfigError(f"nodes must be >= 1, got {nodes}")
    if world_size is None:
        if devices_per_node is None:
            raise ConfigError("local_cpu needs world_size, or nodes= and devices_per_node=")
        world_size = nodes * devices_per_node
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    limits.DEGREE.check(world_size, "world_size")
    if world_size % nodes or (devices_per_node is not None and devices_per_node * nodes != world_size):
        raise ConfigError(f"local_cpu: {world_size} processes do not split into {nodes} nodes"
                          + (f" of {devices_per_node}" if devices_per_node is not None else "")
                          + "; pass nodes= and devices_per_node= whose product is the world size")
    one = _one_node(world_size, cache_dir)
    if one.num_nodes == nodes:
        return one  # a profile of this layout (torchrun agents as nodes): its per-node device kinds
    if one.num_nodes > 1:  # a profile of another layout: its first node's device for every node
        kind = one.node_kinds[0]
        one = dataclasses.replace(one, num_nodes=1, devices_per_node=world_size, node_kinds=(kind,),
                                  device_specs={kind: one.device_specs[kind]})
    if nodes == 1:
        return one
    return dataclasses.replace(one, name=f"{one.name}-{nodes}x{world_size // nodes}", num_nodes=nodes,
                               devices_per_node=world_size // nodes, node_kinds=one.node_kinds * nodes,
                               inter_node=dataclasses.replace(one.intra_node, name=TierName.INTER_NODE))


def cached_profile(world_size: int, cache_dir=None) -> tuple[Cluster | None, str]:
    """This machine's cached hardware profile for ``world_size`` gloo processes, when it can be
    trusted, else ``(None, why not)``: the file is read bounded and parsed depth-capped, its
    recorded machine fields (CPU model, cores, torch, backend, world size) must be this machine's
    and hash to its fingerprint, and its cluster must be of this fingerprint and world size. A
    file whose name matches but whose contents describe another machine is not used."""
    fp = local_fingerprint(world_size)
    path = Path(default_cache_dir(cache_dir)) / f"hardware-{fp}.json"
    if not path.exists():
        return None, f"no cached profile for fingerprint {fp}"
    try:
        data = limits.read_json(path, what="hardware profile")
        here = fingerprint_fields(num_hosts=1, device_model=cpu_model(), devices_per_host=os.cpu_count() or 1,
                                  backend="gloo", world_size=world_size)
        fields = data.get("fingerprint_fields") if isinstance(data, dict) else None
        if not isinstance(fields, dict) or make_fingerprint(fields) != data.get("fingerprint"):
            return None, f"{path} does not record the machine it measured (or was edited)"
        diff = sorted(k for k in here if fields.get(k) != here[k])
        if diff:
            shown = ", ".join(f"{k} {fields.get(k)!r} (here {here[k]!r})" for k in diff)
            return None, f"{path} was measured on another machine: {shown}"
        cluster = _cluster_from_dict(data["cluster"])
    except (ConfigError, KeyError, TypeError, AttributeError, OSError) as e:
        return None, f"{path} cannot be read ({e})"
    if cluster.fingerprint != fp or cluster.world_size != world_size:
        return None, f"{path} holds a cluster of another machine or world size"
    return cluster, f"cached hardware profile {path}"


def _one_node(world_size: int, cache_dir) -> Cluster:
    cluster, why = cached_profile(world_size, cache_dir)
    if cluster is not None:
        logger.info("local_cpu: using %s", why)
        return cluster
    if why.startswith("no cached profile"):
        logger.info("local_cpu: %s; using conservative defaults (run `torchrun --nproc-per-node %d -m "
                    "galvatron_fx.cli profile` to measure)", why, world_size)
    else:
        logger.warning("local_cpu: not using the cached profile: %s; using conservative defaults (measure again: "
                       "torchrun --nproc-per-node %d -m galvatron_fx.cli profile)", why, world_size)
    return default_local_cpu(world_size, fingerprint=local_fingerprint(world_size))


def default_local_cpu(world_size: int, *, fingerprint: str | None = None) -> Cluster:
    """Conservative defaults for gloo CPU processes on one host (no profile)."""
    spec = DeviceSpec(
        kind=f"cpu:{cpu_model()}"[:80],
        memory_bytes=host_memory_bytes() // max(world_size, 1),
        # a share of a few cores doing fp32 GEMM; bf16 on CPU is usually slower
        peak_flops={"float32": 20e9, "bfloat16": 10e9, "float16": 5e9},
        memory_bandwidth_bytes_s=10e9,
    )
    return Cluster(
        name=f"local-cpu-{world_size}",
        num_nodes=1,
        devices_per_node=world_size,
        device_specs={spec.kind: spec},
        node_kinds=(spec.kind,),
        intra_node=LinkTier(name=TierName.INTRA_NODE, latency_s=50e-6, bandwidth_bytes_s=1e9),
        inter_node=LinkTier(name=TierName.INTER_NODE, latency_s=100e-6, bandwidth_bytes_s=1.25e9),
        overlap_slowdown=1.5,
        backend="gloo",
        all_to_all_via_all_gather=True,
        fingerprint=fingerprint,
    )
