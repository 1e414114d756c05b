"""The outer search over one global batch: pipeline degree, stage boundaries and ranks,
micro-batches and schedule around the per-stage inter-layer DP (``_Search``; :func:`~galvatron_fx.search.planner.plan`
runs it, :mod:`~galvatron_fx.search.auto_batch` once per candidate batch).

Algorithm, for each pipeline degree ``pp`` (a divisor of the world), micro-batch count ``m``
(a divisor of the global batch on a geometric ladder, ``≥ pp`` under 1F1B; without a pipeline,
``m > 1`` is gradient accumulation) and schedule:
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

Stages sit on whole nodes laid off slow links (:func:`galvatron_fx.cluster.topology.stage_ranks`); with
slow links each stage is priced on its own ranks, else every stage on the first one's shape.

Heterogeneous clusters (nodes of several device kinds): stages lie on whole nodes of one kind
where the world allows (:func:`~galvatron_fx.cluster.topology.stage_ranks`), and every stage is priced on
its own ranks — compute at its device's speed (a stage spanning kinds at its slowest member's,
whose pace its data-parallel groups keep), memory within its device's budget
(:func:`~galvatron_fx.cost_models.memory.tensor_budget_bytes` of its ranks: the user's budget
capping each device's own memory; a stage spanning kinds gets its smallest). Step 2 then balances
each stage's own fastest times within its own memory
(:func:`~galvatron_fx.search.stage_split.min_max_split`, an exact DP over contiguous splits, ``O(pp · n²)`` vectorised, keeping each stage's layers' least memories within
its budget where any split can: faster or bigger stages take more layers), step 4 climbs on the
same per-stage prices, and the lower bound takes each layer on its fastest kind. Clusters of one
kind take none of this path (their plans and search times are as before).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import cast

import numpy as np

from galvatron_fx.cluster import Cluster, Collective, topology
from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.grad_sync import bucketed_sync_s
from galvatron_fx.cost_models.memory import tensor_budget_bytes
from galvatron_fx.cost_models.offload import can_offload
from galvatron_fx.cost_models.pipeline import StageCost
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan_report import TEMP_STEPS
from galvatron_fx.report.progress import Progress
from galvatron_fx.search.assemble_plan import _Candidate, _StageResult
from galvatron_fx.search.candidates import (
    LayerChoice,
    NoStrategyError,
    OptionCache,
    SearchSpace,
    layer_choices,
)
from galvatron_fx.search.layer_dp import ChainProblem, min_memory, solve_chain
from galvatron_fx.search.no_plan import _why_none
from galvatron_fx.search.stage_split import StageSplit
from galvatron_fx.search.transitions import prune_dominated, transition_matrix

HOST_PRICE_ROUNDS = 8

log = logging.getLogger(__name__)


class _Search(StageSplit):
    """One search: shared caches for all (pp, m, schedule) points."""

    def __init__(self, mg: ModelGraph, cluster: Cluster, cm: CostModel, space: SearchSpace,
                 global_batch: int, budget: int, progress: bool, cache: OptionCache | None = None, *,
                 microbatches: str = "accumulate"):
        self.mg, self.cluster, self.cm, self.space = mg, cluster, cm, space
        # CPU offload: offered where the space allows it and every device has host memory beside
        # its own; a rank's offloaded layers keep within its share of its node's host budget
        # (``space.host_memory_budget`` per node, default the devices' host memory)
        specs = [cluster.device_specs[k] for k in set(cluster.node_kinds)]
        self.can_offload = all(can_offload(d) for d in specs)
        self.offloads = True in space.offload and self.can_offload
        per_rank = min((d.host_memory_bytes or 0) for d in specs)
        host_budget = space.host_memory_budget
        self.host_budget = per_rank if host_budget is None else min(per_rank, host_budget // cluster.devices_per_node)
        self.host_bound = False  # some stage fitted the device only over the host budget
        # which micro-batch counts a point may take: "accumulate" — several also without a
        # pipeline (gradient accumulation: fewer activations held, no bubble; it can beat
        # recomputation or a pipeline when memory is short); "pipeline" — several only with a
        # pipeline (the automatic batch's largest batch that fits at once); "fewest" — the
        # fewest the schedule allows (what fits at once: its probes)
        assert microbatches in ("pipeline", "accumulate", "fewest"), microbatches
        self.microbatches = microbatches
        # the budget is what a device may show in use; the tensors get what its fixed terms leave
        self.global_batch, self.device_budget = global_batch, budget
        self.budget = budget = tensor_budget_bytes(budget, cluster)  # a heterogeneous cluster's smallest
        # nodes of several device kinds: every stage priced on its own ranks and budget (module doc)
        self.hetero = cluster.is_heterogeneous
        self._stage_budget: dict[tuple[int, ...], int] = {}
        self.world = cluster.world_size
        self.dpn = cluster.devices_per_node
        self.captured_batch = mg.example_shapes[0][0] if mg.example_shapes and mg.example_shapes[0] else 1
        self.cache = cache or OptionCache(mg, cm, vocab_parallel=space.vocab_parallel, lowered_prices=space.lowered_prices,
                                          shard_weights=space.tp is not None)
        self.layers = mg.layers
        self._choices: dict[tuple, list[LayerChoice]] = {}
        self._trans: dict[tuple, np.ndarray] = {}
        self._stage: dict[tuple, _StageResult] = {}
        self._pruned: dict[tuple, list[LayerChoice]] = {}
        self._stage_ranks: dict[int, tuple[tuple[int, ...], ...]] = {}
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
    def stage_ranks(self, pp: int) -> tuple[tuple[int, ...], ...]:
        """Each stage's ranks: whole nodes, laid off slow links (:func:`topology.stage_ranks`)."""
        if pp not in self._stage_ranks:
            self._stage_ranks[pp] = topology.stage_ranks(self.cluster, pp)
        return self._stage_ranks[pp]

    def ranks_of(self, pp: int, s: int) -> tuple[int, ...] | None:
        """The ranks stage ``s`` is priced on: None (the first stage's shape, ranks 0..D-1) unless
        slow links or device kinds make stages differ."""
        return self.stage_ranks(pp)[s] if self.cluster.slow_links or self.hetero else None

    def stage_budget(self, ranks: tuple[int, ...] | None) -> int:
        """The tensor budget of a stage on ``ranks``: the search's own on a cluster of one kind,
        else that of the stage's devices (module doc)."""
        if not self.hetero or ranks is None:
            return self.budget
        if ranks not in self._stage_budget:
            self._stage_budget[ranks] = tensor_budget_bytes(self.device_budget, self.cluster, ranks=ranks)
        return self._stage_budget[ranks]

    def choices(self, i: int, devices: int, samples: int, m: int, ranks: tuple[int, ...] | None = None
                ) -> list[LayerChoice]:
        layer = self.layers[i]
        owner = tuple(self.mg.params[f].layers[:1] == (layer.name,) for f in layer.param_names if f in self.mg.params)
        key = (layer.kind, owner, devices, samples, m, ranks)
        if key not in self._choices:
            self._choices[key] = layer_choices(
                self.mg, layer, self.cache, self.space, devices=devices, ranks=list(ranks or range(devices)),
                samples=samples, num_microbatches=m, captured_batch=self.captured_batch, devices_per_node=self.dpn)
        return self._choices[key]

    def pruned(self, i: int, devices: int, samples: int, m: int, in_flight: int,
               ranks: tuple[int, ...] | None = None, *, offload: bool = False) -> list[LayerChoice]:
        """The layer's choices without dominated ones (cached: identical layers share them);
        ``offload``: the CPU-offloaded ones too (when the space allows others, only a stage that
        does not fit without them takes them: :meth:`stage`)."""
        full = self.choices(i, devices, samples, m, ranks)
        key = (id(full), in_flight, offload)
        if key not in self._pruned:
            kept = [c for c in full if offload or not c.strategy.offload] if False in self.space.offload else full
            self._pruned[key] = prune_dominated(kept or full, m, in_flight)
        return self._pruned[key]

    def trans(self, i: int, prev: list[LayerChoice], cur: list[LayerChoice], devices: int, samples: int, m: int,
              key_extra: tuple, ranks: tuple[int, ...] | None = None) -> np.ndarray:
        layer_prev = self.layers[i - 1]
        key = (layer_prev.kind, self.layers[i].kind, devices, samples, m, key_extra, ranks)
        if key not in self._trans:
            assert layer_prev.costs is not None  # (the search runs on a graph with costs)
            nbytes = int(layer_prev.costs.output_bytes * samples / self.captured_batch)
            ndim = 3
            self._trans[key] = transition_matrix(self.cm, prev, cur, nbytes, ndim, list(ranks or range(devices)), m)
        return self._trans[key]

    # ---- one stage ------------------------------------------------------------------------------
    def _problem(self, lo: int, hi: int, devices: int, samples: int, m: int, in_flight: int, *,
                 trans: bool = True, ranks: tuple[int, ...] | None = None, offload: bool = False,
                 host_price: float = 0.0) -> tuple[list[list[LayerChoice]], ChainProblem]:
        """Layers ``lo..hi`` of a stage (on ``ranks``: :meth:`ranks_of`) as the inter-layer DP's
        chain (``trans=False``: every transition free, for a memory bound that needs none priced;
        ``offload``: CPU offload allowed; ``host_price``: seconds charged per host byte, the
        host budget's multiplier)."""
        all_choices = [self.pruned(i, devices, samples, m, in_flight, ranks, offload=offload) for i in range(lo, hi)]
        mats: list[np.ndarray | None] = [None]
        for j in range(1, hi - lo):
            if not trans:
                mats.append(np.zeros((len(all_choices[j - 1]), len(all_choices[j]))))
                continue
            sig = (tuple(id(c) for c in all_choices[j - 1]), tuple(id(c) for c in all_choices[j]))
            mats.append(self.trans(lo + j, all_choices[j - 1], all_choices[j], devices, samples, m, sig, ranks))
        problem = ChainProblem(
            time_s=[np.array([c.step_time_s(m) + host_price * c.memory.host_bytes for c in cs]) for cs in all_choices],
            mem_bytes=[np.array([c.mem_bytes(in_flight) for c in cs], dtype=np.int64) for cs in all_choices],
            trans_s=mats,
            extra_max_bytes=[_round_up(np.array([c.memory.temp_bytes for c in cs], dtype=np.int64), self.temp_step)
                             for cs in all_choices],
        )
        return all_choices, problem

    def chunk_fits(self, lo: int, hi: int, devices: int, samples: int, m: int, in_flight: int, budget: int,
                   ranks: tuple[int, ...] | None = None) -> bool:
        """Whether some assignment of layers ``lo..hi`` holds a rank within ``budget`` (exact, no
        DP: the least memory of the chain; with transitions free first, a bound that needs none
        priced and settles most chunks that do not fit)."""
        for trans in (False, True):
            need = min_memory(self._problem(lo, hi, devices, samples, m, in_flight, trans=trans, ranks=ranks,
                                            offload=self.offloads)[1])
            if not 0 <= need <= budget:
                return False
        return True

    def stage(self, lo: int, hi: int, devices: int, samples: int, m: int, in_flight: int,
              budget: int | None = None, ranks: tuple[int, ...] | None = None) -> _StageResult:
        budget = self.budget if budget is None else budget
        key = (lo, hi, devices, samples, m, in_flight, budget, ranks)
        if key in self._stage:
            return self._stage[key]
        all_choices, problem, sol = self._solve(lo, hi, devices, samples, m, in_flight, budget, ranks)
        trans = problem.trans_s
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

    def _solve(self, lo, hi, devices, samples, m, in_flight, budget, ranks):
        """The stage's chain DP: without CPU offload first (when the space allows that), then with
        it when nothing fits; an offloading solution over the host budget is solved again with
        host bytes priced (a multiplier quadrupled until it fits, :data:`HOST_PRICE_ROUNDS` rounds;
        then the stage does not fit)."""
        tries = [False, True] if self.offloads and False in self.space.offload else [self.offloads]
        for offload in tries:
            all_choices, problem = self._problem(lo, hi, devices, samples, m, in_flight, ranks=ranks, offload=offload)
            sol = self._chain(problem, budget)
            if sol.feasible:
                break
        if not sol.feasible or not offload:
            return all_choices, problem, sol
        host_budget = self.host_budget // max(1, round(self.stage_budget(ranks) / max(budget, 1)))  # a rank's chunks share it
        chosen = [all_choices[j][c] for j, c in enumerate(sol.choices)]
        if sum(c.memory.host_bytes for c in chosen) <= host_budget:
            return all_choices, problem, sol
        price = max(sol.time_s, 1e-9) / max(host_budget, 1)
        for _ in range(HOST_PRICE_ROUNDS):
            all_choices, priced = self._problem(lo, hi, devices, samples, m, in_flight, ranks=ranks, offload=True,
                                                host_price=price)
            sol = self._chain(priced, budget)
            if not sol.feasible:
                break
            chosen = [all_choices[j][c] for j, c in enumerate(sol.choices)]
            if sum(c.memory.host_bytes for c in chosen) <= host_budget:
                # the plan's time without the multiplier's charge
                sol = dataclasses.replace(sol, time_s=sol.time_s - price * sum(c.memory.host_bytes for c in chosen))
                return all_choices, problem, sol
            price *= 4
        self.host_bound = True
        return all_choices, problem, dataclasses.replace(sol, feasible=False, choices=(), time_s=math.inf)

    def _chain(self, problem: ChainProblem, budget: int):
        sol = solve_chain(problem, budget, mem_resolution_bytes=self.mem_step)
        self.chain_solves += 1
        self.frontier_max = max(self.frontier_max, max(sol.frontier_sizes, default=0))
        return sol

    # ---- a pipeline point -------------------------------------------------------------------------
    def evaluate(self, bounds: list[int], pp: int, m: int, schedule: str, samples: int) -> _Candidate | None:
        """Solve every stage (chunk, under interleaving) at these boundaries and simulate a step."""
        if len(bounds) > 1 and not self.splits_params(bounds):  # a chunk with nothing to train (StageSplit.trains)
            return None
        devices = self.world // pp
        v = _virtual(schedule)
        edges = bounds + [len(self.layers)]
        in_flight = self._in_flight(schedule, pp, m, v)
        chunks = []
        for c in range(pp * v):
            # chunks of one rank share its memory: each is solved within its share of the budget
            ranks = self.ranks_of(pp, c % pp)
            chunks.append(self.stage(edges[c], edges[c + 1], devices, samples, m, in_flight[c],
                                     self.stage_budget(ranks) // v, ranks))
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
        syncs = [self._sync_s(sts, self.stage_ranks(pp)[r], armed=pp == 1) for r, sts in enumerate(per_rank)]
        optim = [sum(x.optim_s for st in sts for x in st.choices) for sts in per_rank]
        after = max(sy + tied + o for sy, o in zip(syncs, optim))
        busy = [sum(m * (x.fwd_s + x.bwd_s) for st in sts for x in st.choices) for sts in per_rank]
        tp_comm = max(m * sum(x.tp_comm_s for st in sts for x in st.choices) for sts in per_rank)
        transition = max(sum(sum(st.trans_s) for st in sts) for sts in per_rank)
        recompute = max(m * sum(x.recompute_s for st in sts for x in st.choices) for sts in per_rank)
        breakdown = {"compute": max(busy), "comm": tp_comm + max(syncs) + tied, "transition": transition,
                     "bubble": bubble * step, "dp_sync": max(syncs) + tied, "optimizer": max(optim),
                     "recompute": recompute}
        return _Candidate(pp, m, schedule, samples, chunks, step + after, bubble, breakdown, v, tuple(busy),
                          self.stage_ranks(pp))

    def _sync_s(self, chunks: list[_StageResult], ranks: Sequence[int], *, armed: bool) -> float:
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
                total += bucketed_sync_s(self.cm, entries, list(ranks)[::tp][:dp], t, armed=armed)
        return total

    def _cross_tied_s(self, chunks: list[_StageResult], pp: int, devices: int) -> float:
        """The all-reduce over the pipeline group of each weight read in several stages (a tied
        embedding and head), after every chunk's own sync."""
        chunk_of = {i: c for c, st in enumerate(chunks) for i in st.layers}
        index = {layer.name: i for i, layer in enumerate(self.layers)}
        group = [ranks[0] for ranks in self.stage_ranks(pp)]
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
            for k, st in enumerate(cand.stages):
                new = []
                for i, x in zip(st.layers, st.choices):
                    want = dataclasses.replace(x.strategy, dp_type=flavour)
                    alt = [c for c in self.choices(i, devices, cand.samples, cand.m, self.ranks_of(cand.pp, k % cand.pp))
                           if c.dp == x.dp and c.strategy == want and c.option is x.option]
                    new.append(alt[0] if alt else x)
                if all(a is b for a, b in zip(new, st.choices)):
                    chunks.append(st)
                    continue
                changed = True
                mem = sum(c.mem_bytes(st.in_flight) for c in new) + max(c.memory.temp_bytes for c in new)
                if mem > self.stage_budget(self.ranks_of(cand.pp, k % cand.pp)) // v or \
                        sum(c.memory.host_bytes for c in new) > self.host_budget // v:
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
        assert layer.costs is not None  # (the search runs on a graph with costs)
        nbytes = int(layer.costs.output_bytes * samples / self.captured_batch / last.dp)
        pp = self.world // devices
        stages = self.stage_ranks(pp)
        src, dst = stages[c % pp][-1], stages[(c + 1) % pp][0]  # this chunk's stage's last rank, the next's first
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
            if pp == 1 and self.microbatches != "accumulate":
                vals = vals[:1]
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
        vals = [m for m in vals if self.global_batch % m == 0]
        return vals[:1] if self.microbatches == "fewest" else vals

    def search_point(self, pp: int, m: int, schedule: str, best_so_far: float) -> _Candidate | None:
        samples = self.global_batch // m
        devices = self.world // pp
        n_chunks = pp * _virtual(schedule)
        try:
            bounds = self.balanced_bounds(n_chunks, devices, samples, m,
                                          self._in_flight(schedule, pp, m, _virtual(schedule)) if self.hetero else None)
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
        if self.hetero:  # each layer on its fastest kind
            total = float(self.stage_weights(n_chunks, devices, samples, m).min(axis=0).sum())
        else:
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
            slow = max(range(n_chunks), key=lambda k: cast(_Candidate, cur).stages[k].time_s)  # (not None here)
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

    def outer_points(self) -> list[tuple[int, int, str]]:
        """The (pp, micro-batches, schedule) points, in search order: more micro-batches first
        with a pipeline (they shrink the bubble, so a good plan is found early and the
        bubble-aware lower bound then skips most of the others); without one, where only
        accumulation makes more, the fewest first (accumulating only costs time)."""
        return [(pp, m, sch) for pp in self.pp_values() for sch in self.space.schedules
                for m in sorted(self.m_values(pp, sch), reverse=pp > 1)
                if not (pp == 1 and sch != self.space.schedules[0])]

    def run(self, bound_s: float = math.inf) -> _Candidate | None:
        """The fastest point. With ``bound_s`` only a point faster than it counts (None when none
        is: points whose lower bound cannot beat it are skipped); without one, ``PlanError``
        saying the smallest memory that would fit when no point does."""
        best: _Candidate | None = None
        points = self.outer_points()
        bar = Progress(len(points), self.progress, title="search")
        for pp, m, sch in points:
            cand = self.search_point(pp, m, sch, min(bound_s, best.step_time_s if best else math.inf))
            if cand is not None and cand.step_time_s < bound_s and (best is None or cand.step_time_s < best.step_time_s):
                best = cand
            bar.step(f"pp={pp} m={m} {sch}")
        if best is None and bound_s == math.inf:
            raise PlanError(_why_none(self, points))
        return best

    def fits(self) -> bool:
        """Whether any point holds every rank within the budget at the stage boundaries the
        search starts from (where it finds a point feasible if it finds it at all: it only moves
        boundaries of feasible points). A feasibility probe: no chain DP, no step simulated."""
        for pp, m, sch in self.outer_points():
            v = _virtual(sch)
            samples, devices = self.global_batch // m, self.world // pp
            try:
                bounds = self.balanced_bounds(pp * v, devices, samples, m,
                                              self._in_flight(sch, pp, m, v) if self.hetero else None)
            except (NoStrategyError, PlanError):
                continue
            if bounds is None:
                continue
            edges, in_flight = bounds + [len(self.layers)], self._in_flight(sch, pp, m, v)
            if all(self.chunk_fits(edges[c], edges[c + 1], devices, samples, m, in_flight[c],
                                   self.stage_budget(self.ranks_of(pp, c % pp)) // v, self.ranks_of(pp, c % pp))
                   for c in range(pp * v)):
                return True
        return False


def _virtual(schedule: str) -> int:
    """Model chunks per rank: two under interleaved 1F1B (Megatron's usual), else one."""
    return 2 if schedule == "interleaved_1f1b" else 1


def _round_up(a: np.ndarray, step: int) -> np.ndarray:
    return -(-a // step) * step
