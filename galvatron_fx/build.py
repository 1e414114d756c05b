"""Build the module that runs a plan: capture, plan on rank 0 (or check the given plan), lower.

Contract: :func:`build` is called on every rank of an initialised process group with the same
:class:`CompileRequest` (``galvatron_fx.compile`` makes it from its arguments; a re-plan
(:mod:`galvatron_fx.adapt`) makes it again with another plan or shape). Every rank either returns
a module or raises the same ``PlanError`` (plans that differ between ranks, another world size, a
plan made for another model): every check whose verdict could differ between ranks is agreed
collectively before any rank acts on it (:func:`galvatron_fx.runtime.guard.agree`), so a bad plan
never leaves some ranks waiting in a collective. A plan made for another cluster description is
only a warning naming the fields that differ (a plan may be moved to an equal cluster on purpose).

Algorithm: capture at the example inputs' shape, plan (or check the given plan: *strategy
locking*), re-capture at the per-micro-batch global shape the runtime runs
(``global_batch_size / num_microbatches`` samples, the example inputs sliced or repeated along
dim 0), check the plan against it, lower it on this rank's meshes
(:func:`galvatron_fx.passes.lower_program.lower`: the graphs the first step runs), then build the
module that executes the program. A layer whose saved placements do not name this torch's nodes
is re-solved on the plan's own cluster, with a warning (a plan that names no cluster is refused).
``dump_dir``: rank 0 writes the program it lowered there
(:func:`galvatron_fx.passes.dump_program.write_program`: per layer graph ``<layer>.fw.txt`` /
``.bw.txt``, ``summary.json`` with ``matches_plan``, every pass's graphs under ``passes/``); in a
pipelined plan the first rank of each stage writes its stage's under ``stage<k>/``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from galvatron_fx.cluster import Cluster
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.plan import ParallelPlan, cluster_differences, model_mismatch
from galvatron_fx.runtime.guard import PLANNING_TIMEOUT, agree, patience
from galvatron_fx.runtime.parallel_module import ParallelModule
from galvatron_fx.runtime.precision import runtime_model as _runtime_model

log = logging.getLogger(__name__)
_QUIET = contextvars.ContextVar("galvatron_fx_quiet", default=False)


@contextlib.contextmanager
def quiet():
    """Within it, ``compile`` keeps its one line (what runs, on which figures) to the log: for
    compiles a tool makes for itself (the CPU calibration's probe), not the user's."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)

__all__ = ["CompileRequest", "build", "check_same_plan", "plan_on_rank0", "quiet"]


@dataclass(frozen=True, kw_only=True)
class CompileRequest:
    """What a module is compiled from: ``compile``'s arguments, normalised (the example inputs
    as a tuple of positional values and a mapping of keyword ones). A re-plan builds its next
    module from the same request with another plan, batch or example shape
    (``dataclasses.replace``)."""

    model: nn.Module
    cluster: Any
    example_inputs: tuple = ()
    example_kwargs: Mapping[str, Any] = field(default_factory=dict)
    loss_fn: Callable | None = None
    global_batch_size: Any
    memory_budget: int | float | None = None
    plan: ParallelPlan | None = None
    search: Any = None
    precision: str | None = None
    progress: bool | None = None
    cost_model: Any = None
    dump_dir: Any = None
    inputs: str = "global"


def _resize(x: torch.Tensor, batch: int) -> torch.Tensor:
    if x.ndim == 0 or x.shape[0] == batch:
        return x
    reps = -(-batch // x.shape[0])
    return x.repeat(reps, *([1] * (x.ndim - 1)))[:batch].clone()


def check_same_plan(plan: ParallelPlan) -> None:
    """All ranks hold the same plan (all-gather of ``plan_hash()``); else ``PlanError`` on every rank."""
    mine = plan.plan_hash()
    hashes: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(hashes, mine)
    if len(set(hashes)) > 1:
        groups: dict[str, list[int]] = {}
        for r, h in enumerate(hashes):
            groups.setdefault(h, []).append(r)
        which = "; ".join(f"ranks {rs}: {h[:12]}" for h, rs in groups.items())
        raise PlanError(f"the ranks hold different plans ({which}): load the same plan file on every rank, "
                        "or plan on one rank and broadcast it")


def _captured_everywhere(capture: Callable[[], Any]):
    """``capture()`` on every rank, its outcome agreed over the world: a rank where it fails
    raises its own error; where it fails on some ranks only (a model whose forward depends on the
    rank or the host), the others raise an ``UnsupportedModelError`` naming those ranks and their
    error instead of going on to wait in the runtime's first collective. Collective."""
    from galvatron_fx.errors import UnsupportedModelError

    error: BaseException | None = None
    try:
        mg = capture()
    except Exception as e:  # every rank must hear of it
        mg, error = None, e
    every: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, None if error is None else f"{type(error).__name__}: {str(error)[:600]}")
    if error is not None:
        raise error
    failed = [r for r, e in enumerate(every) if e is not None]
    if failed:
        raise UnsupportedModelError(f"capturing the model failed on rank(s) {failed} ({every[failed[0]]}), not on "
                                    f"rank {dist.get_rank()}: the model's forward must trace alike on every rank "
                                    "(no branches on the rank, host or process-local state)")
    return mg


def plan_on_rank0(search: Callable[[], ParallelPlan]) -> ParallelPlan:
    """``search()`` on rank 0, its plan broadcast to every rank (or its error, so that no rank
    waits for a plan that will not come): one search instead of one per rank, and one plan by
    construction. Collective."""
    payload: list[Any] = [None]
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            payload = [("plan", search().to_json())]
        except Exception as e:  # every rank must hear of it
            error = e
            payload = [("error", type(e).__name__, str(e))]
    dist.broadcast_object_list(payload, src=0)
    if error is not None:
        raise error
    if payload[0][0] == "error":
        _, kind, msg = payload[0]
        raise PlanError(f"planning failed on rank 0 ({kind}): {msg}")
    return ParallelPlan.from_json(payload[0][1], source="the plan broadcast by rank 0")


def _check_given(plan: ParallelPlan, mg, model: nn.Module, args: tuple, kwargs: dict, loss_fn, cluster) -> None:
    """A given plan matches the captured model (else ``PlanError`` on every rank, naming the
    first difference); a plan made for another cluster description is a warning naming what
    differs. The plan's hash is of the fp32 model's graph: under mixed precision the check
    captures the fp32 model once more (without costs)."""
    import galvatron_fx as gfx

    problem = None
    try:
        check_mg = mg if plan.precision == "fp32" else gfx.capture(model, args, loss_fn, example_kwargs=kwargs,
                                                                     annotate=False)
        problem = model_mismatch(plan, check_mg)
    except Exception as e:  # the verdict must reach every rank
        problem = f"the model could not be checked against plan {plan.model!r} ({type(e).__name__}: {e})"
    agree(problem)
    differs = cluster_differences(plan, cluster) if isinstance(cluster, Cluster) else []
    if differs:
        more = f" (and {len(differs) - 6} more)" if len(differs) > 6 else ""
        log.warning("plan %r was made for another cluster description: %s%s; running it as given (re-plan if "
                    "this cluster is really different)", plan.model, "; ".join(differs[:6]), more)


def _resized(args: tuple, kwargs: dict, batch: int) -> tuple[tuple, dict]:
    """The tensor arguments sliced or repeated to ``batch`` samples (see :func:`_resize`)."""
    resize = lambda x: _resize(x, batch) if isinstance(x, torch.Tensor) else x  # noqa: E731
    return tuple(resize(x) for x in args), {k: resize(v) for k, v in kwargs.items()}


def _find_batched(mg, model: nn.Module, args: tuple, kwargs: dict, loss_fn, batch: int) -> None:
    """``mg.batched`` from a probe capture at ``batch`` samples (:func:`~galvatron_fx.passes.batch_probe.mark_batched`):
    values built whole from factories with a batch dim (masks, positions) are then split on dp
    where a layer reads them, not held whole by every rank. A model that cannot be captured at
    that batch keeps every such value whole (correct, more memory), with a log line."""
    from galvatron_fx.frontend.capture import capture
    from galvatron_fx.passes.batch_probe import mark_batched

    args, kwargs = _resized(args, kwargs, batch)
    try:
        probe = capture(model, args, loss_fn, example_kwargs=kwargs, annotate=False)
    except Exception as e:  # an optimisation: the runtime is correct without it
        log.info("no batch probe (%s: %s): values made whole from factories stay whole", type(e).__name__, e)
        return
    mark_batched(mg, probe)


def check_hosts(cluster) -> list[str]:
    """Warn (and return why) where ranks the cluster puts on one node run on different hosts:
    the plan prices their groups as the fast intra-node links they do not have. Ranks of
    several "nodes" on one host (agents on loopback) are fine. Collective (gathers hostnames)."""
    from galvatron_fx.cluster.host import hostname

    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, hostname())
    by_node: dict[int, list[int]] = {}
    for r in range(len(hosts)):
        by_node.setdefault(cluster.node_of(r), []).append(r)
    per = cluster.devices_per_node
    problems = []
    for node, ranks in by_node.items():
        seen = sorted({hosts[r] for r in ranks})
        if len(seen) > 1:
            problems.append(f"ranks {ranks[0]}-{ranks[-1]} form node {node} of cluster {cluster.name!r} but run "
                            f"on hosts {', '.join(seen)}: their groups are priced as intra-node links; launch "
                            f"{per} processes per host (torchrun --nproc-per-node {per}) or describe the cluster "
                            "as it is")
    if problems and dist.get_rank() == 0:
        for p in problems:
            log.warning(p)
    return problems


