"""Readable reports of a :class:`~galvatron_fx.ir.plan.ParallelPlan`: ``explain`` (the whole plan,
or one layer beside its alternatives) and ``diff`` / ``diff_dict`` (what changed between two plans).

Contract
    Pure functions of frozen plans; they return text (or, for :func:`diff_dict`, JSON-able
    ``[old, new]`` pairs) and change nothing. ``ParallelPlan.explain``, ``.diff`` and
    ``.diff_dict`` delegate here.

Terms
    *run*: consecutive layers of one kind, role, stage, strategy and dp, shown as one row
    (``blocks.0–31 ×32``).

Algorithm
    ``diff_dict`` compares the plans' JSON forms field by field (top-level fields, then layers by
    name, then predictions); ``diff`` renders that as a table. ``explain`` groups layers into runs,
    then lists stages with their ranks (and, on a heterogeneous cluster, device kind and own
    budget) and peak memory against the budget, predictions, the baseline and solver statistics.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.plan_records import Alternative, LayerPlan, LayerPrediction, PlanPrediction
from galvatron_fx.ir.strategy import LayerStrategy
from galvatron_fx.report.fmt import fmt_bytes, fmt_count, fmt_seconds, format_table

if TYPE_CHECKING:
    from galvatron_fx.ir.plan import ParallelPlan

_DIFF_FIELDS = ("model", "graph_hash", "cluster_hash", "world_size", "pp", "num_microbatches", "schedule",
                "virtual_stages", "global_batch_size", "micro_batch_size", "stage_boundaries", "stage_ranks",
                "precision")


# ---- diff -----------------------------------------------------------------------------------


def diff_dict(plan: ParallelPlan, other: ParallelPlan) -> dict:
    """What changed from ``plan`` to ``other``, as JSON-able ``[old, new]`` pairs; ``{}`` when
    the plans agree on everything but ``solver_stats`` and ``notes``.

    Keys (only those that changed): ``"plan"`` {field: [old, new]}, ``"layers"``
    {name: {"strategy" | "stage" | "dp" | "placements" | "time_s" | "memory_bytes": [old, new]}},
    ``"added_layers"``, ``"removed_layers"``, ``"predicted"`` {field: [old, new]}.
    """
    out: dict[str, Any] = {}
    a, b = plan.to_dict(), other.to_dict()
    top = {k: [a[k], b[k]] for k in _DIFF_FIELDS if a[k] != b[k]}
    if top:
        out["plan"] = top
    mine = {lp.name: lp for lp in plan.layers}
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
    pred = {k: [pa.get(k), pb.get(k)] for k in {**pa, **pb} if pa.get(k) != pb.get(k)}
    if pred:
        out["predicted"] = pred
    if a["baseline"] != b["baseline"]:
        out.setdefault("plan", {})["baseline"] = [a["baseline"], b["baseline"]]
    if plan.grad_comm != other.grad_comm:
        out.setdefault("plan", {})["grad_comm"] = [plan.grad_comm.short(), other.grad_comm.short()]
    return out


def diff(plan: ParallelPlan, other: ParallelPlan) -> str:
    """A readable account of :meth:`diff_dict`; ``"plans are identical"`` when it is empty."""
    d = diff_dict(plan, other)
    if not d:
        return "plans are identical"
    lines = [f"plan {plan.model} {plan.plan_hash()[:8]} -> {other.model} {other.plan_hash()[:8]}"]
    for k, (old, new) in d.get("plan", {}).items():
        lines.append(f"  {k}: {_human(k, old)} -> {_human(k, new)}")
    if "layers" in d:
        lines.append(f"layers ({len(d['layers'])} changed of {len(plan.layers)}):")
        rows = []
        for name, ch in d["layers"].items():
            la, lb = plan.layer(name), other.layer(name)
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
        pa, pb = plan.predicted, other.predicted
        lines.append("predicted:")
        if pa.step_time_s != pb.step_time_s:
            rel = (pb.step_time_s / pa.step_time_s - 1) * 100 if pa.step_time_s else float("inf")
            lines.append(f"  step time: {fmt_seconds(pa.step_time_s)} -> {fmt_seconds(pb.step_time_s)} ({rel:+.1f}%)")
        if pa.throughput_samples_s != pb.throughput_samples_s:
            lines.append(f"  throughput: {pa.throughput_samples_s:.1f} -> {pb.throughput_samples_s:.1f} samples/s")
        if pa.peak_memory_bytes != pb.peak_memory_bytes:
            for s in range(max(len(pa.peak_memory_bytes), len(pb.peak_memory_bytes))):
                old = pa.peak_memory_bytes[s] if s < len(pa.peak_memory_bytes) else None
                new = pb.peak_memory_bytes[s] if s < len(pb.peak_memory_bytes) else None
                if old != new:
                    lines.append(f"  peak memory stage {s}: {_opt_bytes(old)} -> {_opt_bytes(new)}"
                                 + (f" ({_signed_bytes(new - old)})" if old is not None and new is not None else ""))
        for k, (old, new) in d["predicted"].items():
            if k in ("step_time_s", "throughput_samples_s", "peak_memory_bytes"):
                continue
            if k == "breakdown" and isinstance(old, dict) and isinstance(new, dict):
                parts = [f"{n} {fmt_seconds(old.get(n, 0.0))} -> {fmt_seconds(new.get(n, 0.0))}" for n in {**old, **new}
                         if old.get(n) != new.get(n)]
                lines.append("  step breakdown: " + ", ".join(parts))
            else:
                lines.append(f"  {k.replace('_', ' ')}: {_human(k, old)} -> {_human(k, new)}")
    return "\n".join(lines)


# ---- explain --------------------------------------------------------------------------------


def explain(plan: ParallelPlan, layer: str | None = None, alternative: str | LayerStrategy | None = None) -> str:
    """A report for practitioners.

    With no arguments: header, per-layer table (runs of identical layers collapsed into one
    row such as ``blocks.0–31 ×32``), stage layout with ranks, predictions against the memory
    budget, the baseline comparison and solver statistics. With ``layer``: that layer's chosen
    strategy beside its alternatives and why each lost; ``alternative`` (a ``short()`` label
    such as ``"tp4·zero3"`` — ``"tp4.zero3"`` works too — or a ``LayerStrategy``) picks one.
    """
    if layer is not None:
        return _explain_layer(plan, layer, alternative)
    if alternative is not None:
        raise ConfigError("explain(alternative=...) needs a layer name too: explain('blocks.3', 'tp4·ddp')")
    return _explain_plan(plan)


# what a step spends beyond its compute, by the name explain gives it (PlanPrediction.breakdown's keys)
LOSSES = (("bubble", "pipeline bubble"), ("comm", "exposed communication"), ("transition", "resharding between layers"),
          ("recompute", "recomputation"), ("optimizer", "optimizer step"))


def efficiency_losses(p: PlanPrediction) -> list[tuple[str, float]]:
    """The step's losses of efficiency (:data:`LOSSES` present in the breakdown), largest first."""
    return sorted(((name, float(p.breakdown[k])) for k, name in LOSSES if p.breakdown.get(k, 0.0) > 0),
                  key=lambda kv: -kv[1])


