"""``galvatron-fx train``: plan and train a model from the command line or a TOML run config.

    torchrun --nproc-per-node 4 -m galvatron_fx.cli train --config run.toml [--steps 50] [--lr 3e-4]

A run config is one flat TOML table whose keys are the flags' names (``hf_config`` for
``--hf-config``); a flag given on the command line overrides its key; a key nobody knows is an
error (see :data:`FIELDS`). Relative paths in the file are relative to the file. The model is a
zoo name (``model = "gpt-tiny"``), ``hf_config`` or ``factory`` (``module:function``), built on
this rank's device with seed ``seed``; ``data = "module:function"`` gives the batches
(``function(step=, batch_size=, seq_len=)`` returning the model's inputs, a tuple or a mapping);
without it every step trains on the model's example batch (a smoke run: the loss falls as the
model learns that batch). ``cluster`` is ``local-cpu`` (this machine's CPU processes, with its
cached hardware profile if any: the default on CPU; as many nodes as torchrun started agents,
or ``nodes``), a preset or a cluster JSON. ``batch`` is the global batch, or ``"auto"`` (the
largest that fits at once), ``"LO:HI"`` (the fastest in the range) or ``tokens_per_step`` (the
batch nearest that target): the search then chooses it and the run trains at its batch.

Every step appends one JSON line to ``<out>/metrics.jsonl`` on rank 0 (step, loss, tokens/s,
step time, peak CUDA memory allocated — null on CPU —, MFU: the plan's model FLOPs over the step
time and the cluster's peak, and on the steps profiled — the third and every
``efficiency_every`` after it — each stage's measured compute density,
:mod:`galvatron_fx.runtime.efficiency`, with ``"profiled": true``); ``<out>/plan.json`` is the plan run,
``<out>/report.json`` the predicted against measured summary and ``<out>/report.html`` the plan and
the run as one page (:mod:`galvatron_fx.report_html`). ``checkpoint_dir`` saves every
``checkpoint_every`` steps and at the end (:mod:`galvatron_fx.runtime.checkpoint`), and resumes
from a checkpoint already there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from galvatron_fx.commands import DEFAULT_PRECISION, OFFLOAD_CHOICES, PRECISIONS, offload_space
from galvatron_fx.errors import ConfigError

# key -> (type, default); the flags of `galvatron-fx train` carry the same names
FIELDS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "model": (str, None), "hf_config": (str, None), "factory": (str, None), "data": (str, None),
    "cluster": (str, "local-cpu"), "nodes": (int, None),
    "batch": ((int, str), None), "tokens_per_step": (int, None), "seq": (int, None), "precision": (str, DEFAULT_PRECISION), "memory": ((int, float), None),
    "max_tp": (int, None), "tp": (list, None), "max_pp": (int, None), "pp": (list, None),
    "reduce_dtypes": (list, None), "powersgd_ranks": (list, None), "offload": (str, None), "host_memory": ((int, float), None),
    "steps": (int, 20), "lr": ((int, float), 1e-3), "optimizer": (str, "adamw"), "seed": (int, 0),
    "plan": (str, None), "out": (str, "runs/train"), "checkpoint_dir": (str, None), "checkpoint_every": (int, 0),
    "efficiency_every": (int, 10),
}
_PATHS = ("hf_config", "plan", "out", "checkpoint_dir")
OPTIMIZERS = ("adamw", "sgd")


def load_run_config(path: str | os.PathLike) -> dict[str, Any]:
    """The run config at ``path`` (TOML), checked: known keys, their types, relative paths made
    relative to the file. Nothing in it is executed (``data``/``factory`` name importable
    functions, imported when the run starts)."""
    import tomllib

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"run config {path}: cannot be read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"run config {path}: not valid TOML ({e})") from None
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ConfigError(f"run config {path}: unknown keys {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    for key, value in data.items():
        want = FIELDS[key][0]
        if not isinstance(value, want) or isinstance(value, bool):
            names = "/".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
            raise ConfigError(f"run config {path}: {key} = {value!r} should be a {names}")
        if key in ("tp", "pp", "powersgd_ranks") and not all(isinstance(v, int) for v in value):
            raise ConfigError(f"run config {path}: {key} should be a list of integers, e.g. [1, 2]")
        if key in _PATHS and not Path(value).is_absolute():
            data[key] = str(path.parent / value)
    return data


def resolve_run(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults, then the run config's keys, then the flags given."""
    run = {k: d for k, (_t, d) in FIELDS.items()}
    if getattr(args, "config", None) is not None:
        run.update(load_run_config(args.config))
    flags = {"model": args.zoo_name, **{k: getattr(args, k, None) for k in FIELDS if k != "model"}}
    run.update({k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in flags.items() if v is not None})
    if run["precision"] not in PRECISIONS:
        raise ConfigError(f"precision {run['precision']!r}: choose one of {', '.join(PRECISIONS)}")
    if run["optimizer"] not in OPTIMIZERS:
        raise ConfigError(f"optimizer {run['optimizer']!r}: choose one of {', '.join(OPTIMIZERS)}")
    if run["offload"] is not None and run["offload"] not in OFFLOAD_CHOICES:
        raise ConfigError(f"offload {run['offload']!r}: choose one of {', '.join(OFFLOAD_CHOICES)}")
    if run["steps"] < 1:
        raise ConfigError(f"steps must be >= 1, got {run['steps']}")
    return run


