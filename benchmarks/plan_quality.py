"""Predicted quality of searched plans against the best hand-written baseline, same cost model.

For every (model, cluster, memory budget) of the matrix the full search (``plan(..., baselines=
False)``) and every baseline of :mod:`galvatron_fx.search.baselines` (DDP, ZeRO-2, FSDP/ZeRO-3,
Megatron tp×pp, each with and without recompute) are priced by one ``AnalyticCostModel`` (bf16) in
the same run. ``ratio_vs_best_baseline`` = best baseline's predicted step time / the searched
plan's, i.e. the searched plan's predicted throughput over the best baseline's. The search space
contains every baseline, so a ratio below 1.0 is a search bug; the script says so in its output
(it does not raise) and lists the cases. Where the ratio exceeds 1.2 a ``why`` string compares the
plan's per-layer strategies with the best baseline's.

Matrix: gpt2-xl, gpt3-6.7b, gpt3-175b, llama2-7b, llama2-70b, bert-large, t5-base ×
8×A100-80G (``dgx-a100-80g`` × 1), 8×RTX 4090 (``rtx4090-pcie`` × 1), 64×H100 (``dgx-h100`` × 8),
1,024×A100-80G (``dgx-a100-80g`` × 128) × memory budget = the device's full memory and half of it.
Sequence length: the model's maximum capped at 2048 (GPT-2 XL 1024, BERT-large 512, T5-base its
default 512), 4096 for Llama-2. Global batch: 8 sequences per device, capped at 1,536. Each model
is captured once (meta device, batch 1) and reused. Combos where nothing fits are kept as
``fits: false`` with the ``PlanError`` message. Nothing of the full matrix is skipped (it runs in
a few minutes on 2 cores); ``skipped`` lists anything left out (``--quick`` leaves out a lot).
Every combo is also planned with the batch left to the search (``auto_batch`` of each row:
``AutoBatch(max_batch=gb)``, the fastest batch up to the matrix's, gradient accumulation
allowed), its throughput compared with the best baseline's and the fixed-batch plan's in samples
per second (``throughput_ratio_vs_best_baseline``, ``throughput_ratio_vs_fixed``), with the
plan's note saying why that batch; ``auto_batch_wins`` lists the combos where it fits where the
fixed batch does not, or beats every baseline and the fixed-batch plan by more than 1%.
Baselines include ``fsdp+offload`` (ZeRO-3-Offload: every layer's shards and optimizer step in host
memory). A plan that offloads has an ``offload`` record (layers offloaded, host memory per node,
the ratio to the best offload baseline, ``reason``); ``offload_wins`` lists the combos where
offload lets the model fit where no baseline without it does, or beats every baseline by more
than 1%. ``worse_than_previous`` lists the combos whose plan is slower than in the results file
the run replaces. Prints a table and writes ``benchmarks/results/plan_quality.json``
(``{"rows": [...], "min_ratio": ..., "below_1": [...], "auto_batch_wins": [...], "skipped": [...],
"machine": {...}}``).

    python benchmarks/plan_quality.py [--quick]

``--quick``: gpt2-xl, llama2-7b and bert-large on the two 8-GPU presets, full memory only.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

MODELS = {  # name -> sequence length
    "gpt2-xl": 1024, "gpt3-6.7b": 2048, "gpt3-175b": 2048, "llama2-7b": 4096, "llama2-70b": 4096,
    "bert-large": 512, "t5-base": 512,
}
CLUSTERS = [("dgx-a100-80g", 1), ("rtx4090-pcie", 1), ("dgx-h100", 8), ("dgx-a100-80g", 128)]
BATCH_PER_DEVICE, BATCH_CAP = 8, 1536
WHY_ABOVE = 1.2


def _counts(layers) -> Counter:
    return Counter(l.strategy.short() for l in layers)


def _fmt_counts(c: Counter) -> str:
    if len(c) == 1:
        return next(iter(c))
    return ", ".join(f"{n}× {s}" for s, n in c.most_common())


def describe(p) -> str:
    """``pp2×mb16: 40× tp4+megatron·zero3, 3× tp1·zero3`` (distinct strategies over all layers)."""
    return f"pp{p.pp}×mb{p.num_microbatches}: {_fmt_counts(_counts(p.layers))}"


def why(p, base_name: str, b) -> str:
    """The per-layer choices where the searched plan ``p`` differs from the best baseline ``b``."""
    from galvatron_fx.ir.graph import LayerRole
    from galvatron_fx.ir.recompute import Recompute

    blocks = [l for l in p.layers if l.role == LayerRole.BLOCK]
    bblocks = [l for l in b.layers if l.role == LayerRole.BLOCK]
    parts = [f"blocks use {_fmt_counts(_counts(blocks))} (baseline {base_name}: {_fmt_counts(_counts(bblocks))})"]
    rc = sum(l.strategy.recompute != Recompute.NONE for l in blocks)
    brc = sum(l.strategy.recompute != Recompute.NONE for l in bblocks)
    if rc != brc:
        parts.append(f"{rc} of {len(blocks)} blocks recompute (baseline {brc})")
    others = [f"{l.name}: {l.strategy.short()} vs {bl.strategy.short()}"
              for l, bl in zip(p.layers, b.layers) if l.role != LayerRole.BLOCK and l.strategy != bl.strategy]
    if others:
        parts.append("other layers " + "; ".join(others[:4]) + (" …" if len(others) > 4 else ""))
    if (p.pp, p.num_microbatches) != (b.pp, b.num_microbatches):
        parts.append(f"pp{p.pp}×mb{p.num_microbatches} vs pp{b.pp}×mb{b.num_microbatches}")
    bd, bbd = p.predicted.breakdown, b.predicted.breakdown
    diffs = [f"{k} {bd[k]:.3g} s vs {bbd[k]:.3g} s" for k in ("compute", "comm", "bubble")
             if k in bd and k in bbd and abs(bd[k] - bbd[k]) > 0.05 * max(b.predicted.step_time_s, 1e-12)]
    if diffs:
        parts.append("; ".join(diffs))
    return "; ".join(parts)


def _auto_batch(gfx, mg, cluster, cm, gb: int, budget: int, fixed, best) -> dict:
    """The combo planned with the batch left to the search (up to ``gb``), against the fixed-batch
    plan ``fixed`` and the best baseline ``best`` (name, plan) at ``gb``, in samples per second."""
    from galvatron_fx.errors import PlanError

    t0 = time.perf_counter()
    try:
        p = gfx.plan(mg, cluster, global_batch_size=gfx.AutoBatch(max_batch=gb), memory_budget=budget,
                     precision="bf16", baselines=False, cost_model=cm)
    except PlanError as e:
        return {"fits": False, "error": str(e).splitlines()[0], "search_s": time.perf_counter() - t0}
    out = {"fits": True, "global_batch": p.global_batch_size, "num_microbatches": p.num_microbatches, "pp": p.pp,
           "throughput_samples_s": p.predicted.throughput_samples_s, "plan": describe(p),
           "note": next(n for n in p.notes if "chosen automatically" in n), "search_s": time.perf_counter() - t0}
    if fixed is not None:
        out["throughput_ratio_vs_fixed"] = p.predicted.throughput_samples_s / fixed.predicted.throughput_samples_s
        out["why"] = why(p, "fixed batch", fixed)
    if best is not None:
        out["throughput_ratio_vs_best_baseline"] = p.predicted.throughput_samples_s / best[1].predicted.throughput_samples_s
    return out


def _auto_wins(row: dict) -> bool:
    a = row["auto_batch"]
    if not a["fits"]:
        return False
    if not row["fits"]:
        return True
    return (a.get("throughput_ratio_vs_fixed", 0) > 1.01
            and a.get("throughput_ratio_vs_best_baseline", math.inf) > 1.01)


def _offload(p, baselines: dict, best) -> dict:
    """A plan that offloads: how many layers, the host memory it keeps, and why it wins (or not)
    against the baselines: none without offload fits, or it beats every one, offload's included."""
    n = sum(lp.strategy.offload for lp in p.layers)
    pr = p.predicted
    plain = {k: v for k, v in baselines.items() if v is not None and "offload" not in k}
    with_off = {k: v for k, v in baselines.items() if v is not None and "offload" in k}
    out = {"offloaded_layers": n, "layers": len(p.layers), "host_gib_per_node": max(pr.host_node_bytes) / 2**30,
           "host_budget_gib_per_node": (pr.host_budget_bytes or 0) / 2**30}
    parts = [f"{n} of {len(p.layers)} layers keep their optimizer step (ZeRO: their shards too) in host memory, "
             f"{out['host_gib_per_node']:.1f} GiB per node of {out['host_budget_gib_per_node']:.0f} GiB"]
    if not plain:
        parts.append("no baseline fits without offload")
    if with_off:
        name, t = min(with_off.items(), key=lambda kv: kv[1])
        out["best_offload_baseline"], out["ratio_vs_best_offload_baseline"] = name, t / pr.step_time_s
        parts.append(f"{t / pr.step_time_s:.3f}× the best offload baseline ({name}: every layer offloaded)")
    else:
        parts.append("no baseline fits, offload's included")
    ratio = best[1].predicted.step_time_s / pr.step_time_s if best else None
    out["wins"] = not plain or (ratio is not None and ratio > 1.01)
    out["reason"] = "; ".join(parts)
    return out