def host_memory_line(plan) -> str:
    """CPU offload's host memory: per stage on one rank, per node against the host budget, and
    which layers offload (why: the stage did not fit its device without)."""
    p = plan.predicted
    budget = p.host_budget_bytes
    nodes = p.host_node_bytes
    per_node = (f"; per node {fmt_bytes(max(nodes))}" + (f" of {fmt_bytes(budget)} host budget ({_pct(max(nodes), budget)})"
                                                          if budget else "")) if nodes else ""
    n = sum(lp.strategy.offload for lp in plan.layers)
    return (f"  host memory (CPU offload of {n} of {len(plan.layers)} layers, taken where a stage fits its "
            f"device no other way): per rank " + ", ".join(f"stage {s} {fmt_bytes(b)}" for s, b in
                                                           enumerate(p.host_memory_bytes)) + per_node)


def efficiency_line(p: PlanPrediction) -> str | None:
    """``efficiency: MFU 38.2%, compute density 81% (stage 0) ...; largest loss: ...``, or None
    for a plan written before efficiency was predicted."""
    if p.mfu is None and not p.compute_density:
        return None
    parts = []
    if p.mfu is not None:
        parts.append(f"MFU {p.mfu * 100:.1f}%" + (f" ({fmt_count(p.model_flops)}FLOP per step over "
                                                   f"{fmt_count(p.peak_flops)}FLOP/s of peak)"
                                                   if p.model_flops is not None and p.peak_flops else ""))
    if p.compute_density:
        parts.append("compute density " + ", ".join(f"{d * 100:.0f}% (stage {s})" for s, d in enumerate(p.compute_density)))
    losses = efficiency_losses(p)
    text = "efficiency: " + ", ".join(parts)
    if losses and p.step_time_s > 0:
        text += "; largest loss: " + ", then ".join(
            f"{name} {fmt_seconds(t)} ({t / p.step_time_s * 100:.0f}% of the step)" for name, t in losses[:2])
    return text


