"""The per-layer records of a :class:`~galvatron_fx.ir.plan.ParallelPlan`: what was decided for one
layer (:class:`LayerPlan`), what it is predicted to cost (:class:`LayerPrediction`), the strategies
the search rejected (:class:`Alternative`) and the whole plan's prediction (:class:`PlanPrediction`).

Contract
    Frozen records; dict and sequence fields are copied on construction, so a record never changes
    after it is built. Each has ``to_dict()`` giving its plain-JSON form; parsing that form back and
    checking values is :mod:`galvatron_fx.ir.plan_schema`'s job.

Units
    Per-layer times (:class:`LayerPrediction`) are seconds per training step on one rank of the
    layer's stage, all micro-batches summed: ``fwd_s``, ``bwd_s`` (recomputation included),
    ``comm_s`` (communication not hidden behind compute) and ``transition_s`` (resharding the
    input from the previous layer's layout). ``memory_bytes`` is what the layer holds on one rank
    at the stage's peak (activations × micro-batches in flight); ``memory_breakdown`` splits it
    (e.g. params, grads, optimizer, activations, temp) and sums to it when given.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from galvatron_fx.ir.graph import LayerRole
from galvatron_fx.ir.placements import NodePlacement
from galvatron_fx.ir.strategy import LayerStrategy

__all__ = ["Alternative", "Baseline", "CollectiveRecord", "LayerPlan", "LayerPrediction", "PlanPrediction", "SearchStats"]


class _AsMapping(Mapping):
    """A record that reads as its JSON form too (``stats["search_s"]``, ``dict(stats)``), as plans
    written before it was a record were read."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The record's plain-JSON form."""

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(frozen=True, order=True)
class CollectiveRecord(_AsMapping):
    """One collective, as a plan prices it (``LayerPlan.collectives``) and as a lowered program
    issues it (``LoweredLayer.fw_collectives`` ...: :func:`galvatron_fx.ir.program.collectives_of`):
    its phase (``"fwd"``, ``"bwd"``, or ``"step"``: once per step, in the stage's gradient
    buckets), op (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``), group size,
    bytes per micro-batch, and, where the search priced it, the mesh axis (``"tp"`` / ``"dp"``;
    ``""``: not recorded). Reads as its JSON object too (``c["bytes"]``)."""

    phase: str
    op: str
    group_size: int
    bytes: int
    axis: str = ""

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> CollectiveRecord:
        """The record of a JSON object, or itself."""
        if isinstance(d, CollectiveRecord):
            return d
        return cls(phase=d["phase"], op=d["op"], group_size=d["group_size"], bytes=d["bytes"], axis=d.get("axis", ""))

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "op": self.op, "group_size": self.group_size, "bytes": self.bytes,
                **({"axis": self.axis} if self.axis else {})}


@dataclass(frozen=True, eq=True)
class SearchStats(_AsMapping):
    """What the search did to find a plan (``ParallelPlan.solver_stats``): its seconds (the one
    figure every plan has; a hand-made plan gives 0), the points and ILP solves it priced, the
    largest Pareto frontier of its layer DP, the candidates it weighed, the automatic batch's
    record (:mod:`galvatron_fx.search.auto_batch`) and the uniform baseline it kept when that was
    faster. ``extra``: keys a file holds that this version does not know, kept as read."""

    search_s: float | None = None
    points: int | None = None
    ilp_solves: int | None = None
    ilp_s: float | None = None
    chain_solves: int | None = None
    dp_frontier_max: int | None = None
    num_candidates: int | None = None
    batch_search: dict[str, Any] | None = None
    kept_baseline: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, d: Mapping[str, Any] | None) -> SearchStats:
        """The record of a JSON object (a plan file's ``solver_stats``), or itself."""
        if isinstance(d, SearchStats):
            return d
        d = dict(d or {})
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: d[k] for k in known if k in d}, extra={k: v for k, v in d.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}


@dataclass(frozen=True, eq=True)
class Baseline(_AsMapping):
    """The best uniform configuration (:mod:`galvatron_fx.search.baselines`) priced beside the
    searched plan under the same model (``ParallelPlan.baseline``): its name and predicted step."""

    name: Any  # a str (a plan file's other values are reported by the plan's checks)
    step_time_s: Any  # seconds

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Baseline:
        """The record of a JSON object (a plan file's ``baseline``), or itself."""
        if isinstance(d, Baseline):
            return d
        return cls(name=d.get("name"), step_time_s=d.get("step_time_s"))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "step_time_s": self.step_time_s}


