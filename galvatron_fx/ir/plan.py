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
    Every number is checked against the sane ranges of :mod:`galvatron_fx.cluster.limits` (see
    :mod:`galvatron_fx.ir.plan_schema`, which parses the JSON form and checks the invariants).

Units
    Per-layer times are seconds per training step on one rank of the layer's stage; memory is
    bytes per rank (see :mod:`galvatron_fx.ir.plan_records`).

JSON (schema_version 1)
    ``{"schema_version", "model", "graph_hash", "cluster_hash", "world_size", "pp",
    "num_microbatches", "schedule", "virtual_stages", "global_batch_size", "micro_batch_size",
    "stage_boundaries": [int], "stage_ranks": [[int]], "stage_devices": [str] (optional: the device
    kind of each stage on a heterogeneous cluster), "precision",
    "layers": [{"name", "kind", "role", "stage", "dp", "strategy": {"tp", "sp", "dp_type",
    "recompute"}, "placements": {node: str}, "predicted": {"fwd_s", "bwd_s", "comm_s",
    "transition_s", "memory_bytes", "memory_breakdown"}, "alternatives": [{"strategy", "predicted",
    "reason"}], "collectives": [...] (optional), "labels": {node: name} (optional: parameters and
    the ops reading them, by name within the layer)}],
    "predicted": {"step_time_s", "throughput_samples_s", "peak_memory_bytes": [int per stage],
    "memory_budget_bytes", "bubble_fraction", "breakdown": {str: float},
    "reserved_peak_bytes": [int per stage] (optional), "stage_budget_bytes": [int per stage]
    (optional: each stage's device budget on a heterogeneous cluster)},
    "solver_stats": {"search_s", ...}, "baseline": {"name", "step_time_s"} | null, "notes": [str],
    "cluster": {the cluster's JSON} (optional), "graph": {"params": [[name, shape, dtype]],
    "inputs": [[shape past the batch, dtype]]} (optional), "grad_comm": {"reduce_dtype",
    "powersgd_rank", "powersgd_start_step"} (optional: absent means fp32 sums, no compression —
    :class:`~galvatron_fx.ir.grad_comm.GradComm`)}``

A plan is bound to its model graph and cluster: ``graph_hash`` (see :func:`graph_hash`; the batch
is not part of it) is checked by ``compile(plan=...)``, which names the first differing layer, and
``cluster`` (the description planned for) and ``graph`` (parameter and input shapes) let a
mismatch be reported by the field or parameter that differs.

Modules: the per-layer records live in :mod:`~galvatron_fx.ir.plan_records`, JSON parsing and the
invariants in :mod:`~galvatron_fx.ir.plan_schema`, ``explain`` / ``diff`` formatting in
:mod:`~galvatron_fx.ir.plan_report`; all public names are importable from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import galvatron_fx.ir.plan_report as plan_report
from galvatron_fx.cluster import limits
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.grad_comm import GradComm
from galvatron_fx.ir.plan_records import Alternative, Baseline, LayerPlan, LayerPrediction, PlanPrediction, SearchStats
from galvatron_fx.ir.plan_report import _short_value
from galvatron_fx.ir.plan_schema import (
    _OPTIONAL_TOP_KEYS,
    _REPLAN,
    _TOP_KEYS,
    SCHEMA_VERSION,
    _check_invariants,
    _FieldError,
    _InvalidPlan,
    _parse_plan,
    _problems_message,
)
from galvatron_fx.ir.strategy import LayerStrategy

if TYPE_CHECKING:
    from galvatron_fx.cluster import Cluster
    from galvatron_fx.ir.graph import ModelGraph

__all__ = [
    "SCHEMA_VERSION", "Alternative", "LayerPlan", "LayerPrediction", "ParallelPlan", "PlanPrediction",
    "cluster_hash", "graph_hash",
]

logger = logging.getLogger(__name__)


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
    # heterogeneous clusters: the device kind each stage runs on ("A+B" where it spans kinds);
    # empty on clusters of one kind and in plans written before it was recorded
    stage_devices: tuple[str, ...] = ()
    precision: str = "fp32"
    layers: tuple[LayerPlan, ...]
    predicted: PlanPrediction
    solver_stats: SearchStats = field(default_factory=SearchStats)
    baseline: Baseline | None = None
    notes: tuple[str, ...] = ()
    cluster: dict[str, Any] | None = None
    graph: dict[str, Any] | None = None
    grad_comm: GradComm = GradComm()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "stage_boundaries", tuple(self.stage_boundaries))
        set_(self, "stage_ranks", tuple(tuple(r) for r in self.stage_ranks))
        set_(self, "stage_devices", tuple(self.stage_devices))
        set_(self, "layers", tuple(self.layers))
        set_(self, "solver_stats", SearchStats.of(self.solver_stats))  # (a dict is read as its record)
        set_(self, "baseline", None if self.baseline is None else Baseline.of(self.baseline))
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
            "stage_ranks": [list(r) for r in self.stage_ranks],
            **({"stage_devices": list(self.stage_devices)} if self.stage_devices else {}),
            "precision": self.precision,
            "layers": [lp.to_dict() for lp in self.layers], "predicted": self.predicted.to_dict(),
            "solver_stats": self.solver_stats.to_dict(),
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "notes": list(self.notes),
            **({} if self.cluster is None else {"cluster": json.loads(json.dumps(self.cluster))}),
            **({} if self.graph is None else {"graph": json.loads(json.dumps(self.graph))}),
            **({} if self.grad_comm.lossless else {"grad_comm": self.grad_comm.to_dict()}),
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
        if path.is_dir():
            raise ConfigError(f"{str(path)!r} is a directory; give the plan a file name (e.g. {str(path / 'plan.json')!r})")
        if not path.parent.is_dir():
            raise ConfigError(f"cannot write the plan to {str(path)!r}: its directory {str(path.parent)!r} does not exist")
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
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        logger.info("saved plan %s to %s", self.plan_hash()[:12], path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> ParallelPlan:
        """Read and check a plan file written by :meth:`save`."""
        p = Path(path)
        try:
            text = limits.read_text(p, what="plan file")
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
                f"for {world_size} devices (`galvatron-fx plan` on a cluster of {world_size}: --cluster, --nodes) "
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


    # ---- diff and explain (formatting in galvatron_fx.ir.plan_report) ---------------------
    def diff_dict(self, other: ParallelPlan) -> dict:
        """What changed from ``self`` to ``other``, as JSON-able ``[old, new]`` pairs; ``{}`` when
        the plans agree on everything but ``solver_stats`` and ``notes``.

        Keys (only those that changed): ``"plan"`` {field: [old, new]}, ``"layers"``
        {name: {"strategy" | "stage" | "dp" | "placements" | "time_s" | "memory_bytes": [old, new]}},
        ``"added_layers"``, ``"removed_layers"``, ``"predicted"`` {field: [old, new]}.
        """
        return plan_report.diff_dict(self, other)

    def diff(self, other: ParallelPlan) -> str:
        """A readable account of :meth:`diff_dict`; ``"plans are identical"`` when it is empty."""
        return plan_report.diff(self, other)

    def explain(self, layer: str | None = None, alternative: str | LayerStrategy | None = None) -> str:
        """A report for practitioners.

        With no arguments: header, per-layer table (runs of identical layers collapsed into one
        row such as ``blocks.0–31 ×32``), stage layout with ranks, predictions against the memory
        budget, the baseline comparison and solver statistics. With ``layer``: that layer's chosen
        strategy beside its alternatives and why each lost; ``alternative`` (a ``short()`` label
        such as ``"tp4·zero3"`` — ``"tp4.zero3"`` works too — or a ``LayerStrategy``) picks one.
        """
        return plan_report.explain(self, layer, alternative)

    def chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write this plan's predicted step as a Chrome trace (``chrome://tracing``, Perfetto):
        one row per pipeline stage, one event per forward or backward of a micro-batch. See
        :mod:`galvatron_fx.report.trace`."""
        from galvatron_fx.report.trace import write_chrome_trace

        return write_chrome_trace(self, path)

    def report(self, path: str | os.PathLike, run: str | os.PathLike | None = None) -> Path:
        """Write this plan as one self-contained HTML page (strategy per layer, memory per rank,
        pipeline timeline, communication per group); ``run``: a training run's directory, for
        predicted against measured. See :mod:`galvatron_fx.report.html`."""
        from galvatron_fx.report import html as report_html

        return report_html.write(self, path, run)


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
    for i, (pk, mk) in enumerate(zip(pc, mc)):
        if pk != mk:
            if pk == i:
                return (f"{head}: layer {mine[i].name!r} has its own structure in the plan, the structure of "
                        f"{mine[mk].name!r} in this model; {fix}")
            return (f"{head}: layer {mine[i].name!r} repeats {theirs[pk].name!r} in the plan but not in this model "
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




assert set(_TOP_KEYS) | set(_OPTIONAL_TOP_KEYS) == {f.name for f in dataclasses.fields(ParallelPlan)}, \
    "JSON keys out of sync"