def _nodes(plan: ParallelPlan) -> str:
    """`` (2 nodes × 4)`` when the plan's cluster has several nodes."""
    cluster = plan.cluster or {}
    n, per = cluster.get("num_nodes", 1), cluster.get("devices_per_node", plan.world_size)
    return f" ({n} nodes × {per})" if isinstance(n, int) and n > 1 else ""


def _explain_plan(plan: ParallelPlan) -> str:
    p = plan.predicted
    budget = p.memory_budget_bytes
    shapes = sorted({(lp.dp, lp.strategy.tp) for lp in plan.layers}, key=lambda x: (-x[0], x[1]))
    if len(shapes) == 1:
        layout = f"pp{plan.pp} × dp{shapes[0][0]} × tp{shapes[0][1]}"
    else:
        layout = f"pp{plan.pp} × per layer (" + ", ".join(f"dp{d}×tp{t}" for d, t in shapes) + ")"
    sched = plan.schedule + (f" ×{plan.virtual_stages} chunks/stage" if plan.virtual_stages > 1 else "")
    out = [
        f"plan for {plan.model} on {plan.world_size} devices{_nodes(plan)} in {plan.precision}"
        f"{'' if plan.grad_comm.lossless else f' (gradient sums {plan.grad_comm.short()})'}: {layout}",
        f"  schedule {sched}, {plan.num_microbatches} micro-batches, global batch {plan.global_batch_size} "
        f"(micro-batch {plan.micro_batch_size} per data-parallel rank)",
        *([f"  {plan.grad_comm.describe()}"] if not plan.grad_comm.lossless else []),
        f"  graph {plan.graph_hash[:12]}  cluster {plan.cluster_hash[:12]}  plan {plan.plan_hash()[:12]}",
        "",
    ]
    # ---- per-layer table, runs of identical layers collapsed
    rows = []
    for run in layer_runs(plan.layers):
        first = run[0]
        n = len(run)
        def mean(f: str, run=run, n=n) -> float:
            return sum(getattr(lp.predicted, f) for lp in run) / n

        mem = max(lp.predicted.memory_bytes for lp in run)
        rows.append([
            run_name(run), str(first.stage), first.strategy.short(), f"{first.dp}",
            f"{mean('fwd_s') * 1e3:.2f}", f"{mean('bwd_s') * 1e3:.2f}",
            f"{mean('comm_s') * 1e3:.2f}", f"{mean('transition_s') * 1e3:.2f}",
            f"{sum(lp.predicted.total_s for lp in run) * 1e3:.2f}",
            f"{fmt_bytes(mem)} ({_pct(mem, p.budget_of(first.stage))})",
        ])
    out.append(f"per layer (ms per step on one rank; memory per rank, % of the {fmt_bytes(budget)} budget):")
    out.append(format_table(
        ["layer", "stage", "strategy", "dp", "fwd ms", "bwd ms", "comm ms", "trans ms", "total ms", "memory/rank"],
        rows, align="lrlrrrrrrr"))
    # ---- stages
    out += ["", f"stages (pp={plan.pp}):"]
    chunks = plan.chunk_layers()
    for s, ranks in enumerate(plan.stage_ranks):
        mine = [c for i, c in enumerate(chunks) if plan.stage_of_chunk(i) == s]
        spans = ", ".join(f"layers {c.start}–{c.stop - 1} ({plan.layers[c.start].name} … "
                          f"{plan.layers[c.stop - 1].name})" for c in mine)
        peak, shown, own = p.peak_memory_bytes[s], p.device_peak_bytes[s], p.budget_of(s)
        flag = "  OVER BUDGET" if shown > own else ""
        tensors = f"tensors {fmt_bytes(peak)}, device {fmt_bytes(shown)}" if p.reserved_peak_bytes else fmt_bytes(peak)
        device = f" on {plan.stage_devices[s]}" if plan.stage_devices else ""
        out.append(f"  stage {s}: ranks {_ranks(ranks)} ({len(ranks)} devices{device}); {spans}; "
                   f"peak {tensors} / {fmt_bytes(own)} budget ({_pct(shown, own)}){flag}")
    out += layout_lines(plan)
    # ---- predictions
    out += ["", "predicted:",
            f"  step time {fmt_seconds(p.step_time_s)}, throughput {p.throughput_samples_s:.1f} samples/s, "
            f"bubble {p.bubble_fraction * 100:.1f}%",
            "  peak memory per stage: " + ", ".join(
                f"{fmt_bytes(m)} ({_pct(m, budget)})" for m in p.peak_memory_bytes)
            + (f" of {fmt_bytes(budget)} budget" if not p.stage_budget_bytes else
               " of their devices' budgets " + ", ".join(map(fmt_bytes, p.stage_budget_bytes)))]
    if p.reserved_peak_bytes and p.reserved_peak_bytes != p.peak_memory_bytes:
        out.append("  device in use at the peak (context, communicator buffers, allocator reserve): "
                   + ", ".join(f"{fmt_bytes(m)} ({_pct(m, budget)})" for m in p.reserved_peak_bytes))
    if p.host_memory_bytes:
        out.append(host_memory_line(plan))
    if p.breakdown:
        out.append("  breakdown: " + ", ".join(f"{k} {fmt_seconds(v)}" for k, v in p.breakdown.items()))
    if (eff := efficiency_line(p)) is not None:
        out.append("  " + eff)
    if plan.baseline:
        name, t = plan.baseline.get("name", "baseline"), plan.baseline.get("step_time_s")
        if isinstance(t, (int, float)) and t > 0 and p.step_time_s > 0:
            out.append(f"  {t / p.step_time_s:.2f}× faster than {name} ({fmt_seconds(t)} per step)")
        else:
            out.append(f"  baseline {name}: {t}")
    if plan.solver_stats:
        out += ["", "solver: " + ", ".join(f"{k}={_short_value(v)}" for k, v in plan.solver_stats.items())]
    if plan.notes:
        out += ["", "notes:"] + [f"  - {n}" for n in plan.notes]
    return "\n".join(out)


