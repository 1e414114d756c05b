"""Reshard cost between layouts: exact bytes, and equal to the collective it behaves like."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from galvatron_fx.cluster import Cluster
from galvatron_fx.cost_models.communication import CommModel
from galvatron_fx.cost_models.reshard import Layout, Partial, Replicate, Shard, reshard_plan, reshard_time_s

S = 2**28
RANKS8 = list(range(8))


@pytest.fixture(scope="module")
def comm():
    return CommModel(Cluster.preset("dgx-a100-80g", nodes=2))


def L(shape, *placements):
    return Layout(tuple(shape), tuple(placements))


def test_shard_to_replicate_is_an_all_gather(comm):
    t = reshard_time_s(comm, S, L([8], Shard(0)), L([8], Replicate()), RANKS8, 3)
    assert t == pytest.approx(comm.time_s("all_gather", S, RANKS8))


def test_shard_to_other_dim_is_an_all_to_all(comm):
    t = reshard_time_s(comm, S, L([8], Shard(0)), L([8], Shard(1)), RANKS8, 3)
    assert t == pytest.approx(comm.time_s("all_to_all", S, RANKS8))


def test_partial_reductions(comm):
    assert reshard_time_s(comm, S, L([8], Partial()), L([8], Replicate()), RANKS8, 2) == pytest.approx(
        comm.time_s("all_reduce", S, RANKS8))
    assert reshard_time_s(comm, S, L([8], Partial()), L([8], Shard(0)), RANKS8, 2) == pytest.approx(
        comm.time_s("reduce_scatter", S, RANKS8))


@pytest.mark.parametrize("src,dst", [
    (L([8], Replicate()), L([8], Shard(0))),
    (L([2, 4], Shard(0), Replicate()), L([4, 2], Shard(0), Replicate())),  # finer batch split
    (L([8], Replicate()), L([2, 4], Shard(0), Shard(1))),
])
def test_local_slices_are_free(comm, src, dst):
    assert reshard_time_s(comm, S, src, dst, RANKS8, 3) == 0.0


def test_tp_degree_change_moves_exactly_the_missing_rows():
    # dp4 x tp2 (activations replicated over tp) -> dp2 x tp4: each rank holds 1/4 of the
    # batch and needs 1/2 of it: it receives 1/4 of the tensor from one partner
    reductions, recv, g = reshard_plan(L([4, 2], Shard(0), Replicate()), L([2, 4], Shard(0), Replicate()), 3)
    assert reductions == [] and recv == Fraction(1, 4) and g == 2


def test_groups_spanning_nodes_pay_the_slower_tier(comm):
    inside = reshard_time_s(comm, S, L([8], Shard(0)), L([8], Replicate()), RANKS8, 2)
    across = reshard_time_s(comm, S, L([8], Shard(0)), L([8], Replicate()), [0, 1, 2, 3, 8, 9, 10, 11], 2)
    assert across > 2 * inside


def test_mismatched_layouts_are_errors(comm):
    with pytest.raises(ValueError, match="different numbers of ranks"):
        reshard_plan(L([4], Shard(0)), L([8], Shard(0)), 2)
    with pytest.raises(ValueError, match="differ in length"):
        Layout((2, 2), (Shard(0),))


def _suppliers_by_sweep(src: Layout, dst: Layout, ndim: int, r: int) -> int:
    """The distinct source regions, other than rank ``r``'s own, that meet ``r``'s destination
    region, found by visiting every source rank; plus ``r`` itself."""
    want, own = dst.region(r, ndim), src.region(r, ndim)

    def meets(a, b):
        return all(min(h1, h2) > max(l1, l2) for (l1, h1), (l2, h2) in zip(a, b))

    return len({reg for reg in (src.region(i, ndim) for i in range(src.size)) if reg != own and meets(reg, want)}) + 1


def test_supplier_counts_equal_a_sweep_over_every_rank():
    import random

    rng = random.Random(0)
    shapes = [(2,), (4,), (2, 2), (2, 4), (4, 2), (2, 2, 2), (8,), (3, 2)]
    checked = 0
    for _ in range(400):
        ndim = rng.choice([1, 2, 3])
        ms = rng.choice(shapes)
        ms2 = rng.choice([s for s in shapes if math.prod(s) == math.prod(ms)])

        def placements(shape, ndim=ndim):
            return tuple(rng.choice([Replicate(), Partial(), Shard(rng.randrange(ndim))]) for _ in shape)

        src, dst = Layout(ms, placements(ms)), Layout(ms2, placements(ms2))
        _, worst, suppliers = reshard_plan(src, dst, ndim)
        if worst > 0:
            worst_ranks = [r for r in range(dst.size) if _missing(src, dst, ndim, r) == worst]
            assert suppliers in {_suppliers_by_sweep(src, dst, ndim, r) for r in worst_ranks}, (src, dst, ndim)
            checked += 1
    assert checked > 100


def _missing(src: Layout, dst: Layout, ndim: int, r: int):
    want, own = dst.region(r, ndim), src.region(r, ndim)
    inter = math.prod((max(0, min(h1, h2) - max(l1, l2)) for (l1, h1), (l2, h2) in zip(want, own)), start=1)
    return math.prod((h - l for l, h in want), start=1) - inter