# ---- records --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LayerPrediction:
    """Predicted cost of one layer under one strategy (see the module docstring for units)."""

    fwd_s: float
    bwd_s: float
    comm_s: float = 0.0
    transition_s: float = 0.0
    memory_bytes: int = 0
    memory_breakdown: dict[str, int] = field(default_factory=dict)
    # the optimizer step over this layer's parameter shards, per step
    optimizer_s: float = 0.0
    # what the search held this layer's stage to the budget with this choice in place: every
    # layer's parameters, gradients, optimizer state and held activations, plus the largest
    # temporary (None in plans written before it was recorded)
    stage_bytes: int | None = None
    # what CPU offload keeps of this layer in host memory on one rank (not in memory_bytes)
    host_bytes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_breakdown", dict(self.memory_breakdown))

    @property
    def total_s(self) -> float:
        """Time this layer adds to the step: fwd + bwd + exposed comm + transition + optimizer."""
        return self.fwd_s + self.bwd_s + self.comm_s + self.transition_s + self.optimizer_s

    def to_dict(self) -> dict:
        return {"fwd_s": self.fwd_s, "bwd_s": self.bwd_s, "comm_s": self.comm_s,
                "transition_s": self.transition_s, "memory_bytes": self.memory_bytes,
                "memory_breakdown": dict(self.memory_breakdown),
                **({"optimizer_s": self.optimizer_s} if self.optimizer_s else {}),
                **({"stage_bytes": self.stage_bytes} if self.stage_bytes is not None else {}),
                **({"host_bytes": self.host_bytes} if self.host_bytes else {})}


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """A strategy the search considered for a layer and rejected, with its costs and why it lost
    (``"over memory budget by 3.2 GiB"``, ``"+12 ms per step"``)."""

    strategy: LayerStrategy
    predicted: LayerPrediction
    reason: str
    layout: str = ""  # the tp layouts it takes and hands on ("in S(2), out R"), where they differ by option
    # resharding its output into the next layer's chosen layout, per step (its predicted
    # transition_s is the resharding into it from the previous layer's chosen layout)
    transition_out_s: float = 0.0

    def to_dict(self) -> dict:
        d = {"strategy": self.strategy.to_dict(), "predicted": self.predicted.to_dict(), "reason": self.reason}
        return (d | ({"layout": self.layout} if self.layout else {})
                | ({"transition_out_s": self.transition_out_s} if self.transition_out_s else {}))


@dataclass(frozen=True, kw_only=True)
class LayerPlan:
    """The decision for one layer: its stage, strategy, node placements and predicted costs."""

    name: str
    kind: str
    role: LayerRole
    stage: int
    strategy: LayerStrategy
    dp: int
    placements: dict[str, str] = field(default_factory=dict)
    predicted: LayerPrediction
    alternatives: tuple[Alternative, ...] = ()
    # the collectives the search priced, per micro-batch ("step": once per step, in the stage's gradient buckets)
    collectives: tuple[CollectiveRecord, ...] = ()
    # readable names of placed nodes: parameters and the ops reading them, by name within the layer
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", LayerRole(self.role))
        object.__setattr__(self, "placements", dict(self.placements))
        object.__setattr__(self, "labels", dict(self.labels))
        object.__setattr__(self, "alternatives", tuple(self.alternatives))
        object.__setattr__(self, "collectives", tuple(CollectiveRecord.of(c) for c in self.collectives))

    @functools.cached_property
    def node_placements(self) -> dict[str, NodePlacement]:
        """``placements`` as typed records (each distinct string parsed once)."""
        return {n: NodePlacement.parse(s) for n, s in self.placements.items()}

    def to_dict(self) -> dict:
        d = {"name": self.name, "kind": self.kind, "role": str(self.role), "stage": self.stage,
             "dp": self.dp, "strategy": self.strategy.to_dict(), "placements": dict(self.placements),
             "predicted": self.predicted.to_dict(), "alternatives": [a.to_dict() for a in self.alternatives]}
        if self.collectives:
            d["collectives"] = [c.to_dict() for c in self.collectives]
        if self.labels:
            d["labels"] = dict(self.labels)
        return d


