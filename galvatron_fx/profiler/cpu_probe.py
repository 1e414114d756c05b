"""Timing the CPU probe: the measurements a CPU runtime calibration is fitted from.

Contract: each function runs the probe (:data:`galvatron_fx.cost_models.cpu_runtime.PROBE`) on
this machine — in this process, or in spawned gloo processes (``spawn``; one thread each) — and
returns medians of seconds, fitted figures and the raw timings (a ``dict`` kept under
``CPURuntimeCalibration.measured``). :mod:`galvatron_fx.profiler.cpu_calibration` combines them
into a calibration. Nothing here prices a plan.

Terms: those of :mod:`galvatron_fx.cost_models.cpu_runtime` (rates, runtime overhead, optimizer
step, slowdown, in-step collective, overlap); *probe plans* (``PROBE_PLANS``): the probe's
DDP, ZeRO-3 and tensor-parallel plans over all N ranks (:func:`probe_plan_space`).

Algorithm
---------
1. :func:`fit_rates`, in this process (one thread): capture the probe at each batch size, time
   each layer kind (``profiler.model``'s interleaved timing, medians of ``repeats``), fit the rates
   with :func:`galvatron_fx.profiler.model.fit_efficiency`.
2. :func:`fit_runtime_overhead`, in a spawned one-rank gloo group: compile the probe at each batch
   size, time ``steps`` training steps after warm-up and as many optimizer steps; the overhead is
   ``(step − optimizer step − roofline) / kernels``, median over batch sizes.
   AdamW over the probe's parameters, one flat tensor of as many elements and the parameters as
   DTensors gives the seconds per element (the flat tensor), per tensor and per DTensor (the rest
   over the tensor count).
3. :func:`measure_slowdown`, for every ``N > 1``: ``N`` spawned processes, each with the probe
   compiled in its own one-rank group; in a few rounds process 0 runs ``steps`` steps alone (the
   others asleep at a barrier), then all ``N`` run ``steps`` at once. The slowdown is the median
   over rounds of the together phase (first start to last end: a synchronous step waits for its
   slowest rank) over the alone phase just before it, so a burst of other load spoils one round,
   not the ratio.
4. :func:`measure_collectives`, for every ``N > 1``: ``N`` gloo ranks run eager probe steps alone,
   each followed by an all-reduce, each overlapping one, and each with one after its forward and
   one after its backward, for each group size and message size (interleaved over rounds;
   medians); the in-step time is the difference to the steps alone, the excess right after a sync
   the pair less the one after the step. The same ranks then compile the probe plans and time
   their steps (interleaved over rounds; medians).
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any

from galvatron_fx.cluster.spec import default_local_cpu
from galvatron_fx.cost_models.compute import ComputeEfficiency, ComputeModel
from galvatron_fx.cost_models.cpu_runtime import PROBE
from galvatron_fx.errors import ConfigError

__all__ = ["COLLECTIVE_SIZES", "PROBE_PLANS", "fit_rates", "fit_runtime_overhead", "measure_collectives",
           "measure_slowdown", "probe_plan_space", "time_concurrent"]

REFERENCE_FLOPS, REFERENCE_BYTES_S = 20e9, 10e9  # the fits' reference peaks (any positive values do)


def _quiet_compile(*args, **kwargs):
    """``galvatron_fx.compile`` without its line on stderr (the probe's compiles are not the user's)."""
    import galvatron_fx as gfx
    from galvatron_fx.build import quiet

    with quiet():
        return gfx.compile(*args, **kwargs)


# ---------------------------------------------------------------- 1. rates from single layers
def _probe_model(batch: int):
    from galvatron_fx import zoo

    return zoo.build(PROBE["family"], batch_size=batch, seq_len=PROBE["seq_len"], overrides=PROBE["overrides"],
                     device="cpu", seed=0)


def fit_rates(batch_sizes: Sequence[int] = (2, 4, 8), *, repeats: int = 5, warmup: int = 1,
              progress: bool = False) -> tuple[float, float, float, dict[str, Any]]:
    """``(flops_s, bytes_s, eager overhead_s, measured)`` from the probe's layers (module doc, step 1)."""
    import numpy as np
    import torch

    from galvatron_fx.frontend.capture import capture
    from galvatron_fx.profiler import model as mp

    graphs = {b: capture(*_probe_model(b)) for b in batch_sizes}
    jobs, where = [], []
    for b, mg in graphs.items():
        for layers in mg.kinds().values():
            jobs.append(mp._layer_job(mg, layers[0], torch.device("cpu")))
            where.append((b, layers[0]))
    res = mp._time_jobs(jobs, repeats=repeats, warmup=warmup, labels=[f"{l.name} b={b}" for b, l in where],
                        progress=progress)
    points, rows = [], []
    for (b, layer), (f, bk, _, _) in zip(where, res):
        rows.append({"layer": layer.name, "batch": b, "fwd_s": f, "bwd_s": bk})
        for d, t in (("fwd", f), ("bwd", bk)):
            fl, nb, n = mp._point_arrays(graphs[b], layer, d)
            if n and t > 0:
                points.append((0, d, fl, nb, n, float(t)))
    m, e, o = mp.fit_efficiency(points, REFERENCE_FLOPS, REFERENCE_BYTES_S)
    pred = mp._predict(np.log([m, e, o]), points, REFERENCE_FLOPS, REFERENCE_BYTES_S)
    err = [float(p / pt[5] - 1) for p, pt in zip(pred, points)]
    return m * REFERENCE_FLOPS, e * REFERENCE_BYTES_S, o, {"layers": rows, "layer_fit_rel_errors": err}


