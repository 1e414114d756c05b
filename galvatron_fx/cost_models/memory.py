"""Memory of a layer under a strategy, per rank; and of a pipeline stage at its peak.

Terms (per rank, bytes):
- *params*: the parameter storage a rank keeps for the whole step — all of its tensor-parallel
  shard under DDP, ``1/dp`` of it under ZeRO-2/3 (FSDP2 pads each parameter's dim 0 to a
  multiple of ``dp``, which is counted).
- *unsharded params*: the all-gathered compute copies. ZeRO-2 (FSDP2 with
  ``reshard_after_forward=False``) keeps them from the layer's forward until its backward;
  ZeRO-3 holds them only while the layer runs (a transient, see *temp*).
- *grads*: DDP keeps the full gradient (as bucket views: no second copy); ZeRO-2/3 keep the
  reduce-scattered ``1/dp`` shard.
- *optimizer*: AdamW's two states per parameter, ``1/dp`` under ZeRO-2/3.
- *activations*: what the layer keeps from forward to backward for ONE micro-batch
  (``LayerCosts.activation_bytes_for(recompute)``, measured), scaled to the local micro-batch,
  the compute dtype and the tensor-parallel shard.
- *host*: what CPU offload (``LayerStrategy.offload``) keeps in host memory instead of on the
  device: under DDP the fp32 master parameters, their gradients and the optimizer states (the
  device keeps working parameters and gradients, no optimizer state); under ZeRO-2/3 the
  sharded parameters, gradients and optimizer states (the device keeps none of them, only the
  gathered copies and, while a gather starts, the shard copied in). Host bytes never count
  against the device; a stage's host memory (:func:`stage_host_bytes`) is held to the host budget.
- *temp*: the largest transient while the layer runs: ZeRO-3's gathered parameters (current and
  prefetched layer), the unsharded gradients before their reduce-scatter, the activations that
  recomputation brings back during the layer's backward, and (when measured,
  ``backward_temp_bytes``) what its backward allocates beyond what it frees: the gradients of its
  outputs and intermediates (a cross-entropy's backward holds several logits-sized tensors).

A stage's peak (:func:`stage_peak_bytes`) = Σ params, unsharded ZeRO-2 params and optimizer
states + the largest, over the backward, of the activations still held + the gradients already
made + the running layer's temp. Gradients are made during the backward while activations are
freed, so with one micro-batch the peak is usually at the start of the backward, with no
gradient yet; when gradients accumulate over micro-batches (``num_microbatches > 1``, every
pipeline) they are held from the first backward on and count in full.

What the device shows in use (``nvidia-smi``) is more than the tensors (:func:`reserved_bytes`):
the runtime's context (CUDA context, library handles), the communicators' buffers (NCCL
allocates them outside PyTorch's caching allocator, one set per process group a rank uses) and
the caching allocator's reserve and fragmentation above the tensor peak, a factor on it. These
are a device spec's ``context_bytes``, ``comm_buffer_bytes`` and ``allocator_factor`` (0, 0, 1 on
CPUs); a plan's memory budget is what the device may show, so the search holds the tensors to
:func:`tensor_budget_bytes`. On a heterogeneous cluster (nodes of several device kinds) the
budget caps every device and each device gets at most its own memory
(:func:`device_budget_bytes`): a stage is held to the smallest of its devices'.

Which parameters a layer is charged for: ``LayerCosts.num_params`` counts every parameter *and
buffer* the layer reads, so Llama's rotary tables count as parameters. Pass ``params`` — the
trainable ``ParamInfo``s the layer reads — and they are the count for every flavour. The runtime
keeps one copy of a tied weight (an embedding and its head) per layer that reads it, each with
its gradient and optimizer states, so the search passes every parameter a layer reads.

Checked against ``torch.distributed._tools.MemTracker``/``FSDPMemTracker`` (torch 2.13, CPU,
gloo, world 2, ``tests/dist/test_memory_model.py``; gpt-tiny and llama-tiny, every flavour and
recompute option): params, grads, optimizer states and per-block activations are exact to the
byte, except AdamW's ``step`` (one 4-byte scalar tensor per parameter, not modelled). What the
runtime keeps, as measured:
- DDP (``gradient_as_bucket_view=True``): one full copy of each parameter; the gradients live in
  the reducer's buckets (allocated in the first backward), exactly the parameter bytes, with no
  second copy.
- FSDP2: each parameter's local shard is its own tensor of ``ceil(dim0/dp)`` rows
  (``sharded_numel``); the reduce-scattered gradient is the same size; AdamW's states follow
  the local shard without its padding (rank 0 holds the most: exactly the padded size, counted
  here). After forward, ZeRO-2 (``reshard_after_forward=False``, root included) holds every
  parameter unsharded and unpadded (the all-gather buffer itself is freed after the copy-out);
  ZeRO-3 holds none. Both reshard after backward, so nothing unsharded is
  left after the step.
- Recompute (``galvatron_fx.ir.recompute.checkpoint_fn`` around each block): a block keeps exactly
  ``activation_bytes_for(mode)``; under ``full`` that is its input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

from galvatron_fx.cluster import Cluster, DeviceSpec
from galvatron_fx.ir.graph import LayerCosts, ParamInfo
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import DPType, LayerStrategy, Precision


@dataclass(frozen=True, kw_only=True, slots=True)
class TPShard:
    """How a layer divides under tensor parallelism (from the intra-layer solver).

    ``param_fraction``: local parameter elements / all parameter elements;
    ``activation_fraction``: local activation bytes / unsharded, per recompute mode.
    """

    param_fraction: float = 1.0
    activation_fraction: tuple[float, float, float] = (1.0, 1.0, 1.0)  # none, selective, full

    def activation(self, recompute: Recompute) -> float:
        return self.activation_fraction[_RECOMPUTE_INDEX[Recompute(recompute)]]


_RECOMPUTE_INDEX = {r: i for i, r in enumerate(Recompute)}


NO_TP = TPShard()


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerMemory:
    """Per-rank bytes of one layer; ``activation_bytes`` is for one micro-batch."""

    param_bytes: int = 0
    unsharded_param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    activation_bytes: int = 0
    temp_bytes: int = 0
    host_bytes: int = 0  # in host memory (CPU offload), not on the device

    @property
    def persistent_bytes(self) -> int:
        return self.param_bytes + self.unsharded_param_bytes + self.grad_bytes + self.optimizer_bytes

    def peak_bytes(self, in_flight: int = 1) -> int:
        """This layer alone, with ``in_flight`` micro-batches of activations held."""
        return self.persistent_bytes + in_flight * self.activation_bytes + self.temp_bytes

    def __add__(self, other: LayerMemory) -> LayerMemory:
        """Sum of two layers' memories (temps do not add up: the larger one is kept)."""
        kw = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        kw["temp_bytes"] = max(self.temp_bytes, other.temp_bytes)
        return LayerMemory(**kw)

    def to_dict(self) -> dict[str, int]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if not d["host_bytes"]:
            del d["host_bytes"]
        return d


