"""The main job of ``make demo``: plan and train a small GPT on this machine's CPUs.

Run under ``torchrun --standalone --nproc-per-node 4 examples/train.py`` (gloo; rank 0 prints):

1. hardware: reuse the cached profile of this machine for this world size, or measure a quick
   one (a few message sizes and repeats, a few seconds) and cache it for next time;
2. plan: capture the model, search once without a memory limit, then again under a budget of
   ``--budget-fraction`` of that plan's predicted peak, so the plan has to shard, recompute or
   split tensors (tighter budgets are tried until the plan differs); the demo keeps one pipeline
   stage and one micro-batch (``search={"pp": (1,), "num_microbatches": (1,)}``: its memory
   measurement follows one call of each layer per step; pipelined and accumulating plans run too:
   ``tests/dist/test_pipeline.py``, ``tests/dist/test_hf_models.py``).
   Planning happens on rank 0; the plan is broadcast;
3. train ``--steps`` AdamW steps on a small fixed synthetic dataset (token sequences that repeat
   with a short period, so the loss falls visibly) with a progress bar on stderr, as a recipe
   does: warmup then cosine (``LambdaLR``), weight decay on all but biases and norms (parameter
   groups by ``pm.named_parameters()``), gradients clipped to a global norm of 1, and the loss of a
   held-out batch evaluated before, halfway and after (``pm(batch)`` under ``torch.no_grad()``);
4. measure: median wall time of ``train_step`` after warm-up, and the peak of tensor memory of
   one step per rank (``torch.distributed._tools.mem_tracker.MemTracker``), gathered to rank 0;
5. close the loop: the ``OBSERVE_STEPS`` steps after the memory step are observed (per-layer
   forward and backward times, gradient sync, optimizer, all-reduces on the plan's groups), the
   cost model is refitted from them and the memory step's peak (``pm.refit``); the ``HELD_OUT``
   steps after it are timed against the refitted prediction; then ``pm.replan`` searches again
   with the refitted model (the same budget), switching the module in place when the new plan
   is predicted faster (its steps are then timed too);
6. write ``plan.json``, ``report.json``, ``report.md`` and ``report.html`` (the page of
   ``galvatron-fx report``) to ``--out`` (default ``runs/demo``)
   and end with one line: predicted vs measured step time and peak memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cli.train_recipe import lr_at, param_groups
from galvatron_fx.cluster.host import default_cache_dir, local_fingerprint
from galvatron_fx.cost_models import cpu_runtime
from galvatron_fx.ir.plan import ParallelPlan

MiB = 2**20
WARMUP_STEPS = 3  # steps left out of the timing median (first-call overheads)
OBSERVE_STEPS = 8  # steps observed (per-layer times) before the closed loop refits
HELD_OUT = 8  # steps after the refit timed against its prediction, before the re-plan
MAX_NORM = 1.0  # the global gradient norm the steps clip to
WEIGHT_DECAY = 0.1


def _batch(text: str) -> int | str:
    return text if text == "auto" else int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-tiny", help="zoo model name (default gpt-tiny)")
    p.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    p.add_argument("--global-batch", type=_batch, default=16,
                   help="samples per step over all ranks (default 16), or auto: the largest the memory budget "
                        "holds at once (the budget then comes from the unconstrained plan at 16)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sample (default 64)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--budget-fraction", type=float, default=0.65,
                   help="memory budget as a fraction of the unconstrained plan's predicted peak (default 0.65)")
    p.add_argument("--ddp-only", action="store_true",
                   help="keep the search to replicated data parallelism (no ZeRO-2/3 layers)")
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--cache-dir", default=None, help="hardware profile cache (default $GFX_CACHE_DIR or ~/.cache/galvatron_fx)")
    return p.parse_args(argv)


# ---- printing (rank 0) ------------------------------------------------------------------------

def is_main() -> bool:
    return dist.get_rank() == 0


def say(*args) -> None:
    if is_main():
        print(*args, flush=True)


def mib(nbytes: float) -> str:
    return f"{nbytes / MiB:.2f} MiB"


class ProgressBar:
    """A text bar with the loss on stderr (rank 0): redrawn every step on a terminal, one line kept
    every tenth of the run (a plain line when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total, self.t0 = total, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.enabled = is_main()

    def update(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        frac = step / self.total
        el = time.perf_counter() - self.t0
        line = f"train [{'#' * int(30 * frac):<30}] {step}/{self.total} loss {loss:.3f} {el:5.1f}s"
        keep = step == self.total or step % max(1, self.total // 10) == 0
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if keep else ""))
        elif keep:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---- 1. hardware --------------------------------------------------------------------------------

def hardware(world: int, cache_dir: str | None) -> tuple[gfx.Cluster, str]:
    """This machine as a cluster: the cached profile if there is one, else a quick fresh one."""
    from galvatron_fx.cluster.spec import cached_profile
    from galvatron_fx.profiler.hardware import profile_hardware

    path = Path(default_cache_dir(cache_dir)) / f"hardware-{local_fingerprint(world)}.json"
    trusted = [cached_profile(world, cache_dir) if is_main() else None]
    dist.broadcast_object_list(trusted, src=0)
    cluster, why = trusted[0]
    if cluster is not None:
        source = why
    else:
        say(f"{why}: measuring a quick hardware profile for {world} gloo processes ...")
        t0 = time.perf_counter()
        profile_hardware(sizes_bytes=(4096, 65536, 2**20), repeats=2, warmup=1, matmul_sizes=(128, 256),
                         dtypes=("float32",), attention_seq_lens=(64,), cache_dir=cache_dir, use_cache=False,
                         progress=is_main())
        source = f"fresh hardware profile ({time.perf_counter() - t0:.1f} s), cached at {path}"
    dist.barrier()
    return gfx.Cluster.local_cpu(world, cache_dir=cache_dir), source


# ---- data ---------------------------------------------------------------------------------------

def synthetic_batches(num_batches: int, batch: int, seq_len: int, vocab: int, seed: int = 0):
    """``num_batches`` fixed (idx, targets) batches: each sample repeats a random motif of 2–8
    tokens from the first ``min(vocab, 64)`` ids, so next tokens are predictable from context."""
    g = torch.Generator().manual_seed(seed)
    ids = min(vocab, 64)
    out = []
    for _ in range(num_batches):
        rows = []
        for _ in range(batch):
            period = int(torch.randint(2, 9, (1,), generator=g))
            motif = torch.randint(0, ids, (period,), generator=g)
            rows.append(motif.repeat(-(-(seq_len + 1) // period))[: seq_len + 1])
        seq = torch.stack(rows)  # (B, T+1)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


# ---- 2. plan ------------------------------------------------------------------------------------

def strategies(plan: ParallelPlan) -> list[str]:
    return [f"{lp.name}: dp{lp.dp}·{lp.strategy.short()}" for lp in plan.layers]


def _start_batch(args) -> int:
    """The batch the model is built and first planned at (16 when the search chooses it)."""
    return 16 if args.global_batch == "auto" else args.global_batch


def make_plan(model, inputs, cluster, args) -> tuple[ParallelPlan, dict]:
    """Rank 0: capture, plan unconstrained, then under a budget tight enough to change the plan."""
    # one pipeline stage, one micro-batch: MemTracker (the measured peak) follows one call of
    # each layer per step, so the demo does not accumulate micro-batches either
    search = {"pp": (1,), "num_microbatches": (1,)}
    if args.ddp_only:
        search["dp_types"] = ("ddp",)
    t0 = time.perf_counter()
    mg = gfx.capture(model, inputs, name=args.model)
    t_capture = time.perf_counter() - t0
    free = gfx.plan(mg, cluster, global_batch_size=_start_batch(args), search=search, name=args.model)
    free_peak = max(free.predicted.peak_memory_bytes)
    print(f"captured {args.model} ({mg.num_params / 1e6:.2f} M parameters, {len(mg.layers)} layers) in "
          f"{t_capture:.1f} s; unconstrained plan: {free.predicted.step_time_s * 1e3:.1f} ms per step, "
          f"peak {mib(free_peak)} per rank", flush=True)
    plan, budget, tried = None, None, []
    for frac in (args.budget_fraction, 0.5, 0.4, 0.3):
        budget = int(frac * free_peak)
        try:
            p = gfx.plan(mg, cluster, global_batch_size=args.global_batch, memory_budget=budget, search=search,
                         name=args.model)  # ("auto": the largest batch this budget holds at once)
        except gfx.PlanError as e:  # nothing fits: keep the last plan that did
            tried.append((frac, f"no plan: {str(e).splitlines()[0]}"))
            break
        differs = strategies(p) != strategies(free) or (p.num_microbatches, p.global_batch_size) != (
            free.num_microbatches, free.global_batch_size)
        tried.append((frac, "differs" if differs else "same as unconstrained"))
        plan = p
        if differs:
            break
    if plan is None:
        raise SystemExit(f"no plan fits {args.budget_fraction:.0%} of the unconstrained peak: {tried}")
    print(f"memory budget {mib(budget)} per rank ({budget / free_peak:.0%} of the unconstrained peak; "
          f"tried {', '.join(f'{f:.0%}: {r}' for f, r in tried)})", flush=True)
    info = {"capture_s": t_capture, "num_params": mg.num_params, "budget_bytes": budget,
            "budget_fraction": budget / free_peak, "budget_tries": tried,
            "unconstrained": {"step_time_s": free.predicted.step_time_s, "peak_memory_bytes": free_peak,
                              "strategies": strategies(free)},
            "differs_from_unconstrained": tried[-1][1] == "differs" if tried else False}
    return plan, info


# ---- 4. memory ----------------------------------------------------------------------------------

def evaluate(pm, batch) -> float:
    """The model's loss on ``batch`` without gradients (every rank)."""
    with torch.no_grad():
        return float(pm(batch))


def tracked_step(pm, batch, opt, sched) -> tuple[float, int, dict[str, int]]:
    """One train_step under MemTracker: (loss, peak bytes, peak breakdown by kind) on this rank."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(pm, opt, *batch)
    with tracker:
        loss = pm.train_step(batch, opt, max_norm=MAX_NORM, scheduler=sched)
    snap = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
    kinds = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
    return loss, kinds.get("Total", 0), {k: v for k, v in kinds.items() if k != "Total"}


# ---- 5. the closed loop --------------------------------------------------------------------------

def refit(pm, peak_bytes: int):
    """Refit the cost model from the observed steps (and the peak the memory step measured on
    every rank) and print what changed."""
    import dataclasses

    obs = pm.observations()
    peaks = [0] * dist.get_world_size()
    dist.all_gather_object(peaks, peak_bytes)
    obs = dataclasses.replace(obs, peak_bytes=max(peaks) or None)
    fit = pm.refit(obs)
    say()
    say(f"closed loop after {OBSERVE_STEPS} observed steps: refitted the cost model from what they measured")
    for line in fit.lines():
        say(f"  {line}")
    return fit


def replan(pm, opt, fit):
    """Search again with the refitted model (same budget and space): the module switches in place
    if the new plan is predicted faster."""
    result = pm.replan(opt, refit=fit)
    for line in result.lines():
        say(f"  {line}")
    say()
    return result


# ---- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --standalone --nproc-per-node 4 examples/train.py")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t_start = time.perf_counter()
    out = Path(args.out)
    try:
        say(f"== training {args.model} on {world} CPU processes (gloo), global batch {args.global_batch} × "
            f"{args.seq_len} tokens, {args.steps} steps ==")
        # 1. hardware
        t0 = time.perf_counter()
        cluster, profile_source = hardware(world, args.cache_dir)
        t_profile = time.perf_counter() - t0
        calibrated = cpu_runtime.cached(cluster) is not None
        say(f"hardware: {profile_source}; "
            + ("plans priced with this machine's CPU runtime calibration" if calibrated else
               "no CPU runtime calibration cached (python examples/demo.py measures one): plans priced from the "
               "profile alone"))

        # 2. plan on rank 0, broadcast
        torch.manual_seed(0)
        model, inputs = zoo.build(args.model, batch_size=_start_batch(args), seq_len=args.seq_len, device="cpu", seed=0)
        t0 = time.perf_counter()
        box = [None]
        if rank == 0:
            plan, info = make_plan(model, inputs, cluster, args)
            box = [(plan.to_json(), info)]
        dist.broadcast_object_list(box, src=0)
        plan_json, plan_info = box[0]
        plan = ParallelPlan.from_json(plan_json)
        t_plan = time.perf_counter() - t0
        say()
        say(plan.explain())
        say()

        # 3. build and train
        t0 = time.perf_counter()
        pm = gfx.compile(model, cluster, inputs, global_batch_size=plan.global_batch_size, plan=plan)
        t_compile = time.perf_counter() - t0
        # a recipe's loop: weight decay on matrices only (groups by the model's own names),
        # warmup then cosine, gradients clipped to a global norm, a held-out validation batch
        opt = torch.optim.AdamW(param_groups(pm.named_parameters(), WEIGHT_DECAY), lr=args.lr)
        warmup = min(WARMUP_STEPS, args.steps - 1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, lr=1.0, steps=args.steps, warmup=warmup,
                                                                       schedule="cosine", min_lr=0.1))
        vocab = model.config.vocab_size
        data = synthetic_batches(4, plan.global_batch_size, args.seq_len, vocab)
        val = synthetic_batches(1, plan.global_batch_size, args.seq_len, vocab, seed=1)[0]
        say(f"built the parallel module in {t_compile:.1f} s; training on {len(data)} fixed synthetic batches "
            f"(repeating motifs): AdamW lr {args.lr} with {warmup} warmup steps then cosine to {args.lr / 10:g}, "
            f"weight decay {WEIGHT_DECAY} (none on biases and norms), gradients clipped to norm {MAX_NORM}; "
            f"val loss on a held-out batch")
        val_losses = [(0, evaluate(pm, val))]
        mem_step = min(WARMUP_STEPS, args.steps - 1)  # the step measured for memory (not timed)
        # the closed loop: observe the steps after it, refit the cost model, re-plan if that pays
        loop_at = mem_step + 1 + OBSERVE_STEPS if args.steps >= mem_step + 1 + OBSERVE_STEPS + HELD_OUT + 3 else None
        losses, times, held, after = [], [], [], []
        peak_bytes, peak_kinds = 0, {}
        fit = replanned = None
        bar = ProgressBar(args.steps)
        t_train0 = time.perf_counter()
        for step in range(args.steps):
            batch = data[step % len(data)]
            if loop_at is not None and step == mem_step + 1:
                pm.observe(OBSERVE_STEPS, memory=False)  # the memory step just measured the peak
            if step == loop_at:
                fit = refit(pm, peak_bytes)
            if step == loop_at + HELD_OUT:
                replanned = replan(pm, opt, fit)
            if step == mem_step:
                loss, peak_bytes, peak_kinds = tracked_step(pm, batch, opt, sched)
            else:
                t0 = time.perf_counter()
                loss = pm.train_step(batch, opt, max_norm=MAX_NORM, scheduler=sched)
                if step >= WARMUP_STEPS and (loop_at is None or step < loop_at):
                    times.append(time.perf_counter() - t0)
                elif loop_at is not None and step < loop_at + HELD_OUT:
                    held.append(time.perf_counter() - t0)  # the refitted plan's steps, unseen by the refit
                elif replanned is not None and replanned.switched and step >= loop_at + HELD_OUT + 2:
                    after.append(time.perf_counter() - t0)  # a new plan's, after two warm-up steps
            if not math.isfinite(loss):
                raise RuntimeError(f"step {step}: loss is {loss}")
            losses.append(loss)
            bar.update(step + 1, loss)
            if step + 1 == args.steps // 2:
                val_losses.append((step + 1, evaluate(pm, val)))
        val_losses.append((args.steps, evaluate(pm, val)))
        t_train = time.perf_counter() - t_train0
        if not times:  # very short runs: time what there is
            times = [t_train / args.steps]

        # 4. gather measurements
        mine = {"rank": rank, "median_step_s": statistics.median(times), "peak_memory_bytes": peak_bytes,
                "peak_breakdown_bytes": peak_kinds, "held_out_step_s": statistics.median(held) if held else None,
                "after_step_s": statistics.median(after) if after else None}
        per_rank: list = [None] * world
        dist.all_gather_object(per_rank, mine)

        # 5. report
        if rank == 0:
            pred_step = plan.predicted.step_time_s
            pred_peak = max(plan.predicted.peak_memory_bytes)
            meas_step = statistics.median(times)
            meas_peak = per_rank[0]["peak_memory_bytes"]
            out.mkdir(parents=True, exist_ok=True)
            plan.save(out / "plan.json")
            report = {
                "model": args.model, "world_size": world, "backend": "gloo",
                "global_batch_size": plan.global_batch_size, "seq_len": args.seq_len, "steps": args.steps,
                "num_microbatches": plan.num_microbatches, "hardware": profile_source,
                "plan": {"hash": plan.plan_hash(), "strategies": strategies(plan),
                         **plan_info},
                "predicted": {"step_time_s": pred_step, "peak_memory_bytes": pred_peak,
                              "memory_budget_bytes": plan.predicted.memory_budget_bytes,
                              "mfu": plan.predicted.mfu, "compute_density": list(plan.predicted.compute_density)},
                "measured": {"step_time_s": meas_step, "step_time_s_per_rank": [r["median_step_s"] for r in per_rank],
                             "peak_memory_bytes": meas_peak,
                             "peak_memory_bytes_per_rank": [r["peak_memory_bytes"] for r in per_rank],
                             "peak_breakdown_bytes_per_rank": [r["peak_breakdown_bytes"] for r in per_rank],
                             "timed_steps": len(times), "memory_step": mem_step,
                             # the plan's model FLOPs over the measured step and the plan's peak
                             "mfu": plan.predicted.model_flops / meas_step / plan.predicted.peak_flops
                             if plan.predicted.model_flops and plan.predicted.peak_flops else None},
                "loss": {"first": losses[0], "last": losses[-1], "curve": losses,
                         "val": [{"step": k, "loss": v} for k, v in val_losses]},
                "recipe": {"lr": args.lr, "warmup_steps": warmup, "schedule": "cosine", "min_lr": args.lr / 10,
                           "weight_decay": WEIGHT_DECAY, "max_norm": MAX_NORM},
                **({"refit": {**fit.to_dict(), "held_out_step_s": max(r["held_out_step_s"] for r in per_rank),
                              "switched": replanned.switched, "reason": replanned.reason,
                              "new_predicted_s": replanned.new_predicted_s,
                              "new_measured_s": max((r["after_step_s"] for r in per_rank if r["after_step_s"]),
                                                    default=None)}}
                   if fit is not None and replanned is not None else {}),
                "wall_s": {"profile": t_profile, "plan": t_plan, "compile": t_compile, "train": t_train,
                           "total": time.perf_counter() - t_start},
                "notes": ["measured step time: median wall time of train_step on each rank after "
                   f"{WARMUP_STEPS} warm-up steps, with {world} processes sharing {os.cpu_count()} CPU cores; the "
                   + ("prediction is priced with this machine's CPU runtime calibration (make demo measures it "
                      "once: the runtime's per-kernel, per-layer and optimizer costs, collectives inside a step, "
                      "shared cores)" if calibrated else
                      "prediction comes from the profiled matmul and collective rates and does not model small-op "
                      "inefficiency or DTensor's per-op overhead on CPU (no CPU runtime calibration cached: "
                      "python examples/demo.py measures one)"),
                   "measured memory: peak of tensor bytes seen by MemTracker during one training step "
                   "(parameters, gradients, optimizer states, activations and temporaries), per rank"],
            }
            (out / "report.json").write_text(json.dumps(report, indent=1))
            (out / "report.md").write_text(report_md(report))
            plan.report(out / "report.html", run=out)  # the plan and this run as one page
            say()
            say("per rank:  measured step ms   peak memory measured / predicted")
            for r in per_rank:
                say(f"  rank {r['rank']}:  {r['median_step_s'] * 1e3:8.1f}        "
                    f"{mib(r['peak_memory_bytes'])} / {mib(pred_peak)}")
            say(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {args.steps} steps, val loss "
                + " -> ".join(f"{v:.3f}" for _, v in val_losses) + " (held-out batch, steps "
                + ", ".join(str(k) for k, _ in val_losses) + "); "
                f"wrote {out / 'plan.json'}, {out / 'report.json'}, {out / 'report.md'}, {out / 'report.html'}")
            if fit is not None:
                held_s = max(r["held_out_step_s"] for r in per_rank)
                say(f"refitted: step predicted {fit.refitted_step_s * 1e3:.1f} ms, measured {held_s * 1e3:.1f} ms over the "
                    f"{HELD_OUT} steps after the refit ({abs(fit.refitted_step_s - held_s) / held_s:.0%} off; "
                    f"{abs(pred_step - meas_step) / meas_step:.0%} before it); peak memory {mib(fit.refitted_peak_bytes)}, "
                    f"measured {mib(fit.measured_peak_bytes)} "
                    f"({abs(fit.refitted_peak_bytes - fit.measured_peak_bytes) / fit.measured_peak_bytes:.1%} off)")
                if replanned is not None and replanned.switched and any(r["after_step_s"] for r in per_rank):
                    new_s = max(r["after_step_s"] for r in per_rank if r["after_step_s"])
                    say(f"re-planned: the new plan predicted {replanned.new_predicted_s * 1e3:.1f} ms per step, "
                        f"measured {new_s * 1e3:.1f} ms ({held_s / new_s:.2f}× the old plan's)")
            say(f"predicted step {pred_step * 1e3:.1f} ms, measured {meas_step * 1e3:.1f} ms; "
                f"peak memory predicted {mib(pred_peak)}, measured {mib(meas_peak)} (rank 0)")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def report_md(r: dict) -> str:
    """A short human summary of ``report.json``."""
    p, m = r["predicted"], r["measured"]
    lines = [
        f"# {r['model']} on {r['world_size']} CPU processes ({r['backend']})",
        "",
        f"- global batch {r['global_batch_size']} × {r['seq_len']} tokens, {r['num_microbatches']} micro-batch(es), "
        f"{r['steps']} steps",
        f"- hardware: {r['hardware']}",
        f"- memory budget {mib(r['plan']['budget_bytes'])} per rank "
        f"({r['plan']['budget_fraction']:.0%} of the unconstrained plan's "
        f"{mib(r['plan']['unconstrained']['peak_memory_bytes'])})",
        f"- loss {r['loss']['first']:.3f} → {r['loss']['last']:.3f}; val loss (held-out batch) "
        + " → ".join(f"{v['loss']:.3f} (step {v['step']})" for v in r["loss"].get("val", [])),
        f"- recipe: AdamW lr {r['recipe']['lr']:g}, {r['recipe']['warmup_steps']} warmup steps then cosine to "
        f"{r['recipe']['min_lr']:g}, weight decay {r['recipe']['weight_decay']} (none on biases and norms), "
        f"gradients clipped to norm {r['recipe']['max_norm']}",
        "",
        "## Plan",
        "",
        *[f"- {s}" for s in r["plan"]["strategies"]],
        "",
        "unconstrained plan: " + "; ".join(r["plan"]["unconstrained"]["strategies"]),
        "",
        "## Predicted vs measured",
        "",
        "| | predicted | measured |",
        "|---|---|---|",
        f"| step time | {p['step_time_s'] * 1e3:.1f} ms | {m['step_time_s'] * 1e3:.1f} ms (rank 0 median) |",
        *[f"| peak memory rank {i} | {mib(p['peak_memory_bytes'])} | {mib(b)} |"
          for i, b in enumerate(m["peak_memory_bytes_per_rank"])],
        *([f"| MFU | {p['mfu']:.1%} | {m['mfu']:.1%} |"] if p.get("mfu") and m.get("mfu") else []),
        "",
        *[f"- {n}" for n in r["notes"]],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
