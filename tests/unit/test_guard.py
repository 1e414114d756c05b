"""The pieces of :mod:`galvatron_fx.runtime.guard` that need no process group: timeouts, batch
signatures and what counts as a peer's failure (the spawned cases are in tests/dist/test_faults.py)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch

from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.runtime import guard


@pytest.mark.parametrize("value, seconds", [(None, 300.0), (2.5, 2.5), (60, 60.0), (timedelta(minutes=2), 120.0)])
def test_a_timeout_reads_seconds_or_a_timedelta(value, seconds):
    assert guard.timeout_of(value).total_seconds() == seconds


@pytest.mark.parametrize("value", [0, 0.5, -3, math.nan, math.inf, 1e9, "60", True, timedelta(days=30)])
def test_an_absurd_timeout_is_a_config_error(value):
    with pytest.raises(ConfigError, match="between 1 s and 7 days"):
        guard.timeout_of(value)


def test_agree_without_a_process_group_raises_locally():
    guard.agree(None)
    with pytest.raises(PlanError, match="bad"):
        guard.agree("bad")


def _sig(*tensors):
    return guard.batch_signature(tensors, [f"x{i}" for i in range(len(tensors))])


def test_batch_signatures_tell_values_order_shapes_and_dtypes_apart():
    ids = torch.arange(32).reshape(4, 8)
    same = _sig(ids.clone(), torch.ones(4, 8))
    assert _sig(ids, torch.ones(4, 8)) == same
    changed = ids.clone()
    changed[2, 5] += 1
    swapped = ids[[1, 0, 2, 3]]  # the same samples in another order
    for other in (_sig(changed, torch.ones(4, 8)), _sig(swapped, torch.ones(4, 8)),
                  _sig(ids[:2], torch.ones(2, 8)), _sig(ids.int(), torch.ones(4, 8))):
        assert other != same
    assert _sig(torch.zeros(0, 3))[0][3] == 0 and _sig(torch.tensor([True, False]))[0][3] != 0


def test_a_batch_problem_names_the_rank_and_the_input():
    a = _sig(torch.arange(8).reshape(2, 4))
    b = _sig(torch.arange(8).reshape(2, 4) + 1)
    assert guard._batch_problem([a, a, None], 1) is None  # a rank that reads no batch is not compared
    msg = guard._batch_problem([a, a, b, b], 7)
    assert "at step 7" in msg and "ranks 2, 3 got other values of input 'x0'" in msg and "DistributedSampler" in msg
    msg = guard._batch_problem([a, _sig(torch.arange(6).reshape(2, 3))], 1)
    assert "input 'x0' of shape [2, 3] int64 (rank 0: [2, 4] int64)" in msg


def test_local_shares_are_compared_by_shape_not_values():
    """inputs="local": each rank's share holds other samples (no checksum compared), but a share of
    another shape is a problem naming the local contract."""
    share = lambda t: guard.batch_signature([t], ["input_ids"], values=False)  # noqa: E731
    a, b = share(torch.arange(8).reshape(2, 4)), share(torch.arange(8).reshape(2, 4) + 100)
    assert a == b and guard._batch_problem([a, b], 3, values=False) is None
    msg = guard._batch_problem([a, share(torch.arange(4).reshape(1, 4))], 3, values=False)
    assert "different shapes at step 3" in msg and "inputs='local'" in msg and "pm.sampler" in msg
    msg = guard._batch_problem([a, share(torch.arange(4).reshape(1, 4))], 3, values=False, mode="rank")
    assert "inputs='rank'" in msg and "world size" in msg and "inputs='local'" not in msg  # its own contract


@pytest.mark.parametrize("text, peer", [
    ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete", True),
    ("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4783: Connection reset by peer", True),
    ("[gloo/transport/tcp/pair.cc:590] Connection closed by peer [127.0.0.1]:29500", True),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)", True),
    ("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)", False),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
])
def test_what_counts_as_a_peer_failure(text, peer):
    assert bool(guard._PEER_FAILURE.search(text)) is peer


def test_a_section_without_a_process_group_runs_plainly():
    g = guard.StepGuard()
    with g.step(([torch.ones(2)], ["x"])):
        pass
    assert g.steps == 1
    # no group: nothing to diagnose, nothing hidden
    with pytest.raises(RuntimeError, match="Timed out"), g.section("test"):
        raise RuntimeError("Timed out waiting")
