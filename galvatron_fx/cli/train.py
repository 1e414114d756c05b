"""``galvatron-fx train``: plan and train a model from the command line or a TOML run config.

    torchrun --nproc-per-node 4 -m galvatron_fx.cli train --config run.toml [--training.steps 50] [--lr 3e-4]

A run config is a TOML file in sections (``[model]``, ``[parallelism]``, ``[training]``,
``[optimizer]``, ``[data]``, ``[checkpoint]``, ``[metrics]``), read into a typed
:class:`~galvatron_fx.cli.run_config.RunConfig`; ``--section.key value`` overrides a key, and the
command's flags (``--steps``, ``--checkpoint-dir``) override last. Relative paths in the file are
relative to the file. The model is ``model.name`` (a zoo name, ``gpt-tiny``), ``model.hf_config``
or ``model.factory`` (``module:function``), built on this rank's device with seed ``model.seed``;
``data.source = "module:function"`` gives the batches (``function(step=, batch_size=, seq_len=)``
returning the model's inputs, a tuple or a mapping); without it every step trains on the model's
example batch (a smoke run: the loss falls as the model learns that batch).
``parallelism.cluster`` is ``local-cpu`` (this machine's CPU processes, with its
cached hardware profile if any: the default on CPU; as many nodes as torchrun started agents,
or ``nodes``), a preset or a cluster JSON. ``training.batch`` is the global batch, or ``"auto"`` (the
largest that fits at once), ``"LO:HI"`` (the fastest in the range) or ``tokens_per_step`` (the
batch nearest that target): the search then chooses it and the run trains at its batch.

``data.source`` may also be a flat file of token ids (``uint16``/``uint32``: ``data.dtype``; nanoGPT's
``train.bin``), its last ``val_fraction`` held out for validation (:mod:`galvatron_fx.cli.train_recipe`);
``model.init = "hf:DIR"`` starts from a ``save_pretrained`` directory's weights (and model, unless one is
named). The recipe: ``lr`` after ``warmup`` steps, then ``schedule`` (cosine, linear or constant)
down to ``min_lr`` at the last step (a function of the step, so a resumed run continues it);
AdamW with ``weight_decay`` on all but biases and norms; gradients clipped to ``max_norm``; the
val loss over ``eval_batches`` held-out batches every ``eval_every`` steps and at the end.

Every step appends one JSON line to ``<out>/metrics.jsonl`` on rank 0 (step, loss, lr, grad norm
before clipping, tokens/s, step time, peak CUDA memory allocated — null on CPU —, MFU: the plan's
model FLOPs over the step time and the cluster's peak, the val loss where evaluated, and on the
steps profiled — the third and every ``efficiency_every`` after it — each stage's measured compute
density, :mod:`galvatron_fx.runtime.efficiency`, with ``"profiled": true``), and every
``log_every`` steps rank 0 prints it as one line; with ``tensorboard`` installed the same scalars
go to ``<out>/tensorboard``. ``<out>/plan.json`` is the plan run, ``<out>/predicted_trace.json``
its predicted step and ``<out>/step_trace.rank<R>.json`` the first profiled step as Chrome traces
(Perfetto), ``<out>/report.json`` the predicted against measured summary and
``<out>/report.html`` the plan and the run as one page (:mod:`galvatron_fx.report.html`),
``<out>/run_config.json`` the config the run resolved, by section. ``checkpoint.dir`` holds the
run's checkpoints, ``step-<N>`` every ``checkpoint.every`` steps and at the end
(:mod:`galvatron_fx.runtime.checkpoint`), the newest ``checkpoint.keep`` kept. Before the first
step a run decides what to do with it: resume from the newest checkpoint that loads (newer ones
that do not are said and set aside), or refuse a directory of other files, or of checkpoints none
of which loads, naming it. A step whose loss or gradient norm is not finite is not stepped on; more
than ``training.nan_tolerance`` of them stop the run with an error naming the step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from galvatron_fx.cli import run_config
from galvatron_fx.cli.commands import default_precision, offload_space
from galvatron_fx.cli.run_config import IMPORTABLE, RunConfig
from galvatron_fx.errors import ConfigError, NonFiniteLossError


def resolve_run(args: argparse.Namespace) -> RunConfig:
    """Defaults, then the run config file's keys, then its ``--section.key`` overrides, then the
    flags given; checked (:mod:`galvatron_fx.cli.run_config`)."""
    run = RunConfig()
    if getattr(args, "config", None) is not None:
        run_config.load(args.config, run)
    run.override(list(getattr(args, "overrides", None) or ()))
    flat = RunConfig.flat_names()
    flags = {"model": args.zoo_name, **{k: getattr(args, k, None) for k in flat if k != "model"}}
    for name, v in flags.items():
        if v is not None:
            run.set(*flat[name], str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v,
                    where=f"--{name.replace('_', '-')}: ")
    run.check()
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


def _cluster(run: RunConfig, world: int, on_gpu: bool):
    from galvatron_fx.cluster import Cluster

    if run.parallelism.cluster == "local-cpu":
        if on_gpu:
            raise ConfigError("cluster = local-cpu describes CPU processes; on GPUs give a preset (--cluster "
                              "dgx-h100 --nodes N), a cluster JSON, or a measured profile (galvatron-fx profile)")
        nodes = run.parallelism.nodes or _launched_nodes(world)
        if world % nodes:
            raise ConfigError(f"--nodes {nodes} with cluster local-cpu: {world} processes do not split into "
                              f"{nodes} nodes; give a --nodes that divides the world size")
        return Cluster.local_cpu(world, nodes=nodes)
    return Cluster.from_spec(run.parallelism.cluster, run.parallelism.nodes)


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


def _data(run: RunConfig, example, model):
    """``(train(step) -> batch, val(i) -> batch or None, what)``: from a token file, a data
    function, a saved ``datasets`` dataset, or the example batch."""
    from galvatron_fx.cli.train_recipe import TokenFile

    if not run.data.source:
        return (lambda step: example), None, "the example batch (a smoke run: give data = a token file)"
    if run.data.source.startswith("datasets:"):
        tokens = TokenFile.from_datasets(run.data.source.removeprefix("datasets:"), val_fraction=run.data.val_fraction,
                                         seed=run.model.seed)
        return _token_batches(run, tokens, example, model)
    if IMPORTABLE.fullmatch(run.data.source) and not Path(run.data.source).exists():
        fn = _importable(run.data.source, "data")
        seq = run.training.seq
        takes_split = "split" in _parameters(fn)
        if run.training.eval_every and not takes_split:
            raise ConfigError(f"eval_every needs validation batches, but data {run.data.source!r} takes no split=; "
                              "accept split='train'|'val', or give a token file")
        train = (lambda step: fn(step=step, batch_size=_batch_of(example), seq_len=seq, split="train")) if takes_split \
            else (lambda step: fn(step=step, batch_size=_batch_of(example), seq_len=seq))
        val = (lambda i: fn(step=i, batch_size=_batch_of(example), seq_len=seq, split="val")) if takes_split else None
        return train, val, run.data.source
    tokens = TokenFile(run.data.source, dtype=run.data.dtype, val_fraction=run.data.val_fraction, seed=run.model.seed)
    return _token_batches(run, tokens, example, model)


def _token_batches(run: RunConfig, tokens, example, model):
    from galvatron_fx.cli.train_recipe import TokenFile, vocab_size

    layout = TokenFile.layout(example)
    first = _tensors(example)[0]
    b, t = int(first.shape[0]), int(first.shape[1])
    vocab = vocab_size(model)

    def train(step: int):
        return TokenFile.fill(tokens.train_batch(step, b, t), layout, example, vocab, f"data {tokens.path}")

    def val(i: int):
        return TokenFile.fill(tokens.val_batch(i, b, t), layout, example, vocab, f"data {tokens.path}")

    if run.training.eval_every and not tokens.has_val:
        raise ConfigError(f"eval_every needs a validation split, but val_fraction = {run.data.val_fraction} holds "
                          f"none of {tokens.path}; give val_fraction > 0")
    return train, (val if tokens.has_val else None), (
        f"{tokens.path} ({len(tokens.tokens):,} tokens, {len(tokens.tokens) - tokens.split:,} held out)")


def _parameters(fn) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _batch_of(example) -> int:
    return int(_tensors(example)[0].shape[0])


def _evaluate(pm, val, batches: int) -> float:
    """The mean loss of ``batches`` validation batches (no gradients; every rank)."""
    import torch

    with torch.no_grad():
        return sum(float(pm(val(i))) for i in range(batches)) / batches


def run_cli(args: argparse.Namespace) -> int:
    from galvatron_fx.frontend import model_source

    run = resolve_run(args)  # every key checked before torch is imported: a bad config says so at once
    from galvatron_fx.runtime.checkpoint.files import step_checkpoints

    resumable = step_checkpoints(run.checkpoint.dir) if run.checkpoint.dir else []  # (foreign files: refused now)
    init_dir = run.model.init[3:] if run.model.init else None
    hf_config = run.model.hf_config or (init_dir if init_dir and not run.model.name and not run.model.factory else None)
    source = model_source.resolve(zoo_name=run.model.name, hf_config=hf_config, factory=run.model.factory)

    import torch

    from galvatron_fx.api import compile as gfx_compile
    from galvatron_fx.build import _resized
    from galvatron_fx.cli.train_recipe import format_line, init_from_hf, lr_at, param_groups, tensorboard_writer
    from galvatron_fx.ir.plan import ParallelPlan
    from galvatron_fx.ir.strategy import Precision
    from galvatron_fx.runtime import efficiency
    from galvatron_fx.search.auto_batch import AutoBatch
    from galvatron_fx.search.candidates import SearchSpace

    dist = _init_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    cluster = _cluster(run, world, on_gpu)
    if run.parallelism.precision is None and not run.parallelism.plan:  # bf16 on GPUs, fp32 on CPUs, said once
        run.parallelism.precision, line = default_precision(cluster)
        if rank == 0:
            print(line, file=sys.stderr)
    wanted = AutoBatch.parse(run.training.batch, run.training.tokens_per_step)  # an int, or the search chooses
    batch = wanted if isinstance(wanted, int) else 2 * world
    torch.manual_seed(run.model.seed)
    model, inputs, kwargs = model_source.build(source, batch_size=batch, seq_len=run.training.seq, device=device)
    if init_dir:
        copied = init_from_hf(model, init_dir)
        if rank == 0:
            print(f"initialised {copied} tensors from {init_dir}", file=sys.stderr)
    example = kwargs if kwargs else inputs
    space = SearchSpace(tp=tuple(run.parallelism.tp) if run.parallelism.tp else None, max_tp=run.parallelism.max_tp,
                        pp=tuple(run.parallelism.pp) if run.parallelism.pp else None, max_pp=run.parallelism.max_pp,
                        reduce_dtypes=tuple(run.parallelism.reduce_dtypes or ("float32",)),
                        powersgd_ranks=tuple(run.parallelism.powersgd_ranks or (0,)), offload=offload_space(run.parallelism.offload),
                        host_memory_budget=int(run.parallelism.host_memory * 2**30) if run.parallelism.host_memory is not None else None)
    budget = int(run.parallelism.memory * 2**30) if run.parallelism.memory is not None else None
    given = ParallelPlan.load(run.parallelism.plan) if run.parallelism.plan else None
    pm = gfx_compile(model, cluster, example, global_batch_size=wanted or batch, memory_budget=budget, search=space,
                     plan=given, precision=None if given else run.parallelism.precision)
    plan = pm.plan
    if pm.global_batch_size != batch:  # the searched batch (or a given plan's): the example grows or shrinks to it
        batch = pm.global_batch_size
        inputs, kwargs = _resized(tuple(inputs), dict(kwargs or {}), batch)
        example = kwargs if kwargs else inputs
    train_batch, val_batch, data_what = _data(run, example, model)
    out = Path(run.metrics.out)
    steps = run.training.steps
    recipe: dict[str, Any] = dict(lr=run.optimizer.lr, steps=steps, warmup=run.optimizer.warmup,
                                  schedule=run.optimizer.schedule, min_lr=run.optimizer.min_lr)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        plan.save(out / "plan.json")
        (out / "run_config.json").write_text(json.dumps(run.to_dict(), indent=1) + "\n")
        plan.chrome_trace(out / "predicted_trace.json")
        clip = f"clipped to norm {run.training.max_norm}" if run.training.max_norm else "no clipping"
        print(f"training {source.name} for {steps} steps on {world} processes, global batch {batch} in "
              f"{plan.num_microbatches} micro-batch(es), data: {data_what}\n  {run.optimizer.name} lr {run.optimizer.lr:g} "
              f"({run.optimizer.warmup} warmup steps, then {run.optimizer.schedule} to {run.optimizer.min_lr:g}), weight decay "
              f"{run.optimizer.weight_decay:g} (none on biases and norms), {clip}"
              + (f", val loss every {run.training.eval_every} steps" if run.training.eval_every else "")
              + f"; a line every {run.metrics.log_every} steps, metrics in {out / 'metrics.jsonl'}", file=sys.stderr)
    groups = param_groups(pm.named_parameters(), run.optimizer.weight_decay)
    opt = torch.optim.AdamW(groups, lr=run.optimizer.lr) if run.optimizer.name == "adamw" else \
        torch.optim.SGD(groups, lr=run.optimizer.lr)
    start = _resume(pm, opt, run.checkpoint.dir, resumable, rank)
    ckpt = run.checkpoint.dir
    if start and rank == 0:
        print(f"  the schedule goes on from there: learning rate {lr_at(start, **recipe):.3g}", file=sys.stderr)
    tokens = _tokens(example)
    peak_flops = plan.predicted.peak_flops or cluster.device(0).flops(Precision.named(plan.precision).compute_dtype) * world
    flops_step = plan.predicted.model_flops
    if flops_step is None:  # a plan written before it was predicted: the graph, captured at one micro-batch
        graph = getattr(pm, "mg", None)
        if graph is not None and all(layer.costs is not None for layer in graph.layers):
            c = graph.total_costs()
            flops_step = (c.fwd_flops + c.bwd_flops) * plan.num_microbatches
    every = run.metrics.efficiency_every
    densities: list[list[float]] = []
    times: list[float] = []  # the steps run as they are (slowed: the profiled ones)
    slowed: list[float] = []
    metrics = (out / "metrics.jsonl").open("a") if rank == 0 else None
    board = tensorboard_writer(out / "tensorboard") if rank == 0 else None
    max_norm = run.training.max_norm
    bad = 0  # steps skipped for a non-finite loss or gradient norm

    def step_fn(b):
        loss = pm.forward_backward(b)
        norm = float(pm.clip_grad_norm_(max_norm if max_norm else math.inf))  # (the norm is logged either way)
        loss = float(loss)
        if math.isfinite(loss) and math.isfinite(norm):  # (the global loss and norm: every rank decides alike)
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    def record(rec: dict) -> None:
        if metrics is None:
            return
        metrics.write(json.dumps(_strict(rec), allow_nan=False) + "\n")
        metrics.flush()
        if board is not None:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    board.add_scalar(k, v, rec["step"])

    try:
        for step in range(start, steps):
            lr = lr_at(step, **recipe)
            for g in opt.param_groups:
                g["lr"] = lr
            b = train_batch(step)
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            density = None
            k = step - start
            if every and k >= 2 and (k - 2) % every == 0:  # after two warm-up steps, then every `every`
                # the first profiled step's trace, per rank, beside the plan's predicted one
                trace = out / f"step_trace.rank{rank}.json" if not slowed else None
                if trace is not None:
                    out.mkdir(parents=True, exist_ok=True)
                (loss, norm), busy, dt = efficiency.profiled(cast(Callable[[], Any], lambda b=b: step_fn(b)),
                                                             trace=trace)
                density = efficiency.stage_density(busy / dt, plan.stage_ranks)
                densities += [density] if density else []
                slowed.append(dt)
            else:
                t0 = time.perf_counter()
                loss, norm = step_fn(b)
                if on_gpu:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                times.append(dt)
            mem = torch.cuda.max_memory_allocated() if on_gpu else None
            rec = {"step": step + 1, "loss": loss, "lr": lr, "grad_norm": norm, "tokens_per_s": tokens / dt,
                   "step_s": dt, "memory_bytes": mem, "mfu": flops_step / dt / peak_flops if flops_step else None,
                   "compute_density": density, "profiled": density is not None}
            if val_batch is not None and run.training.eval_every and ((step + 1) % run.training.eval_every == 0 or step + 1 == steps):
                rec["val_loss"] = _evaluate(pm, val_batch, run.training.eval_batches)
            if not (math.isfinite(loss) and math.isfinite(norm)):  # the step was not taken (step_fn)
                bad += 1
                rec["skipped"] = f"non-finite loss {loss} or grad norm {norm}: the optimizer did not step"
                if bad > run.training.nan_tolerance:
                    record(rec)
                    raise NonFiniteLossError(
                        f"step {step + 1}: the loss is {loss} (grad norm {norm}), {bad} such step(s) with "
                        f"training.nan_tolerance = {run.training.nan_tolerance}; the parameters were not stepped on "
                        f"it. Lower optimizer.lr (now {lr:.3g}), give training.max_norm, or a larger nan_tolerance "
                        "to skip such steps")
                if rank == 0:
                    print(f"step {step + 1}: {rec['skipped']} ({bad} of {run.training.nan_tolerance} tolerated)",
                          file=sys.stderr)
            record(rec)
            if rank == 0 and ((step + 1) % run.metrics.log_every == 0 or step + 1 == steps or "val_loss" in rec):
                print(format_line(rec, steps), file=sys.stderr, flush=True)
            if ckpt and run.checkpoint.every and (step + 1) % run.checkpoint.every == 0:
                _save(pm, opt, ckpt, step + 1, run.checkpoint.keep)
    finally:
        if metrics is not None:
            metrics.close()
        if board is not None:
            board.close()
    if ckpt and not (run.checkpoint.every and steps % run.checkpoint.every == 0 and start < steps):
        _save(pm, opt, ckpt, steps, run.checkpoint.keep)
    if rank == 0 and (times or slowed):
        measured = statistics.median(times[min(3, len(times) - 1):] or slowed)
        p = plan.predicted
        report = {"model": source.name, "world_size": world, "steps": steps,
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


def _strict(rec: dict) -> dict:
    """A metrics record as strict JSON: a non-finite number is null (the step's ``skipped``
    field, or ``nonfinite``, says why)."""
    out: dict[str, Any] = {}
    bad: list[str] = []
    for k, v in rec.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k], bad = None, bad + [f"{k} {v}"]
        elif isinstance(v, list):
            out[k] = [x if not isinstance(x, float) or math.isfinite(x) else None for x in v]
        else:
            out[k] = v
    if bad and "skipped" not in out:
        out["nonfinite"] = ", ".join(bad)
    return out


def _save(pm, opt, directory: str, step: int, keep: int) -> None:
    """Step ``step``'s checkpoint as ``<directory>/step-<step>``; then all but the newest ``keep``
    of the run's step checkpoints removed (rank 0)."""
    import torch.distributed as dist

    from galvatron_fx.runtime import checkpoint
    from galvatron_fx.runtime.checkpoint.files import STEP_PREFIX, prune_steps

    checkpoint.save(pm, opt, Path(directory) / f"{STEP_PREFIX}{step}", step=step)
    if dist.get_rank() == 0:
        prune_steps(directory, keep)


