"""Per-layer candidates: every ``LayerStrategy`` a layer may take inside one pipeline stage,
priced in time and memory by the cost model — the choices the inter-layer DP picks from.

Contract: :class:`OptionCache` solves the intra-layer ILP once per (layer kind, tp, sp) and
keeps the :class:`~galvatron_fx.search.intra_layer.LayerOption`; :func:`layer_choices` turns
options into :class:`LayerChoice` records for one stage configuration (its devices, the
samples per micro-batch, micro-batches per step and in flight), and :func:`transition_s` prices
the reshard of the hidden state between two consecutive choices.

Terms (per rank of the stage, ``D`` devices, a layer with tensor-parallel degree ``tp`` has
``dp = D / tp`` data-parallel replicas; ``s`` samples per micro-batch over the stage, so each
replica sees ``s / dp``):
- *compute*: the layer's forward and backward from the compute model at ``s / dp`` samples,
  times the share of its work one tensor-parallel rank does (from the ILP), plus the backward's
  recomputation;
- *tp comm*: the ILP's redistributions inside the layer, scaled to ``s / dp`` samples;
- *dp comm*: the gradient synchronisation of the layer's parameters over its ``dp`` replicas:
  DDP one all-reduce per step; ZeRO-2 one reduce-scatter of gradients and one all-gather of
  parameters per step; ZeRO-3 a reduce-scatter per step and two all-gathers per micro-batch;
  hidden behind the backward compute where it fits (cost model's overlap);
- *memory*: ``cost_models.memory.layer_memory`` with the ILP's shard fractions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from galvatron_fx.cluster import Collective
from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.memory import LayerMemory, TPShard
from galvatron_fx.cost_models.reshard import Layout, Replicate, Shard
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import LayerInfo, LayerRole, ModelGraph
from galvatron_fx.ir.strategy import DPType, LayerStrategy, SPMode
from galvatron_fx.recompute import Recompute
from galvatron_fx.search.intra_layer import LayerOption, decompose_layer, parse_placement, solve_intra_layer

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Which strategies the search may use; every dimension can be capped or switched off.

    ``None`` means "all that fit": tp = divisors of the stage's devices up to one node, pp =
    divisors of the world up to the number of blocks, micro-batch counts searched.
    """

    tp: tuple[int, ...] | None = None
    max_tp: int | None = None
    sp: tuple[SPMode, ...] = (SPMode.NONE, SPMode.MEGATRON, SPMode.ULYSSES)
    dp_types: tuple[DPType, ...] = (DPType.DDP, DPType.ZERO2, DPType.ZERO3)
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    pp: tuple[int, ...] | None = None
    max_pp: int | None = None
    schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b")
    num_microbatches: tuple[int, ...] | None = None
    max_microbatches: int = 64
    uniform: bool = False  # one strategy for all blocks (the hand-written baselines)

    @classmethod
    def coerce(cls, value: SearchSpace | dict | None) -> SearchSpace:
        if value is None:
            return cls()
        if isinstance(value, SearchSpace):
            return value
        kw = dict(value)
        for key, enum in (("sp", SPMode), ("dp_types", DPType), ("recompute", Recompute)):
            if key in kw:
                kw[key] = tuple(enum(v) for v in kw[key])
        for key in ("tp", "pp", "num_microbatches", "schedules"):
            if key in kw and kw[key] is not None:
                kw[key] = tuple(kw[key])
        return cls(**kw)


@dataclass(frozen=True)
class LayerChoice:
    """One strategy of one layer in one stage configuration, priced."""

    strategy: LayerStrategy
    dp: int
    fwd_s: float  # per micro-batch
    bwd_s: float  # per micro-batch, recomputation included
    tp_comm_s: float  # per micro-batch, not hidden
    dp_comm_s: float  # per step, exposed after overlap with the backward
    memory: LayerMemory  # activation_bytes for one micro-batch
    in_layout: str
    out_layout: str
    option: LayerOption | None

    def step_time_s(self, m: int) -> float:
        return m * (self.fwd_s + self.bwd_s + self.tp_comm_s) + self.dp_comm_s

    def mem_bytes(self, in_flight: int) -> int:
        return self.memory.persistent_bytes + in_flight * self.memory.activation_bytes


