"""DTensor sharding rules galvatron_fx adds for ops that DTensor has none for.

Registered through DTensor's own API when this module is imported, so that the placement
solver (which reads DTensor's strategy tables) and the runtime (which dispatches DTensors) see
one set. The CPU flash-attention kernels' rules, which need the runtime's mesh conventions, live
here too; those of attention with a trained bias with its op (``galvatron_fx.ops.attention``, imported
here). The solver reads these tables (:mod:`galvatron_fx.search.node_strategies`) exactly as the
runtime's dispatch does: one rule set.

- ``aten.lift_fresh_copy``: the copy export makes of a tensor constant built in a forward
  (``torch.tensor([...])`` in T5's relative-position buckets); its output follows its input,
  as ``clone``'s does.
- ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward (DTensor has no rule
  for the CPU kernel), per mesh dim: all replicated; heads sharded (``Shard(1)`` on q, k, v,
  out, logsumexp and their gradients); batch sharded (``Shard(0)``). An ``attn_mask`` follows q
  on the sharded dim where it is 4-D with q's size there, else stays replicated (broadcast).
- ``aten.fill_.Tensor`` (``x[..., 0] = start_token``, a 0-dim tensor value): ``self`` keeps
  its placement (a partial one is replicated first: a filled value must not be summed), the
  value is replicated.
"""

from __future__ import annotations

from typing import cast

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor._ops._tensor_ops import propagate_single_input_strategy
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
    generate_redistribute_costs,
    register_op_strategy,
)
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from galvatron_fx.ops import attention  # noqa: F401 (its ops and their rules)

aten = torch.ops.aten

_COPIES = [aten.lift_fresh_copy.default]

register_op_strategy(_COPIES)(propagate_single_input_strategy)


@register_op_strategy(aten.fill_.Tensor)
def _fill_tensor(op_schema: OpSchema) -> OpStrategy:
    self_strategy, value_strategy = op_schema.args_schema[:2]
    assert isinstance(self_strategy, OpStrategy) and isinstance(value_strategy, OpStrategy)
    mesh = self_strategy.mesh
    out = []
    seen = set()
    for st in self_strategy.strategies:
        spec = st.output_spec
        placements = tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements)
        if placements in seen:
            continue
        seen.add(placements)
        self_spec = DTensorSpec(mesh, placements, tensor_meta=spec.tensor_meta)
        value_spec = DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=value_strategy.strategies[0].output_spec.tensor_meta)
        out.append(OpSpec(output_specs=self_spec, input_specs=[self_spec, value_spec],
                          redistribute_cost=[generate_redistribute_costs(self_strategy, self_spec),
                                             generate_redistribute_costs(value_strategy, value_spec)]))
    return OpStrategy(out)


def _mask_placement(op_schema: OpSchema, q_index: int, d: int) -> list[Placement | None]:
    """An ``attn_mask``'s placement when q is sharded on ``d`` (none: no mask)."""
    mask = op_schema.kwargs_schema.get("attn_mask")
    if not isinstance(mask, OpStrategy):
        return []
    keep = len(mask.shape) == 4 and mask.shape[d] == cast(OpStrategy, op_schema.args_schema[q_index]).shape[d]
    return [Shard(d) if keep else Replicate()]


@register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default,
                      schema_info=RuntimeSchemaInfo(3, static_kwargkey=["scale"]))
def _cpu_flash_attention(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args()
    # [out, logsumexp, q, k, v, (attn_mask)]
    strategies: list[list[Placement | None]] = [
        cast(list[Placement | None], [Replicate()] * 5) + ([Replicate()] if _mask_placement(op_schema, 0, 1) else [])]
    for d in (1, 0):
        strategies.append([Shard(d)] * 5 + _mask_placement(op_schema, 0, d))
    return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)


@register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                      schema_info=RuntimeSchemaInfo(6, static_kwargkey=["scale"]))
def _cpu_flash_attention_backward(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args(validate=False)
    # [grad_q, grad_k, grad_v, grad_out, q, k, v, out, logsumexp, (attn_mask)]
    strategies: list[list[Placement | None]] = [
        cast(list[Placement | None], [Replicate()] * 9) + ([Replicate()] if _mask_placement(op_schema, 1, 1) else [])]
    for d in (1, 0):
        strategies.append([Shard(d)] * 9 + _mask_placement(op_schema, 1, d))
    return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=3)


