"""Per-layer candidates: every ``LayerStrategy`` a layer may take inside one pipeline stage,
priced in time and memory by the cost model — the choices the inter-layer DP picks from.

Contract: :class:`OptionCache` solves the intra-layer ILP once per (layer kind, tp, sp) — a
head and its loss once per layout of the logits between them, whole or vocab-sharded — and
keeps the :class:`~galvatron_fx.ir.layer_option.LayerOption`s; :func:`layer_choices` turns
options into :class:`LayerChoice` records for one stage configuration (its devices, the
samples per micro-batch, micro-batches per step and in flight); :mod:`~galvatron_fx.search.transitions`
prices the reshard of the hidden state between two consecutive choices and prunes dominated ones.

Terms (per rank of the stage, ``D`` devices, a layer with tensor-parallel degree ``tp`` has
``dp = D / tp`` data-parallel replicas; ``s`` samples per micro-batch over the stage, so each
replica sees ``s / dp``):
- *compute*: the layer's forward and backward from the compute model at ``s / dp`` samples,
  times the share of its work one tensor-parallel rank does (from the ILP), plus the backward's
  recomputation; on the stage's device (``ranks``), or where the stage spans device kinds of a
  heterogeneous cluster on its slowest member's, which its data-parallel groups wait for (the
  optimizer step and CPU offload likewise on that device);
- *tp comm*: the collectives inside the layer, each priced at its bytes for ``s / dp`` samples
  (a parameter's gradient at its own size): the ILP's redistributions, or — when the cost model
  sets ``traces_runtime`` — those the layer's lowered program issues forward and backward
  (:mod:`~galvatron_fx.search.lowered_prices`); a loss's own collectives over dp (its normaliser),
  from its lowering; full recomputation runs the forward's collectives again in the backward
  (selective keeps their outputs). Each
  choice records what it priced (``collectives``: the plan's ``LayerPlan.collectives``);
- *dp comm*: the gradient synchronisation of the layer's parameters over its ``dp`` replicas.
  DDP: the runtime sums the plain gradients of all layers of a data-parallel group in buckets
  (:mod:`~galvatron_fx.cost_models.grad_sync`), priced for the whole stage by the planner; per
  layer the search sees the bytes' share of a bucket (the all-reduce of its bytes less that of
  one byte), hidden behind its backward where it fits. ZeRO-2: per micro-batch, a reduce-scatter
  of gradients and an all-gather of parameters; ZeRO-3 the same with a second all-gather for the
  backward; what they add beyond the layer's compute is the cost model's ``exposed_fsdp_s``.
  Gradients travel as the search space's one gradient communication says (``space.grad_comm``):
  summed in its reduce dtype (a 16-bit sum: half the bytes), DDP matrices under PowerSGD as their
  two factors plus the compression's compute, whose error feedback adds an fp32 copy of each
  compressed gradient to the layer's memory (:func:`~galvatron_fx.cost_models.grad_sync.wire_entry`);
- *optimizer*: the optimizer step over the parameters the layer reads on this rank (a tied
  weight once per reader: the runtime keeps a copy per layer), DTensors under FSDP;
- *memory*: ``cost_models.memory.layer_memory`` with the ILP's shard fractions, or the lowered
  program's saved activations and backward transient when traced.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.tensor import Shard as TorchShard

from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.memory import LayerMemory, TPShard
from galvatron_fx.cost_models.offload import can_offload, offload_cost
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import LayerInfo, LayerRole, ModelGraph
from galvatron_fx.ir.layer_option import CommEvent, LayerOption
from galvatron_fx.ir.plan_records import CollectiveRecord
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import DPType, LayerStrategy, Precision, SPMode
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer, param_values
from galvatron_fx.passes.segment_layers import kind_hash
from galvatron_fx.passes.state_writes import stateful_kinds
from galvatron_fx.search.choice_costs import (
    at_rank,
    bucket_share_s,
    comm_s,
    ddp_wire,
    fsdp_comm_s,
    optimizer_s,
    slowest,
)
from galvatron_fx.search.intra_layer import solve_intra_layer
from galvatron_fx.search.lowered_prices import dp_collective_records, dp_collectives, lowered_price, tp_collectives
from galvatron_fx.search.placement_ilp import solver_job
from galvatron_fx.search.search_space import SearchSpace  # re-exported: the search's callers import it from here

if TYPE_CHECKING:
    from galvatron_fx.cluster import DeviceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerChoice:
    """One strategy of one layer in one stage configuration, priced."""

    strategy: LayerStrategy
    dp: int
    fwd_s: float  # per micro-batch
    bwd_s: float  # per micro-batch, recomputation included
    tp_comm_s: float  # per micro-batch, not hidden
    dp_comm_s: float  # per step, exposed after overlap with the backward (DDP: the bucket share)
    memory: LayerMemory  # activation_bytes for one micro-batch
    in_layout: str
    out_layout: str
    option: LayerOption | None
    optim_s: float = 0.0  # per step: the optimizer step over this layer's parameters on one rank
    bucket_bytes: tuple[int, ...] = ()  # DDP (dp > 1): local gradient bytes per parameter, runtime order
    # DDP under a lossy GradComm: per bucket_bytes entry (wire bytes, P bytes, Q bytes, compute s)
    bucket_wire: tuple[tuple[int, int, int, float], ...] = ()
    collectives: tuple[CollectiveRecord, ...] = ()  # what it prices, per micro-batch (LayerPlan.collectives)
    recompute_s: float = 0.0  # per micro-batch: the forward run again in the backward (in bwd_s)

    def step_time_s(self, m: int) -> float:
        return m * (self.fwd_s + self.bwd_s + self.tp_comm_s) + self.dp_comm_s + self.optim_s

    def bucket_entries(self, ready_s: float) -> list[tuple]:
        """Its gradients as :func:`~galvatron_fx.cost_models.grad_sync.bucketed_sync_s` entries, all
        ready at ``ready_s``."""
        if not self.bucket_wire:  # summed as stored
            return [(b, ready_s) for b in self.bucket_bytes]
        return [(b, ready_s, *w) for b, w in zip(self.bucket_bytes, self.bucket_wire)]

    @property
    def bucketed(self) -> bool:
        """Whether its gradients join the stage's data-parallel buckets (DDP flavour, dp > 1)."""
        return self.dp > 1 and self.strategy.dp_type == DPType.DDP

    def mem_bytes(self, in_flight: int) -> int:
        return self.memory.persistent_bytes + in_flight * self.memory.activation_bytes


