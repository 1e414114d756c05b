"""Model profiler (calibration): time each layer kind on the real device and fit the efficiencies
that ``galvatron_fx.cost_models.compute.ComputeModel`` uses.

Contract: given a way to capture the model at a batch size (a factory ``batch_size -> ModelGraph``,
or a module and example inputs whose dim 0 is the batch), returns a
:class:`~galvatron_fx.cost_models.compute.ComputeEfficiency` whose global ``matmul``, ``memory``
and ``overhead_s`` and per-kind factors make the compute model reproduce the measured layer times.
Measured times are cached as JSON under ``default_cache_dir()`` in one file per (hardware
fingerprint, dtype), keyed inside by layer kind hash: a second call with the same kinds re-times
nothing and only re-fits.

Terms: *point* = one (layer kind, batch size, direction) with its measured median seconds and the
per-node FLOPs/bytes of that layer; *group* = the layers at the same position across the captures
at different batch sizes (kind hashes include shapes, so one layer kind has one hash per batch size).

Algorithm
---------
1. Capture at every batch size (costs annotated). For each kind of the first capture, take its
   first layer; in each capture, the layer at that position.
2. Time each such layer on real tensors (random floats for activations and parameters, zeros for
   integer inputs such as token ids and targets, ones for masks), shapes from the nodes' ``val``:
   forward (with autograd recording, as in training) and ``autograd.grad`` of its outputs with
   respect to its floating inputs and parameters. After ``warmup`` calls each, ``repeats`` rounds
   run every layer once per round (interleaved, so a burst of load from other processes spoils one
   sample of many layers, not every sample of one); the median is kept.
3. Fit ``(matmul, memory, overhead_s)`` by least squares on the log of predicted / measured over
   every point (scipy ``least_squares``, log-parameters, several starts), then set each group's
   ``(fwd_factor, bwd_factor)`` to the geometric mean of measured / predicted over its batch sizes,
   and give it to every kind hash of that group.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from galvatron_fx.cluster import Cluster
from galvatron_fx.cluster.host import cpu_model, default_cache_dir, make_fingerprint
from galvatron_fx.cluster.limits import read_json
from galvatron_fx.cost_models.compute import ComputeEfficiency, node_sums
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.meta import facts
from galvatron_fx.report.progress import Progress

logger = logging.getLogger(__name__)

__all__ = [
    "profile_model", "time_layers_s", "calibration_fingerprint", "cache_path", "load_measurements", "save_efficiency",
    "load_efficiency", "fit_efficiency",
]

CACHE_SCHEMA_VERSION = 2  # 2: kernel bytes without metadata queries
_Point = tuple[int, str, np.ndarray, np.ndarray, int, float]  # group, dir, flops, bytes, kernels, t


# ---------------------------------------------------------------- cache
def calibration_fingerprint(cluster: Cluster, device: torch.device) -> str:
    """What the measured times depend on: the hardware, the torch version and the thread count."""
    return make_fingerprint({
        "cluster": cluster.fingerprint or cluster.device(0).kind,
        "device": cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else 0,
        "torch": torch.__version__,
    })


def cache_path(fingerprint: str, dtype: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The file holding measured layer times for one (fingerprint, dtype)."""
    return default_cache_dir(cache_dir) / f"compute-{fingerprint}-{dtype}.json"


