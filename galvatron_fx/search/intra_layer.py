"""solve_intra_layer — the placement ILP inside one layer kind, for one tensor-parallel degree.

Contract: takes an annotated :class:`~galvatron_fx.ir.ModelGraph`, one layer (the
representative of its kind), a tensor-parallel degree ``tp``, a sequence-parallel mode and a
cost model; returns a :class:`~galvatron_fx.ir.layer_option.LayerOption`: one DTensor placement
per value of the layer's decomposed forward graph, its compute and communication time per
micro-batch, and how its parameters and activations divide. The graph is not changed; the
result is cached per ``(kind, tp, sp, cluster tier)``.

Terms: the layer is re-traced into the post-dispatch ATen ops that DTensor itself sees at run
time (:mod:`~galvatron_fx.passes.decompose_layer`), so every placement the solver picks is one
the runtime can execute. A *value* is one tensor output of a node; a *strategy* of a node fixes
the placement of each of its tensor inputs and outputs on the 1-D ``tp`` mesh (``Replicate``,
``Shard(d)``, ``Partial``; :mod:`~galvatron_fx.search.node_strategies` lists them).
Sequence-parallel modes fix the layout of the hidden state at the layer's boundary (unless a
caller fixes another: a head handing on vocab-sharded logits, the loss taking them): ``none``
replicated, ``megatron`` and ``ulysses`` split on the sequence dim; Ulysses also keeps every
parameter whole, so the solver has to move the sequence split to heads around attention
(all-to-all) instead of sharding weights.

Formulation. Binary ``x[n,s]`` chooses strategy ``s`` of node ``n``; for every edge
``e = (u → n, slot k)`` binary ``y[e,a,b]`` is the product ``x[u,a]·x[n,b]``; for every value
``v`` and every gradient placement ``g`` a consumer may hand back, binary ``w[v,g]`` says
that some consumer does, and ``z[v,g,a] = w[v,g]·x[u,a]``:

    minimise   Σ_n Σ_s x[n,s]·compute(n,s)
             + Σ_e Σ_{a,b} y[e,a,b]·fwd(out(u,a) → in(n,b,k))                       (1)
             + Σ_v Σ_g Σ_a z[v,g,a]·bwd(g → dual(out(u,a)))                          (2)
    s.t.       Σ_s x[n,s] = 1                                  (_add_choice_constraints)
               Σ_b y[e,a,b] = x[u,a],  Σ_a y[e,a,b] = x[n,b]   (_add_edge_constraints)
               w[v,g] ≥ x[n,b]   for each consumer strategy b handing back g
               z[v,g,a] ≥ w[v,g] + x[u,a] − 1                  (_add_grad_constraints)
               x fixed on the layer's inputs/outputs by the sequence-parallel mode

``compute(n,s)`` is the node's forward+backward time from the cost model, on ``1/tp`` of its
FLOPs and bytes when ``s`` partitions the work (a sharded input or output; launch overhead is
paid either way), plus the collectives its own kernel runs under ``s`` (a class-sharded
log-softmax or NLL loss all-reduces per-row scalars: :mod:`~galvatron_fx.ops.vocab_parallel`,
``PlacementProblem.inner``). (1) is the forward redistribution on every
edge, costed by the reshard model. (2) is the backward: a consumer that reads a replicated
input inside partitioned work returns a *partial* gradient (Megatron's "f": identity forward,
all-reduce backward); the gradients of one value are summed first and redistributed once to
the placement the producer's backward needs (``dual``: a partial output takes a replicated
gradient, a replicated parameter all-reduces its gradient). On a transformer block this
rediscovers Megatron's column→row pattern (two all-reduces forward, two backward; or, with
sequence parallelism, all-gather/reduce-scatter pairs) with no model-specific rule.
"""

from __future__ import annotations

import logging
import operator
import time
from collections import defaultdict
from typing import TypeGuard, cast

import torch
import torch.fx as fx
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_flatten

