"""The JSON schema of a :class:`~galvatron_fx.ir.plan.ParallelPlan`: parsing its JSON form into
constructor arguments, and the cross-field invariants every plan must satisfy.

Contract
    ``_parse_plan(data)`` returns the keyword arguments of ``ParallelPlan(...)`` built from plain
    JSON, or raises ``_FieldError(field, problem)`` at the first bad key, type, enum value or
    out-of-range number. ``_check_invariants(plan)`` returns every broken cross-field rule of a
    built plan as ``(field, problem)`` pairs (empty when sound); ``ParallelPlan.__post_init__``
    raises ``_InvalidPlan`` with them, and ``_problems_message`` turns them into one user-facing
    message that says what to try.

Terms
    *field*: a path into the JSON form, such as ``layers[3].strategy.tp`` or
    ``predicted.peak_memory_bytes[1]``.

Ranges
    Every number is checked against the sane ranges of :mod:`galvatron_fx.cluster.limits` (world size and
    degrees ≤ 2**20, batches ≤ 2**30, bytes ≤ 2**60, times ≤ 1e12 s), so that an absurd value is a
    ``ConfigError`` naming the field, never work or arithmetic proportional to it.

Algorithm
    Parsing walks the schema top-down and stops at the first bad field (later fields may depend
    on it). The invariant check first checks the scalars (schema version, ranges, enum values);
    only when they are sane does it check the rules that use them (stage boundaries, stage ranks,
    per-layer dp × tp against the stage's devices, batch arithmetic, predictions), collecting all
    problems.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from galvatron_fx.cluster import limits
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.grad_comm import (
    DEFAULT_POWERSGD_START,
    MAX_POWERSGD_RANK,
    MAX_POWERSGD_START,
    REDUCE_DTYPES,
    GradComm,
)
from galvatron_fx.ir.graph import LayerRole
from galvatron_fx.ir.placements import PLACEMENT_HELP, placement_problem
from galvatron_fx.ir.plan_records import Alternative, CollectiveRecord, LayerPlan, LayerPrediction, PlanPrediction
from galvatron_fx.ir.plan_report import _ranks
from galvatron_fx.ir.strategy import DPType, LayerStrategy, Recompute, SPMode

if TYPE_CHECKING:
    from galvatron_fx.ir.plan import ParallelPlan

SCHEMA_VERSION = 1
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
PRECISIONS = ("fp32", "bf16", "fp16")
_REPLAN = "re-run `galvatron-fx plan` to make a new plan"


class _InvalidPlan(ConfigError):
    """Raised by ``ParallelPlan.__post_init__``; carries the (field, problem) list."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "plan") -> None:
        self.problems = problems
        super().__init__(_problems_message(source, problems))


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
    if not isinstance(plan.grad_comm, GradComm):
        pr.append(("grad_comm", f"must be a GradComm, got {type(plan.grad_comm).__name__}"))
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
    # stage devices (heterogeneous clusters; optional): one device kind name per stage
    if plan.stage_devices and len(plan.stage_devices) != pp:
        pr.append(("stage_devices", f"has {len(plan.stage_devices)} entries, expected one per stage ({pp})"))
    for s, kind in enumerate(plan.stage_devices):
        if not isinstance(kind, str) or not kind:
            pr.append((f"stage_devices[{s}]", f"= {kind!r} must name the stage's device kind"))
    # layers
    chunk_of = [0] * n
    if not any(f.startswith("stage_boundaries") for f, _ in pr):
        for c, chunk in enumerate(plan.chunk_layers()):
            for i in chunk:
                chunk_of[i] = c
    names: set[str] = set()
    max_dp = 0
    for i, lp in enumerate(plan.layers):
        at = f"layers[{i}]"
        if lp.name in names:
            pr.append((f"{at}.name", f"= {lp.name!r} is used by an earlier layer too"))
        names.add(lp.name)
        for node, pl in lp.placements.items():
            if (problem := placement_problem(pl)) is not None:
                first = not any(".placements[" in f for f, _ in pr)
                pr.append((f"{at}.placements[{node!r}]", f"= {pl!r} (layer {lp.name}, node {node}) {problem}"
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
    if pd.stage_budget_bytes and len(pd.stage_budget_bytes) != pp:
        pr.append(("predicted.stage_budget_bytes",
                   f"has {len(pd.stage_budget_bytes)} entries, expected one per stage ({pp})"))
    if pd.reserved_peak_bytes and len(pd.reserved_peak_bytes) != pp:
        pr.append(("predicted.reserved_peak_bytes",
                   f"has {len(pd.reserved_peak_bytes)} entries, expected one per stage ({pp})"))
    for s, nbytes in enumerate(pd.peak_memory_bytes):
        if (problem := limits.BYTES.problem(nbytes)) is not None:
            pr.append((f"predicted.peak_memory_bytes[{s}]", problem))
    for k, secs in pd.breakdown.items():
        if (problem := _SIGNED_SECONDS.problem(secs)) is not None:
            pr.append((f"predicted.breakdown.{k}", problem))
    if "search_s" not in plan.solver_stats or not _is_num(plan.solver_stats["search_s"]):
        pr.append(("solver_stats.search_s", "is missing or not a number (seconds the search took)"))
    if plan.baseline is not None and (not isinstance(plan.baseline.get("name"), str)
                                      or not _is_num(plan.baseline.get("step_time_s"))):
        pr.append(("baseline", "needs a string 'name' and a number 'step_time_s', or null"))
    for f in ("solver_stats", "baseline"):
        try:
            value = getattr(plan, f)
            json.dumps(None if value is None else value.to_dict(), allow_nan=False)
        except (TypeError, ValueError) as e:
            pr.append((f, f"is not plain JSON: {e}"))
    return pr


def _check_prediction(p: LayerPrediction, at: str) -> list[tuple[str, str]]:
    pr = []
    for f in ("fwd_s", "bwd_s", "comm_s", "transition_s", "optimizer_s"):
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
_OPTIONAL_TOP_KEYS = ("cluster", "graph", "grad_comm", "stage_devices")
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
    d = _obj(v, at, ("tp", "sp", "dp_type", "recompute"), optional=("offload",))
    tp = _int(d["tp"], f"{at}.tp", rng=limits.DEGREE)
    sp = _str(d["sp"], f"{at}.sp", tuple(SPMode))
    dpt = _str(d["dp_type"], f"{at}.dp_type", tuple(DPType))
    rc = _str(d["recompute"], f"{at}.recompute", tuple(Recompute))
    offload = d.get("offload", False)
    if not isinstance(offload, bool):
        raise _FieldError(f"{at}.offload", f"must be true or false, got {_jtype(offload)} {offload!r}")
    try:
        return LayerStrategy(tp=tp, sp=SPMode(sp), dp_type=DPType(dpt), recompute=Recompute(rc), offload=offload)
    except ValueError as e:
        raise _FieldError(at, f"is impossible: {e}") from None


def _parse_layer_prediction(v: Any, at: str) -> LayerPrediction:
    d = _obj(v, at, _LPRED_KEYS, optional=("optimizer_s", "stage_bytes", "host_bytes"))
    return LayerPrediction(
        host_bytes=_int(d.get("host_bytes", 0), f"{at}.host_bytes", lo=0, rng=limits.BYTES),
        optimizer_s=_num(d.get("optimizer_s", 0.0), f"{at}.optimizer_s"),
        stage_bytes=None if d.get("stage_bytes") is None else _int(d["stage_bytes"], f"{at}.stage_bytes", lo=0,
                                                                   rng=limits.BYTES),
        fwd_s=_num(d["fwd_s"], f"{at}.fwd_s"), bwd_s=_num(d["bwd_s"], f"{at}.bwd_s"),
        comm_s=_num(d["comm_s"], f"{at}.comm_s"), transition_s=_num(d["transition_s"], f"{at}.transition_s"),
        memory_bytes=_int(d["memory_bytes"], f"{at}.memory_bytes", lo=0, rng=limits.BYTES),
        memory_breakdown=_dict_of(d["memory_breakdown"], f"{at}.memory_breakdown",
                                  lambda x, a: _int(x, a, lo=0, rng=limits.BYTES)),
    )


def _parse_collective(v: Any, at: str) -> CollectiveRecord:
    d = _obj(v, at, ("phase", "op", "group_size", "bytes"), optional=("axis",))
    return CollectiveRecord(phase=_str(d["phase"], f"{at}.phase", ("fwd", "bwd", "step")),
                            op=_str(d["op"], f"{at}.op", ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")),
                            group_size=_int(d["group_size"], f"{at}.group_size", rng=limits.DEGREE),
                            bytes=_int(d["bytes"], f"{at}.bytes", lo=0, rng=limits.BYTES),
                            axis=_str(d["axis"], f"{at}.axis", ("tp", "dp")) if "axis" in d else "")


def _parse_layer(v: Any, at: str) -> LayerPlan:
    d = _obj(v, at, _LAYER_KEYS, optional=("collectives", "labels"))
    alts = []
    for j, a in enumerate(_list(d["alternatives"], f"{at}.alternatives")):
        aat = f"{at}.alternatives[{j}]"
        ad = _obj(a, aat, ("strategy", "predicted", "reason"), optional=("layout", "transition_out_s"))
        alts.append(Alternative(strategy=_parse_strategy(ad["strategy"], f"{aat}.strategy"),
                                predicted=_parse_layer_prediction(ad["predicted"], f"{aat}.predicted"),
                                reason=_str(ad["reason"], f"{aat}.reason"),
                                layout=_str(ad.get("layout", ""), f"{aat}.layout"),
                                transition_out_s=_num(ad.get("transition_out_s", 0.0), f"{aat}.transition_out_s")))
    return LayerPlan(
        name=_str(d["name"], f"{at}.name"), kind=_str(d["kind"], f"{at}.kind"),
        role=LayerRole(_str(d["role"], f"{at}.role", tuple(LayerRole))),
        stage=_int(d["stage"], f"{at}.stage", lo=0, rng=_INDEX), dp=_int(d["dp"], f"{at}.dp", rng=limits.DEGREE),
        strategy=_parse_strategy(d["strategy"], f"{at}.strategy"),
        placements=_dict_of(d["placements"], f"{at}.placements", _str),
        predicted=_parse_layer_prediction(d["predicted"], f"{at}.predicted"),
        alternatives=tuple(alts),
        collectives=tuple(_parse_collective(c, f"{at}.collectives[{j}]")
                          for j, c in enumerate(_list(d.get("collectives", []), f"{at}.collectives"))),
        labels=_dict_of(d.get("labels", {}), f"{at}.labels", _str),
    )


def _parse_plan(data: Any) -> dict[str, Any]:
    """Constructor arguments from the JSON form; raises ``_FieldError`` on the first bad field."""
    if isinstance(data, dict) and "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        raise _FieldError("schema_version", f"is {data['schema_version']!r}; this galvatron_fx reads plans of "
                                            f"schema {SCHEMA_VERSION}")
    d = _obj(data, "", _TOP_KEYS, optional=_OPTIONAL_TOP_KEYS)
    for key in ("cluster", "graph", "grad_comm"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise _FieldError(key, f"must be a JSON object or absent, got {_jtype(d[key])}")
    pd = _obj(d["predicted"], "predicted", _PRED_KEYS, optional=("reserved_peak_bytes", "tensor_budget_bytes", "model_flops", "peak_flops", "mfu",
                                                                 "compute_density", "host_memory_bytes",
                                                                 "host_node_bytes", "host_budget_bytes",
                                                                 "stage_budget_bytes"))
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
        "stage_devices": tuple(_str(x, f"stage_devices[{s}]")
                               for s, x in enumerate(_list(d.get("stage_devices", []), "stage_devices"))),
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
            reserved_peak_bytes=tuple(
                _int(x, f"predicted.reserved_peak_bytes[{s}]", lo=0, rng=limits.BYTES)
                for s, x in enumerate(_list(pd.get("reserved_peak_bytes", []), "predicted.reserved_peak_bytes"))),
            tensor_budget_bytes=None if pd.get("tensor_budget_bytes") is None else _int(
                pd["tensor_budget_bytes"], "predicted.tensor_budget_bytes", lo=0, rng=limits.BYTES),
            model_flops=None if pd.get("model_flops") is None else _num(pd["model_flops"], "predicted.model_flops"),
            peak_flops=None if pd.get("peak_flops") is None else _num(pd["peak_flops"], "predicted.peak_flops"),
            mfu=None if pd.get("mfu") is None else _num(pd["mfu"], "predicted.mfu"),
            compute_density=tuple(_num(x, f"predicted.compute_density[{s}]") for s, x in
                                  enumerate(_list(pd.get("compute_density", []), "predicted.compute_density"))),
            host_memory_bytes=tuple(_int(x, f"predicted.host_memory_bytes[{s}]", lo=0, rng=limits.BYTES) for s, x in
                                    enumerate(_list(pd.get("host_memory_bytes", []), "predicted.host_memory_bytes"))),
            host_node_bytes=tuple(_int(x, f"predicted.host_node_bytes[{n}]", lo=0, rng=limits.BYTES) for n, x in
                                  enumerate(_list(pd.get("host_node_bytes", []), "predicted.host_node_bytes"))),
            host_budget_bytes=None if pd.get("host_budget_bytes") is None else _int(
                pd["host_budget_bytes"], "predicted.host_budget_bytes", lo=0, rng=limits.BYTES),
            stage_budget_bytes=tuple(_int(x, f"predicted.stage_budget_bytes[{s}]", lo=1, rng=limits.BYTES) for s, x in
                                     enumerate(_list(pd.get("stage_budget_bytes", []), "predicted.stage_budget_bytes"))),
        ),
        "solver_stats": dict(d["solver_stats"]),
        "baseline": baseline,
        "notes": tuple(_str(x, f"notes[{i}]") for i, x in enumerate(_list(d["notes"], "notes"))),
        "cluster": d.get("cluster"), "graph": d.get("graph"),
        **({"grad_comm": _parse_grad_comm(d["grad_comm"])} if "grad_comm" in d else {}),
    }


def _parse_grad_comm(v: Any) -> GradComm:
    """The optional ``grad_comm`` object: a reduce dtype and a PowerSGD rank (0: none)."""
    at = "grad_comm"
    g = _obj(v, at, (), ("reduce_dtype", "powersgd_rank", "powersgd_start_step"))
    dtype = _str(g.get("reduce_dtype", "float32"), f"{at}.reduce_dtype", REDUCE_DTYPES)
    rank = _int(g.get("powersgd_rank", 0), f"{at}.powersgd_rank", lo=0,
                rng=limits.Range(0, MAX_POWERSGD_RANK, "rank"))
    start = _int(g.get("powersgd_start_step", DEFAULT_POWERSGD_START), f"{at}.powersgd_start_step", lo=0,
                 rng=limits.Range(0, MAX_POWERSGD_START, "steps"))
    return GradComm(reduce_dtype=dtype, powersgd_rank=rank, powersgd_start_step=start)
