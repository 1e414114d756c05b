"""Mixed precision at run time: the compute dtypes of the plan's precision policies, and
dynamic loss scaling for fp16.

Contract: ``COMPUTE_DTYPES[plan.precision]`` is the dtype parameters are read in and activations
kept in (:class:`~galvatron_fx.ir.strategy.Precision`: parameters, gradient reduction and
optimizer states stay fp32). :class:`LossScaler` keeps fp16 gradients in range: the loss is
multiplied by ``scale`` before backward; after the gradients are reduced, :meth:`LossScaler.unscale`
checks every rank's gradients for inf/NaN (one all-reduce of a flag), and either divides them by
the scale (the step goes ahead) or drops them and halves the scale (the step is skipped, on every
rank alike). The scale doubles after ``growth_interval`` good steps in a row — the policy of
``torch.amp.GradScaler``, written here because the gradients it sees are a mix of plain local
shards and FSDP's DTensor shards spread over several meshes.

Limits: the scale never backs off below ``min_scale`` (1.0: the loss as it is), so a long run of
overflows cannot drive it to zero. A gradient that overflows even there is not a scaling problem:
after ``max_overflows_at_min_scale`` overflowing steps in a row at the floor, :meth:`unscale`
raises :class:`~galvatron_fx.errors.PrecisionError` (the verdict is agreed over the ranks, so
every rank raises it at the same step), telling the user to train in bf16 or fp32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from galvatron_fx.errors import PrecisionError

__all__ = ["COMPUTE_DTYPES", "LossScaler", "runtime_model"]

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """Dynamic loss scale (see module doc)."""

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000, backoff: float = 0.5,
                 growth: float = 2.0, *, min_scale: float = 1.0, max_overflows_at_min_scale: int = 50):
        if not (math.isfinite(min_scale) and min_scale > 0 and math.isfinite(init_scale) and init_scale >= min_scale) \
                or not 0 < backoff < 1 or growth <= 1 or growth_interval < 1 or max_overflows_at_min_scale < 1:
            raise ValueError("LossScaler needs 0 < min_scale <= init_scale (finite), 0 < backoff < 1, growth > 1, "
                             "growth_interval >= 1 and max_overflows_at_min_scale >= 1")
        self.scale = float(init_scale)
        self.growth_interval, self.backoff, self.growth = growth_interval, backoff, growth
        self.min_scale, self.max_overflows_at_min_scale = float(min_scale), max_overflows_at_min_scale
        self.good_steps = 0
        self.skipped = 0
        self.overflows_at_min_scale = 0  # overflowing steps in a row at the floor

    @torch.no_grad()
    def unscale(self, params: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None = None) -> bool:
        """Divide the (reduced) gradients by the scale and return True, or, if any rank holds an
        inf/NaN, drop every gradient, back off (not below ``min_scale``) and return False (the
        caller skips the step). Raises :class:`~galvatron_fx.errors.PrecisionError` on the
        ``max_overflows_at_min_scale``-th overflowing step in a row at ``min_scale``."""
        params = list(params)
        grads = [p.grad for p in params if p.grad is not None]
        locals_ = [g._local_tensor if isinstance(g, DTensor) else g for g in grads]
        bad = torch.zeros((), device=locals_[0].device if locals_ else "cpu")
        for g in locals_:
            if not torch.isfinite(g).all():
                bad.fill_(1.0)
                break
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=group)
        if bad.item() > 0:  # the same verdict on every rank: every rank takes this branch
            for p in params:
                p.grad = None
            self.good_steps = 0
            self.skipped += 1
            if self.scale <= self.min_scale:
                self.overflows_at_min_scale += 1
                if self.overflows_at_min_scale >= self.max_overflows_at_min_scale:
                    raise PrecisionError(
                        f"fp16 training cannot go on: the gradients overflowed (inf/NaN) in "
                        f"{self.overflows_at_min_scale} steps in a row at the smallest loss scale "
                        f"({self.min_scale:g}), {self.skipped} steps skipped in all: the loss or its gradients exceed fp16's range "
                        "(largest value 65504), which no loss scale fixes. Train in bf16 or fp32 (precision='bf16' "
                        "or 'fp32' when planning), and check the inputs and the learning rate for a loss that "
                        "diverges; LossScaler(max_overflows_at_min_scale=...) sets how many such steps are skipped "
                        "before this error")
            self.scale = max(self.scale * self.backoff, self.min_scale)
            return False
        inv = 1.0 / self.scale
        for g in locals_:
            g.mul_(inv)
        self.good_steps += 1
        self.overflows_at_min_scale = 0
        if self.good_steps % self.growth_interval == 0:
            self.scale *= self.growth
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped,
                "overflows_at_min_scale": self.overflows_at_min_scale}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s values; a scale below ``min_scale`` (a state saved before
        the scale had a floor could hold 0.0) is raised to it."""
        scale = float(state["scale"])
        self.scale = max(scale, self.min_scale) if math.isfinite(scale) else self.min_scale
        self.good_steps, self.skipped = int(state["good_steps"]), int(state["skipped"])
        self.overflows_at_min_scale = int(state.get("overflows_at_min_scale", 0))


def runtime_model(model, precision: str):
    """The model to capture the runtime graph from: itself in fp32; under mixed precision a copy
    in the compute dtype, so that the graph keeps the model's own upcasts (a norm's
    ``x.float()`` and ``type_as(x)`` are no-ops, and vanish, when captured in fp32). The
    executors still take the user's fp32 parameters (by name) and read them in the compute dtype."""
    if precision == "fp32":
        return model
    import copy

    return copy.deepcopy(model).to(COMPUTE_DTYPES[precision])
