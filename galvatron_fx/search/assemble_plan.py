"""The search's results and their assembly into a :class:`~galvatron_fx.ir.plan.ParallelPlan`.

Contract
    ``_assemble(mg, cluster, cm, best, budget, stats, baseline, precision, name)`` turns the best
    search point (a ``_Candidate``: pp, micro-batches, schedule and one ``_StageResult`` per
    chunk) into a checked, frozen plan: one ``LayerPlan`` per layer with its placements, its
    predicted costs and up to three rejected alternatives with why each lost, per-stage peak
    memory, the hashes and summaries that bind the plan to its graph and cluster.

Terms
    *chunk*: a contiguous run of layers on one stage (``pp × virtual_stages`` of them);
    *stage memory*: what the stage DP held a rank to (every gradient plus the largest temporary),
    the measure alternatives are refused by; *peak*: the schedule-aware
    :func:`~galvatron_fx.cost_models.memory.stage_peak_bytes`, what the plan reports.

Algorithm
    Per rank, the peak over its chunks' layer memories, less the copies of weights tied between
    layers that the runtime keeps as one parameter (:func:`shared_tied_memory`); per layer, the
    chosen choice's prediction and the fastest other choices of its stage as alternatives.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass

from galvatron_fx.cluster import Cluster
from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.memory import (
    LayerMemory,
    device_budget_bytes,
    reserved_bytes,
    stage_host_bytes,
    stage_peak_bytes,
    tensor_budget_bytes,
)
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import (
    Alternative,
    LayerPlan,
    LayerPrediction,
    ParallelPlan,
    PlanPrediction,
    cluster_hash,
    graph_hash,
    graph_summary,
)
from galvatron_fx.ir.plan_records import Baseline, SearchStats
from galvatron_fx.ir.plan_report import verdict
from galvatron_fx.ir.strategy import DPType, Precision
from galvatron_fx.report.fmt import fmt_bytes
from galvatron_fx.search.candidates import LayerChoice


@dataclass
class _StageResult:
    layers: range
    choices: list[LayerChoice]  # chosen, one per layer
    trans_s: list[float]  # per layer, per step (0 for the first of the stage)
    time_s: float  # Σ per-step layer times + transitions
    mem_bytes: int  # peak per rank
    in_flight: int
    all_choices: list[list[LayerChoice]]
    min_mem_bytes: int
    # the chain's transition matrices (trans[j][a, b]: all_choices[j-1][a] -> all_choices[j][b],
    # per step; trans[0] None), where the stage was solved as a chain
    trans: list | None = None


@dataclass
class _Candidate:
    pp: int
    m: int
    schedule: str
    samples: int
    stages: list[_StageResult]
    step_time_s: float
    bubble_fraction: float
    breakdown: dict[str, float]
    virtual_stages: int = 1
    busy_s: tuple[float, ...] = ()  # per stage: a rank's forward and backward seconds per step
    stage_ranks: tuple[tuple[int, ...], ...] = ()  # per stage (topology.stage_ranks); () = contiguous blocks


def _assemble(mg: ModelGraph, cluster: Cluster, cm: CostModel, best: _Candidate, budget: int, stats: Mapping,
              baseline: Mapping | None, precision: str, name: str, *, host_budget: int | None = None) -> ParallelPlan:
    """The plan of the search's best candidate (``host_budget``: the host memory per node the
    search held offloaded layers to; default the devices' host memory)."""
    devices = cluster.world_size // best.pp
    stage_ranks = best.stage_ranks or tuple(tuple(range(s * devices, (s + 1) * devices)) for s in range(best.pp))
    layer_plans: list[LayerPlan] = []
    peaks = []
    for r in range(best.pp):  # a rank runs stage r: one chunk, or several under interleaving
        sts = best.stages[r::best.pp]
        peaks.append(stage_peak_bytes([x for st in sts for x in shared_tied_memory(mg, cm, st)],
                                      [st.in_flight for st in sts for _ in st.choices],
                                      grads_held=best.m > 1 or best.pp > 1))
    # what each stage's device shows: its tensors and the fixed terms (cost_models.memory); a
    # stage spanning device kinds, the most any of them shows
    reserved = [max(reserved_bytes(peak, cluster.device_specs[k], plan_communicators(best.stages[r::best.pp], best.pp))
                    for k in _stage_kinds(cluster, stage_ranks[r]))
                for r, peak in enumerate(peaks)]
    tensor_budget = tensor_budget_bytes(budget, cluster)
    # per stage (heterogeneous clusters: each its own devices' budget, module doc of outer_search)
    stage_budgets = [device_budget_bytes(budget, cluster, ranks) for ranks in stage_ranks]
    stage_tensor_budgets = [tensor_budget_bytes(budget, cluster, ranks=ranks) for ranks in stage_ranks]
    # what the stage DPs held each rank to (every gradient and the largest temporary added up):
    # the measure alternatives are refused by
    searched = [sum(x.mem_bytes(st.in_flight) for st in best.stages[r::best.pp] for x in st.choices)
                + max(x.memory.temp_bytes for st in best.stages[r::best.pp] for x in st.choices)
                for r in range(best.pp)]
    for c, st in enumerate(best.stages):
        stage_mem = searched[c % best.pp]
        on_rank = [x for ch in best.stages[c % best.pp::best.pp] for x in ch.choices]
        offset = sum(len(ch.choices) for ch in best.stages[c % best.pp:c:best.pp])  # this chunk's first
        for j, i in enumerate(st.layers):
            layer = mg.layers[i]
            x = st.choices[j]
            pred = _prediction(x, best.m, st.in_flight, st.trans_s[j], temp_here=x.memory.temp_bytes,
                               stage_bytes=stage_mem)
            alts = _alternatives(st, j, best.m, stage_tensor_budgets[c % best.pp], stage_mem, on_rank, offset + j)
            layer_plans.append(LayerPlan(
                name=layer.name, kind=layer.kind, role=layer.role, stage=c % best.pp, strategy=x.strategy, dp=x.dp,
                placements=dict(x.option.placements) if x.option is not None else {},
                predicted=pred, alternatives=tuple(alts), collectives=x.collectives,
                labels=dict(x.option.labels) if x.option is not None else {}))
    host = _host_memory(cluster, best, host_budget, shared=[[x for st in best.stages[r::best.pp]
                                                for x in shared_tied_memory(mg, cm, st)] for r in range(best.pp)])
    max_dp = max(lp.dp for lp in layer_plans)
    samples = best.samples
    flops, peak, mfu, density = _efficiency(mg, cluster, cm, best, precision)
    plan = ParallelPlan(
        model=name, graph_hash=graph_hash(mg), cluster_hash=cluster_hash(cluster), world_size=cluster.world_size,
        cluster=json.loads(cluster.to_json()), graph=graph_summary(mg),
        pp=best.pp, num_microbatches=best.m, schedule=best.schedule, virtual_stages=best.virtual_stages,
        global_batch_size=samples * best.m, micro_batch_size=samples // max_dp,
        stage_boundaries=tuple(st.layers.start for st in best.stages),
        stage_ranks=stage_ranks,
        stage_devices=tuple(stage_device(cluster, ranks) for ranks in stage_ranks) if cluster.is_heterogeneous else (),
        precision=precision, layers=tuple(layer_plans),
        predicted=PlanPrediction(step_time_s=best.step_time_s,
                                 throughput_samples_s=samples * best.m / best.step_time_s,
                                 peak_memory_bytes=tuple(peaks), memory_budget_bytes=budget,
                                 reserved_peak_bytes=tuple(reserved), tensor_budget_bytes=tensor_budget,
                                 bubble_fraction=best.bubble_fraction, breakdown=best.breakdown,
                                 model_flops=flops, peak_flops=peak, mfu=mfu, compute_density=density,
                                 stage_budget_bytes=tuple(stage_budgets) if cluster.is_heterogeneous else (), **host),
        solver_stats=SearchStats.of(stats), baseline=None if baseline is None else Baseline.of(baseline), notes=tuple(_over_budget_notes(reserved, stage_budgets)),
    )
    return plan


