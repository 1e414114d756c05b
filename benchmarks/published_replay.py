"""Published GPU training runs replayed: predicted vs published step time and memory.

Every row of ``benchmarks/published_data.json`` (published measurements of real multi-GPU training
runs, each with its source; the schema is ``published_data.py``'s doc) whose configuration the planner can express is replayed: the model
is built on the ``meta`` device from the published dimensions (GPT or Llama family), the cluster
from the GPU's preset with the published GPU count (memory set to the variant's), and the plan is
pinned through the search caps to the published tensor, pipeline and data-parallel degrees,
micro-batches (from the micro-batch size where published), schedule (interleaved where virtual
stages are), sequence parallelism, recomputation and ZeRO / FSDP flavour (each left to the
search where the source does not say; Megatron-LM 2021's runs recompute, as its FLOP formula,
which counts a recomputed forward, says). The analytic GPU cost model with the presets' figures
then predicts the step; nothing here is fitted to the rows.

The published step time is the source's own where given, else the global batch's tokens over
the published tokens/s per GPU × GPUs, else the source's FLOPs per step (its formula, e.g.
Megatron-LM's Eq. 3) over the published TFLOP/s per GPU × GPUs. Published memory (torchtitan's
``max_reserved``, what PyTorch's caching allocator holds) is compared with the plan's tensor
peak × the device's allocator factor (``nvidia-smi`` would add the context and NCCL buffers;
torchtitan runs with expandable segments, whose reserve is taken as the tensor peak itself).

Rows that cannot be pinned are listed with the reason (FP8 — no FP8 compute in the planner;
GPUs without a preset — B200, GB200, GB300; context parallelism; degrees the source does not
give). A pinned plan that the memory model says does not fit in the device is priced anyway
(with an unbounded budget) and flagged ``fits: false``.

Prints a table and the median absolute error and Spearman correlation per source and overall;
writes ``benchmarks/results/published_replay.json``.

    python benchmarks/published_replay.py [--source megatron-lm-2021 ...] [--limit N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

DATA = Path(__file__).resolve().parent / "published_data.json"  # read as data (published_data.py: its schema)
GiB = 2**30

# published GPU name -> (preset, memory GiB of the variant, note)
_GPUS = {
    "A100-80GB": ("dgx-a100-80g", 80, ""),
    "A100-40GB": ("dgx-a100-80g", 40, ""),
    "H100-SXM-80GB": ("dgx-h100", 80, ""),
    "H100-94GB": ("dgx-h100", 94, ""),
    "H100-SXM-96GB-HBM2e-500W": ("dgx-h100", 96, "power-capped at 500 W: slower than the 700 W preset"),
    "H200-141GB": ("h200", None, ""),
}
# sources that state mixed 16-bit precision for every run without a per-row column
_SIXTEEN_BIT = {"megatron-lm-2021", "korthikanti-2022"}
# sources whose FLOP formula counts one recomputed forward: their runs recomputed every layer
_RECOMPUTED = {"megatron-lm-2021"}
# sources whose runs set PYTORCH_ALLOC_CONF=expandable_segments:True (torchtitan's run_train.sh):
# the caching allocator grows segments in pages instead of keeping freed blocks, so its reserve is
# taken as the tensor peak rather than the allocator factor's fragmentation of fixed blocks
_EXPANDABLE_SEGMENTS = {"torchtitan"}
_ZERO = {"none": ("ddp",), "zero1": ("zero2",), "zero2": ("zero2",), "zero3": ("zero3",), "fsdp": ("zero3",)}


def _unpinned(row: dict) -> str | None:
    """Why ``row`` cannot be replayed, or None."""
    par, cl, mo = row["parallel"], row["cluster"], row["model"]
    if par.get("precision") not in (None, "bf16", "fp16"):
        return f"{par['precision']} compute (the planner prices bf16/fp16/fp32)"
    if par.get("precision") is None and row["source"] not in _SIXTEEN_BIT:
        return "precision not published (the source's other tables are FP8)"
    if cl["gpu"] not in _GPUS:
        return f"no preset for {cl['gpu']}"
    if par.get("tp") is None or par.get("pp") is None:
        return "tensor / pipeline degrees not published"
    if cl["num_gpus"] % 8 and cl["num_gpus"] > 8:
        return f"{cl['num_gpus']} GPUs are not whole 8-GPU nodes"
    if mo["family"] not in ("gpt", "llama"):
        return f"model family {mo['family']}"
    if _published_step_s(row) is None:
        return "no step time, tokens/s or TFLOP/s with a known FLOP formula"
    return None


def _published_step_s(row: dict) -> float | None:
    m, par, mo, n = row["measured"], row["parallel"], row["model"], row["cluster"]["num_gpus"]
    if m.get("step_time_s"):
        return float(m["step_time_s"])
    tokens = par["global_batch"] * mo["seq_len"]
    if m.get("tokens_per_s_per_gpu"):
        return tokens / (m["tokens_per_s_per_gpu"] * n)
    if m.get("tflops_per_gpu") and row["source"] == "megatron-lm-2021":
        # Narayanan et al. 2021, Eq. 3 (recompute counted): 96 B s l h^2 (1 + s/6h + V/16lh)
        b, s, l, h, v = par["global_batch"], mo["seq_len"], mo["layers"], mo["hidden"], mo["vocab"]
        flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        return flops / (m["tflops_per_gpu"] * 1e12 * n)
    return None


def _model(row: dict):

    mo = row["model"]
    if mo["family"] == "gpt":
        ffn = mo.get("ffn_hidden") or 4 * mo["hidden"]
        if ffn % mo["hidden"]:
            raise ValueError(f"ffn {ffn} is not a multiple of the width {mo['hidden']}")
        return "gpt3-175b", {"n_layers": mo["layers"], "d_model": mo["hidden"], "n_heads": mo["heads"],
                             "vocab_size": mo.get("vocab") or 51200, "max_seq_len": mo["seq_len"],
                             "ffn_mult": ffn // mo["hidden"]}
    return "llama2-70b", {"n_layers": mo["layers"], "d_model": mo["hidden"], "n_heads": mo["heads"],
                          "n_kv_heads": mo.get("kv_heads") or mo["heads"], "ffn_dim": mo["ffn_hidden"],
                          "vocab_size": mo.get("vocab") or 32000, "max_seq_len": mo["seq_len"]}


def _cluster(row: dict):
    import galvatron_fx as gfx

    preset, mem, _ = _GPUS[row["cluster"]["gpu"]]
    n = row["cluster"]["num_gpus"]
    cl = gfx.Cluster.preset(preset, nodes=max(1, n // 8))
    if n < 8:
        cl = dataclasses.replace(cl, devices_per_node=n)
    if mem is not None:
        (kind, spec), = cl.device_specs.items()
        cl = dataclasses.replace(cl, device_specs={kind: dataclasses.replace(spec, memory_bytes=mem * GiB)})
    return cl


def _space(row: dict) -> dict:
    from galvatron_fx.ir.recompute import Recompute
    from galvatron_fx.ir.strategy import DPType, SPMode

    par = row["parallel"]
    space = {"tp": (par["tp"],), "pp": (par["pp"],), "uniform": True}
    dp = row["cluster"]["num_gpus"] // (par["tp"] * par["pp"])
    if par.get("micro_batch"):
        m = par["global_batch"] // (par["micro_batch"] * dp)
        space["num_microbatches"] = (max(1, m),)
        space["max_microbatches"] = max(64, m)
    vs = par.get("virtual_stages")
    if par["pp"] > 1:
        space["schedules"] = ("interleaved_1f1b",) if vs and vs > 1 else ("1f1b",)
    sp = par.get("sequence_parallel")
    if sp is not None and par["tp"] > 1:
        space["sp"] = (SPMode.MEGATRON,) if sp else (SPMode.NONE,)
    elif par["tp"] == 1:
        space["sp"] = (SPMode.NONE,)
    recompute = par.get("recompute") or ("full" if row["source"] in _RECOMPUTED else None)
    if recompute is not None:
        space["recompute"] = (Recompute(recompute),)
    if par.get("zero") is not None and dp > 1:
        space["dp_types"] = tuple(DPType(x) for x in _ZERO[par["zero"]])
    return space


def _replay(row: dict, graphs: dict) -> dict:
    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.errors import PlanError

    name, overrides = _model(row)
    key = (name, tuple(sorted(overrides.items())))
    if key not in graphs:
        t = time.perf_counter()
        model, inputs = zoo.build(name, batch_size=1, seq_len=row["model"]["seq_len"], device="meta",
                                  overrides=overrides)
        graphs[key] = (gfx.capture(model, inputs, name=row["id"]), time.perf_counter() - t)
    mg, capture_s = graphs[key]
    cl = _cluster(row)
    precision = row["parallel"].get("precision") or "bf16"
    kw = dict(global_batch_size=row["parallel"]["global_batch"], precision=precision, search=_space(row),
              baselines=False)
    t = time.perf_counter()
    fits = True
    try:
        plan = gfx.plan(mg, cl, **kw)
    except PlanError:
        fits = False
        plan = gfx.plan(mg, cl, memory_budget=2**50, **kw)
    search_s = time.perf_counter() - t
    spec = cl.device(0)
    published = _published_step_s(row)
    predicted = plan.predicted.step_time_s
    out = {"id": row["id"], "source": row["source"], "gpu": row["cluster"]["gpu"], "gpus": row["cluster"]["num_gpus"],
           "params_b": row["model"]["params_b"], "tp": row["parallel"]["tp"], "pp": row["parallel"]["pp"],
           "global_batch": row["parallel"]["global_batch"], "planned": {
               "pp": plan.pp, "num_microbatches": plan.num_microbatches, "schedule": plan.schedule,
               "strategies": sorted({f"{lp.strategy.short()} dp{lp.dp}" for lp in plan.layers})},
           "fits": fits, "published_step_s": published, "predicted_step_s": predicted,
           "time_error": (predicted - published) / published, "breakdown": plan.predicted.breakdown,
           "search_s": search_s, "capture_s": capture_s}
    if row["measured"].get("memory_gib"):
        pub = row["measured"]["memory_gib"] * GiB
        factor = 1.0 if row["source"] in _EXPANDABLE_SEGMENTS else spec.allocator_factor
        pred = factor * max(plan.predicted.peak_memory_bytes)
        out.update(published_memory_gib=pub / GiB, predicted_memory_gib=pred / GiB,
                   memory_error=(pred - pub) / pub, predicted_device_gib=max(plan.predicted.device_peak_bytes) / GiB)
    return out


def _summary(rows: list[dict]) -> dict:
    from scipy.stats import spearmanr

    def block(rs):
        te = [abs(r["time_error"]) for r in rs]
        me = [abs(r["memory_error"]) for r in rs if "memory_error" in r]
        d = {"rows": len(rs), "median_time_error": statistics.median(te) if te else None,
             "median_signed_time_error": statistics.median(r["time_error"] for r in rs) if rs else None,
             "memory_rows": len(me), "median_memory_error": statistics.median(me) if me else None}
        if len(rs) >= 3:
            rho = spearmanr([r["published_step_s"] for r in rs], [r["predicted_step_s"] for r in rs]).statistic
            d["spearman_time"] = None if math.isnan(rho) else float(rho)
        return d

    by = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r)
    return {"overall": block(rows), "per_source": {s: block(rs) for s, rs in sorted(by.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", nargs="*", help="replay only these sources")
    ap.add_argument("--limit", type=int, default=0, help="at most this many rows per source (0: all)")
    args = ap.parse_args()
    data = json.loads(DATA.read_text(encoding="utf-8"))
    rows, skipped, graphs, per = [], [], {}, {}
    t0 = time.perf_counter()
    for row in data["ROWS"]:
        if args.source and row["source"] not in args.source:
            continue
        why = _unpinned(row)
        if why is None and args.limit and per.get(row["source"], 0) >= args.limit:
            continue
        if why is not None:
            skipped.append({"id": row["id"], "source": row["source"], "why": why})
            continue
        per[row["source"]] = per.get(row["source"], 0) + 1
        try:
            r = _replay(row, graphs)
        except Exception as e:  # a row the planner cannot express: reported, not hidden
            skipped.append({"id": row["id"], "source": row["source"], "why": f"{type(e).__name__}: {e}"[:300]})
            continue
        rows.append(r)
        mem = f"{r['predicted_memory_gib']:6.1f}/{r['published_memory_gib']:5.1f}" if "memory_error" in r else " " * 12
        print(f"{r['id'][:44]:<44} {r['gpus']:>5} tp{r['tp']} pp{r['pp']:<3} pub {r['published_step_s']:8.3f}s "
              f"pred {r['predicted_step_s']:8.3f}s {r['time_error'] * 100:+6.1f}%  mem {mem}"
              f"{'' if r['fits'] else '  (does not fit)'}", flush=True)
    for s in data.get("CP_ROWS", []):
        if not args.source or s["source"] in args.source:
            skipped.append({"id": s["id"], "source": s["source"], "why": "context parallelism"})
    summ = _summary(rows)
    print(f"\n{'source':<30} {'rows':>4} {'median |time err|':>18} {'signed':>8} {'spearman':>9} {'mem rows':>8} "
          f"{'median |mem err|':>17}")
    for s, b in [*summ["per_source"].items(), ("overall", summ["overall"])]:
        sp = f"{b['spearman_time']:.2f}" if b.get("spearman_time") is not None else "-"
        mm = f"{b['median_memory_error'] * 100:.1f}%" if b["median_memory_error"] is not None else "-"
        print(f"{s:<30} {b['rows']:>4} {b['median_time_error'] * 100:>17.1f}% {b['median_signed_time_error'] * 100:>+7.1f}% "
              f"{sp:>9} {b['memory_rows']:>8} {mm:>17}")
    print(f"\n{len(skipped)} rows not replayed (reasons in the JSON); {time.perf_counter() - t0:.0f} s")
    path = write_results("published_replay", {
        "summary": summ, "targets": {"median_time_error": 0.15, "median_memory_error": 0.10},
        "rows": rows, "not_replayed": skipped, "machine": machine()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
