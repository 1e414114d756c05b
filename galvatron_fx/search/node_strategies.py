"""node_strategies — every placement strategy of one decomposed node on a 1-D tensor-parallel mesh.

Contract: :func:`node_strategies` takes a node of a decomposed layer
(:mod:`galvatron_fx.passes.decompose_layer`, fake values in ``node.meta["val"]``), a 1-D mesh
(:func:`_mesh`) and its size ``tp``; returns the node's :class:`NodePlacement` list, the
all-replicated one first. The graph is not changed.

Terms: a *strategy* of a node fixes the placement (``Replicate``, ``Shard(d)``, ``Partial``)
of each of its tensor inputs and outputs on the ``tp`` mesh axis; it is *partitioned* when a
sharded tensor splits the work.

Algorithm: the strategies come from DTensor's own sharding propagator (its single-dim and op
strategy functions, on every even, plain combination of the inputs' candidate placements;
the rules we add for kernels DTensor has none for are registered there too, by
:mod:`galvatron_fx.ops.shardings`, so the solver and the runtime read one set), plus the
class-sharded strategies the runtime runs with its own code
(:mod:`~galvatron_fx.ops.vocab_parallel`). Uneven shards and non-sum partials are dropped.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_flatten

from galvatron_fx.errors import PlanError
from galvatron_fx.ir.meta import tensor_bytes
from galvatron_fx.ir.placements import NodePlacement, P, R
from galvatron_fx.ops import shardings  # noqa: F401 (registers our DTensor rules)
from galvatron_fx.ops.vocab_parallel import extra_strategies

__all__ = ["node_strategies", "strategy_key", "sharded_activation_fraction", "sharded_param_fraction"]

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _tensor_meta(v):
    from torch.distributed.tensor._dtensor_spec import TensorMeta

    return TensorMeta(v.shape, v.stride(), v.dtype)


def _candidates(v: torch.Tensor, tp: int) -> list[Placement]:
    """Replicate, Partial, and Shard(d) on every dim that ``tp`` divides."""
    out: list[Placement] = [R]
    if v.is_floating_point():
        out.append(P)
    out += [Shard(d) for d in range(v.ndim) if v.shape[d] % tp == 0 and v.shape[d] >= tp]
    return out


def _plain(placements) -> bool:
    """Only Replicate, Shard and sum-partials (including the masked partial of a vocab-parallel
    embedding): no strided or other exotic shards."""
    for p in placements:
        if p is None or type(p) in (Replicate, Shard):
            continue
        if isinstance(p, Partial) and p.reduce_op == "sum":
            continue
        return False
    return True


def _even(placements, metas, tp: int) -> bool:
    if not _plain(placements):
        return False
    for p, m in zip(placements, metas):
        if isinstance(p, Shard) and m is not None:
            d = p.dim % len(m.shape)
            if m.shape[d] % tp != 0:
                return False
    return True


_IGNORED = {aten._assert_tensor_metadata.default}


def node_strategies(node: fx.Node, mesh, tp: int) -> list[NodePlacement]:
    """Every strategy of ``node`` on a 1-D mesh of ``tp`` ranks (see module doc for sources)."""
    op = node.target
    from torch.distributed.tensor import DTensor

    prop = DTensor._op_dispatcher.sharding_propagator
    tensor_args = [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, fx.Node)]
    in_vals = [a.meta["val"] for a in tensor_args]
    out_vals = [v if isinstance(v, torch.Tensor) else None for v in _flat_outputs(node)]
    found: set[NodePlacement] = set()
    if op in prop.op_single_dim_strategy_funcs:
        found |= _from_single_dim(prop, node, in_vals, out_vals, tp)
    elif op in prop.op_strategy_funcs:
        found |= _from_op_strategy(prop, node, mesh, tensor_args, out_vals, tp)
    replicate = NodePlacement(tuple(R for _ in in_vals), tuple(R if v is not None else None for v in out_vals))
    found.add(replicate)
    # class-sharded log-softmax / NLL loss (vocab-parallel cross-entropy), run by our own code
    found |= {NodePlacement(ins, outs) for ins, outs in extra_strategies(node, tp)}
    return sorted(found, key=lambda s: (s != replicate, str(s)))


def strategy_key(node: fx.Node) -> tuple | None:
    """All that :func:`node_strategies` reads of ``node`` at one tp: its op, its arguments'
    structure and values, each tensor's shape, strides and dtype, its outputs'. Nodes with one key
    have one strategy list. None where a value is not a tensor or an argument not hashable."""
    def meta(v):
        return (tuple(int(d) for d in v.shape), tuple(v.stride()), v.dtype)

    parts = []
    flat, spec = tree_flatten((node.args, node.kwargs))
    for a in flat:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor):
                return None
            parts.append(meta(v))
        else:
            parts.append(a)
    outs = tuple(meta(v) if isinstance(v, torch.Tensor) else None for v in _flat_outputs(node))
    key = (node.target, str(spec), tuple(parts), outs)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _flat_outputs(node: fx.Node) -> list:
    v = node.meta.get("val")
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _from_single_dim(prop, node, in_vals, out_vals, tp) -> set[NodePlacement]:
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder

    info = prop.op_single_dim_strategy_funcs[node.target]
    args = torch.fx.node.map_arg(node.args, lambda a: _tensor_meta(a.meta["val"]))
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: _tensor_meta(a.meta["val"]))
    try:
        rules = info.func(node.target, args, kwargs)
    except Exception as e:  # a rule that cannot handle these shapes: replicate only
        log.debug("no single-dim strategies for %s: %s", node.format_node(), e)
        return set()
    out: set[NodePlacement] = set()
    n_out = len(out_vals)
    metas = [_tensor_meta(v) if v is not None else None for v in out_vals] + [_tensor_meta(v) for v in in_vals]
    for rule in rules:
        placements = []
        ok = True
        for p in rule:
            if isinstance(p, _ShardingPlaceholder):
                p = Shard(p.dim)
            if isinstance(p, Partial) and p.reduce_op != "sum":
                ok = False
            placements.append(p)
        if not ok or len(placements) != n_out + len(in_vals) or not _even(placements, metas, tp):
            continue
        outs = tuple(p if out_vals[i] is not None else None for i, p in enumerate(placements[:n_out]))
        out.add(NodePlacement(tuple(placements[n_out:]), outs))
    return out


def _from_op_strategy(prop, node, mesh, tensor_args, out_vals, tp) -> set[NodePlacement]:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy

    fn = prop.op_strategy_funcs[node.target]
    cands = [_candidates(a.meta["val"], tp) for a in tensor_args]
    out: set[NodePlacement] = set()

    def schema_for(choice):
        it = iter(choice)

        def to_strategy(a):
            p = next(it)
            meta = _tensor_meta(a.meta["val"])
            return OpStrategy([OpSpec(DTensorSpec(mesh, (p,), tensor_meta=meta))])

        def wrap(a):
            if isinstance(a, fx.Node):
                return to_strategy(a)
            if isinstance(a, (list, tuple)) and a and all(isinstance(x, fx.Node) for x in a):
                return TupleStrategy([to_strategy(x) for x in a])  # a tensor list (cat, stack)
            return a

        args = tuple(wrap(a) for a in node.args)
        kwargs = {k: wrap(v) for k, v in node.kwargs.items()}
        return OpSchema(node.target, args, kwargs)

    combos = itertools.product(*cands) if math.prod(len(c) for c in cands) <= 256 else [tuple(R for _ in cands)]
    for choice in combos:
        try:
            st = fn(schema_for(choice))
        except Exception:
            continue
        specs = st.strategies if isinstance(st, OpStrategy) else None
        if isinstance(st, TupleStrategy):
            # multi-output view ops (split, unbind): one child per output, all following the input
            children: Sequence[Any] = st.children  # (OpStrategy each where read: checked below)
            if not all(isinstance(c, OpStrategy) and len(c.strategies) == 1 for c in children):
                continue
            ins = tuple(s.placements[0] for s in children[0].strategies[0].input_specs)
            outs = tuple(c.strategies[0].output_spec.placements[0] for c in children)
            out.add(NodePlacement(ins, outs))
            continue
        for spec in specs or []:
            ins = tuple(s.placements[0] if s is not None else None for s in (spec.input_specs or ()))
            if len(ins) != len(tensor_args):
                continue
            outs_specs = spec.output_specs if isinstance(spec.output_specs, tuple) else (spec.output_specs,)
            outs = tuple(s.placements[0] if s is not None else None for s in outs_specs)
            if len(outs) != len(out_vals):
                continue
            metas = [_tensor_meta(a.meta["val"]) for a in tensor_args]
            if _even(ins, metas, tp) and _even(outs, [(_tensor_meta(v) if v is not None else None) for v in out_vals], tp):
                out.add(NodePlacement(ins, outs))
    return out


_MESHES: dict[int, object] = {}


def _mesh(tp: int):
    """A 1-D device mesh of ``tp`` ranks for the strategy functions (a fake group if none)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if tp in _MESHES:
        return _MESHES[tp]
    if not dist.is_initialized():
        from galvatron_fx.passes.lower_program import init_stand_in_group

        init_stand_in_group()
    if tp > dist.get_world_size():
        raise PlanError(f"tp={tp} is larger than the process group ({dist.get_world_size()} ranks)")
    mesh = DeviceMesh("cpu", torch.arange(tp), _init_backend=False)
    _MESHES[tp] = mesh
    return mesh


def sharded_param_fraction(dl, chosen: dict, tp: int) -> float:
    """Share of a decomposed layer's parameter bytes one rank holds under the chosen node
    strategies (sharded parameters count 1/tp)."""
    total = 0
    local: float = 0  # (a sharded parameter adds b / tp)
    for ph, role in zip(dl.inputs, dl.input_roles):
        if role != "param":
            continue
        b = tensor_bytes(ph.meta["val"])
        total += b
        local += b / tp if isinstance(chosen[ph].outputs[0], Shard) else b
    return local / total if total else 1.0


def sharded_activation_fraction(dl, chosen: dict, calls: list[fx.Node], tp: int) -> float:
    """Share of the forward's output bytes one rank holds (sharded outputs count 1/tp)."""
    total = local = 0.0
    for n in calls:
        for p, v in zip(chosen[n].outputs, _flat_outputs(n)):
            if not isinstance(v, torch.Tensor) or p is None:
                continue
            b = tensor_bytes(v)
            total += b
            local += b / tp if isinstance(p, Shard) else b
    return local / total if total else 1.0