from galvatron_fx.cost_models.base import CostModel
from galvatron_fx.cost_models.reshard import Layout
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.layer_option import CommEvent, LayerOption
from galvatron_fx.ir.meta import tensor_bytes
from galvatron_fx.ir.placements import NodePlacement, P, R, check_layer_placements, parse_placement, pstr
from galvatron_fx.ir.strategy import SPMode
from galvatron_fx.ops.vocab_parallel import collectives as in_op_collectives
from galvatron_fx.ops.vocab_parallel import is_class_sharded
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer, node_labels, param_values
from galvatron_fx.passes.state_writes import written_through
from galvatron_fx.search.node_strategies import (
    _IGNORED,
    _mesh,
    node_strategies,
    sharded_activation_fraction,
    sharded_param_fraction,
    strategy_key,
)
from galvatron_fx.search.placement_ilp import PlacementProblem, _Value, evaluate, solve_placement  # noqa: F401

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _fits(p: Placement | None, val: torch.Tensor, tp: int) -> TypeGuard[Placement]:
    """Whether ``val`` can take layout ``p`` on ``tp`` ranks (``None`` never does)."""
    if p is None:
        return False
    if not isinstance(p, Shard):
        return True
    return p.dim < val.ndim and val.shape[p.dim] % tp == 0 and val.shape[p.dim] >= tp


def _layout_for(sp: SPMode, val: torch.Tensor) -> Placement:
    """The placement of an activation crossing a layer boundary under ``sp``: a hidden state
    ``(B, T, C)`` is split on the sequence; other values (a position bias ``(1, H, T, T)``)
    cross replicated."""
    if sp == SPMode.NONE or val.ndim != 3:
        return R
    return Shard(1)


