"""The hardware profile: its record, its JSON cache, and the fits made from its measurements.

Contract: :class:`HardwareProfile` is what one run of
:func:`galvatron_fx.profiler.hardware.profile_hardware` measured plus the fitted ``Cluster``;
:func:`load_profile` reads one back (refusing one measured on other hardware), :func:`cache_path`
says where a fingerprint's profile is cached. :func:`fit_rows` and :func:`build_cluster` turn
measurement rows into per (tier, collective, group size) fits and a ``Cluster``;
:func:`detect_slow_links` reports rank pairs and nodes whose point-to-point bandwidth is low,
:func:`slow_node_links` the node pairs the cluster then records as slow links.
Nothing here runs a collective.

Terms
-----
- *row*: one measured time, ``{collective, group_size, arrangement, tier, nbytes, time_s}``.
- *fit*: ``CollectiveFit(alpha_s, beta_s_per_byte, points)`` (see :mod:`galvatron_fx.cluster.spec`).
- *fingerprint fields*: the facts a profile depends on (:func:`galvatron_fx.cluster.host.fingerprint_fields`).

Algorithm
---------
Fits minimise the *relative* error ``sum(((alpha + beta*s) - t) / t)^2`` with ``alpha, beta >= 0``
(non-negative least squares on rows scaled by ``1/t``), so small messages weigh as much as 64 MiB
ones; all arrangements of one (tier, collective, group size) are pooled. The kept points are the
median time per size, made non-decreasing in size by pooling adjacent violators (geometric means).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from galvatron_fx.cluster import Cluster, Collective, CollectiveFit, DeviceSpec, LinkTier, TierName
from galvatron_fx.cluster.host import (
    cpu_model,
    default_cache_dir,
    fingerprint_fields,
    host_memory_bytes,
    make_fingerprint,
)
from galvatron_fx.cluster.limits import load_json, read_text
from galvatron_fx.cost_models.communication import bandwidth_factor
from galvatron_fx.errors import ConfigError

__all__ = ["PROFILE_SCHEMA_VERSION", "SLOW_NODE_RATIO", "HardwareProfile", "NodeDevice", "build_cluster", "cache_path",
           "current_fingerprint_fields", "detect_slow_links", "fit_alpha_beta", "fit_rows", "load_profile",
           "matmul_peaks", "node_kinds", "node_rate", "profile_from_dict", "slow_node_links"]

PROFILE_SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """Everything one profiling run measured, plus the fitted ``Cluster``."""

    fingerprint: str
    fingerprint_fields: dict[str, Any]
    cluster: Cluster
    hosts: list[str]  # hostname of every rank
    measurements: list[dict[str, Any]]  # collective, group_size, arrangement, tier, nbytes, time_s
    compute: list[dict[str, Any]] = field(default_factory=list)  # op, size, dtype, time_s, flops_s
    overlap: dict[str, float] = field(default_factory=dict)
    p2p_bandwidth: list[dict[str, Any]] = field(default_factory=list)  # src, dst, bytes_s
    slow_links: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    schema_version: int = PROFILE_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["cluster"] = self.cluster.to_dict()
        return d

    def save(self, path: str | os.PathLike) -> Path:
        """Write JSON to ``path`` (atomically) and return it."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=p.parent, delete=False, suffix=".tmp") as f:
            json.dump(self.to_dict(), f, indent=1, sort_keys=True)
        os.replace(f.name, p)
        return p


