"""plan — the outer search: pipeline degree, stage boundaries, micro-batches and schedule around
the per-stage inter-layer DP; assembles the :class:`~galvatron_fx.ir.plan.ParallelPlan`.

Contract: needs a captured, annotated ModelGraph (or a model and example inputs to capture), a
Cluster and a global batch; returns the fastest plan the cost model predicts that fits the
memory budget on every stage, or raises :class:`~galvatron_fx.errors.PlanError` saying the
smallest memory any plan would need and what to relax. Needs no processes and no weights.

On a heterogeneous cluster (nodes of several device kinds) every stage is priced on its own
devices — their speed and memory — and the plan records each stage's device kind
(``ParallelPlan.stage_devices``) and budget (``predicted.stage_budget_bytes``).

The search over one global batch — pipeline degree, stage boundaries and ranks, micro-batches,
schedule, per-layer strategies — is :mod:`~galvatron_fx.search.outer_search`'s; the choice of the
global batch, when left to the search, :mod:`~galvatron_fx.search.auto_batch`'s. The best
hand-written baseline, priced by the same model, is the plan when the searched one is predicted
slower (the per-layer sums the search minimises can miss what the whole plan's price sees).

:func:`~galvatron_fx.search.price_plan.price_plan` re-prices a given plan — its stages,
micro-batches, schedule, layer strategies and placements — with any cost model, through the same
evaluation. The search's results and their assembly into the plan are in
:mod:`~galvatron_fx.search.assemble_plan`, the message when no plan is found in
:mod:`~galvatron_fx.search.no_plan`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
import warnings
from collections.abc import Sequence
from typing import cast

from galvatron_fx.cluster import Cluster
from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.offload import can_offload
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.plan_records import Baseline, SearchStats
from galvatron_fx.search.assemble_plan import _assemble
from galvatron_fx.search.auto_batch import AutoBatch, search_batches
from galvatron_fx.search.candidates import OptionCache, SearchSpace, shared_option_caches
from galvatron_fx.search.grad_comm_choice import search_each_grad_comm
from galvatron_fx.search.outer_search import _Search
from galvatron_fx.search.run_search import check_batches, check_budget, default_cost_model, search_plan

log = logging.getLogger(__name__)

__all__ = ["plan", "search_plan", "unused_requests"]


def plan(
    model_or_graph,
    cluster: Cluster,
    example_inputs: Sequence | None = None,
    *,
    global_batch_size: int | Sequence[int] | str | AutoBatch,
    memory_budget: int | float | None = None,
    search: SearchSpace | dict | None = None,
    cost_model: CostModel | None = None,
    loss_fn=None,
    precision: str = "fp32",
    name: str | None = None,
    progress: bool = False,
    baselines: bool = True,
) -> ParallelPlan:
    """Search a hybrid-parallel plan for ``model_or_graph`` on ``cluster`` (see module doc).

    ``global_batch_size`` may be a list: the batch with the highest predicted throughput wins;
    ``"auto"`` (the largest batch that fits) or an :class:`~galvatron_fx.search.auto_batch.AutoBatch`
    (a range or a tokens-per-step target, highest throughput) lets the search choose it
    (:mod:`~galvatron_fx.search.auto_batch`; the plan's notes say why, ``solver_stats["batch_search"]``
    lists the batches tried).
    ``memory_budget`` is bytes per device (default: the device's own memory; on a heterogeneous
    cluster a budget caps every device, each stage held to its own devices' memory or the budget,
    the smaller);
    ``search`` caps or switches off dimensions (:class:`SearchSpace` or a dict of its fields).
    With ``baselines`` the best hand-written configuration (DDP, ZeRO/FSDP, Megatron tp×pp) is
    scored by the same cost model and recorded for comparison; when it is predicted faster than
    the searched plan, it is the plan (``solver_stats["kept_baseline"]`` and a note say so).
    """
    from galvatron_fx.frontend.capture import capture

    t0 = time.perf_counter()
    auto = AutoBatch.coerce(global_batch_size)
    batches = auto or check_batches(cast("int | Sequence[int]", global_batch_size))  # (coerce took the rest)
    if memory_budget is not None:
        check_budget(memory_budget)
    space = SearchSpace.coerce(search)
    if False not in space.offload and not all(can_offload(cluster.device_specs[k]) for k in set(cluster.node_kinds)):
        raise ConfigError(f"search offload=(True,) asks every layer to offload to host memory, but the devices of "
                          f"cluster {cluster.name!r} have no host memory beside their own (DeviceSpec.host_memory_bytes; "
                          "a CPU process's memory is host memory already): give it in the cluster JSON, or allow "
                          "offload=(False, True)")
    if isinstance(model_or_graph, ModelGraph):
        mg = model_or_graph
    else:
        if example_inputs is None:
            raise PlanError("plan() needs example_inputs to capture a model (or pass a captured ModelGraph)")
        mg = capture(model_or_graph, example_inputs, loss_fn, name=name)
    if any(l.costs is None for l in mg.layers):
        raise PlanError("the graph has no costs: capture it with annotate=True")
    with young_collections():  # (the capture above measures with the collector as the program has it)
        return _searched(mg, cluster, t0, batches, space, global_batch_size=global_batch_size,
                         memory_budget=memory_budget, cost_model=cost_model, precision=precision, name=name,
                         progress=progress, baselines=baselines)


_PAUSED = [0]


@contextlib.contextmanager
def young_collections():
    """While a search runs the collector passes over what the search makes only: what was alive
    before it (a captured graph of tens of thousands of nodes and their fake values) is set aside
    (``gc.freeze``) and put back after, and the young generation is collected less often. The
    search's own garbage is freed as before. (A published-size Mamba's search spent seconds in
    full passes over its captured graph.)"""
    if _PAUSED[0] or not gc.isenabled():
        yield
        return
    _PAUSED[0] += 1
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0  # (a program that froze objects itself keeps them so)
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold[0], 20000), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()
        _PAUSED[0] -= 1


def _searched(mg: ModelGraph, cluster: Cluster, t0: float, batches, space: SearchSpace, *, global_batch_size,
              memory_budget, cost_model, precision, name, progress, baselines) -> ParallelPlan:
    """:func:`plan` from its captured graph on: the search, the baselines, the assembled plan."""
    space, coupled_note = one_microbatch_if_coupled(mg, space)
    if len(space.grad_comm_options()) > 1:  # one search per gradient communication allowed
        return plan_each_grad_comm(space, mg, cluster, global_batch_size=global_batch_size, cost_model=cost_model,
                                   memory_budget=memory_budget, precision=precision, name=name, progress=progress,
                                   baselines=baselines)
    cm = cost_model or default_cost_model(cluster, precision)
    budget = int(memory_budget) if memory_budget is not None else default_budget(cluster)
    cache = OptionCache.for_search(mg, cm, vocab_parallel=space.vocab_parallel, lowered_prices=space.lowered_prices,
                                   shard_weights=space.tp is not None)

    def new_search(gb: int, microbatches: str = "accumulate") -> _Search:
        return _Search(mg, cluster, cm, space, gb, budget, progress, cache, microbatches=microbatches)

    found = search_batches(new_search, batches, cluster.world_size, mg)
    best, s = found.best, found.search
    global_batch_size = best.samples * best.m
    search_s = time.perf_counter() - t0
    base = b = None
    if baselines and not space.uniform:
        from galvatron_fx.search.baselines import best_baseline

        b = best_baseline(mg, cluster, cm, global_batch_size=global_batch_size, memory_budget=budget,
                          cache=s.cache, limits=space)
        if b is not None:
            base = {"name": b[0], "step_time_s": b[1].predicted.step_time_s}
    stats = {"search_s": search_s, "points": s.points, "ilp_solves": s.cache.solves, "ilp_s": s.cache.solve_s,
             "chain_solves": s.chain_solves, "dp_frontier_max": s.frontier_max,
             "num_candidates": sum(len(v) for v in s._choices.values())}
    if found.record is not None:
        stats["batch_search"] = found.record
    plan = dataclasses.replace(_assemble(mg, cluster, cm, best, budget, stats, base, precision, name or mg.name,
                                         host_budget=space.host_memory_budget), grad_comm=space.grad_comm)
    kept = None
    if b is not None and b[1].predicted.step_time_s < plan.predicted.step_time_s:
        # the search sums per-layer prices, the assembled plan is priced whole (e.g. a gradient
        # all-reduce the sums count as hidden with no compute left to hide behind): a uniform
        # configuration the whole-plan price puts ahead is never given up
        kept = (f"the searched per-layer plan (predicted {plan.predicted.step_time_s * 1e3:.2f} ms per step) "
                f"is slower than the baseline {b[0]} under the same model: the plan is that baseline")
        plan = dataclasses.replace(b[1], model=plan.model, solver_stats=SearchStats.of({**stats, "kept_baseline": b[0]}),
                                   baseline=None if base is None else Baseline.of(base), notes=())
    unused = unused_requests(space, plan)
    for msg in unused:
        warnings.warn(msg, stacklevel=3)  # (plan's caller)
    notes = ((found.note,) if found.note else ()) + ((kept,) if kept else ()) + tuple(unused) \
        + ((coupled_note,) if coupled_note else ())
    return dataclasses.replace(plan, notes=plan.notes + notes) if notes else plan


def one_microbatch_if_coupled(mg: ModelGraph, space: SearchSpace) -> tuple[SearchSpace, str | None]:
    """``space`` held to one micro-batch per step where ``mg`` couples samples
    (:meth:`~galvatron_fx.ir.graph.ModelGraph.coupled`: a contrastive loss's value for one sample
    depends on the other samples of its batch, so a loss over micro-batches is another loss), and
    the note saying so; a ``search`` that asks for more micro-batches only is a ``ConfigError``."""
    coupled = mg.coupled()
    if not coupled:
        return space, None
    layer, node = next(iter(coupled.items()))
    why = (f"layer {layer} couples samples (its value {node} holds the batch in two dims: one sample's loss "
           "depends on the others'), so the whole batch is one micro-batch: the loss over micro-batches "
           "would be another loss")
    if space.num_microbatches is not None and 1 not in space.num_microbatches:
        raise ConfigError(f"search num_microbatches={tuple(space.num_microbatches)}: {why}; allow "
                          "num_microbatches=(1,), or lower the global batch to what fits in one pass")
    return dataclasses.replace(space, num_microbatches=(1,)), f"one micro-batch per step: {why}"


def default_budget(cluster: Cluster) -> int:
    """The budget when none is given: the device memory on a cluster of one kind; on a
    heterogeneous one the largest (each device is held to its own memory as well:
    :func:`~galvatron_fx.cost_models.memory.device_budget_bytes`)."""
    return max(cluster.device_specs[k].memory_bytes for k in set(cluster.node_kinds))


def unused_requests(space: SearchSpace, plan: ParallelPlan) -> list[str]:
    """A sentence per degree the caller named in ``search`` (``tp``, ``pp``, ``num_microbatches``)
    of which ``plan`` uses none, and why: these are the values the search may take, not ones it
    must (a layer that cannot take any of the tp degrees asked stays at tp 1)."""
    out = []
    devices = plan.world_size // plan.pp
    used = {"tp": {lp.strategy.tp for lp in plan.layers}, "pp": {plan.pp},
            "num_microbatches": {plan.num_microbatches}}
    for key in ("tp", "pp", "num_microbatches"):
        asked = getattr(space, key)
        if asked is None or used[key] & set(asked):
            continue
        missing = list(asked)
        why = "the search found the plan it chose faster or the others did not fit"
        if key == "tp" and all(v > devices for v in missing):
            why = (f"its {plan.pp} pipeline stage(s) have {devices} device(s) each, fewer than tp {max(missing)} needs; "
                   f"add pp=(1,) (or fewer stages) to keep tensor parallelism")
        elif key == "tp" and plan.cluster and all(v > int(plan.cluster.get("devices_per_node", v)) for v in missing):
            why = "tensor parallelism stays within a node, and a node has fewer devices"
        out.append(f"search {key}={tuple(asked)} was asked for, but the plan uses {key} "
                   f"{', '.join(map(str, sorted(used[key])))}: {why} (search values are what the search may use, "
                   "not what it must)")
    return out


def plan_each_grad_comm(space: SearchSpace, mg, cluster, **plan_kwargs) -> ParallelPlan:
    """:func:`~galvatron_fx.search.planner.plan` of the captured ``mg`` once per gradient
    communication ``space`` allows, the fastest kept (:func:`search_each_grad_comm`)."""
    if plan_kwargs.get("cost_model") is None:  # one cost model for all: the searches share its ILP solutions
        plan_kwargs["cost_model"] = default_cost_model(cluster, plan_kwargs.get("precision", "fp32"))
    with shared_option_caches():
        return search_each_grad_comm(space, lambda sub: plan(mg, cluster, search=sub, **plan_kwargs))
