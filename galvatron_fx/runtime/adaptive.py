"""The running module's side of the closed loop: observation, and state moved between plans in memory.

Contract: :class:`AdaptiveMixin` is a base of the parallel modules. ``pm.observe(steps)`` arms
the next ``steps`` ``train_step`` calls and ``pm.observations()`` gathers them (collective;
:mod:`galvatron_fx.runtime.observe`). ``pm.refit``, ``pm.replan``, ``pm.switch_to`` and
``pm.adapt_after`` are the session's (:class:`galvatron_fx.adapt.ClosedLoop`, which
``galvatron_fx.compile`` hands the module as ``closed_loop``): the runtime imports nothing above
it. :func:`move_state` moves parameters, buffers and an optimizer's state from one module into
another built for another plan, in memory and collectively; :func:`resized_to` makes example
inputs for another sequence length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from galvatron_fx.runtime.meshes import device_type

if TYPE_CHECKING:
    from galvatron_fx.ir.graph import ModelGraph
    from galvatron_fx.ir.plan import ParallelPlan

__all__ = ["AdaptiveMixin", "move_state", "resized_to"]


class AdaptiveMixin:
    """Observation, and the session's closed loop reached from the module (see module doc)."""

    closed_loop: Any = None  # the galvatron_fx.adapt.ClosedLoop compile made for this module

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

    def _loop(self, what: str):
        if self.closed_loop is None:
            raise RuntimeError(f"{what}() needs the module galvatron_fx.compile() built (its session keeps the model "
                               "and the arguments to build the new plan's module from)")
        return self.closed_loop

    def base_cost_model(self):
        """The cost model the plan was priced by (:meth:`galvatron_fx.adapt.ClosedLoop.base_cost_model`)."""
        return self._loop("base_cost_model").base_cost_model()

    def refit(self, observations=None, *, fit=None):
        """:meth:`galvatron_fx.adapt.ClosedLoop.refit`: the plan's cost model refitted from
        ``observations`` (default: :meth:`observations`, collective)."""
        return self._loop("refit").refit(observations, fit=fit)

    def replan(self, optimizer: torch.optim.Optimizer | None = None, **kw):
        """:meth:`galvatron_fx.adapt.ClosedLoop.replan`: search again and switch to the new plan
        when it pays; this object then runs it. Returns a :class:`galvatron_fx.adapt.Replan`."""
        return self._loop("replan").replan(optimizer, **kw)

    def switch_to(self, plan, optimizer: torch.optim.Optimizer | None = None, **kw) -> None:
        """:meth:`galvatron_fx.adapt.ClosedLoop.switch_to`: run ``plan`` from now on (collective)."""
        self._loop("switch_to").switch_to(plan, optimizer, **kw)

    def adapt_after(self, *args, **kw) -> None:
        """:meth:`galvatron_fx.adapt.ClosedLoop.adapt_after`: observe, refit and re-plan once after
        ``warmup`` steps."""
        self._loop("adapt_after").adapt_after(*args, **kw)

    @property
    def adapt_report(self):
        """``(refit, Replan)`` of the last automatic re-plan (``compile(adapt=True)``), or None."""
        return self.closed_loop.report if self.closed_loop is not None else None


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
    if device_type() == "cuda":
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

