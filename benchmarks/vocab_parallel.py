"""Vocab-parallel cross-entropy against gathering the logits: predicted on GPUs, measured on CPUs.

Part 1, predicted (``AnalyticCostModel``, ``dgx-a100-80g``, bf16): the head + loss of Llama-2 7B
(32,000 classes) and Llama-3 8B (128,256) at sequence 4096, micro-batch 1, tp 2 / 4 / 8, priced
exactly as the planner prices them (:func:`~galvatron_fx.search.candidates.layer_choices`, DDP,
no recompute): per micro-batch forward + backward + tp collectives, and per-rank bytes kept for
the backward (activations) plus the head's weights, gradients and optimizer states (``act x``:
the activations alone). *gathered*: the head all-gathers its
vocab-sharded logits and every rank computes the whole loss (the search with
``vocab_parallel=False``: no class-sharded log-softmax or NLL loss anywhere); *vocab*: the
logits stay sharded and the loss all-reduces per-row scalars. ``ratio`` = gathered / vocab, from the same run. (GPT-2 and GPT-3's 50,257 classes
are not divisible by tp: they cannot shard on the vocabulary, a limitation of even sharding.)

Part 2, measured (this machine, ``--nproc`` gloo ranks on CPU, fp32): a 2-block GPT (width 128)
with 16,384 classes, sequence 128, 8 sequences per step, every layer at tp = world, planned by
the search twice in one run (``vocab_parallel`` on / off, on latency-free links so that the search
picks vocab-parallel at this size). Per plan: the median ``train_step`` time over the steps after
two warm-up steps (rank 0), the bytes the forward saves for the backward on rank 0 (every tensor
autograd keeps, counted once per storage, through ``saved_tensors_hooks``), and the first loss
(both plans must agree with each other).

    python benchmarks/vocab_parallel.py [--nproc 2] [--steps 8]

Prints two tables and writes ``benchmarks/results/vocab_parallel.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

PREDICTED = {"llama2-7b": 4096, "llama3-8b": 4096}
TPS = (2, 4, 8)


def _pair(mg, cache, tp: int, vocab: bool) -> dict:
    """The head + loss choices the planner prices at ``tp`` (the fastest of each layout pair)."""
    from galvatron_fx.ir.recompute import Recompute
    from galvatron_fx.ir.strategy import DPType
    from galvatron_fx.search.candidates import SearchSpace, layer_choices
    from galvatron_fx.search.transitions import transition_s

    space = SearchSpace(tp=(tp,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,), vocab_parallel=vocab)
    head, loss = mg.layers[-2], mg.layers[-1]
    kw = dict(devices=tp, ranks=list(range(tp)), samples=1, num_microbatches=1, captured_batch=1, devices_per_node=8)
    heads = [c for c in layer_choices(mg, head, cache, space, **kw) if c.strategy.tp == tp]
    losses = layer_choices(mg, loss, cache, space, **kw)
    nbytes = head.costs.output_bytes
    best = None
    for h in heads:
        for lo in losses:
            t = h.step_time_s(1) + lo.step_time_s(1) - h.optim_s - lo.optim_s \
                + transition_s(cache.cost_model, h, lo, nbytes, 3, list(range(tp)))
            if best is None or t < best[0]:
                best = (t, h, lo)
    t, h, lo = best
    return {"time_s": t, "memory_bytes": h.mem_bytes(1) + lo.mem_bytes(1),
            "activation_bytes": h.memory.activation_bytes + lo.memory.activation_bytes,
            "head_out": h.out_layout, "loss_in": lo.in_layout}


def predicted() -> list[dict]:
    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.cost_models.memory import Precision
    from galvatron_fx.search.candidates import OptionCache

    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"), precision=Precision.named("bf16"))
    rows = []
    for name, seq in PREDICTED.items():
        model, inputs = zoo.build(name, batch_size=1, seq_len=seq, device="meta")
        mg = gfx.capture(model, inputs)
        caches = {v: OptionCache(mg, cm, vocab_parallel=v) for v in (False, True)}
        for tp in TPS:
            g, v = _pair(mg, caches[False], tp, False), _pair(mg, caches[True], tp, True)
            rows.append({"model": name, "seq": seq, "tp": tp, "gathered": g, "vocab": v,
                         "time_ratio": g["time_s"] / v["time_s"], "memory_ratio": g["memory_bytes"] / v["memory_bytes"],
                         "activation_ratio": g["activation_bytes"] / v["activation_bytes"]})
    return rows


# ---- measured ---------------------------------------------------------------------------------

VOCAB, WIDTH, SEQ, BATCH = 16384, 128, 128, 8


def _saved_bytes(fn) -> int:
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        if t.device.type != "meta":
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def _worker(rank: int, world: int, port: int, steps: int, out: dict) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import galvatron_fx as gfx
    from galvatron_fx import zoo

    model, inputs = zoo.build("gpt-tiny", batch_size=BATCH, seq_len=SEQ,
                              overrides={"vocab_size": VOCAB, "n_layers": 2, "d_model": WIDTH})
    cl = gfx.Cluster.local_cpu(world)
    fast = dataclasses.replace(cl, intra_node=dataclasses.replace(cl.intra_node, latency_s=0.0))
    g = torch.Generator().manual_seed(1)
    batches = [tuple(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2)) for _ in range(steps + 2)]
    res = {}
    for key, vocab in (("gathered", False), ("vocab", True)):
        torch.manual_seed(0)
        pm = gfx.compile(model, fast, inputs, global_batch_size=BATCH,
                         search={"tp": (world,), "pp": (1,), "num_microbatches": (1,), "vocab_parallel": vocab})
        opt = torch.optim.SGD(pm.parameters(), lr=0.0)  # lr 0: every step sees the same weights
        loss = pm.train_step(batches[0], opt)
        pm.train_step(batches[1], opt)
        times = []
        for b in batches[2:]:
            dist.barrier()
            t0 = time.perf_counter()
            pm.train_step(b, opt)
            times.append(time.perf_counter() - t0)
        saved, val = _saved_bytes(lambda pm=pm: pm(*batches[0]))
        val.backward()
        opt.zero_grad(set_to_none=True)
        lp = pm.plan.layers[-1].placements
        res[key] = {"step_s": sorted(times)[len(times) // 2], "saved_bytes": saved, "first_loss": loss,
                    "loss_in": next(v for k, v in lp.items() if k.startswith("arg")),
                    "class_sharded": lp.get("_log_softmax") == "S(1)->S(1)"}
    if rank == 0:
        out.update(res)
    dist.destroy_process_group()


def measured(nproc: int, steps: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_worker, args=(nproc, port, steps, out), nprocs=nproc)
    res = dict(out)
    res["time_ratio"] = res["gathered"]["step_s"] / res["vocab"]["step_s"]
    res["saved_ratio"] = res["gathered"]["saved_bytes"] / res["vocab"]["saved_bytes"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = predicted()
    print(f"{'model':<10} {'tp':>2}  {'gathered ms':>11} {'vocab ms':>9} {'time x':>6}  "
          f"{'gathered GiB':>12} {'vocab GiB':>9} {'mem x':>6}  {'act x':>6}")
    for r in rows:
        g, v = r["gathered"], r["vocab"]
        print(f"{r['model']:<10} {r['tp']:>2}  {g['time_s'] * 1e3:>11.2f} {v['time_s'] * 1e3:>9.2f} {r['time_ratio']:>6.2f}  "
              f"{g['memory_bytes'] / 2**30:>12.2f} {v['memory_bytes'] / 2**30:>9.2f} {r['memory_ratio']:>6.2f}  "
              f"{r['activation_ratio']:>6.2f}")
    m = measured(args.nproc, args.steps)
    print(f"\nmeasured, {args.nproc} gloo ranks (tp {args.nproc}), vocab {VOCAB}, seq {SEQ}, batch {BATCH}:")
    print(f"{'plan':<9} {'loss in':>7} {'step ms':>8} {'saved MiB':>9} {'first loss':>10}")
    for key in ("gathered", "vocab"):
        r = m[key]
        print(f"{key:<9} {r['loss_in']:>7} {r['step_s'] * 1e3:>8.1f} {r['saved_bytes'] / 2**20:>9.1f} {r['first_loss']:>10.5f}")
    print(f"gathered / vocab: step time {m['time_ratio']:.2f}x, saved bytes {m['saved_ratio']:.2f}x")
    path = write_results("vocab_parallel", {"predicted": rows, "measured": m, "nproc": args.nproc, "steps": args.steps,
                                            "wall_s": time.perf_counter() - t0, "machine": machine()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
