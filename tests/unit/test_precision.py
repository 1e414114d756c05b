"""fp16's dynamic loss scale (``LossScaler``) in one process (no process group: the overflow
verdict is this process's own): it backs off to a floor, never to zero, and a run of overflowing
steps at the floor stops training with an error that names the way out."""

from __future__ import annotations

import pytest
import torch

from galvatron_fx.errors import PrecisionError
from galvatron_fx.runtime.precision import LossScaler


def _step(scaler: LossScaler, p: torch.nn.Parameter, *, overflow: bool) -> bool:
    p.grad = torch.full((3,), float("inf") if overflow else 8.0)
    return scaler.unscale([p])


def test_the_scale_stops_at_its_floor_and_a_good_step_after_many_overflows_unscales():
    """Before the floor, 1,091 overflows in a row took the scale to 0.0 and the next good step
    divided by it (ZeroDivisionError)."""
    scaler, p = LossScaler(max_overflows_at_min_scale=10_000), torch.nn.Parameter(torch.ones(3))
    for _ in range(1_200):
        assert not _step(scaler, p, overflow=True)
        assert p.grad is None
    assert scaler.scale == 1.0 and scaler.skipped == 1_200
    assert _step(scaler, p, overflow=False)
    assert torch.equal(p.grad, torch.full((3,), 8.0)), "at scale 1.0 the gradient is kept as it is"
    assert scaler.overflows_at_min_scale == 0, "a good step ends the run of overflows"


def test_a_run_of_overflows_at_the_floor_raises_that_the_loss_overflows_fp16():
    scaler, p = LossScaler(), torch.nn.Parameter(torch.ones(3))
    halvings = 16  # 2**16 -> 1.0
    for _ in range(halvings + 49):
        _step(scaler, p, overflow=True)
    assert scaler.scale == 1.0 and scaler.overflows_at_min_scale == 49
    with pytest.raises(PrecisionError) as e:
        _step(scaler, p, overflow=True)
    msg = str(e.value)
    assert "50 steps in a row" in msg and "fp16" in msg and "bf16" in msg and "fp32" in msg, msg
    assert "max_overflows_at_min_scale" in msg, msg
    assert p.grad is None and scaler.skipped == halvings + 50


def test_a_good_step_resets_the_run_and_the_limits_are_configurable():
    scaler, p = LossScaler(init_scale=4.0, min_scale=0.5, max_overflows_at_min_scale=3),\
        torch.nn.Parameter(torch.ones(3))
    for _ in range(3 + 2):  # 4 -> 2 -> 1 -> 0.5, then two at the floor
        _step(scaler, p, overflow=True)
    assert scaler.scale == 0.5 and scaler.overflows_at_min_scale == 2
    assert _step(scaler, p, overflow=False) and torch.equal(p.grad, torch.full((3,), 16.0))
    for _ in range(2):
        _step(scaler, p, overflow=True)
    with pytest.raises(PrecisionError, match="3 steps in a row"):
        _step(scaler, p, overflow=True)


def test_the_run_of_overflows_travels_with_the_state_dict():
    scaler, p = LossScaler(init_scale=1.0, max_overflows_at_min_scale=4), torch.nn.Parameter(torch.ones(3))
    for _ in range(3):
        _step(scaler, p, overflow=True)
    state = scaler.state_dict()
    assert state == {"scale": 1.0, "good_steps": 0, "skipped": 3, "overflows_at_min_scale": 3}
    resumed = LossScaler(max_overflows_at_min_scale=4)
    resumed.load_state_dict(state)
    with pytest.raises(PrecisionError):
        _step(resumed, p, overflow=True)
    # a state saved before the run was counted (or at a scale of 0.0) loads at the floor
    old = LossScaler()
    old.load_state_dict({"scale": 0.0, "good_steps": 0, "skipped": 1091})
    assert old.scale == 1.0 and old.overflows_at_min_scale == 0
    assert _step(old, p, overflow=False)


@pytest.mark.parametrize("kw", [{"min_scale": 0.0}, {"min_scale": float("nan")}, {"init_scale": 0.5},
                                {"max_overflows_at_min_scale": 0}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        LossScaler(**kw)