_SHARED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("gfx_option_caches", default=None)


@contextlib.contextmanager
def shared_option_caches():
    """Within it, :meth:`OptionCache.for_search` hands every search of one graph and cost model
    the same cache (the searches of one plan per gradient communication: their ILPs are alike)."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


@dataclass
class OptionCache:
    """Intra-layer ILP solutions, one per (kind, tp, sp); decomposed layers, one per kind."""

    mg: ModelGraph
    cost_model: CostModel
    vocab_parallel: bool = True  # class-sharded log-softmax / NLL loss allowed (SearchSpace.vocab_parallel)
    lowered_prices: bool = False  # SearchSpace.lowered_prices
    # the caller named the tp degrees (SearchSpace.tp): a layer with weights shards some of them
    shard_weights: bool = False
    options: dict[tuple[str, int, SPMode], list[LayerOption]] = field(default_factory=dict)
    decomposed: dict[str, DecomposedLayer] = field(default_factory=dict)
    solves: int = 0
    solve_s: float = 0.0
    _shares: dict = field(default_factory=dict)
    _inputs: dict = field(default_factory=dict)
    _fqns: dict = field(default_factory=dict)
    _twin: dict = field(default_factory=dict)
    _batched: set = field(default_factory=set)  # (tp, sp) solved for every kind at once

    @classmethod
    def for_search(cls, mg: ModelGraph, cost_model: CostModel, *, vocab_parallel: bool = True,
                   lowered_prices: bool = False, shard_weights: bool = False) -> OptionCache:
        """A new cache, or inside :func:`shared_option_caches` the one for these arguments."""
        caches = _SHARED.get()
        if caches is None:
            return cls(mg, cost_model, vocab_parallel=vocab_parallel, lowered_prices=lowered_prices,
                       shard_weights=shard_weights)
        key = (id(mg), id(cost_model), vocab_parallel, lowered_prices, shard_weights)
        if key not in caches:
            caches[key] = cls(mg, cost_model, vocab_parallel=vocab_parallel, lowered_prices=lowered_prices,
                              shard_weights=shard_weights)
        return caches[key]

    def trace(self, layer: LayerInfo, option: LayerOption | None):
        """The lowered program's collectives and memory of ``layer`` under ``option`` (None:
        tp = 1) when the cost model or the search space asks for them, else None."""
        if not (self.lowered_prices or getattr(self.cost_model, "traces_runtime", False)):
            return None
        return lowered_price(self.mg, layer, option, decomposed=self._decomposed(layer),
                             compute_dtype=self._compute_dtype())

    def dp_events(self, layer: LayerInfo) -> tuple:
        """The collectives a loss's own graphs issue over dp (its normaliser: a mean over a
        batch-sharded input), or a layer's that couples samples (the gathers CLIP's similarities
        need: :meth:`~galvatron_fx.ir.graph.ModelGraph.coupled`), from its lowering; none for
        other layers, which run on their share of the batch and whose gradients stay partial over
        dp until the data-parallel sync."""
        if layer.role != LayerRole.LOSS and layer.name not in self.mg.coupled():
            return ()
        return dp_collectives(self.mg, layer, decomposed=self._decomposed(layer),
                              compute_dtype=self._compute_dtype()) or ()

    def _compute_dtype(self):
        """Mixed precision's compute dtype (None: fp32)."""
        prec = getattr(self.cost_model, "precision", None)
        dtype = getattr(torch, prec.compute_dtype) if prec is not None else torch.float32
        return None if dtype == torch.float32 else dtype

    def _decomposed(self, layer: LayerInfo):
        if layer.kind not in self.decomposed:
            self.decomposed[layer.kind] = decompose_layer(self.mg, layer)
        return self.decomposed[layer.kind]

    def _shape_of(self, layer: LayerInfo):
        """The decomposed layer of ``layer``'s twin (:meth:`_twins`): the same nodes, inputs and
        shapes, only float constants differ, so where an option's placements are read against
        the graph's structure (batch rows, stored shares) one decomposition per twin does."""
        twin = self._twins().get(layer.kind, layer.kind)
        root = next((l for l in self.mg.layers if l.kind == twin), layer)
        return self._decomposed(root)

    def splits_evenly(self, layer: LayerInfo, option: LayerOption, local: int, captured_batch: int) -> bool:
        """Whether every dim 0 ``option`` shards on tp, of a value that grows with the batch
        (its size at the captured batch scaled to ``local`` samples of a dp rank, which takes
        dim 0 first), still splits evenly over tp."""
        key = ("rows", id(option))
        if key not in self._shares:
            dl = self._shape_of(layer)
            fixed = param_values(dl)
            by_name = {n.name: n for n in dl.gm.graph.nodes}
            rows = set()
            for name, s in option.placements.items():
                n = by_name.get(name)
                if n is None or n.op != "call_function":
                    continue
                ins = s.split("->")[0].split(",")
                args = [a for a in n.all_input_nodes]
                for a, pl in zip(args, ins):
                    v = a.meta.get("val")
                    if pl == "S(0)" and a.name not in fixed and isinstance(v, torch.Tensor) and v.ndim >= 1:
                        rows.add(int(v.shape[0]))
            self._shares[key] = rows
        tp = option.tp
        return all((r * local) % (captured_batch * tp) == 0 for r in self._shares[key])

    def param_shares(self, layer: LayerInfo, option: LayerOption | None) -> dict[str, float]:
        """FQN -> the share of the parameter one rank stores under ``option`` (1/tp where its
        placement shards it; none at tp = 1)."""
        if option is None or option.tp == 1:
            return {}
        key = (layer.name, id(option))
        if key not in self._shares:
            dl = self._shape_of(layer)
            if layer.name not in self._inputs:
                self._inputs[layer.name] = [a.name for a in self.mg.layer_inputs(layer)]
            fqn_of = self._fqn_of()
            out = {}
            for ph, name, role in zip(dl.inputs, self._inputs[layer.name], dl.input_roles):
                if role == "param" and name in fqn_of:
                    stored = option.placements.get(ph.name, "->R").split("->")[1]
                    out[fqn_of[name]] = 1.0 / option.tp if stored.startswith("S(") else 1.0
            self._shares[key] = out
        return self._shares[key]

    def _twins(self) -> dict[str, str]:
        """Layer kind -> the first kind whose layer hashes alike without float constants."""
        if not self._twin:
            by_name = self.mg.nodes_by_name()
            params = {node for p in self.mg.params.values() for node in p.nodes}
            first: dict[str, str] = {}
            for layer in self.mg.layers:
                if layer.kind not in self._twin:
                    key = kind_hash([by_name[n] for n in layer.node_names], params, floats=False)
                    self._twin[layer.kind] = first.setdefault(key, layer.kind)
        return self._twin

    def _fqn_of(self) -> dict[str, str]:
        if not self._fqns:
            self._fqns.update({node: fqn for fqn, p in self.mg.params.items() for node in p.nodes})
        return self._fqns

    def option_list(self, layer: LayerInfo, tp: int, sp: SPMode) -> list[LayerOption]:
        """The ILP's options for (tp, sp): the fastest, plus the memory-lean one (every matrix
        parameter sharded) when the fastest replicates some; for a head and its loss, each also
        with the logits crossing vocab-sharded (:meth:`_boundaries`), so that the inter-layer DP
        weighs gathering them against a vocab-parallel cross-entropy. Empty when the layer
        cannot use (tp, sp)."""
        key = (layer.kind, tp, sp)
        if key in self.options:
            return self.options[key]
        if tp > 1 and (tp, sp) not in self._batched:
            self._batched.add((tp, sp))
            self._solve_concurrently(tp, sp)
            if key in self.options:
                return self.options[key]
        # a kind that differs from one solved only in float constants (a drop probability) takes
        # its solution: the placements name the same decomposed nodes and price the same work
        twin = self._twins().get(layer.kind)
        if twin is not None and twin != layer.kind and (twin, tp, sp) in self.options:
            self.options[key] = [dataclasses.replace(o, kind=layer.kind) for o in self.options[(twin, tp, sp)]]
            return self.options[key]
        self.options[key] = self._solve_options(layer, tp, sp)
        return self.options[key]

    def _solve_options(self, layer: LayerInfo, tp: int, sp: SPMode) -> list[LayerOption]:
        """:meth:`option_list`'s options of one layer, solved (empty when it cannot use (tp, sp))."""
        opts: list[LayerOption] = []
        if tp > 1:
            try:
                if layer.kind not in self.decomposed:
                    self.decomposed[layer.kind] = decompose_layer(self.mg, layer)
                dl = self.decomposed[layer.kind]
                if sp != SPMode.NONE and not any(r == "activation" for r in dl.input_roles):
                    raise PlanError("no hidden-state input to shard on the sequence")
                for boundary in self._boundaries(layer, tp):
                    opts += self._solved(layer, dl, tp, sp, boundary)
            except Exception as e:  # an op without sharding rules: this layer stays unsharded
                log.info("layer %s cannot use tp=%d sp=%s: %s", layer.name, tp, sp, e)
                opts = []
        return opts

    def _solve_concurrently(self, tp: int, sp: SPMode) -> None:
        """Solve (tp, sp) for every layer kind that may use it (one per kind and its twins; sequence
        parallelism only for blocks, as :func:`layer_choices` asks) at once, on as many threads as
        this process has cores: the solver runs in parallel, the Python work in turn
        (:func:`~galvatron_fx.search.placement_ilp.solver_job`). The same options as one by one."""
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        twins = self._twins()
        todo = [layer for layer in self.mg.layers if twins[layer.kind] == layer.kind
                and (layer.kind, tp, sp) not in self.options and (sp == SPMode.NONE or layer.role == LayerRole.BLOCK)]
        todo = list({layer.kind: layer for layer in reversed(todo)}.values())[::-1]  # one per kind
        if workers < 2 or len(todo) < 2:
            return
        traced = []
        for layer in todo:  # tracing stays on this thread
            try:
                self._decomposed(layer)
            except Exception:  # noqa: BLE001 (left to option_list, which solves it alone and logs why)
                continue
            traced.append(layer)
        todo = traced

        def job(layer: LayerInfo) -> list[LayerOption]:
            with solver_job():
                return self._solve_options(layer, tp, sp)

        with ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
            futures = [(layer, pool.submit(contextvars.copy_context().run, job, layer)) for layer in todo]
            for layer, fut in futures:
                self.options[(layer.kind, tp, sp)] = fut.result()

    def _solved(self, layer: LayerInfo, dl, tp: int, sp: SPMode, boundary: dict) -> list[LayerOption]:
        """The fastest and (where it differs) the memory-lean option at one boundary layout."""
        opts: list[LayerOption] = []
        boundary = boundary | {"vocab_parallel": self.vocab_parallel}
        fast = solve_intra_layer(self.mg, layer, tp, sp, self.cost_model, decomposed=dl, **boundary)
        self.solves += 1
        self.solve_s += fast.solve_s
        # a tp > 1 option shards something: one that keeps the whole layer on every tp rank
        # is the tp = 1 layer with its compute repeated, and "tp" would name no tensor
        # parallelism at all (the memory-lean option below is offered instead); where the caller
        # named the tp degrees, a layer with weights shards some of them (Ulysses, which keeps
        # them whole by design, aside): it asked for tensor parallelism
        whole_ok = not self.shard_weights or sp == SPMode.ULYSSES or not any(r == "param" for r in dl.input_roles)
        if fast.param_fraction < 0.99 or whole_ok and (fast.activation_fraction < 0.99 or fast.compute_ratio < 0.99):
            opts.append(fast)
        if fast.param_fraction > 1.0 / tp + 0.02 and sp != SPMode.ULYSSES:  # Ulysses keeps weights whole
            lean = solve_intra_layer(self.mg, layer, tp, sp, self.cost_model, decomposed=dl,
                                     shard_params=True, **boundary)
            self.solves += 1
            self.solve_s += lean.solve_s
            if lean.param_fraction < fast.param_fraction - 0.01 or not opts:
                opts.append(lean)
        return opts

    def _boundaries(self, layer: LayerInfo, tp: int) -> list[dict]:
        """The boundary layouts to solve ``layer`` at: the sequence-parallel mode's, and for the
        head's output / the loss's input (the logits) also sharded on their last (class) dim."""
        out: list[dict] = [{}]
        if not self.vocab_parallel:
            return out
        if layer.role == LayerRole.HEAD:
            names, key = layer.output_names[:1], "out_layout"
        elif layer.role == LayerRole.LOSS:
            head = {n for lay in self.mg.layers if lay.role == LayerRole.HEAD for n in lay.output_names}
            names, key = [n for n in layer.input_names if n in head][:1], "in_layout"
        else:
            return out
        by_name = self.mg.nodes_by_name()
        for name in names:
            val: Any = by_name[name].meta.get("val") if name in by_name else None  # (None: getattr gives 0)
            if getattr(val, "ndim", 0) >= 2 and val.is_floating_point() and val.shape[-1] % tp == 0:
                out.append({key: TorchShard(val.ndim - 1)})
        return out


