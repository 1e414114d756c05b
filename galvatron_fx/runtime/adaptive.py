"""Plans that adapt while training: observe, refit, re-plan and switch in place.

Contract: :class:`AdaptiveMixin` is a base of the parallel modules. ``pm.observe(steps)`` arms
the next ``steps`` ``train_step`` calls (:mod:`galvatron_fx.runtime.observe`);
``pm.observations()`` gathers them (collective); ``pm.refit(obs)`` refits the cost model the plan
was priced by (:func:`galvatron_fx.refit`); ``pm.replan(optimizer, ...)``
searches again — with the refitted model, and/or for another sequence length or global batch —
on rank 0, and when the new plan is predicted faster by more than ``threshold`` (or the shape
changed) switches ``pm`` to it **in place**: the same Python object then runs the new plan (a
pipelined one or not), and ``optimizer`` (the user's, any ``torch.optim`` optimizer built over
``pm.parameters()``) holds the new parameters with its state carried over. Every rank calls
these with the same arguments and reaches the same decision (rank 0's, broadcast).

State moves in memory, as the resharding checkpoints move it through files: each parameter's full
tensor (``pm.state_dict()``: gathered over its mesh, and over the pipeline from the stage that
holds it) is sliced into the new layout (``load_full_state_dict``); each elementwise optimizer
state (Adam's moments) likewise, parameter by parameter (a tensor of one parameter's full size
at a time), and scalar state (``step``) is copied. The loss curve continues as if the plan had
not changed (fp32: equal to an uninterrupted run within float rounding of the sums' order).

``compile(..., adapt=True)`` installs :meth:`AdaptiveMixin.adapt_after`: after ``warmup`` steps it
observes ``steps`` more, refits, re-plans once and logs what changed and why; after a switch it
measures the new plan over ``steps`` steps (after two of warm-up) and switches back when it runs
slower than the old one did by more than ``threshold`` — a prediction the run refutes is undone.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from galvatron_fx.errors import ConfigError

if TYPE_CHECKING:
    from galvatron_fx.ir.graph import ModelGraph
    from galvatron_fx.ir.plan import ParallelPlan

log = logging.getLogger(__name__)

__all__ = ["AdaptiveMixin", "Replan"]

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


class AdaptiveMixin:
    """The closed loop on a parallel module (see module doc)."""

    if TYPE_CHECKING:  # set by the parallel module
        plan: ParallelPlan
        mg: ModelGraph
        global_batch_size: int

    def observe(self, steps: int = 5, *, memory: bool = True) -> None:
        """Record the next ``steps`` training steps (per-layer times, sync, optimizer, step time;
        ``memory``: the peak too, on CPUs in one more step); :meth:`observations` gathers them."""
        from galvatron_fx.runtime.observe import start

        start(self, steps, memory)

    def observations(self, links: bool = True):
        """The observed steps of every rank, as one :class:`~galvatron_fx.runtime.observe.Observations`
        (collective); ``links``: time the plan's groups too."""
        from galvatron_fx.runtime.observe import finish

        return finish(self, links)

    def base_cost_model(self):
        """The cost model the plan was priced by: the one given to ``compile`` or the planner's
        default on the plan's cluster and precision."""
        args = self.__dict__.get("_compile_args") or {}
        if args.get("cost_model") is not None:
            return args["cost_model"]
        from galvatron_fx.cost_models import AnalyticCostModel
        from galvatron_fx.ir.strategy import Precision

        return AnalyticCostModel(self._cluster(), precision=Precision.named(self.plan.precision))

    def _cluster(self):
        from galvatron_fx.cluster import Cluster

        args = self.__dict__.get("_compile_args") or {}
        if args.get("cluster") is not None:
            return args["cluster"]
        if not self.plan.cluster:
            raise RuntimeError("this plan names no cluster: compile it with galvatron_fx.compile to re-plan")
        return Cluster.from_dict(self.plan.cluster)

    def refit(self, observations=None, *, fit=None):
        """A :class:`~galvatron_fx.cost_models.refit.Refit` of the plan's cost model from
        ``observations`` (default: :meth:`observations`, collective); ``fit``: which factors
        (default all of :data:`~galvatron_fx.cost_models.refit.FITS`)."""
        import galvatron_fx as gfx
        from galvatron_fx.cost_models.refit import FITS

        obs = observations if observations is not None else self.observations()
        return gfx.refit(self.plan, obs, mg=self.mg, cost_model=self.base_cost_model(), fit=tuple(fit or FITS))

    def replan(self, optimizer: torch.optim.Optimizer | None = None, *, refit=None, seq_len: int | None = None,
               global_batch_size: int | None = None, example_inputs=None, threshold: float = DEFAULT_THRESHOLD,
               force: bool = False, memory_budget: int | None = None, search=None) -> Replan:
        """Search again and switch to the new plan in place when it pays (see module doc).

        ``refit``: a :class:`~galvatron_fx.cost_models.refit.Refit` whose model the search uses
        (default: the plan's own model); ``seq_len`` / ``global_batch_size`` / ``example_inputs``:
        plan for another shape (progressive context, another batch) — always switches;
        ``threshold``: the least predicted gain (a fraction of the step) worth a switch;
        ``force``: switch to the searched plan whatever it gains; ``memory_budget`` (default the
        running plan's) and ``search`` (default ``compile``'s) bound the search. Returns a
        :class:`Replan`."""
        import galvatron_fx as gfx
        from galvatron_fx.api import plan_on_rank0

        args = self.__dict__.get("_compile_args")
        if args is None:
            raise RuntimeError("replan() needs the module galvatron_fx.compile() built (it keeps the model and the "
                               "arguments to build the new plan's module from)")
        model = args["model"]
        for name, v in (("seq_len", seq_len), ("global_batch_size", global_batch_size)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 2**30):
                raise ConfigError(f"replan({name}={v!r}): give a whole number >= 1 (the new {name.replace('_', ' ')})")
        cm = refit.cost_model if refit is not None else self.base_cost_model()
        overhead = refit.overhead_s if refit is not None else 0.0
        reshaped = seq_len is not None or global_batch_size is not None or example_inputs is not None
        ex_args, ex_kwargs = args["example_inputs"], args["example_kwargs"]
        if example_inputs is not None:
            ex_args, ex_kwargs = (tuple(example_inputs), {}) if not isinstance(example_inputs, dict) \
                else ((), dict(example_inputs))
        elif seq_len is not None:
            ex_args, ex_kwargs = resized_to(ex_args, ex_kwargs, seq_len, dim=1)
        gbs = global_batch_size or self.global_batch_size
        old = self.plan
        budget = memory_budget if memory_budget is not None else \
            (old.predicted.memory_budget_bytes or args["memory_budget"])  # (a hand-made plan records none)
        space = search if search is not None else args["search"]

        def run_search():
            # the running graph when the shape stays (its kinds are the ones the refit measured)
            mg0 = gfx.capture(model, ex_args, args["loss_fn"], example_kwargs=ex_kwargs) if reshaped else self.mg
            return gfx.plan(mg0, self._cluster(), global_batch_size=gbs, memory_budget=budget, search=space, precision=old.precision, cost_model=cm, progress=False,
                            name=old.model)

        new = plan_on_rank0(run_search)
        box: list[Any] = [None]
        if dist.get_rank() == 0:
            if reshaped:
                cur_s, decision = float("nan"), (True, "the shape changed: the new shape's plan runs")
            else:
                cur_s = gfx.price_plan(old, self.mg, cm).predicted.step_time_s + overhead
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
        """Run ``plan`` from now on, in place: build its module from the model ``compile`` was
        given, move the parameters, buffers and ``optimizer``'s state into it in memory, and make
        this object that module (collective)."""
        from galvatron_fx.api import _compile

        args = self.__dict__["_compile_args"]
        ex_args = args["example_inputs"] if example_inputs is None else example_inputs
        ex_kwargs = args["example_kwargs"] if example_kwargs is None else example_kwargs
        new = _compile(args["model"], args["cluster"] or self._cluster(), ex_args, ex_kwargs, args["loss_fn"],
                       plan.global_batch_size, plan.predicted.memory_budget_bytes or args["memory_budget"], plan,
                       args["search"])
        move_state(cast(nn.Module, self), new, optimizer)
        new.set_inputs(args.get("inputs", "global"))
        new.__dict__["_compile_args"] = {**args, "example_inputs": ex_args, "example_kwargs": ex_kwargs}
        ref = self.__dict__.get("_user_model_ref")
        self.__class__ = new.__class__
        self.__dict__ = new.__dict__
        if ref is not None:
            self.__dict__["_user_model_ref"] = ref

    def adapt_after(self, warmup: int = 3, steps: int = 5, threshold: float = DEFAULT_THRESHOLD) -> None:
        """After ``warmup`` more training steps, observe ``steps`` steps, refit, re-plan once and
        log (rank 0: stderr) what changed and why; a switch is measured and undone when the new
        plan runs slower (``compile(adapt=True)`` calls this; see module doc)."""
        from galvatron_fx.runtime.observe import recorder

        pm = self
        state = {"left": warmup, "phase": "warmup"}

        def say(lines: list[str]) -> None:
            if dist.get_rank() == 0:
                text = "\n".join(lines)
                log.info(text)
                print(text, file=sys.stderr)

        def after(optimizer):
            rec = recorder(pm)  # (a switch makes pm another module: its own recorder)
            if state["phase"] == "warmup":
                state["left"] -= 1
                if state["left"] <= 0:
                    state["phase"] = "observe"
                    rec.arm(steps)
            elif state["phase"] == "observe" and not rec.armed:
                rec.after_step = None
                obs = pm.observations()
                fit = pm.refit(obs)
                result = pm.replan(optimizer, refit=fit, threshold=threshold)
                pm.__dict__["adapt_report"] = (fit, result)
                say(["galvatron_fx: refitted the cost model from the run:"]
                    + [f"  {x}" for x in fit.lines()] + [f"  {x}" for x in result.lines()])
                if result.switched:  # measure the new plan: keep it only if it is faster
                    state.update(phase="verify", old=result.old_plan, old_s=obs.step_s, left=2)
                    recorder(pm).after_step = after
            elif state["phase"] == "verify":
                if state["left"] > 0:  # the new module's first steps warm up
                    state["left"] -= 1
                    if state["left"] == 0:
                        rec.arm(steps, memory=False)
                elif not rec.armed:
                    rec.after_step = None
                    new_s = pm.observations(links=False).step_s
                    fit, result = pm.__dict__["adapt_report"]
                    if new_s > state["old_s"] * (1 + threshold):
                        pm.switch_to(state["old"], optimizer)
                        pm.__dict__["adapt_report"] = (fit, dataclasses.replace(
                            result, switched=False, reason=f"switched back: the new plan measured {new_s * 1e3:.1f} ms "
                                                           f"per step against {state['old_s'] * 1e3:.1f} ms"))
                        say([f"galvatron_fx: the new plan measured {new_s * 1e3:.1f} ms per step, the old one "
                             f"{state['old_s'] * 1e3:.1f} ms: switched back"])
                    else:
                        say([f"galvatron_fx: the new plan measured {new_s * 1e3:.1f} ms per step, the old one "
                             f"{state['old_s'] * 1e3:.1f} ms: kept"])

        recorder(pm).after_step = after