@dataclass(frozen=True, kw_only=True)
class PlanPrediction:
    """Predicted step time, throughput and per-stage peak memory of the whole plan."""

    step_time_s: float
    throughput_samples_s: float
    peak_memory_bytes: tuple[int, ...]  # one per pipeline stage, per rank
    memory_budget_bytes: int
    bubble_fraction: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)  # e.g. compute/comm/transition/bubble seconds
    # what each stage's device shows in use (nvidia-smi): the tensor peak plus the runtime's
    # context, communicator buffers and allocator reserve (cost_models.memory.reserved_bytes);
    # empty in plans written before it was predicted
    reserved_peak_bytes: tuple[int, ...] = ()
    # what the search held each stage's tensors to: the budget less the runtime's fixed reserve
    # (cost_models.memory.tensor_budget_bytes); None in plans written before it was recorded
    tensor_budget_bytes: int | None = None
    # efficiency (None / empty in plans written before it was predicted): the model's FLOPs per
    # step (forward and backward at the global batch, recomputation not counted), every device's
    # peak FLOP/s summed (in the compute dtype; at least the rate its matmuls are priced at), MFU
    # (the FLOPs over the step time and that peak) and, per stage, compute density (a rank's
    # compute time, recomputation included, over the step time)
    model_flops: float | None = None
    peak_flops: float | None = None
    mfu: float | None = None
    compute_density: tuple[float, ...] = ()
    # CPU offload (empty / None when no layer offloads): per stage, the host memory one rank's
    # offloaded layers keep; per node, its ranks' sum; and the host budget per node it was held to
    host_memory_bytes: tuple[int, ...] = ()
    host_node_bytes: tuple[int, ...] = ()
    host_budget_bytes: int | None = None
    # heterogeneous clusters (empty otherwise, and in plans written before): per stage, what its
    # devices may show in use — the budget capping each device's own memory, the smallest of a
    # stage spanning kinds (cost_models.memory.device_budget_bytes)
    stage_budget_bytes: tuple[int, ...] = ()

    def budget_of(self, stage: int) -> int:
        """The device budget of ``stage``: its own where recorded, else the plan's."""
        return self.stage_budget_bytes[stage] if self.stage_budget_bytes else self.memory_budget_bytes

    @property
    def device_peak_bytes(self) -> tuple[int, ...]:
        """Per stage, what the budget is checked against: the reserved peak where predicted."""
        return self.reserved_peak_bytes or self.peak_memory_bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_memory_bytes", tuple(self.peak_memory_bytes))
        object.__setattr__(self, "reserved_peak_bytes", tuple(self.reserved_peak_bytes))
        object.__setattr__(self, "breakdown", dict(self.breakdown))
        object.__setattr__(self, "compute_density", tuple(self.compute_density))
        object.__setattr__(self, "host_memory_bytes", tuple(self.host_memory_bytes))
        object.__setattr__(self, "host_node_bytes", tuple(self.host_node_bytes))
        object.__setattr__(self, "stage_budget_bytes", tuple(self.stage_budget_bytes))

    def to_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "throughput_samples_s": self.throughput_samples_s,
                "peak_memory_bytes": list(self.peak_memory_bytes),
                "memory_budget_bytes": self.memory_budget_bytes, "bubble_fraction": self.bubble_fraction,
                "breakdown": dict(self.breakdown),
                **({"reserved_peak_bytes": list(self.reserved_peak_bytes)} if self.reserved_peak_bytes else {}),
                **({"tensor_budget_bytes": self.tensor_budget_bytes} if self.tensor_budget_bytes is not None else {}),
                **({"model_flops": self.model_flops} if self.model_flops is not None else {}),
                **({"peak_flops": self.peak_flops} if self.peak_flops is not None else {}),
                **({"mfu": self.mfu} if self.mfu is not None else {}),
                **({"compute_density": list(self.compute_density)} if self.compute_density else {}),
                **({"host_memory_bytes": list(self.host_memory_bytes)} if self.host_memory_bytes else {}),
                **({"host_node_bytes": list(self.host_node_bytes)} if self.host_node_bytes else {}),
                **({"host_budget_bytes": self.host_budget_bytes} if self.host_budget_bytes is not None else {}),
                **({"stage_budget_bytes": list(self.stage_budget_bytes)} if self.stage_budget_bytes else {})}
