"""Autograd functions that move a layer's values between layouts without a collective where the
plan says so: a local ``R | S(d) -> P`` on tp (:func:`_to_partial`), a gradient summed or kept
in its layout (:class:`_GradInLayout`), a local shard as a DTensor (:class:`_AsDTensor`), and a
dp-replicated value moved on tp whose gradient stays a sum over dp (:func:`_move_on_tp`).

Terms: *storage* placement of a parameter — the plan's placeholder placement on tp, never
``Partial`` (:func:`_storage`); see :mod:`galvatron_fx.passes.apply_placements`.
"""

from __future__ import annotations

from typing import cast

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

R = Replicate()


def _storage(p: Placement) -> Placement:
    """A parameter is never stored partial: a planned ``P`` is stored replicated."""
    return R if isinstance(p, Partial) else p


def _to_partial(v: DTensor, mesh: DeviceMesh) -> DTensor:
    """``(dp, R | S(d)) -> (dp, P)`` on the tp axis: a local step (DTensor's ``redistribute``
    refuses targets that are ``Partial``). Rank 0 of the tp group keeps a replicated value, the
    others hold zeros; a shard is zero-padded to its full extent. Backward: a replicated input
    receives a partial gradient, a sharded input the slice of the (tp-replicated) gradient; the
    gradient's dp placement is passed through as it comes (a dp-``Partial`` grad stays partial,
    so FSDP can reduce-scatter it and DDP all-reduces it once, in ``sync_grads``)."""
    return _ToPartial.apply(v, mesh)


class _ToPartial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: DTensor, mesh: DeviceMesh) -> DTensor:
        dp_p, tp_p = v.placements
        coord = mesh.get_local_rank("tp")
        tp = mesh.size(1)
        local = v._local_tensor
        ctx.mesh, ctx.tp_p, ctx.coord, ctx.shape, ctx.stride = mesh, tp_p, coord, v.shape, v.stride()
        if isinstance(tp_p, Replicate):
            local = local if coord == 0 else torch.zeros_like(local)
        else:
            assert isinstance(tp_p, Shard), f"cannot make {v.placements} partial"
            d = tp_p.dim
            # (dp, tp) order: tp splits the dp-local block, so the padded extent is the dp-local one
            chunk = local.shape[d]
            dp_extent = v.shape[d] // mesh.size(0) if isinstance(dp_p, Shard) and dp_p.dim == d else v.shape[d]
            assert chunk * tp == dp_extent, f"uneven tp shard of dim {d}: {tuple(v.shape)} on {v.placements}"
            pad = [0, 0] * (local.ndim - 1 - d) + [coord * chunk, (tp - 1 - coord) * chunk]
            local = torch.nn.functional.pad(local, pad)
            ctx.chunk = chunk
        return DTensor.from_local(local, mesh, (dp_p, Partial()), run_check=False, shape=v.shape, stride=v.stride())

    @staticmethod
    def backward(ctx, g: DTensor):
        mesh, tp_p, coord = ctx.mesh, ctx.tp_p, ctx.coord
        g_dp = g.placements[0]
        if not isinstance(g.placements[1], Replicate):
            g = g.redistribute(mesh, (g_dp, R))
        local = g._local_tensor
        if isinstance(tp_p, Replicate):
            local, tp_g = (local if coord == 0 else torch.zeros_like(local)), Partial()
        else:
            local, tp_g = local.narrow(tp_p.dim, coord * ctx.chunk, ctx.chunk), tp_p
        grad = DTensor.from_local(local.contiguous(), mesh, (g_dp, tp_g), run_check=False,
                                  shape=ctx.shape, stride=ctx.stride)
        return grad, None


def _sum_grad_here(x: DTensor) -> DTensor:
    """``x``, whose gradient is summed over tp where ``x`` is made (see :class:`_GradInLayout`)."""
    if not x.requires_grad or x.placements[1].is_partial():
        return x
    return _GradInLayout.apply(x)


class _GradInLayout(torch.autograd.Function):
    """Identity on a layer's value; its gradient, when it arrives partial over tp, is brought to
    the value's own tp placement: the partial sums of a value's gradient are reduced once, where
    the value is made (Megatron's rule, and what the intra-layer ILP charges). Left alone, DTensor
    carries a partial gradient on through the backward kernels before it, which costs more
    collectives (a reduce-scatter and later gathers, and an all-reduce per replicated weight such
    as a norm's)."""

    @staticmethod
    def forward(ctx, x: DTensor) -> DTensor:
        ctx.mesh, ctx.tp = x.device_mesh, x.placements[1]
        return DTensor.from_local(x._local_tensor, x.device_mesh, x.placements, run_check=False,
                                  shape=x.shape, stride=x.stride())

    @staticmethod
    def backward(ctx, g: DTensor) -> DTensor:
        if isinstance(g, DTensor) and g.placements[1].is_partial():
            g = g.redistribute(ctx.mesh, (g.placements[0], ctx.tp))
        return g


