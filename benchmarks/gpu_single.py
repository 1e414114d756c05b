"""One GPU: predicted vs measured step time and reserved memory of a ~1B model under several plans.

Prepared for a machine with an NVIDIA GPU (one process, NCCL): it profiles the GPU with
``galvatron_fx.profiler.hardware.profile_hardware`` (peaks, memory bandwidth, the host's fixed
costs per kernel and layer call, the CUDA context), plans a Llama-style model of about 1.1B
parameters (16 layers, width 2048, sequence 2048, bf16) for that one GPU under each pinned plan
(recompute none / full × micro-batch 1 / 2 / 4), trains each ``--steps`` steps with AdamW, and
compares the plan's predicted step time and device peak with the measured median step time
(``torch.cuda.synchronize`` around each step) and ``torch.cuda.max_memory_reserved``. A plan
the memory model says does not fit is still run (with an unbounded budget); a run that runs out
of memory is recorded as such. Writes ``benchmarks/results/gpu_single.json`` and prints a table.

``--tiny`` runs the same procedure on a small model (4 layers, width 256, sequence 256; any
device, CPU included) to check the script itself.

    python benchmarks/gpu_single.py [--steps 20] [--tiny]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

ONE_B = {"n_layers": 16, "d_model": 2048, "n_heads": 16, "n_kv_heads": 16, "ffn_dim": 5632, "vocab_size": 32000,
         "max_seq_len": 2048}
TINY = {"n_layers": 4, "d_model": 256, "n_heads": 4, "n_kv_heads": 4, "ffn_dim": 704, "vocab_size": 1024,
        "max_seq_len": 256}
PLANS = [(rc, mb) for rc in ("none", "full") for mb in (1, 2, 4)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a small model, any device (checks the script)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.errors import PlanError
    from galvatron_fx.profiler.hardware import profile_hardware

    cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    cfg = TINY if args.tiny else ONE_B
    seq = cfg["max_seq_len"]
    t0 = time.perf_counter()
    prof = profile_hardware(sizes_bytes=[2**20], p2p=False, overlap=False, progress=False,
                            matmul_sizes=(1024, 2048, 4096) if cuda else (256, 512),
                            attention_seq_lens=(512, 1024) if cuda else (128,))
    cluster = prof.cluster
    profile_s = time.perf_counter() - t0
    spec = cluster.device(0)
    print(f"profiled {spec.kind}: bf16 {spec.flops('bfloat16') / 1e12:.1f} TFLOP/s, "
          f"{spec.memory_bandwidth_bytes_s / 1e9:.0f} GB/s, kernel {spec.kernel_overhead_s}, layer "
          f"{spec.layer_overhead_s}, context {spec.context_bytes / 2**20:.0f} MiB ({profile_s:.0f} s)", flush=True)

    rows = []
    for rc, mb in PLANS:
        torch.manual_seed(0)
        model, inputs = zoo.build("llama2-7b", batch_size=mb, seq_len=seq, device=device, seed=0, overrides=cfg)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        search = {"tp": (1,), "pp": (1,), "num_microbatches": (1,), "recompute": (rc,), "uniform": True}
        row = {"recompute": rc, "micro_batch": mb, "seq_len": seq, "params": zoo.num_params("llama2-7b", overrides=cfg)}
        try:
            try:
                pm = gfx.compile(copy.deepcopy(model), cluster, inputs, global_batch_size=mb, search=search)
                row["fits"] = True
            except PlanError:
                pm = gfx.compile(copy.deepcopy(model), cluster, inputs, global_batch_size=mb, search=search,
                                 memory_budget=2**50)
                row["fits"] = False
            del model
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-4)
            g = torch.Generator(device="cpu").manual_seed(1)
            batch = [torch.randint(0, cfg["vocab_size"], x.shape, generator=g).to(device) for x in inputs]
            times = []
            for i in range(args.warmup + args.steps):
                if cuda:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                pm.train_step(batch, opt)
                if cuda:
                    torch.cuda.synchronize()
                if i >= args.warmup:
                    times.append(time.perf_counter() - t)
            pred = pm.plan.predicted
            row.update(predicted_step_s=pred.step_time_s, measured_step_s=statistics.median(times),
                       predicted_tensor_peak_bytes=max(pred.peak_memory_bytes),
                       predicted_device_peak_bytes=max(pred.device_peak_bytes),
                       measured_reserved_bytes=torch.cuda.max_memory_reserved(device) if cuda else None,
                       measured_allocated_bytes=torch.cuda.max_memory_allocated(device) if cuda else None)
            row["time_error"] = (row["predicted_step_s"] - row["measured_step_s"]) / row["measured_step_s"]
            if cuda:
                allocator = spec.allocator_factor * row["predicted_tensor_peak_bytes"]
                row["memory_error"] = (allocator - row["measured_reserved_bytes"]) / row["measured_reserved_bytes"]
            del pm, opt
        except torch.cuda.OutOfMemoryError as e:  # recorded, not hidden
            row["error"] = f"out of memory: {str(e)[:200]}"
        rows.append(row)
        mem = (f"{row['predicted_tensor_peak_bytes'] * spec.allocator_factor / 2**30:6.2f}/"
               f"{row['measured_reserved_bytes'] / 2**30:6.2f} GiB" if row.get("measured_reserved_bytes") else "")
        if "error" in row:
            print(f"recompute {rc:<5} mb {mb}: {row['error']}", flush=True)
        else:
            print(f"recompute {rc:<5} mb {mb}: predicted {row['predicted_step_s'] * 1e3:8.1f} ms, measured "
                  f"{row['measured_step_s'] * 1e3:8.1f} ms ({row['time_error'] * 100:+.1f}%)  {mem}"
                  f"{'' if row['fits'] else '  (predicted not to fit)'}", flush=True)
    ok = [r for r in rows if "error" not in r]
    summary = {"median_abs_time_error": statistics.median(abs(r["time_error"]) for r in ok) if ok else None,
               "median_abs_memory_error": statistics.median(abs(r["memory_error"]) for r in ok if "memory_error" in r)
               if any("memory_error" in r for r in ok) else None}
    print(summary)
    if not args.tiny:
        write_results("gpu_single", {"rows": rows, "summary": summary, "device": spec.kind,
                                     "cluster": cluster.to_dict(), "profile_s": profile_s, "machine": machine()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