_TIE_S = 1e-9
TEMP_STEPS = 32  # the search's layer DP holds temporaries in steps of budget / TEMP_STEPS (outer_search.py)


def verdict(chosen: LayerPrediction, chosen_out_s: float, alt: LayerPrediction, alt_out_s: float,
            budget: int | None) -> str:
    """Why an alternative lost, from the numbers ``explain`` prints: the memory its stage would
    hold against the ``budget`` the search holds stages to, then its time with resharding in and
    out of the chosen neighbours' layouts (``*_out_s``) against the chosen one's."""
    if alt.stage_bytes is not None and budget is not None and alt.stage_bytes > budget:
        return (f"does not fit: its stage would hold {fmt_bytes(alt.stage_bytes)}, "
                f"{fmt_bytes(alt.stage_bytes - budget)} over the {fmt_bytes(budget)} the search holds it to")
    dt = (alt.total_s + alt_out_s) - (chosen.total_s + chosen_out_s)
    own = (alt.total_s - alt.transition_s) - (chosen.total_s - chosen.transition_s)
    reshard = (alt.transition_s + alt_out_s) - (chosen.transition_s + chosen_out_s)
    if dt > _TIE_S:
        if own <= _TIE_S:
            return (f"{_signed_ms(own)} by itself, but resharding to its neighbours' layouts costs "
                    f"{_signed_ms(reshard)}: {_signed_ms(dt)} per step")
        return f"{_signed_ms(dt)} per step"
    if dt >= -_TIE_S:
        return "as fast as the chosen one (a tie: the search kept the one it found first)"
    if alt.stage_bytes is not None and budget is not None and budget - alt.stage_bytes < budget / TEMP_STEPS:
        return (f"{_signed_ms(dt)} per step, but its stage would be only {fmt_bytes(budget - alt.stage_bytes)} under "
                f"the budget: the search rounds temporaries up to 1/{TEMP_STEPS} of it and counted it over")
    return f"{_signed_ms(dt)} per step, yet not taken (a whole-pipeline pass after the layer search chose otherwise)"