# ---------------------------------------------------------------- 2. the runtime's overhead
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runtime_worker(port: int, batch_sizes: Sequence[int], steps: int, queue) -> None:
    """One gloo rank: the probe compiled by galvatron_fx at each batch size; median step and
    optimizer-step seconds."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    out: dict[int | str, Any] = {}
    try:
        cluster = default_local_cpu(1)
        for b in batch_sizes:
            model, inputs = _probe_model(b)
            pm = _quiet_compile(model, cluster, inputs, global_batch_size=b,
                                search={"pp": (1,), "tp": (1,), "recompute": ("none",), "uniform": True})
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
            for _ in range(2):
                pm.train_step(inputs, opt)
            step, optim = [], []
            for _ in range(steps):
                t0 = time.perf_counter()
                pm.train_step(inputs, opt)
                step.append(time.perf_counter() - t0)
                for p in pm.parameters():
                    p.grad = torch.zeros_like(p)
                t0 = time.perf_counter()
                opt.step()
                optim.append(time.perf_counter() - t0)
                opt.zero_grad(set_to_none=True)
            nparams = sum(p.numel() for p in pm.parameters())
            out[b] = {"step_s": statistics.median(step), "optimizer_s": statistics.median(optim),
                      "params": nparams, "recompute": [str(lp.strategy.recompute) for lp in pm.plan.layers]}
        out["optimizer"] = _time_optimizer([p.detach() for p in pm.parameters()], steps)
    finally:
        dist.destroy_process_group()
        queue.put(out)


def _time_optimizer(params: list, steps: int) -> dict[str, float]:
    """Median seconds of an AdamW step (PyTorch's defaults) over ``params`` as plain tensors, over
    one flat tensor of as many elements, and over ``params`` as DTensors sharded on a one-rank
    mesh (as FSDP's are); with the element and tensor counts (module doc, step 2)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    numel = sum(p.numel() for p in params)
    sets = {"plain": [p.clone() for p in params], "flat": [torch.zeros(numel)],
            "dtensor": [distribute_tensor(p.clone(), mesh, [Shard(0)]) for p in params]}
    out: dict[str, float] = {"numel": float(numel), "tensors": float(len(params))}
    opts = {}
    for name, ts in sets.items():
        ps = [torch.nn.Parameter(t) for t in ts]
        for p in ps:
            p.grad = torch.zeros_like(p)
        opts[name] = torch.optim.AdamW(ps, lr=1e-3)
    # the three step in turn, round after round, so that a burst of load on a shared host falls on
    # all of them alike; the per-tensor costs are medians of the rounds' own differences
    rounds: list[dict[str, float]] = []
    for i in range(max(steps, 9) + 2):
        row = {}
        for name, opt in opts.items():
            t0 = time.perf_counter()
            opt.step()
            row[name] = time.perf_counter() - t0
        if i >= 2:
            rounds.append(row)
    for name in sets:
        out[f"{name}_s"] = statistics.median(r[name] for r in rounds)
    for name in ("plain", "dtensor"):
        out[f"{name}_minus_flat_s"] = statistics.median(r[name] - r["flat"] for r in rounds)
    return out


def fit_runtime_overhead(flops_s: float, bytes_s: float, batch_sizes: Sequence[int] = (4, 8), *,
                         steps: int = 9) -> tuple[float, tuple[float, float, float], dict[str, Any]]:
    """``(overhead_s per kernel, (optimizer seconds per element, per tensor, per DTensor),
    measured)`` (module doc, step 2)."""
    import torch.multiprocessing as tmp

    from galvatron_fx.frontend.capture import capture

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_runtime_worker, args=(_free_port(), tuple(batch_sizes), steps, queue))
    p.start()
    runs = queue.get(timeout=600)
    p.join()
    if not runs or "optimizer" not in runs:
        raise ConfigError("cpu_runtime: the runtime micro-run failed (see the log); re-run calibrate()")
    opt = runs.pop("optimizer")
    per_element = opt["flat_s"] / opt["numel"]
    per_tensor = max(0.0, opt["plain_minus_flat_s"]) / opt["tensors"]
    per_dtensor = max(0.0, opt["dtensor_minus_flat_s"]) / opt["tensors"]
    cl = default_local_cpu(1)
    rows, per_kernel = [], []
    roof = ComputeModel(cl, ComputeEfficiency(matmul=flops_s / REFERENCE_FLOPS, memory=bytes_s / REFERENCE_BYTES_S,
                                              overhead_s=0.0))
    unit = ComputeModel(cl, ComputeEfficiency(matmul=1e12, memory=1e12, overhead_s=1.0))
    for b, r in sorted(runs.items()):
        mg = capture(*_probe_model(b))
        roofline = kernels = 0.0
        for layer, lrc in zip(mg.layers, r["recompute"]):
            roofline += sum(roof.layer_times_s(mg, layer, recompute=lrc))
            kernels += sum(unit.layer_times_s(mg, layer, recompute=lrc))
        per_kernel.append(max(r["step_s"] - r["optimizer_s"] - roofline, 0.0) / kernels)
        rows.append({"batch": b, **{k: v for k, v in r.items() if k != "recompute"},
                     "roofline_s": roofline, "kernels": round(kernels)})
    return statistics.median(per_kernel), (per_element, per_tensor, per_dtensor), {"runtime_steps": rows,
                                                                                   "optimizer": opt}


# ---------------------------------------------------------------- 3. processes sharing the cores
def _step_worker(idx: int, port: int, barrier, queue, batch: int, rounds: int, steps: int) -> None:
    """Alternate, ``rounds`` times: ``steps`` training steps of the probe through the runtime (in
    this process's own one-rank gloo group) by process 0 alone, the others asleep at the barrier,
    then ``steps`` by every process at once; record each phase's (start, end) on the system-wide
    monotonic clock."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    try:
        model, inputs = _probe_model(batch)
        pm = _quiet_compile(model, default_local_cpu(1), inputs, global_batch_size=batch, search={"pp": (1,)})
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        pm.train_step(inputs, opt)  # warm-up
        alone, together = [], []

        def run() -> tuple[float, float]:
            t0 = time.monotonic()
            for _ in range(steps):
                pm.train_step(inputs, opt)
            return t0, time.monotonic()

        for _ in range(rounds):
            barrier.wait()
            if idx == 0:
                alone.append(run())
            barrier.wait()
            together.append(run())
        queue.put((idx, alone, together))
    finally:
        dist.destroy_process_group()


def time_concurrent(processes: int, *, batch: int = 16, rounds: int = 5,
                    steps: int = 5) -> tuple[list[float], list[float]]:
    """Seconds of ``steps`` probe steps by one process alone, and by all ``processes`` at once
    (first start to last end), per round (module doc, step 3)."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_step_worker, args=(i, _free_port(), barrier, queue, batch, rounds, steps))
             for i in range(processes)]
    for p in procs:
        p.start()
    out = {i: (a, t) for i, a, t in (queue.get(timeout=600) for _ in procs)}
    for p in procs:
        p.join()
    alone = [e - s for s, e in out[0][0]]
    together = [max(out[i][1][r][1] for i in out) - min(out[i][1][r][0] for i in out) for r in range(rounds)]
    return alone, together


