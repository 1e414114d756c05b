"""The time to move a tensor from one layout to another over the same ranks.

Terms: a *layout* is a mesh shape over an ordered list of ranks (row-major: the last axis
varies fastest) plus one DTensor placement per mesh axis — ``Replicate()``, ``Shard(d)`` or
``Partial()``. Several axes sharding one dim nest in axis order, as DTensor does. A rank's
*region* is the box of the global tensor it holds (fractions of each dim).

Algorithm (exact in bytes, then costed as the collective it behaves like):
1. A ``Partial`` axis of the source that the destination does not keep partial is reduced
   first: a reduce-scatter over that axis when the destination shards there, else an
   all-reduce, on the bytes each rank holds.
2. Each rank must receive ``|dst region| − |dst region ∩ src region|`` bytes; the pieces come
   from ``g − 1`` distinct source regions. The worst rank's receive volume ``R`` is costed as an
   all-gather over its ``g`` suppliers of ``R·g/(g−1)`` bytes — which is exactly the all-gather
   time for Shard→Replicate and the all-to-all time for Shard(i)→Shard(j) — on the tier those
   ranks span.
A destination region inside the source region costs nothing (a local slice).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from galvatron_fx.cluster import Collective
from galvatron_fx.cost_models.communication import CommModel

Box = tuple[tuple[Fraction, Fraction], ...]


@dataclass(frozen=True)
class Layout:
    """``placements[i]`` on mesh axis ``i`` of size ``mesh_shape[i]``, over ``ranks``."""

    mesh_shape: tuple[int, ...]
    placements: tuple[Placement, ...]

    def __post_init__(self) -> None:
        if len(self.mesh_shape) != len(self.placements):
            raise ValueError(f"mesh {self.mesh_shape} and placements {self.placements} differ in length")

    @property
    def size(self) -> int:
        return math.prod(self.mesh_shape)

    def coords(self, index: int) -> tuple[int, ...]:
        """Mesh coordinates of the ``index``-th rank (row-major)."""
        out = []
        for n in reversed(self.mesh_shape):
            out.append(index % n)
            index //= n
        return tuple(reversed(out))

    def region(self, index: int, ndim: int) -> Box:
        """The box of the global tensor the ``index``-th rank holds."""
        lo = [Fraction(0)] * ndim
        width = [Fraction(1)] * ndim
        for axis, (p, c) in enumerate(zip(self.placements, self.coords(index))):
            if isinstance(p, Shard):
                d = p.dim % ndim
                width[d] /= self.mesh_shape[axis]
                lo[d] += c * width[d]
        return tuple((lo[d], lo[d] + width[d]) for d in range(ndim))

    def partial_axes(self) -> list[int]:
        return [i for i, p in enumerate(self.placements) if isinstance(p, Partial)]

    def __str__(self) -> str:
        return "(" + ",".join(f"{n}:{_pstr(p)}" for n, p in zip(self.mesh_shape, self.placements)) + ")"


def _pstr(p: Placement) -> str:
    if isinstance(p, Shard):
        return f"S{p.dim}"
    return "P" if isinstance(p, Partial) else "R"


def _volume(box: Box) -> Fraction:
    return math.prod((hi - lo for lo, hi in box), start=Fraction(1))


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (l1, h1), (l2, h2) in zip(a, b):
        lo, hi = max(l1, l2), min(h1, h2)
        if hi <= lo:
            return None
        out.append((lo, hi))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def reshard_plan(src: Layout, dst: Layout, ndim: int) -> tuple[list[tuple[str, int, Fraction]], Fraction, int]:
    """The steps of a reshard: (reductions, worst receive fraction, its supplier count).

    Reductions are ``(collective, group size, fraction of the tensor each rank holds)``.
    """
    if src.size != dst.size:
        raise ValueError(f"layouts cover different numbers of ranks: {src.size} vs {dst.size}")
    reductions: list[tuple[str, int, Fraction]] = []
    held = _volume(src.region(0, ndim))
    for axis in src.partial_axes():
        if axis < len(dst.placements) and isinstance(dst.placements[axis], Partial) and dst.mesh_shape == src.mesh_shape:
            continue
        n = src.mesh_shape[axis]
        keep_sharded = axis < len(dst.placements) and isinstance(dst.placements[axis], Shard) and dst.mesh_shape == src.mesh_shape
        reductions.append((Collective.REDUCE_SCATTER if keep_sharded else Collective.ALL_REDUCE, n, held))
    worst, suppliers = Fraction(0), 1
    # the source regions are a grid: dim d cut in ``pieces[d]`` equal parts (the product of the
    # mesh axes that shard it), so the distinct regions meeting a box are counted per dim
    pieces = [1] * ndim
    for n, p in zip(src.mesh_shape, src.placements):
        if isinstance(p, Shard):
            pieces[p.dim % ndim] *= n
    # every rank of a regular layout moves the same volume up to translation: a few probes
    # (first, last, the middle, and one per axis step) find the worst without an O(n²) sweep
    probes = sorted({0, dst.size - 1, dst.size // 2, *(math.prod(dst.mesh_shape[i + 1:]) for i in
                                                       range(len(dst.mesh_shape)))} & set(range(dst.size)))
    for r in probes:
        want = dst.region(r, ndim)
        have = _intersect(want, src.region(r, ndim))
        missing = _volume(want) - (_volume(have) if have else 0)
        if missing <= worst:
            continue
        meeting = math.prod(math.ceil(hi * k) - math.floor(lo * k) for (lo, hi), k in zip(want, pieces))
        worst, suppliers = missing, meeting - (have is not None) + 1  # the others, and this rank
    return reductions, worst, suppliers


def reshard_time_s(comm: CommModel, nbytes: int, src: Layout, dst: Layout, ranks: list[int], ndim: int) -> float:
    """Seconds to turn a tensor of ``nbytes`` (global) from ``src`` into ``dst`` on ``ranks``."""
    if len(ranks) != src.size:
        raise ValueError(f"{len(ranks)} ranks for a layout over {src.size}")
    reductions, recv, g = reshard_plan(src, dst, ndim)
    t = 0.0
    for coll, n, frac in reductions:
        t += comm.time_s(coll, int(nbytes * frac), _axis_group(ranks, src.mesh_shape, n))
    if recv > 0 and g > 1:
        equiv = int(nbytes * recv * g / (g - 1))
        t += comm.time_s(Collective.ALL_GATHER, equiv, _nearest_group(ranks, g))
    return t


def _axis_group(ranks: list[int], mesh_shape: tuple[int, ...], n: int) -> list[int]:
    """A representative group of ``n`` ranks along a mesh axis (its stride decides the tier)."""
    stride = 1
    for size in reversed(mesh_shape):
        if size == n:
            break
        stride *= size
    return [ranks[i * stride] for i in range(n) if i * stride < len(ranks)]


def _nearest_group(ranks: list[int], g: int) -> list[int]:
    """The supplier group of the worst rank, approximated by ``g`` consecutive ranks."""
    return list(itertools.islice(ranks, g))


__all__ = ["Layout", "Partial", "Replicate", "Shard", "reshard_plan", "reshard_time_s"]