def cache_path(fingerprint: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the profile of ``fingerprint`` is cached."""
    return default_cache_dir(cache_dir) / f"hardware-{fingerprint}.json"


def current_fingerprint_fields(*, backend: str, world_size: int, num_hosts: int = 1) -> dict[str, Any]:
    """The fingerprint facts of this host (for ``backend`` and ``world_size``)."""
    import torch

    if backend == "nccl" and torch.cuda.is_available():
        model, count = torch.cuda.get_device_name(0), torch.cuda.device_count()
    else:
        model, count = cpu_model(), os.cpu_count() or 1
    return fingerprint_fields(
        num_hosts=num_hosts, device_model=model, devices_per_host=count, backend=backend, world_size=world_size
    )


def load_profile(path: str | os.PathLike, *, check_fingerprint: bool = True) -> HardwareProfile:
    """Load a profile JSON; with ``check_fingerprint`` refuse one measured on other hardware.

    The recorded host count, backend and world size are taken from the file; device model,
    device count and torch version are compared with this host. Raises ``ConfigError`` naming
    the differing facts.
    """
    p = Path(path)
    try:
        text = read_text(p, what="hardware profile")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read hardware profile {str(p)!r}: {e}; re-run `galvatron-fx profile`") from e
    d = load_json(text, f"hardware profile {str(p)!r}", hint="re-run `galvatron-fx profile`")
    return profile_from_dict(d, source=str(p), check_fingerprint=check_fingerprint)


def profile_from_dict(d: Any, *, source: str, check_fingerprint: bool) -> HardwareProfile:
    """A profile from its JSON form (``source`` names it in errors), checked as :func:`load_profile` says."""
    p = source
    need = {"fingerprint", "fingerprint_fields", "cluster", "hosts", "measurements"}
    if not isinstance(d, dict) or need - set(d):
        raise ConfigError(f"{p!r} is not a hardware profile (missing {sorted(need - set(d or {}))})")
    fields = d["fingerprint_fields"]
    if make_fingerprint(fields) != d["fingerprint"]:
        raise ConfigError(f"{p!r}: fingerprint does not match its recorded fields (edited by hand?); re-profile")
    if check_fingerprint:
        here = current_fingerprint_fields(
            backend=fields.get("backend", "gloo"),
            world_size=fields.get("world_size", 1),
            num_hosts=fields.get("num_hosts", 1),
        )
        diff = {k: (fields.get(k), v) for k, v in here.items() if fields.get(k) != v}
        if diff:
            shown = ", ".join(f"{k}: profile {a!r} vs here {b!r}" for k, (a, b) in sorted(diff.items()))
            raise ConfigError(
                f"hardware profile {p!r} was measured on different hardware ({shown}); "
                "re-run `galvatron-fx profile` on this machine, or pass check_fingerprint=False to use it anyway"
            )
    known = {f.name for f in dataclasses.fields(HardwareProfile)}
    kwargs = {k: v for k, v in d.items() if k in known}
    kwargs["cluster"] = Cluster.from_dict(d["cluster"])
    return HardwareProfile(**kwargs)


# ---------------------------------------------------------------------------- fitting
def fit_alpha_beta(nbytes: Sequence[float], times_s: Sequence[float], *, keep_points: bool = True) -> CollectiveFit:
    """``alpha + beta * nbytes`` minimising the squared *relative* error, with alpha, beta >= 0.

    With ``keep_points`` the measured points (fastest time per size) are kept for log-log
    interpolation inside the measured range (see ``CollectiveFit``).
    """
    from scipy.optimize import nnls

    s = np.asarray(nbytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if len(s) == 0 or np.any(t <= 0):
        raise ValueError("fit_alpha_beta needs at least one positive time")
    a = np.stack([1.0 / t, s / t], axis=1)
    coef, _ = nnls(a, np.ones_like(t))
    points: tuple[tuple[int, float], ...] = ()
    if keep_points:
        best: dict[int, list[float]] = {}
        for si, ti in zip(s, t):  # several arrangements of one size: keep the median
            best.setdefault(int(si), []).append(float(ti))
        sizes = sorted(best)
        smooth = _monotone([float(np.median(best[k])) for k in sizes], [len(best[k]) for k in sizes])
        points = tuple(zip(sizes, smooth))
    return CollectiveFit(alpha_s=float(coef[0]), beta_s_per_byte=float(coef[1]), points=points)


def _monotone(times: list[float], weights: list[int]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators, geometric means).

    Moving more bytes never takes less time, so a dip between sizes is scheduler noise in one
    of them; pooling the offending neighbours averages it out instead of interpolating it.
    """
    blocks: list[list[float]] = []  # [sum of w*log t, sum of w, count]
    for t, w in zip(times, weights):
        blocks.append([w * math.log(t), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            lw, ww, cnt = blocks.pop()
            blocks[-1][0] += lw
            blocks[-1][1] += ww
            blocks[-1][2] += cnt
    out: list[float] = []
    for lw, ww, cnt in blocks:
        out.extend([math.exp(lw / ww)] * int(cnt))
    return out


def fit_rows(rows: Iterable[Mapping[str, Any]]) -> dict[TierName, dict[Collective, dict[int, CollectiveFit]]]:
    """Fits per (tier, collective, group size) from measurement rows (all arrangements pooled)."""
    groups: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for r in rows:
        groups.setdefault((r["tier"], r["collective"], int(r["group_size"])), []).append((r["nbytes"], r["time_s"]))
    out: dict[TierName, dict[Collective, dict[int, CollectiveFit]]] = {}
    for (tier, coll, n), pts in sorted(groups.items()):
        s, t = zip(*pts)
        out.setdefault(TierName(tier), {}).setdefault(Collective(coll), {})[n] = fit_alpha_beta(s, t)
    return out


def slow_node_links(
    pair_bytes_s: Mapping[tuple[int, int], float],
    node_of: Callable[[int], int],
    *,
    threshold: float = 0.5,
) -> tuple[tuple[int, int, float], ...]:
    """Node pairs whose link is below ``threshold`` × the median inter-node pair, each as
    ``(a, b, factor)`` with ``factor`` its share of that median (``Cluster.slow_links``: the planner
    then keeps data-parallel groups off it, :mod:`galvatron_fx.cluster.topology`). A node pair's bandwidth
    is the median of its rank pairs'."""
    per_pair: dict[tuple[int, int], list[float]] = {}
    for (a, b), pair_bw in pair_bytes_s.items():
        na, nb = node_of(a), node_of(b)
        if na != nb:
            per_pair.setdefault((min(na, nb), max(na, nb)), []).append(pair_bw)
    if len(per_pair) < 2:
        return ()
    bw = {k: statistics.median(v) for k, v in per_pair.items()}
    med = statistics.median(bw.values())
    return tuple((a, b, max(1e-3, min(1.0, x / med))) for (a, b), x in sorted(bw.items()) if x < threshold * med)


def detect_slow_links(
    pair_bytes_s: Mapping[tuple[int, int], float],
    rank_names: Sequence[str],
    node_of: Callable[[int], int] | None = None,
    *,
    threshold: float = 0.5,
) -> list[str]:
    """Rank pairs (and nodes) whose p2p bandwidth is below ``threshold`` × the median.

    Pairs are compared with the median of pairs on the same tier (same node or not) so that a
    normal inter-node link is not reported as slow next to NVLink.
    """
    if not pair_bytes_s:
        return []
    node_of = node_of or (lambda r: 0)
    reports: list[str] = []
    by_tier: dict[bool, list[tuple[tuple[int, int], float]]] = {}
    for (a, b), bw in pair_bytes_s.items():
        by_tier.setdefault(node_of(a) == node_of(b), []).append(((a, b), bw))
    for same, items in sorted(by_tier.items()):
        med = statistics.median(bw for _, bw in items)
        for (a, b), bw in sorted(items):
            if bw < threshold * med:
                reports.append(
                    f"slow link {rank_names[a]} <-> {rank_names[b]}: {bw / 1e9:.3g} GB/s, "
                    f"median {'intra' if same else 'inter'}-node {med / 1e9:.3g} GB/s"
                )
    # a node whose inter-node links are all slow
    per_node: dict[int, list[float]] = {}
    for (a, b), bw in pair_bytes_s.items():
        if node_of(a) != node_of(b):
            per_node.setdefault(node_of(a), []).append(bw)
            per_node.setdefault(node_of(b), []).append(bw)
    if len(per_node) >= 3:
        node_bw = {n: statistics.median(v) for n, v in per_node.items()}
        med = statistics.median(node_bw.values())
        for n, bw in sorted(node_bw.items()):
            if bw < threshold * med:
                ranks = [r for r in range(len(rank_names)) if node_of(r) == n]
                host = rank_names[ranks[0]].split(":")[0] if ranks else str(n)
                reports.append(f"slow node {n} ({host}): inter-node {bw / 1e9:.3g} GB/s, median {med / 1e9:.3g} GB/s")
    return reports


# the caching allocator's reserve at the peak, which a synthetic profile cannot provoke: max
# reserved / max allocated in LLM training runs on A100s (see the presets in galvatron_fx.cluster.spec)
GPU_ALLOCATOR_FACTOR = 1.25
# a node whose matmul rate is under this × its fastest peer's (same device) is its own device kind
SLOW_NODE_RATIO = 0.67


def matmul_peaks(compute_rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Dtype -> the fastest matmul's FLOP/s among ``compute_rows``."""
    peak: dict[str, float] = {}
    for r in compute_rows:
        if r["op"] == "matmul":
            peak[r["dtype"]] = max(peak.get(r["dtype"], 0.0), r["flops_s"])
    return peak


@dataclass(frozen=True)
class NodeDevice:
    """What one node's ranks measured of their devices: the device's name and memory, and per
    dtype the median over the node's ranks of each rank's fastest matmul, and the median memory
    bandwidth, kernel launch and layer call (the host's fixed costs, 0 where not measured)."""

    name: str
    memory_bytes: int
    peak_flops: Mapping[str, float]
    memory_bandwidth_bytes_s: float
    kernel_s: float = 0.0
    layer_s: float = 0.0


def node_rate(n: NodeDevice) -> float:
    """The matmul rate nodes are compared by: float32's, else the first dtype measured."""
    return n.peak_flops.get("float32") or next(iter(n.peak_flops.values()), 0.0)


def node_kinds(nodes: Sequence[NodeDevice], *, slow_ratio: float = SLOW_NODE_RATIO
               ) -> tuple[list[str], dict[str, NodeDevice]]:
    """Each node's device kind, and per kind the node whose figures it takes. Nodes of one
    device name are one kind, at the fastest such node's figures, unless a node's float32 (else
    first) matmul rate is under ``slow_ratio`` × that fastest one's: that node is its own kind,
    ``"<name> @node<i>"``, at its own figures (a slowed, throttled or shared node; the planner
    places stages per kind)."""
    rate = node_rate
    best: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.name not in best or rate(n) > rate(nodes[best[n.name]]):
            best[n.name] = i
    kinds: list[str] = []
    ref: dict[str, NodeDevice] = {}
    for i, n in enumerate(nodes):
        top = nodes[best[n.name]]
        kind = n.name if rate(n) >= slow_ratio * rate(top) else f"{n.name} @node{i}"[:96]
        kinds.append(kind)
        ref.setdefault(kind, top if kind == n.name else n)
    return kinds, ref


def _node_fixed_costs(spec: DeviceSpec, node: NodeDevice, fastest: NodeDevice) -> dict[str, float]:
    """A node kind's fixed costs per kernel and per layer call: on GPUs its own measured ones; on a
    CPU (whose absolute fixed costs are the compute model's defaults or a calibration's) those
    defaults × how much slower the node launches than its device's fastest node. A slowed or
    shared node is slower at everything, not only at large matmuls; a tiny layer's time is mostly
    these costs, so without them the planner would see it barely slower."""
    from galvatron_fx.cost_models.compute import default_efficiency

    if not spec.kind.lower().startswith("cpu"):
        return {"kernel_overhead_s": node.kernel_s, "layer_overhead_s": node.layer_s} if node.kernel_s > 0 else {}
    if node is fastest or node.kernel_s <= 0 or fastest.kernel_s <= 0:
        return {}
    base = default_efficiency(spec)
    ratio = node.kernel_s / fastest.kernel_s
    return {"kernel_overhead_s": base.overhead_s * ratio, "layer_overhead_s": base.layer_overhead_s * ratio}


def build_cluster(
    rows, compute_rows, mem_bw, overlap_info, *, backend, device, num_nodes, dpn, fingerprint, hosts, colls_supported,
    nodes: Sequence[NodeDevice] | None = None,
) -> Cluster:
    """The ``Cluster`` a profiling run measured: link tiers from the fits of ``rows`` (latency the
    smallest group's all-reduce alpha, bus bandwidth from the largest group's beta), device peaks
    from the fastest matmul per dtype, overlap slowdown from ``overlap_info``; on GPUs the fixed
    costs per kernel and layer call and the context and communicator memory measured. ``nodes``
    (one per node, as measured there): nodes of another device, or one much slower than its
    peers (:func:`node_kinds`), get their own device kind and spec; without it every node is
    rank 0's device."""
    import torch

    fits = fit_rows(rows)
    if device.type == "cuda":
        kind = torch.cuda.get_device_name(device)
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        kind = f"cpu:{cpu_model()}"[:80]
        try:
            host_mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            host_mem = 8 * 2**30
        memory = host_mem // dpn
    peak = matmul_peaks(compute_rows)
    if not peak:
        peak = {"float32": 20e9}
    # GPUs: the host's fixed costs and the memory beside the tensors, as measured (a CPU's
    # fixed costs belong to its calibration, cost_models.cpu_runtime)
    fixed: dict[str, Any] = {}
    if device.type == "cuda":
        by_op = {r["op"]: r for r in compute_rows}
        if "kernel_launch" in by_op:
            fixed["kernel_overhead_s"] = by_op["kernel_launch"]["time_s"]
        if "layer_call" in by_op:
            fixed["layer_overhead_s"] = by_op["layer_call"]["time_s"]
        if "device_memory" in by_op:
            fixed["context_bytes"] = int(by_op["device_memory"]["context_bytes"])
            fixed["comm_buffer_bytes"] = int(by_op["device_memory"]["comm_buffer_bytes"])
        fixed["allocator_factor"] = GPU_ALLOCATOR_FACTOR
        # the host tier CPU offload is priced by: this rank's share of the node's host memory,
        # the host link and the host's optimizer as measured (device_probes.measure_host_tier)
        fixed["host_memory_bytes"] = host_memory_bytes() // dpn
        if "host_link" in by_op:
            fixed["host_link_bytes_s"] = float(by_op["host_link"]["bytes_s"])
        if "host_optimizer" in by_op:
            fixed["host_optimizer_params_s"] = float(by_op["host_optimizer"]["params_s"])
    spec = DeviceSpec(kind=kind, memory_bytes=int(memory), peak_flops=peak, memory_bandwidth_bytes_s=mem_bw or 10e9,
                      **fixed)

    def tier(name: TierName, lat: float, bw: float) -> LinkTier:
        f = fits.get(name, {})
        ar = f.get(Collective.ALL_REDUCE, {})
        if ar:
            n = max(ar)
            lat = ar[min(ar)].alpha_s
            if ar[n].beta_s_per_byte > 0:
                bw = bandwidth_factor(Collective.ALL_REDUCE, n) / ar[n].beta_s_per_byte
        return LinkTier(name=name, latency_s=lat, bandwidth_bytes_s=bw, fits=f)

    specs, per_node = {kind: spec}, (kind,) * num_nodes
    if nodes is not None and len(nodes) == num_nodes and num_nodes > 1:
        kinds, ref = node_kinds(nodes)
        if len(ref) > 1:
            fastest = {n.name: ref[n.name] for n in nodes if n.name in ref}
            specs = {}
            for k, n in ref.items():
                own = dataclasses.replace(spec, kind=k, peak_flops=dict(n.peak_flops) or spec.peak_flops,
                                          memory_bandwidth_bytes_s=n.memory_bandwidth_bytes_s or mem_bw or 10e9,
                                          **cast(dict[str, Any], _node_fixed_costs(spec, n, fastest[n.name])))
                if device.type == "cuda" and n.memory_bytes:
                    own = dataclasses.replace(own, memory_bytes=int(n.memory_bytes))
                specs[k] = own
            per_node = tuple(kinds)

    gpu = backend == "nccl"
    return Cluster(
        name=f"profiled-{hosts[0]}" + (f"x{num_nodes}" if num_nodes > 1 else ""),
        num_nodes=num_nodes,
        devices_per_node=dpn,
        device_specs=specs,
        node_kinds=per_node,
        intra_node=tier(TierName.INTRA_NODE, 10e-6 if gpu else 50e-6, 100e9 if gpu else 1e9),
        inter_node=tier(TierName.INTER_NODE, 25e-6 if gpu else 100e-6, 20e9 if gpu else 1.25e9),
        overlap_slowdown=float(overlap_info.get("slowdown", 1.0 if not gpu else 1.2)),
        backend=backend,
        # DTensor uses all-gather + chunk instead of all-to-all on CPU meshes
        all_to_all_via_all_gather=device.type == "cpu" or Collective.ALL_TO_ALL not in colls_supported,
        fingerprint=fingerprint,
    )
