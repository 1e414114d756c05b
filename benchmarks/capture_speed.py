"""Capture + cost annotation speed and memory for large zoo models on the meta device.

Each model runs in a fresh process so that its peak RSS is its own (torch's import included:
that is what a user pays). Prints a table and writes ``benchmarks/results/capture_speed.json``:
``{"<model>": {"seconds": ..., "peak_rss_bytes": ..., ...}, ..., "machine": {...}}``.

    python benchmarks/capture_speed.py [--models llama2-7b gpt3-175b ...] [--seq 2048]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

DEFAULT = ["gpt2-xl", "llama2-7b", "llama3-8b", "gpt3-6.7b", "llama2-70b", "gpt3-175b"]

_CHILD = r"""
import json, resource, sys, time
import torch
from galvatron_fx import capture, zoo
name, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seq = min(seq, getattr(zoo.config(name), "max_seq_len", seq) or seq)  # gpt2-* stop at 1024
t0 = time.perf_counter()
model, inputs = zoo.build(name, batch_size=batch, seq_len=seq, device="meta")
t1 = time.perf_counter()
mg = capture(model, inputs, name=name)
t2 = time.perf_counter()
tot = mg.total_costs()
print(json.dumps({
    "seconds": t2 - t0, "build_s": t1 - t0, "capture_annotate_s": t2 - t1,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "num_nodes": len(mg.gm.graph.nodes), "num_layers": len(mg.layers), "num_kinds": len(mg.kinds()),
    "num_params": mg.num_params, "train_flops": tot.fwd_flops + tot.bwd_flops,
    "batch": batch, "seq": seq,
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=DEFAULT)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args()
    results: dict = {}
    print(f"{'model':<12} {'seq':>5} {'seconds':>8} {'peak RSS':>10} {'nodes':>6} {'layers':>6} {'kinds':>5} {'params':>10}")
    for name in args.models:
        out = subprocess.run([sys.executable, "-c", _CHILD, name, str(args.batch), str(args.seq)],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        results[name] = row
        print(f"{name:<12} {row['seq']:>5} {row['seconds']:>8.2f} {row['peak_rss_bytes'] / 2**30:>8.2f}Gi "
              f"{row['num_nodes']:>6} {row['num_layers']:>6} {row['num_kinds']:>5} {row['num_params'] / 1e9:>9.2f}B")
    results["machine"] = machine()
    path = write_results("capture_speed", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
