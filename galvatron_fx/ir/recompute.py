"""Recomputation policies, shared by the cost annotation (which measures them) and the runtime
(which applies them), so that predicted and real activation memory come from one definition.

- ``full``: ``torch.utils.checkpoint`` (non-reentrant) around the layer: only its inputs are
  kept; the whole forward runs again in backward.
- ``selective``: a policy that keeps the outputs of compute-heavy kernels (matmuls,
  convolutions, attention), of collectives (a backward never repeats communication) and of
  random draws (the same draws, no generator state to replay), and recomputes everything else
  (norms, activations, elementwise ops) — cheap FLOPs, most of the bytes. A lowered layer
  carries it as tags on its joint graph (:func:`tag_selective`: ``node.meta["recompute"]``, as
  ``torch.utils.checkpoint`` tags a traced region), which the partitioner honours: its backward
  graph recomputes what is not kept. Measured eagerly, the same policy runs under
  ``torch.utils.checkpoint`` (:func:`selective_context_fn`).
"""

from __future__ import annotations

import functools
import operator
from enum import StrEnum
from typing import Any

import torch
import torch.fx as fx
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


def policy_of(func) -> CheckpointPolicy:
    """What selective recomputation does with the outputs of ``func`` (an ATen op, a collective):
    keep them (``MUST_SAVE``) or make them again in backward (``PREFER_RECOMPUTE``); module doc."""
    if getattr(func, "_overloadpacket", None) in SAVE_OUTPUTS_OF or getattr(func, "namespace", "") == "_c10d_functional":
        return CheckpointPolicy.MUST_SAVE
    if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return policy_of(func)


def tag_selective(joint: fx.GraphModule) -> int:
    """Tag the forward ops of a joint forward-backward graph (those that do not read a gradient
    input, ``tangents_*``) with :func:`policy_of` as ``node.meta["recompute"]``, one checkpointed
    region (``ac_graph_id``): the partitioner then saves the kept outputs and puts the other ops
    again in backward where it needs their values. A multi-output op's items take the op's
    policy. Returns how many nodes it tagged."""
    backward = {n for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")}
    tagged = 0
    for n in joint.graph.nodes:
        if n.op != "call_function":
            continue
        if any(a in backward for a in n.all_input_nodes):
            backward.add(n)
            continue
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node) and "recompute" in n.args[0].meta:
            n.meta["recompute"] = n.args[0].meta["recompute"]
        else:
            n.meta["recompute"] = policy_of(n.target)
        n.meta["ac_graph_id"] = 1
        tagged += 1
    return tagged


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
