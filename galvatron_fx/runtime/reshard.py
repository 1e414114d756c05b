"""``reshard`` — move a DTensor to another layout on another mesh over the same ranks, with autograd.

Contract: ``reshard(x, dst_mesh, dst_placements)`` takes a DTensor ``x`` on mesh ``A`` and returns
a DTensor with the same global value on mesh ``B`` laid out as ``dst_placements``. ``A`` and ``B``
cover the same ranks and may factor them differently (``(dp2, tp2) -> (dp1, tp4) -> (dp4, tp1)``).
Gradients flow back to ``x`` in ``x``'s layout. On one mesh it is DTensor's own ``redistribute``.

Terms: a rank's *block* of a layout is the index box (per tensor dim, ``start:stop``) its local
tensor holds; placements are applied in mesh-axis order, each ``Shard(d)`` splitting the current
block of dim ``d`` evenly (DTensor's order). Uneven shards are refused (the planner only makes even
ones).

Algorithm (correctness first; gloo has all-gather but no fast all-to-all): a ``Partial`` source is
first reduced on its own mesh (DTensor's ``redistribute`` to ``Replicate``). Forward: all-gather
every rank's local block over the ranks of the mesh, assemble the full tensor, keep the own
destination block. Backward, the dual: the incoming grad is brought to the forward output's
layout (``from_local``'s backward does this, reducing a ``Partial`` grad), all-gathered, assembled
and sliced to the source block. Replicated blocks carry equal values, so overlaps are consistent.
``torch.distributed.nn.functional`` is not used: its autograd collectives fail on sub-groups.

Cost: every rank receives the whole tensor once per direction — fine for activations at the
transition between two layers; an all-to-all (NCCL) version is a later optimisation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

log = logging.getLogger(__name__)

__all__ = ["block_of", "reshard"]

_GROUPS: dict[tuple[int, ...], object] = {}


def block_of(shape: Sequence[int], mesh: DeviceMesh, placements: Sequence[Placement], rank: int) -> tuple[slice, ...]:
    """The index box of ``rank``'s local tensor of a ``shape`` tensor laid out as ``placements``."""
    coords = (mesh.mesh == rank).nonzero()
    assert coords.shape[0] == 1, f"rank {rank} is not in mesh {mesh.mesh.tolist()}"
    coord = coords[0].tolist()
    start, size = [0] * len(shape), list(shape)
    for axis, p in enumerate(placements):
        if isinstance(p, Shard):
            n = mesh.size(axis)
            assert size[p.dim] % n == 0, f"uneven shard of dim {p.dim} ({size[p.dim]} over {n}) of {tuple(shape)}"
            size[p.dim] //= n
            start[p.dim] += coord[axis] * size[p.dim]
        else:
            assert isinstance(p, Replicate), f"block_of needs Shard/Replicate placements, got {p}"
    return tuple(slice(a, a + s) for a, s in zip(start, size))


def _group(ranks: tuple[int, ...]):
    if ranks == tuple(range(dist.get_world_size())):
        return dist.group.WORLD
    if ranks not in _GROUPS:  # only the members create it (a pipeline stage reshards on its own ranks)
        _GROUPS[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)
    return _GROUPS[ranks]


def _move(local: torch.Tensor, shape: torch.Size, src: tuple[DeviceMesh, tuple], dst: tuple[DeviceMesh, tuple]) -> torch.Tensor:
    """Own block under ``dst`` from own block under ``src`` (all-gather over the mesh's ranks)."""
    src_mesh, src_pl = src
    dst_mesh, dst_pl = dst
    ranks = tuple(sorted(src_mesh.mesh.flatten().tolist()))
    me = dist.get_rank()
    local = local.contiguous()
    pieces = [torch.empty_like(local) for _ in ranks]
    dist.all_gather(pieces, local, group=_group(ranks))
    full = local.new_empty(shape)  # (the global shape)
    for r, piece in zip(ranks, pieces):
        full[block_of(shape, src_mesh, src_pl, r)] = piece
    return full[block_of(shape, dst_mesh, dst_pl, me)].contiguous()


class _Reshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, shape, src, dst):
        ctx.shape, ctx.src, ctx.dst = shape, src, dst
        return _move(local, shape, src, dst)

    @staticmethod
    def backward(ctx, grad):
        return _move(grad, ctx.shape, ctx.dst, ctx.src), None, None, None


def _same_mesh(a: DeviceMesh, b: DeviceMesh) -> bool:
    return a is b or (a.mesh.shape == b.mesh.shape and torch.equal(a.mesh, b.mesh))


def reshard(x: DTensor, dst_mesh: DeviceMesh, dst_placements: Sequence[Placement]) -> DTensor:
    """``x`` on ``dst_mesh`` laid out as ``dst_placements``; differentiable (see module doc)."""
    dst_pl = tuple(dst_placements)
    assert not any(isinstance(p, Partial) for p in dst_pl), f"reshard cannot target Partial: {dst_pl}"
    src_mesh = x.device_mesh
    if _same_mesh(src_mesh, dst_mesh):
        return x if tuple(x.placements) == dst_pl else x.redistribute(src_mesh, dst_pl)
    assert set(src_mesh.mesh.flatten().tolist()) == set(dst_mesh.mesh.flatten().tolist()), \
        f"reshard across meshes over different ranks: {src_mesh.mesh.tolist()} -> {dst_mesh.mesh.tolist()}"
    if any(isinstance(p, Partial) for p in x.placements):  # reduce on the source mesh first
        x = x.redistribute(src_mesh, [Replicate() if isinstance(p, Partial) else p for p in x.placements])
    src = (src_mesh, tuple(x.placements))
    local = x.to_local(grad_placements=src[1])
    out = _Reshard.apply(local, x.shape, src, (dst_mesh, dst_pl))
    return DTensor.from_local(out, dst_mesh, dst_pl, run_check=False, shape=x.shape, stride=x.stride())