def _out_s(plan: ParallelPlan, lp: LayerPlan) -> float:
    """Resharding out of ``lp``'s chosen layout into the next layer's, per step: the next
    layer's transition where it follows in the same chunk, else 0."""
    i = plan.layers.index(lp)
    same_chunk = any(i in rng and i + 1 in rng for rng in plan.chunk_layers())
    return plan.layers[i + 1].predicted.transition_s if same_chunk else 0.0


def _explain_layer(plan: ParallelPlan, name: str, alternative: str | LayerStrategy | None) -> str:
    lp = plan.layer(name)
    alts = list(lp.alternatives)
    if alternative is not None:
        alts = [_find_alternative(lp, alternative)]
    budget = plan.predicted.budget_of(lp.stage)
    held = plan.predicted.tensor_budget_bytes if not plan.predicted.stage_budget_bytes else None
    ranks = plan.stage_ranks[lp.stage]
    device = f" ({plan.stage_devices[lp.stage]})" if plan.stage_devices else ""
    out = [
        f"layer {lp.name} ({lp.role}, kind {lp.kind[:12]}), stage {lp.stage} on ranks {_ranks(ranks)}{device}",
        f"chosen: {lp.strategy.short()} (dp{lp.dp} × tp{lp.strategy.tp}); memory budget {fmt_bytes(budget)} per rank"
        + (f", of which the search holds each stage's tensors to {fmt_bytes(held)} (the rest: the runtime's "
           "context, communicator buffers and allocator reserve)" if held is not None else ""),
        _groups_line(plan, lp),
    ]
    if not lp.alternatives:
        out.append("no alternatives were recorded for this layer (the search kept none, or it had no choice)")
    out_chosen = _out_s(plan, lp)
    cols = [("chosen " + lp.strategy.short(), lp.predicted, out_chosen, "chosen")]
    labels = [lp.strategy.short()] + [a.strategy.short() for a in alts]
    # one strategy at two boundary layouts (a head handing on whole or vocab-sharded logits)
    for a in alts:
        why = a.reason
        # recorded: the verdict of the numbers printed (a heterogeneous plan's stages have budgets
        # of their own, which it does not record: the search's verdict stands)
        if a.predicted.stage_bytes is not None and not plan.predicted.stage_budget_bytes:
            why = verdict(lp.predicted, out_chosen, a.predicted, a.transition_out_s, held)
        cols.append((a.strategy.short() + (f" ({a.layout})" if a.layout and labels.count(a.strategy.short()) > 1
                                           else ""), a.predicted, a.transition_out_s, why))
    keys = []
    for _, pr, _, _ in cols:
        keys += [k for k in pr.memory_breakdown if k not in keys]
    total0 = lp.predicted.total_s + out_chosen
    rows = [
        ["fwd ms"] + [f"{pr.fwd_s * 1e3:.2f}" for _, pr, _, _ in cols],
        ["bwd ms"] + [f"{pr.bwd_s * 1e3:.2f}" for _, pr, _, _ in cols],
        ["comm ms"] + [f"{pr.comm_s * 1e3:.2f}" for _, pr, _, _ in cols],
        ["optimizer ms"] + [f"{pr.optimizer_s * 1e3:.2f}" for _, pr, _, _ in cols],
        ["reshard in ms"] + [f"{pr.transition_s * 1e3:.2f}" for _, pr, _, _ in cols],
        ["reshard out ms"] + [f"{o * 1e3:.2f}" for _, _, o, _ in cols],
        ["total ms/step"] + [f"{(pr.total_s + o) * 1e3:.2f}" for _, pr, o, _ in cols],
        ["vs chosen"] + [_signed_ms(pr.total_s + o - total0) if i else "" for i, (_, pr, o, _) in enumerate(cols)],
        ["memory/rank"] + [fmt_bytes(pr.memory_bytes) for _, pr, _, _ in cols],
    ]
    rows += [[f"  {k}"] + [fmt_bytes(pr.memory_breakdown[k]) if k in pr.memory_breakdown else "-"
                           for _, pr, _, _ in cols] for k in keys]
    if any(pr.stage_bytes is not None for _, pr, _, _ in cols):
        rows.append(["stage holds"] + [fmt_bytes(pr.stage_bytes) if pr.stage_bytes is not None else "-"
                                       for _, pr, _, _ in cols])
    out += ["", format_table([""] + [c for c, _, _, _ in cols], rows, align="l" + "r" * len(cols))]
    if len(cols) > 1:
        out += ["", "why not:"] + [f"  {c}: {r}" for c, _, _, r in cols[1:]]
    out.append("(reshard in/out: moving activations from the previous layer's chosen layout and into the next "
               "one's; stage holds: every layer's parameters, gradients, optimizer state and held activations "
               "on a rank of the stage, plus its largest temporary, with that choice in place)")
    if lp.placements:
        out += ["", *_placements(lp)]
    return "\n".join(out)