def build_problem(dl: DecomposedLayer, tp: int, sp: SPMode | str, cost_model: CostModel,
                  ranks: list[int], *, shard_params: bool = False, in_layout: Placement | None = None,
                  out_layout: Placement | None = None, input_layouts: dict[str, Placement] | None = None,
                  vocab_parallel: bool = True) -> tuple[PlacementProblem, dict[str, fx.Node]]:
    """The :class:`PlacementProblem` of a decomposed layer at degree ``tp`` under ``sp``.

    ``shard_params`` forbids replicating any matrix parameter that can be sharded: the
    memory-lean variant (the time-optimal one may replicate small weights and all-reduce their
    gradients instead). ``in_layout`` / ``out_layout`` replace the sequence-parallel mode's
    boundary layout of the activation inputs / outputs where they fit them (a head handing its
    loss vocab-sharded logits; ``None``: the mode's); ``input_layouts`` fixes them per input
    placeholder (a saved plan's). ``vocab_parallel=False`` forbids the class-sharded
    log-softmax / NLL strategies (:mod:`~galvatron_fx.ops.vocab_parallel`).
    """
    sp = SPMode(sp)
    mesh = _mesh(tp)
    gm = dl.gm
    calls, alias, tensor_args_of, written = _structure(dl)

    def value_of(a: fx.Node) -> tuple[fx.Node, int]:
        return alias.get(a, (a, 0))

    strategies: dict[str, list[NodePlacement]] = {}
    role = dict(zip(dl.inputs, dl.input_roles))
    for ph in dl.inputs:
        val = ph.meta["val"]
        if role[ph] == "param":
            cands: list[Placement] = [R] + [Shard(d) for d in range(val.ndim)
                                            if val.shape[d] % tp == 0 and val.shape[d] >= tp]
            if sp == SPMode.ULYSSES:
                cands = [R]  # Ulysses: weights whole on every rank, the sequence split instead
            elif shard_params and val.ndim >= 2 and len(cands) > 1:
                cands = cands[1:]
        elif role[ph] == "activation":
            if input_layouts and ph.name in input_layouts:
                cands = [input_layouts[ph.name]]
            else:
                cands = [in_layout if _fits(in_layout, val, tp) else _layout_for(sp, val)]
        else:
            cands = [R]
        strategies[ph.name] = [NodePlacement((), (p,)) for p in cands]
    compute: dict[str, list[float]] = {ph.name: [0.0] * len(strategies[ph.name]) for ph in dl.inputs}
    for n in calls:
        if (n.name, tp) not in dl.strategies:  # the same for every SP mode and variant
            # and for every node of one op on alike values (an unrolled loop's steps)
            key = strategy_key(n)
            shared = (n.name if key is None else key, tp)
            if shared not in dl.strategies:
                dl.strategies[shared] = node_strategies(n, mesh, tp)
            dl.strategies[(n.name, tp)] = dl.strategies[shared]
        strategies[n.name] = dl.strategies[(n.name, tp)]
        flops, nbytes = dl.fwd_flops.get(n.name, 0), dl.fwd_bytes.get(n.name, 0)
        # forward + backward: the backward of a kernel costs about twice its forward; a
        # partitioned kernel does 1/tp of the work but still pays its launch overhead
        if flops or nbytes:
            whole = 3 * cost_model.node_time_s(flops, nbytes)
            part = 3 * cost_model.node_time_s(flops / tp, nbytes / tp)
        else:
            whole = part = 0.0
        compute[n.name] = [part if s.partitioned else whole for s in strategies[n.name]]
    # an op that writes into a tensor, and the views it writes through, take no partial
    # placement: a partial sum written into a slice of a buffer is not the buffer's partial sum
    for name in written:
        if name in strategies and name in compute:
            keep = [i for i, st in enumerate(strategies[name])
                    if not any(isinstance(p, Partial) for p in st.inputs + st.outputs if p is not None)]
            strategies[name] = [strategies[name][i] for i in keep]
            compute[name] = [compute[name][i] for i in keep]
    consumers: dict[tuple[fx.Node, int], list[tuple[str, int]]] = defaultdict(list)
    for n in calls:
        for k, a in enumerate(tensor_args_of[n]):
            u, idx = value_of(a)
            if u.name in strategies:
                consumers[(u, idx)].append((n.name, k))
    values = []
    # float values travel in the compute dtype (mixed precision: the graph was captured in fp32)
    prec = getattr(cost_model, "precision", None)
    itemsize = getattr(torch, prec.compute_dtype).itemsize if prec is not None else None
    for (u, idx), cons in consumers.items():
        val = _val(u, idx)
        has_grad = val.is_floating_point() and not (u.op == "placeholder" and role.get(u) == "other")
        nbytes = val.numel() * itemsize if itemsize and val.is_floating_point() else tensor_bytes(val)
        values.append(_Value(u.name, idx, int(nbytes), val.ndim, has_grad, cons))
    forbidden: set[tuple[str, int]] = set()
    if sp == SPMode.ULYSSES:  # every op reads its weights whole: no slicing a replicated weight
        weightish = {ph.name for ph in dl.inputs if role[ph] == "param"}
        for n in calls:  # views of weights (transposes, reshapes) are weights too
            if _is_view_like(n) and any(a.name in weightish for a in n.all_input_nodes):
                weightish.add(n.name)
        for v in values:
            if v.producer in weightish:
                for n, k in v.consumers:
                    forbidden |= {(n, i) for i, s in enumerate(strategies[n])
                                  if k < len(s.inputs) and not isinstance(s.inputs[k], Replicate)}
    if not vocab_parallel:
        forbidden |= {(n.name, i) for n in calls for i, s in enumerate(strategies[n.name])
                      if is_class_sharded(n, s.inputs)}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    for a in tree_flatten(out_node.args)[0]:
        if not isinstance(a, fx.Node):
            continue
        u, idx = value_of(a)
        if _is_activation_value(u, idx):  # the layer hands on its output in the SP layout
            want = out_layout if _fits(out_layout, _val(u, idx), tp) else _layout_for(sp, _val(u, idx))
            bad = {(u.name, i) for i, s in enumerate(strategies[u.name]) if s.outputs[idx] != want}
            # where no strategy of the producer makes it (a view from (B*T, C)), the output
            # leaves as made and the next layer's transition reshards it
            if len(bad) < len(strategies[u.name]):
                forbidden |= bad
    nodes = [ph.name for ph in dl.inputs] + [n.name for n in calls]

    def reshard(src, dst, nbytes, ndim):
        return _reshard_s(cost_model, nbytes, src, dst, ranks, ndim)

    inner = {}
    for n in calls:
        per = [[(d, c, b, reshard(P, R, b, 2)) for d, c, b in in_op_collectives(n, s.inputs)]
               for s in strategies[n.name]]
        if any(per):
            inner[n.name] = per
    problem = PlacementProblem(nodes=nodes, strategies=strategies, compute_s=compute, values=values,
                               view_like={n.name for n in calls if _is_view_like(n)},
                               reshard_s=reshard, forbidden=forbidden, inner=inner,
                               no_grad={n.name for n in calls if n.target is aten.detach.default})
    return problem, {n.name: n for n in gm.graph.nodes}


