"""The one owner of this process's device meshes.

Contract: :func:`owner` is the :class:`MeshOwner` of the current world process group (one per
group, made on first use; a new group — a test's next world, an elastic restart — gets its own).
It builds each mesh once and hands the same object to every module that asks: a ``(dp, tp)``
mesh over one stage's ranks (:meth:`MeshOwner.layer_mesh`), and a pipeline's ``(pp, dp, tp)``
layout with its stage submeshes and pipeline group (:meth:`MeshOwner.pipeline`). Meshes must
outlive the modules that use them: a re-plan builds a new module on the same ranks, and new
meshes would create new process groups (which NCCL and gloo allocate for good), while DTensor's
sharding cache may hand back an earlier, equal mesh anyway. Axis names come from
:class:`~galvatron_fx.ir.strategy.Axis`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from galvatron_fx.errors import PlanError
from galvatron_fx.ir.strategy import LAYER_MESH_DIMS, Axis

__all__ = ["MeshOwner", "device_type", "owner"]


def device_type() -> str:
    """The meshes' device type: ``cuda`` under NCCL with GPUs, else ``cpu`` (gloo)."""
    return "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"


@dataclass(eq=False)
class MeshOwner:
    """Every mesh made in this process for one world group (see module doc)."""

    world: object = None  # the group (held: its id keys the owner, and must not be reused)
    _layer: dict[tuple, DeviceMesh] = field(default_factory=dict)  # (ranks, dp, tp) -> mesh
    # (stage ranks, dp, tp) -> (stage submesh of the (pp, dp, tp) mesh, pp group)
    _pipeline: dict[tuple, tuple[DeviceMesh, dist.ProcessGroup]] = field(default_factory=dict)

    def layer_mesh(self, ranks: tuple[int, ...], dp: int, tp: int) -> DeviceMesh:
        """The ``(dp, tp)`` mesh over ``ranks`` (a stage's, in the plan's order)."""
        if dp * tp != len(ranks):
            raise PlanError(f"a layer's dp={dp} × tp={tp} does not cover the stage's {len(ranks)} ranks")
        key = (tuple(ranks), dp, tp)
        if key not in self._layer:
            names = tuple(str(a) for a in LAYER_MESH_DIMS)
            if tuple(ranks) == tuple(range(dist.get_world_size())):
                self._layer[key] = init_device_mesh(device_type(), (dp, tp), mesh_dim_names=names)
            else:
                self._layer[key] = DeviceMesh(device_type(), torch.tensor(ranks).view(dp, tp), mesh_dim_names=names)
        return self._layer[key]

    def pipeline(self, stage_ranks: tuple[tuple[int, ...], ...], dp: int, tp: int) -> tuple[DeviceMesh, dist.ProcessGroup]:
        """This rank's stage's ``(dp, tp)`` submesh of the ``(pp, dp, tp)`` mesh whose stages hold
        ``stage_ranks``, and the ``pp`` group through this rank."""
        key = (tuple(map(tuple, stage_ranks)), dp, tp)
        if key not in self._pipeline:
            layout = torch.tensor(stage_ranks, dtype=torch.int64).reshape(len(stage_ranks), dp, tp)
            mesh = DeviceMesh(device_type(), layout, mesh_dim_names=(str(Axis.PP), str(Axis.DP), str(Axis.TP)))
            self._pipeline[key] = (mesh[str(Axis.DP), str(Axis.TP)], mesh[str(Axis.PP)].get_group())
        return self._pipeline[key]


_OWNERS: dict[int, MeshOwner] = {}  # id(world group) -> its owner


def owner() -> MeshOwner:
    """The mesh owner of the current world process group."""
    world = dist.group.WORLD
    return _OWNERS.setdefault(id(world), MeshOwner(world=world))