def allowed_tp(space: SearchSpace, devices: int, devices_per_node: int) -> list[int]:
    """Tensor-parallel degrees a stage of ``devices`` ranks may use (inside one node)."""
    cap = min(devices, devices_per_node, space.max_tp or devices)
    tps = [t for t in range(1, cap + 1) if devices % t == 0]
    if space.tp is not None:
        tps = [t for t in tps if t in space.tp]
    return tps or [1]


def layer_choices(
    mg: ModelGraph,
    layer: LayerInfo,
    cache: OptionCache,
    space: SearchSpace,
    *,
    devices: int,
    ranks: Sequence[int],
    samples: int,
    num_microbatches: int,
    captured_batch: int,
    devices_per_node: int,
) -> list[LayerChoice]:
    """All priced choices of ``layer`` in a stage of ``devices`` ranks (see module doc)."""
    out: list[LayerChoice] = []
    # every trainable parameter the layer reads (the runtime keeps a copy per reader: memory and
    # the optimizer count it), of which the gradients it owns are summed over dp (a tied weight's
    # copies are summed locally first and reduced once, with its first reader)
    params = [mg.params[f] for f in layer.param_names
              if f in mg.params and not mg.params[f].is_buffer and mg.params[f].requires_grad]
    owned = [p for p in params if p.layers[:1] == (layer.name,)]
    for tp in allowed_tp(space, devices, devices_per_node):
        dp = devices // tp
        if samples % dp != 0:
            continue
        local = samples // dp
        frac = local / captured_batch
        # sequence parallelism is a block-level choice: embeddings, heads and losses keep theirs
        sps = space.sp if tp > 1 and layer.role == LayerRole.BLOCK else (SPMode.NONE,)
        for sp in sps:
            for opt in (cache.option_list(layer, tp, sp) if tp > 1 else [None]):
                if opt is not None and not cache.splits_evenly(layer, opt, local, captured_batch):
                    continue  # it splits a batch dim over tp too, which the dp rank's samples cannot
                out.extend(_priced(mg, layer, cache, space, opt, tp=tp, sp=sp, dp=dp, local=local, frac=frac,
                                   ranks=ranks, params=params, owned=owned,
                                   num_microbatches=num_microbatches, captured_batch=captured_batch))
    return _or_replicated(out, mg, layer, cache, space, devices=devices, ranks=ranks, samples=samples,
                          num_microbatches=num_microbatches, captured_batch=captured_batch,
                          devices_per_node=devices_per_node)


