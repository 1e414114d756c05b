"""Attention with a bias that is trained (T5's relative position bias): one op forward, one back.

PyTorch's CPU flash-attention kernel takes a mask but is not differentiable in it; with a mask
that requires grad, SDPA falls back to its math path, whose batched matmuls flatten
``(batch, heads)`` into one dim, so that neither can stay sharded (tensor parallelism loses its
heads split; data and tensor parallelism together make a strided shard DTensor's ``bmm`` rule
cannot take). ``galvatron_fx::biased_attention`` keeps the attention one op:

- forward: the flash kernel with the bias as its mask (output and log-sum-exp);
- backward (``galvatron_fx::biased_attention_backward``): the flash kernel's backward for q, k,
  v and, for the bias, ``dS = P ∘ (dP − rowsum(dO ∘ O))`` with ``P = exp(s·qkᵀ + bias − lse)``
  and ``dP = dO·vᵀ``, summed over the dims the bias broadcasts.

Both ops have fake kernels and DTensor rules (batch- or heads-sharded; the bias follows q on the
sharded dim where it has its size; a bias broadcast over the sharded dim gets a partial
gradient), and the forward has a FLOP formula, so that the solver, cost counting and the runtime
see one node. :func:`sdpa_or_biased` is what a captured graph's ``scaled_dot_product_attention``
runs as when its mask requires grad.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy
from torch.distributed.tensor.placement_types import Placement
from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten
R = Replicate()


@torch.library.custom_op("galvatron_fx::biased_attention", mutates_args=())
def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(scale·q·kᵀ + bias)·v`` and its log-sum-exp, for (B, H, T, D) q, k, v and a bias
    that broadcasts to (B, H, T, T)."""
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)
    return out, lse


@biased_attention.register_fake
def _(q, k, v, bias, scale):
    b, h, t, _ = q.shape
    # the kernel lays its output out in q's dim order: q from (B, T, H, D) transposed gives an
    # output whose merge back to (B, T, H·D) is a view (no copy to count, as in a real run)
    order = sorted(range(4), key=lambda d: -q.stride(d))
    shape = (b, h, t, v.shape[-1])
    out = q.new_empty([shape[d] for d in order]).permute([order.index(d) for d in range(4)])
    return out, q.new_empty((b, h, t), dtype=torch.float32)


@torch.library.custom_op("galvatron_fx::biased_attention_backward", mutates_args=())
def biased_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              bias: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`biased_attention` for q, k, v and the bias (in the bias's shape)."""
    mask = bias.to(q.dtype)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out.contiguous(), q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale + mask  # (B, H, T, T)
    p = torch.exp(scores - lse.unsqueeze(-1).to(scores.dtype))
    dp = torch.matmul(grad_out, v.transpose(-2, -1))
    ds = p * (dp - (grad_out * out).sum(-1, keepdim=True))
    dims = [d for d in range(4) if bias.shape[d] == 1 and ds.shape[d] != 1]
    dbias = ds.sum(dims, keepdim=True) if dims else ds  # (an empty list would sum every dim)
    return dq, dk, dv, dbias.to(bias.dtype)


@biased_attention_backward.register_fake
def _(grad_out, q, k, v, bias, out, lse, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(bias)


def _setup(ctx, inputs, output):
    q, k, v, bias, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, bias, out, lse)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, bias, out, lse = ctx.saved_tensors
    dq, dk, dv, dbias = biased_attention_backward(grad_out, q, k, v, bias, out, lse, ctx.scale)
    return dq, dk, dv, dbias, None


biased_attention.register_autograd(_backward, setup_context=_setup)


@register_flop_formula(torch.ops.galvatron_fx.biased_attention)
def _fwd_flops(q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


@register_flop_formula(torch.ops.galvatron_fx.biased_attention_backward)
def _bwd_flops(grad_out_shape, q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    # the kernel's backward, plus recomputing the scores and the bias gradient's two matmuls
    return sdpa_backward_flop_count(grad_out_shape, q_shape, k_shape, v_shape) + sdpa_flop_count(q_shape, k_shape,
                                                                                                 v_shape)


def sdpa_or_biased(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``aten.scaled_dot_product_attention`` as a captured graph calls it: through
    :func:`biased_attention` when the mask is a floating bias that requires grad (and nothing
    else is asked of the kernel), else as it is."""
    if isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad and attn_mask.is_floating_point() \
            and attn_mask.ndim == 4 and q.ndim == 4 and dropout_p == 0.0 and not is_causal and not enable_gqa \
            and k.shape[1] == q.shape[1]:
        s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return torch.ops.galvatron_fx.biased_attention(q, k, v, attn_mask, s)[0]
    return aten.scaled_dot_product_attention.default(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                                      enable_gqa=enable_gqa)


# ---- DTensor rules ------------------------------------------------------------------------------

def _bias_follows(op_schema: OpSchema, q_index: int, bias_index: int, d: int) -> list[Placement | None]:
    q, bias = cast(OpStrategy, op_schema.args_schema[q_index]), cast(OpStrategy, op_schema.args_schema[bias_index])
    return [Shard(d) if bias.shape[d] == q.shape[d] else R]


@register_op_strategy(torch.ops.galvatron_fx.biased_attention.default, schema_info=RuntimeSchemaInfo(4))
def _fwd_strategy(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args()
    # [out, lse, q, k, v, bias]
    strategies: list[list[Placement | None]] = [[R] * 6]
    for d in (1, 0):
        strategies.append([Shard(d)] * 5 + _bias_follows(op_schema, 0, 3, d))
    return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)


@register_op_strategy(torch.ops.galvatron_fx.biased_attention_backward.default, schema_info=RuntimeSchemaInfo(7))
def _bwd_strategy(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args(validate=False)
    # [dq, dk, dv, dbias, grad_out, q, k, v, bias, out, lse]
    strategies: list[list[Placement | None]] = [[R] * 11]
    for d in (1, 0):
        bias = _bias_follows(op_schema, 1, 4, d)
        dbias = bias if isinstance(bias[0], Shard) else [Partial()]  # summed over the sharded dim
        strategies.append([Shard(d)] * 3 + dbias + [Shard(d)] * 4 + bias + [Shard(d)] * 2)
    return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=4)
