"""Recomputation policies, shared by the cost annotation (which measures them) and the runtime
(which applies them), so that predicted and real activation memory come from one definition.

- ``full``: ``torch.utils.checkpoint`` (non-reentrant) around the layer: only its inputs are
  kept; the whole forward runs again in backward.
- ``selective``: the same, with a policy that keeps the outputs of compute-heavy kernels
  (matmuls, convolutions, attention) and recomputes everything else (norms, activations,
  elementwise ops) — cheap FLOPs, most of the bytes.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


def _packets(*names: str) -> frozenset:
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


# Kernels whose outputs selective recomputation keeps (by overload packet).
SAVE_OUTPUTS_OF = _packets(
    "mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
)


def _selective_policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    if func._overloadpacket in SAVE_OUTPUTS_OF:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint`` implementing ``selective``."""
    return create_selective_checkpoint_contexts(_selective_policy)


def checkpoint_fn(mode: Recompute | str):
    """A wrapper ``f -> f'`` that runs ``f`` under the given recomputation, or None for none."""
    mode = Recompute(mode)
    if mode == Recompute.NONE:
        return None
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode == Recompute.SELECTIVE:
        kwargs["context_fn"] = selective_context_fn

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args):
            return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)

        return run

    return wrap
