"""One search on a captured graph with a given cost model (:func:`search_plan`, what the
baselines and each gradient communication's search run), the cost model a search prices with by
default, and the checks of the batches and budget a search is given.

Contract: :func:`search_plan` returns the best plan of ``space`` or raises ``PlanError``;
:func:`check_batches` and :func:`check_budget` raise ``ConfigError`` naming the argument."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import cast

from galvatron_fx.cluster import Cluster, limits
from galvatron_fx.cost_models.base import AnalyticCostModel, CostModel
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.strategy import Precision
from galvatron_fx.search.assemble_plan import _assemble, _Candidate
from galvatron_fx.search.candidates import OptionCache, SearchSpace
from galvatron_fx.search.outer_search import _Search


def search_plan(mg: ModelGraph, cluster: Cluster, cm: CostModel, space: SearchSpace, *, global_batch_size: int,
                budget: int, cache: OptionCache | None = None, name: str | None = None,
                precision: str = "fp32") -> ParallelPlan:
    """The search on a captured graph with a given cost model, sharing ILP solutions via ``cache``;
    ``space`` allows one gradient communication (:attr:`SearchSpace.grad_comm`)."""
    t0 = time.perf_counter()
    check_batches(global_batch_size)
    check_budget(budget)
    s = _Search(mg, cluster, cm, space, global_batch_size, budget, False, cache)
    best = cast(_Candidate, s.run())  # (without a bound a candidate, or PlanError)
    stats = {"search_s": time.perf_counter() - t0, "points": s.points, "chain_solves": s.chain_solves}
    return dataclasses.replace(_assemble(mg, cluster, cm, best, budget, stats, None, precision, name or mg.name,
                                         host_budget=space.host_memory_budget), grad_comm=space.grad_comm)


def default_cost_model(cluster: Cluster, precision: str = "fp32") -> CostModel:
    """What a search prices with when given no cost model: on this machine's CPU processes with a
    cached calibration of this machine, the calibrated model
    (:func:`~galvatron_fx.cost_models.cpu_runtime.calibrated_cost_model`: a training step's
    runtime overhead, in-step collectives and shared cores, measured); else the analytic model
    of ``cluster``'s figures."""
    from galvatron_fx.cost_models.cpu_runtime import calibrated_cost_model

    prec = Precision.named(precision)
    return calibrated_cost_model(cluster, prec) or AnalyticCostModel(cluster, precision=prec)


_MAX_BATCH_CANDIDATES = 256  # each candidate global batch is a whole search


def check_batches(global_batch_size: int | Sequence[int]) -> list[int]:
    """The candidate global batches, sorted; ``ConfigError`` unless each is an int in
    :data:`limits.BATCH` and there are 1 to 256 of them."""
    hint = "pass the samples per optimizer step (an int), or a list of candidates"
    if isinstance(global_batch_size, Sequence) and not isinstance(global_batch_size, str):
        if not 1 <= len(global_batch_size) <= _MAX_BATCH_CANDIDATES:
            raise ConfigError(f"global_batch_size lists {len(global_batch_size)} candidates; give 1 to "
                              f"{_MAX_BATCH_CANDIDATES} (each is searched in full)")
        for i, gb in enumerate(global_batch_size):
            limits.BATCH.check(gb, f"global_batch_size[{i}]", hint)
        return sorted(set(global_batch_size))
    return [limits.BATCH.check(global_batch_size, "global_batch_size", hint)]


def check_budget(memory_budget: int | float) -> None:
    """``ConfigError`` unless ``memory_budget`` is a finite number of bytes in [1, 2**60] (a
    budget too small for any plan is the search's to report)."""
    rng = limits.Range(1, limits.DEVICE_MEMORY.hi, "bytes")
    rng.check(memory_budget, "memory_budget", "pass bytes per device (e.g. 16 * 2**30 for 16 GiB), or None for "
                                              "the devices' own memory")