def _structure(dl: DecomposedLayer) -> tuple:
    """What :func:`build_problem` reads of the decomposed graph whatever the degree and mode
    (kept on ``dl``): the nodes it places, the ``getitem`` aliases of multi-output values, each
    node's tensor arguments, the nodes a write goes through."""
    if "problem" not in dl.structure:
        gm = dl.gm
        calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target not in _IGNORED
                 and n.target is not operator.getitem]
        alias: dict[fx.Node, tuple[fx.Node, int]] = {}  # getitem nodes alias their source's output
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is operator.getitem:
                src, idx = n.args
                alias[n] = alias.get(src, (src, idx))
        tensor_args = {n: [a for a in tree_flatten((n.args, n.kwargs))[0] if isinstance(a, fx.Node)] for n in calls}
        written = {n.name for pair in written_through(gm) for n in pair}
        dl.structure["problem"] = (calls, alias, tensor_args, written)
    return dl.structure["problem"]


def solve_intra_layer(mg: ModelGraph, layer: LayerInfo, tp: int, sp: SPMode | str, cost_model: CostModel,
                      *, ranks: list[int] | None = None, decomposed: DecomposedLayer | None = None,
                      shard_params: bool = False, in_layout: Placement | None = None,
                      out_layout: Placement | None = None, vocab_parallel: bool = True) -> LayerOption:
    """Solve the placement ILP of ``layer`` at tensor-parallel degree ``tp`` (see module doc;
    ``in_layout``, ``out_layout``, ``vocab_parallel``: see :func:`build_problem`)."""
    t0 = time.perf_counter()
    sp = SPMode(sp)
    ranks = ranks if ranks is not None else list(range(tp))
    dl = decomposed or decompose_layer(mg, layer)
    problem, by_name = build_problem(dl, tp, sp, cost_model, ranks, shard_params=shard_params,
                                     in_layout=in_layout, out_layout=out_layout, vocab_parallel=vocab_parallel)
    choice, objective, num_vars = solve_placement(problem)
    option = _option(layer, dl, problem, by_name, choice, tp, sp, solve=(objective, num_vars, t0))
    log.info("intra-layer ILP %s tp=%d sp=%s: %d variables, %.3f s, fwd comm %s", layer.name, tp, sp,
             num_vars, option.solve_s, option.collectives("fwd"))
    return option


def option_from_placements(mg: ModelGraph, layer: LayerInfo, tp: int, sp: SPMode | str, cost_model: CostModel,
                           placements: dict[str, str], *, decomposed: DecomposedLayer | None = None) -> LayerOption:
    """The :class:`LayerOption` of ``layer`` with given placements (a saved plan's), priced by
    ``cost_model``: what :func:`solve_intra_layer` returns with the ILP's choice replaced by
    ``placements``. Raises ``ConfigError`` when a placement does not fit its node's tensors,
    ``PlanError`` when it is not a strategy of its node."""
    sp = SPMode(sp)
    dl = decomposed or decompose_layer(mg, layer)
    check_layer_placements(layer.name, placements, dl.gm)
    # the saved activation inputs' layouts (a loss reading vocab-sharded logits)
    given = {ph.name: parse_placement(placements[ph.name].split("->")[1]) for ph, r in zip(dl.inputs, dl.input_roles)
             if r == "activation" and ph.name in placements}
    problem, by_name = build_problem(dl, tp, sp, cost_model, list(range(tp)), input_layouts=given)
    choice = {}
    for n in problem.nodes:
        idx = [i for i, st in enumerate(problem.strategies[n]) if str(st) == placements.get(n)]
        if not idx:
            raise PlanError(f"layer {layer.name}: placement {placements.get(n)!r} of {n} is not a strategy at "
                            f"tp={tp}; re-plan with this torch version")
        choice[n] = idx[0]
    return _option(layer, dl, problem, by_name, choice, tp, sp)