def resolver(plan: ParallelPlan, mg):
    """``resolve(layer, decomposed, strategy)`` for the lowering: the layer's intra-layer ILP
    solved again on the plan's own cluster, with a warning; a plan that names no cluster (made by
    hand) is refused with a :class:`PlanError`."""
    def resolve(layer, dl, st):
        from galvatron_fx.cost_models import AnalyticCostModel
        from galvatron_fx.search.intra_layer import solve_intra_layer

        if not plan.cluster:
            raise PlanError(f"layer {layer.name}: the plan names no placements this torch's nodes match, and no "
                            "cluster to solve them on: re-plan with galvatron_fx.plan()")
        log.warning("layer %s: the plan's placements do not name this torch's decomposed nodes; re-solving its "
                    "intra-layer ILP on the plan's cluster", layer.name)
        return solve_intra_layer(mg, layer, st.tp, st.sp, AnalyticCostModel(Cluster.from_dict(plan.cluster)),
                                 decomposed=dl, shard_params=st.tp > 1)
    return resolve


def _my_dump_dir(plan: ParallelPlan, dump_dir):
    """Where this rank writes its program: rank 0 (in a pipeline, each stage's first rank, under
    ``stage<k>/``); None on the others."""
    from pathlib import Path

    if dump_dir is None:
        return None
    rank = dist.get_rank()
    if plan.pp == 1:
        return Path(dump_dir) if rank == 0 else None
    stage = next(s for s, ranks in enumerate(plan.stage_ranks) if rank in ranks)
    return Path(dump_dir) / f"stage{stage}" if rank == plan.stage_ranks[stage][0] else None


