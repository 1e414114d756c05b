"""A plan as one self-contained HTML page: what each layer runs, memory per rank against the
budget, the pipeline timeline, communication per layer and per group, and — given a training
run's directory — predicted against measured.

Contract: :func:`render(plan, run=None) -> str` and :func:`write(plan, path, run=None) -> Path`
(``plan.report(path)`` and ``galvatron-fx report PLAN.json [--run DIR] --out R.html`` call them).
The page needs no network: inline SVG and CSS, a few lines of script for hover details. Every
figure drawn is read from the plan or the run, none is made up here; where the page combines them
(the timeline, the memory bars) its caption says how.

The sections, each an element with an id a test can look for: ``summary``, ``strategy`` (one cell
per layer, coloured by strategy, stage boundaries marked), ``memory`` (per stage, i.e. per rank of
that stage: parameters, gradients, optimizer state and activations summed over its layers, the
rest of the predicted tensor peak as temporaries, the runtime's reserve up to what the device
shows, against the budget line), ``timeline`` (the plan's schedule simulated by
:func:`galvatron_fx.cost_models.pipeline.simulate` with each chunk's forward and backward time, the
sums of its layers' predictions; bubbles are the gaps), ``comm`` (per run of identical layers: the
collectives priced per micro-batch, their bytes and time, and each group's ranks and whether it
crosses a node), ``measured`` (from ``<run>/report.json`` and ``<run>/metrics.jsonl``).

A run directory is what ``galvatron-fx train --out`` or ``examples/train.py --out`` writes:
``report.json`` (``predicted``/``measured`` with ``step_time_s`` and ``peak_memory_bytes``) and
``metrics.jsonl`` (one JSON object per step: ``step``, ``loss``, ``step_s``, ...). Both are read as
JSON only; a missing file leaves its part out, a malformed one is a ``ConfigError``.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from galvatron_fx.cluster.limits import load_json, read_json
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.plan_report import efficiency_line, group_ranks, group_text, layer_runs, node_of, run_name
from galvatron_fx.report.fmt import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from galvatron_fx.ir.plan_records import CollectiveRecord

__all__ = ["read_run", "render", "write"]

_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac", "#2f4b7c", "#a05195")
_MEM_COLORS = {"params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#59a14f", "activations": "#e15759",
               "temporaries": "#edc948", "reserve": "#bab0ac"}

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}
.cap{color:#555;font-size:12.5px;margin:4px 0 8px}table{border-collapse:collapse;font-size:12.5px}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f4f4f4}
.num{text-align:right;font-variant-numeric:tabular-nums}.kv td:first-child{color:#555}
.legend span{display:inline-block;margin-right:14px;font-size:12.5px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
.cross{color:#b00020;font-weight:600}#tip{position:fixed;pointer-events:none;background:#222;color:#fff;
padding:4px 7px;border-radius:3px;font-size:12px;display:none;max-width:420px;white-space:pre-line}
svg text{font:11px system-ui,Helvetica,Arial,sans-serif}
"""

# hover details: any element with data-tip; the body is marked ready once the script has run
_JS = """
(function(){var tip=document.getElementById('tip');
document.querySelectorAll('[data-tip]').forEach(function(el){
el.addEventListener('mousemove',function(e){tip.textContent=el.getAttribute('data-tip');tip.style.display='block';
tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';});
el.addEventListener('mouseleave',function(){tip.style.display='none';});});
document.body.setAttribute('data-ready','1');})();
"""


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _strategy_label(lp) -> str:
    st = lp.strategy
    parts = [f"dp{lp.dp}", f"tp{st.tp}", st.dp_type]
    if st.sp != "none":
        parts.append(f"sp={st.sp}")
    if st.recompute != "none":
        parts.append(f"recompute={st.recompute}")
    return " ".join(parts)


# ---- sections ------------------------------------------------------------------------------


