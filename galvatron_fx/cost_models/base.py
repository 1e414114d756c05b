"""The ``CostModel`` protocol — everything the search asks of a cost model — and the analytic
model that composes the parts in this package.

Contract: a cost model answers in seconds and bytes, per rank, and never touches a graph. The
search depends only on this protocol, so a measured or learned model can replace the analytic
one without changing the solver.

Parts of :class:`AnalyticCostModel`:
- compute: :class:`~galvatron_fx.cost_models.compute.ComputeModel` (roofline on per-node facts,
  corrected by calibrated efficiencies);
- communication: :class:`~galvatron_fx.cost_models.communication.CommModel` (tier-aware,
  hierarchical; profiled fits where the cluster has them), and compute/communication overlap;
- resharding between layouts: :func:`~galvatron_fx.cost_models.reshard.reshard_time_s`;
- memory: :func:`~galvatron_fx.cost_models.memory.layer_memory`;
- pipeline schedules: :func:`~galvatron_fx.cost_models.pipeline.simulate` (event simulation);
- the optimizer step: AdamW as a memory-bound pass over parameters, gradients and its two states
  (fused or ``foreach``, as on GPUs: no cost per tensor);
- sharded data parallelism (FSDP's all-gathers and reduce-scatters): hidden behind the layer's
  compute where it fits (``overlapped_s``), as FSDP2's prefetching on CUDA streams does.

A cost model may set ``traces_runtime = True``: the search then prices tensor-parallel layers by
the collectives and saved activations of their lowered program, read off its graphs on fake
tensors (:mod:`galvatron_fx.search.lowered_prices`), instead of the intra-layer ILP's estimate
(about half a second per layer kind and option; the CPU runtime model does, where the difference
is large).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import galvatron_fx.cost_models.memory as _memory
import galvatron_fx.cost_models.pipeline as _pipeline
from galvatron_fx.cluster import Cluster, Collective
from galvatron_fx.cost_models.communication import CommModel
from galvatron_fx.cost_models.compute import ComputeEfficiency, ComputeModel
from galvatron_fx.cost_models.memory import LayerMemory, TPShard
from galvatron_fx.cost_models.pipeline import PipelineResult, ScheduleKind, StageCost
from galvatron_fx.cost_models.reshard import Layout, reshard_time_s
from galvatron_fx.ir.graph import LayerCosts, LayerInfo, ModelGraph, ParamInfo
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import LayerStrategy, Precision


@runtime_checkable
class CostModel(Protocol):
    """What the search needs: compute, communication, resharding, memory, pipeline schedules."""

    cluster: Cluster

    def layer_times_s(self, mg: ModelGraph, layer: LayerInfo, *, batch_fraction: float = 1.0,
                      tp_fraction: float = 1.0, recompute: Recompute | str = "none",
                      rank: int = 0) -> tuple[float, float]:
        """Forward and backward compute seconds of ``layer`` on one rank."""
        ...

    def node_time_s(self, flops: float, nbytes: float, *, rank: int = 0) -> float:
        """Seconds of one kernel doing ``flops`` and moving ``nbytes`` on ``rank``'s device."""
        ...

    def collective_time_s(self, collective: Collective | str, nbytes: int, ranks: Sequence[int] | int, *,
                          gap_s: float | None = None) -> float:
        """Seconds of one collective over ``ranks`` (``nbytes`` = the full tensor); ``gap_s``: the
        compute each rank does between the previous collective that synchronised them and this
        one, when known (a model may charge rank skew by it; None: a whole step's)."""
        ...

    def tp_collective_time_s(self, collective: Collective | str, nbytes: int, ranks: Sequence[int] | int, *,
                             gap_s: float | None = None) -> float:
        """Seconds of one collective inside a tensor-parallel layer's forward or backward (back to
        back with its kernels, on the layer's critical path)."""
        ...

    def overlapped_s(self, compute_s: float, comm_s: float) -> float:
        """Wall seconds of compute and communication running at the same time."""
        ...

    def reshard_time_s(self, nbytes: int, src: Layout, dst: Layout, ranks: Sequence[int], ndim: int) -> float:
        """Seconds to move a tensor of ``nbytes`` from layout ``src`` to ``dst`` over ``ranks``."""
        ...

    def layer_memory(self, costs: LayerCosts, strategy: LayerStrategy, *, dp: int, micro_batch: float,
                     captured_batch: int, params: list[ParamInfo] | None = None,
                     tp_shard: TPShard | None = None, backward_temp_bytes: int = 0) -> LayerMemory:
        """Per-rank bytes of a layer under ``strategy``."""
        ...

    def simulate_pipeline(self, schedule: ScheduleKind | str, stages: Sequence[StageCost],
                          num_microbatches: int, *, virtual_stages: int = 1) -> PipelineResult:
        """Step time and per-stage peak memory of a pipeline schedule."""
        ...

    def optimizer_step_s(self, numel: int, tensors: int, *, dtensor: bool = False, rank: int = 0) -> float:
        """Seconds of one optimizer step over ``tensors`` parameter tensors holding ``numel``
        elements on one rank; ``dtensor``: the parameters are DTensors (FSDP's shards)."""
        ...

    def exposed_fsdp_s(self, compute_s: float, comm_s: float) -> float:
        """Seconds that ``comm_s`` of a layer's FSDP all-gathers and reduce-scatters add to a
        step beyond the ``compute_s`` of the layer they may hide behind."""
        ...


