"""``ParallelPlan``: the whole solution of the search — frozen, JSON round-trippable, diffable and
explainable.

Contract
    The search (``solve_sharding``) builds one :class:`ParallelPlan`; rewrite passes and ``emit``
    read it; nothing mutates it. Everything is keyed by names (layer names, node names), never by
    ``fx.Node`` objects, so a plan survives graph copies, processes and JSON. A plan is checked
    when it is built, by hand or from JSON: either every invariant below holds or a
    :class:`~galvatron_fx.errors.ConfigError` names the first offending field (``layers[3].strategy.tp``)
    and says what to try. Nothing is ever half-built.

    ``save(path)`` writes atomically (a temp file in the same directory, then ``os.replace``), so a
    crash mid-write leaves the previous plan intact. ``load(path)`` / ``from_json`` / ``from_dict``
    check the schema version, every key and type, enum values and the invariants.

Terms
    *stage*: a pipeline stage = a rank group ``stage_ranks[s]``; ``pp`` of them. Under interleaved
    1F1B each stage holds ``virtual_stages`` *chunks*: ``stage_boundaries`` then lists
    ``pp * virtual_stages`` chunk starts and chunk ``c`` runs on stage ``c % pp`` (round-robin, as
    ``ScheduleInterleaved1F1B`` and ``cost_models.pipeline``); otherwise one chunk per stage.
    *dp* of a layer = devices of its stage / its ``tp``: layers of one stage may factor the same
    ranks differently (dp4×tp1 then dp2×tp2); reshards between them are the *transitions*.
    *micro_batch_size*: samples per micro-batch on one data-parallel rank of the widest data
    parallelism in the plan (max dp over layers), so
    ``global_batch_size = micro_batch_size × num_microbatches × max dp``; a layer with a smaller dp
    sees ``global_batch_size / num_microbatches / dp`` samples per rank and micro-batch.
    *placement*: a node's placements on the tp axis of the layer's (dp, tp) mesh as a string, its
    tensor inputs', ``->``, its outputs': ``"S(1),R->S(2)"``, ``"->R"`` for a placeholder
    (grammar and checks: :mod:`galvatron_fx.ir.placements`). Checked for syntax when a plan is
    built; against the graph (dims within each tensor's rank) once a layer is decomposed.

Ranges
    Every number is checked against the sane ranges of :mod:`galvatron_fx.limits` (world size and
    degrees ≤ 2**20, batches ≤ 2**30, bytes ≤ 2**60, times ≤ 1e12 s), so that an absurd value is a
    ``ConfigError`` naming the field, never work or arithmetic proportional to it.

Units
    Per-layer times (:class:`LayerPrediction`) are seconds per training step on one rank of the
    layer's stage, all micro-batches summed: ``fwd_s``, ``bwd_s`` (recomputation included),
    ``comm_s`` (communication not hidden behind compute) and ``transition_s`` (resharding the
    input from the previous layer's layout). ``memory_bytes`` is what the layer holds on one rank
    at the stage's peak (activations × micro-batches in flight); ``memory_breakdown`` splits it
    (e.g. params, grads, optimizer, activations, temp) and sums to it when given.

JSON (schema_version 1)
    ``{"schema_version", "model", "graph_hash", "cluster_hash", "world_size", "pp",
    "num_microbatches", "schedule", "virtual_stages", "global_batch_size", "micro_batch_size",
    "stage_boundaries": [int], "stage_ranks": [[int]], "precision",
    "layers": [{"name", "kind", "role", "stage", "dp", "strategy": {"tp", "sp", "dp_type",
    "recompute"}, "placements": {node: str}, "predicted": {"fwd_s", "bwd_s", "comm_s",
    "transition_s", "memory_bytes", "memory_breakdown"}, "alternatives": [{"strategy", "predicted",
    "reason"}]}],
    "predicted": {"step_time_s", "throughput_samples_s", "peak_memory_bytes": [int per stage],
    "memory_budget_bytes", "bubble_fraction", "breakdown": {str: float}},
    "solver_stats": {"search_s", ...}, "baseline": {"name", "step_time_s"} | null, "notes": [str],
    "cluster": {the cluster's JSON} (optional), "graph": {"params": [[name, shape, dtype]],
    "inputs": [[shape past the batch, dtype]]} (optional)}``

A plan is bound to its model graph and cluster: ``graph_hash`` (see :func:`graph_hash`; the batch
is not part of it) is checked by ``compile(plan=...)``, which names the first differing layer, and
``cluster`` (the description planned for) and ``graph`` (parameter and input shapes) let a
mismatch be reported by the field or parameter that differs.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from galvatron_fx import limits
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.inspect import fmt_bytes, format_table
from galvatron_fx.ir.graph import LayerRole
from galvatron_fx.ir.placements import PLACEMENT_HELP, placement_problem
from galvatron_fx.ir.strategy import DPType, LayerStrategy, Recompute, SPMode

if TYPE_CHECKING:
    from galvatron_fx.cluster import Cluster
    from galvatron_fx.ir.graph import ModelGraph

__all__ = [
    "SCHEMA_VERSION", "Alternative", "LayerPlan", "LayerPrediction", "ParallelPlan", "PlanPrediction",
    "cluster_hash", "graph_hash",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
PRECISIONS = ("fp32", "bf16", "fp16")
_REPLAN = "re-run `galvatron-fx plan` to make a new plan"


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_breakdown", dict(self.memory_breakdown))

    @property
    def total_s(self) -> float:
        """Time this layer adds to the step: fwd + bwd + exposed comm + transition."""
        return self.fwd_s + self.bwd_s + self.comm_s + self.transition_s

    def to_dict(self) -> dict:
        return {"fwd_s": self.fwd_s, "bwd_s": self.bwd_s, "comm_s": self.comm_s,
                "transition_s": self.transition_s, "memory_bytes": self.memory_bytes,
                "memory_breakdown": dict(self.memory_breakdown)}


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """A strategy the search considered for a layer and rejected, with its costs and why it lost
    (``"over memory budget by 3.2 GiB"``, ``"+12 ms per step"``)."""

    strategy: LayerStrategy
    predicted: LayerPrediction
    reason: str
    layout: str = ""  # the tp layouts it takes and hands on ("in S(2), out R"), where they differ by option

    def to_dict(self) -> dict:
        d = {"strategy": self.strategy.to_dict(), "predicted": self.predicted.to_dict(), "reason": self.reason}
        return d | ({"layout": self.layout} if self.layout else {})


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", LayerRole(self.role))
        object.__setattr__(self, "placements", dict(self.placements))
        object.__setattr__(self, "alternatives", tuple(self.alternatives))

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "role": str(self.role), "stage": self.stage,
                "dp": self.dp, "strategy": self.strategy.to_dict(), "placements": dict(self.placements),
                "predicted": self.predicted.to_dict(), "alternatives": [a.to_dict() for a in self.alternatives]}


@dataclass(frozen=True, kw_only=True)
class PlanPrediction:
    """Predicted step time, throughput and per-stage peak memory of the whole plan."""

    step_time_s: float
    throughput_samples_s: float
    peak_memory_bytes: tuple[int, ...]  # one per pipeline stage, per rank
    memory_budget_bytes: int
    bubble_fraction: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)  # e.g. compute/comm/transition/bubble seconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_memory_bytes", tuple(self.peak_memory_bytes))
        object.__setattr__(self, "breakdown", dict(self.breakdown))

    def to_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "throughput_samples_s": self.throughput_samples_s,
                "peak_memory_bytes": list(self.peak_memory_bytes),
                "memory_budget_bytes": self.memory_budget_bytes, "bubble_fraction": self.bubble_fraction,
                "breakdown": dict(self.breakdown)}


class _InvalidPlan(ConfigError):
    """Raised by ``ParallelPlan.__post_init__``; carries the (field, problem) list."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "plan") -> None:
        self.problems = problems
        super().__init__(_problems_message(source, problems))


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """The whole parallel plan: pipeline layout, one :class:`LayerPlan` per layer, predictions.

    Built by the search, saved beside checkpoints, read by the rewrite passes and ``emit``.
    Construction checks every invariant (see the module docstring) and raises ``ConfigError``
    naming the field; dict and sequence fields are copied, so the plan cannot change later.
    """

    schema_version: int = SCHEMA_VERSION
    model: str
    graph_hash: str
    cluster_hash: str
    world_size: int
    pp: int
    num_microbatches: int
    schedule: str
    virtual_stages: int = 1
    global_batch_size: int
    micro_batch_size: int
    stage_boundaries: tuple[int, ...]
    stage_ranks: tuple[tuple[int, ...], ...]
    precision: str = "fp32"
    layers: tuple[LayerPlan, ...]
    predicted: PlanPrediction
    solver_stats: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    cluster: dict[str, Any] | None = None
    graph: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "stage_boundaries", tuple(self.stage_boundaries))
        set_(self, "stage_ranks", tuple(tuple(r) for r in self.stage_ranks))
        set_(self, "layers", tuple(self.layers))
        set_(self, "solver_stats", dict(self.solver_stats))
        set_(self, "baseline", None if self.baseline is None else dict(self.baseline))
        set_(self, "notes", tuple(self.notes))
        set_(self, "cluster", None if self.cluster is None else json.loads(json.dumps(self.cluster)))
        set_(self, "graph", None if self.graph is None else json.loads(json.dumps(self.graph)))
        problems = _check_invariants(self)
        if problems:
            raise _InvalidPlan(problems)

    # ---- lookups ---------------------------------------------------------------------------
    def layer(self, name: str) -> LayerPlan:
        """The plan of layer ``name``; ``ConfigError`` with the closest names if absent."""
        for lp in self.layers:
            if lp.name == name:
                return lp
        names = [lp.name for lp in self.layers]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"layers are: {', '.join(names[:8])}, ..."
        raise ConfigError(f"the plan has no layer named {name!r}; {hint}")

    def stage_of_chunk(self, chunk: int) -> int:
        """The pipeline stage that runs chunk ``chunk`` (round-robin under interleaving)."""
        return chunk % self.pp

    def chunk_layers(self) -> list[range]:
        """Layer index ranges of the chunks, in pipeline order."""
        ends = (*self.stage_boundaries[1:], len(self.layers))
        return [range(a, b) for a, b in zip(self.stage_boundaries, ends)]

    # ---- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain-JSON form (the inverse of :meth:`from_dict`)."""
        return {
            "schema_version": self.schema_version, "model": self.model, "graph_hash": self.graph_hash,
            "cluster_hash": self.cluster_hash, "world_size": self.world_size, "pp": self.pp,
            "num_microbatches": self.num_microbatches, "schedule": self.schedule,
            "virtual_stages": self.virtual_stages, "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size, "stage_boundaries": list(self.stage_boundaries),
            "stage_ranks": [list(r) for r in self.stage_ranks], "precision": self.precision,
            "layers": [lp.to_dict() for lp in self.layers], "predicted": self.predicted.to_dict(),
            "solver_stats": dict(self.solver_stats),
            "baseline": None if self.baseline is None else dict(self.baseline),
            "notes": list(self.notes),
            **({} if self.cluster is None else {"cluster": json.loads(json.dumps(self.cluster))}),
            **({} if self.graph is None else {"graph": json.loads(json.dumps(self.graph))}),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """The JSON text (keys in schema order; NaN/inf refused)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> ParallelPlan:
        """Build from the JSON form, checking every key, type, enum value and invariant.

        Raises ``ConfigError`` naming ``source`` and the field; never returns a partial plan.
        """
        try:
            kwargs = _parse_plan(data)
            return cls(**kwargs)
        except _FieldError as e:
            raise ConfigError(_problems_message(source, [(e.field, e.problem)])) from None
        except _InvalidPlan as e:
            raise ConfigError(_problems_message(source, e.problems)) from None

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan JSON") -> ParallelPlan:
        """Parse JSON text; malformed JSON (reported with line and column) or JSON nested too
        deep is a ``ConfigError``."""
        data = limits.load_json(text, source, hint=f"fix the file or {_REPLAN}")
        return cls.from_dict(data, source=source)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan to ``path`` atomically (temp file in the same directory, then
        ``os.replace``): readers see the old plan or the new one, never a torn file."""
        path = Path(path)
        data = self.to_dict()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, allow_nan=False)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; a plan is meant to be shared
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        logger.info("saved plan %s to %s", self.plan_hash()[:12], path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> ParallelPlan:
        """Read and check a plan file written by :meth:`save`."""
        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise ConfigError(
                f"plan file {str(p)!r} does not exist; write one with `galvatron-fx plan ... --out {p}`"
            ) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"plan file {str(p)!r} cannot be read: {e}") from None
        return cls.from_json(text, source=f"plan file {str(p)!r}")

    # ---- identity --------------------------------------------------------------------------
    def plan_hash(self) -> str:
        """sha256 of the canonical JSON without ``solver_stats`` and ``notes`` (how the search
        went is not part of what it decided): equal for equal decisions and predictions."""
        d = self.to_dict()
        d.pop("solver_stats")
        d.pop("notes")
        return _sha256_json(d)

    def check_matches(self, *, graph_hash: str | None = None, cluster_hash: str | None = None,
                      world_size: int | None = None) -> None:
        """Raise ``PlanError`` if this plan was made for another graph, cluster or world size.

        Arguments left as None are not checked; every mismatch is reported in one message.
        """
        problems = []
        if world_size is not None and world_size != self.world_size:
            problems.append(
                f"plan was made for world size {self.world_size}, this job has {world_size}: re-plan "
                f"for {world_size} devices (`galvatron-fx plan` with --nodes/--devices giving {world_size}) "
                f"or launch with {self.world_size} processes (torchrun --nproc-per-node ...)"
            )
        if graph_hash is not None and graph_hash != self.graph_hash:
            problems.append(
                f"plan was made for another model graph (graph hash {self.graph_hash[:12]}, this model "
                f"{graph_hash[:12]}): the model, its input shapes or dtypes changed since; {_REPLAN}"
            )
        if cluster_hash is not None and cluster_hash != self.cluster_hash:
            problems.append(
                f"plan was made for another cluster description (cluster hash {self.cluster_hash[:12]}, "
                f"this one {cluster_hash[:12]}); {_REPLAN} with this cluster, or pass the cluster the plan "
                "was made for"
            )
        if problems:
            raise PlanError(f"plan {self.model!r} does not match this job: " + "; ".join(problems))

    # ---- diff ------------------------------------------------------------------------------
    def diff_dict(self, other: ParallelPlan) -> dict:
        """What changed from ``self`` to ``other``, as JSON-able ``[old, new]`` pairs; ``{}`` when
        the plans agree on everything but ``solver_stats`` and ``notes``.

        Keys (only those that changed): ``"plan"`` {field: [old, new]}, ``"layers"``
        {name: {"strategy" | "stage" | "dp" | "placements" | "time_s" | "memory_bytes": [old, new]}},
        ``"added_layers"``, ``"removed_layers"``, ``"predicted"`` {field: [old, new]}.
        """
        out: dict[str, Any] = {}
        a, b = self.to_dict(), other.to_dict()
        top = {k: [a[k], b[k]] for k in _DIFF_FIELDS if a[k] != b[k]}
        if top:
            out["plan"] = top
        mine = {lp.name: lp for lp in self.layers}
        theirs = {lp.name: lp for lp in other.layers}
        layers: dict[str, dict] = {}
        for name, la in mine.items():
            lb = theirs.get(name)
            if lb is None:
                continue
            ch: dict[str, list] = {}
            if la.strategy != lb.strategy:
                ch["strategy"] = [la.strategy.short(), lb.strategy.short()]
            for f in ("stage", "dp"):
                if getattr(la, f) != getattr(lb, f):
                    ch[f] = [getattr(la, f), getattr(lb, f)]
            if la.placements != lb.placements:
                ch["placements"] = [len(la.placements), sum(
                    1 for k in set(la.placements) | set(lb.placements) if la.placements.get(k) != lb.placements.get(k))]
            if la.predicted.total_s != lb.predicted.total_s:
                ch["time_s"] = [la.predicted.total_s, lb.predicted.total_s]
            if la.predicted.memory_bytes != lb.predicted.memory_bytes:
                ch["memory_bytes"] = [la.predicted.memory_bytes, lb.predicted.memory_bytes]
            if ch or la != lb:
                layers[name] = ch or {"details": ["predictions or alternatives differ", ""]}
        if layers:
            out["layers"] = layers
        added = [n for n in theirs if n not in mine]
        removed = [n for n in mine if n not in theirs]
        if added:
            out["added_layers"] = added
        if removed:
            out["removed_layers"] = removed
        pa, pb = a["predicted"], b["predicted"]
        pred = {k: [pa[k], pb[k]] for k in pa if pa[k] != pb[k]}
        if pred:
            out["predicted"] = pred
        if a["baseline"] != b["baseline"]:
            out.setdefault("plan", {})["baseline"] = [a["baseline"], b["baseline"]]
        return out

    def diff(self, other: ParallelPlan) -> str:
        """A readable account of :meth:`diff_dict`; ``"plans are identical"`` when it is empty."""
        d = self.diff_dict(other)
        if not d:
            return "plans are identical"
        lines = [f"plan {self.model} {self.plan_hash()[:8]} -> {other.model} {other.plan_hash()[:8]}"]
        for k, (old, new) in d.get("plan", {}).items():
            lines.append(f"  {k}: {_short_value(old)} -> {_short_value(new)}")
        if "layers" in d:
            lines.append(f"layers ({len(d['layers'])} changed of {len(self.layers)}):")
            rows = []
            for name, ch in d["layers"].items():
                la, lb = self.layer(name), other.layer(name)
                what = []
                for f in ("stage", "dp", "placements", "details"):
                    if f in ch:
                        what.append(f"{f} {ch[f][0]}->{ch[f][1]}" if f != "placements"
                                    else f"{ch[f][1]} placements changed")
                rows.append([
                    name, la.strategy.short(), "->", lb.strategy.short(),
                    _signed_ms(lb.predicted.total_s - la.predicted.total_s),
                    _signed_bytes(lb.predicted.memory_bytes - la.predicted.memory_bytes),
                    ", ".join(what),
                ])
            table = format_table(["layer", "old", "", "new", "Δ time/step", "Δ mem/rank", "other"],
                                 rows, align="llllrrl")
            lines += ["  " + line.rstrip() for line in table.splitlines()]
        for k in ("added_layers", "removed_layers"):
            if k in d:
                lines.append(f"  {k.replace('_', ' ')}: {', '.join(d[k])}")
        if "predicted" in d:
            pa, pb = self.predicted, other.predicted
            lines.append("predicted:")
            if pa.step_time_s != pb.step_time_s:
                rel = (pb.step_time_s / pa.step_time_s - 1) * 100 if pa.step_time_s else float("inf")
                lines.append(f"  step time: {_ms(pa.step_time_s)} -> {_ms(pb.step_time_s)} ({rel:+.1f}%)")
            if pa.throughput_samples_s != pb.throughput_samples_s:
                lines.append(f"  throughput: {pa.throughput_samples_s:.1f} -> {pb.throughput_samples_s:.1f} samples/s")
            if pa.peak_memory_bytes != pb.peak_memory_bytes:
                for s in range(max(len(pa.peak_memory_bytes), len(pb.peak_memory_bytes))):
                    old = pa.peak_memory_bytes[s] if s < len(pa.peak_memory_bytes) else None
                    new = pb.peak_memory_bytes[s] if s < len(pb.peak_memory_bytes) else None
                    if old != new:
                        lines.append(f"  peak memory stage {s}: {_opt_bytes(old)} -> {_opt_bytes(new)}"
                                     + (f" ({_signed_bytes(new - old)})" if old is not None and new is not None else ""))
            for k in ("memory_budget_bytes", "bubble_fraction", "breakdown"):
                if k in d["predicted"]:
                    old, new = d["predicted"][k]
                    lines.append(f"  {k}: {_short_value(old)} -> {_short_value(new)}")
        return "\n".join(lines)

    # ---- explain ---------------------------------------------------------------------------
    def explain(self, layer: str | None = None, alternative: str | LayerStrategy | None = None) -> str:
        """A report for practitioners.

        With no arguments: header, per-layer table (runs of identical layers collapsed into one
        row such as ``blocks.0–31 ×32``), stage layout with ranks, predictions against the memory
        budget, the baseline comparison and solver statistics. With ``layer``: that layer's chosen
        strategy beside its alternatives and why each lost; ``alternative`` (a ``short()`` label
        such as ``"tp4·zero3"`` — ``"tp4.zero3"`` works too — or a ``LayerStrategy``) picks one.
        """
        if layer is not None:
            return self._explain_layer(layer, alternative)
        if alternative is not None:
            raise ConfigError("explain(alternative=...) needs a layer name too: explain('blocks.3', 'tp4·ddp')")
        return self._explain_plan()

    def _explain_plan(self) -> str:
        p = self.predicted
        budget = p.memory_budget_bytes
        shapes = sorted({(lp.dp, lp.strategy.tp) for lp in self.layers}, key=lambda x: (-x[0], x[1]))
        if len(shapes) == 1:
            layout = f"pp{self.pp} × dp{shapes[0][0]} × tp{shapes[0][1]}"
        else:
            layout = f"pp{self.pp} × per layer (" + ", ".join(f"dp{d}×tp{t}" for d, t in shapes) + ")"
        sched = self.schedule + (f" ×{self.virtual_stages} chunks/stage" if self.virtual_stages > 1 else "")
        out = [
            f"plan for {self.model} on {self.world_size} devices: {layout}",
            f"  schedule {sched}, {self.num_microbatches} micro-batches, global batch {self.global_batch_size} "
            f"(micro-batch {self.micro_batch_size} per data-parallel rank), precision {self.precision}",
            f"  graph {self.graph_hash[:12]}  cluster {self.cluster_hash[:12]}  plan {self.plan_hash()[:12]}",
            "",
        ]
        # ---- per-layer table, runs of identical layers collapsed
        rows = []
        for run in _runs(self.layers):
            first = run[0]
            n = len(run)
            def mean(f: str) -> float:
                return sum(getattr(lp.predicted, f) for lp in run) / n

            mem = max(lp.predicted.memory_bytes for lp in run)
            rows.append([
                _run_name(run), str(first.stage), first.strategy.short(), f"{first.dp}",
                f"{mean('fwd_s') * 1e3:.2f}", f"{mean('bwd_s') * 1e3:.2f}",
                f"{mean('comm_s') * 1e3:.2f}", f"{mean('transition_s') * 1e3:.2f}",
                f"{sum(lp.predicted.total_s for lp in run) * 1e3:.2f}",
                f"{fmt_bytes(mem)} ({_pct(mem, budget)})",
            ])
        out.append(f"per layer (ms per step on one rank; memory per rank, % of the {fmt_bytes(budget)} budget):")
        out.append(format_table(
            ["layer", "stage", "strategy", "dp", "fwd ms", "bwd ms", "comm ms", "trans ms", "total ms", "memory/rank"],
            rows, align="lrlrrrrrrr"))
        # ---- stages
        out += ["", f"stages (pp={self.pp}):"]
        chunks = self.chunk_layers()
        for s, ranks in enumerate(self.stage_ranks):
            mine = [c for i, c in enumerate(chunks) if self.stage_of_chunk(i) == s]
            spans = ", ".join(f"layers {c.start}–{c.stop - 1} ({self.layers[c.start].name} … "
                              f"{self.layers[c.stop - 1].name})" for c in mine)
            peak = p.peak_memory_bytes[s]
            flag = "  OVER BUDGET" if peak > budget else ""
            out.append(f"  stage {s}: ranks {_ranks(ranks)} ({len(ranks)} devices); {spans}; "
                       f"peak {fmt_bytes(peak)} / {fmt_bytes(budget)} budget ({_pct(peak, budget)}){flag}")
        # ---- predictions
        out += ["", "predicted:",
                f"  step time {_ms(p.step_time_s)}, throughput {p.throughput_samples_s:.1f} samples/s, "
                f"bubble {p.bubble_fraction * 100:.1f}%",
                "  peak memory per stage: " + ", ".join(
                    f"{fmt_bytes(m)} ({_pct(m, budget)})" for m in p.peak_memory_bytes)
                + f" of {fmt_bytes(budget)} budget"]
        if p.breakdown:
            out.append("  breakdown: " + ", ".join(f"{k} {_ms(v)}" for k, v in p.breakdown.items()))
        if self.baseline:
            name, t = self.baseline.get("name", "baseline"), self.baseline.get("step_time_s")
            if isinstance(t, (int, float)) and t > 0 and p.step_time_s > 0:
                out.append(f"  {t / p.step_time_s:.2f}× faster than {name} ({_ms(t)} per step)")
            else:
                out.append(f"  baseline {name}: {t}")
        if self.solver_stats:
            out += ["", "solver: " + ", ".join(f"{k}={_short_value(v)}" for k, v in self.solver_stats.items())]
        if self.notes:
            out += ["", "notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(out)

    def _explain_layer(self, name: str, alternative: str | LayerStrategy | None) -> str:
        lp = self.layer(name)
        alts = list(lp.alternatives)
        if alternative is not None:
            alts = [_find_alternative(lp, alternative)]
        budget = self.predicted.memory_budget_bytes
        ranks = self.stage_ranks[lp.stage]
        out = [
            f"layer {lp.name} ({lp.role}, kind {lp.kind[:12]}), stage {lp.stage} on ranks {_ranks(ranks)}",
            f"chosen: {lp.strategy.short()} (dp{lp.dp} × tp{lp.strategy.tp}); memory budget {fmt_bytes(budget)} per rank",
        ]
        if not lp.alternatives:
            out.append("no alternatives were recorded for this layer (the search kept none, or it had no choice)")
        cols = [("chosen " + lp.strategy.short(), lp.predicted, "chosen")]
        labels = [lp.strategy.short()] + [a.strategy.short() for a in alts]
        # one strategy at two boundary layouts (a head handing on whole or vocab-sharded logits)
        cols += [(a.strategy.short() + (f" ({a.layout})" if a.layout and labels.count(a.strategy.short()) > 1 else ""),
                  a.predicted, a.reason) for a in alts]
        keys = []
        for _, pr, _ in cols:
            keys += [k for k in pr.memory_breakdown if k not in keys]
        rows = [
            ["fwd ms"] + [f"{pr.fwd_s * 1e3:.2f}" for _, pr, _ in cols],
            ["bwd ms"] + [f"{pr.bwd_s * 1e3:.2f}" for _, pr, _ in cols],
            ["comm ms"] + [f"{pr.comm_s * 1e3:.2f}" for _, pr, _ in cols],
            ["transition ms"] + [f"{pr.transition_s * 1e3:.2f}" for _, pr, _ in cols],
            ["total ms/step"] + [f"{pr.total_s * 1e3:.2f}" for _, pr, _ in cols],
            ["vs chosen"] + [_signed_ms(pr.total_s - lp.predicted.total_s) if i else "" for i, (_, pr, _) in enumerate(cols)],
            ["memory/rank"] + [fmt_bytes(pr.memory_bytes) for _, pr, _ in cols],
        ]
        rows += [[f"  {k}"] + [fmt_bytes(pr.memory_breakdown[k]) if k in pr.memory_breakdown else "-"
                               for _, pr, _ in cols] for k in keys]
        rows.append(["why"] + [r for _, _, r in cols])
        out += ["", format_table([""] + [c for c, _, _ in cols], rows, align="l" + "r" * len(cols))]
        if lp.placements:
            shown = list(lp.placements.items())[:12]
            more = len(lp.placements) - len(shown)
            out += ["", f"placements ({len(lp.placements)} node{'s' if len(lp.placements) != 1 else ''}, tp placements of inputs -> outputs):"]
            out += [f"  {n}: {pl}" for n, pl in shown] + ([f"  … {more} more"] if more > 0 else [])
        return "\n".join(out)


# ---- hashes ---------------------------------------------------------------------------------

def graph_hash(mg: ModelGraph) -> str:
    """sha256 of what a plan depends on in the graph: each layer's name, role and which layers
    share its structural kind, every parameter's name, shape, dtype and flags, and the example
    inputs' dtypes and shapes past dim 0. Not the batch (a plan sets its own: a capture at another
    batch, such as ``compile``'s at the micro-batch, hashes equal). Stable across processes and
    graph copies (no ``id()``)."""
    payload = {
        "layers": [[l.name, str(l.role), c] for l, c in zip(mg.layers, _kind_classes([l.kind for l in mg.layers]))],
        "params": sorted([p.name, list(p.shape), p.dtype, p.is_buffer, p.requires_grad, list(p.aliases)]
                         for p in mg.params.values()),
        "inputs": [[list(s)[1:] for s in mg.example_shapes], list(mg.example_dtypes)],
    }
    return _sha256_json(payload)


def graph_summary(mg: ModelGraph) -> dict[str, Any]:
    """What :func:`graph_hash` covers besides the layers, in plain JSON: every parameter's name,
    shape and dtype, and the inputs' shapes past the batch and dtypes (a plan's ``graph``)."""
    return {"params": sorted([p.name, list(p.shape), p.dtype] for p in mg.params.values()),
            "inputs": [[list(s)[1:], d] for s, d in zip(mg.example_shapes, mg.example_dtypes)]}


def _summary_difference(theirs: Any, mine: dict[str, Any]) -> str | None:
    """The first difference between a plan's ``graph`` summary and this model's (None: none
    found, or the plan's summary is not in the expected form)."""
    if not isinstance(theirs, dict):
        return None
    ti, mi = theirs.get("inputs"), mine["inputs"]
    if isinstance(ti, list) and ti != mi:
        for k, (a, b) in enumerate(zip(ti, mi)):
            if a != b:
                return f"input {k} is {_short_value(a)} past the batch in the plan, {_short_value(b)} here"
        return f"the plan has {len(ti)} inputs, this model {len(mi)}"
    tp = theirs.get("params")
    if not isinstance(tp, list) or not all(isinstance(x, list) and len(x) == 3 for x in tp):
        return None
    tmap, mmap = {str(x[0]): x[1:] for x in tp}, {x[0]: x[1:] for x in mine["params"]}
    for name in sorted(set(tmap) | set(mmap)):
        a, b = tmap.get(name), mmap.get(name)
        if a is None:
            return f"parameter {name!r} is not in the plan's model"
        if b is None:
            return f"the plan's model has a parameter {name!r}, this one has not"
        if a != b:
            return f"parameter {name!r} is {_short_value(a[0])} {a[1]} in the plan, {_short_value(b[0])} {b[1]} here"
    return None


def _kind_classes(kinds: list[str]) -> list[int]:
    """Each layer's kind as the index of the first layer of that kind (batch-independent)."""
    first: dict[str, int] = {}
    return [first.setdefault(k, i) for i, k in enumerate(kinds)]


def model_mismatch(plan: ParallelPlan, mg: ModelGraph) -> str | None:
    """The first difference between the model graph ``plan`` was made for and ``mg`` (None when
    the graph hashes agree): layer count, a layer's name or role, which layers repeat which, then
    parameters and input shapes as a whole (the plan holds only their hash)."""
    if graph_hash(mg) == plan.graph_hash:
        return None
    head = (f"plan {plan.model!r} was made for another model than this {mg.name!r}" if plan.model != mg.name else
            f"plan {plan.model!r} was made for another graph than this model's")
    fix = f"{_REPLAN} for this model, or pass the model the plan was made for"
    theirs, mine = plan.layers, mg.layers
    for i, (a, b) in enumerate(zip(theirs, mine)):
        if (a.name, str(a.role)) != (b.name, str(b.role)):
            return f"{head}: layer {i} is {a.name!r} ({a.role}) in the plan, {b.name!r} ({b.role}) in this model; {fix}"
    if len(theirs) != len(mine):
        return f"{head}: the plan has {len(theirs)} layers, this model {len(mine)}; {fix}"
    pc, mc = _kind_classes([lp.kind for lp in theirs]), _kind_classes([l.kind for l in mine])
    for i, (a, b) in enumerate(zip(pc, mc)):
        if a != b:
            if a == i:
                return (f"{head}: layer {mine[i].name!r} has its own structure in the plan, the structure of "
                        f"{mine[b].name!r} in this model; {fix}")
            return (f"{head}: layer {mine[i].name!r} repeats {theirs[a].name!r} in the plan but not in this model "
                    f"(a changed block); {fix}")
    what = _summary_difference(plan.graph, graph_summary(mg))
    if what is None:
        what = "parameter shapes or dtypes, or the input shapes past the batch (e.g. the sequence length), differ"
    return (f"{head}: the layers agree, but {what}: another configuration (graph hash {plan.graph_hash[:12]} in "
            f"the plan, {graph_hash(mg)[:12]} here); {fix}")


def cluster_differences(plan: ParallelPlan, cluster: Cluster) -> list[str]:
    """What differs between the cluster ``plan`` was made for and ``cluster`` (``field: plan →
    this``; only the hash when the plan does not carry its cluster); empty when they hash equal."""
    if cluster_hash(cluster) == plan.cluster_hash:
        return []
    if plan.cluster is None:
        return [f"cluster hash {plan.cluster_hash[:12]} → {cluster_hash(cluster)[:12]}"]
    out: list[str] = []

    def walk(a: Any, b: Any, at: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{at}.{k}" if at else k)
        elif a != b:
            out.append(f"{at}: {_short_value(a)} → {_short_value(b)}")

    walk(plan.cluster, json.loads(cluster.to_json()), "")
    return out or [f"cluster hash {plan.cluster_hash[:12]} → {cluster_hash(cluster)[:12]}"]


def cluster_hash(cluster: Cluster) -> str:
    """sha256 of ``cluster.to_json()`` canonicalised (sorted keys, no whitespace)."""
    return _sha256_json(json.loads(cluster.to_json()))


def _sha256_json(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# ---- invariants -----------------------------------------------------------------------------

def _problems_message(source: str, problems: list[tuple[str, str]]) -> str:
    head = f"{source} is invalid: " if len(problems) == 1 else f"{source} is invalid ({len(problems)} problems): "
    return head + "; ".join(f"{f} {p}" for f, p in problems[:10]) + (
        f"; … {len(problems) - 10} more" if len(problems) > 10 else "") + f". {_REPLAN[0].upper()}{_REPLAN[1:]}"


def _check_invariants(plan: ParallelPlan) -> list[tuple[str, str]]:
    """Every cross-field rule of a plan, as (field, problem) pairs; empty when the plan is sound."""
    pr: list[tuple[str, str]] = []
    if plan.schema_version != SCHEMA_VERSION:
        pr.append(("schema_version", f"is {plan.schema_version!r}; this galvatron_fx reads {SCHEMA_VERSION}"))
    for f, rng in _SCALAR_RANGES.items():
        if (problem := rng.problem(getattr(plan, f))) is not None:
            pr.append((f, problem))
    if plan.schedule not in SCHEDULES:
        pr.append(("schedule", f"= {plan.schedule!r} is not one of {', '.join(SCHEDULES)}"))
    if plan.precision not in PRECISIONS:
        pr.append(("precision", f"= {plan.precision!r} is not one of {', '.join(PRECISIONS)}"))
    if not plan.layers:
        pr.append(("layers", "is empty: a plan needs at least one layer"))
    if pr:
        return pr  # the rules below need sane scalars
    pp, v, m, n = plan.pp, plan.virtual_stages, plan.num_microbatches, len(plan.layers)
    if v != 1 and plan.schedule != "interleaved_1f1b":
        pr.append(("virtual_stages", f"= {v} but schedule {plan.schedule!r} runs one chunk per stage; "
                                     "use 'interleaved_1f1b' or virtual_stages=1"))
    if plan.schedule == "1f1b" and m < pp:
        pr.append(("num_microbatches", f"= {m} < pp = {pp}: 1F1B needs at least one micro-batch per stage"))
    if plan.schedule == "interleaved_1f1b" and m % max(1, m // pp):
        pr.append(("num_microbatches", f"= {m} is not a multiple of max(1, m // pp) = {max(1, m // pp)}, "
                                       "which interleaved 1F1B needs"))
    # stage boundaries: chunk starts, increasing, covering the layers
    sb = plan.stage_boundaries
    if len(sb) != pp * v:
        pr.append(("stage_boundaries", f"has {len(sb)} entries, expected pp × virtual_stages = {pp * v}"))
    elif sb[0] != 0:
        pr.append(("stage_boundaries[0]", f"= {sb[0]}: the first stage must start at layer 0"))
    else:
        for i in range(1, len(sb)):
            if sb[i] <= sb[i - 1]:
                pr.append((f"stage_boundaries[{i}]", f"= {sb[i]} is not greater than the previous boundary {sb[i - 1]}"))
                break
        else:
            if sb[-1] >= n:
                pr.append((f"stage_boundaries[{len(sb) - 1}]", f"= {sb[-1]} leaves no layer for the last stage "
                                                               f"(the plan has {n} layers)"))
    # stage ranks: pp groups covering range(world_size) exactly once
    sr = plan.stage_ranks
    if len(sr) != pp:
        pr.append(("stage_ranks", f"has {len(sr)} stages, expected pp = {pp}"))
    seen: dict[int, int] = {}
    for s, ranks in enumerate(sr):
        if not ranks:
            pr.append((f"stage_ranks[{s}]", "is empty"))
        for r in ranks:
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < plan.world_size:
                pr.append((f"stage_ranks[{s}]", f"holds rank {r!r}, outside 0..{plan.world_size - 1}"))
            elif r in seen:
                pr.append((f"stage_ranks[{s}]", f"repeats rank {r} (already in stage {seen[r]})"))
            else:
                seen[r] = s
    missing = sorted(set(range(plan.world_size)) - set(seen))
    if missing:
        pr.append(("stage_ranks", f"leaves ranks {_ranks(missing)} of world size {plan.world_size} unused"))
    # layers
    chunk_of = [0] * n
    if not any(f.startswith("stage_boundaries") for f, _ in pr):
        for c, rng in enumerate(plan.chunk_layers()):
            for i in rng:
                chunk_of[i] = c
    names: set[str] = set()
    max_dp = 0
    for i, lp in enumerate(plan.layers):
        at = f"layers[{i}]"
        if lp.name in names:
            pr.append((f"{at}.name", f"= {lp.name!r} is used by an earlier layer too"))
        names.add(lp.name)
        for node, s in lp.placements.items():
            if (problem := placement_problem(s)) is not None:
                first = not any(".placements[" in f for f, _ in pr)
                pr.append((f"{at}.placements[{node!r}]", f"= {s!r} (layer {lp.name}, node {node}) {problem}"
                                                         + (f"; {PLACEMENT_HELP}" if first else "")))
                break
        if not any(f.startswith("stage_boundaries") for f, _ in pr) and lp.stage != chunk_of[i] % pp:
            pr.append((f"{at}.stage", f"= {lp.stage} but stage_boundaries put layer {i} ({lp.name}) on stage "
                                      f"{chunk_of[i] % pp}"))
            continue
        if not 0 <= lp.stage < len(sr):
            pr.append((f"{at}.stage", f"= {lp.stage} is not a stage of this plan (0..{len(sr) - 1})"))
            continue
        devices = len(sr[lp.stage])
        tp = lp.strategy.tp
        if devices % tp:
            pr.append((f"{at}.strategy.tp", f"= {tp} does not divide the {devices} devices of stage {lp.stage} "
                                            f"(layer {lp.name})"))
        elif lp.dp * tp != devices:
            pr.append((f"{at}.dp", f"= {lp.dp}, but dp × tp = {lp.dp} × {tp} must equal the {devices} devices "
                                   f"of stage {lp.stage} (layer {lp.name}); expected dp = {devices // tp}"))
        max_dp = max(max_dp, lp.dp)
        pr += _check_prediction(lp.predicted, f"{at}.predicted")
        for j, alt in enumerate(lp.alternatives):
            pr += _check_prediction(alt.predicted, f"{at}.alternatives[{j}].predicted")
    if max_dp and plan.global_batch_size != plan.micro_batch_size * m * max_dp:
        pr.append(("global_batch_size", f"= {plan.global_batch_size} but micro_batch_size × num_microbatches × "
                                        f"max dp = {plan.micro_batch_size} × {m} × {max_dp} = "
                                        f"{plan.micro_batch_size * m * max_dp}"))
    elif max_dp:
        per_mb = plan.global_batch_size // m
        for i, lp in enumerate(plan.layers):
            if lp.dp >= 1 and per_mb % lp.dp:
                pr.append((f"layers[{i}].dp", f"= {lp.dp} does not divide the {per_mb} samples of a micro-batch"))
                break
    # predictions and free-form dicts
    pd = plan.predicted
    if len(pd.peak_memory_bytes) != pp:
        pr.append(("predicted.peak_memory_bytes", f"has {len(pd.peak_memory_bytes)} entries, expected one per stage ({pp})"))
    for f, rng in (("step_time_s", limits.SECONDS), ("throughput_samples_s", _THROUGHPUT),
                   ("bubble_fraction", _FRACTION), ("memory_budget_bytes", limits.BYTES)):
        if (problem := rng.problem(getattr(pd, f))) is not None:
            pr.append((f"predicted.{f}", problem))
    for s, b in enumerate(pd.peak_memory_bytes):
        if (problem := limits.BYTES.problem(b)) is not None:
            pr.append((f"predicted.peak_memory_bytes[{s}]", problem))
    for k, v in pd.breakdown.items():
        if (problem := _SIGNED_SECONDS.problem(v)) is not None:
            pr.append((f"predicted.breakdown.{k}", problem))
    if "search_s" not in plan.solver_stats or not _is_num(plan.solver_stats["search_s"]):
        pr.append(("solver_stats.search_s", "is missing or not a number (seconds the search took)"))
    if plan.baseline is not None and (not isinstance(plan.baseline.get("name"), str)
                                      or not _is_num(plan.baseline.get("step_time_s"))):
        pr.append(("baseline", "needs a string 'name' and a number 'step_time_s', or null"))
    for f in ("solver_stats", "baseline"):
        try:
            json.dumps(getattr(plan, f), allow_nan=False)
        except (TypeError, ValueError) as e:
            pr.append((f, f"is not plain JSON: {e}"))
    return pr


def _check_prediction(p: LayerPrediction, at: str) -> list[tuple[str, str]]:
    pr = []
    for f in ("fwd_s", "bwd_s", "comm_s", "transition_s"):
        v = getattr(p, f)
        if not _is_num(v) or v < 0:
            pr.append((f"{at}.{f}", f"must be a finite number >= 0, got {v!r}"))
        elif (problem := limits.SECONDS.problem(v)) is not None:
            pr.append((f"{at}.{f}", problem))
    for f, v in (("memory_bytes", p.memory_bytes), *((f"memory_breakdown.{k}", b) for k, b in p.memory_breakdown.items())):
        if (problem := limits.BYTES.problem(v)) is not None:
            pr.append((f"{at}.{f}", problem))
            return pr
    if p.memory_breakdown and sum(p.memory_breakdown.values()) != p.memory_bytes:
        pr.append((f"{at}.memory_breakdown", f"sums to {sum(p.memory_breakdown.values())}, but memory_bytes "
                                             f"= {p.memory_bytes}"))
    return pr


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_SCALAR_RANGES = {"world_size": limits.DEGREE, "pp": limits.DEGREE, "num_microbatches": limits.MICROBATCHES,
                  "virtual_stages": limits.DEGREE, "global_batch_size": limits.BATCH,
                  "micro_batch_size": limits.BATCH}
_THROUGHPUT = limits.Range(0, 1e15, "samples/s")
_INDEX = limits.Range(0, 2**20, integer=True)  # a stage, a rank, a layer index
_FRACTION = limits.Range(0, 1)
_SIGNED_SECONDS = limits.Range(-1e12, 1e12, "s")


# ---- parsing (JSON → constructor arguments) -------------------------------------------------

class _FieldError(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


_TOP_KEYS = ("schema_version", "model", "graph_hash", "cluster_hash", "world_size", "pp", "num_microbatches",
             "schedule", "virtual_stages", "global_batch_size", "micro_batch_size", "stage_boundaries",
             "stage_ranks", "precision", "layers", "predicted", "solver_stats", "baseline", "notes")
_OPTIONAL_TOP_KEYS = ("cluster", "graph")
_DIFF_FIELDS = ("model", "graph_hash", "cluster_hash", "world_size", "pp", "num_microbatches", "schedule",
                "virtual_stages", "global_batch_size", "micro_batch_size", "stage_boundaries", "stage_ranks",
                "precision")
_LAYER_KEYS = ("name", "kind", "role", "stage", "dp", "strategy", "placements", "predicted", "alternatives")
_LPRED_KEYS = ("fwd_s", "bwd_s", "comm_s", "transition_s", "memory_bytes", "memory_breakdown")
_PRED_KEYS = ("step_time_s", "throughput_samples_s", "peak_memory_bytes", "memory_budget_bytes",
              "bubble_fraction", "breakdown")


def _jtype(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _obj(v: Any, at: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(v, dict):
        raise _FieldError(at or "the plan", f"must be a JSON object, got {_jtype(v)}")
    for k in keys:
        if k not in v:
            raise _FieldError(_join(at, k), "is missing")
    extra = sorted(set(v) - set(keys) - set(optional))
    if extra:
        raise _FieldError(_join(at, extra[0]), f"is not a field of schema {SCHEMA_VERSION} (typo?); "
                                               f"known fields: {', '.join(keys + optional)}")
    return v


def _join(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _int(v: Any, at: str, *, lo: int | None = None, rng: limits.Range | None = None) -> int:
    """An integer field, at least ``lo`` and within the sane range ``rng``."""
    if not isinstance(v, int) or isinstance(v, bool):
        sane = f" in {rng}" if rng is not None else ""
        raise _FieldError(at, f"must be an integer{sane}, got {_jtype(v)} {limits.short_repr(v)}")
    if lo is not None and v < lo:
        raise _FieldError(at, f"= {v} must be >= {lo}")
    if rng is not None and (problem := rng.problem(v)) is not None:
        raise _FieldError(at, problem)
    return v


def _num(v: Any, at: str, rng: limits.Range | None = None) -> float:
    """A finite number field within the sane range ``rng``."""
    if not _is_num(v):
        sane = f" in {rng}" if rng is not None else ""
        raise _FieldError(at, f"must be a finite number{sane}, got {_jtype(v)} {limits.short_repr(v)}")
    if rng is not None and (problem := rng.problem(v)) is not None:
        raise _FieldError(at, problem)
    return float(v)


def _str(v: Any, at: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(v, str):
        raise _FieldError(at, f"must be a string, got {_jtype(v)} {v!r}")
    if choices is not None and v not in choices:
        raise _FieldError(at, f"= {v!r} is not one of {', '.join(choices)}")
    return v


def _list(v: Any, at: str) -> list:
    if not isinstance(v, list):
        raise _FieldError(at, f"must be a list, got {_jtype(v)}")
    return v


def _dict_of(v: Any, at: str, conv) -> dict:
    if not isinstance(v, dict):
        raise _FieldError(at, f"must be a JSON object, got {_jtype(v)}")
    return {k: conv(x, f"{at}.{k}") for k, x in v.items()}


def _parse_strategy(v: Any, at: str) -> LayerStrategy:
    d = _obj(v, at, ("tp", "sp", "dp_type", "recompute"))
    tp = _int(d["tp"], f"{at}.tp", rng=limits.DEGREE)
    sp = _str(d["sp"], f"{at}.sp", tuple(SPMode))
    dpt = _str(d["dp_type"], f"{at}.dp_type", tuple(DPType))
    rc = _str(d["recompute"], f"{at}.recompute", tuple(Recompute))
    try:
        return LayerStrategy(tp=tp, sp=sp, dp_type=dpt, recompute=rc)
    except ValueError as e:
        raise _FieldError(at, f"is impossible: {e}") from None


def _parse_layer_prediction(v: Any, at: str) -> LayerPrediction:
    d = _obj(v, at, _LPRED_KEYS)
    return LayerPrediction(
        fwd_s=_num(d["fwd_s"], f"{at}.fwd_s"), bwd_s=_num(d["bwd_s"], f"{at}.bwd_s"),
        comm_s=_num(d["comm_s"], f"{at}.comm_s"), transition_s=_num(d["transition_s"], f"{at}.transition_s"),
        memory_bytes=_int(d["memory_bytes"], f"{at}.memory_bytes", lo=0, rng=limits.BYTES),
        memory_breakdown=_dict_of(d["memory_breakdown"], f"{at}.memory_breakdown",
                                  lambda x, a: _int(x, a, lo=0, rng=limits.BYTES)),
    )


def _parse_layer(v: Any, at: str) -> LayerPlan:
    d = _obj(v, at, _LAYER_KEYS)
    alts = []
    for j, a in enumerate(_list(d["alternatives"], f"{at}.alternatives")):
        aat = f"{at}.alternatives[{j}]"
        ad = _obj(a, aat, ("strategy", "predicted", "reason"), optional=("layout",))
        alts.append(Alternative(strategy=_parse_strategy(ad["strategy"], f"{aat}.strategy"),
                                predicted=_parse_layer_prediction(ad["predicted"], f"{aat}.predicted"),
                                reason=_str(ad["reason"], f"{aat}.reason"),
                                layout=_str(ad.get("layout", ""), f"{aat}.layout")))
    return LayerPlan(
        name=_str(d["name"], f"{at}.name"), kind=_str(d["kind"], f"{at}.kind"),
        role=LayerRole(_str(d["role"], f"{at}.role", tuple(LayerRole))),
        stage=_int(d["stage"], f"{at}.stage", lo=0, rng=_INDEX), dp=_int(d["dp"], f"{at}.dp", rng=limits.DEGREE),
        strategy=_parse_strategy(d["strategy"], f"{at}.strategy"),
        placements=_dict_of(d["placements"], f"{at}.placements", _str),
        predicted=_parse_layer_prediction(d["predicted"], f"{at}.predicted"),
        alternatives=tuple(alts),
    )


def _parse_plan(data: Any) -> dict[str, Any]:
    """Constructor arguments from the JSON form; raises ``_FieldError`` on the first bad field."""
    if isinstance(data, dict) and "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        raise _FieldError("schema_version", f"is {data['schema_version']!r}; this galvatron_fx reads plans of "
                                            f"schema {SCHEMA_VERSION}")
    d = _obj(data, "", _TOP_KEYS, optional=_OPTIONAL_TOP_KEYS)
    for key in _OPTIONAL_TOP_KEYS:
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise _FieldError(key, f"must be a JSON object or absent, got {_jtype(d[key])}")
    pd = _obj(d["predicted"], "predicted", _PRED_KEYS)
    baseline = d["baseline"]
    if baseline is not None:
        baseline = _obj(baseline, "baseline", ("name", "step_time_s"))
        baseline = {"name": _str(baseline["name"], "baseline.name"),
                    "step_time_s": _num(baseline["step_time_s"], "baseline.step_time_s", limits.SECONDS)}
    if not isinstance(d["solver_stats"], dict):
        raise _FieldError("solver_stats", f"must be a JSON object, got {_jtype(d['solver_stats'])}")
    return {
        "schema_version": _int(d["schema_version"], "schema_version"),
        "model": _str(d["model"], "model"), "graph_hash": _str(d["graph_hash"], "graph_hash"),
        "cluster_hash": _str(d["cluster_hash"], "cluster_hash"),
        "world_size": _int(d["world_size"], "world_size", rng=limits.DEGREE),
        "pp": _int(d["pp"], "pp", rng=limits.DEGREE),
        "num_microbatches": _int(d["num_microbatches"], "num_microbatches", rng=limits.MICROBATCHES),
        "schedule": _str(d["schedule"], "schedule", SCHEDULES),
        "virtual_stages": _int(d["virtual_stages"], "virtual_stages", rng=limits.DEGREE),
        "global_batch_size": _int(d["global_batch_size"], "global_batch_size", rng=limits.BATCH),
        "micro_batch_size": _int(d["micro_batch_size"], "micro_batch_size", rng=limits.BATCH),
        "stage_boundaries": tuple(_int(x, f"stage_boundaries[{i}]", lo=0, rng=_INDEX)
                                  for i, x in enumerate(_list(d["stage_boundaries"], "stage_boundaries"))),
        "stage_ranks": tuple(tuple(_int(r, f"stage_ranks[{s}][{k}]", lo=0, rng=_INDEX)
                                   for k, r in enumerate(_list(g, f"stage_ranks[{s}]")))
                             for s, g in enumerate(_list(d["stage_ranks"], "stage_ranks"))),
        "precision": _str(d["precision"], "precision", PRECISIONS),
        "layers": tuple(_parse_layer(x, f"layers[{i}]") for i, x in enumerate(_list(d["layers"], "layers"))),
        "predicted": PlanPrediction(
            step_time_s=_num(pd["step_time_s"], "predicted.step_time_s", limits.SECONDS),
            throughput_samples_s=_num(pd["throughput_samples_s"], "predicted.throughput_samples_s", _THROUGHPUT),
            peak_memory_bytes=tuple(_int(x, f"predicted.peak_memory_bytes[{s}]", lo=0, rng=limits.BYTES) for s, x in
                                    enumerate(_list(pd["peak_memory_bytes"], "predicted.peak_memory_bytes"))),
            memory_budget_bytes=_int(pd["memory_budget_bytes"], "predicted.memory_budget_bytes", lo=1,
                                     rng=limits.BYTES),
            bubble_fraction=_num(pd["bubble_fraction"], "predicted.bubble_fraction"),
            breakdown=_dict_of(pd["breakdown"], "predicted.breakdown", _num),
        ),
        "solver_stats": dict(d["solver_stats"]),
        "baseline": baseline,
        "notes": tuple(_str(x, f"notes[{i}]") for i, x in enumerate(_list(d["notes"], "notes"))),
        "cluster": d.get("cluster"), "graph": d.get("graph"),
    }


# ---- formatting helpers ---------------------------------------------------------------------

def _runs(layers: tuple[LayerPlan, ...]) -> list[list[LayerPlan]]:
    """Consecutive layers of one kind, role, stage, strategy and dp, grouped (for collapsed rows)."""
    runs: list[list[LayerPlan]] = []
    for lp in layers:
        key = (lp.kind, lp.role, lp.stage, lp.strategy, lp.dp)
        if runs and (runs[-1][0].kind, runs[-1][0].role, runs[-1][0].stage, runs[-1][0].strategy,
                     runs[-1][0].dp) == key:
            runs[-1].append(lp)
        else:
            runs.append([lp])
    return runs


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _run_name(run: list[LayerPlan]) -> str:
    """``blocks.0–31 ×32`` for a run, the plain name for a single layer."""
    if len(run) == 1:
        return run[0].name
    a, b = _NUMBERED.match(run[0].name), _NUMBERED.match(run[-1].name)
    if a and b and a.group(1) == b.group(1):
        return f"{a.group(1)}{a.group(2)}–{b.group(2)} ×{len(run)}"
    return f"{run[0].name}–{run[-1].name} ×{len(run)}"


def _ranks(ranks) -> str:
    """(0, 1, 2, 3, 6) -> '0–3,6'."""
    ranks = list(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}–{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 10 else f"{s:.2f} s"


def _signed_ms(s: float) -> str:
    return f"{s * 1e3:+.2f} ms"


def _signed_bytes(b: int) -> str:
    return ("+" if b >= 0 else "-") + fmt_bytes(abs(b))


def _opt_bytes(b: int | None) -> str:
    return "-" if b is None else fmt_bytes(b)


def _pct(x: float, budget: float) -> str:
    return f"{x / budget * 100:.0f}%" if budget else "-"


def _short_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str) and len(v) > 24 and re.fullmatch(r"[0-9a-f]+", v):
        return v[:12]
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _norm_label(s: str) -> str:
    return s.strip().lower().replace("·", ".").replace(" ", "")


def _find_alternative(lp: LayerPlan, which: str | LayerStrategy) -> Alternative:
    for a in lp.alternatives:
        if (isinstance(which, LayerStrategy) and a.strategy == which) or (
                isinstance(which, str) and _norm_label(a.strategy.short()) == _norm_label(which)):
            return a
    label = which.short() if isinstance(which, LayerStrategy) else which
    kept = ", ".join(a.strategy.short() for a in lp.alternatives) or "none"
    if isinstance(which, LayerStrategy) and which == lp.strategy or label == lp.strategy.short():
        raise ConfigError(f"{label} is the strategy chosen for {lp.name}, not an alternative; "
                          f"alternatives kept: {kept}")
    raise ConfigError(f"{label} is not among the alternatives kept for layer {lp.name} (kept: {kept}); "
                      "re-run `galvatron-fx plan` with more alternatives kept to compare others")


assert set(_TOP_KEYS) | set(_OPTIONAL_TOP_KEYS) == {f.name for f in dataclasses.fields(ParallelPlan)}, \
    "JSON keys out of sync"
