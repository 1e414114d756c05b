"""Progressive context: train at sequence 64, then 128, then 256, each with its own plan, the
loss continuing across the switches.

Run under ``torchrun --standalone --nproc-per-node 4 examples/progressive_context.py`` (gloo; rank 0
prints). gpt-tiny (positions up to 256) is compiled for sequence 64; after each phase
``pm.replan(optimizer, seq_len=...)`` searches a plan for the longer context and switches the
module to it in place — parameters and AdamW state moved in memory — and training goes on with
batches of the longer sequences. Each phase prints its plan, its first and last loss and its
median step time; the last line names the three plans.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import galvatron_fx as gfx
from galvatron_fx import zoo


def batches(seq: int, n: int, batch: int = 16, vocab: int = 512) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token sequences that repeat a short motif (so the next token is predictable from context)."""
    g = torch.Generator().manual_seed(seq)
    out = []
    for _ in range(n):
        motif = torch.randint(0, min(vocab, 64), (batch, 8), generator=g)
        x = motif.repeat(1, seq // 8 + 2)
        out.append((x[:, :seq].clone(), x[:, 1:seq + 1].clone()))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="steps per phase (default 10)")
    p.add_argument("--seq", type=int, nargs="+", default=[64, 128, 256], help="the phases' sequence lengths")
    args = p.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --standalone --nproc-per-node 4 examples/progressive_context.py")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    main_rank = dist.get_rank() == 0
    try:
        torch.manual_seed(0)
        model, _ = zoo.build("gpt-tiny", batch_size=16, seq_len=args.seq[0], device="cpu", seed=0)
        first = batches(args.seq[0], 4)
        pm = gfx.compile(model, gfx.Cluster.local_cpu(dist.get_world_size()), first[0], global_batch_size=16)
        opt = torch.optim.AdamW(pm.parameters(), lr=3e-3)
        plans = []
        for k, seq in enumerate(args.seq):
            if k > 0:
                r = pm.replan(opt, seq_len=seq)
                if main_rank:
                    print(f"re-planned for sequence {seq}: " + "; ".join(r.lines()[1:]))
            data = first if k == 0 else batches(seq, 4)
            losses, times = [], []
            for step in range(args.steps):
                t0 = time.perf_counter()
                losses.append(pm.train_step(data[step % len(data)], opt))
                times.append(time.perf_counter() - t0)
            plans.append(pm.plan.explain().splitlines()[0].split(": ", 1)[1])
            if main_rank:
                print(f"sequence {seq}: {plans[-1]}; loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
                      f"median step {statistics.median(times[2:] or times) * 1e3:.1f} ms", flush=True)
        if main_rank:
            print("plans: " + " | ".join(f"seq {s}: {p}" for s, p in zip(args.seq, plans)))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
