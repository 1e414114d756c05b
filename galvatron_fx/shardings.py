"""DTensor sharding rules galvatron_fx adds for ops that DTensor has none for.

Registered through DTensor's own API when this module is imported, so that the placement
solver (which reads DTensor's strategy tables) and the runtime (which dispatches DTensors) see
one set. The CPU flash-attention kernels' rules, which need the runtime's mesh conventions, live
with the executor (``runtime.layer_exec.register_cpu_flash_attention_rules``); those of
attention with a trained bias with its op (``galvatron_fx.attention``, imported here).

- ``aten.lift_fresh_copy``: the copy export makes of a tensor constant built in a forward
  (``torch.tensor([...])`` in T5's relative-position buckets); its output follows its input,
  as ``clone``'s does.
- ``aten.fill_.Tensor`` (``x[..., 0] = start_token``, a 0-dim tensor value): ``self`` keeps
  its placement (a partial one is replicated first: a filled value must not be summed), the
  value is replicated.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops._tensor_ops import propagate_single_input_strategy
from torch.distributed.tensor._ops.utils import generate_redistribute_costs, register_op_strategy
from torch.distributed.tensor.placement_types import Partial, Replicate

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
