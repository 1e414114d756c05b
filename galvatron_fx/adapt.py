"""Plans that adapt while training: observe, refit, re-plan and switch, above the runtime.

Contract: ``galvatron_fx.compile`` hands every module it builds a :class:`ClosedLoop` (the
module's ``closed_loop``), the session that owns the running module and the
:class:`~galvatron_fx.build.CompileRequest` it was built from. ``pm.observe(steps)`` arms the next
``steps`` ``train_step`` calls (:mod:`galvatron_fx.runtime.observe`); ``pm.observations()``
gathers them (collective); ``pm.refit(obs)`` — :meth:`ClosedLoop.refit` — refits the cost model
the plan was priced by (:func:`galvatron_fx.refit`); ``pm.replan(optimizer, ...)`` —
:meth:`ClosedLoop.replan` — searches again, with the refitted model and/or for another sequence
length or global batch, on rank 0, and when the new plan is predicted faster by more than
``threshold`` (or the shape changed) switches to it: the request built again with the new plan
(:func:`galvatron_fx.build.build`), the state moved into that module, and the session's module
*becomes* it — the same Python object the user holds (their loop, their optimizer, a Hugging Face
``Trainer`` keep working), pipelined or not; ``optimizer`` (any ``torch.optim`` optimizer built
over ``pm.parameters()``) holds the new parameters with its state carried over. Every rank calls
these with the same arguments and reaches the same decision (rank 0's, broadcast).

State moves in memory (:func:`galvatron_fx.runtime.adaptive.move_state`), as the resharding
checkpoints move it through files: each parameter's full tensor sliced into the new layout, each
elementwise optimizer state likewise, scalar state copied. The loss curve continues as if the plan
had not changed (fp32: equal to an uninterrupted run within float rounding of the sums' order).

``compile(..., adapt=True)`` calls :meth:`ClosedLoop.adapt_after`: a step hook on the module
(:class:`~galvatron_fx.runtime.hooks.Hooks`) that after ``warmup`` steps observes ``steps`` more,
refits, re-plans once and logs what changed and why; after a switch it measures the new plan over
``steps`` steps (after two of warm-up) and switches back when it runs slower than the old one did
by more than ``threshold`` — a prediction the run refutes is undone.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from galvatron_fx.build import CompileRequest, build, plan_on_rank0
from galvatron_fx.errors import ConfigError
from galvatron_fx.runtime.adaptive import move_state, resized_to
from galvatron_fx.runtime.hooks import Hooks

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_THRESHOLD", "ClosedLoop", "Replan"]

DEFAULT_THRESHOLD = 0.05


@dataclass(frozen=True)
class Replan:
    """What :meth:`AdaptiveMixin.replan` decided: the plans, their predicted step times (the
    current one under the model the search used), whether it switched, and why."""

    switched: bool
    old_plan: Any
    new_plan: Any
    old_predicted_s: float
    new_predicted_s: float
    reason: str

    def lines(self) -> list[str]:
        def desc(p) -> str:
            return p.explain().splitlines()[0].removeprefix("plan for ")

        out = [f"current plan: {desc(self.old_plan)}; predicted {self.old_predicted_s * 1e3:.1f} ms per step"]
        if self.new_plan is not None and self.new_plan.plan_hash() != self.old_plan.plan_hash():
            out.append(f"searched plan: {desc(self.new_plan)}; predicted {self.new_predicted_s * 1e3:.1f} ms per step")
        out.append(("switched: " if self.switched else "kept: ") + self.reason)
        return out


class ClosedLoop:
    """The session of one compiled module: the module running now (``module``), the request it
    was built from, and what the last automatic re-plan found (``report``: ``(refit, Replan)``).
    See the module doc."""

    def __init__(self, request: CompileRequest, module: Any):
        self.request = request
        self.module: Any = module  # a ParallelModule or PipelineModule
        self.report: tuple[Any, Replan] | None = None
        module.closed_loop = self

    def cluster(self):
        """The cluster the plan is for: the one given to ``compile``, else the plan's own."""
        from galvatron_fx.cluster import Cluster

        if self.request.cluster is not None:
            return self.request.cluster
        plan = self.module.plan
        if not plan.cluster:
            raise RuntimeError("this plan names no cluster: compile it with galvatron_fx.compile to re-plan")
        return Cluster.from_dict(plan.cluster)

    def base_cost_model(self):
        """The cost model the plan was priced by: the one given to ``compile`` or the planner's
        default on the plan's cluster and precision."""
        if self.request.cost_model is not None:
            return self.request.cost_model
        from galvatron_fx.cost_models import AnalyticCostModel
        from galvatron_fx.ir.strategy import Precision

        return AnalyticCostModel(self.cluster(), precision=Precision.named(self.module.plan.precision))

    def refit(self, observations=None, *, fit=None):
        """A :class:`~galvatron_fx.cost_models.refit.Refit` of the plan's cost model from
        ``observations`` (default: the module's ``observations()``, collective); ``fit``: which
        factors (default all of :data:`~galvatron_fx.cost_models.refit.FITS`)."""
        import galvatron_fx as gfx
        from galvatron_fx.cost_models.refit import FITS

        pm = self.module
        obs = observations if observations is not None else pm.observations()
        return gfx.refit(pm.plan, obs, mg=pm.mg, cost_model=self.base_cost_model(), fit=tuple(fit or FITS))

    def replan(self, optimizer: torch.optim.Optimizer | None = None, *, refit=None, seq_len: int | None = None,
               global_batch_size: int | None = None, example_inputs=None, threshold: float = DEFAULT_THRESHOLD,
               force: bool = False, memory_budget: int | None = None, search=None) -> Replan:
        """Search again and switch to the new plan when it pays (see module doc).

        ``refit``: a :class:`~galvatron_fx.cost_models.refit.Refit` whose model the search uses
        (default: the plan's own model); ``seq_len`` / ``global_batch_size`` / ``example_inputs``:
        plan for another shape (progressive context, another batch) — always switches;
        ``threshold``: the least predicted gain (a fraction of the step) worth a switch;
        ``force``: switch to the searched plan whatever it gains; ``memory_budget`` (default the
        running plan's) and ``search`` (default ``compile``'s) bound the search. Returns a
        :class:`Replan`."""
        import galvatron_fx as gfx

        pm, req = self.module, self.request
        for name, v in (("seq_len", seq_len), ("global_batch_size", global_batch_size)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 2**30):
                raise ConfigError(f"replan({name}={v!r}): give a whole number >= 1 (the new {name.replace('_', ' ')})")
        cm = refit.cost_model if refit is not None else self.base_cost_model()
        overhead = refit.overhead_s if refit is not None else 0.0
        reshaped = seq_len is not None or global_batch_size is not None or example_inputs is not None
        ex_args, ex_kwargs = req.example_inputs, dict(req.example_kwargs)
        if example_inputs is not None:
            ex_args, ex_kwargs = (tuple(example_inputs), {}) if not isinstance(example_inputs, dict) \
                else ((), dict(example_inputs))
        elif seq_len is not None:
            ex_args, ex_kwargs = resized_to(ex_args, ex_kwargs, seq_len, dim=1)
        gbs = global_batch_size or pm.global_batch_size
        old = pm.plan
        budget = memory_budget if memory_budget is not None else \
            (old.predicted.memory_budget_bytes or req.memory_budget)  # (a hand-made plan records none)
        space = search if search is not None else req.search

        def run_search():
            # the running graph when the shape stays (its kinds are the ones the refit measured)
            mg0 = gfx.capture(req.model, ex_args, req.loss_fn, example_kwargs=ex_kwargs) if reshaped else pm.mg
            return gfx.plan(mg0, self.cluster(), global_batch_size=gbs, memory_budget=budget, search=space,
                            precision=old.precision, cost_model=cm, progress=False, name=old.model)

        new = plan_on_rank0(run_search)
        box: list[Any] = [None]
        if dist.get_rank() == 0:
            if reshaped:
                cur_s, decision = float("nan"), (True, "the shape changed: the new shape's plan runs")
            else:
                cur_s = gfx.price_plan(old, pm.mg, cm).predicted.step_time_s + overhead
                new_s = new.predicted.step_time_s + overhead
                if new.plan_hash() == old.plan_hash():
                    decision = (False, "the search chose the running plan again")
                elif force or new_s < cur_s * (1 - threshold):
                    decision = (True, f"predicted {cur_s / new_s:.2f}× faster" + (" (forced)" if force else ""))
                else:
                    decision = (False, f"predicted {cur_s / max(new_s, 1e-12):.3f}× faster, under the "
                                       f"{1 / (1 - threshold):.3f}× a switch needs")
            box = [(cur_s, decision)]
        dist.broadcast_object_list(box, src=0)
        cur_s, (switch, reason) = box[0]
        result = Replan(switched=switch, old_plan=old, new_plan=new, old_predicted_s=cur_s,
                        new_predicted_s=new.predicted.step_time_s + overhead, reason=reason)
        if switch:
            self.switch_to(new, optimizer, example_inputs=ex_args, example_kwargs=ex_kwargs)
        return result

    def switch_to(self, plan, optimizer: torch.optim.Optimizer | None = None, *, example_inputs=None,
                  example_kwargs=None) -> None:
        """Run ``plan`` from now on: build its module from the request (with ``plan`` and, when
        given, the example inputs of a new shape), move the parameters, buffers and
        ``optimizer``'s state into it in memory, and make the session's module that module
        (collective)."""
        req = self.request
        ex_args = req.example_inputs if example_inputs is None else tuple(example_inputs)
        ex_kwargs = dict(req.example_kwargs) if example_kwargs is None else dict(example_kwargs)
        new = build(dataclasses.replace(
            req, cluster=req.cluster if req.cluster is not None else self.cluster(), example_inputs=ex_args,
            example_kwargs=ex_kwargs, global_batch_size=plan.global_batch_size,
            memory_budget=plan.predicted.memory_budget_bytes or req.memory_budget, plan=plan, precision=None,
            progress=None, dump_dir=None))
        move_state(self.module, new, optimizer)
        self.request = dataclasses.replace(req, example_inputs=ex_args, example_kwargs=ex_kwargs)
        new.closed_loop = self
        _become(self.module, new)

    def adapt_after(self, warmup: int = 3, steps: int = 5, threshold: float = DEFAULT_THRESHOLD) -> None:
        """After ``warmup`` more training steps, observe ``steps`` steps, refit, re-plan once and
        log (rank 0: stderr) what changed and why; a switch is measured and undone when the new
        plan runs slower (``compile(adapt=True)`` calls this; see module doc)."""
        from galvatron_fx.runtime.observe import recorder

        state: dict[str, Any] = {"left": warmup, "phase": "warmup"}

        def say(lines: list[str]) -> None:
            if dist.get_rank() == 0:
                text = "\n".join(lines)
                log.info(text)
                print(text, file=sys.stderr)

        def hook(call, batch, optimizer, **kw):
            loss = call(batch, optimizer, **kw)
            after(optimizer)
            return loss

        def install() -> None:  # outside the recorder's own step hook: after it counted the step
            recorder(self.module)
            self.module.hooks.step.insert(0, hook)

        def uninstall() -> None:
            Hooks.remove(self.module.hooks.step, hook)

        def after(optimizer) -> None:
            pm = self.module
            rec = recorder(pm)  # (a switch gives pm another plan's module: its own recorder)
            if state["phase"] == "warmup":
                state["left"] -= 1
                if state["left"] <= 0:
                    state["phase"] = "observe"
                    rec.arm(steps)
            elif state["phase"] == "observe" and not rec.armed:
                uninstall()
                obs = pm.observations()
                fit = self.refit(obs)
                result = self.replan(optimizer, refit=fit, threshold=threshold)
                self.report = (fit, result)
                say(["galvatron_fx: refitted the cost model from the run:"]
                    + [f"  {x}" for x in fit.lines()] + [f"  {x}" for x in result.lines()])
                if result.switched:  # measure the new plan: keep it only if it is faster
                    state.update(phase="verify", old=result.old_plan, old_s=obs.step_s, left=2)
                    install()
            elif state["phase"] == "verify":
                if state["left"] > 0:  # the new module's first steps warm up
                    state["left"] -= 1
                    if state["left"] == 0:
                        rec.arm(steps, memory=False)
                elif not rec.armed:
                    uninstall()
                    new_s = pm.observations(links=False).step_s
                    assert self.report is not None
                    fit, result = self.report
                    if new_s > state["old_s"] * (1 + threshold):
                        self.switch_to(state["old"], optimizer)
                        self.report = (fit, dataclasses.replace(
                            result, switched=False, reason=f"switched back: the new plan measured {new_s * 1e3:.1f} ms "
                                                           f"per step against {state['old_s'] * 1e3:.1f} ms"))
                        say([f"galvatron_fx: the new plan measured {new_s * 1e3:.1f} ms per step, the old one "
                             f"{state['old_s'] * 1e3:.1f} ms: switched back"])
                    else:
                        say([f"galvatron_fx: the new plan measured {new_s * 1e3:.1f} ms per step, the old one "
                             f"{state['old_s'] * 1e3:.1f} ms: kept"])

        install()


def _become(held: nn.Module, new: nn.Module) -> None:
    """Make the object the user holds run ``new``: it takes ``new``'s class and state (both
    objects then share one state). The user's loop, optimizer and any ``Trainer`` hold ``held``, not
    the session: a switch must not leave them a module that no longer trains. The user model it
    writes weights back to stays the one it had."""
    ref = held.__dict__.get("_user_model_ref")
    held.__class__ = new.__class__
    held.__dict__ = new.__dict__
    if ref is not None:
        held.__dict__["_user_model_ref"] = ref