def measure_slowdown(worlds: Sequence[int], *, batch: int = 16, rounds: int = 7,
                     steps: int = 5) -> tuple[dict[int, float], dict]:
    """Slowdown of each N in ``worlds`` over one process (module doc, step 3)."""
    out, raw = {1: 1.0}, {}
    for n in sorted(set(worlds) - {1}):
        alone, together = time_concurrent(n, batch=batch, rounds=rounds, steps=steps)
        out[n] = statistics.median(t / a for a, t in zip(alone, together))
        raw[str(n)] = {"alone_s": alone, "together_s": together, "steps": steps, "batch": batch}
    return out, raw


# ---------------------------------------------------------------- 4. collectives inside a step
COLLECTIVE_SIZES = (4096, 262144, 1048576)
AFTER, OVERLAPPED, SPLIT = 0, 1, 2  # when the timed all-reduce runs (see _collective_worker)


PROBE_PLANS = ("ddp", "zero3", "tp")  # the probe's plans timed at N ranks


def probe_plan_space(name: str, world: int) -> dict:
    """The search space of probe plan ``name`` at ``world`` ranks, no pipeline, no recomputation:
    every layer data-parallel over all ranks (``ddp``, ``zero3``), or tensor-parallel over all
    (``tp``, the intra-layer ILP's placements)."""
    dp_type, tp = {"ddp": ("ddp", 1), "zero3": ("zero3", 1), "tp": ("ddp", world)}[name]
    return {"tp": (tp,), "sp": ("none",), "dp_types": (dp_type,), "recompute": ("none",), "pp": (1,),
            "uniform": True}


