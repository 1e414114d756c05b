"""grad_norm — the global gradient norm of a parallel module, and clipping by it.

``clip_grad_norm_(module, max_norm, norm_type)`` is ``torch.nn.utils.clip_grad_norm_`` over the
single-process model's parameters, for a module whose parameters live on several meshes:
plain local shards (tensor-parallel layers at ``(Replicate, tp)``, tp-1 layers replicated over
dp), DTensors (FSDP's dim-0 shards over dp), host masters of offloaded layers, the chunks of a
pipeline stage, and copies of one tied weight in several layers or stages (equal after the
gradient sync). Every element of every parameter of the user's model is counted exactly once
in the world: a parameter's gradient counts on the first layer (in the model's order) that
reads it, and there on the ranks whose mesh coordinate is 0 along every mesh dim it is not
sharded over. Each rank sums its counted elements' ``|g|^p`` (or takes their max for ``inf``),
one all-reduce over the world gives the norm, and every gradient tensor of the rank (copies and
replicas too) is scaled by the same coefficient.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import _StridedShard

__all__ = ["clip_grad_norm_", "grad_norm"]

R = Replicate()


def _bodies(module) -> list:
    """The :class:`ParallelModule` bodies of ``module`` on this rank (a pipeline's chunks)."""
    chunks = getattr(module, "chunks", None)
    return [ch.body for ch in chunks] if chunks is not None else [module]


def _grads(module) -> list[tuple[torch.Tensor, bool]]:
    """This rank's gradient tensors (local shards), each once, with whether it counts toward
    the norm (see the module doc)."""
    mg = module.mg
    index = {layer.name: i for i, layer in enumerate(mg.layers)}
    first = {fqn: min(index[name] for name in info.layers) for fqn, info in mg.params.items()
             if not info.is_buffer and info.layers}
    for info in mg.params.values():
        for alias in info.aliases:
            if info.name in first:
                first[alias] = first[info.name]
    out: list[tuple[torch.Tensor, bool]] = []
    seen: set[int] = set()
    for body in _bodies(module):
        for i, ex in zip(body.layer_ids, body.executors):
            for key, fqn in ex.fqn_of_key.items():
                p = ex.params[key]
                if id(p) in seen or p.grad is None:
                    continue
                seen.add(id(p))
                g = p.grad
                if isinstance(g, DTensor):
                    mesh, placements, local = g.device_mesh, tuple(g.placements), g._local_tensor
                else:
                    mesh, placements, local = ex.mesh, (R, ex._meta[key][0]), g
                coord = mesh.get_coordinate()
                mine = coord is not None and all(c == 0 for c, pl in zip(coord, placements) if not _split(pl))
                out.append((local, mine and first.get(fqn) == i))
    return out


def _split(placement) -> bool:
    """Whether a mesh dim splits the tensor (FSDP's ``_StridedShard`` is no ``Shard`` subclass)."""
    return placement.is_shard() or isinstance(placement, _StridedShard)


def _device(module) -> torch.device:
    dev = getattr(module, "device", None)
    return dev if isinstance(dev, torch.device) else torch.device("cpu")


@torch.no_grad()
def grad_norm(module, norm_type: float = 2.0, grads: list[tuple[torch.Tensor, bool]] | None = None) -> torch.Tensor:
    """The norm of every gradient of ``module`` taken together, as one tensor of all of them
    would have on one process (a collective: every rank calls it). ``grads``: :func:`_grads`
    already listed."""
    p = float(norm_type)
    dev = _device(module)
    part = torch.zeros((), dtype=torch.float64, device=dev)
    for g, counts in grads if grads is not None else _grads(module):
        if not counts or g.numel() == 0:
            continue
        if math.isinf(p):
            part = torch.maximum(part, g.detach().abs().max().to(dev, torch.float64))
        else:
            part += torch.linalg.vector_norm(g.detach().to(torch.float64), p).to(dev) ** p
    dist.all_reduce(part, op=dist.ReduceOp.MAX if math.isinf(p) else dist.ReduceOp.SUM)
    return (part if math.isinf(p) else part ** (1.0 / p)).float()


@torch.no_grad()
def clip_grad_norm_(module, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    """Scale every gradient of ``module`` so that their global norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does on one process; returns the norm before clipping
    (see the module doc; a collective: every rank calls it, and every rank raises alike)."""
    grads = _grads(module)
    total = grad_norm(module, norm_type, grads)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, "
            "set `error_if_nonfinite=False`")
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for g, _ in grads:
        g.mul_(coef.to(g.device, g.dtype))
    return total
