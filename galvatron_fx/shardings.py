"""DTensor sharding rules galvatron_fx adds for ops that DTensor has none for.

Registered through DTensor's own API when this module is imported, so that the placement
solver (which reads DTensor's strategy tables) and the runtime (which dispatches DTensors) see
one set. The CPU flash-attention kernels' rules, which need the runtime's mesh conventions, live
here too; those of attention with a trained bias with its op (``galvatron_fx.attention``, imported
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

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor._ops._tensor_ops import propagate_single_input_strategy
from torch.distributed.tensor._ops.utils import (expand_to_full_mesh_op_strategy, generate_redistribute_costs,
                                                register_op_strategy)
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from galvatron_fx import attention  # noqa: F401 (its ops and their rules)

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


def _mask_placement(op_schema: OpSchema, q_index: int, d: int) -> list[Placement]:
    """An ``attn_mask``'s placement when q is sharded on ``d`` (none: no mask)."""
    mask = op_schema.kwargs_schema.get("attn_mask")
    if not isinstance(mask, OpStrategy):
        return []
    keep = len(mask.shape) == 4 and mask.shape[d] == op_schema.args_schema[q_index].shape[d]
    return [Shard(d) if keep else Replicate()]


@register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default,
                      schema_info=RuntimeSchemaInfo(3, static_kwargkey=["scale"]))
def _cpu_flash_attention(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args()
    # [out, logsumexp, q, k, v, (attn_mask)]
    strategies = [[Replicate()] * 5 + ([Replicate()] if _mask_placement(op_schema, 0, 1) else [])]
    for d in (1, 0):
        strategies.append([Shard(d)] * 5 + _mask_placement(op_schema, 0, d))
    return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)


@register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                      schema_info=RuntimeSchemaInfo(6, static_kwargkey=["scale"]))
def _cpu_flash_attention_backward(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args(validate=False)
    # [grad_q, grad_k, grad_v, grad_out, q, k, v, out, logsumexp, (attn_mask)]
    strategies = [[Replicate()] * 9 + ([Replicate()] if _mask_placement(op_schema, 1, 1) else [])]
    for d in (1, 0):
        strategies.append([Shard(d)] * 9 + _mask_placement(op_schema, 1, d))
    return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=3)