def _host_memory(cluster: Cluster, best: _Candidate, host_budget: int | None, shared: list[list[LayerMemory]]) -> dict:
    """CPU offload's host memory: per stage one rank's, per node the sum over its ranks, and the
    host budget per node (none of it when no layer offloads)."""
    per_stage = [stage_host_bytes(mems) for mems in shared]
    if not any(per_stage):
        return {}
    devices = cluster.world_size // best.pp
    ranks = best.stage_ranks or tuple(tuple(range(s * devices, (s + 1) * devices)) for s in range(best.pp))
    nodes = [0] * cluster.num_nodes
    for s, rs in enumerate(ranks):
        for r in rs:
            nodes[cluster.node_of(r)] += per_stage[s]
    specs = [cluster.device_specs[k] for k in set(cluster.node_kinds)]
    budget = min((d.host_memory_bytes or 0) for d in specs) * cluster.devices_per_node
    budget = budget if host_budget is None else min(budget, host_budget)
    return {"host_memory_bytes": tuple(per_stage), "host_node_bytes": tuple(nodes), "host_budget_bytes": budget}


def _efficiency(mg: ModelGraph, cluster: Cluster, cm: CostModel, best: _Candidate, precision: str
                ) -> tuple[float | None, float | None, float | None, tuple[float, ...]]:
    """The model's FLOPs per step (forward and backward of every layer at the global batch,
    recomputation not counted), the devices' peak FLOP/s summed, MFU (the FLOPs over the step
    time and that peak) and each stage's compute density (its busiest rank's forward and
    backward time, recomputation included, over the step time). A device's peak is its stated
    one in the compute dtype, or the rate the cost model prices its matmuls at where that is
    higher (a conservative stated figure would put MFU above 1)."""
    step = best.step_time_s
    density = tuple(b / step for b in best.busy_s) if step > 0 else ()
    if any(layer.costs is None for layer in mg.layers):
        return None, None, None, density
    captured = mg.example_shapes[0][0] if mg.example_shapes and mg.example_shapes[0] else 1
    c = mg.total_costs()
    flops = float(c.fwd_flops + c.bwd_flops) * best.samples * best.m / captured
    dtype = Precision.named(precision).compute_dtype
    priced = getattr(getattr(cm, "compute", None), "matmul_flops", None)
    peak = sum(max(cluster.device(r).flops(dtype), priced(r) if priced is not None else 0.0)
               for r in range(cluster.world_size))
    return flops, peak, (flops / (step * peak) if step > 0 and peak > 0 else None), density