def _init_group():
    """This process's group: torchrun's, or a group of one when run directly."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ:
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend)
        else:
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return dist


def _cluster(run: dict, world: int, on_gpu: bool):
    from galvatron_fx.cluster import Cluster

    if run["cluster"] == "local-cpu":
        if on_gpu:
            raise ConfigError("cluster = local-cpu describes CPU processes; on GPUs give a preset (--cluster "
                              "dgx-h100 --nodes N), a cluster JSON, or a measured profile (galvatron-fx profile)")
        nodes = run["nodes"] or _launched_nodes(world)
        if world % nodes:
            raise ConfigError(f"--nodes {nodes} with cluster local-cpu: {world} processes do not split into "
                              f"{nodes} nodes; give a --nodes that divides the world size")
        return Cluster.local_cpu(world, nodes=nodes)
    return Cluster.from_spec(run["cluster"], run["nodes"])


def _launched_nodes(world: int) -> int:
    """How many nodes torchrun started this world as: the world over each agent's processes
    (``LOCAL_WORLD_SIZE``) when that divides it, else one."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    return world // local if local and world % local == 0 else 1


def _importable(spec: str, what: str):
    import importlib

    module_name, _, func = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), func)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{what} {spec!r}: cannot import {func or '?'} from {module_name} ({e})") from None