def load_measurements(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Kind hash -> ``{"layer", "fwd_s", "bwd_s", ...}`` from a cache file ({} if absent or unreadable)."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        data = read_json(p, what="model-profile cache")
        if data.get("schema_version") != CACHE_SCHEMA_VERSION:
            logger.warning("ignoring model-profile cache %s (schema %r)", p, data.get("schema_version"))
            return {}
        return dict(data["kinds"])
    except (OSError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ConfigError) as e:
        logger.warning("ignoring unreadable model-profile cache %s (%s); layers will be re-timed", p, e)
        return {}


def _save_measurements(path: Path, kinds: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema_version": CACHE_SCHEMA_VERSION, **meta, "kinds": dict(sorted(kinds.items()))}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=1)
    os.replace(f.name, path)


def save_efficiency(eff: ComputeEfficiency, path: str | os.PathLike) -> Path:
    """Write ``eff`` as JSON to ``path`` and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    eff.to_json(p)
    return p


def load_efficiency(path: str | os.PathLike) -> ComputeEfficiency:
    """Read a ``ComputeEfficiency`` written by ``save_efficiency`` (or its JSON text)."""
    return ComputeEfficiency.from_json(path)


# ---------------------------------------------------------------- real tensors
def _concrete(s) -> int:
    if isinstance(s, torch.SymInt):
        return int(s.node.hint)
    return int(s)


def _real_like(val, requires_grad: bool, device: torch.device, gen: torch.Generator):
    if isinstance(val, torch.Tensor):
        shape = [_concrete(s) for s in val.shape]
        if val.dtype.is_floating_point:
            t = (torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02).to(device=device, dtype=val.dtype)
            return t.requires_grad_(requires_grad)
        if val.dtype == torch.bool:
            return torch.ones(shape, dtype=torch.bool, device=device)
        return torch.zeros(shape, dtype=val.dtype, device=device)  # token ids, targets: always valid
    if isinstance(val, (list, tuple)):
        return type(val)(_real_like(v, requires_grad, device, gen) for v in val)
    if isinstance(val, torch.SymInt):
        return _concrete(val)
    return val


def _layer_job(mg: ModelGraph, layer: LayerInfo, device: torch.device, seed: int = 0):
    """A zero-argument function running the layer forward then backward, returning (fwd_s, bwd_s)."""
    from galvatron_fx.passes.annotate_costs import layer_callable

    by_name = mg.nodes_by_name()
    nodes = mg.layer_nodes(layer)
    ext = mg.layer_inputs(layer)
    gen = torch.Generator().manual_seed(seed)
    xs = [_real_like(a.meta.get("val"), facts(a).requires_grad, device, gen) for a in ext]
    leaves = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
    run = layer_callable(nodes, ext, [by_name[o] for o in layer.output_names], mg.gm)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def job() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        outs = run(*xs)
        sync()
        t1 = time.perf_counter()
        diff = [o for o in tree_flatten(outs)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
        if diff and leaves:
            torch.autograd.grad(diff, leaves, [torch.ones_like(o) for o in diff], allow_unused=True)
        sync()
        return t1 - t0, time.perf_counter() - t1

    return job


def time_layers_s(mg: ModelGraph, layers: Sequence[LayerInfo] | None = None, *, repeats: int = 7,
                  warmup: int = 2, device: str | torch.device = "cpu",
                  progress: bool = False) -> dict[str, tuple[float, float]]:
    """Layer name -> median ``(fwd_s, bwd_s)`` on real tensors on ``device``, timed interleaved as
    ``profile_model`` does (default: the first layer of each kind)."""
    if layers is None:
        layers = [group[0] for group in mg.kinds().values()]
    dev = torch.device(device)
    jobs = [_layer_job(mg, layer, dev) for layer in layers]
    res = _time_jobs(jobs, repeats=repeats, warmup=warmup, labels=[l.name for l in layers], progress=progress)
    return {layer.name: (r[0], r[1]) for layer, r in zip(layers, res)}


def _time_jobs(jobs: list[Callable[[], tuple[float, float]]], *, repeats: int, warmup: int,
               labels: list[str], progress: bool) -> list[tuple[float, float, list[float], list[float]]]:
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    bar = Progress(len(jobs) * warmup + repeats, progress, title="profile_model")
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in jobs]
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection inside (or just before) a timed call is noise, not the layer's cost
    try:
        with torch.enable_grad():
            for job, label in zip(jobs, labels):
                for _ in range(warmup):
                    job()
                    bar.step(f"warmup {label}")
            for r in range(repeats):
                for job, (fs, bs) in zip(jobs, samples):
                    f, b = job()
                    fs.append(f)
                    bs.append(b)
                bar.step(f"round {r + 1}/{repeats}")
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()
    return [(statistics.median(fs), statistics.median(bs), fs, bs) for fs, bs in samples]


# ---------------------------------------------------------------- fit
def _point_arrays(mg: ModelGraph, layer: LayerInfo, direction: str) -> tuple[np.ndarray, np.ndarray, int]:
    rows = np.array(node_sums(mg, layer), dtype=np.float64).reshape(-1, 4)
    f, b = (rows[:, 0], rows[:, 1]) if direction == "fwd" else (rows[:, 2], rows[:, 3])
    work = (f > 0) | (b > 0)
    return f[work], b[work], int(work.sum())


def _predict(x: np.ndarray, points: Sequence[_Point], peak: float, bw: float) -> np.ndarray:
    m, e, o = np.exp(x)
    return np.array([np.maximum(f / (peak * m), b / (bw * e)).sum() + n * o for _, _, f, b, n, _ in points])


def fit_efficiency(points: Sequence[_Point], peak_flops: float, bandwidth_bytes_s: float) -> tuple[float, float, float]:
    """``(matmul, memory, overhead_s)`` minimising the squared log error of the per-node roofline
    sum over ``points`` (``(group, direction, flops[], bytes[], kernels, measured_s)``)."""
    from scipy.optimize import least_squares

    t = np.array([p[5] for p in points])

    def resid(x):
        return np.log(_predict(x, points, peak_flops, bandwidth_bytes_s)) - np.log(t)

    best: Any = None
    lo, hi = np.log([1e-4, 1e-4, 1e-9]), np.log([20.0, 20.0, 1e-2])
    for m0 in (0.05, 0.5, 2.0):
        for e0 in (0.05, 0.5, 2.0):
            x0 = np.log([m0, e0, 1e-5])
            r = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale=1.0)
            if best is None or r.cost < best.cost:
                best = r
    m, e, o = (float(v) for v in np.exp(best.x))
    return m, e, o


# ---------------------------------------------------------------- entry point
def profile_model(
    model: nn.Module | Callable[[int], ModelGraph],
    example_inputs: Sequence[Any] | None = None,
    *,
    batch_sizes: Sequence[int] = (1, 2, 4),
    repeats: int = 7,
    warmup: int = 2,
    cluster: Cluster | None = None,
    dtype: str = "float32",
    device: str | torch.device | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    progress: bool = True,
) -> ComputeEfficiency:
    """Time every layer kind forward and backward at ``batch_sizes`` and fit a ``ComputeEfficiency``.

    ``model`` is either a factory ``batch_size -> ModelGraph`` (captured with costs), or an
    ``nn.Module`` with ``example_inputs`` (and optional ``loss_fn``, as for ``capture``): every
    tensor input is then tiled or cut along dim 0 to each batch size and captured, and the kinds of
    the capture at the examples' own batch size get the factors too (that is the graph a planner
    holds). ``cluster`` gives the peaks the efficiencies are relative to (default
    ``Cluster.local_cpu(1)``); ``dtype`` picks its peak FLOP/s and the cache file, while the tensors
    keep the graph's own dtypes (capture a bf16 model to calibrate bf16). Measured times are cached per (fingerprint, kind, dtype);
    ``use_cache=False`` re-times everything. A progress line goes to stderr when ``progress``.
    """
    if not batch_sizes or any(not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise ConfigError(f"batch_sizes must be positive ints, got {batch_sizes!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cluster is None:
        cluster = Cluster.local_cpu(1)
    spec = cluster.device(0)
    peak, bw = spec.flops(dtype), spec.memory_bandwidth_bytes_s

    sizes = sorted(set(batch_sizes))
    if isinstance(model, nn.Module):
        if example_inputs is None:
            raise ConfigError("profile_model(module) needs example_inputs (or pass a factory batch_size -> ModelGraph)")
        factory, own = _module_factory(model, example_inputs, loss_fn), _batch_of(example_inputs)
    elif callable(model):
        factory, own = model, None
    else:
        raise ConfigError(f"profile_model needs an nn.Module or a factory batch_size -> ModelGraph, got {type(model).__name__}")
    graphs = {b: factory(b) for b in sizes}
    ref = graphs[sizes[0]]
    for b, mg in graphs.items():
        if len(mg.layers) != len(ref.layers):
            raise ConfigError(
                f"the capture at batch size {b} has {len(mg.layers)} layers but the one at {sizes[0]} has "
                f"{len(ref.layers)}; the model's structure must not depend on the batch size"
            )
        if any(layer.costs is None for layer in mg.layers):
            raise ConfigError(f"the capture at batch size {b} has no costs: capture with annotate=True")
    positions = [layers[0].index for layers in ref.kinds().values()]  # first layer of each kind

    fp = calibration_fingerprint(cluster, dev)
    path = cache_path(fp, dtype, cache_dir)
    cached = load_measurements(path) if use_cache else {}
    todo = [(b, i) for b in sizes for i in positions if graphs[b].layers[i].kind not in cached]
    if todo:
        labels = [f"{graphs[b].layers[i].name} b={b}" for b, i in todo]
        logger.info("profile_model: timing %d layer(s) on %s (%d cached)", len(todo), dev, len(sizes) * len(positions) - len(todo))
        jobs = [_layer_job(graphs[b], graphs[b].layers[i], dev) for b, i in todo]
        results = _time_jobs(jobs, repeats=repeats, warmup=warmup, labels=labels, progress=progress)
        del jobs
        for (b, i), (f, bk, fs, bs) in zip(todo, results):
            cached[graphs[b].layers[i].kind] = {
                "layer": graphs[b].layers[i].name, "batch_size": b, "fwd_s": f, "bwd_s": bk,
                "fwd_samples": fs, "bwd_samples": bs,
            }
        _save_measurements(path, cached, {"fingerprint": fp, "dtype": dtype, "device": spec.kind})
    else:
        logger.info("profile_model: every layer kind is cached in %s; fitting only", path)

    points: list[_Point] = []
    for b in sizes:
        for g, i in enumerate(positions):
            layer = graphs[b].layers[i]
            m = cached[layer.kind]
            for d in ("fwd", "bwd"):
                flops, nb, n = _point_arrays(graphs[b], layer, d)
                if n and m[f"{d}_s"] > 0:
                    points.append((g, d, flops, nb, n, float(m[f"{d}_s"])))
    if not points:
        raise ConfigError("no layer did any measurable work; nothing to calibrate")
    matmul, memory, overhead = fit_efficiency(points, peak, bw)
    x = np.log([matmul, memory, overhead])
    pred = _predict(x, points, peak, bw)
    logr: dict[tuple[int, str], list[float]] = {}
    for p, y in zip(points, pred):
        logr.setdefault((p[0], p[1]), []).append(math.log(p[5] / y))
    factor = {k: math.exp(sum(v) / len(v)) for k, v in logr.items()}
    per_kind: dict[str, tuple[float, float]] = {}
    extra = [] if own is None or own in graphs else [factory(own)]
    for mg in [*graphs.values(), *extra]:
        for g, i in enumerate(positions):
            per_kind[mg.layers[i].kind] = (factor.get((g, "fwd"), 1.0), factor.get((g, "bwd"), 1.0))
    eff = ComputeEfficiency(matmul=matmul, memory=memory, overhead_s=overhead, per_kind=per_kind,
                            source=f"profile_model:{fp}:{dtype}")
    logger.info("profile_model: matmul %.3g, memory %.3g of peak, overhead %.3g µs per kernel; "
                "per-kind factors %s", matmul, memory, overhead * 1e6,
                ", ".join(f"{ref.layers[i].name} {factor.get((g, 'fwd'), 1):.2f}/{factor.get((g, 'bwd'), 1):.2f}"
                          for g, i in enumerate(positions)))
    if matmul > 1.0 or memory > 1.0:
        logger.warning("profile_model: fitted efficiency above 1 (matmul %.2f, memory %.2f): the cluster's "
                       "peaks understate this device; run the hardware profiler for measured peaks", matmul, memory)
    return eff


def _batch_of(inputs: Sequence[Any]) -> int | None:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return None


def _module_factory(model: nn.Module, inputs: Sequence[Any], loss_fn) -> Callable[[int], ModelGraph]:
    from galvatron_fx.frontend.capture import capture

    def resize(x, b: int):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return x
        reps = -(-b // x.shape[0])
        return x.repeat(reps, *([1] * (x.dim() - 1)))[:b].contiguous()

    def factory(b: int) -> ModelGraph:
        return capture(model, [resize(x, b) for x in inputs], loss_fn)

    return factory
