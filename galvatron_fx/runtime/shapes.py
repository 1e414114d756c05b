"""shapes — batches of other shapes than the planned one: a smaller last batch, an evaluation
batch, a shorter sequence, under the same plan.

Contract: :class:`ShapeVariants` is a base of ``ParallelModule``; the host calls
:meth:`ShapeVariants._init_shapes` at the end of its ``__init__`` and routes every batch through
:meth:`ShapeVariants._micro_batches` and every micro-batch through :meth:`ShapeVariants._activate`.
``PipelineModule`` has the model-level half, :class:`BatchShapes` (the split, the recapture), and
switches its chunks' ``ParallelModule`` bodies itself (:meth:`ShapeVariants._add_variant`,
:meth:`ShapeVariants._use_variant`), with a schedule per variant and micro-batch count.
A batch may be any size, and every other dim up to the captured one (a longer one would need
memory the plan did not price: refused, saying to re-plan). It runs as ``m'`` equal
micro-batches, ``m'`` the fewest that keep each at most the planned micro-batch
and divisible by every layer's data-parallel degree (the planned shape: the plan's own ``m``); a
batch no such split exists for is refused, naming its shape and what to pass instead.

Algorithm: a micro-batch shape other than the captured one is a *variant*: the user's model is
captured again at that shape (without costs or probe; the batched values and batch scaling are
the captured graph's, by node name), checked to have the same layers and parameters, and lowered
under the same plan on the same meshes (:func:`~galvatron_fx.passes.lower_program.lower`: the
plan's saved placements, by node name, re-solved only where the plan's cluster must, as at
compile). Each executor keeps its parameters, FSDP wrapping, buckets and offload; what the shape
changes — its placed graph (:class:`~galvatron_fx.passes.apply_placements.PlacedLayer`'s state)
and its lowered program — is swapped in when a micro-batch of that shape runs and swapped back
for the next of another shape. A backward always runs the graphs its forward ran (autograd holds
them). Variants are cached, least recently used first out beyond :attr:`shape_cache_limit`;
:meth:`ShapeVariants.shape_cache_info` says what is cached and how many recaptures there were.
Every rank sees the same shapes (the global batch, or equal shares gathered into it), so every
rank builds a variant at the same call.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from galvatron_fx.errors import ConfigError, PlanError

if TYPE_CHECKING:
    import weakref

    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from galvatron_fx.ir.graph import ModelGraph
    from galvatron_fx.ir.plan import ParallelPlan
    from galvatron_fx.runtime.layer_exec import Executors, LayerExecutor

log = logging.getLogger(__name__)

__all__ = ["ShapeVariants"]

# what a placed layer's graph and lowering decide, and so what a variant swaps (see the module doc)
_PLACED = ("gm", "option", "_plan", "_in_place", "_written", "_param_of", "_inputs", "input_names",
           "input_grads", "param_keys", "mismatches")
_SWAPPED = _PLACED + ("lowered", "feeds")


def _signature(tensors: Sequence) -> tuple:
    return tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else None for t in tensors)


class BatchShapes:
    """The model-level half (module doc): a batch split into equal micro-batches, and the user's
    model captured again at a micro-batch's shape. The host has ``mg``, ``plan`` and
    ``inputs_mode``, and calls :meth:`_init_batch_shapes` in its ``__init__``."""

    shape_cache_limit = 8

    if TYPE_CHECKING:  # set by the host module and its other bases, or by :meth:`_init_batch_shapes`
        mg: ModelGraph
        plan: ParallelPlan
        _user_model_ref: weakref.ReferenceType | None
        _shape_model: nn.Module | None
        _capture_loss_fn: Callable[..., torch.Tensor] | None
        _variants: collections.OrderedDict[tuple, Any]
        _recaptures: int
        _base_sig: tuple
        _dp_lcm: int

    def _init_batch_shapes(self, model, keep_model: bool, layers: Sequence[int]) -> None:
        d = self.__dict__
        # the module to capture again (not a submodule: its parameters are not this one's);
        # a pipeline's chunks hold none (their pipeline does)
        d["_shape_model"] = model if keep_model else None
        d["_capture_loss_fn"] = None  # compile() sets the loss_fn the model was captured with
        d["_variants"] = collections.OrderedDict()  # signature -> what runs that shape
        d["_recaptures"] = 0
        d["_base_sig"] = tuple((tuple(s), None) for s in self.mg.example_shapes)
        # a micro-batch splits evenly over every layer's data-parallel degree
        d["_dp_lcm"] = math.lcm(*(self.plan.layers[i].dp for i in layers))

    # ---- what the user sees -------------------------------------------------------------------
    def release_model(self) -> None:
        """Drop this module's reference to the model it was built from (its memory is freed if
        nothing else holds it): batches of a shape not cached yet are then refused."""
        self.__dict__["_shape_model"] = None

    def shape_cache_info(self) -> dict:
        """The micro-batch shapes with a lowered program besides the captured one, the cache's
        limit, and how many times the model was captured again for a new shape."""
        return {"shapes": [[list(s[0]) for s in sig if s is not None] for sig in self._variants],
                "size": len(self._variants), "limit": self.shape_cache_limit, "recaptures": self._recaptures}

    # ---- batches -------------------------------------------------------------------------------
    def _micro_batches(self, batch: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
        """``batch`` (a global batch, or one micro-batch) as equal micro-batches (module doc)."""
        batch = list(batch)
        self._check_sizes(batch)
        first = next((x for x in batch if isinstance(x, torch.Tensor) and x.ndim >= 1), None)
        if first is None:
            return [batch]
        n = first.shape[0]
        planned_micro = self.mg.example_shapes[0][0] if self.mg.example_shapes and self.mg.example_shapes[0] else n
        dp = self._dp_lcm
        coupled = bool(self.mg.coupled())
        for m in range(1, n + 1):
            if n % m or n // m > planned_micro or (n // m) % dp or (coupled and m > 1):
                continue
            return [[x.chunk(m, dim=0)[i] if isinstance(x, torch.Tensor) and x.ndim >= 1 else x for x in batch]
                    for i in range(m)]
        local = getattr(self, "inputs_mode", "global") != "global"
        raise ConfigError(
            f"a batch of {n} samples{' (the shares gathered)' if local else ''} cannot run under this plan: it runs "
            f"in equal micro-batches of at most {planned_micro} samples, each split evenly over data-parallel degree "
            f"{dp}{' in one micro-batch (a loss that couples samples)' if coupled else ''}; pass a multiple of {dp} "
            f"samples (a DataLoader's drop_last=True, or pad the last batch)")

    def _check_sizes(self, batch: Sequence) -> None:
        """Every dim of every input but the batch at most the captured micro-batch's (the batch
        may be any size that splits into micro-batches no larger than the planned one)."""
        names, shapes = self.mg.input_names, [tuple(s) for s in self.mg.example_shapes]
        if len(batch) != len(names):
            raise ValueError(f"expected inputs ({', '.join(names)}), got {len(batch)}")
        for name, x, want in zip(names, batch, shapes):
            if not isinstance(x, torch.Tensor) or not want:
                continue
            if x.ndim != len(want):
                raise ValueError(f"input {name!r} has shape {list(x.shape)}; the model was captured with "
                                 f"{list(want)} per micro-batch ({len(want)} dims)")
            if any(g > w for g, w in zip(x.shape[1:], want[1:])):
                raise ConfigError(
                    f"input {name!r} of shape {list(x.shape)} is larger than this plan runs: at most "
                    f"{['any'] + list(want[1:])} (micro-batches of {list(want)}), the memory the plan was made for. "
                    "Pass shorter sequences, or re-plan for the longer one (pm.replan(seq_len=...), or compile "
                    "with that example)")

    def _is_base(self, sig: tuple) -> bool:
        return len(sig) == len(self._base_sig) and all(
            (s is None) == (b is None) and (s is None or s[0] == b[0]) for s, b in zip(sig, self._base_sig))

    def _call_form(self, inputs: Sequence) -> tuple[tuple, dict]:
        """The positional and keyword arguments of a call of the user's model with ``inputs``."""
        from galvatron_fx.ir.graph import InputInfo

        infos = self.mg.inputs or [InputInfo(name=n, key=i) for i, n in enumerate(self.mg.input_names)]
        it = iter(inputs)
        pos: dict[int, object] = {}
        kw: dict[str, object] = {}
        for info in infos:
            value = next(it) if info.is_tensor else info.value
            if isinstance(info.key, int):
                pos[info.key] = value
            else:
                kw[info.key] = value
        return tuple(pos[i] for i in sorted(pos)), kw

    def _recapture(self, inputs: Sequence):
        from galvatron_fx.frontend.capture import capture
        from galvatron_fx.runtime.precision import runtime_model

        model = self._shape_model if self._shape_model is not None else \
            self._user_model_ref() if self._user_model_ref is not None else None
        if model is None:
            shapes = [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
            raise ConfigError(f"a micro-batch of shapes {shapes} (the plan's: {[list(s) for s in self.mg.example_shapes]}) "
                              "needs the model captured again at that shape, but pm.release_model() let it go: "
                              "pass batches of the shapes already run, or keep the model")
        args, kwargs = self._call_form(inputs)
        return capture(runtime_model(model, self.plan.precision), args, self._capture_loss_fn,
                       example_kwargs=kwargs, annotate=False, probe=False, name=self.mg.name)

    def _recapture_checked(self, sig: tuple, inputs: Sequence):
        """The model captured at ``inputs``' shapes, checked to have the planned layers and
        parameters, with the captured graph's batched values and batch scaling."""
        mg = self._recapture(inputs)
        base = self.mg
        if [l.name for l in mg.layers] != [l.name for l in base.layers] or \
                [sorted(l.param_names) for l in mg.layers] != [sorted(l.param_names) for l in base.layers]:
            raise PlanError(f"{base.name} at shapes {[list(s[0]) for s in sig if s]} captures to other layers than "
                            "at the planned shape (a shape-dependent branch in the model): re-plan at this shape")
        mg.batched, mg.batch_scaling = set(base.batched), base.batch_scaling
        self.__dict__["_recaptures"] = self._recaptures + 1
        return mg

class ShapeVariants(BatchShapes):
    """The executors' half (module doc): each variant's placed graphs and lowered programs,
    swapped in per micro-batch."""

    if TYPE_CHECKING:  # set or defined by the host module, or set by :meth:`_init_shapes`
        layer_ids: Sequence[int]
        executors: Executors
        _resolve: Callable | None
        _base_state: dict[int, dict] | None
        _active: tuple | None

        def mesh(self, dp: int, tp: int) -> DeviceMesh: ...

    def _init_shapes(self, model, resolve, keep_model: bool) -> None:
        self._init_batch_shapes(model, keep_model, self.layer_ids)
        d = self.__dict__
        d["_resolve"] = resolve
        d["_base_state"] = None  # the captured shape's state, kept once a variant exists
        d["_active"] = None  # the signature whose state the executors hold (None: the captured one)

    # ---- variants ------------------------------------------------------------------------------
    def _activate(self, inputs: Sequence) -> None:
        """Make the executors run micro-batches shaped as ``inputs`` (module doc)."""
        sig = _signature(inputs)
        key = None if self._is_base(sig) else sig
        if key is not None and key not in self._variants:
            with torch.enable_grad():  # (an evaluation's first call: the program has a backward all the same)
                self._build_variant(key, inputs)
        self._use_variant(key)

    def _swap(self, state: dict) -> None:
        for k, ex in enumerate(self.executors):
            for attr, value in state[k].items():
                setattr(ex, attr, value)

    @staticmethod
    def _state_of(ex) -> dict:
        return {attr: getattr(ex, attr) for attr in _SWAPPED}

    def _build_variant(self, sig: tuple, inputs: Sequence) -> None:
        t0 = time.perf_counter()
        self._add_variant(sig, self._recapture_checked(sig, inputs))
        log.info("galvatron_fx: micro-batches of shapes %s captured and lowered under the plan in %.1f s (%d shapes "
                 "cached, %d recaptures)", [list(s[0]) for s in sig if s], time.perf_counter() - t0,
                 len(self._variants), self._recaptures)

    def _use_variant(self, sig: tuple | None) -> None:
        """Make the executors run the variant ``sig`` (added by :meth:`_add_variant`), or the
        captured shape (None): a pipeline's chunks are switched so, by their pipeline."""
        if sig == self._active:
            return
        if sig is None:
            self._swap(cast("dict[int, dict]", self._base_state))  # (kept once a variant exists)
        else:
            self._variants.move_to_end(sig)
            self._swap(self._variants[sig])
        self.__dict__["_active"] = sig

    def _add_variant(self, sig: tuple, mg) -> None:
        """Lower this module's layers of ``mg`` (the model captured at the micro-batch shapes
        ``sig``) under the plan, and cache what the executors swap in for it."""
        from galvatron_fx.ir.recompute import Recompute
        from galvatron_fx.passes.apply_placements import PlacedLayer
        from galvatron_fx.passes.lower_program import lower as lower_program
        from galvatron_fx.runtime.lowered import _Lowered

        micro = next((s[0][0] for s in sig if s is not None and s[0]), 1)
        widest = max(lp.dp for lp in self.plan.layers)
        k = self.plan.num_microbatches  # (the plan's own count, valid for its schedule: micro-batches of `micro`)
        plan = dataclasses.replace(self.plan, global_batch_size=micro * k, micro_batch_size=max(1, micro // widest))
        program = lower_program(mg, plan, mesh_of=lambda _stage, dp, tp: self.mesh(dp, tp), resolve=self._resolve,
                                layers=self.layer_ids)
        by_name = {lay.name: lay for lay in program.layers}
        fqns = {node: p.name for p in mg.params.values() for node in p.nodes}
        if self._base_state is None:
            self.__dict__["_base_state"] = {k: self._state_of(ex) for k, ex in enumerate(self.executors)}
        state: dict[int, dict] = {}
        shared: dict[int, object] = {}
        try:
            for k, (i, ex) in enumerate(zip(self.layer_ids, cast("list[LayerExecutor]", self.executors))):
                layer = mg.layers[i]
                graphs = by_name[layer.name].graphs
                dl = dataclasses.replace(graphs.decomposed, input_names=[a.name for a in mg.layer_inputs(layer)])
                placed = PlacedLayer(dl, graphs.option, ex.mesh, fqns)
                if set(placed.param_keys) != set(ex.param_keys):
                    raise PlanError(f"layer {layer.name} reads other parameters at shapes "
                                    f"{[list(s[0]) for s in sig if s]}: re-plan at this shape")
                st = {attr: getattr(placed, attr) for attr in _PLACED}
                names = {ph.name: n for ph, n in zip(dl.inputs, dl.input_names)}
                st["feeds"] = [(names[ph.name], pl[1]) for (ph, _), pl in zip(placed._inputs, placed.input_placements())]
                self._swap({kk: (st if kk == k else {}) for kk in range(len(self.executors))})
                if cast("dict[int, dict]", self._base_state)[k]["lowered"] is not None:
                    st["lowered"] = shared.get(id(graphs)) or _Lowered(
                        ex, program=graphs, selective=graphs.recompute == Recompute.SELECTIVE)
                    shared[id(graphs)] = st["lowered"]
                else:
                    st["lowered"] = None
                state[k] = st
        finally:
            self._swap(cast("dict[int, dict]", self._base_state) if self._active is None
                       else self._variants[self._active])
        self._variants[sig] = state
        while len(self._variants) > self.shape_cache_limit:
            self._variants.popitem(last=False)