def _resume(pm, opt, directory: str | None, candidates: list, rank: int) -> int:
    """The step to start from: the newest of the run's checkpoints (``candidates``, newest first)
    that loads into this run, said on rank 0; 0 with none. When there are some but none loads,
    a ``ConfigError`` naming the directory, before the first step (never train and then fail to
    save)."""
    from galvatron_fx.runtime import checkpoint

    problems, unloadable = [], []
    for _step, path in candidates:
        try:
            start = int(checkpoint.load(pm, opt, path).step or 0)
        except ConfigError as e:
            problems.append(f"{path.name}: {e}")
            unloadable.append(path)
            if rank == 0:
                print(f"not resuming from {path}: {e}", file=sys.stderr)
            continue
        if rank == 0:
            print(f"resumed from {path} at step {start}", file=sys.stderr)
            for p in unloadable:  # newer saves that do not load: set aside (kept, hidden), their steps saved anew
                if p != Path(cast(str, directory)):  # candidates come from the directory
                    aside = p.parent / f".{p.name}.unloadable-{int(time.time())}"
                    p.rename(aside)
                    print(f"  {p} set aside as {aside.name}", file=sys.stderr)
        return start
    if problems:
        raise ConfigError(f"checkpoint.dir {directory!r} holds checkpoints, none of which loads into this run "
                          f"({'; '.join(p[:300] for p in problems[:3])}): point checkpoint.dir at a new directory, "
                          "or move those away")
    return 0


def _tensors(example) -> list:
    return list(example.values()) if isinstance(example, dict) else list(example)


def _tokens(example) -> int:
    first = _tensors(example)[0]
    return int(first.shape[0] * (first.shape[1] if first.ndim >= 2 else 1))