def build(request: CompileRequest):
    """The module that runs ``request`` on this rank (collective): its plan searched on rank 0
    and broadcast, or the plan it gives checked on every rank; then captured again at the
    micro-batch shape, lowered and built (see module doc). ``compile`` is this plus its checks
    and the closed loop; a re-plan builds its next module here."""
    import galvatron_fx as gfx

    model, cluster, loss_fn, plan = request.model, request.cluster, request.loss_fn, request.plan
    global_batch_size, memory_budget, search = request.global_batch_size, request.memory_budget, request.search
    precision, progress, cost_model = request.precision, request.progress, request.cost_model
    example_inputs, example_kwargs = request.example_inputs, dict(request.example_kwargs)
    world = dist.get_world_size()
    if plan is None:
        def search_plan() -> ParallelPlan:
            mg0 = gfx.capture(model, example_inputs, loss_fn, example_kwargs=example_kwargs)
            return gfx.plan(mg0, cluster, global_batch_size=global_batch_size, memory_budget=memory_budget,
                            search=search, precision=precision or "fp32", cost_model=cost_model,
                            progress=sys.stderr.isatty() if progress is None else progress)

        with patience(PLANNING_TIMEOUT):  # the others wait for rank 0's search
            plan, given = plan_on_rank0(search_plan), False
    else:
        given = True
        if precision is not None and precision != plan.precision:
            raise ConfigError(f"precision={precision!r} next to a plan made for {plan.precision}: the plan runs in its "
                              f"own precision; drop precision= or re-plan in {precision}")
        check_same_plan(plan)  # first: the checks below then see one plan on every rank
    if dist.get_rank() == 0:  # what will run, and on which figures: one line where people look
        from galvatron_fx.cost_models.cpu_runtime import cached

        calibrated = not given and cost_model is None and plan.precision == "fp32" and cached(cluster) is not None
        summary = (f"galvatron_fx: {plan.explain().splitlines()[0]}; predicted {plan.predicted.step_time_s * 1e3:.1f} "
                   f"ms per step, {max(plan.predicted.device_peak_bytes) / 2**20:.1f} MiB per device "
                   f"({'the plan given' if given else 'searched on rank 0'}); hardware: "
                   f"{cluster.describe_source()}"
                   + ("; priced with this machine's CPU runtime calibration (step overheads, in-step collectives "
                      "and shared cores as measured)" if calibrated else ""))
        log.info(summary)
        if not _QUIET.get():
            print(summary, file=sys.stderr)
    if plan.world_size != world:  # every rank holds the same plan now: all raise, none waits
        raise PlanError(f"plan {plan.model!r} was made for world size {plan.world_size}, this job has {world}: "
                        f"launch with {plan.world_size} processes (torchrun --nproc-per-node {plan.world_size}) "
                        f"or re-plan for {world} devices")
    if isinstance(global_batch_size, int) and plan.global_batch_size != global_batch_size:
        log.warning("the plan's global batch is %d, not %d: running the plan's", plan.global_batch_size,
                    global_batch_size)
    check_hosts(cluster)
    micro = plan.global_batch_size // plan.num_microbatches
    runtime_model = _runtime_model(model, plan.precision)
    args, kwargs = _resized(example_inputs, example_kwargs, micro)
    mg = _captured_everywhere(lambda: gfx.capture(runtime_model, args, loss_fn, example_kwargs=kwargs))
    if given:
        _check_given(plan, mg, model, args, kwargs, loss_fn, cluster)
    if mg.batch_scaling is None:  # (the capture probes at twice its batch itself; this when it could not)
        _find_batched(mg, runtime_model, example_inputs, example_kwargs, loss_fn, 2 * micro)
    mine = _my_dump_dir(plan, request.dump_dir)
    from galvatron_fx.runtime.pipeline import PipelineModule

    module: ParallelModule | PipelineModule
    if plan.pp > 1:
        module = PipelineModule(model, mg, plan, resolve=resolver(plan, mg), dump_dir=mine)
    else:
        module = ParallelModule(model, mg, plan, resolve=resolver(plan, mg), dump_dir=mine)
    module.remember_user_model(model)  # pm.to_module() / pm.unwrap() write the trained weights back into it
    module._capture_loss_fn = loss_fn  # (a batch of another shape captures the model again: runtime/shapes.py)
    module.set_inputs(request.inputs)
    if mine is not None:
        from galvatron_fx.passes.dump_program import write_program

        write_program(module.program, mine)
    return module