def _summary(plan) -> str:
    p = plan.predicted
    rows = [("model", plan.model), ("devices", plan.world_size), ("precision", plan.precision),
            ("pipeline", f"pp{plan.pp}, {plan.schedule}" + (f", {plan.virtual_stages} chunks per stage"
                                                            if plan.virtual_stages > 1 else "")),
            ("batch", f"global {plan.global_batch_size}, {plan.num_microbatches} micro-batch(es) of "
                      f"{plan.micro_batch_size} per data-parallel rank"),
            ("predicted step", fmt_seconds(p.step_time_s)),
            ("throughput", f"{p.throughput_samples_s:.3g} samples/s"),
            ("peak memory per rank", " / ".join(fmt_bytes(b) for b in p.peak_memory_bytes)
             + f" (budget {fmt_bytes(p.memory_budget_bytes)})"),
            ("bubble", f"{p.bubble_fraction:.1%}")]
    if plan.baseline:
        b = plan.baseline
        rows.append(("baseline", f"{b.get('name')}: {fmt_seconds(float(b['step_time_s']))} "
                                 f"({float(b['step_time_s']) / p.step_time_s:.2f}× this plan's step)"))
    if plan.solver_stats.get("search_s") is not None:
        rows.append(("search", f"{float(plan.solver_stats['search_s']):.1f} s"))
    if p.breakdown:
        rows.append(("step breakdown", ", ".join(f"{k} {fmt_seconds(v)}" for k, v in p.breakdown.items())))
    if (eff := efficiency_line(p)) is not None:
        rows.append(("efficiency", eff.removeprefix("efficiency: ")))
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    notes = "".join(f"<li>{_e(n)}</li>" for n in plan.notes)
    return (f'<section id="summary"><h1>{_e(plan.model)}: plan on {plan.world_size} devices</h1>'
            f'<table class="kv">{body}</table>' + (f"<ul>{notes}</ul>" if notes else "") + "</section>")


def _strategy_strip(plan) -> str:
    labels: dict[str, str] = {}
    for lp in plan.layers:
        labels.setdefault(_strategy_label(lp), _PALETTE[len(labels) % len(_PALETTE)])
    n = len(plan.layers)
    width, h = 1100, 34
    cell = width / max(n, 1)
    chunk_of = {}
    for c, rng in enumerate(plan.chunk_layers()):
        for i in rng:
            chunk_of[i] = c
    parts = []
    for i, lp in enumerate(plan.layers):
        pr = lp.predicted
        tip = (f"{lp.name} ({lp.role})\n{_strategy_label(lp)}\nstage {lp.stage}\nforward {fmt_seconds(pr.fwd_s)}, backward "
               f"{fmt_seconds(pr.bwd_s)}, comm {fmt_seconds(pr.comm_s)}, transition {fmt_seconds(pr.transition_s)}\nmemory "
               f"{fmt_bytes(pr.memory_bytes)} per rank")
        parts.append(f'<rect class="layer" x="{i * cell:.2f}" y="0" width="{max(cell - 1, 0.5):.2f}" height="{h}" '
                     f'fill="{labels[_strategy_label(lp)]}" data-tip="{_e(tip)}"><title>{_e(lp.name)}</title></rect>')
        if i and chunk_of.get(i) != chunk_of.get(i - 1):
            parts.append(f'<line x1="{i * cell:.2f}" x2="{i * cell:.2f}" y1="-4" y2="{h + 4}" stroke="#000" '
                         'stroke-width="2"/>')
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(k)}</span>' for k, c in labels.items())
    first, last = plan.layers[0].name, plan.layers[-1].name
    return (f'<section id="strategy"><h2>Strategy per layer</h2><div class="cap">{n} layers, {_e(first)} to '
            f'{_e(last)}; a black line starts a new pipeline chunk. Hover a cell for its predictions.</div>'
            f'<svg width="{width}" height="{h + 10}" viewBox="0 -5 {width} {h + 10}">{"".join(parts)}</svg>'
            f'<div class="legend">{legend}</div></section>')