def sharded_numel(shape: tuple[int, ...], dp: int) -> int:
    """Elements one rank keeps of a parameter that FSDP2 shards on dim 0 over ``dp`` ranks."""
    if dp == 1 or not shape:
        return math.prod(shape) if shape else 1
    rows = math.ceil(shape[0] / dp)
    return rows * math.prod(shape[1:])


def layer_memory(
    costs: LayerCosts,
    strategy: LayerStrategy,
    *,
    dp: int,
    micro_batch: float,
    captured_batch: int,
    precision: Precision = Precision(),
    captured_dtype_bytes: int = 4,
    params: list[ParamInfo] | None = None,
    tp_shard: TPShard | None = None,
    backward_temp_bytes: int = 0,
) -> LayerMemory:
    """Per-rank memory of a layer under ``strategy`` with data-parallel degree ``dp``.

    ``micro_batch`` is the local micro-batch (samples per rank per micro-batch);
    ``captured_batch`` the batch the costs were measured at. ``params`` are the ``ParamInfo``s
    this layer is charged for (each parameter given to one layer only; buffers and frozen ones
    are skipped): when given they, not ``costs.num_params``, are the parameter count (see the
    module doc) and make the FSDP padding exact; without them the count is ``costs.num_params``
    and the shard ``numel / dp``. ``tp_shard`` is required when ``strategy.tp > 1``.
    ``backward_temp_bytes``: the measured transient of the layer's backward on one rank at the
    captured batch (:mod:`galvatron_fx.search.lowered_prices`), scaled like the activations.
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    if strategy.tp > 1 and tp_shard is None:
        raise ValueError(f"layer memory under tp={strategy.tp} needs the tensor-parallel shard "
                         "(TPShard) from the intra-layer solver")
    shard = tp_shard or NO_TP
    p = precision
    trainable = None if params is None else [pi for pi in params if pi.requires_grad and not pi.is_buffer]
    full_numel = costs.num_params if trainable is None else sum(pi.numel for pi in trainable)
    numel = full_numel * shard.param_fraction
    if strategy.dp_type == DPType.DDP or dp == 1:
        local = numel
    elif trainable is not None and shard.param_fraction == 1.0:
        local = sum(sharded_numel(pi.shape, dp) for pi in trainable)
    else:
        local = numel / dp
    param_b = local * p.param_bytes
    grad_b = local * p.grad_bytes
    optim_b = local * p.optim_bytes_per_param
    sharded = strategy.dp_type != DPType.DDP and dp > 1
    # FSDP2 without mixed precision computes on the sharded parameters' all-gather output: one
    # more copy; with mixed precision the copy is in the compute dtype.
    unsharded_b = numel * p.compute_bytes if sharded else 0
    scale = (micro_batch / captured_batch) * (p.compute_bytes / captured_dtype_bytes)
    act = costs.activation_bytes_for(strategy.recompute) * shard.activation(strategy.recompute) * scale
    full_act = costs.activation_bytes * shard.activation(Recompute.NONE) * scale
    temp = backward_temp_bytes * scale
    if strategy.recompute != Recompute.NONE:
        temp += max(0.0, full_act - act)  # brought back while this layer's backward runs
    if sharded:
        temp += numel * p.grad_bytes  # unsharded gradients before the reduce-scatter
    zero3_gathered = 0.0
    if sharded and strategy.dp_type == DPType.ZERO3:
        zero3_gathered = 2 * unsharded_b  # this layer's gathered params + the prefetched next
    host_b = 0.0
    if strategy.offload:
        host_b = param_b + grad_b + optim_b  # the master (DDP) or the shards (ZeRO), with grads and states
        optim_b = 0.0
        if sharded:  # the device keeps only the gathered copies, and a shard while it is copied in
            temp += param_b
            param_b = grad_b = 0.0
    return LayerMemory(
        param_bytes=int(param_b),
        unsharded_param_bytes=int(unsharded_b) if strategy.dp_type == DPType.ZERO2 and sharded else 0,
        grad_bytes=int(grad_b),
        optimizer_bytes=int(optim_b),
        activation_bytes=int(act),
        temp_bytes=int(temp + zero3_gathered),
        host_bytes=int(host_b),
    )


def stage_peak_bytes(memories: list[LayerMemory], in_flight: int | list[int], *,
                     grads_held: bool = True) -> int:
    """Peak per-rank bytes of the layers one rank runs, in forward order, holding ``in_flight``
    micro-batches of activations (one count, or one per layer); ``grads_held``: gradients are
    held through the step (accumulation over micro-batches, pipelines), else they appear during
    the backward as activations are freed (see the module doc)."""
    if not memories:
        return 0
    counts = [in_flight] * len(memories) if isinstance(in_flight, int) else list(in_flight)
    fixed = sum(m.param_bytes + m.unsharded_param_bytes + m.optimizer_bytes for m in memories)
    acts = [k * m.activation_bytes for k, m in zip(counts, memories)]
    if grads_held:
        return fixed + sum(m.grad_bytes for m in memories) + sum(acts) + max(m.temp_bytes for m in memories)
    # the backward runs from the last layer to the first: while layer i runs, the activations of
    # layers 0..i are held and the gradients of layers i+1.. are made
    peak, held, made = 0, sum(acts), 0
    for i in range(len(memories) - 1, -1, -1):
        peak = max(peak, held + made + memories[i].temp_bytes)
        held -= acts[i]
        made += memories[i].grad_bytes
    return fixed + max(peak, made)


def stage_host_bytes(memories: list[LayerMemory]) -> int:
    """Host memory one rank's offloaded layers keep (CPU offload), for the whole step."""
    return sum(m.host_bytes for m in memories)