def _worse_than_previous(rows: list[dict]) -> list[str]:
    """Rows whose plan is slower than (or no longer fits where it fit in) the results file this
    run replaces, same combo."""
    from _common import RESULTS

    path = RESULTS / "plan_quality.json"
    if not path.exists():
        return []
    import json

    old = {(r["model"], r["cluster"], r["memory_gib"]): r for r in json.loads(path.read_text()).get("rows", [])}
    out = []
    for r in rows:
        o = old.get((r["model"], r["cluster"], r["memory_gib"]))
        if o is None or not o.get("fits"):
            continue
        if not r["fits"]:
            out.append(f"{r['model']} {r['cluster']} {r['memory_gib']:.0f} GiB: fitted before, not now")
        elif r["step_time_s"] > o["step_time_s"] * (1 + 1e-6):
            out.append(f"{r['model']} {r['cluster']} {r['memory_gib']:.0f} GiB: {o['step_time_s']:.4g} s -> "
                       f"{r['step_time_s']:.4g} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 models × the two 8-GPU presets, full memory")
    args = ap.parse_args()

    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.errors import PlanError
    from galvatron_fx.ir.strategy import Precision
    from galvatron_fx.search.baselines import all_baselines

    models, clusters, fractions = dict(MODELS), list(CLUSTERS), (1.0, 0.5)
    skipped: list[dict] = []
    if args.quick:
        models = {m: MODELS[m] for m in ("gpt2-xl", "llama2-7b", "bert-large")}
        clusters, fractions = CLUSTERS[:2], (1.0,)
        skipped.append({"what": "everything but gpt2-xl/llama2-7b/bert-large × 8-GPU presets × full memory",
                        "reason": "--quick"})

    t_all = time.perf_counter()
    rows: list[dict] = []
    print(f"{'model':<11} {'cluster':<17} {'mem':>5} {'gbs':>5} {'ratio':>6} {'best baseline':<24} {'s':>5}  plan")
    for model, seq in models.items():
        t0 = time.perf_counter()
        m, inputs = zoo.build(model, batch_size=1, seq_len=seq, device="meta")
        mg = gfx.capture(m, inputs, name=model)
        capture_s = time.perf_counter() - t0
        for preset, nodes in clusters:
            cluster = gfx.Cluster.preset(preset, nodes=nodes)
            cm = AnalyticCostModel(cluster, precision=Precision.named("bf16"))
            gb = min(BATCH_PER_DEVICE * cluster.world_size, BATCH_CAP)
            full = cluster.min_memory_bytes()
            for frac in fractions:
                budget = int(full * frac)
                row: dict = {"model": model, "seq": seq, "cluster": f"{preset}x{nodes}", "devices": cluster.world_size,
                             "global_batch": gb, "memory_gib": budget / 2**30, "memory_fraction": frac,
                             "capture_s": capture_s}
                t1 = time.perf_counter()
                p = None
                try:
                    p = gfx.plan(mg, cluster, global_batch_size=gb, memory_budget=budget, precision="bf16",
                                 baselines=False, cost_model=cm)
                except PlanError as e:
                    row.update(fits=False, error=str(e))
                row["search_s"] = time.perf_counter() - t1
                t2 = time.perf_counter()
                bl = all_baselines(mg, cluster, cm, global_batch_size=gb, memory_budget=budget)
                row["baselines_s"] = time.perf_counter() - t2
                row["baselines"] = {n: (b.predicted.step_time_s if b is not None else None) for n, b in bl.items()}
                fitting = {n: b for n, b in bl.items() if b is not None}
                best = min(fitting.items(), key=lambda nb: nb[1].predicted.step_time_s) if fitting else None
                row["best_baseline"] = best[0] if best else None
                row["best_baseline_step_time_s"] = best[1].predicted.step_time_s if best else None
                if p is None:
                    row["ratio_vs_best_baseline"] = None
                    if best:  # the search space holds every baseline: this is a bug
                        row["bug"] = f"search found nothing but baseline {best[0]} fits"
                else:
                    row.update(fits=True, step_time_s=p.predicted.step_time_s,
                               throughput_samples_s=p.predicted.throughput_samples_s,
                               peak_memory_gib=max(p.predicted.peak_memory_bytes) / 2**30,
                               pp=p.pp, num_microbatches=p.num_microbatches,
                               strategies=dict(_counts(p.layers).most_common()), plan=describe(p),
                               solver_search_s=p.solver_stats.get("search_s"))
                    if best:
                        ratio = best[1].predicted.step_time_s / p.predicted.step_time_s
                        row["ratio_vs_best_baseline"] = ratio
                        row["best_baseline_plan"] = describe(best[1])
                        if ratio > WHY_ABOVE:
                            row["why"] = why(p, best[0], best[1])
                        if ratio < 1.0:
                            row["bug"] = f"searched plan slower than baseline {best[0]} (ratio {ratio:.6f})"
                    else:
                        row["ratio_vs_best_baseline"] = None
                        row["note"] = "no baseline fits; only the search finds a plan"
                    if max(p.predicted.peak_memory_bytes) > budget:
                        row["bug"] = (row.get("bug", "") + "; " if "bug" in row else "") + "plan exceeds its budget"
                if p is not None and any(lp.strategy.offload for lp in p.layers):
                    row["offload"] = _offload(p, row["baselines"], best)
                row["auto_batch"] = _auto_batch(gfx, mg, cluster, cm, gb, budget, p, best)
                rows.append(row)
                r = row.get("ratio_vs_best_baseline")
                ratio_s = f"{r:6.3f}" if r is not None else ("  -   " if row["fits"] else "no fit")
                desc = row.get("plan") or row["error"][:70]
                print(f"{model:<11} {row['cluster']:<17} {row['memory_gib']:>5.0f} {gb:>5} {ratio_s} "
                      f"{row['best_baseline'] or '-':<24} {row['search_s'] + row['baselines_s']:>5.1f}  {desc}"
                      + (f"  BUG: {row['bug']}" if "bug" in row else ""), flush=True)
                if "why" in row:
                    print(f"{'':>11}   why: {row['why']}", flush=True)
                if "offload" in row:
                    print(f"{'':>11}   offload: {row['offload']['reason']}", flush=True)
                a = row["auto_batch"]
                if a["fits"]:
                    vs_b = a.get("throughput_ratio_vs_best_baseline")
                    vs_f = a.get("throughput_ratio_vs_fixed")
                    print(f"{'':>11}   auto batch {a['global_batch']} ×{a['num_microbatches']} pp{a['pp']}: "
                          f"{a['throughput_samples_s']:.4g} samples/s, "
                          f"{'%.3f' % vs_f if vs_f else '-'}× the fixed batch's, "
                          f"{'%.3f' % vs_b if vs_b else '-'}× the best baseline's ({a['search_s']:.1f} s)", flush=True)

    ratios = [r["ratio_vs_best_baseline"] for r in rows if r.get("ratio_vs_best_baseline") is not None]
    below = [{k: r.get(k) for k in ("model", "cluster", "memory_gib", "ratio_vs_best_baseline", "best_baseline",
                                     "plan", "best_baseline_plan", "bug")}
             for r in rows if "bug" in r]
    min_ratio = min(ratios) if ratios else None
    wall = time.perf_counter() - t_all
    print(f"\n{len(rows)} combos, {sum(r['fits'] for r in rows)} fit, {len(ratios)} with a fitting baseline; "
          + (f"min ratio {min_ratio:.4f}, max {max(ratios):.3f}" if ratios else "no ratios") + f"; wall {wall:.0f} s")
    never_fit = [n for n in (rows[0]["baselines"] if rows else {}) if all(r["baselines"].get(n) is None for r in rows)]
    if never_fit:
        print(f"WARNING: baselines that fit in no combo (suspect the baseline, not the model): {', '.join(never_fit)}")
    never_below = all(x >= 1.0 for x in ratios)
    print(f"ratio never below 1.0: {'YES' if never_below else 'NO — search bug'}")
    for b in below:
        print(f"  BUG {b['model']} {b['cluster']} {b['memory_gib']:.0f} GiB: {b['bug']}")
    wins = [{"model": r["model"], "cluster": r["cluster"], "memory_gib": r["memory_gib"], **r["auto_batch"]}
            for r in rows if _auto_wins(r)]
    print(f"automatic batch: {len(wins)} combo(s) where it fits where the fixed batch does not, or beats every "
          "baseline and the fixed batch by more than 1%:")
    for w in wins:
        print(f"  {w['model']} {w['cluster']} {w['memory_gib']:.0f} GiB: {w['note']}")
        if w.get("why"):
            print(f"      against the fixed batch's plan: {w['why']}")
    owins = [{"model": r["model"], "cluster": r["cluster"], "memory_gib": r["memory_gib"], **r["offload"]}
             for r in rows if r.get("offload", {}).get("wins")]
    print(f"CPU offload: {len(owins)} combo(s) where it lets the model fit where no baseline without offload does, "
          "or beats every baseline by more than 1%:")
    for w in owins:
        print(f"  {w['model']} {w['cluster']} {w['memory_gib']:.0f} GiB: {w['reason']}")
    worse = _worse_than_previous(rows)
    print(f"rows worse than the previous results: {len(worse)}" + "".join(f"\n  {w}" for w in worse))
    path = write_results("plan_quality", {"rows": rows, "offload_wins": owins, "worse_than_previous": worse, "min_ratio": min_ratio, "ratio_never_below_1": never_below,
                                          "below_1": below, "auto_batch_wins": wins, "baselines_never_fit": never_fit, "skipped": skipped,
                                          "quick": args.quick, "wall_s": wall, "machine": machine()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