# ---- grouped matrix multiplication (mixture-of-experts experts) ----------------------------------
#
# grouped_mm(x (S, K), w (E, K, N), offs (E,)) -> (S, N): the rows offs[e-1]:offs[e] of x times
# expert e's matrix. Per mesh dim, as a column- or row-parallel linear layer: w split on N (its
# output columns) gives an output split on its columns; x and w split on K give a partial sum.
# Rows cannot be split (the offsets are positions in the whole token list), nor experts (that is
# expert parallelism: tokens must travel to their experts' ranks).

def _grouped_mm_2d3d(out_partial: Placement = Partial()) -> list[list[Placement | None]]:
    # [out, x, w, offs]
    return [[Replicate()] * 4,
            [Shard(1), Replicate(), Shard(2), Replicate()],
            [out_partial, Shard(1), Shard(1), Replicate()]]


def _grouped_mm_strategy(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args()
    tensors = op_schema.args_strategy + op_schema.kwargs_strategy
    x, w = cast(tuple[OpStrategy, ...], op_schema.args_schema[:2])
    nd = (len(x.shape), len(w.shape))
    rules: list[list[Placement | None]]
    if nd == (2, 3) and len(tensors) == 3:
        rules = _grouped_mm_2d3d()
    elif nd == (2, 2) and len(tensors) == 3:  # x^T (K, S) by g (S, N) grouped over S -> (E, K, N): a weight's grad
        rules = [[Replicate()] * 4, [Shard(1), Shard(0), Replicate(), Replicate()],
                 [Shard(2), Replicate(), Shard(1), Replicate()]]
    else:  # (bias, batched 3-D forms): replicated
        rules = [[Replicate()] * (1 + len(tensors))]
    return expand_to_full_mesh_op_strategy(mesh, op_schema, rules, input_index=1)


def _grouped_mm_backward_strategy(op_schema: OpSchema) -> OpStrategy:
    # (x, w, offs, grad_out) -> (grad_x, grad_w): [grad_x, grad_w, x, w, offs, grad_out]
    mesh = op_schema.get_mesh_from_args()
    rules: list[list[Placement | None]] = [
             [Replicate()] * 6,
             [Partial(), Shard(2), Replicate(), Shard(2), Replicate(), Shard(1)],
             [Shard(1), Shard(1), Shard(1), Shard(1), Replicate(), Replicate()]]
    return expand_to_full_mesh_op_strategy(mesh, op_schema, rules, input_index=2)


register_op_strategy(aten._grouped_mm.default, schema_info=RuntimeSchemaInfo(needs_pytree=False))(
    _grouped_mm_strategy)

# ops other libraries register, given rules once they exist (their library imported): qualified
# name -> rule
_LIBRARY_RULES = {
    "transformers::grouped_mm_fallback": _grouped_mm_strategy,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_backward_strategy,
}
_REGISTERED: set[str] = set()


def ensure_rules(ops) -> None:
    """Register our rules for the library ops among ``ops`` (OpOverloads seen in a graph) that
    have none yet (:data:`_LIBRARY_RULES`; an op of a library not imported is never seen)."""
    for op in ops:
        name = getattr(op, "_schema", None)
        qual = name.name if name is not None else None
        if qual in _LIBRARY_RULES and qual not in _REGISTERED:
            register_op_strategy(op)(_LIBRARY_RULES[qual])
            _REGISTERED.add(qual)
            # its backward op too, where the library defines one
            ns, _, base = qual.partition("::")
            back = f"{qual}_backward"
            if back in _LIBRARY_RULES and back not in _REGISTERED:
                packet = getattr(getattr(torch.ops, ns), f"{base}_backward", None)
                if packet is not None:
                    register_op_strategy(packet.default)(_LIBRARY_RULES[back])
                    _REGISTERED.add(back)


# ---- scans -------------------------------------------------------------------------------------
#
# cumsum / cumprod / logcumsumexp along dim d: no shard on d (each shard would scan only its own
# part). DTensor's own rule (torch 2.13) compares a negative ``dim`` with the shard dims
# unnormalised, so ``cumsum(x, -1)`` kept a shard on the last dim and summed per shard; here the
# dim is normalised first, so a sharded scan dim is redistributed (and priced as such).

def _scan_strategy(op_schema: OpSchema) -> OpStrategy:
    from torch.distributed.tensor._ops._math_ops import common_reduction_strategy

    x, dim = op_schema.args_schema[:2]
    assert isinstance(x, OpStrategy) and isinstance(dim, int), op_schema
    return common_reduction_strategy(x, [dim % max(x.ndim, 1)], keep_dim=True, reduction_linear=False)


register_op_strategy([aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default],
                     schema_info=RuntimeSchemaInfo(1))(_scan_strategy)
