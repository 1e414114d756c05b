"""plan — the outer search: pipeline degree, stage boundaries, micro-batches and schedule around
the per-stage inter-layer DP; assembles the :class:`~galvatron_fx.ir.plan.ParallelPlan`.

Contract: needs a captured, annotated ModelGraph (or a model and example inputs to capture), a
Cluster and a global batch; returns the fastest plan the cost model predicts that fits the
memory budget on every stage, or raises :class:`~galvatron_fx.errors.PlanError` saying the
smallest memory any plan would need and what to relax. Needs no processes and no weights.

Algorithm, for each pipeline degree ``pp`` (a divisor of the world), micro-batch count ``m``
(a divisor of the global batch, ``≥ pp`` under 1F1B) and schedule:
1. price every layer's choices in a stage of ``D = world / pp`` ranks
   (:mod:`galvatron_fx.search.candidates`; intra-layer ILPs cached per kind, tp and SP mode);
2. start from the stage boundaries that balance each layer's fastest time (a linear-partition
   DP minimising the largest stage);
3. solve each stage with the inter-layer DP (:func:`~galvatron_fx.search.layer_dp.solve_chain`)
   under the budget, with the activations of the micro-batches the schedule keeps in flight on
   that stage (1F1B: ``pp − s`` on stage ``s``), then simulate the schedule
   (:func:`~galvatron_fx.cost_models.pipeline.simulate`) for the step time;
4. move each boundary by one layer while the simulated step time improves (hill climbing on
   the real objective, memory re-checked by the stage DPs).
Points whose lower bound (their fastest, memory-blind time) cannot beat the best plan found are
skipped.

A point's step time = the simulated schedule (or ``m`` micro-batches of compute without
pipeline) + the busiest rank's synchronisation: the data-parallel gradient sums as the runtime
buckets them (:func:`~galvatron_fx.cost_models.grad_sync.bucketed_sync_s` per data-parallel
group of each chunk, launched during the last backward without pipeline, after the schedule with
one), FSDP's exposed collectives, the all-reduce of weights tied across pipeline stages, and the
optimizer step. The per-layer DP sees each DDP layer's share of a bucket only (module
:mod:`~galvatron_fx.search.candidates`), so the latency paid per bucket is priced here, once.
Memory: the DP adds every layer's gradients and its largest temporary (conservative); the plan
reports the peak of :func:`~galvatron_fx.cost_models.memory.stage_peak_bytes`, where with one
micro-batch and no pipeline the gradients only appear as the backward frees activations.

:func:`~galvatron_fx.search.price_plan.price_plan` re-prices a given plan — its stages,
micro-batches, schedule, layer strategies and placements — with any cost model, through the same
evaluation. The search's results and their assembly into the plan are in
:mod:`~galvatron_fx.search.assemble_plan`, the message when no plan is found in
:mod:`~galvatron_fx.search.no_plan`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Sequence

import numpy as np

from galvatron_fx import limits
from galvatron_fx.cluster import Cluster, Collective
from galvatron_fx.cost_models.base import AnalyticCostModel, CostModel
from galvatron_fx.cost_models.grad_sync import bucketed_sync_s
from galvatron_fx.cost_models.memory import tensor_budget_bytes
from galvatron_fx.cost_models.pipeline import StageCost
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.plan_report import TEMP_STEPS
from galvatron_fx.ir.strategy import Precision
from galvatron_fx.progress import Progress
from galvatron_fx.search.assemble_plan import _assemble, _Candidate, _StageResult
from galvatron_fx.search.candidates import (
    LayerChoice,
    NoStrategyError,
    OptionCache,
    SearchSpace,
    layer_choices,
    prune_dominated,
    transition_matrix,
)
from galvatron_fx.search.grad_comm_choice import plan_each_grad_comm
from galvatron_fx.search.layer_dp import ChainProblem, solve_chain
from galvatron_fx.search.no_plan import _why_none

log = logging.getLogger(__name__)
GiB = 2**30


class _Search:
    """One search: shared caches for all (pp, m, schedule) points."""

    def __init__(self, mg: ModelGraph, cluster: Cluster, cm: CostModel, space: SearchSpace,
                 global_batch: int, budget: int, progress: bool, cache: OptionCache | None = None):
        self.mg, self.cluster, self.cm, self.space = mg, cluster, cm, space
        # the budget is what a device may show in use; the tensors get what its fixed terms leave
        self.global_batch, self.device_budget = global_batch, budget
        self.budget = budget = tensor_budget_bytes(budget, cluster)
        self.world = cluster.world_size
        self.dpn = cluster.devices_per_node
        self.captured_batch = mg.example_shapes[0][0] if mg.example_shapes and mg.example_shapes[0] else 1
        self.cache = cache or OptionCache(mg, cm, vocab_parallel=space.vocab_parallel, lowered_prices=space.lowered_prices)
        self.layers = mg.layers
        self._choices: dict[tuple, list[LayerChoice]] = {}
        self._trans: dict[tuple, np.ndarray] = {}
        self._stage: dict[tuple, _StageResult] = {}
        self._pruned: dict[tuple, list[LayerChoice]] = {}
        self.progress = progress
        # memory is compared at 1/1024 of the budget and temporary buffers rounded up to 1/32 of
        # it (conservative: a plan found is always within budget)
        self.mem_step = max(1, budget // 1024)
        self.temp_step = max(1, budget // TEMP_STEPS)
        self.points = 0
        self.chain_solves = 0
        self.frontier_max = 0
        self.smallest_need = math.inf
        self.rejected: list[tuple[int, int, NoStrategyError]] = []  # (pp, m, why): points no layer split fits

    # ---- pricing ------------------------------------------------------------------------------
    def choices(self, i: int, devices: int, samples: int, m: int) -> list[LayerChoice]:
        layer = self.layers[i]
        owner = tuple(self.mg.params[f].layers[:1] == (layer.name,) for f in layer.param_names if f in self.mg.params)
        key = (layer.kind, owner, devices, samples, m)
        if key not in self._choices:
            self._choices[key] = layer_choices(
                self.mg, layer, self.cache, self.space, devices=devices, ranks=list(range(devices)),
                samples=samples, num_microbatches=m, captured_batch=self.captured_batch, devices_per_node=self.dpn)
        return self._choices[key]

    def pruned(self, i: int, devices: int, samples: int, m: int, in_flight: int) -> list[LayerChoice]:
        """The layer's choices without dominated ones (cached: identical layers share them)."""
        full = self.choices(i, devices, samples, m)
        key = (id(full), in_flight)
        if key not in self._pruned:
            self._pruned[key] = prune_dominated(full, m, in_flight)
        return self._pruned[key]

    def trans(self, i: int, prev: list[LayerChoice], cur: list[LayerChoice], devices: int, samples: int, m: int,
              key_extra: tuple) -> np.ndarray:
        layer_prev = self.layers[i - 1]
        key = (layer_prev.kind, self.layers[i].kind, devices, samples, m, key_extra)
        if key not in self._trans:
            nbytes = int(layer_prev.costs.output_bytes * samples / self.captured_batch)
            ndim = 3
            self._trans[key] = transition_matrix(self.cm, prev, cur, nbytes, ndim, list(range(devices)), m)
        return self._trans[key]

    # ---- one stage ------------------------------------------------------------------------------
    def stage(self, lo: int, hi: int, devices: int, samples: int, m: int, in_flight: int,
              budget: int | None = None) -> _StageResult:
        budget = self.budget if budget is None else budget
        key = (lo, hi, devices, samples, m, in_flight, budget)
        if key in self._stage:
            return self._stage[key]
        all_choices = [self.pruned(i, devices, samples, m, in_flight) for i in range(lo, hi)]
        trans: list[np.ndarray | None] = [None]
        for j in range(1, hi - lo):
            sig = (tuple(id(c) for c in all_choices[j - 1]), tuple(id(c) for c in all_choices[j]))
            trans.append(self.trans(lo + j, all_choices[j - 1], all_choices[j], devices, samples, m, sig))
        problem = ChainProblem(
            time_s=[np.array([c.step_time_s(m) for c in cs]) for cs in all_choices],
            mem_bytes=[np.array([c.mem_bytes(in_flight) for c in cs], dtype=np.int64) for cs in all_choices],
            trans_s=trans,
            extra_max_bytes=[_round_up(np.array([c.memory.temp_bytes for c in cs], dtype=np.int64), self.temp_step)
                             for cs in all_choices],
        )
        sol = solve_chain(problem, budget, mem_resolution_bytes=self.mem_step)
        self.chain_solves += 1
        self.frontier_max = max(self.frontier_max, max(sol.frontier_sizes, default=0))
        if not sol.feasible:  # (min_mem_bytes is -1 when no assignment is allowed at all)
            res = _StageResult(range(lo, hi), [], [], math.inf, sol.min_mem_bytes, in_flight, all_choices,
                               sol.min_mem_bytes)
        else:
            chosen = [all_choices[j][c] for j, c in enumerate(sol.choices)]
            tr = [0.0] + [float(trans[j][sol.choices[j - 1], sol.choices[j]]) for j in range(1, hi - lo)]
            res = _StageResult(range(lo, hi), chosen, tr, sol.time_s, sol.mem_bytes, in_flight, all_choices,
                               sol.min_mem_bytes, trans)
        self._stage[key] = res
        return res

    # ---- a pipeline point -------------------------------------------------------------------------
    def evaluate(self, bounds: list[int], pp: int, m: int, schedule: str, samples: int) -> _Candidate | None:
        """Solve every stage (chunk, under interleaving) at these boundaries and simulate a step."""
        devices = self.world // pp
        v = _virtual(schedule)
        edges = bounds + [len(self.layers)]
        in_flight = self._in_flight(schedule, pp, m, v)
        chunks = []
        for c in range(pp * v):
            # chunks of one rank share its memory: each is solved within its share of the budget
            chunks.append(self.stage(edges[c], edges[c + 1], devices, samples, m, in_flight[c], self.budget // v))
        if any(not st.choices for st in chunks):
            # the least memory this point could need: its hungriest rank, each chunk at its least
            need = max(sum(max(chunks[c].min_mem_bytes, 0) for c in range(r, pp * v, pp)) for r in range(pp))
            self.smallest_need = min(self.smallest_need, need)
            return None
        return self._price(chunks, pp, m, schedule, samples)

    def _price(self, chunks: list[_StageResult], pp: int, m: int, schedule: str, samples: int) -> _Candidate | None:
        """Simulate a step of these solved chunks and add the synchronisation (module doc)."""
        devices = self.world // pp
        v = _virtual(schedule)
        costs = []
        for c, st in enumerate(chunks):
            fwd = sum(x.fwd_s + x.tp_comm_s / 2 for x in st.choices) + sum(st.trans_s) / (2 * m)
            bwd = sum(x.bwd_s + x.tp_comm_s / 2 for x in st.choices) + sum(st.trans_s) / (2 * m)
            p2p = self._p2p_s(chunks, c, devices, samples) if c < pp * v - 1 else 0.0
            costs.append(StageCost(fwd_s=fwd, bwd_s=bwd, p2p_s=p2p))
        if pp == 1:
            step = m * sum(x.fwd_s + x.bwd_s for x in costs)
            bubble = 0.0
        else:
            try:
                res = self.cm.simulate_pipeline(schedule, costs, m, virtual_stages=v)
            except ConfigError:
                return None
            step, bubble = res.step_time_s, res.bubble_fraction
        per_rank = [[chunks[c] for c in range(r, pp * v, pp)] for r in range(pp)]
        tied = self._cross_tied_s(chunks, pp, devices) if pp > 1 else 0.0
        syncs = [self._sync_s(sts, devices, armed=pp == 1) for sts in per_rank]
        optim = [sum(x.optim_s for st in sts for x in st.choices) for sts in per_rank]
        after = max(sy + tied + o for sy, o in zip(syncs, optim))
        busy = [sum(m * (x.fwd_s + x.bwd_s) for st in sts for x in st.choices) for sts in per_rank]
        tp_comm = max(m * sum(x.tp_comm_s for st in sts for x in st.choices) for sts in per_rank)
        transition = max(sum(sum(st.trans_s) for st in sts) for sts in per_rank)
        recompute = max(m * sum(x.recompute_s for st in sts for x in st.choices) for sts in per_rank)
        breakdown = {"compute": max(busy), "comm": tp_comm + max(syncs) + tied, "transition": transition,
                     "bubble": bubble * step, "dp_sync": max(syncs) + tied, "optimizer": max(optim),
                     "recompute": recompute}
        return _Candidate(pp, m, schedule, samples, chunks, step + after, bubble, breakdown, v, tuple(busy))

    def _sync_s(self, chunks: list[_StageResult], devices: int, *, armed: bool) -> float:
        """Seconds one rank's gradient synchronisation adds to a step: FSDP's exposed collectives
        per layer, and per chunk and data-parallel group the bucketed DDP sums (module doc)."""
        total = 0.0
        for st in chunks:
            total += sum(x.dp_comm_s for x in st.choices if not x.bucketed)
            groups: dict[tuple[int, int], list[tuple[int, float]]] = {}
            t = 0.0  # the last micro-batch's backward runs from the chunk's last layer to its first
            for x in reversed(st.choices):
                t += x.bwd_s + x.tp_comm_s / 2
                if x.bucketed:
                    groups.setdefault((x.dp, x.strategy.tp), []).extend(x.bucket_entries(t))
            for (dp, tp), entries in groups.items():
                total += bucketed_sync_s(self.cm, entries, list(range(devices))[::tp][:dp], t, armed=armed)
        return total

    def _cross_tied_s(self, chunks: list[_StageResult], pp: int, devices: int) -> float:
        """The all-reduce over the pipeline group of each weight read in several stages (a tied
        embedding and head), after every chunk's own sync."""
        chunk_of = {i: c for c, st in enumerate(chunks) for i in st.layers}
        index = {layer.name: i for i, layer in enumerate(self.layers)}
        group = [s * devices for s in range(pp)]
        total = 0.0
        for info in self.mg.params.values():
            if info.is_buffer or not info.requires_grad:
                continue
            stages = {chunk_of[index[n]] % pp for n in info.layers if n in index}
            if len(stages) > 1:
                total += self.cm.collective_time_s(Collective.ALL_REDUCE, info.nbytes, group)
        return total

    def polish(self, cand: _Candidate) -> _Candidate:
        """The stage DPs see a DDP layer's share of its group's buckets only, so the exact price
        (per bucket, with its latency and the exposed last bucket) can make another
        data-parallel flavour better: try each flavour on every layer that has it with the same
        tp, SP mode, recompute and dp, and keep the fastest variant within the budget."""
        best = cand
        devices = self.world // cand.pp
        v = _virtual(cand.schedule)
        for flavour in self.space.dp_types:
            chunks, changed = [], False
            for st in cand.stages:
                new = []
                for i, x in zip(st.layers, st.choices):
                    want = dataclasses.replace(x.strategy, dp_type=flavour)
                    alt = [c for c in self.choices(i, devices, cand.samples, cand.m)
                           if c.dp == x.dp and c.strategy == want and c.option is x.option]
                    new.append(alt[0] if alt else x)
                if all(a is b for a, b in zip(new, st.choices)):
                    chunks.append(st)
                    continue
                changed = True
                mem = sum(c.mem_bytes(st.in_flight) for c in new) + max(c.memory.temp_bytes for c in new)
                if mem > self.budget // v:
                    break
                chunks.append(_StageResult(st.layers, new, st.trans_s,
                                           sum(c.step_time_s(cand.m) for c in new) + sum(st.trans_s), mem,
                                           st.in_flight, st.all_choices, st.min_mem_bytes, st.trans))
            else:
                if changed:
                    other = self._price(chunks, cand.pp, cand.m, cand.schedule, cand.samples)
                    if other is not None and other.step_time_s < best.step_time_s - 1e-12:
                        best = other
        return best

    def _in_flight(self, schedule: str, pp: int, m: int, v: int) -> list[int]:
        """Micro-batches each chunk holds at its peak: m under GPipe, pp − s under 1F1B, and
        counted from the operation order under interleaving."""
        if schedule == "gpipe":
            return [m] * (pp * v)
        if v == 1:
            return [min(pp - s, m) for s in range(pp)]
        from galvatron_fx.cost_models.pipeline import rank_orders

        try:
            orders = rank_orders(schedule, pp, m, virtual_stages=v)
        except ConfigError:
            return [m] * (pp * v)
        peak = [0] * (pp * v)
        for order in orders:
            live: dict[int, int] = {}
            for kind, chunk, _mb in order:
                live[chunk] = live.get(chunk, 0) + (1 if kind == "F" else -1)
                peak[chunk] = max(peak[chunk], live[chunk])
        return [max(1, x) for x in peak]

    def _p2p_s(self, chunks: list[_StageResult], c: int, devices: int, samples: int) -> float:
        last = chunks[c].choices[-1]
        layer = self.layers[chunks[c].layers[-1]]
        nbytes = int(layer.costs.output_bytes * samples / self.captured_batch / last.dp)
        pp = self.world // devices
        src = (c % pp + 1) * devices - 1  # the last rank of this chunk's stage, to the next stage
        dst = ((c + 1) % pp) * devices
        return self.cm.collective_time_s(Collective.P2P, nbytes, [src, dst]) if src != dst else 0.0

    # ---- the outer loops ------------------------------------------------------------------------
    def pp_values(self) -> list[int]:
        n_blocks = max(1, len(self.layers))
        cap = min(self.space.max_pp or self.world, n_blocks)
        vals = [p for p in range(1, cap + 1) if self.world % p == 0]
        if self.space.pp is not None:
            vals = [p for p in vals if p in self.space.pp]
        return vals

    def m_values(self, pp: int, schedule: str) -> list[int]:
        if self.space.num_microbatches is not None:
            vals = list(self.space.num_microbatches)
        else:
            vals = [m for m in range(1, min(self.global_batch, self.space.max_microbatches) + 1)
                    if self.global_batch % m == 0]
            if pp == 1:
                vals = vals[:1]  # without a pipeline, accumulation only costs time
            else:
                # a geometric ladder from pp upwards keeps the search short
                ladder, v = [], pp
                while v <= vals[-1]:
                    cands = [x for x in vals if x >= v]
                    if cands:
                        ladder.append(cands[0])
                    v *= 2
                vals = sorted(set(ladder))
        if schedule != "gpipe":
            vals = [m for m in vals if m >= pp]
        return [m for m in vals if self.global_batch % m == 0]

    def balanced_bounds(self, pp: int, devices: int, samples: int, m: int) -> list[int] | None:
        """Stage starts minimising the largest stage's fastest time (binary search on the cap,
        greedy packing — exact for contiguous partitions)."""
        n = len(self.layers)
        if pp > n:
            return None
        w = [min(c.step_time_s(m) for c in self.choices(i, devices, samples, m)) for i in range(n)]

        def pack(cap: float) -> list[int] | None:
            starts, acc = [0], 0.0
            for i, x in enumerate(w):
                if acc + x > cap and acc > 0:
                    starts.append(i)
                    acc = 0.0
                acc += x
            return starts if len(starts) <= pp else None

        lo, hi = max(w), sum(w)
        for _ in range(60):
            mid = (lo + hi) / 2
            if pack(mid) is None:
                lo = mid
            else:
                hi = mid
        starts = pack(hi) or [0]
        # split the longest stages until there are exactly pp (each non-empty)
        while len(starts) < pp:
            edges = starts + [n]
            sizes = [(edges[k + 1] - edges[k], k) for k in range(len(starts))]
            size, k = max(sizes)
            if size < 2:
                return None
            starts.insert(k + 1, edges[k] + size // 2)
        return starts

    def search_point(self, pp: int, m: int, schedule: str, best_so_far: float) -> _Candidate | None:
        samples = self.global_batch // m
        devices = self.world // pp
        n_chunks = pp * _virtual(schedule)
        try:
            bounds = self.balanced_bounds(n_chunks, devices, samples, m)
        except NoStrategyError as e:
            self.rejected.append((pp, m, e))
            return None
        except PlanError:
            return None
        if bounds is None:
            return None
        # a memory-blind lower bound: the fastest choices, perfectly balanced; a pipeline step
        # takes at least (m + pp − 1) micro-batch slots of its slowest stage, ≥ the average one
        # ((m·v + pp − 1) chunk slots with v chunks per rank)
        total = sum(min(c.step_time_s(m) for c in self.choices(i, devices, samples, m))
                    for i in range(len(self.layers)))
        lb = total / pp * (1 + (pp - 1) / (_virtual(schedule) * m))  # interleaving shrinks the bubble
        if lb >= best_so_far:
            return None
        self.points += 1
        cur = self.evaluate(bounds, pp, m, schedule, samples)
        # hill climbing on the simulated step time: shrink the bottleneck stage by one layer —
        # only from points within 10% of the best so far (moving boundaries rarely gains more)
        for _ in range(2 * n_chunks):
            if cur is None or n_chunks == 1 or cur.step_time_s > 1.1 * best_so_far:
                break
            slow = max(range(n_chunks), key=lambda k: cur.stages[k].time_s)
            best_move = None
            for b, delta in ((slow, 1), (slow + 1, -1)):  # its start moves right or its end left
                if not 0 < b < n_chunks:
                    continue
                nb = list(bounds)
                nb[b] += delta
                if not (nb[b - 1] < nb[b] < (nb[b + 1] if b + 1 < n_chunks else len(self.layers))):
                    continue
                cand = self.evaluate(nb, pp, m, schedule, samples)
                if cand is not None and cand.step_time_s < cur.step_time_s - 1e-12 and (
                        best_move is None or cand.step_time_s < best_move[1].step_time_s):
                    best_move = (nb, cand)
            if best_move is None:
                break
            bounds, cur = best_move
        return self.polish(cur) if cur is not None else None

    def run(self) -> _Candidate:
        best: _Candidate | None = None
        # more micro-batches first: they shrink the bubble, so a good plan is found early and
        # the bubble-aware lower bound then skips most of the others
        points = [(pp, m, sch) for pp in self.pp_values() for sch in self.space.schedules
                  for m in sorted(self.m_values(pp, sch), reverse=True)
                  if not (pp == 1 and sch != self.space.schedules[0])]
        bar = Progress(len(points), self.progress, title="search")
        for pp, m, sch in points:
            cand = self.search_point(pp, m, sch, best.step_time_s if best else math.inf)
            if cand is not None and (best is None or cand.step_time_s < best.step_time_s):
                best = cand
            bar.step(f"pp={pp} m={m} {sch}")
        if best is None:
            raise PlanError(_why_none(self, points))
        return best


def search_plan(mg: ModelGraph, cluster: Cluster, cm: CostModel, space: SearchSpace, *, global_batch_size: int,
                budget: int, cache: OptionCache | None = None, name: str | None = None,
                precision: str = "fp32") -> ParallelPlan:
    """The search on a captured graph with a given cost model, sharing ILP solutions via ``cache``;
    ``space`` allows one gradient communication (:attr:`SearchSpace.grad_comm`)."""
    t0 = time.perf_counter()
    _check_batches(global_batch_size)
    _check_budget(budget)
    s = _Search(mg, cluster, cm, space, global_batch_size, budget, False, cache)
    best = s.run()
    stats = {"search_s": time.perf_counter() - t0, "points": s.points, "chain_solves": s.chain_solves}
    return dataclasses.replace(_assemble(mg, cluster, cm, best, budget, stats, None, precision, name or mg.name),
                               grad_comm=space.grad_comm)


def plan(
    model_or_graph,
    cluster: Cluster,
    example_inputs: Sequence | None = None,
    *,
    global_batch_size: int | Sequence[int],
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

    ``global_batch_size`` may be a list: the batch with the highest predicted throughput wins.
    ``memory_budget`` is bytes per device (default: the smallest device memory of the cluster);
    ``search`` caps or switches off dimensions (:class:`SearchSpace` or a dict of its fields).
    With ``baselines`` the best hand-written configuration (DDP, ZeRO/FSDP, Megatron tp×pp) is
    scored by the same cost model and recorded for comparison.
    """
    from galvatron_fx.capture import capture

    t0 = time.perf_counter()
    batches = _check_batches(global_batch_size)
    if memory_budget is not None:
        _check_budget(memory_budget)
    space = SearchSpace.coerce(search)
    if isinstance(model_or_graph, ModelGraph):
        mg = model_or_graph
    else:
        if example_inputs is None:
            raise PlanError("plan() needs example_inputs to capture a model (or pass a captured ModelGraph)")
        mg = capture(model_or_graph, example_inputs, loss_fn, name=name)
    if any(l.costs is None for l in mg.layers):
        raise PlanError("the graph has no costs: capture it with annotate=True")
    if len(space.grad_comm_options()) > 1:  # one search per gradient communication allowed
        return plan_each_grad_comm(space, mg, cluster, global_batch_size=global_batch_size, cost_model=cost_model,
                                   memory_budget=memory_budget, precision=precision, name=name, progress=progress,
                                   baselines=baselines)
    cm = cost_model or AnalyticCostModel(cluster, precision=Precision.named(precision))
    budget = int(memory_budget) if memory_budget is not None else cluster.min_memory_bytes()
    # several global batches: the one with the highest predicted throughput that fits wins
    best, s, errors = None, None, []
    cache = OptionCache.for_search(mg, cm, vocab_parallel=space.vocab_parallel, lowered_prices=space.lowered_prices)
    for gb in batches:
        search_gb = _Search(mg, cluster, cm, space, gb, budget, progress, cache)
        try:
            cand = search_gb.run()
        except PlanError as e:
            errors.append(e)
            continue
        if best is None or gb / cand.step_time_s > best.samples * best.m / best.step_time_s:
            best, s = cand, search_gb
    if best is None:
        raise errors[0]
    global_batch_size = best.samples * best.m
    search_s = time.perf_counter() - t0
    base = None
    if baselines and not space.uniform:
        from galvatron_fx.search.baselines import best_baseline

        b = best_baseline(mg, cluster, cm, global_batch_size=global_batch_size, memory_budget=budget,
                          cache=s.cache, limits=space)
        if b is not None:
            base = {"name": b[0], "step_time_s": b[1].predicted.step_time_s}
    stats = {"search_s": search_s, "points": s.points, "ilp_solves": s.cache.solves, "ilp_s": s.cache.solve_s,
             "chain_solves": s.chain_solves, "dp_frontier_max": s.frontier_max,
             "num_candidates": sum(len(v) for v in s._choices.values())}
    plan = dataclasses.replace(_assemble(mg, cluster, cm, best, budget, stats, base, precision, name or mg.name),
                               grad_comm=space.grad_comm)
    unused = unused_requests(space, plan)
    for msg in unused:
        warnings.warn(msg, stacklevel=2)
    return dataclasses.replace(plan, notes=plan.notes + tuple(unused)) if unused else plan


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


_MAX_BATCH_CANDIDATES = 256  # each candidate global batch is a whole search


def _check_batches(global_batch_size: int | Sequence[int]) -> list[int]:
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


def _check_budget(memory_budget: int | float) -> None:
    """``ConfigError`` unless ``memory_budget`` is a finite number of bytes in [1, 2**60] (a
    budget too small for any plan is the search's to report)."""
    rng = limits.Range(1, limits.DEVICE_MEMORY.hi, "bytes")
    rng.check(memory_budget, "memory_budget", "pass bytes per device (e.g. 16 * 2**30 for 16 GiB), or None for "
                                              "the devices' own memory")


def _virtual(schedule: str) -> int:
    """Model chunks per rank: two under interleaved 1F1B (Megatron's usual), else one."""
    return 2 if schedule == "interleaved_1f1b" else 1


def _round_up(a: np.ndarray, step: int) -> np.ndarray:
    return -(-a // step) * step
