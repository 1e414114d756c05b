"""The hand-written configurations practitioners use, as plans scored by the same cost model.

- ``ddp``: pure data parallelism (every rank holds everything; one gradient all-reduce);
- ``zero2`` / ``zero2+recompute`` (DeepSpeed-style ZeRO-2): gradients and optimizer sharded;
- ``fsdp`` / ``fsdp+recompute`` (FSDP / ZeRO-3): parameters sharded too;
- ``fsdp+offload`` / ``fsdp+recompute+offload`` (DeepSpeed ZeRO-3-Offload, FSDP's
  ``CPUOffloadPolicy``): every layer's shards and optimizer step in host memory, on clusters whose
  devices have host memory beside their own;
- ``megatron tpT ppP`` / ``+recompute``: Megatron-style uniform tensor × pipeline × data
  parallelism, best over its grid (tp ∈ divisors within a node, pp searched with micro-batches).

Each is the search restricted to one strategy for every layer (``SearchSpace(uniform=True)``
with a single tp / dp flavour / recompute value), so baselines and searched plans are priced by
exactly the same model.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from galvatron_fx.cluster import Cluster
from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.offload import can_offload
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import DPType, SPMode
from galvatron_fx.search.candidates import OptionCache, SearchSpace, allowed_tp
from galvatron_fx.search.run_search import search_plan

log = logging.getLogger(__name__)


def baseline_spaces(cluster: Cluster, limits: SearchSpace | None = None) -> dict[str, SearchSpace]:
    """Name → restricted search space of every baseline configuration.

    ``limits`` (the user's search space) caps the baselines the same way: a baseline using a
    data-parallel flavour, a recompute mode or a tensor-parallel degree the user ruled out is
    dropped, and pipeline and schedule limits apply to all, as does the gradient communication
    (the plan's one: a bf16-sum plan is compared with bf16-sum baselines) — so the comparison is fair.
    """
    spaces = _all_baseline_spaces(cluster)
    if limits is None:
        return spaces
    out = {}
    for name, sp in spaces.items():
        if not set(sp.dp_types) <= set(limits.dp_types) or not set(sp.recompute) <= set(limits.recompute):
            continue
        if not set(sp.offload) <= set(limits.offload):
            continue
        if limits.tp is not None and not set(sp.tp or ()) <= set(limits.tp):
            continue
        if limits.max_tp is not None and max(sp.tp or (1,)) > limits.max_tp:
            continue
        pp = sp.pp if sp.pp is not None else limits.pp
        if sp.pp is not None and limits.pp is not None and not set(sp.pp) <= set(limits.pp):
            continue
        out[name] = dataclasses.replace(sp, pp=pp, max_pp=limits.max_pp, schedules=limits.schedules,
                                        num_microbatches=limits.num_microbatches,
                                        reduce_dtypes=limits.reduce_dtypes, powersgd_ranks=limits.powersgd_ranks,
                                        powersgd_start_step=limits.powersgd_start_step,
                                        host_memory_budget=limits.host_memory_budget)
    return out


def _all_baseline_spaces(cluster: Cluster) -> dict[str, SearchSpace]:
    out: dict[str, SearchSpace] = {}
    for rc in (Recompute.NONE, Recompute.FULL):
        suffix = "" if rc == Recompute.NONE else "+recompute"
        flat: dict[str, Any] = dict(tp=(1,), sp=(SPMode.NONE,), recompute=(rc,), pp=(1,), uniform=True)
        if rc == Recompute.NONE:
            out["ddp"] = SearchSpace(dp_types=(DPType.DDP,), offload=(False,), **flat)
        out["zero2" + suffix] = SearchSpace(dp_types=(DPType.ZERO2,), offload=(False,), **flat)
        out["fsdp" + suffix] = SearchSpace(dp_types=(DPType.ZERO3,), offload=(False,), **flat)
        if cluster.world_size > 1 and all(can_offload(cluster.device_specs[k]) for k in set(cluster.node_kinds)):
            out["fsdp" + suffix + "+offload"] = SearchSpace(dp_types=(DPType.ZERO3,), offload=(True,), **flat)
        for tp in allowed_tp(SearchSpace(), cluster.world_size, cluster.devices_per_node):
            out[f"megatron-tp{tp}" + suffix] = SearchSpace(tp=(tp,), sp=(SPMode.NONE,), dp_types=(DPType.DDP,),
                                                          recompute=(rc,), uniform=True, offload=(False,))
    return out


def all_baselines(mg: ModelGraph, cluster: Cluster, cm: CostModel, *, global_batch_size: int, memory_budget: int,
                  cache: OptionCache | None = None, limits: SearchSpace | None = None) -> dict[str, ParallelPlan | None]:
    """Every baseline's best plan, or None where it does not fit."""
    cache = cache or OptionCache(mg, cm)
    out: dict[str, ParallelPlan | None] = {}
    for name, space in baseline_spaces(cluster, limits).items():
        try:
            out[name] = search_plan(mg, cluster, cm, space, global_batch_size=global_batch_size,
                                    budget=memory_budget, cache=cache, name=f"{mg.name} [{name}]")
        except PlanError as e:
            log.info("baseline %s: %s", name, e)
            out[name] = None
    return out


def best_baseline(mg: ModelGraph, cluster: Cluster, cm: CostModel, *, global_batch_size: int, memory_budget: int,
                  cache: OptionCache | None = None, limits: SearchSpace | None = None) -> tuple[str, ParallelPlan] | None:
    """The fastest baseline that fits (within the user's ``limits``), with its name."""
    plans = all_baselines(mg, cluster, cm, global_batch_size=global_batch_size, memory_budget=memory_budget,
                          cache=cache, limits=limits)
    fits = [(n, p) for n, p in plans.items() if p is not None]
    return min(fits, key=lambda np_: np_[1].predicted.step_time_s) if fits else None