# process groups a rank holds, for the budget the search holds tensors to: the world, a
# data-parallel and a tensor-parallel group, and the pipeline's two neighbours (a plan whose
# layers use more mesh shapes holds more; its notes say so)
BUDGET_COMMUNICATORS = 5


def reserved_bytes(tensor_peak: int, device: DeviceSpec, communicators: int) -> int:
    """What ``device`` shows in use at a tensor peak of ``tensor_peak`` bytes with
    ``communicators`` process groups: context + communicator buffers + allocator factor × peak."""
    return int(device.context_bytes + device.comm_buffer_bytes * communicators
               + device.allocator_factor * tensor_peak)


def _kinds(cluster: Cluster, ranks: Iterable[int] | None) -> set[str]:
    """The device kinds of ``ranks`` (None: every rank)."""
    if ranks is None:
        return set(cluster.node_kinds)
    return {cluster.node_kinds[cluster.node_of(r)] for r in ranks}


def device_budget_bytes(budget: int, cluster: Cluster, ranks: Iterable[int] | None = None) -> int:
    """What a device of ``ranks`` (None: any rank) may show in use under ``budget``: the budget
    itself on a cluster of one device kind (taken as given, also above the device's memory: a
    "what if" of a larger device); on a heterogeneous cluster the smallest, over the kinds of
    ``ranks``, of the budget and the device's own memory."""
    if not cluster.is_heterogeneous:
        return budget
    return min(min(budget, cluster.device_specs[k].memory_bytes) for k in _kinds(cluster, ranks))


def tensor_budget_bytes(budget: int, cluster: Cluster, communicators: int = BUDGET_COMMUNICATORS, *,
                        ranks: Iterable[int] | None = None) -> int:
    """The tensor peak whose :func:`reserved_bytes` stays within the device budget
    (:func:`device_budget_bytes`) on every device kind of ``ranks`` (None: of ``cluster``)
    (0 when the fixed terms alone exceed it)."""
    ranks = None if ranks is None else list(ranks)
    out = device_budget_bytes(budget, cluster, ranks)
    for kind in _kinds(cluster, ranks):
        d = cluster.device_specs[kind]
        fixed = d.context_bytes + d.comm_buffer_bytes * communicators
        own = device_budget_bytes(budget, cluster, [cluster.node_kinds.index(kind) * cluster.devices_per_node])
        out = min(out, int(max(0, own - fixed) / d.allocator_factor))
    return max(1, out)