def _over_budget_notes(reserved: list[int], budgets: list[int]) -> list[str]:
    """A note per stage whose device peak exceeds its budget: the search allowed for
    ``BUDGET_COMMUNICATORS`` process groups per rank, and the plan's layers use more."""
    return [f"stage {s}: the device is predicted to hold {fmt_bytes(r)}, over the {fmt_bytes(b)} budget, "
            f"because its layers use more process groups than the search allowed for (each holds communicator "
            f"buffers); cap the search's degrees or lower the budget"
            for s, (r, b) in enumerate(zip(reserved, budgets)) if r > b]


def _stage_kinds(cluster: Cluster, ranks) -> list[str]:
    """The device kinds of a stage's ranks, in rank order."""
    return list(dict.fromkeys(cluster.node_kinds[cluster.node_of(r)] for r in ranks))


def stage_device(cluster: Cluster, ranks) -> str:
    """The device kind a stage runs on (``ParallelPlan.stage_devices``): its kind, or its kinds
    joined by ``+`` where it spans several (priced by the slowest, held to the smallest)."""
    return "+".join(_stage_kinds(cluster, ranks))


def plan_communicators(chunks, pp: int) -> int:
    """Process groups one rank of a stage (its ``chunks``) communicates in: the world, each
    data-parallel and tensor-parallel group of its layers' meshes, the pipeline's neighbours."""
    groups: set[tuple] = set()
    for st in chunks:
        for x in st.choices:
            if x.dp > 1:
                groups.add(("dp", x.dp, x.strategy.tp))
            if x.strategy.tp > 1:
                groups.add(("tp", x.strategy.tp))
    return 1 + len(groups) + (min(2, pp - 1) if pp > 1 else 0)


def shared_tied_memory(mg: ModelGraph, cm: CostModel, stage) -> list[LayerMemory]:
    """The memories of ``stage``'s layers (one chunk: a ``_StageResult``), less what their own
    accounting counts twice for a weight tied between them that the runtime keeps as one
    parameter.

    A layer's choice prices a copy of every weight it reads, with its gradient and optimizer
    states (it does not know its neighbours' choices). The runtime shares one parameter between
    readers that store it alike (``ParallelModule._share_tied``; one FSDP unit under ZeRO): at
    ``tp == 1``, those with the same dp degree, both outside FSDP or both in it (readers at
    ``tp > 1`` keep their copies here). Each further reader loses its copy of the parameter and
    its optimizer states (and ZeRO-2's gathered copy, when both keep one); of the gradients one
    remains, where backward makes it: outside FSDP at the last reader (autograd holds the first
    contribution from there on), in an FSDP unit at the first (its reduce-scatter follows the
    unit's last backward)."""
    mems = [c.memory for c in stage.choices]
    first: dict[tuple, int] = {}  # (fqn, dp, sharded) -> position of the previous reader
    for j, (i, c) in enumerate(zip(stage.layers, stage.choices)):
        layer, st = mg.layers[i], c.strategy
        if st.tp != 1:
            continue
        sharded = st.dp_type != DPType.DDP and c.dp > 1
        for f in layer.param_names:
            p = mg.params.get(f)
            if p is None or p.is_buffer or not p.requires_grad or len(p.layers) < 2:
                continue
            key = (f, c.dp, sharded)
            if key not in first:
                first[key] = j
                continue
            prev = first[key]
            first[key] = j
            m = cm.layer_memory(layer.costs, st, dp=c.dp, micro_batch=1, captured_batch=1, params=[p])
            gathered = st.dp_type == stage.choices[prev].strategy.dp_type == DPType.ZERO2
            mems[j] = dataclasses.replace(
                mems[j], param_bytes=mems[j].param_bytes - m.param_bytes,
                optimizer_bytes=mems[j].optimizer_bytes - m.optimizer_bytes,
                unsharded_param_bytes=mems[j].unsharded_param_bytes - (m.unsharded_param_bytes if gathered else 0))
            g = j if sharded else prev  # the gradient that does not exist apart
            mems[g] = dataclasses.replace(mems[g], grad_bytes=mems[g].grad_bytes - m.grad_bytes)
    return mems


