"""This machine as a :class:`~galvatron_fx.cluster.Cluster`: gloo CPU processes on one host,
described as one node or several (``Cluster.local_cpu``), from a cached hardware profile when one
matches this machine's fingerprint, else conservative defaults (:func:`default_local_cpu`)."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from galvatron_fx import limits
from galvatron_fx.cluster import Cluster, DeviceSpec, LinkTier, TierName, _cluster_from_dict
from galvatron_fx.errors import ConfigError
from galvatron_fx.host import (
    cpu_model,
    default_cache_dir,
    fingerprint_fields,
    host_memory_bytes,
    local_fingerprint,
    make_fingerprint,
)

logger = logging.getLogger("galvatron_fx.cluster")

__all__ = ["default_local_cpu", "local_cpu"]


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
