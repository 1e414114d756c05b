"""The plan-wide gradient communication (:class:`~galvatron_fx.ir.grad_comm.GradComm`): one search
per option the caller allows, the fastest plan kept.

Contract: :func:`search_each_grad_comm` takes the caller's :class:`SearchSpace` and a function
that searches a space allowing one gradient communication; it returns the fastest plan of those
searches (``PlanError`` from the first option when none finds a plan), its ``grad_comm`` set and a
note naming what the others predicted. With one option (the default: fp32, no compression) it is
one search. Ties keep the least lossy option (listed first, :func:`grad_comm_options`), so a plan
without data-parallel gradients (dp = 1 everywhere) always sums in fp32.

Why one search per option, not a per-layer choice: the option is a property of the whole run
(every data-parallel group sums in one dtype, one compression state per bucketer), and it changes
which strategies win — cheaper DDP sums favour data over tensor parallelism and DDP over
ZeRO — so each option's plan is searched with its own prices rather than re-priced afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from galvatron_fx.errors import PlanError
from galvatron_fx.ir.grad_comm import GradComm
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.search.candidates import SearchSpace

__all__ = ["one_option", "search_each_grad_comm"]


def one_option(space: SearchSpace, gc: GradComm) -> SearchSpace:
    """``space`` allowing only ``gc``."""
    return dataclasses.replace(space, reduce_dtypes=(gc.reduce_dtype,), powersgd_ranks=(gc.powersgd_rank,))


def search_each_grad_comm(space: SearchSpace, search: Callable[[SearchSpace], ParallelPlan]) -> ParallelPlan:
    """The fastest of ``search(one_option(space, g))`` over the options ``space`` allows (module doc)."""
    options = space.grad_comm_options()
    if len(options) == 1:
        return dataclasses.replace(search(space), grad_comm=options[0])
    found: list[tuple[GradComm, ParallelPlan]] = []
    errors: list[PlanError] = []
    for gc in options:
        try:
            found.append((gc, dataclasses.replace(search(one_option(space, gc)), grad_comm=gc)))
        except PlanError as e:
            errors.append(e)
    if not found:
        raise errors[0]
    best_gc, best = found[0]
    for gc, p in found[1:]:  # strictly faster only: ties keep the less lossy option
        if p.predicted.step_time_s < best.predicted.step_time_s * (1 - 1e-9):
            best_gc, best = gc, p
    others = ", ".join(f"{gc.short()} {p.predicted.step_time_s * 1e3:.3f} ms" for gc, p in found if gc != best_gc)
    note = (f"gradient communication {best_gc.short()} ({best.predicted.step_time_s * 1e3:.3f} ms per step) chosen "
            f"from those allowed; the others predicted: {others or 'no plan'}")
    return dataclasses.replace(best, notes=best.notes + (note,))