def _grad_together(outs: list) -> list:
    """The DTensor outputs of one op (a split) as :class:`_GradInLayout` treats one value, with a
    zero gradient (a DTensor) for those no later op reads: autograd's own would be a plain
    tensor, which the op's backward (a ``cat``) refuses to mix with DTensors."""
    idx = [i for i, o in enumerate(outs) if isinstance(o, DTensor) and o.requires_grad]
    if not idx:
        return outs
    got = _GradTogether.apply(*(outs[i] for i in idx))
    outs = list(outs)
    for i, o in zip(idx, got):
        outs[i] = o
    return outs


class _GradTogether(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *xs: DTensor):
        ctx.set_materialize_grads(False)
        ctx.specs = [(x.device_mesh, x.placements, x.shape, x.stride(), x._local_tensor.shape, x.dtype) for x in xs]
        return tuple(DTensor.from_local(x._local_tensor, x.device_mesh, x.placements, run_check=False,
                                        shape=x.shape, stride=x.stride()) for x in xs)

    @staticmethod
    def backward(ctx, *gs):
        out = []
        for g, (mesh, placements, shape, stride, local_shape, dtype) in zip(gs, ctx.specs):
            if g is None:
                zeros = torch.zeros(local_shape, dtype=dtype, device=_local_device(mesh))
                g = DTensor.from_local(zeros, mesh, tuple(R if p.is_partial() else p for p in placements),
                                       run_check=False, shape=shape, stride=stride)
            elif isinstance(g, DTensor) and g.placements[-1].is_partial() and not placements[-1].is_partial():
                g = g.redistribute(mesh, (*g.placements[:-1], placements[-1]))
            out.append(g)
        return tuple(out)


def _local_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())


class _AsDTensor(torch.autograd.Function):
    """A local parameter shard read as its ``(Replicate, tp_p)`` DTensor. Backward returns a
    plain local gradient in the storage layout whose *sum over dp* is the gradient: the tp
    placement is redistributed to ``tp_p`` (a tp-``Partial`` grad under sequence parallelism is
    all-reduced over tp here), and a dp-``Replicate`` or ``Partial(avg)`` grad is divided by dp
    so that one all-reduce (sum) over dp finishes it."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, mesh: DeviceMesh, tp_p: Placement, shape, stride) -> DTensor:
        ctx.mesh, ctx.tp_p = mesh, tp_p
        return DTensor.from_local(local, mesh, (R, tp_p), run_check=False, shape=shape, stride=stride)

    @staticmethod
    def backward(ctx, g: DTensor):
        dp_p, tp_g = g.placements
        if tp_g != ctx.tp_p:
            g = g.redistribute(ctx.mesh, (dp_p, ctx.tp_p))
        local = g._local_tensor
        if isinstance(dp_p, Replicate) or (isinstance(dp_p, Partial) and dp_p.reduce_op == "avg"):
            local = local / ctx.mesh.size(0)
        return local, None, None, None, None


def _move_on_tp(v: DTensor, mesh: DeviceMesh, tp_dst: Placement) -> DTensor:
    """``v`` (replicated on dp) redistributed to ``tp_dst`` on tp; its gradient comes back in
    ``v``'s tp placement with its dp placement as it arrives (see :class:`_MoveOnTp`)."""
    return _MoveOnTp.apply(v, mesh, tp_dst)


class _MoveOnTp(torch.autograd.Function):
    """DTensor's own backward of a redistribute brings the gradient to the *source* placements:
    a dp-``Replicate`` source (a parameter, stored whole on dp) makes the dp-``Partial``
    gradient of a batch-sharded reader all-reduced over dp right there, in the layer's backward,
    and the data-parallel sync of the step sums it again. Here only the tp placement is moved
    back; a dp-``Partial`` gradient stays partial for the one data-parallel sum the plan prices
    (DDP's buckets, FSDP's reduce-scatter)."""

    @staticmethod
    def forward(ctx, v: DTensor, mesh: DeviceMesh, tp_dst: Placement) -> DTensor:
        ctx.mesh, ctx.tp_src = mesh, v.placements[1]
        return cast(DTensor, v.detach()).redistribute(mesh, (v.placements[0], tp_dst))

    @staticmethod
    def backward(ctx, g: DTensor):
        # (a partial source takes the gradient as it comes: each partial term's gradient is the whole)
        if isinstance(g, DTensor) and g.placements[1] != ctx.tp_src and not ctx.tp_src.is_partial():
            g = g.redistribute(ctx.mesh, (g.placements[0], ctx.tp_src))
        return g, None, None
