"""Vocab-parallel cross-entropy: log-softmax and the picked log-probability on class-sharded logits.

A tensor-parallel head leaves the logits ``(N, V)`` sharded on the vocabulary (``Shard(1)`` on
the tp axis: each rank holds ``V/tp`` classes). Gathering them whole costs an all-gather of
``N·V`` values and every rank then computes the whole loss; Megatron's vocab-parallel
cross-entropy instead reduces only per-row scalars across tp:

- ``_log_softmax`` (class dim sharded): the row max and the row sum of ``exp`` are all-reduced
  (max, sum: ``2·N`` values), the result stays class-sharded; its backward
  ``g − exp(out)·Σ_class g`` all-reduces ``Σ_class g`` (``N`` values).
- ``nll_loss_forward`` (class dim sharded, no class weights): each rank picks the target's
  log-probability where the target falls in its range of classes (0 elsewhere); one all-reduce
  of ``N`` values makes them whole. A mean divides by the *global* count of non-ignored targets
  (all-reduced over the batch-sharded axes), so that the loss is the one-process mean even when
  ranks hold different numbers of ignored targets; the result is ``Partial`` on those axes.
  Its backward scatters ``-g`` (over the count for a mean) at the picked classes.

This module is the one place that knows it: :func:`extra_strategies` and :func:`collectives`
give the intra-layer solver the class-sharded strategies and their in-op collectives (priced like
any other), and :func:`run` executes them on the runtime's ``(dp, tp)`` DTensors — as autograd
functions on the local shards with functional collectives, so the lowered (traced) layers keep
them too. The same ops with the class dim whole run through DTensor's own rules.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

aten = torch.ops.aten
R = Replicate()


# ---- what the solver sees -----------------------------------------------------------------------

def _val(a) -> torch.Tensor | None:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _class_dim(node: fx.Node) -> int | None:
    """The class dim of a vocab-parallel candidate node, or None when the node is not one."""
    if node.target is aten._log_softmax.default:
        x = _val(node.args[0])
        return None if x is None or x.ndim == 0 else cast(int, node.args[1]) % x.ndim
    if node.target is aten.nll_loss_forward.default:
        x = _val(node.args[0])
        weight = node.args[2] if len(node.args) > 2 else None
        return 1 if x is not None and x.ndim == 2 and weight is None else None
    return None


def extra_strategies(node: fx.Node, tp: int) -> list[tuple[tuple[Placement | None, ...], tuple[Placement | None, ...]]]:
    """``(input placements, output placements)`` on the tp axis of the class-sharded strategy of
    ``node`` (a log-softmax or an NLL loss whose class dim ``tp`` divides); empty otherwise."""
    d = _class_dim(node)
    if d is None:
        return []
    x = cast(torch.Tensor, _val(node.args[0]))  # a class dim implies a tensor value
    if x.shape[d] % tp != 0 or x.shape[d] < tp:
        return []
    if node.target is aten._log_softmax.default:
        return [((Shard(d),), (Shard(d),))]
    return [((Shard(1), R), (R, R))]  # (logits, target) -> (loss, total weight)


def is_class_sharded(node: fx.Node, inputs: tuple[Placement | None, ...]) -> bool:
    """Whether ``inputs`` (the planned tp placements of ``node``'s tensor inputs) shard its class dim."""
    d = _class_dim(node)
    return d is not None and bool(inputs) and isinstance(inputs[0], Shard) and inputs[0].dim == d


def runs(node: fx.Node, inputs: tuple[Placement | None, ...], args: tuple) -> bool:
    """Whether :func:`run` executes ``node`` (its DTensor ``args`` laid out as planned, ``inputs``
    their tp placements): a class-sharded strategy, or an NLL mean whose rows are split over a
    mesh axis (DTensor's rule averages the ranks' means, which is not the mean of all targets
    when ranks hold different numbers of ignored ones)."""
    if is_class_sharded(node, inputs):
        return True
    if node.target is not aten.nll_loss_forward.default or _class_dim(node) is None or args[3] != 1:
        return False
    x = args[0]
    return isinstance(x, DTensor) and any(isinstance(p, Shard) and p.dim == 0 and x.device_mesh.size(i) > 1
                                          for i, p in enumerate(x.placements))


def collectives(node: fx.Node, inputs: tuple[Placement | None, ...]) -> list[tuple[str, str, int]]:
    """The all-reduces over tp a class-sharded strategy performs inside ``node``:
    ``(direction, collective, bytes)`` at the captured batch (every one grows with the rows)."""
    if not is_class_sharded(node, inputs):
        return []
    x = cast(torch.Tensor, _val(node.args[0]))  # class-sharded: a tensor value with a class dim
    d = cast(int, _class_dim(node))
    row_bytes = x.numel() // x.shape[d] * 4  # per-row scalars, reduced in fp32 or the logits' dtype
    if node.target is aten._log_softmax.default:
        return [("fwd", "all_reduce", row_bytes), ("fwd", "all_reduce", row_bytes), ("bwd", "all_reduce", row_bytes)]
    return [("fwd", "all_reduce", row_bytes)]


# ---- what the runtime runs ----------------------------------------------------------------------

def _all_reduce(t: torch.Tensor, op: str, mesh, axis: int, *, wait: bool = True) -> torch.Tensor:
    """``t`` all-reduced over mesh axis ``axis``; ``wait=False``: launched, waited for where
    first read (eagerly; a traced graph waits where the ``wait_tensor`` node sits)."""
    out = funcol.all_reduce(t, reduceOp=op, group=(mesh, axis))
    return funcol.wait_tensor(out) if wait and isinstance(out, funcol.AsyncCollectiveTensor) else out


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


class _LogSoftmax(torch.autograd.Function):
    """``log_softmax`` over a class dim sharded on mesh axis ``axis`` (see module doc)."""

    @staticmethod
    def forward(ctx, x: DTensor, dim: int, half_to_float: bool, axis: int) -> DTensor:
        mesh, local = x.device_mesh, x._local_tensor
        comp = local.to(_compute_dtype(local))
        row_max = _all_reduce(comp.amax(dim, keepdim=True), "max", mesh, axis)  # (N, 1)
        shifted = comp - row_max
        sum_exp = _all_reduce(shifted.exp().sum(dim, keepdim=True), "sum", mesh, axis)
        out = shifted - sum_exp.log()
        out = out if half_to_float else out.to(local.dtype)
        ctx.save_for_backward(out)
        ctx.dim, ctx.axis, ctx.in_dtype = dim, axis, local.dtype
        ctx.x = (mesh, x.placements, x.shape, x.stride())
        return DTensor.from_local(out, mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())

    @staticmethod
    def backward(ctx, g: DTensor):
        (out,) = ctx.saved_tensors
        mesh, placements, shape, stride = ctx.x
        if tuple(g.placements) != tuple(placements):
            g = g.redistribute(mesh, placements)
        gl = g._local_tensor.to(_compute_dtype(out))
        row_sum = _all_reduce(gl.sum(ctx.dim, keepdim=True), "sum", mesh, ctx.axis)
        grad = (gl - out.to(gl.dtype).exp() * row_sum).to(ctx.in_dtype)
        return DTensor.from_local(grad, mesh, placements, run_check=False, shape=shape, stride=stride), None, None, None


class _NllLoss(torch.autograd.Function):
    """``nll_loss_forward`` on ``(N, V)`` log-probabilities whose classes are sharded on mesh axis
    ``axis``, targets ``(N,)`` laid out like the rows (see module doc)."""

    @staticmethod
    def forward(ctx, x: DTensor, target: DTensor, reduction: int, ignore_index: int, axis: int):
        mesh, local, t = x.device_mesh, x._local_tensor, target._local_tensor
        sharded = isinstance(x.placements[axis], Shard) and cast(Shard, x.placements[axis]).dim == 1
        valid = t != ignore_index
        rows = [i for i, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim == 0 and mesh.size(i) > 1]
        count = valid.sum().to(local.dtype)
        for i in rows:  # the global number of counted targets, launched first: it overlaps the pick
            count = _all_reduce(count, "sum", mesh, i, wait=i != rows[-1])
        width = local.shape[1]
        lo = mesh.get_local_rank(axis) * width if sharded else 0  # this rank's first class
        mine = valid & (t >= lo) & (t < lo + width)
        idx = torch.where(mine, t - lo, 0)
        picked = torch.where(mine, local.gather(1, idx.unsqueeze(1)).squeeze(1), 0)
        per_row = -_all_reduce(picked, "sum", mesh, axis) if sharded else -picked  # (N,): 0 where ignored
        if isinstance(count, funcol.AsyncCollectiveTensor):
            count = funcol.wait_tensor(count)
        whole = tuple(R for _ in x.placements)
        if reduction == 0:  # none
            out = per_row
            out_placements = tuple(R if i == axis else p for i, p in enumerate(x.placements))
            out_shape, out_stride = target.shape, target.stride()
        else:
            out = per_row.sum() / count if reduction == 1 else per_row.sum()
            out_placements = tuple(Partial() if i in rows else R for i in range(mesh.ndim))
            out_shape, out_stride = torch.Size(()), ()
        ctx.save_for_backward(idx, mine, count)
        ctx.meta = (mesh, x.placements, x.shape, x.stride(), local.shape, local.dtype, reduction, out_placements)
        total = DTensor.from_local(count, mesh, whole, run_check=False, shape=torch.Size(()), stride=())
        ctx.mark_non_differentiable(total)
        return DTensor.from_local(out, mesh, out_placements, run_check=False, shape=out_shape, stride=out_stride), total

    @staticmethod
    def backward(ctx, g: DTensor, _g_total):
        idx, mine, count = ctx.saved_tensors
        mesh, placements, shape, stride, local_shape, dtype, reduction, out_placements = ctx.meta
        want = out_placements if reduction == 0 else tuple(R for _ in out_placements)
        want = tuple(R if isinstance(p, Partial) else p for p in want)
        if tuple(g.placements) != want:
            g = g.redistribute(mesh, want)
        gl = g._local_tensor.to(dtype)
        scale = -gl / count if reduction == 1 else -gl
        scale = scale.expand(idx.shape) if scale.ndim == 0 else scale
        grad = torch.zeros(local_shape, dtype=dtype, device=gl.device)
        grad.scatter_(1, idx.unsqueeze(1), torch.where(mine, scale, 0).unsqueeze(1))
        return DTensor.from_local(grad, mesh, placements, run_check=False, shape=shape, stride=stride), None, None, None, None


def run(node: fx.Node, args: tuple, kwargs: dict, axis: int):
    """Run ``node`` (where :func:`runs`) on DTensors laid out as planned (``axis``: the tp axis
    of their mesh)."""
    if node.target is aten._log_softmax.default:
        x, dim, half_to_float = args
        return _LogSoftmax.apply(x, dim % x.ndim, half_to_float, axis)
    x, target, _weight, reduction, ignore_index = args
    if not isinstance(target, DTensor):
        raise AssertionError(f"{node.format_node()}: the target must be a DTensor laid out like the rows")
    # the targets laid out like the rows (a target made whole from a factory, CLIP's arange of the
    # batch, is sliced: no collective)
    rows = tuple(Shard(0) if isinstance(p, Shard) and p.dim == 0 else R for p in x.placements)
    if tuple(target.placements) != rows:
        target = target.redistribute(x.device_mesh, rows)
    return _NllLoss.apply(x, target, reduction, ignore_index, axis)