_SHOWN_PLACEMENTS = 24


def _placements(lp: LayerPlan) -> list[str]:
    """The layer's placements: its parameters, the ops reading them and the parameters' views by
    name (the decomposed node after it), then the other nodes, up to :data:`_SHOWN_PLACEMENTS`
    lines in all (every parameter and op reading one always)."""
    n = len(lp.placements)
    labels = lp.labels
    named = [k for k in lp.placements if k in labels and not labels[k].startswith("input ")]
    params = [k for k in named if " " not in labels[k]]  # "attn.q_proj.weight"
    ops = [k for k in named if k not in params and not labels[k].endswith(")")]  # "attn.q_proj mm"
    views = [k for k in named if k not in params and k not in ops]  # "attn.q_proj.weight (t)"
    first = params + ops + views
    shown = (first + [k for k in lp.placements if k not in first])[:max(_SHOWN_PLACEMENTS, len(params + ops))]
    width = max(len(lp.labels.get(k, k)) for k in shown)
    pw = max(len(lp.placements[k]) for k in shown)
    lines = [f"placements ({n} node{'s' if n != 1 else ''}; tp placements of inputs -> outputs"
             + ("; parameters and the ops reading them first, by name" if named else "") + "):"]
    for k in shown:
        label = lp.labels.get(k)
        lines.append((f"  {label or k:<{width}}  {lp.placements[k]:<{pw}}" + (f"  [{k}]" if label else "")).rstrip())
    if n > len(shown):
        lines.append(f"  … {n - len(shown)} more (every node: galvatron-fx lower MODEL --plan PLAN --out DIR)")
    return lines


# ---- formatting helpers ---------------------------------------------------------------------


def group_ranks(plan: ParallelPlan, lp: LayerPlan) -> dict[str, list[list[int]]]:
    """The tensor- and data-parallel groups of layer ``lp``: its stage's ranks laid out as a
    ``(dp, tp)`` mesh, tp innermost, as the runtime builds it."""
    ranks = list(plan.stage_ranks[lp.stage])
    tp, dp = lp.strategy.tp, lp.dp
    return {"tp": [ranks[d * tp:(d + 1) * tp] for d in range(dp)],
            "dp": [ranks[t::tp] for t in range(tp)]}