def _priced(mg, layer, cache, space, opt, *, tp, sp, dp, local, frac, ranks, params, owned,
            num_microbatches, captured_batch) -> list[LayerChoice]:
    """Every (recompute, dp flavour) of one (tp, sp, option), priced."""
    cm = cache.cost_model
    out: list[LayerChoice] = []
    m = num_microbatches
    share = opt.compute_ratio if opt is not None else 1.0
    pf = opt.param_fraction if opt is not None else 1.0
    af = opt.activation_fraction if opt is not None else 1.0
    lowered = cache.trace(layer, opt)  # what the runtime's executor does (None: not asked for)
    # the bytes the data-parallel collectives move: each parameter's tensor-parallel shard, gathered
    # in the compute dtype (FSDP's mixed precision), its gradient reduced in the gradient dtype
    shares = cache.param_shares(layer, opt)
    prec = getattr(cm, "precision", None)
    gather_size = getattr(torch, prec.compute_dtype).itemsize if prec else None
    grad_size = getattr(torch, prec.grad_dtype).itemsize if prec else None
    # the plan's gradient communication: sums in its reduce dtype, DDP matrices maybe PowerSGD factors
    gc = space.grad_comm
    reduce_size = grad_size if gc.reduce_dtype == "float32" else gc.reduce_bytes

    def dp_bytes(ps, size) -> int:
        return int(sum((p.numel * size if size else p.nbytes) * shares.get(p.name, pf) for p in ps))

    # DDP: per owned parameter, last first (the runtime's order), its stored bytes (which decide the
    # buckets) and what it puts on the wire (grad_sync.wire_entry)
    wires = [ddp_wire(cm, p, shares.get(p.name, pf), gc, grad_size) for p in reversed(owned)]
    gather_bytes, reduce_bytes = dp_bytes(params, gather_size), dp_bytes(params, reduce_size)
    grad_bytes = sum(w[1] + w[2] + w[3] for w in wires)
    # PowerSGD's error feedback keeps one more fp32 copy of each compressed gradient, and its Q
    feedback_bytes = sum(w[0] + w[3] for w in wires if w[2] > 0)
    # a stage spanning device kinds runs at its slowest member's pace (data parallelism waits for it)
    rank, (fwd0, bwd0) = slowest(cm, mg, layer, frac, ranks)
    dp_ranks = list(ranks[::tp])[:dp]
    tp_ranks = list(range(tp))
    saved = layer.costs.activation_bytes
    af_none = lowered.saved_bytes / saved if lowered is not None and saved > 0 else af
    numel = sum(p.numel for p in params)
    # CPU offload: where the space allows it, the device has host memory beside its own and the
    # layer has parameters to move (the outer search offers these choices only when memory forces it)
    device = cm.cluster.device(rank or (ranks[0] if ranks else 0)) if hasattr(cm, "cluster") else None
    offloads = tuple(o for o in space.offload
                     if not o or (numel > 0 and device is not None and can_offload(device))) or (False,)
    # a loss has nothing worth recomputing, a layer writing state in place (BatchNorm) must not
    # be: they always keep their activations, whatever the space
    rcs = (Recompute.NONE,) if layer.role == LayerRole.LOSS or layer.kind in stateful_kinds(mg) else space.recompute
    for rc in rcs:
        # full recomputation runs the forward's collectives again in backward; selective keeps
        # their outputs (galvatron_fx.ir.recompute.policy_of)
        again = rc == Recompute.FULL
        _, bwd_rc = cm.layer_times_s(mg, layer, batch_fraction=frac, recompute=rc, **at_rank(rank)) if rc != Recompute.NONE \
            else (fwd0, bwd0)
        fwd_s, bwd_s = fwd0 * share, bwd_rc * share
        trace = lowered
        events = trace.comm if trace is not None else (opt.comm if opt is not None else ())
        tp_comm = comm_s(cm, events, frac, tp_ranks, again_fwd=again,
                          compute_s={"fwd": fwd_s, "bwd": bwd_s})
        # the backward's transient: lowered, or the captured layer's own (its tp share)
        temp = trace.bwd_transient_bytes if trace is not None else layer.costs.bwd_transient_bytes * af
        tp_colls = tp_collectives(events, frac, tp, again_fwd=again)
        # a loss's own data-parallel collectives (lowered at dp = 2: per-sample bytes scale from there)
        dp_events = [CommEvent(e.direction, e.value, e.collective, int(e.nbytes * 2 * frac) if e.per_sample
                               else e.nbytes, 0.0, per_sample=False) for e in cache.dp_events(layer)] if dp > 1 else []
        tp_comm += comm_s(cm, dp_events, 1.0, dp_ranks, again_fwd=again,
                           compute_s={"fwd": fwd_s, "bwd": bwd_s}) if dp_events else 0.0
        tp_colls += tp_collectives(dp_events, 1.0, dp, again_fwd=again, axis="dp")
        for dpt, offload in itertools.product(space.dp_types, offloads):
            if dp == 1 and dpt != DPType.DDP:
                continue
            strategy = LayerStrategy(tp=tp, sp=sp, dp_type=dpt, recompute=rc, offload=offload)
            shard = TPShard(param_fraction=pf, activation_fraction=(af_none, af, af)) \
                if tp > 1 or lowered is not None else None
            mem = cm.layer_memory(layer.costs, strategy, dp=dp, micro_batch=local,
                                  captured_batch=captured_batch, params=params or None, tp_shard=shard,
                                  backward_temp_bytes=temp)
            sharded = dpt != DPType.DDP and dp > 1
            if not sharded and dp > 1 and feedback_bytes:
                mem = dataclasses.replace(mem, grad_bytes=mem.grad_bytes + feedback_bytes)
            local_numel = numel * pf / dp if sharded else numel * pf
            # (offload is offered only with a device to offload from: ``offloads`` above)
            off = offload_cost(cast("DeviceSpec", device), dpt, local_numel=int(local_numel), sharded=sharded, m=m,
                               precision=prec or Precision()) if offload else None
            if sharded:
                # FSDP shards and gathers every copy a layer keeps (a tied weight's too); offloaded
                # shards are copied in before each gather and out after each reduce-scatter
                comm = fsdp_comm_s(cm, dpt, gather_bytes, reduce_bytes, dp_ranks, m, compute_s=fwd_s + bwd_s)
                comm += off.overlappable_s if off else 0.0
                dp_comm = cm.exposed_fsdp_s(m * (fwd_s + bwd_s), comm) if comm > 0 else 0.0
            else:
                share_s = bucket_share_s(cm, wires, dp_ranks)
                dp_comm = max(0.0, cm.overlapped_s(bwd_s * m, share_s) - bwd_s * m)
            optim = off.exposed_s if off else optimizer_s(cm, int(local_numel), len(params), dtensor=sharded,
                                                           rank=rank)
            out.append(LayerChoice(
                strategy=strategy, dp=dp, fwd_s=fwd_s, bwd_s=bwd_s, tp_comm_s=tp_comm,
                dp_comm_s=dp_comm, memory=mem,
                in_layout=(opt.input_layout[0] if opt and opt.input_layout else "R"),
                out_layout=(opt.output_layout[0] if opt and opt.output_layout else "R"),
                option=opt, optim_s=optim, recompute_s=max(0.0, (bwd_rc - bwd0) * share),
                bucket_bytes=tuple(w[0] for w in wires) if dp > 1 and dpt == DPType.DDP else (),
                bucket_wire=tuple(w[1:] for w in wires) if dp > 1 and dpt == DPType.DDP and not gc.lossless else (),
                collectives=tp_colls + dp_collective_records(dpt, dp, gather_bytes, reduce_bytes, grad_bytes),
            ))
    return out