@dataclass
class OptionCache:
    """Intra-layer ILP solutions, one per (kind, tp, sp); decomposed layers, one per kind."""

    mg: ModelGraph
    cost_model: CostModel
    options: dict[tuple[str, int, SPMode], list[LayerOption]] = field(default_factory=dict)
    decomposed: dict[str, object] = field(default_factory=dict)
    solves: int = 0
    solve_s: float = 0.0

    def option_list(self, layer: LayerInfo, tp: int, sp: SPMode) -> list[LayerOption]:
        """The ILP's options for (tp, sp): the fastest, plus the memory-lean one (every matrix
        parameter sharded) when the fastest replicates some; empty when the layer cannot use
        (tp, sp)."""
        key = (layer.kind, tp, sp)
        if key in self.options:
            return self.options[key]
        opts: list[LayerOption] = []
        if tp > 1:
            try:
                if layer.kind not in self.decomposed:
                    self.decomposed[layer.kind] = decompose_layer(self.mg, layer)
                dl = self.decomposed[layer.kind]
                if sp != SPMode.NONE and not any(r == "activation" for r in dl.input_roles):
                    raise PlanError("no hidden-state input to shard on the sequence")
                fast = solve_intra_layer(self.mg, layer, tp, sp, self.cost_model, decomposed=dl)
                opts.append(fast)
                self.solves += 1
                self.solve_s += fast.solve_s
                if fast.param_fraction > 1.0 / tp + 0.02 and sp != SPMode.ULYSSES:  # Ulysses keeps weights whole
                    lean = solve_intra_layer(self.mg, layer, tp, sp, self.cost_model, decomposed=dl,
                                             shard_params=True)
                    self.solves += 1
                    self.solve_s += lean.solve_s
                    if lean.param_fraction < fast.param_fraction - 0.01:
                        opts.append(lean)
            except Exception as e:  # an op without sharding rules: this layer stays unsharded
                log.info("layer %s cannot use tp=%d sp=%s: %s", layer.name, tp, sp, e)
                opts = []
        self.options[key] = opts
        return opts


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
    cm = cache.cost_model
    out: list[LayerChoice] = []
    params = [mg.params[f] for f in layer.param_names
              if f in mg.params and not mg.params[f].is_buffer and mg.params[f].layers[:1] == (layer.name,)]
    grad_bytes = sum(p.nbytes for p in params if p.requires_grad)
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
                out.extend(_priced(mg, layer, cm, space, opt, tp=tp, sp=sp, dp=dp, local=local, frac=frac,
                                   ranks=ranks, params=params, grad_bytes=grad_bytes,
                                   num_microbatches=num_microbatches, captured_batch=captured_batch))
    return _or_replicated(out, mg, layer, cache, space, devices=devices, ranks=ranks, samples=samples,
                          num_microbatches=num_microbatches, captured_batch=captured_batch,
                          devices_per_node=devices_per_node)


