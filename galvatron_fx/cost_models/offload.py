"""The price of CPU offload (``LayerStrategy.offload``): host-link copies and the host's optimizer
step, per rank and step, from the device spec's host tier (``DeviceSpec.host_*``).

What the runtime does (:mod:`galvatron_fx.runtime.data_parallel`) and what it costs:
- *DDP* (and dp = 1): the device computes with working parameters and keeps their gradients; the
  fp32 master copy, its gradients and the optimizer states live in host memory. After the step's
  gradient sync each gradient goes to the host (device → host), the host's cores run the optimizer,
  and the updated parameters come back (host → device) before the next forward. None of it
  overlaps the step's compute: ``exposed`` = both copies + the host optimizer.
- *ZeRO-2/3* (dp > 1, FSDP2's ``CPUOffloadPolicy``): the sharded parameters, gradients and
  optimizer states live in host memory. Each all-gather first copies the rank's shard to the
  device, each reduce-scatter's shard goes back to the host; FSDP issues them on its
  communication streams, so they overlap compute like its collectives (``overlappable``, per
  micro-batch × the gathers and reduce-scatters of the flavour). The optimizer steps the shards
  on the host: exposed.

Host link: ``bytes / host_link_bytes_s`` plus :data:`HOST_COPY_LATENCY_S` per copy batch; no
figure: :data:`DEFAULT_HOST_LINK_BYTES_S` (PCIe 4.0 x16, pinned). Host optimizer:
``numel / host_optimizer_params_s`` (default :data:`DEFAULT_HOST_OPTIMIZER_PARAMS_S`).
"""

from __future__ import annotations

from dataclasses import dataclass

from galvatron_fx.cluster import DeviceSpec
from galvatron_fx.ir.strategy import DPType, Precision

__all__ = ["DEFAULT_HOST_LINK_BYTES_S", "DEFAULT_HOST_OPTIMIZER_PARAMS_S", "OffloadCost", "can_offload",
           "host_link_bytes_s", "host_optimizer_params_s", "offload_cost"]

DEFAULT_HOST_LINK_BYTES_S = 25e9  # PCIe 4.0 x16, pinned copies (80% of its 32 GB/s per direction)
DEFAULT_HOST_OPTIMIZER_PARAMS_S = 1.25e8  # torch's AdamW on an eighth of a two-socket host
HOST_COPY_LATENCY_S = 10e-6  # one batch of copies (launch and synchronisation)


def can_offload(device: DeviceSpec) -> bool:
    """Whether the device has host memory beside its own to offload into (a CPU "device" has not)."""
    return bool(device.host_memory_bytes)


def host_link_bytes_s(device: DeviceSpec) -> float:
    return device.host_link_bytes_s or DEFAULT_HOST_LINK_BYTES_S


def host_optimizer_params_s(device: DeviceSpec) -> float:
    return device.host_optimizer_params_s or DEFAULT_HOST_OPTIMIZER_PARAMS_S


@dataclass(frozen=True, slots=True)
class OffloadCost:
    """Seconds per step on one rank: ``exposed`` (after the backward: copies that wait for the
    gradient sync and the host optimizer) and ``overlappable`` (FSDP's per-micro-batch shard
    copies, hidden behind compute like its collectives); ``optimizer_s`` is the host optimizer's
    share of ``exposed``."""

    exposed_s: float
    overlappable_s: float
    optimizer_s: float


def offload_cost(device: DeviceSpec, dp_type: DPType, *, local_numel: int, sharded: bool, m: int,
                 precision: Precision = Precision()) -> OffloadCost:
    """The cost of offloading a layer whose rank keeps ``local_numel`` parameter elements
    (its tensor-parallel shard, ``1/dp`` of it when ``sharded``) over ``m`` micro-batches."""
    if local_numel <= 0:
        return OffloadCost(0.0, 0.0, 0.0)
    link = host_link_bytes_s(device)
    opt = local_numel / host_optimizer_params_s(device)
    p = precision
    if sharded:
        gathers = 2 if dp_type == DPType.ZERO3 else 1  # ZeRO-3 gathers again for the backward
        per_mb = (gathers * local_numel * p.param_bytes + local_numel * p.grad_bytes) / link \
            + (gathers + 1) * HOST_COPY_LATENCY_S
        return OffloadCost(opt, m * per_mb, opt)
    copies = local_numel * (p.grad_bytes + p.param_bytes) / link + 2 * HOST_COPY_LATENCY_S
    return OffloadCost(copies + opt, 0.0, opt)
