"""Re-pricing a given plan: its stages, micro-batches, schedule, layer strategies, dp and placements,
with any cost model, through the planner's own evaluation.

Contract
    ``price_plan(plan, mg, cost_model)`` returns a copy of ``plan`` whose predictions (per layer
    and in total) are ``cost_model``'s, on the cost model's cluster; ``PlanError`` when ``mg`` is
    not the plan's graph, the world sizes differ or a layer's strategy cannot be priced.

Terms
    *pinned*: every layer restricted to the plan's own choice (strategy, dp and placements), and
    its gradient communication (``grad_comm``), so the evaluation prices exactly that plan.

Algorithm
    A search space holding only the plan's values, an option cache holding only its placements
    (``_PlanOptions``), and a ``_Search`` whose stage solve returns the pinned choices
    (``_Pinned``); one evaluation at the plan's stage boundaries, then the planner's assembly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.layer_option import LayerOption
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import DPType, SPMode
from galvatron_fx.passes.decompose_layer import check_placements, decompose_layer
from galvatron_fx.search.assemble_plan import _assemble, _StageResult
from galvatron_fx.search.candidates import OptionCache, SearchSpace
from galvatron_fx.search.intra_layer import option_from_placements
from galvatron_fx.search.outer_search import _Search
from galvatron_fx.search.transitions import transition_s


def price_plan(plan: ParallelPlan, mg: ModelGraph, cost_model: CostModel) -> ParallelPlan:
    """The same plan — pp, micro-batches, schedule, stage boundaries, every layer's strategy, dp
    and placements — priced by ``cost_model`` (on its cluster) through the planner's own
    evaluation. Returns a copy of ``plan`` whose predictions (per layer and in total) are
    ``cost_model``'s. Raises ``PlanError`` when ``mg`` is not the graph the plan was made for or
    the cost model cannot price a layer's strategy."""
    if len(plan.layers) != len(mg.layers) or any(lp.name != l.name for lp, l in zip(plan.layers, mg.layers)):
        raise PlanError(f"plan {plan.model!r} names other layers than the graph {mg.name!r}; price it on its own graph")
    cluster = cost_model.cluster
    if cluster.world_size != plan.world_size:
        raise PlanError(f"plan {plan.model!r} is for {plan.world_size} devices, the cost model's cluster has "
                        f"{cluster.world_size}")
    space = SearchSpace(
        tp=tuple(sorted({lp.strategy.tp for lp in plan.layers})),
        sp=tuple(sorted({lp.strategy.sp for lp in plan.layers} | {SPMode.NONE})),
        dp_types=tuple(sorted({lp.strategy.dp_type for lp in plan.layers} | {DPType.DDP})),
        recompute=tuple(sorted({lp.strategy.recompute for lp in plan.layers} | {Recompute.NONE})),
        pp=(plan.pp,), num_microbatches=(plan.num_microbatches,), schedules=(plan.schedule,),
        reduce_dtypes=(plan.grad_comm.reduce_dtype,),
        powersgd_ranks=(plan.grad_comm.powersgd_rank,), powersgd_start_step=plan.grad_comm.powersgd_start_step,
        offload=tuple(sorted({lp.strategy.offload for lp in plan.layers} | {False})))
    options = _PlanOptions(mg, cost_model, plan=plan)
    check_placements(plan, mg, decomposed=options.decomposed)
    s = _Pinned(plan, mg, cluster, cost_model, space, plan.global_batch_size, plan.predicted.memory_budget_bytes,
                False, options)
    cand = s.evaluate(list(plan.stage_boundaries), plan.pp, plan.num_microbatches, plan.schedule,
                      plan.global_batch_size // plan.num_microbatches)
    if cand is None:
        raise PlanError(f"{plan.model}: the cost model cannot price this plan")
    return dataclasses.replace(
        _assemble(mg, cluster, cost_model, cand, plan.predicted.memory_budget_bytes, plan.solver_stats,
                  plan.baseline, plan.precision, plan.model), grad_comm=plan.grad_comm)


@dataclass
class _PlanOptions(OptionCache):
    """Only a plan's own placements, priced by the cost model."""

    plan: ParallelPlan | None = None

    def option_list(self, layer: LayerInfo, tp: int, sp: SPMode) -> list[LayerOption]:
        key = (layer.kind, tp, sp)
        if key not in self.options:
            want: list[dict[str, str]] = []
            assert self.plan is not None  # (price_plan always gives one)
            for lp in self.plan.layers:
                if (lp.kind, lp.strategy.tp, lp.strategy.sp) == key and lp.placements and lp.placements not in want:
                    want.append(dict(lp.placements))
            if layer.kind not in self.decomposed:
                self.decomposed[layer.kind] = decompose_layer(self.mg, layer)
            self.options[key] = [option_from_placements(self.mg, layer, tp, sp, self.cost_model, w,
                                                        decomposed=self.decomposed[layer.kind]) for w in want]
        return self.options[key]


class _Pinned(_Search):
    """The search's evaluation with every layer pinned to a plan's choice."""

    def __init__(self, plan: ParallelPlan, *args):
        super().__init__(*args)
        self.plan = plan

    def stage_ranks(self, pp: int):
        """The plan's own stages' ranks (the order it was laid out in)."""
        return self.plan.stage_ranks

    def stage(self, lo, hi, devices, samples, m, in_flight, budget=None, ranks=None):
        chosen, trans = [], [0.0]
        for i in range(lo, hi):
            lp = self.plan.layers[i]
            cands = [c for c in self.choices(i, devices, samples, m, ranks)
                     if c.strategy == lp.strategy and c.dp == lp.dp
                     and (dict(c.option.placements) if c.option is not None else {}) == dict(lp.placements)]
            if not cands:
                raise PlanError(f"{self.plan.model}: no priced choice matches layer {lp.name} ({lp.strategy.short()}, "
                                f"dp={lp.dp})")
            chosen.append(cands[0])
            if i > lo:
                prev = self.layers[i - 1]
                nbytes = int(prev.costs.output_bytes * samples / self.captured_batch)
                trans.append(m * transition_s(self.cm, chosen[-2], chosen[-1], nbytes, 3, list(ranks or range(devices))))
        mem = sum(c.mem_bytes(in_flight) for c in chosen) + max(c.memory.temp_bytes for c in chosen)
        time_s = sum(c.step_time_s(m) for c in chosen) + sum(trans)
        return _StageResult(range(lo, hi), chosen, trans, time_s, mem, in_flight, [[c] for c in chosen], mem)
