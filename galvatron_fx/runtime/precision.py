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
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["COMPUTE_DTYPES", "LossScaler"]

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """Dynamic loss scale (see module doc)."""

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000, backoff: float = 0.5,
                 growth: float = 2.0):
        if init_scale <= 0 or not 0 < backoff < 1 or growth <= 1 or growth_interval < 1:
            raise ValueError("LossScaler needs init_scale > 0, 0 < backoff < 1, growth > 1, growth_interval >= 1")
        self.scale = float(init_scale)
        self.growth_interval, self.backoff, self.growth = growth_interval, backoff, growth
        self.good_steps = 0
        self.skipped = 0

    @torch.no_grad()
    def unscale(self, params: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None = None) -> bool:
        """Divide the (reduced) gradients by the scale and return True, or, if any rank holds an
        inf/NaN, drop every gradient, back off and return False (the caller skips the step)."""
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
        if bad.item() > 0:
            for p in params:
                p.grad = None
            self.scale *= self.backoff
            self.good_steps = 0
            self.skipped += 1
            return False
        inv = 1.0 / self.scale
        for g in locals_:
            g.mul_(inv)
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale *= self.growth
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps, self.skipped = float(state["scale"]), int(state["good_steps"]), \
            int(state["skipped"])