def _priced(mg, layer, cm, space, opt, *, tp, sp, dp, local, frac, ranks, params, grad_bytes, num_microbatches,
            captured_batch) -> list[LayerChoice]:
    """Every (recompute, dp flavour) of one (tp, sp, option), priced."""
    out: list[LayerChoice] = []
    share = opt.compute_ratio if opt is not None else 1.0
    pf = opt.param_fraction if opt is not None else 1.0
    af = opt.activation_fraction if opt is not None else 1.0
    tp_comm = (opt.comm_fwd_s + opt.comm_bwd_s) * frac if opt is not None else 0.0
    fwd0, bwd0 = cm.layer_times_s(mg, layer, batch_fraction=frac)
    dp_ranks = list(ranks[::tp])[:dp]
    # a loss has nothing worth recomputing: it always keeps its activations, whatever the space
    rcs = (Recompute.NONE,) if layer.role == LayerRole.LOSS else space.recompute
    for rc in rcs:
        _, bwd_rc = cm.layer_times_s(mg, layer, batch_fraction=frac, recompute=rc) if rc != Recompute.NONE \
            else (fwd0, bwd0)
        fwd_s, bwd_s = fwd0 * share, bwd_rc * share
        for dpt in space.dp_types:
            if dp == 1 and dpt != DPType.DDP:
                continue
            strategy = LayerStrategy(tp=tp, sp=sp, dp_type=dpt, recompute=rc)
            mem = cm.layer_memory(layer.costs, strategy, dp=dp, micro_batch=local,
                                  captured_batch=captured_batch, params=params or None,
                                  tp_shard=TPShard(param_fraction=pf, activation_fraction=(af, af, af))
                                  if tp > 1 else None)
            dp_comm = _dp_comm_s(cm, dpt, int(grad_bytes * pf), dp_ranks, num_microbatches)
            exposed = max(0.0, cm.overlapped_s(bwd_s * num_microbatches, dp_comm) - bwd_s * num_microbatches)
            out.append(LayerChoice(
                strategy=strategy, dp=dp, fwd_s=fwd_s, bwd_s=bwd_s, tp_comm_s=tp_comm,
                dp_comm_s=exposed, memory=mem,
                in_layout=(opt.input_layout[0] if opt and opt.input_layout else "R"),
                out_layout=(opt.output_layout[0] if opt and opt.output_layout else "R"),
                option=opt,
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
        raise PlanError(f"layer {layer.name} has no strategy that fits {devices} devices with {samples} "
                        f"samples per micro-batch: use a global batch divisible by the data-parallel degree")
    return out


def _with_tp1(space: SearchSpace) -> SearchSpace:
    import dataclasses

    return dataclasses.replace(space, tp=(1,), max_tp=None)


def _dp_comm_s(cm: CostModel, dpt: DPType, nbytes: int, ranks: list[int], m: int) -> float:
    """Seconds per step of synchronising ``nbytes`` of gradients (see module doc)."""
    if len(ranks) <= 1 or nbytes == 0:
        return 0.0
    if dpt == DPType.DDP:
        return cm.collective_time_s(Collective.ALL_REDUCE, nbytes, ranks)
    rs = cm.collective_time_s(Collective.REDUCE_SCATTER, nbytes, ranks)
    ag = cm.collective_time_s(Collective.ALL_GATHER, nbytes, ranks)
    if dpt == DPType.ZERO2:
        return rs + ag
    return rs + 2 * m * ag


def transition_s(cm: CostModel, a: LayerChoice, b: LayerChoice, nbytes: int, ndim: int,
                 ranks: Sequence[int]) -> float:
    """Forward + backward seconds to reshard the hidden state from choice ``a`` to ``b``."""
    if (a.dp, a.strategy.tp, a.out_layout) == (b.dp, b.strategy.tp, b.in_layout):
        return 0.0
    src = Layout((a.dp, a.strategy.tp), (Shard(0), _tp_placement(a.out_layout)))
    dst = Layout((b.dp, b.strategy.tp), (Shard(0), _tp_placement(b.in_layout)))
    fwd = cm.reshard_time_s(nbytes, src, dst, list(ranks), max(ndim, 2))
    bwd = cm.reshard_time_s(nbytes, dst, src, list(ranks), max(ndim, 2))
    return fwd + bwd


def _tp_placement(s: str):
    p = parse_placement(s)
    return p if isinstance(p, Shard) else Replicate()


def transition_matrix(cm: CostModel, prev: list[LayerChoice], cur: list[LayerChoice], nbytes: int,
                      ndim: int, ranks: Sequence[int], num_microbatches: int) -> np.ndarray:
    """Per-step transition seconds between every pair of choices (computed once per layout pair)."""
    memo: dict[tuple, float] = {}
    out = np.zeros((len(prev), len(cur)))
    for i, a in enumerate(prev):
        ka = (a.dp, a.strategy.tp, a.out_layout)
        for j, b in enumerate(cur):
            kb = (b.dp, b.strategy.tp, b.in_layout)
            if (ka, kb) not in memo:
                memo[(ka, kb)] = num_microbatches * transition_s(cm, a, b, nbytes, ndim, ranks)
            out[i, j] = memo[(ka, kb)]
    return out


def prune_dominated(choices: list[LayerChoice], m: int, in_flight: int) -> list[LayerChoice]:
    """Drop every choice that another with the same layouts beats or ties in time, memory and
    temporary memory (so no optimum is lost)."""
    keep: list[LayerChoice] = []
    by_layout: dict[tuple, list[LayerChoice]] = {}
    for c in choices:
        by_layout.setdefault((c.dp, c.strategy.tp, c.in_layout, c.out_layout), []).append(c)
    for group in by_layout.values():
        pts = [(c.step_time_s(m), c.mem_bytes(in_flight), c.memory.temp_bytes, i) for i, c in enumerate(group)]
        for t, mb, tmp, i in pts:
            dominated = any(t2 <= t and m2 <= mb and tmp2 <= tmp and ((t2, m2, tmp2) != (t, mb, tmp) or j < i)
                            for t2, m2, tmp2, j in pts if j != i)
            if not dominated:
                keep.append(group[i])
    return keep
