"""user_loop — what a training loop written for ``DistributedDataParallel`` expects of a module.

Contract: :class:`UserLoop` is a base of ``ParallelModule`` and ``PipelineModule``; it reads the
host's executors (its own, or a pipeline's chunks' bodies'), and the host's
gradient step reads :attr:`UserLoop.syncing`. It gives:

- ``named_parameters()`` by the user's FQNs (``model.named_parameters()``'s names), so that
  parameter groups (no weight decay on norms and biases) are chosen as on the model itself. The
  parameters are the module's own (sharded) ones, in ``parameters()`` order. A tied weight held
  in two layouts (two parameters, kept equal by summing their gradients) appears twice under its
  one FQN; a parameter no layer reads is not a parameter here (``state_dict()`` keeps it).
- ``with pm.no_sync():`` — backward passes inside accumulate each rank's gradients locally,
  without the data-parallel sync (DDP's plain buckets, FSDP's reduce-scatters, the sums of tied
  copies, an fp16 loss scaler's unscale); the first ``forward_backward`` (or ``loss.backward()``)
  outside syncs what accumulated, as ``DistributedDataParallel.no_sync`` does. Accumulated
  gradients are the *sum* of the calls' gradients (each call's the gradient of its own mean loss).
- ``loss = pm(batch); loss.backward()`` for a plan without pipeline stages: the gradient sync runs
  when that backward ends (an autograd callback, as DDP queues its own, after FSDP's), unless inside
  ``no_sync``. ``sync_on_backward = False`` turns it off for callers that sync themselves.
- ``pm(batch, outputs=True)``: the loss and the model's other outputs by their keys in its
  output, gathered whole (a pipeline's from its last stage: ``PipelineModule.forward``); and
  :func:`finish_step`, the end of a step both modules share (clip, step, schedule, zero).

Algorithm: ``no_sync`` sets a flag the hosts' steps read (no bucket armed, no ``sync_grads``, no
unscale) and FSDP2's own ``set_requires_gradient_sync(False)`` on every FSDP unit of the bodies,
restored on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from galvatron_fx.ir.graph import ModelGraph
    from galvatron_fx.runtime.guard import StepGuard

__all__ = ["SyncOnBackward", "UserLoop", "finish_step"]


class SyncOnBackward(torch.autograd.Function):
    """Identity on the loss whose backward queues ``module``'s gradient sync for the end of the
    backward pass (every gradient is in ``.grad`` by then)."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, module) -> torch.Tensor:
        ctx.module = module
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        module = ctx.module
        torch.autograd.Variable._execution_engine.queue_callback(module._sync_after_backward)
        return grad, None