def _memory(plan) -> str:
    p = plan.predicted
    stages = []
    for s in range(plan.pp):
        cats = {"params": 0, "grads": 0, "optimizer": 0, "activations": 0}
        for lp in plan.layers:
            if lp.stage == s:
                for k in cats:
                    cats[k] += int(lp.predicted.memory_breakdown.get(k, 0))
        peak = int(p.peak_memory_bytes[s])
        cats["temporaries"] = max(peak - sum(cats.values()), 0)
        top = max(peak, sum(cats.values()))
        if p.reserved_peak_bytes:
            cats["reserve"] = max(int(p.reserved_peak_bytes[s]) - top, 0)
        stages.append(cats)
    budget = int(p.memory_budget_bytes)
    scale_max = max([budget] + [sum(c.values()) for c in stages]) * 1.05
    width, bar_h, gap, left = 1100, 26, 12, 190
    plot = width - left - 20
    rows = []
    for s, cats in enumerate(stages):
        y = s * (bar_h + gap)
        ranks = plan.stage_ranks[s]
        rows.append(f'<text x="0" y="{y + 17}">stage {s} (ranks {ranks[0]}–{ranks[-1]})</text>' if len(ranks) > 1
                    else f'<text x="0" y="{y + 17}">stage {s} (rank {ranks[0]})</text>')
        x: float = left
        for k, v in cats.items():
            w = plot * v / scale_max
            if w <= 0:
                continue
            rows.append(f'<rect class="mem" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" '
                        f'fill="{_MEM_COLORS[k]}" data-tip="{_e(f"stage {s} {k}: {fmt_bytes(v)}")}"/>')
            x += w
        rows.append(f'<text x="{x + 4:.2f}" y="{y + 17}">{_e(fmt_bytes(sum(cats.values())))}</text>')
    h = plan.pp * (bar_h + gap) + 8
    bx = left + plot * budget / scale_max
    rows.append(f'<line id="budget" x1="{bx:.2f}" x2="{bx:.2f}" y1="-6" y2="{h}" stroke="#b00020" '
                'stroke-width="2" stroke-dasharray="5,3"/>')
    rows.append(f'<text x="{bx - 4:.2f}" y="{h + 10}" text-anchor="end" fill="#b00020">budget {_e(fmt_bytes(budget))}</text>')
    legend = "".join(f'<span><i style="background:{c}"></i>{k}</span>' for k, c in _MEM_COLORS.items())
    return ('<section id="memory"><h2>Memory per rank</h2><div class="cap">Every rank of a stage holds the same. '
            "Parameters, gradients, optimizer state and activations (held micro-batches included) are the sums of "
            "the stage's layer predictions; temporaries are the rest of the predicted tensor peak; the reserve "
            "(context, communicator buffers, allocator) reaches what the device shows in use.</div>"
            f'<svg width="{width}" height="{h + 24}" viewBox="0 -8 {width} {h + 24}">{"".join(rows)}</svg>'
            f'<div class="legend">{legend}</div></section>')


def _timeline(plan) -> str:
    from galvatron_fx.report.trace import predicted_timeline

    schedule = plan.schedule if plan.pp > 1 else "1f1b"
    try:
        schedule, res = predicted_timeline(plan)
    except ConfigError as e:
        return f'<section id="timeline"><h2>Pipeline timeline</h2><div class="cap">not drawn: {_e(e)}</div></section>'
    width, row_h, left = 1100, 24, 70
    plot = width - left - 10
    t_end = res.step_time_s or 1.0
    parts = []
    for r in range(res.num_stages):
        parts.append(f'<text x="0" y="{r * (row_h + 6) + 16}">stage {r}</text>')
        parts.append(f'<rect x="{left}" y="{r * (row_h + 6)}" width="{plot}" height="{row_h}" fill="#f3f3f3"/>')
    for ev in res.timeline or ():
        x = left + plot * ev.start_s / t_end
        w = max(plot * (ev.end_s - ev.start_s) / t_end, 0.5)
        y = ev.rank * (row_h + 6)
        color = "#4e79a7" if ev.kind == "F" else "#f28e2b"
        if ev.chunk % 2:
            color = "#a0cbe8" if ev.kind == "F" else "#ffbe7d"
        tip = (f"stage {ev.rank}, chunk {ev.chunk}: {'forward' if ev.kind == 'F' else 'backward'} of micro-batch "
               f"{ev.microbatch}\n{fmt_seconds(ev.start_s)} – {fmt_seconds(ev.end_s)}")
        parts.append(f'<rect class="op" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{color}" '
                     f'stroke="#fff" stroke-width="0.5" data-tip="{_e(tip)}"/>')
        if w > 14:
            parts.append(f'<text x="{x + w / 2:.2f}" y="{y + 16}" text-anchor="middle" fill="#fff">'
                         f'{ev.kind}{ev.microbatch}</text>')
    h = res.num_stages * (row_h + 6)
    parts.append(f'<text x="{left}" y="{h + 12}">0</text><text x="{width - 10}" y="{h + 12}" text-anchor="end">'
                 f'{_e(fmt_seconds(t_end))}</text>')
    return ('<section id="timeline"><h2>Pipeline timeline</h2><div class="cap">'
            f"One step of {_e(schedule)} with {plan.num_microbatches} micro-batch(es), simulated from each chunk's "
            "forward and backward time per micro-batch (the sums of its layers' predicted times per step over "
            f"{plan.num_microbatches}; communication, transitions and the "
            f"optimizer are not drawn): {_e(fmt_seconds(t_end))} of compute span, idle {res.bubble_fraction:.1%} "
            f"(the plan's whole step is {_e(fmt_seconds(plan.predicted.step_time_s))}). Blue: forward, orange: backward; "
            "lighter: a stage's second chunk. Gaps are the bubble.</div>"
            f'<svg width="{width}" height="{h + 18}" viewBox="0 0 {width} {h + 18}">{"".join(parts)}</svg>'
            "</section>")


