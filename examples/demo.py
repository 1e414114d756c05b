"""The demo behind ``make demo``.

Measures this machine's CPU runtime once (cached: the plans of ``examples/train.py`` are priced
with it), captures a small GPT that really runs here and a 7B Llama on the meta device (no weights),
annotates both with measured costs, prints what the planner sees (layers, kinds, FLOPs,
activation memory), then searches a hybrid-parallel plan for the Llama on one 8-GPU A100 node
under a memory budget and explains it against the hand-written baselines. Dumps (graph JSON,
DOT, plan JSON) go to ``runs/demo/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from galvatron_fx import capture, zoo

OUT = Path("runs/demo")


def show(name: str, *, batch: int, seq: int, device: str) -> None:
    t0 = time.perf_counter()
    model, inputs = zoo.build(name, batch_size=batch, seq_len=seq, device=device)
    mg = capture(model, inputs, name=name)
    dt = time.perf_counter() - t0
    print(mg.summary())
    tot = mg.total_costs()
    tokens = batch * seq
    print(f"  {tot.train_flops / (6 * mg.num_params * tokens):.3f} × 6·N·tokens "
          f"(the rest is attention); captured + annotated on {device} in {dt:.2f} s")
    if device != "meta":
        t1 = time.perf_counter()
        loss = model(*inputs)
        loss.backward()
        print(f"  real forward+backward on this CPU: loss {loss.item():.4f} in {time.perf_counter() - t1:.3f} s")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(mg.to_json_dict(nodes=True), indent=1))
    (OUT / f"{name}.dot").write_text(mg.to_dot())
    print(f"  wrote {OUT / (name + '.json')} and {OUT / (name + '.dot')}\n")


def plan_demo() -> None:
    import galvatron_fx as gfx

    model, inputs = zoo.build("llama2-7b", batch_size=1, seq_len=4096, device="meta")
    mg = capture(model, inputs, name="llama2-7b")
    cluster = gfx.Cluster.preset("dgx-a100-80g", nodes=1)
    budget = 40 * 2**30
    print(f"searching a plan for llama2-7b (global batch 64 x 4096 tokens) on {cluster.world_size} A100-80GB, "
          f"{budget / 2**30:.0f} GiB budget per GPU ...")
    p = gfx.plan(mg, cluster, global_batch_size=64, memory_budget=budget, precision="bf16")
    print(p.explain())
    print()
    print(p.explain("blocks.0"))
    path = p.save(OUT / "llama2-7b-plan.json")
    print(f"  wrote {path}")


def calibrate_cpu(world: int = 4) -> None:
    """This machine's CPU runtime, measured once and cached: what a training step through the
    runtime costs beyond its kernels' roofline (per kernel, per layer, the optimizer), collectives
    inside a step and ``world`` processes sharing the cores. Every later plan on this machine's
    CPU processes is priced with it (``galvatron_fx.cost_models.cpu_runtime``)."""
    from galvatron_fx.profiler import cpu_calibration

    if cpu_calibration.cache_path().exists():
        print(f"this machine's CPU runtime calibration: cached at {cpu_calibration.cache_path()}")
    else:
        print(f"measuring this machine's CPU runtime once (a training step's per-kernel, per-layer and optimizer "
              f"costs, collectives inside a step, {world} processes sharing the cores); cached for every later plan ...")
    t0 = time.perf_counter()
    cal = cpu_calibration.calibrate(worlds=(world,), runs=1, batch_sizes=(2, 4), repeats=3, progress=True)
    print(f"  {cal.summary()} ({time.perf_counter() - t0:.0f} s)\n")


def main() -> None:
    torch.manual_seed(0)
    calibrate_cpu()
    show("gpt-tiny", batch=8, seq=128, device="cpu")
    show("llama2-7b", batch=1, seq=2048, device="meta")
    plan_demo()


if __name__ == "__main__":
    main()