def run_cli(args: argparse.Namespace) -> int:
    import torch

    from galvatron_fx import model_source
    from galvatron_fx.api import _resized, compile as gfx_compile
    from galvatron_fx.ir.plan import ParallelPlan
    from galvatron_fx.ir.strategy import Precision
    from galvatron_fx.runtime import efficiency
    from galvatron_fx.search.auto_batch import AutoBatch
    from galvatron_fx.search.candidates import SearchSpace

    run = resolve_run(args)
    source = model_source.resolve(zoo_name=run["model"], hf_config=run["hf_config"], factory=run["factory"])
    dist = _init_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    cluster = _cluster(run, world, on_gpu)
    wanted = AutoBatch.parse(run["batch"], run["tokens_per_step"])  # an int, or the search chooses
    batch = wanted if isinstance(wanted, int) else 2 * world
    torch.manual_seed(run["seed"])
    model, inputs, kwargs = model_source.build(source, batch_size=batch, seq_len=run["seq"], device=device)
    example = kwargs if kwargs else inputs
    data = _importable(run["data"], "data") if run["data"] else None
    space = SearchSpace(tp=tuple(run["tp"]) if run["tp"] else None, max_tp=run["max_tp"],
                        pp=tuple(run["pp"]) if run["pp"] else None, max_pp=run["max_pp"],
                        reduce_dtypes=tuple(run["reduce_dtypes"] or ("float32",)),
                        powersgd_ranks=tuple(run["powersgd_ranks"] or (0,)), offload=offload_space(run["offload"]),
                        host_memory_budget=int(run["host_memory"] * 2**30) if run["host_memory"] is not None else None)
    budget = int(run["memory"] * 2**30) if run["memory"] is not None else None
    given = ParallelPlan.load(run["plan"]) if run["plan"] else None
    pm = gfx_compile(model, cluster, example, global_batch_size=wanted or batch, memory_budget=budget, search=space,
                     plan=given, precision=None if given else run["precision"])
    plan = pm.plan
    if pm.global_batch_size != batch:  # the searched batch (or a given plan's): the example grows or shrinks to it
        batch = pm.global_batch_size
        inputs, kwargs = _resized(tuple(inputs), dict(kwargs or {}), batch)
        example = kwargs if kwargs else inputs
    out = Path(run["out"])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        plan.save(out / "plan.json")
        print(f"training {source.name} for {run['steps']} steps on {world} processes, global batch {batch} in "
              f"{plan.num_microbatches} micro-batch(es); metrics in {out / 'metrics.jsonl'}", file=sys.stderr)
    opt = (torch.optim.AdamW if run["optimizer"] == "adamw" else torch.optim.SGD)(pm.parameters(), lr=run["lr"])
    start = 0
    ckpt = run["checkpoint_dir"]
    if ckpt and (Path(ckpt) / "manifest.json").exists():
        from galvatron_fx.runtime import checkpoint

        start = int(checkpoint.load(pm, opt, ckpt).step or 0)
        if rank == 0:
            print(f"resumed from {ckpt} at step {start}", file=sys.stderr)
    tokens = _tokens(example)
    peak_flops = plan.predicted.peak_flops or cluster.device(0).flops(Precision.named(plan.precision).compute_dtype) * world
    flops_step = plan.predicted.model_flops
    if flops_step is None:  # a plan written before it was predicted: the graph, captured at one micro-batch
        graph = getattr(pm, "mg", None)
        if graph is not None and all(layer.costs is not None for layer in graph.layers):
            c = graph.total_costs()
            flops_step = (c.fwd_flops + c.bwd_flops) * plan.num_microbatches
    every = run["efficiency_every"]
    densities: list[list[float]] = []
    times: list[float] = []  # the steps run as they are (slowed: the profiled ones)
    slowed: list[float] = []
    metrics = (out / "metrics.jsonl").open("a") if rank == 0 else None
    try:
        for step in range(start, run["steps"]):
            b = data(step=step, batch_size=batch, seq_len=run["seq"]) if data else example
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            density = None
            k = step - start
            if every and k >= 2 and (k - 2) % every == 0:  # after two warm-up steps, then every `every`
                loss, busy, dt = efficiency.profiled(lambda: pm.train_step(b, opt))
                density = efficiency.stage_density(busy / dt, plan.stage_ranks)
                densities += [density] if density else []
                slowed.append(dt)
            else:
                t0 = time.perf_counter()
                loss = pm.train_step(b, opt)
                if on_gpu:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                times.append(dt)
            mem = torch.cuda.max_memory_allocated() if on_gpu else None
            if metrics is not None:
                metrics.write(json.dumps({"step": step + 1, "loss": loss, "tokens_per_s": tokens / dt, "step_s": dt,
                                          "memory_bytes": mem,
                                          "mfu": flops_step / dt / peak_flops if flops_step else None,
                                          "compute_density": density, "profiled": density is not None}) + "\n")
                metrics.flush()
            if ckpt and run["checkpoint_every"] and (step + 1) % run["checkpoint_every"] == 0:
                _save(pm, opt, ckpt, step + 1)
    finally:
        if metrics is not None:
            metrics.close()
    if ckpt:
        _save(pm, opt, ckpt, run["steps"])
    if rank == 0 and (times or slowed):
        measured = statistics.median(times[min(3, len(times) - 1):] or slowed)
        p = plan.predicted
        report = {"model": source.name, "world_size": world, "steps": run["steps"],
                  "predicted": {"step_time_s": p.step_time_s, "peak_memory_bytes": max(p.peak_memory_bytes),
                                "mfu": p.mfu, "compute_density": list(p.compute_density) or None},
                  "measured": {"step_time_s": measured, "timed_steps": len(times[min(3, len(times) - 1):]),
                               "mfu": flops_step / measured / peak_flops if flops_step else None,
                               # per stage, the mean over the profiled steps
                               "compute_density": [statistics.fmean(d[s] for d in densities)
                                                   for s in range(len(densities[0]))] if densities else None}}
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        plan.report(out / "report.html", run=out)
        print(f"step time predicted {plan.predicted.step_time_s * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms "
              f"(median); wrote {out}/", file=sys.stderr)
    dist.barrier()  # every rank tears its groups down together, after rank 0's report
    dist.destroy_process_group()
    return 0


def _save(pm, opt, path: str, step: int) -> None:
    from galvatron_fx.runtime import checkpoint

    checkpoint.save(pm, opt, path, step=step)


def _tensors(example) -> list:
    return list(example.values()) if isinstance(example, dict) else list(example)


def _tokens(example) -> int:
    first = _tensors(example)[0]
    return int(first.shape[0] * (first.shape[1] if first.ndim >= 2 else 1))