def _axis(lp, c: CollectiveRecord) -> str:
    """Which group a priced collective runs on: the tensor-parallel or the data-parallel one (as
    recorded; in older plans, by its size — where both groups have that size, a gather or
    reduce-scatter of a sharded data-parallel layer could be either)."""
    if c.axis in ("tp", "dp"):
        return c.axis
    op, phase, size = c.op, c.phase, c.group_size
    tp, dp = lp.strategy.tp, lp.dp
    if phase == "step" or size != tp:
        return "dp"
    if size != dp:
        return "tp"
    return "tp or dp" if lp.strategy.dp_type != "ddp" and op in ("all_gather", "reduce_scatter") else "tp"


def _comm(plan) -> str:
    rows, bars = [], []
    per_group: dict[tuple, list] = {}
    runs = layer_runs(plan.layers)
    most = max((lp.predicted.comm_s for lp in plan.layers), default=0.0) or 1.0
    for run in runs:
        lp = run[0]
        groups = group_ranks(plan, lp)
        cells = {}
        for ax in ("tp", "dp"):
            size = lp.strategy.tp if ax == "tp" else lp.dp
            if size <= 1:
                cells[ax] = "—"
                continue
            text, crosses = group_text(plan, groups[ax])
            tier = "inter-node" if crosses else "intra-node"
            cells[ax] = f'{_e(text)}<br><span class="{"cross" if crosses else ""}">{tier}</span>'
        summary: dict[tuple, list[int]] = {}
        for c in lp.collectives:
            key = (c.phase, c.op, c.group_size, _axis(lp, c))
            summary.setdefault(key, [0, 0])
            summary[key][0] += 1
            summary[key][1] += c.bytes
        lines = []
        for (phase, op, size, ax), (count, nbytes) in sorted(summary.items()):
            lines.append(f"{phase} {op} ×{count} on {ax} ({size}): {fmt_bytes(nbytes)}")
            g = tuple(tuple(x) for x in groups[ax]) if ax in groups else ()
            per_group.setdefault((ax, g), []).append(nbytes * len(run))
        rows.append(f"<tr><td>{_e(run_name(run))}</td><td>{_e(_strategy_label(lp))}</td><td>{cells['tp']}</td>"
                    f"<td>{cells['dp']}</td><td>{'<br>'.join(_e(x) for x in lines) or '—'}</td>"
                    f'<td class="num">{_e(fmt_seconds(lp.predicted.comm_s))}</td>'
                    f'<td class="num">{_e(fmt_seconds(lp.predicted.transition_s))}</td></tr>')
    width, h = 1100, 60
    cell = width / max(len(plan.layers), 1)
    for i, lp in enumerate(plan.layers):
        bh = h * lp.predicted.comm_s / most
        bars.append(f'<rect class="comm" x="{i * cell:.2f}" y="{h - bh:.2f}" width="{max(cell - 1, 0.5):.2f}" '
                    f'height="{bh:.2f}" fill="#76b7b2" data-tip="{_e(f"{lp.name}: comm {fmt_seconds(lp.predicted.comm_s)}")}"/>')
    node = node_of(plan)
    grows = []
    for (ax, g), sizes in sorted(per_group.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if not g:
            continue
        crosses = any(len({node(r) for r in grp}) > 1 for grp in g)
        nodes = sorted({node(r) for grp in g for r in grp})
        grows.append(f"<tr><td>{ax}</td><td>{_e(' | '.join(','.join(map(str, grp)) for grp in g))}</td>"
                     f"<td>{_e(','.join(map(str, nodes)))}</td>"
                     f'<td class="{"cross" if crosses else ""}">{"inter-node" if crosses else "intra-node"}</td>'
                     f'<td class="num">{_e(fmt_bytes(sum(sizes)))}</td></tr>')
    per = (plan.cluster or {}).get("devices_per_node")
    return ('<section id="comm"><h2>Communication</h2><div class="cap">Per layer, the collectives the search '
            "priced for one micro-batch (fwd, bwd) or once per step (step: gradient buckets), and the time they add "
            f"to a step (the bars above, the longest {_e(fmt_seconds(most))}). Groups: the stage's ranks as a (dp, tp) mesh, tp innermost; "
            f"{_e(per) if per else 'all'} devices per node.</div>"
            f'<svg width="{width}" height="{h}" viewBox="0 0 {width} {h}">{"".join(bars)}</svg>'
            "<table><tr><th>layers</th><th>strategy</th><th>tp group</th><th>dp group</th><th>collectives</th>"
            f"<th>comm</th><th>transition</th></tr>{''.join(rows)}</table>"
            "<h3>Process groups</h3><table id=\"groups\"><tr><th>axis</th><th>groups (ranks)</th><th>nodes</th>"
            f"<th>link</th><th>bytes priced (fwd, bwd: per micro-batch; step: per step)</th></tr>{''.join(grows)}</table></section>")


def read_run(run: str | os.PathLike) -> dict:
    """``{"report": dict | None, "metrics": [dict]}`` from a training run's directory (see module doc)."""
    d = Path(run)
    if not d.is_dir():
        raise ConfigError(f"run directory {d} does not exist; pass the --out directory of a training run")
    out: dict[str, Any] = {"report": None, "metrics": []}
    rp = d / "report.json"
    if rp.exists():
        out["report"] = read_json(rp, what="run report", hint="rerun the training or leave --run out")
        if not isinstance(out["report"], dict):
            raise ConfigError(f"{rp} holds {type(out['report']).__name__}, not a JSON object")
        for key in ("predicted", "measured"):
            if not isinstance(out["report"].get(key, {}), dict):
                raise ConfigError(f"{rp}: {key!r} holds {type(out['report'][key]).__name__}, not an object of figures; "
                                  "rerun the training or leave --run out")
    mp = d / "metrics.jsonl"
    if mp.exists():
        out["metrics"] = _metrics_lines(mp)
    if out["report"] is None and not out["metrics"]:
        raise ConfigError(f"{d} holds neither report.json nor metrics.jsonl; pass a training run's --out directory")
    return out


MAX_METRICS_BYTES = 256 * 2**20  # a million steps of lines; beyond, not a run's metrics
MAX_METRICS_LINE = 64 * 2**10


def _metrics_lines(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl``, read line by line and bounded (each line at most
    :data:`MAX_METRICS_LINE`, the file :data:`MAX_METRICS_BYTES`): each a JSON object whose
    ``step`` is a whole number; fields that are not numbers (or null) are dropped."""
    recs, total = [], 0
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(iter(lambda: f.readline(MAX_METRICS_LINE + 1), b""), 1):
                total += len(raw)
                if total > MAX_METRICS_BYTES:
                    raise ConfigError(f"{path}: larger than {MAX_METRICS_BYTES // 2**20} MiB; not a run's metrics")
                if len(raw) > MAX_METRICS_LINE:
                    raise ConfigError(f"{path}:{n}: a line longer than {MAX_METRICS_LINE // 2**10} KiB; not a "
                                      "metrics record")
                if not raw.strip():
                    continue
                try:
                    rec = load_json(raw.decode("utf-8"), f"{path}:{n}")
                except UnicodeDecodeError:
                    raise ConfigError(f"{path}:{n} is not UTF-8 text") from None
                if not isinstance(rec, dict):
                    continue
                step = rec.get("step")
                if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                    raise ConfigError(f"{path}:{n}: step {step!r} is not a step number; rerun the training or leave "
                                      "--run out")
                recs.append({k: v for k, v in rec.items() if _figure(v)})
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    return recs


def _figure(v: Any) -> bool:
    """A value a metrics record may hold: null, a bool, a number, or a list of numbers."""
    if v is None or isinstance(v, (bool, int, float)):
        return True
    return isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)


def _num(d: Any, *keys: str) -> float | None:
    for k in keys:
        v = d.get(k) if isinstance(d, dict) else None
        if isinstance(v, (int, float)) and math.isfinite(v):
            return float(v)
    return None


def _line_chart(values: list[float], steps: list[int], *, ref: float | None, label: str, fmt, cid: str) -> str:
    width, h, left = 540, 150, 60
    lo = min(values + ([ref] if ref is not None else []))
    hi = max(values + ([ref] if ref is not None else []))
    lo, hi = (0.0, hi * 1.1) if lo >= 0 else (lo, hi)
    span = (hi - lo) or 1.0
    n = len(values)
    xs = [left + (width - left - 10) * (i / max(n - 1, 1)) for i in range(n)]
    ys = [h - 20 - (h - 30) * (v - lo) / span for v in values]
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    parts = [f'<polyline points="{pts}" fill="none" stroke="#4e79a7" stroke-width="1.5"/>']
    parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#4e79a7" data-tip="{_e(f"step {s}: {fmt(v)}")}"/>'
              for x, y, s, v in zip(xs, ys, steps, values)]
    if ref is not None:
        ry = h - 20 - (h - 30) * (ref - lo) / span
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{ry:.1f}" y2="{ry:.1f}" stroke="#b00020" '
                     f'stroke-dasharray="5,3"/><text x="{width - 10}" y="{ry - 4:.1f}" text-anchor="end" '
                     f'fill="#b00020">predicted {_e(fmt(ref))}</text>')
    parts.append(f'<text x="0" y="14">{_e(label)}</text><text x="0" y="{h - 22}">{_e(fmt(lo))}</text>'
                 f'<text x="0" y="30">{_e(fmt(hi))}</text>'
                 f'<text x="{left}" y="{h - 4}">step {steps[0]}</text>'
                 f'<text x="{width - 10}" y="{h - 4}" text-anchor="end">step {steps[-1]}</text>')
    return f'<svg id="{cid}" width="{width}" height="{h}" viewBox="0 0 {width} {h}">{"".join(parts)}</svg>'


def _floats(v) -> list[float]:
    """A JSON list of numbers as floats ([] for anything else)."""
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return []
    return [float(x) for x in v if math.isfinite(x)]


def _measured(plan, run: dict | None) -> str:
    head = '<section id="measured"><h2>Predicted and measured</h2>'
    if run is None:
        return head + ('<div class="cap">No training run given: pass <code>--run DIR</code> (the --out directory of '
                       "<code>galvatron-fx train</code> or <code>examples/train.py</code>) to compare.</div></section>")
    rep = run["report"] or {}
    pred, meas = rep.get("predicted", {}), rep.get("measured", {})
    p_step = _num(pred, "step_time_s", "step_s") or plan.predicted.step_time_s
    p_mem = _num(pred, "peak_memory_bytes", "peak_bytes") or max(plan.predicted.peak_memory_bytes)
    m_step = _num(meas, "step_time_s", "step_s")
    m_mem = _num(meas, "peak_memory_bytes", "peak_bytes")
    steps = [r for r in run["metrics"] if _num(r, "step_s") is not None]
    if m_step is None and steps:
        tail = sorted(cast(float, _num(r, "step_s")) for r in steps[min(3, len(steps) - 1):])
        m_step = tail[len(tail) // 2]
    rows = [("step time", fmt_seconds(p_step), fmt_seconds(m_step) if m_step is not None else "—",
             f"{m_step / p_step:.2f}×" if m_step is not None and p_step else "—"),
            ("peak memory (rank 0)", fmt_bytes(int(p_mem)), fmt_bytes(int(m_mem)) if m_mem is not None else "—",
             f"{m_mem / p_mem:.2f}×" if m_mem is not None and p_mem else "—")]
    p_mfu = _num(pred, "mfu") if _num(pred, "mfu") is not None else plan.predicted.mfu
    m_mfu = _num(meas, "mfu")
    if p_mfu is not None or m_mfu is not None:
        rows.append(("MFU", f"{p_mfu:.1%}" if p_mfu is not None else "—", f"{m_mfu:.1%}" if m_mfu is not None else "—",
                     f"{m_mfu / p_mfu:.2f}×" if m_mfu is not None and p_mfu else "—"))
    p_den = _floats(pred.get("compute_density")) or list(plan.predicted.compute_density)
    m_den = _floats(meas.get("compute_density"))
    for s in range(max(len(p_den), len(m_den))):
        a = p_den[s] if s < len(p_den) else None
        b = m_den[s] if s < len(m_den) else None
        rows.append((f"compute density (stage {s})", f"{a:.0%}" if a is not None else "—",
                     f"{b:.0%}" if b is not None else "—", f"{b / a:.2f}×" if a and b is not None else "—"))
    table = ("<table id=\"pvm\"><tr><th></th><th>predicted</th><th>measured</th><th>measured / predicted</th></tr>"
             + "".join(f"<tr><td>{_e(a)}</td><td class=\"num\">{_e(b)}</td><td class=\"num\">{_e(c)}</td>"
                       f"<td class=\"num\">{_e(d)}</td></tr>" for a, b, c, d in rows) + "</table>")
    charts = ""
    if steps:
        charts += _line_chart([cast(float, _num(r, "step_s")) for r in steps],
                              [int(r.get("step", i + 1)) for i, r in enumerate(steps)],
                              ref=p_step, label="step time", fmt=fmt_seconds, cid="step_chart")
    losses = [r for r in run["metrics"] if _num(r, "loss") is not None]
    if len(losses) > 1:
        charts += _line_chart([cast(float, _num(r, "loss")) for r in losses],
                              [int(r.get("step", i + 1)) for i, r in enumerate(losses)],
                              ref=None, label="loss", fmt=lambda v: f"{v:.3f}", cid="loss_chart")
    elif isinstance(rep.get("loss"), dict) and isinstance(rep["loss"].get("curve"), list) and len(rep["loss"]["curve"]) > 1:
        curve = [float(v) for v in rep["loss"]["curve"]]
        charts += _line_chart(curve, list(range(1, len(curve) + 1)), ref=None, label="loss",
                              fmt=lambda v: f"{v:.3f}", cid="loss_chart")
    src = "report.json" + (f" and {len(run['metrics'])} lines of metrics.jsonl" if run["metrics"] else "") \
        if run["report"] else f"{len(run['metrics'])} lines of metrics.jsonl"
    notes = "".join(f"<li>{_e(n)}</li>" for n in rep.get("notes", []) if isinstance(n, str))
    return (head + f'<div class="cap">From the run\'s {_e(src)}; measured step time: the run\'s median after its '
            f"warm-up steps.</div>{table}<div>{charts}</div>" + (f"<ul>{notes}</ul>" if notes else "") + "</section>")


def render(plan, run: str | os.PathLike | dict | None = None) -> str:
    """The report page of ``plan`` (a :class:`~galvatron_fx.ir.plan.ParallelPlan`); ``run``: a
    training run's directory (or :func:`read_run`'s result) for predicted against measured."""
    data = read_run(run) if run is not None and not isinstance(run, dict) else run
    body = (_summary(plan) + _strategy_strip(plan) + _memory(plan) + _timeline(plan) + _comm(plan)
            + _measured(plan, data))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(plan.model)} plan: galvatron_fx report</title><style>{_CSS}</style></head>"
            f'<body data-ready="0">{body}<div id="tip"></div><script>{_JS}</script></body></html>\n')


def write(plan, path: str | os.PathLike, run: str | os.PathLike | dict | None = None) -> Path:
    """Write :func:`render`'s page to ``path`` (through a temporary file, then renamed)."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{str(out)!r} is a directory; give the report a file name (e.g. {str(out / 'report.html')!r})")
    text = render(plan, run)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