class AnalyticCostModel:
    """The default :class:`CostModel`, composed from this package's parts (see module doc)."""

    def __init__(self, cluster: Cluster, *,
                 efficiency: ComputeEfficiency | Mapping[str, ComputeEfficiency] | None = None,
                 precision: Precision = Precision()):
        self.cluster = cluster
        self.precision = precision
        self.compute = ComputeModel(cluster, efficiency, dtype=precision.compute_dtype)
        self.comm = CommModel(cluster)

    def layer_times_s(self, mg, layer, *, batch_fraction=1.0, tp_fraction=1.0, recompute="none", rank=0):
        return self.compute.layer_times_s(mg, layer, batch_fraction=batch_fraction, tp_fraction=tp_fraction,
                                          recompute=recompute, rank=rank)

    def node_time_s(self, flops, nbytes, *, rank=0):
        return self.compute.node_time_s(flops, nbytes, rank=rank)

    def collective_time_s(self, collective, nbytes, ranks, *, gap_s=None):
        return self.comm.time_s(collective, nbytes, ranks)

    def tp_collective_time_s(self, collective, nbytes, ranks, *, gap_s=None):
        return self.collective_time_s(collective, nbytes, ranks, gap_s=gap_s)

    def overlapped_s(self, compute_s, comm_s):
        return self.comm.overlapped_s(compute_s, comm_s)

    def reshard_time_s(self, nbytes, src, dst, ranks, ndim):
        return reshard_time_s(self.comm, nbytes, src, dst, list(ranks), ndim)

    def layer_memory(self, costs, strategy, *, dp, micro_batch, captured_batch, params=None, tp_shard=None,
                     backward_temp_bytes=0):
        return _memory.layer_memory(costs, strategy, dp=dp, micro_batch=micro_batch,
                                    captured_batch=captured_batch, precision=self.precision,
                                    params=params, tp_shard=tp_shard, backward_temp_bytes=backward_temp_bytes)

    def simulate_pipeline(self, schedule, stages, num_microbatches, *, virtual_stages=1):
        return _pipeline.simulate(schedule, list(stages), num_microbatches, virtual_stages=virtual_stages)

    def optimizer_step_s(self, numel, tensors, *, dtensor=False, rank=0):
        # AdamW reads parameter, gradient and two states and writes back parameter and states
        p = self.precision
        nbytes = numel * (2 * p.param_bytes + p.grad_bytes + 2 * p.optim_bytes_per_param)
        return self.compute.node_time_s(10.0 * numel, nbytes, rank=rank) if numel > 0 else 0.0

    def exposed_fsdp_s(self, compute_s, comm_s):
        return max(0.0, self.overlapped_s(compute_s, comm_s) - compute_s)
