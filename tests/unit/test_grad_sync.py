"""Bucketed data-parallel gradient sums (``galvatron_fx.cost_models.grad_sync``): the runtime's
buckets, and what they add to a step when launched during or after the backward."""

from __future__ import annotations

import pytest
import torch

from galvatron_fx.cost_models import grad_sync
from galvatron_fx.cost_models.grad_sync import bucketed_sync_s, plan_buckets
from galvatron_fx.runtime import buckets as runtime_buckets

MiB = 2**20


class _CM:
    """All-reduces of 1 ms + 1 ms per MiB; overlap slows the compute it hides behind by 10%."""

    def collective_time_s(self, collective, nbytes, ranks):
        assert str(collective) == "all_reduce" and len(ranks) == 2
        return 1e-3 + 1e-3 * nbytes / MiB

    def overlapped_s(self, compute_s, comm_s):
        return min(max(max(compute_s, comm_s) * 1.1, compute_s, comm_s), compute_s + comm_s)


def test_caps_and_buckets_are_the_runtimes():
    assert grad_sync.DEFAULT_BUCKET_BYTES == runtime_buckets.DEFAULT_BUCKET_BYTES
    assert grad_sync.FIRST_BUCKET_BYTES == runtime_buckets.FIRST_BUCKET_BYTES
    sizes = [300_000, 600_000, 400_000, 30 * MiB, 2 * MiB, 5_000]
    tensors = [torch.empty(n // 4) for n in sizes]
    assert plan_buckets(sizes) == runtime_buckets.plan_buckets(tensors, runtime_buckets.DEFAULT_BUCKET_BYTES,
                                                                runtime_buckets.FIRST_BUCKET_BYTES)
    assert plan_buckets(sizes) == [[0, 1], [2], [3], [4, 5]]


def test_buckets_ready_early_hide_behind_the_backward_and_the_last_is_exposed():
    cm = _CM()
    # two 0.5 MiB grads ready at 10 ms (one first bucket), then 4 MiB ready at the end (30 ms)
    entries = [(MiB // 2, 0.010), (MiB // 2, 0.010), (4 * MiB, 0.030)]
    t = bucketed_sync_s(cm, entries, [0, 1], 0.030)
    hidden = 2e-3  # the first bucket, 10–12 ms, under compute: it slows that compute by 10%
    assert t == pytest.approx(5e-3 + 0.1 * hidden)
    # unarmed (a pipeline's sync after its schedule): both buckets after the backward, in a row
    assert bucketed_sync_s(cm, entries, [0, 1], 0.030, armed=False) == pytest.approx(2e-3 + 5e-3)
    # a bucket launched late queues behind the one before it
    late = [(MiB, 0.029), (MiB, 0.030)]
    assert bucketed_sync_s(cm, late, [0, 1], 0.030) == pytest.approx((0.029 + 2e-3 + 2e-3 - 0.030) + 0.1 * 1e-3)


def test_nothing_to_sum_costs_nothing():
    cm = _CM()
    assert bucketed_sync_s(cm, [], [0, 1], 1.0) == 0.0
    assert bucketed_sync_s(cm, [(MiB, 0.0)], [0], 1.0) == 0.0  # one replica