def _collective_worker(rank: int, world: int, port: int, sizes: Sequence[int], rounds: int, iters: int,
                       queue) -> None:
    """One of ``world`` gloo ranks: probe forward+backward steps, alone and each followed by an
    all-reduce of ``size`` bytes in every contiguous group of ``g`` ranks (all groups at once, as
    tensor- or data-parallel groups run), for every group size ``g >= 2`` dividing ``world``,
    interleaved over rounds; then the probe compiled as each of ``PROBE_PLANS`` over all ranks,
    its training steps interleaved over rounds; rank 0 reports the median seconds per step of each."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        groups = {}
        for g in (g for g in range(2, world + 1) if world % g == 0):
            for start in range(0, world, g):  # every rank creates every group, in the same order
                pg = dist.new_group(list(range(start, start + g))) if g < world else dist.group.WORLD
                if start <= rank < start + g:
                    groups[g] = pg
        model, inputs = _probe_model(4)
        bufs = {b: torch.ones(b // 4) for b in sizes}
        # (group size, bytes, mode): 0 bytes = compute alone; AFTER: one all-reduce after each step;
        # OVERLAPPED: launched asynchronously before the step and waited for after it (as bucketed
        # data-parallel gradient sums overlap the backward); SPLIT: one after the forward and one
        # after the backward (each close to the previous sync)
        modes = [(0, 0, AFTER)] + [(g, b, mode) for g in groups for b in sizes for mode in (AFTER, OVERLAPPED, SPLIT)]
        times: dict[tuple[int, int, int], list[float]] = {m: [] for m in modes}
        model(*inputs).backward()
        for g, b, _ in modes[1:]:
            dist.all_reduce(bufs[b], group=groups[g])
        for _ in range(rounds):
            for g, b, mode in modes:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    work = dist.all_reduce(bufs[b], group=groups[g], async_op=True) if g and mode == OVERLAPPED \
                        else None
                    loss = model(*inputs)
                    if g and mode == SPLIT:
                        dist.all_reduce(bufs[b], group=groups[g])
                    loss.backward()
                    if work is not None:
                        work.wait()
                    elif g:
                        dist.all_reduce(bufs[b], group=groups[g])
                times[(g, b, mode)].append((time.perf_counter() - t0) / iters)
        res: dict[tuple, float] = {m: statistics.median(t) for m, t in times.items()}
        # the probe's DDP and ZeRO-3 plans over all ranks (4 samples per rank); FSDP's hooks warn
        # on every step on CPU
        warnings.filterwarnings("ignore", category=UserWarning)
        batch = 4 * world
        model, inputs = _probe_model(batch)
        live = {}
        for name in PROBE_PLANS:
            pm = _quiet_compile(model, default_local_cpu(world), inputs, global_batch_size=batch,
                             search=probe_plan_space(name, world))
            live[name] = (pm, torch.optim.AdamW(pm.parameters(), lr=0.0))
            for _ in range(2):
                pm.train_step(inputs, live[name][1])
        steps: dict[str, list[float]] = {name: [] for name in live}
        for _ in range(rounds):
            for name, (pm, opt) in live.items():
                for _ in range(iters // 2):
                    dist.barrier()
                    t0 = time.perf_counter()
                    pm.train_step(inputs, opt)
                    steps[name].append(time.perf_counter() - t0)
        res |= {("plan", name): statistics.median(t) for name, t in steps.items()}
        if rank == 0:
            queue.put(res)
    finally:
        dist.destroy_process_group()


def measure_collectives(worlds: Sequence[int], *, sizes: Sequence[int] = COLLECTIVE_SIZES, rounds: int = 5,
                        iters: int = 6) -> tuple[dict, dict, dict, dict[str, float], dict[int, float], dict]:
    """Per N in ``worlds`` and group size: all-reduce bytes -> seconds it adds to a step when N
    ranks compute (after the step; close to the previous sync), the slowdown of overlapping it
    with the step; per N and probe plan, its step seconds (``"N/name"``); per N, the probe step
    alone (module doc, step 4)."""
    import torch.multiprocessing as tmp

    plans: dict[str, float]
    out, close, overlap, plans, steps, raw = {}, {}, {}, {}, {}, {}
    for n in sorted(set(worlds) - {1}):
        ctx = tmp.get_context("spawn")
        queue = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_collective_worker, args=(r, n, port, tuple(sizes), rounds, iters, queue))
                 for r in range(n)]
        for p in procs:
            p.start()
        res = queue.get(timeout=600)
        for p in procs:
            p.join()
        plans |= {f"{n}/{k[1]}": t for k, t in res.items() if k[0] == "plan"}
        res = {k: t for k, t in res.items() if k[0] != "plan"}
        base = steps[n] = res[(0, 0, AFTER)]
        for g in sorted({g for g, _, _ in res if g}):
            out[(n, g)] = {b: max(res[(g, b, AFTER)] - base, 0.0) for b in sizes}
            # two per step, after the forward and after the backward: the excess grows with the
            # compute since the previous sync, from a floor; the pair minus the one after the
            # step is one collective right after a sync (cost_models.cpu_runtime's doc, in-step collective)
            close[(n, g)] = {b: min(max(res[(g, b, SPLIT)] - res[(g, b, AFTER)], 0.0), out[(n, g)][b]) for b in sizes}
            # the overlap slowdown as CommModel.overlapped_s defines it: both at once / the longer
            slow = [res[(g, b, OVERLAPPED)] / max(base, res[(g, b, AFTER)] - base) for b in sizes]
            overlap[(n, g)] = max(1.0, statistics.median(slow))
        names = {AFTER: "", OVERLAPPED: "overlapped_", SPLIT: "split_"}
        raw[str(n)] = {"step_s": base, **{f"step_with_{names[mode]}all_reduce_{b}_in_groups_of_{g}_s": t
                                          for (g, b, mode), t in res.items() if g}}
    return out, close, overlap, plans, steps, raw