def _prediction(c: LayerChoice, m: int, in_flight: int, trans_s: float, temp_here: int,
                stage_bytes: int | None = None) -> LayerPrediction:
    mem = c.memory
    breakdown = {"params": mem.param_bytes + mem.unsharded_param_bytes, "grads": mem.grad_bytes,
                 "optimizer": mem.optimizer_bytes, "activations": in_flight * mem.activation_bytes,
                 "temp": temp_here}
    return LayerPrediction(fwd_s=m * c.fwd_s, bwd_s=m * c.bwd_s, comm_s=m * c.tp_comm_s + c.dp_comm_s,
                           transition_s=trans_s, memory_bytes=sum(breakdown.values()),
                           memory_breakdown=breakdown, optimizer_s=c.optim_s, stage_bytes=stage_bytes,
                           host_bytes=mem.host_bytes)


def _transitions(st: _StageResult, j: int, c: LayerChoice) -> tuple[float, float]:
    """Per-step resharding into choice ``c`` of layer ``j`` from the previous layer's chosen
    layout and out of it into the next one's (0 at the stage's ends, or where unknown)."""
    if st.trans is None:
        return 0.0, 0.0

    def at(mat, a, b) -> float:
        try:
            return float(mat[next(k for k, x in enumerate(st.all_choices[a[0]]) if x is a[1]),
                             next(k for k, x in enumerate(st.all_choices[b[0]]) if x is b[1])])
        except StopIteration:  # a choice the chain did not hold (a flavour switched after the DP)
            return 0.0

    t_in = at(st.trans[j], (j - 1, st.choices[j - 1]), (j, c)) if j > 0 else 0.0
    last = len(st.choices) - 1
    t_out = at(st.trans[j + 1], (j, c), (j + 1, st.choices[j + 1])) if j < last else 0.0
    return t_in, t_out


def _alternatives(st: _StageResult, j: int, m: int, budget: int, stage_mem: int, on_rank: list[LayerChoice],
                  pos: int, k: int = 3) -> list[Alternative]:
    """The ``k`` fastest choices of layer ``j`` the search did not take, each priced with the
    chosen neighbours (resharding in and out) and with the memory its stage would hold (``on_rank``:
    the choices of every layer the stage's ranks run, this one at ``pos``), and
    :func:`~galvatron_fx.ir.plan_report.verdict` of those numbers."""
    chosen = st.choices[j]
    _, out_chosen = _transitions(st, j, chosen)
    base = _prediction(chosen, m, st.in_flight, st.trans_s[j], chosen.memory.temp_bytes, stage_bytes=stage_mem)
    out = []
    others = sorted((c for c in st.all_choices[j] if c is not chosen), key=lambda c: c.step_time_s(m))
    rest = on_rank[:pos] + on_rank[pos + 1:]
    rest_bytes = sum(x.mem_bytes(st.in_flight) for x in rest)
    rest_temp = max((x.memory.temp_bytes for x in rest), default=0)
    for c in others[:k]:
        t_in, t_out = _transitions(st, j, c)
        held = rest_bytes + c.mem_bytes(st.in_flight) + max(rest_temp, c.memory.temp_bytes)
        pred = _prediction(c, m, st.in_flight, t_in, c.memory.temp_bytes, stage_bytes=held)
        out.append(Alternative(strategy=c.strategy, predicted=pred,
                               reason=verdict(base, out_chosen, pred, t_out, budget),
                               layout=f"in {c.in_layout}, out {c.out_layout}", transition_out_s=t_out))
    return out