def _or_replicated(out, mg, layer, cache, space, *, devices, ranks, samples, num_microbatches, captured_batch,
                   devices_per_node) -> list[LayerChoice]:
    if not out and 1 not in allowed_tp(space, devices, devices_per_node) and samples % devices == 0:
        # a layer no allowed degree can shard (e.g. a loss) runs replicated over the tp group
        return layer_choices(mg, layer, cache, _with_tp1(space), devices=devices, ranks=ranks, samples=samples,
                             num_microbatches=num_microbatches, captured_batch=captured_batch,
                             devices_per_node=devices_per_node)
    if not out:
        raise NoStrategyError(layer.name, devices, samples)
    return out


class NoStrategyError(PlanError):
    """A layer has no strategy in a stage of ``devices`` ranks with ``samples`` per micro-batch:
    no allowed tp both leaves a data-parallel degree (``devices / tp``) that divides the samples
    and can split the layer."""

    def __init__(self, layer: str, devices: int, samples: int) -> None:
        self.layer, self.devices, self.samples = layer, devices, samples
        super().__init__(f"layer {layer} has no strategy that fits {devices} devices with {samples} samples per "
                         "micro-batch: use a global batch divisible by the data-parallel degree")


def _with_tp1(space: SearchSpace) -> SearchSpace:
    return dataclasses.replace(space, tp=(1,), max_tp=None)