def _option(layer: LayerInfo, dl: DecomposedLayer, problem: PlacementProblem, by_name: dict, choice: dict[str, int],
            tp: int, sp: SPMode, *, solve: tuple[float, int, float] | None = None) -> LayerOption:
    """The :class:`LayerOption` of a chosen strategy per node, priced by ``problem``'s cost
    model. ``solve``: ``(objective, variables, start time)`` of the ILP that chose it (checked
    against the evaluated cost), else a given choice."""
    chosen = {n: problem.strategies[n][i] for n, i in choice.items()}
    total, events = evaluate(problem, choice)
    if solve is not None:
        # (10 ns absolute: on a cluster priced without latency, reshards of a few bytes cost
        # single nanoseconds, which the ILP and the oracle may attribute differently)
        assert abs(total - solve[0]) <= 1e-8 + 1e-6 * abs(solve[0]), \
            f"ILP objective {solve[0]} != evaluated {total} for {layer.name}"
    role = dict(zip((ph.name for ph in dl.inputs), dl.input_roles))
    weights = param_values(dl)
    comm = tuple(CommEvent(d, v, c, _bytes_of(problem, v), t, per_sample=v.rsplit("[", 1)[0] not in weights)
                 for d, v, c, t in events)
    comm += tuple(CommEvent(d, f"{n}[inner]", c, b, t) for n, i in choice.items() if n in problem.inner
                  for d, c, b, t in problem.inner[n][i])
    compute_s = sum(problem.compute_s[n][i] for n, i in choice.items())
    full = sum(max(c) for c in problem.compute_s.values() if c)
    out_node = next(n for n in dl.gm.graph.nodes if n.op == "output")
    outs = [a for a in tree_flatten(out_node.args)[0] if isinstance(a, fx.Node)]
    by_node = {by_name[n]: st for n, st in chosen.items()}
    return LayerOption(
        kind=layer.kind, tp=tp, sp=sp, placements={n: str(st) for n, st in chosen.items()},
        compute_s=compute_s, compute_ratio=compute_s / full if full > 0 else 1.0,
        comm_fwd_s=sum(e.time_s for e in comm if e.direction == "fwd"),
        comm_bwd_s=sum(e.time_s for e in comm if e.direction == "bwd"),
        param_fraction=sharded_param_fraction(dl, by_node, tp),
        activation_fraction=sharded_activation_fraction(dl, by_node, [by_name[n] for n in problem.nodes if n not in role], tp),
        comm=comm, input_layout=tuple(pstr(chosen[n].outputs[0]) for n, r in role.items() if r == "activation"),
        output_layout=tuple(_out_placement(chosen, a) for a in outs),
        objective_s=solve[0] if solve is not None else total,
        labels={k: v for k, v in node_labels(dl).items() if k in chosen},
        solve_s=time.perf_counter() - solve[2] if solve is not None else 0.0,
        num_variables=solve[1] if solve is not None else 0)


def _bytes_of(problem: PlacementProblem, value: str) -> int:
    for v in problem.values:
        if f"{v.producer}[{v.index}]" == value:
            return v.nbytes
    return 0


def _out_placement(chosen: dict[str, NodePlacement], a: fx.Node) -> str:
    if a.target is operator.getitem:
        src, idx = cast("tuple[fx.Node, int]", a.args)  # (a getitem's (source, index))
        return pstr(chosen[src.name].outputs[idx]) if src.name in chosen else "-"
    return pstr(chosen[a.name].outputs[0]) if a.name in chosen else "-"


_VIEW_LIKE = {getattr(aten, n) for n in ("view", "_unsafe_view", "reshape", "t", "transpose", "permute",
                                         "unsqueeze", "squeeze", "expand", "alias", "clone", "_to_copy")
              if hasattr(aten, n)}


def _is_view_like(n: fx.Node) -> bool:
    """Single-input ops that are linear in their input: a partial gradient passes through them."""
    return getattr(n.target, "overloadpacket", None) in _VIEW_LIKE


def _val(node: fx.Node, idx: int) -> torch.Tensor:
    v = node.meta["val"]
    return v[idx] if isinstance(v, (list, tuple)) else v


def _is_activation_value(node: fx.Node, idx: int) -> bool:
    v = _val(node, idx)
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _reshard_s(cost_model: CostModel, nbytes: int, src: Placement, dst: Placement, ranks: list[int], ndim: int) -> float:
    if isinstance(dst, Partial):
        return 0.0
    # the ILPs of a search ask for the same few (bytes, layouts) over and over: priced once per
    # cost model (kept on it, where it keeps a __dict__)
    cache = getattr(cost_model, "__dict__", {}).setdefault("_gfx_reshard_s", {})
    key = (nbytes, src, dst, tuple(ranks), ndim)
    t = cache.get(key)
    if t is None:
        n = len(ranks)
        t = cache[key] = cost_model.reshard_time_s(nbytes, Layout((n,), (src,)), Layout((n,), (dst,)), ranks, ndim)
    return t