def _optimizer_state_by_fqn(pm: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Every parameter's optimizer state as full tensors by FQN (identical on every rank:
    gathered over each slot's mesh and broadcast from a rank of the stage that holds it), and the
    param group index of each FQN."""
    from galvatron_fx.runtime.checkpoint.slots import bodies_of, is_elementwise, optimizer_slots, slot_view

    slot_of = optimizer_slots(bodies_of(pm), optimizer)
    mine: dict[str, tuple[torch.Tensor, dict, int]] = {}
    for gi, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            s = slot_of[id(p)]
            if s.fqn not in mine and p in optimizer.state:
                mine[s.fqn] = (p, optimizer.state[p], gi)
    # what each rank holds: fqn -> (state keys: elementwise shape/dtype or a scalar value), group
    desc = {fqn: ({k: (("full", tuple(slot_of[id(p)].global_shape), str(v.dtype).removeprefix("torch."))
                       if isinstance(v, torch.Tensor) and is_elementwise(p, v) else ("scalar", v.detach().cpu()
                                                                                          if isinstance(v, torch.Tensor) else v))
                   for k, v in st.items()}, gi) for fqn, (p, st, gi) in mine.items()}
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, desc)
    holders: dict[str, int] = {}
    merged: dict[str, tuple[dict, int]] = {}
    for r, d in enumerate(every):
        for fqn, v in d.items():
            holders.setdefault(fqn, r)
            merged.setdefault(fqn, v)
    out: dict[str, dict[str, Any]] = {}
    device = next((t.device for t in pm.parameters()), torch.device("cpu"))
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    for fqn in sorted(merged):
        keys, _gi = merged[fqn]
        out[fqn] = {}
        for k in sorted(keys):
            kind, *rest = keys[k]
            if kind == "scalar":
                out[fqn][k] = rest[0]
                continue
            shape, dtype = rest
            if fqn in mine:
                p, st, _ = mine[fqn]
                full = slot_view(slot_of[id(p)], st[k]).full_tensor().to(device)
            else:
                full = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            dist.broadcast(full, src=holders[fqn])
            out[fqn][k] = full
    return out, {fqn: v[1] for fqn, v in merged.items()}


@torch.no_grad()
def move_state(old: nn.Module, new: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Parameters and buffers of ``old`` into ``new`` and ``optimizer`` re-pointed at ``new``'s
    parameters with its state resharded (collective; see module doc)."""
    from galvatron_fx.runtime.checkpoint import load_full_state_dict
    from galvatron_fx.runtime.checkpoint.slots import all_slots, bodies_of, is_elementwise, set_full

    states, group_of = _optimizer_state_by_fqn(old, optimizer) if optimizer is not None else ({}, {})
    load_full_state_dict(new, old.state_dict(), strict=False)
    if optimizer is None:
        return
    new_slots = all_slots(bodies_of(new))
    by_param: dict[int, Any] = {}
    for s in new_slots:
        by_param.setdefault(id(s.param), s)
    params = [s.param for s in new_slots if by_param[id(s.param)] is s]
    groups: list[list[Any]] = [[] for _ in optimizer.param_groups]
    for p in params:
        groups[group_of.get(by_param[id(p)].fqn, 0)].append(p)
    optimizer.state.clear()
    for g, ps in zip(optimizer.param_groups, groups):
        g["params"] = ps
        if "param_names" in g:  # an optimizer built over pm.named_parameters(): the FQNs, in order
            g["param_names"] = [by_param[id(p)].fqn for p in ps]
    for p in params:
        s = by_param[id(p)]
        saved = states.get(s.fqn)
        if not saved:
            continue
        st = {}
        for k, v in saved.items():
            if isinstance(v, torch.Tensor) and v.shape == torch.Size(s.global_shape) and v.ndim > 0:
                t = torch.zeros_like(p)
                if not is_elementwise(p, t):
                    continue
                set_full(s, t, v)
                st[k] = t
            else:
                st[k] = v.clone() if isinstance(v, torch.Tensor) else v
        optimizer.state[p] = st


def _replace_dim(x: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    if x.ndim <= dim or x.shape[dim] == size:
        return x
    reps = -(-size // x.shape[dim])
    shape = [1] * x.ndim
    shape[dim] = reps
    return x.repeat(*shape).narrow(dim, 0, size).clone()


def resized_to(args: tuple, kwargs: dict, size: int, dim: int) -> tuple[tuple, dict]:
    """Example inputs with dim ``dim`` repeated or cut to ``size`` (a longer context: token ids and
    labels of ``size`` positions)."""
    f = lambda v: _replace_dim(v, size, dim) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return tuple(f(a) for a in args), {k: f(v) for k, v in kwargs.items()}

