"""``compile`` — the user's entry: plan (or take a given plan), build the module that runs it, close the loop.

Contract: called on every rank of an initialised process group (``torchrun``) with the same
model, cluster and arguments; makes a :class:`~galvatron_fx.build.CompileRequest` of them and
returns the module :func:`~galvatron_fx.build.build` makes (every rank a module, or every rank the
same ``PlanError``; the algorithm and ``dump_dir`` are described there), with its session
(:class:`~galvatron_fx.adapt.ClosedLoop`) attached as ``closed_loop``.

``timeout`` (seconds, default 5 minutes) limits every collective from here on, in every process
group (the ranks wait up to 30 minutes for rank 0's plan search): a rank that stops answering
(stopped, hung in its data loader, dead) ends every other rank with a
:class:`~galvatron_fx.errors.RankFailureError` naming it (see :mod:`galvatron_fx.runtime.guard`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from galvatron_fx.adapt import ClosedLoop
from galvatron_fx.build import CompileRequest, build
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.runtime.guard import StepGuard, set_timeout
from galvatron_fx.runtime.local_inputs import check_inputs_mode
from galvatron_fx.runtime.parallel_module import ParallelModule

__all__ = ["compile"]


def compile(model: nn.Module, cluster, example_inputs: Sequence[torch.Tensor] | Mapping[str, Any], *,
            example_kwargs: Mapping[str, Any] | None = None, loss_fn=None, global_batch_size,
            memory_budget: int | float | None = None, plan: ParallelPlan | None = None,
            search=None, precision: str | None = None, progress: bool | None = None, timeout: float | None = None,
            dump_dir=None, adapt: bool | dict = False, cost_model=None,
            inputs: str = "global") -> ParallelModule:  # noqa: A001 (DESIGN §6)
    """Plan ``model`` for ``cluster`` (or use ``plan``) and return the module that runs it on
    this rank: a :class:`ParallelModule`, or a
    :class:`~galvatron_fx.runtime.pipeline.PipelineModule` for a pipelined plan (see module doc).

    ``example_inputs`` are the model's positional arguments, or a mapping of argument names to
    values (a Hugging Face batch: ``{"input_ids": ..., "labels": ...}``); ``example_kwargs`` more
    keyword arguments. ``train_step`` then takes batches of the same form.
    ``global_batch_size``: samples per optimizer step; a list of candidates, ``"auto"`` or an
    :class:`~galvatron_fx.search.auto_batch.AutoBatch` lets the search choose (the largest batch
    that fits, the fastest in a range, the nearest to a tokens-per-step target): ``train_step``
    then takes batches of ``pm.global_batch_size`` samples, split into ``pm.num_microbatches``.
    ``loss_fn(output, target)``: for a model that does not return its loss; the last of
    ``example_inputs`` (and of each batch given to ``train_step``) is then the target, and the
    model is called with the others. The search runs on rank 0 and its plan is broadcast.
    ``precision``: ``"fp32"`` (the default), ``"bf16"`` or ``"fp16"`` to search in (a given
    ``plan`` runs in its own; naming another is an error); ``progress``: the search's progress
    lines on rank 0's stderr (default: when stderr is a terminal).
    ``timeout``: seconds any collective may wait for a peer; ``dump_dir``: where to write the
    lowered program (see module doc). ``cost_model``: what the search prices with (default the
    planner's analytic model of ``cluster``). ``adapt=True`` (or a dict of
    :meth:`~galvatron_fx.runtime.adaptive.AdaptiveMixin.adapt_after`'s ``warmup``, ``steps``,
    ``threshold``) closes the loop once: after warm-up the module observes a few steps, refits
    the cost model, re-plans and switches in place when that pays, logging why
    (:mod:`galvatron_fx.runtime.adaptive`; ``pm.observe``/``refit``/``replan`` do it by hand).
    ``inputs``: ``"global"`` (every rank passes the whole global batch to ``train_step`` /
    ``forward_backward``), ``"local"`` (each rank passes its data-parallel share,
    ``global_batch_size // pm.data_parallel_size`` samples, ``pm.sampler(dataset)``) or ``"rank"``
    (every rank passes ``global_batch_size // world_size`` samples of its own, as under
    ``DistributedDataParallel``): :mod:`galvatron_fx.runtime.local_inputs`."""
    # (the planner's placement search may have set up a stand-in "fake" group in this process)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "fake":
        raise PlanError("galvatron_fx.compile needs an initialised process group: run under torchrun "
                        "(torchrun --nproc-per-node N train.py) and call torch.distributed.init_process_group "
                        "first; to only inspect a plan, use galvatron_fx.plan(...)")
    set_timeout(timeout)
    check_inputs_mode(inputs)  # before any work
    if isinstance(example_inputs, Mapping):
        example_kwargs, example_inputs = {**example_inputs, **(example_kwargs or {})}, ()
    request = CompileRequest(model=model, cluster=cluster, example_inputs=tuple(example_inputs),
                             example_kwargs=dict(example_kwargs or {}), loss_fn=loss_fn,
                             global_batch_size=global_batch_size, memory_budget=memory_budget, plan=plan, search=search,
                             precision=precision, progress=progress, cost_model=cost_model, dump_dir=dump_dir,
                             inputs=inputs)
    with StepGuard().section("compile"):
        pm = build(request)
    loop = ClosedLoop(request, pm)
    if adapt:
        loop.adapt_after(**(adapt if isinstance(adapt, dict) else {}))
    return pm
