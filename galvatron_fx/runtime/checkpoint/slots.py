"""Bodies and slots: the stored copies of a module's parameters on this rank, as a checkpoint
reads and writes them (:mod:`galvatron_fx.runtime.checkpoint.state`).

Terms: a *body* is one :class:`ParallelModule` on this rank: the module itself, or each pipeline
chunk's (a rank of a pipelined plan holds one body per chunk of its stage, and only those
parameters). A *slot* is one stored copy of a parameter, ``(executor, key)``; a tied weight read
by two layers has two slots under one FQN (the user's name, ``ex.fqn_of_key[key]``), each in its
own layout, kept equal; under a pipeline the two may sit on different stages. A slot's ``copy``
numbers the slots of its FQN on this rank (0, 1, ...); its ``layer`` is the global index of its
executor's layer. The *owner* of an FQN is its slot at the lowest layer over all ranks: the one
saved. The *layout* of a slot is DTensor's: an FSDP (ZeRO-2/3) parameter is a DTensor sharded over
dp (``Shard(0)`` or ``_StridedShard(0)``) and as planned over tp; a local parameter is this
rank's shard of ``(Replicate on dp, tp placement)``, viewed as a DTensor with
``DTensor.from_local(..., shape=, stride=)`` over the same storage, on its body's (stage's) mesh.

Contract: the helpers take a :class:`~galvatron_fx.runtime.parallel_module.ParallelModule`, a
:class:`~galvatron_fx.runtime.pipeline.PipelineModule` or a list of bodies, and communicate
nothing. :func:`slot_view` gives a slot's parameter (or an elementwise optimizer state tensor of it)
as a DTensor in the slot's layout over the same storage, so that DCP reads and writes it in place;
:func:`set_full` copies a full tensor into a slot's layout by a local slice.

Algorithm: the slots are enumerated body by body and layer by layer; a slot's ``copy`` counts the
earlier slots of its FQN on this rank. Whole tensors (buffers, parameters no layer reads) are held
by every body alike; the first body's are read and written, then copied into the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from galvatron_fx.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

    from galvatron_fx.runtime.layer_exec import LayerExecutor
    from galvatron_fx.runtime.parallel_module import ParallelModule

R = Replicate()


# ---- bodies and slots: the stored copies of the parameters on this rank -------------------------

def bodies_of(pm: nn.Module | Sequence[ParallelModule]) -> list[ParallelModule]:
    """The :class:`ParallelModule` bodies on this rank: ``pm`` itself, a
    :class:`~galvatron_fx.runtime.pipeline.PipelineModule`'s chunks' bodies, or a list as given."""
    if isinstance(pm, (list, tuple)):
        return list(pm)
    bodies = getattr(pm, "bodies", None)
    return cast("list[ParallelModule]", bodies() if callable(bodies) else [pm])


@dataclass(frozen=True)
class Slot:
    ex: LayerExecutor
    key: str
    fqn: str
    copy: int  # 0 for the first executor on this rank that holds the FQN, 1 for the next, ...
    layer: int = 0  # the global index of the executor's layer

    @property
    def param(self) -> torch.Tensor:
        return self.ex.params[self.key]

    @property
    def global_shape(self) -> tuple[int, ...]:
        return tuple(self.ex._meta[self.key][1])


def all_slots(pm: nn.Module | Sequence[ParallelModule]) -> list[Slot]:
    """Every slot of the bodies on this rank (see :func:`bodies_of`), bodies and layers in order."""
    seen: dict[str, int] = {}
    out = []
    for body in bodies_of(pm):
        for layer, ex in zip(body.layer_ids, cast("list[LayerExecutor]", body.executors)):
            for key, fqn in ex.fqn_of_key.items():
                out.append(Slot(ex, key, fqn, seen.get(fqn, 0), layer))
                seen[fqn] = seen.get(fqn, 0) + 1
    return out


def buffers_of(bodies: list[ParallelModule]) -> dict[str, torch.Tensor]:
    """The buffers (full, equal in every body: each holds all of the model's): the first body's."""
    return bodies[0]._buffers_full if bodies else {}


def unused_params(bodies: list[ParallelModule]) -> dict[str, torch.Tensor]:
    """The parameters no layer reads (whole, equal in every body): the first body's, by FQN."""
    return bodies[0]._unused_full if bodies else {}


def whole_tensors(bodies: list[ParallelModule]) -> dict[str, torch.Tensor]:
    """Every tensor the bodies hold whole, by FQN: the buffers and the parameters no layer reads."""
    return buffers_of(bodies) | unused_params(bodies)


def copy_whole(bodies: list[ParallelModule]) -> None:
    """The first body's whole tensors into the other bodies' (after a load into the first)."""
    for body in bodies[1:]:
        for mine, first in ((body._buffers_full, buffers_of(bodies)), (body._unused_full, unused_params(bodies))):
            for fqn, t in mine.items():
                t.copy_(first[fqn])


def slot_view(slot: Slot, t: torch.Tensor) -> DTensor:
    """``t`` (the slot's parameter or an elementwise state tensor of it) as a DTensor in the
    slot's layout, over the same storage (DCP reads and writes it in place)."""
    if isinstance(t, DTensor):
        return cast(DTensor, t.detach())
    tp_p, shape, stride = slot.ex._meta[slot.key]
    return DTensor.from_local(t.detach(), slot.ex.mesh, (R, tp_p), run_check=False, shape=cast(torch.Size, shape),
                              stride=stride)


def is_elementwise(p: torch.Tensor, v: torch.Tensor) -> bool:
    return isinstance(v, DTensor) == isinstance(p, DTensor) and tuple(v.shape) == tuple(p.shape)


@torch.no_grad()
def set_full(slot: Slot, target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` (identical on every rank) into ``target``, the slot's parameter or an
    elementwise state tensor of it, in the slot's layout. Replicate -> any placement is a local
    slice (``redistribute``: FSDP's shards may be ``_StridedShard``), no communication."""
    if isinstance(target, DTensor):
        mesh, placements = target.device_mesh, tuple(target.placements)
        local = target._local_tensor
    else:
        mesh, placements = slot.ex.mesh, (R, slot.ex._meta[slot.key][0])
        local = target
    full = full.detach().to(device=local.device, dtype=local.dtype).contiguous()
    d = DTensor.from_local(full, mesh, [R] * mesh.ndim, run_check=False).redistribute(mesh, placements)
    local.copy_(d.to_local())


def optimizer_slots(bodies: list[ParallelModule], optimizer: torch.optim.Optimizer | None) -> dict[int, Slot]:
    """id(parameter) -> slot, for every parameter the optimizer holds (all must be the module's)."""
    if optimizer is None:
        return {}
    by_id: dict[int, Slot] = {}
    for s in all_slots(bodies):  # the first slot of a parameter object (tied layers may share one)
        by_id.setdefault(id(s.param), s)
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in by_id:
                raise ConfigError(f"the optimizer holds a parameter of shape {tuple(p.shape)} that is not one of this "
                                  "module's on this rank: build the optimizer over the module's parameters() after "
                                  "the module (its parameters replace the model's)")
            out[id(p)] = by_id[id(p)]
    return out


def reshard_fsdp(bodies: list[ParallelModule]) -> None:
    """Put FSDP layers in their sharded state (a ZeRO-2 layer stays unsharded after a forward
    without backward): their registered parameters are then the shards the optimizer steps."""
    for body in bodies:
        for ex in body.executors:
            if getattr(ex, "fsdp", False):
                cast("FSDPModule", ex).reshard()