class UserLoop:
    """FQN-named parameters, ``no_sync`` and backward-hooked sync (see the module doc)."""

    syncing = True  # False inside no_sync()
    sync_on_backward = True

    if TYPE_CHECKING:  # set or defined by the host module and its other bases
        mg: ModelGraph
        guard: StepGuard
        inputs_mode: str

        def _global_inputs(self, tensors: Sequence) -> list: ...
        def _micro_batches(self, batch: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]: ...
        def _loss_prepare(self, inputs: Sequence[torch.Tensor]) -> None: ...
        def run_layers(self, env: dict[str, object], outputs: Sequence[str], *, wrap: bool = True) -> list: ...
        def sync_grads(self) -> None: ...

    def _loop_bodies(self) -> list:
        """The ParallelModule bodies on this rank: this module, or a pipeline's chunks' bodies."""
        chunks = getattr(self, "chunks", None)
        return [self] if chunks is None else [ch.body for ch in chunks]

    def _fqn_of_param(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for body in self._loop_bodies():
            for ex in body.executors:
                for key, fqn in ex.fqn_of_key.items():
                    out.setdefault(id(ex.params[key]), fqn)
        return out

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        """``(FQN, parameter)`` for every parameter of this rank, named as in the user's model
        (``prefix`` prepended); see the module doc."""
        fqn = self._fqn_of_param()
        for name, p in nn.Module.named_parameters(cast(nn.Module, self), recurse=recurse,
                                                  remove_duplicate=remove_duplicate):
            yield prefix + fqn.get(id(p), name), p

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients over the backward passes inside, without syncing them (see the
        module doc); collective in effect: every rank enters and leaves it at the same calls."""
        if not self.syncing:  # nested: the outer one restores
            yield
            return
        roots = [r for r in (getattr(b, "_fsdp_root_module", None) for b in self._loop_bodies()) if r is not None]
        self.__dict__["syncing"] = False
        for r in roots:
            r.set_requires_gradient_sync(False, recurse=True)
        try:
            yield
        finally:
            self.__dict__["syncing"] = True
            for r in roots:
                r.set_requires_gradient_sync(True, recurse=True)

    def _call_inputs(self, inputs: tuple, kwargs: dict) -> tuple[list, bool]:
        """A call's batch (positional and keyword as captured, or one mapping or sequence) as the
        global batch's tensors (each rank's share gathered, its shape compared first, outside
        ``inputs="global"``), and whether it asked for ``outputs=True``."""
        outputs = False
        if "outputs" not in self.mg.input_names and isinstance(kwargs.get("outputs"), bool):
            kwargs = dict(kwargs)
            outputs = kwargs.pop("outputs")
        one = len(inputs) == 1 and not kwargs and isinstance(inputs[0], (dict, list, tuple))  # a batch as one value
        tensors = self.mg.bind_inputs(inputs[0] if one else inputs, kwargs)
        if self.inputs_mode != "global":  # the shares' shapes compared before they are gathered
            with self.guard.section("forward", (tensors, self.mg.input_names), check=True):
                tensors = self._global_inputs(tensors)
        return list(tensors), outputs

    def _with_outputs(self, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``pm(batch, outputs=True)``: the loss and the model's other outputs by their keys in its
        output (a Hugging Face model's ``logits``), each whole on every rank: batched ones
        concatenated over the micro-batches, others averaged."""
        names = list(self.mg.output_names) + list(self.mg.extra_output_names)
        per_micro, sizes = [], []
        for mb in self._micro_batches(inputs):
            sizes.append(next((x.shape[0] for x in mb if isinstance(x, torch.Tensor) and x.ndim >= 1), None))
            per_micro.append(self._gathered_outputs(mb))
        out: dict[str, torch.Tensor] = {}
        for k, name in enumerate(names):
            vs = [m[k] for m in per_micro]
            key = self.mg.output_keys.get(name, name)
            if len(vs) == 1:
                out[key] = vs[0]
            elif all(v.ndim >= 1 for v in vs) and (name in self.mg.batched if self.mg.batched else
                                                   all(v.shape[0] == n for v, n in zip(vs, sizes))):
                out[key] = torch.cat(vs)
            else:
                out[key] = torch.stack([v.float() for v in vs]).mean(0).to(vs[0].dtype)
        return out

    def _gathered_outputs(self, mb: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One micro-batch's loss and other outputs (``mg.output_names`` then
        ``mg.extra_output_names``), each whole on every rank, differentiably."""
        self._loss_prepare(mb)
        names = list(self.mg.output_names) + list(self.mg.extra_output_names)
        values = self.run_layers(dict(zip(self.mg.input_names, mb)), names)
        return [v.full_tensor() if isinstance(v, DTensor) else v for v in values]

    def _sync_after_backward(self) -> None:
        # queued when backward starts, so before FSDP's own end-of-backward callback (queued by
        # its first unit's backward), whose reduce-scatters and host copies the sync reads:
        # queued again from here, it runs after every callback queued so far
        torch.autograd.Variable._execution_engine.queue_callback(self._sync_now)

    def _sync_now(self) -> None:
        if self.syncing:
            self.sync_grads()


def finish_step(module, optimizer, ok: bool, max_norm: float | None, scheduler) -> None:
    """The end of a step after the gradient sync: clip, step and zero (``optimizer`` None:
    :meth:`ParallelModule.forward_backward`, which leaves the gradients, none after an fp16
    overflow ``ok`` False)."""
    if optimizer is None:
        if not ok:
            module.zero_grad(set_to_none=True)
        return
    if ok:
        if max_norm is not None:
            module.clip_grad_norm_(max_norm)
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