def node_of(plan: ParallelPlan):
    """rank -> the node of the plan's cluster it runs on (ranks fill nodes in order)."""
    per = int((plan.cluster or {}).get("devices_per_node") or plan.world_size)
    return lambda r: r // max(per, 1)


def group_text(plan: ParallelPlan, groups: list[list[int]]) -> tuple[str, bool]:
    """Ranks of the first group (and how many such groups) and whether any crosses a node."""
    node = node_of(plan)
    crosses = any(len({node(r) for r in g}) > 1 for g in groups)
    first = groups[0]
    text = "ranks " + ",".join(map(str, first)) + (f" (+{len(groups) - 1} alike)" if len(groups) > 1 else "")
    return text, crosses


def _groups_line(plan: ParallelPlan, lp: LayerPlan) -> str:
    """``groups: tp ranks 0,1 (+3 alike), intra-node; dp ...`` for the axes of size > 1."""
    groups = group_ranks(plan, lp)
    parts = []
    for ax, size in (("tp", lp.strategy.tp), ("dp", lp.dp)):
        if size > 1:
            text, crosses = group_text(plan, groups[ax])
            parts.append(f"{ax} {text}, {'inter-node' if crosses else 'intra-node'}")
    return "groups: " + ("; ".join(parts) if parts else "none (one rank)")


def layer_runs(layers: tuple[LayerPlan, ...]) -> list[list[LayerPlan]]:
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


def run_name(run: list[LayerPlan]) -> str:
    """``blocks.0–31 ×32`` for a run, the plain name for a single layer."""
    if len(run) == 1:
        return run[0].name
    a, b = _NUMBERED.match(run[0].name), _NUMBERED.match(run[-1].name)
    if a and b and a.group(1) == b.group(1):
        return f"{a.group(1)}{a.group(2)}–{b.group(2)} ×{len(run)}"
    return f"{run[0].name}–{run[-1].name} ×{len(run)}"


def layout_lines(plan: ParallelPlan) -> list[str]:
    """Where the stages were laid when the cluster has slow links (:mod:`galvatron_fx.cluster.topology`):
    each stage's nodes and which slow links its groups cross; nothing otherwise."""
    links = (plan.cluster or {}).get("slow_links") or []
    if not links:
        return []
    node = node_of(plan)
    nodes = [sorted({node(r) for r in ranks}) for ranks in plan.stage_ranks]
    inside = [(a, b, f) for a, b, f in links if any(a in ns and b in ns for ns in nodes)]
    text = "; ".join(f"nodes {a}↔{b} at {f:.0%} of the inter-node bandwidth" for a, b, f in links)
    where = ("every stage's data-parallel groups stay off them" if not inside else
             "inside a stage: " + ", ".join(f"{a}↔{b}" for a, b, _ in inside))
    return [f"  slow links: {text}; stages laid on nodes " + " | ".join(",".join(map(str, ns)) for ns in nodes)
            + f" ({where})"]


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


def _signed_ms(s: float) -> str:
    return f"{s * 1e3:+.2f} ms"


def _signed_bytes(b: int) -> str:
    return ("+" if b >= 0 else "-") + fmt_bytes(abs(b))


def _opt_bytes(b: int | None) -> str:
    return "-" if b is None else fmt_bytes(b)


def _pct(x: float, budget: float) -> str:
    return f"{x / budget * 100:.0f}%" if budget else "-"


def _human(key: str, v: Any) -> str:
    """A field's value in the units a person reads: bytes in KiB/MiB/GiB, seconds in ms or s,
    fractions in %, a baseline by name and step time."""
    if v is None:
        return "-"
    if key.endswith("_bytes"):
        return " / ".join(fmt_bytes(int(x)) for x in v) if isinstance(v, list) else fmt_bytes(int(v))
    if key.endswith("_s") and isinstance(v, (int, float)):
        return fmt_seconds(float(v))
    if key.endswith("_fraction") and isinstance(v, (int, float)):
        return f"{v:.1%}"
    if key == "baseline" and isinstance(v, dict):
        return f"{v.get('name')} ({fmt_seconds(float(v.get('step_time_s', 0.0)))})"
    return _short_value(v)


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
