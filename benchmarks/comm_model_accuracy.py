"""How well the fitted communication model predicts held-out message sizes.

For world sizes 2 and 4 (gloo processes on this machine): profile every collective and p2p on
fit sizes (4 KiB .. 64 MiB, ×4 steps) *and* held-out sizes (the ×2 points between them) in the
same run, fit alpha/beta on the fit sizes only, and compare ``CommModel.time_s`` with the measured
time of every held-out size, group size and arrangement. Prints a table and writes
``benchmarks/results/comm_model_accuracy.json``.

    .venv/bin/python benchmarks/comm_model_accuracy.py [--worlds 2 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from galvatron_fx.cluster import Collective, TierName  # noqa: E402
from galvatron_fx.cost_models.communication import CommModel  # noqa: E402
from galvatron_fx.profiler.hardware import _arrangements  # noqa: E402
from galvatron_fx.profiler.hardware_profile import fit_rows  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
FIT_SIZES = [4 * KiB * 4**i for i in range(8)]  # 4 KiB .. 64 MiB
HELD_OUT = [8 * KiB * 4**i for i in range(7)]  # 8 KiB .. 32 MiB, never used in the fit


def _worker(rank: int, world: int, port: int, out: str, repeats: int) -> None:
    import torch.distributed as dist

    from galvatron_fx.profiler.hardware import profile_hardware

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        profile_hardware(
            sizes_bytes=FIT_SIZES + HELD_OUT, repeats=repeats, warmup=1, compute=False, overlap=False,
            cache_dir=tempfile.mkdtemp(), out=out, progress=False,
        )
    finally:
        dist.destroy_process_group()


def evaluate(world: int, repeats: int) -> tuple[list[dict], float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "profile.json")
        t0 = time.perf_counter()
        mp.spawn(_worker, args=(world, 29600 + world + os.getpid() % 200, out, repeats), nprocs=world)
        wall = time.perf_counter() - t0
        prof = json.loads(Path(out).read_text())
    from galvatron_fx.cluster import Cluster

    rows = prof["measurements"]
    # sizes are rounded down to a multiple of 4 n^2 bytes inside the profiler
    is_fit = lambda r: any(abs(r["nbytes"] - s) <= 4 * r["group_size"] ** 2 for s in FIT_SIZES)  # noqa: E731
    fits = fit_rows([r for r in rows if is_fit(r)])
    cluster = Cluster.from_dict(prof["cluster"])
    # keep the measured all-to-all (the cost model would otherwise cost it as DTensor's CPU all-gather)
    cluster = dataclasses.replace(cluster, all_to_all_via_all_gather=False)
    cluster = cluster.with_fits(TierName.INTRA_NODE, fits.get(TierName.INTRA_NODE, {}))
    model = CommModel(cluster)
    out_rows = []
    for r in rows:
        if is_fit(r):
            continue
        if r["collective"] == Collective.P2P:
            ranks = [int(x) for x in r["arrangement"].split("-")]
        else:
            ranks = _arrangements(world, r["group_size"])[r["arrangement"]][0]
        pred = model.time_s(r["collective"], r["nbytes"], ranks)
        out_rows.append(dict(world=world, collective=r["collective"], group_size=r["group_size"], arrangement=r["arrangement"],
                             nbytes=r["nbytes"], measured_s=r["time_s"], predicted_s=pred,
                             abs_rel_error=abs(pred - r["time_s"]) / r["time_s"]))
    return out_rows, statistics.median(x["abs_rel_error"] for x in out_rows), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/comm_model_accuracy.json"))
    args = ap.parse_args()
    all_rows, per_world, walls = [], {}, {}
    for w in args.worlds:
        rows, med, wall = evaluate(w, args.repeats)
        all_rows += rows
        per_world[str(w)] = med
        walls[str(w)] = wall
    per_coll = {}
    for w in args.worlds:
        for c in sorted({r["collective"] for r in all_rows if r["world"] == w}):
            errs = [r["abs_rel_error"] for r in all_rows if r["world"] == w and r["collective"] == c]
            per_coll[f"{w}/{c}"] = statistics.median(errs)
    print(f"{'world':>5} {'collective':<15} {'n':>2} {'arrangement':<11} {'size':>9} {'meas_ms':>9} {'pred_ms':>9} {'err':>6}")
    for r in all_rows:
        print(f"{r['world']:>5} {r['collective']:<15} {r['group_size']:>2} {r['arrangement']:<11} "
              f"{r['nbytes'] / KiB:>7.0f}Ki {r['measured_s'] * 1e3:>9.3f} {r['predicted_s'] * 1e3:>9.3f} {r['abs_rel_error']:>6.1%}")
    print("\nmedian |rel err| per world/collective:")
    for k, v in per_coll.items():
        print(f"  {k:<22} {v:6.1%}")
    overall = statistics.median(r["abs_rel_error"] for r in all_rows)
    for w, v in per_world.items():
        print(f"world {w}: median |rel err| {v:.1%} (profiling wall {walls[w]:.1f} s)")
    print(f"overall median |rel err| {overall:.1%} (target <= 15%)")
    result = dict(
        median_abs_rel_error=overall,
        median_abs_rel_error_per_world=per_world,
        median_abs_rel_error_per_collective=per_coll,
        target=0.15,
        fit_sizes_bytes=FIT_SIZES,
        held_out_sizes_bytes=HELD_OUT,
        repeats=args.repeats,
        profiling_wall_s=walls,
        machine=dict(host=socket.gethostname(), platform=platform.platform(), cpu_count=os.cpu_count(),
                     processor=platform.processor()),
        torch_version=torch.__version__,
        python=platform.python_version(),
        rows=all_rows,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if overall <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
