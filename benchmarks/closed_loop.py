"""The closed loop on this machine's CPUs: predicted step time before and after the refit, and the
speed-up of the re-planned module, measured in the same run.

For each case, ``torchrun`` starts ``WORLD`` gloo processes (one per core here) that compile gpt-tiny (global batch 16,
sequence 64) on a cluster description — this machine as ``Cluster.local_cpu`` describes it
(its cached hardware profile, or the defaults) with one stage and one micro-batch, and the same
with a link bandwidth 100× too low (a deliberately wrong model) and the whole search space — then: ``WARMUP`` steps; ``OBSERVE`` observed steps
(``pm.observe``; for a plan of one stage and one micro-batch the first also measures the peak
with MemTracker); ``pm.refit()``;
``HELD_OUT`` more steps of the same plan, timed (the refit never saw them); ``pm.replan(refit=...)``;
if it switched, ``HELD_OUT`` steps of the new plan after two warm-up steps. Per case:
``error_before`` = |plan's predicted − measured| / measured (median step time over the held-out
steps), ``error_after`` the same for the refitted prediction, ``memory_error_after`` for the peak,
``speedup_of_new_plan`` = the old plan's measured median / the new plan's; a new plan measured
more than 5% slower is switched back (as ``compile(adapt=True)`` does; ``switched_back``), and
``speedup`` = the old plan's median / the median of the plan the run ends on.
Prints a table and writes ``benchmarks/results/closed_loop.json`` (``{"cases": [...],
"median_error_before": ..., "median_error_after": ..., "machine": {...}}``).

    python benchmarks/closed_loop.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

WORLD = 2  # one process per core of this machine: no process waits for a core
WARMUP, OBSERVE, HELD_OUT = 3, 5, 8
# (name, link bandwidth too low by, search space): the first keeps one stage and one micro-batch
# (MemTracker measures the peak of such a plan); the second lets a wrong link pick a bad layout
CASES = [("as described", 1.0, "pp1"), ("bandwidth 100x low", 100.0, "free")]


def _worker(slow: float, space: str, out: str) -> None:
    import dataclasses

    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx import zoo

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cl = gfx.Cluster.local_cpu(world)
    if slow != 1.0:
        cl = dataclasses.replace(cl, intra_node=dataclasses.replace(
            cl.intra_node, bandwidth_bytes_s=cl.intra_node.bandwidth_bytes_s / slow,
            fits={c: {n: dataclasses.replace(f, beta_s_per_byte=f.beta_s_per_byte * slow) for n, f in per.items()}
                  for c, per in cl.intra_node.fits.items()}))
    model, inputs = zoo.build("gpt-tiny", batch_size=16, seq_len=64, device="cpu", seed=0)
    search = {"pp": (1,), "num_microbatches": (1,)} if space == "pp1" else None
    pm = gfx.compile(model, cl, inputs, global_batch_size=16, search=search)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    first = pm.plan

    def timed(n: int) -> float:
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            pm.train_step(inputs, opt)
            ts.append(time.perf_counter() - t0)
        every = [None] * world
        dist.all_gather_object(every, statistics.median(ts))
        return max(every)

    for _ in range(WARMUP):
        pm.train_step(inputs, opt)
    pm.observe(OBSERVE)
    for _ in range(OBSERVE + 1):
        pm.train_step(inputs, opt)
    fit = pm.refit()
    before = timed(HELD_OUT)
    r = pm.replan(opt, refit=fit)
    after, reverted, final = None, False, before
    if r.switched:
        for _ in range(2):
            pm.train_step(inputs, opt)
        after = final = timed(HELD_OUT)
        if after > before * 1.05:  # what compile(adapt=True) does: a switch the run refutes is undone
            pm.switch_to(r.old_plan, opt)
            for _ in range(2):
                pm.train_step(inputs, opt)
            reverted, final = True, timed(HELD_OUT)
    if rank == 0:
        Path(out).write_text(json.dumps({
            "plan": first.explain().splitlines()[0], "new_plan": pm.plan.explain().splitlines()[0],
            "predicted_s": first.predicted.step_time_s, "refitted_s": fit.refitted_step_s, "measured_s": before,
            "error_before": abs(first.predicted.step_time_s - before) / before,
            "error_after": abs(fit.refitted_step_s - before) / before,
            "predicted_peak_bytes": fit.predicted_peak_bytes, "refitted_peak_bytes": fit.refitted_peak_bytes,
            "measured_peak_bytes": fit.measured_peak_bytes,
            "memory_error_before": abs(fit.predicted_peak_bytes - fit.measured_peak_bytes) / fit.measured_peak_bytes
            if fit.measured_peak_bytes else None,
            "memory_error_after": abs(fit.refitted_peak_bytes - fit.measured_peak_bytes) / fit.measured_peak_bytes
            if fit.measured_peak_bytes else None,
            "switched": r.switched, "reason": r.reason, "new_predicted_s": r.new_predicted_s,
            "new_measured_s": after, "speedup_of_new_plan": before / after if after else None,
            "switched_back": reverted, "final_measured_s": final, "speedup": before / final, "refit": fit.lines()}))
    dist.destroy_process_group()


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}×"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(float(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    rows = []
    print(f"{'case':<20} {'predicted':>9} {'refitted':>9} {'measured':>9} {'err before':>10} {'err after':>9} "
          f"{'mem err':>8} {'switched':>8} {'new plan':>8} {'kept':>5} {'speed-up':>8}")
    for name, slow, space in CASES:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "case.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
                   __file__, "--worker", str(slow), space, str(out)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                  timeout=1200)
            if proc.returncode != 0:
                raise SystemExit(f"case {name!r} failed:\n{proc.stderr[-4000:]}")
            row = {"case": name, "link_slowdown": slow, "search": space, **json.loads(out.read_text()),
                   "wall_s": time.perf_counter() - t0}
        rows.append(row)
        mem = row["memory_error_after"]
        print(f"{name:<20} {row['predicted_s'] * 1e3:8.1f}  {row['refitted_s'] * 1e3:8.1f}  {row['measured_s'] * 1e3:8.1f} "
              f"{row['error_before']:>9.0%} {row['error_after']:>9.0%} {'-' if mem is None else f'{mem:.1%}':>8} "
              f"{str(row['switched']):>8} {_x(row['speedup_of_new_plan']):>8} "
              f"{'-' if not row['switched'] else ('no' if row['switched_back'] else 'yes'):>5} {row['speedup']:>7.2f}×",
              flush=True)
        print(f"{'':<20} {row['plan']} -> {row['new_plan']}: {row['reason']}")
    result = {"cases": rows, "median_error_before": statistics.median(r["error_before"] for r in rows),
              "median_error_after": statistics.median(r["error_after"] for r in rows),
              "world_size": WORLD, "machine": machine()}
    print(f"median step-time error: {result['median_error_before']:.0%} before the refit, "
          f"{result['median_error_after']:.0%} after")
    print(f"wrote {write_results('closed_loop', result)}")


if __name__ == "__main__":
    main()
