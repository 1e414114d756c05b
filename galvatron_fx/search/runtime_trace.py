"""trace_layer — what the runtime's executor of one tensor-parallel layer really does, measured
on fake tensors: its collectives forward and backward, the activations it keeps, and the largest
transient of its backward.

Contract: takes a captured ModelGraph, one layer and a solved :class:`LayerOption` (``tp > 1``);
builds the runtime's own :class:`~galvatron_fx.runtime.layer_exec.LayerExecutor` for it on a
``(1, tp)`` mesh of the planner's stand-in ("fake") process group, under ``FakeTensorMode``, and
runs one forward and backward as the runtime does (lowered to local ops and functional
collectives, or op by op through DTensor as under selective recomputation). Returns a
:class:`RuntimeTrace`, cached per (layer kind, shapes, tp, SP mode, placements, path); None when
the process already has a real process group (the stand-in cannot be created then) or the
executor cannot be built. Nothing is sent anywhere; the graph is not changed.

Why: the intra-layer ILP fixes the *forward* placements and prices the backward with one rule
(the partial gradients of a value are summed once to the producer's layout). DTensor's own
backward propagation does otherwise: it carries partial gradients through linear backward
kernels, reduce-scatters them where a batch-sharded kernel is cheaper and gathers later, and the
replicated weights of a sharded layer (norms, biases) get their partial gradients all-reduced one
by one. On gloo a reduce-scatter costs a whole all-reduce and every small collective a latency of
milliseconds, so the rule underprices a tensor-parallel block by about half its communication.
Tracing the executor prices exactly what runs.

Terms: a collective is *per sample* when its bytes scale with the micro-batch (activations and
their gradients) and not when it moves a parameter or its gradient (its tensor has a parameter's
local or full shape); *saved* bytes are the storages the layer keeps for backward (saved-tensor
hooks; parameters excluded), at the captured batch on one tensor-parallel rank; the *backward
transient* is the peak, over the backward, of the bytes it allocates (its output gradients
included, its parameters' gradients excluded) minus the saved bytes it has freed.

Algorithm: build the executor (``localize``, and ``lower`` unless ``interpreted``); run forward
and backward once to let AOTAutograd trace; then, under a dispatch mode that records every
functional collective and every allocation (a weak-reference finaliser per storage tracks frees),
run forward, backward from ones in each output's own layout, and finally redistribute each input
gradient to its input's layout (what the producing layer's backward would do with it).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from galvatron_fx.cluster import Collective
from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.layer_option import CommEvent, LayerOption
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer

log = logging.getLogger(__name__)

__all__ = ["RuntimeTrace", "trace_layer"]


@dataclass(frozen=True)
class RuntimeTrace:
    """One layer's executor as measured on fake tensors (see module doc); captured batch, one rank."""

    comm: tuple[CommEvent, ...]  # forward ("fwd") and backward ("bwd") collectives, in order
    saved_bytes: int
    bwd_transient_bytes: int


_CACHE: dict[tuple, RuntimeTrace | None] = {}
_MESHES: dict[int, object] = {}
# functional collective -> the cost model's collective (``nbytes`` by CommModel's convention: the
# gathered output of an all-gather, the global tensor of an all-to-all: input bytes × group size)
_COLLECTIVES = {
    "all_reduce": Collective.ALL_REDUCE, "all_reduce_coalesced": Collective.ALL_REDUCE,
    "all_gather_into_tensor": Collective.ALL_GATHER, "all_gather_into_tensor_coalesced": Collective.ALL_GATHER,
    "reduce_scatter_tensor": Collective.REDUCE_SCATTER, "reduce_scatter_tensor_coalesced": Collective.REDUCE_SCATTER,
    "all_to_all_single": Collective.ALL_TO_ALL,
}


def trace_layer(mg: ModelGraph, layer: LayerInfo, option: LayerOption | None, *, interpreted: bool = False,
                decomposed: DecomposedLayer | None = None) -> RuntimeTrace | None:
    """The runtime's collectives, saved bytes and backward transient of ``layer`` under
    ``option`` (None: unsharded, tp = 1) (see module doc); ``interpreted``: op by op (the
    selective-recompute path)."""
    import torch.distributed as dist

    key = (layer.kind, tuple(tuple(s) for s in mg.example_shapes),
           None if option is None else (option.tp, str(option.sp), tuple(sorted(option.placements.items()))),
           interpreted)
    if key in _CACHE:
        return _CACHE[key]
    if dist.is_initialized() and dist.get_backend() != "fake":
        return None
    try:
        dl = decomposed or decompose_layer(mg, layer)
        if option is None:
            from galvatron_fx.ir.strategy import LayerStrategy
            from galvatron_fx.runtime.parallel_module import option_from_plan

            option = option_from_plan(dl, layer.kind, LayerStrategy(), {})
        res = _trace(mg, layer, option, interpreted, dl)
    except Exception as e:  # a layer the executor cannot run on fake tensors: the ILP's pricing stays
        log.warning("runtime trace of %s (%s) failed (%s: %s); keeping the ILP's estimate", layer.name,
                    "tp=1" if option is None else f"tp={option.tp} sp={option.sp}", type(e).__name__, e)
        res = None
    _CACHE[key] = res
    return res


def _mesh(tp: int):
    from torch.distributed.device_mesh import DeviceMesh

    from galvatron_fx.search.node_strategies import _mesh as stand_in

    if tp not in _MESHES:
        stand_in(tp)  # the fake process group, if none yet
        _MESHES[tp] = DeviceMesh("cpu", torch.arange(tp).view(1, tp), mesh_dim_names=("dp", "tp"))
    return _MESHES[tp]


class _Recorder(TorchDispatchMode):
    """Functional collectives and allocations (see module doc)."""

    def __init__(self):
        super().__init__()
        self.phase = "fwd"
        self.events: list[tuple[str, str, tuple[int, ...], int]] = []  # phase, op, shape, input bytes
        self.track = False
        self.live = 0  # bytes allocated since tracking began, still alive
        self.peak = 0
        self.storages: dict[int, int] = {}  # id(storage) -> bytes, allocated while tracking
        self.excluded: set[int] = set()

    def alloc(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        sid = id(st)
        if sid in self.storages:
            return
        nbytes = st.nbytes()
        self.storages[sid] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, sid)

    def _free(self, sid: int) -> None:
        nbytes = self.storages.pop(sid, 0)  # (the id may name a new storage from now on)
        if sid in self.excluded:
            self.excluded.discard(sid)
        else:
            self.live -= nbytes

    def watch_saved(self, st, nbytes: int) -> None:
        """A saved storage: its release during backward lowers the net transient."""
        weakref.finalize(st, self._saved_freed, nbytes)

    def _saved_freed(self, nbytes: int) -> None:
        if self.track:
            self.live -= nbytes

    def exclude(self, t: torch.Tensor) -> None:
        """A parameter's gradient: kept by the step, not a transient (counted from now on as freed)."""
        sid = id(t.untyped_storage())
        if sid in self.storages and sid not in self.excluded:
            self.excluded.add(sid)
            self.live -= self.storages[sid]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "_c10d_functional" and func._opname in _COLLECTIVES:
            t = args[0]
            ts = list(t) if isinstance(t, (list, tuple)) else [t]
            for x in ts:
                self.events.append((self.phase, func._opname, tuple(x.shape), x.numel() * x.element_size()))
        if self.track:
            outs = out if isinstance(out, (list, tuple)) else [out]
            rets = func._schema.returns
            for i, o in enumerate(outs):
                # a view or an in-place result (detach of a saved tensor, say) allocates nothing
                aliased = i < len(rets) and rets[i].alias_info is not None
                if isinstance(o, torch.Tensor) and not aliased:
                    self.alloc(o)
        return out


def _trace(mg: ModelGraph, layer: LayerInfo, option: LayerOption, interpreted: bool,
           dl: DecomposedLayer) -> RuntimeTrace:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor, distribute_tensor

    from galvatron_fx.runtime.parallel_module import _Executor  # the executor ParallelModule builds

    tp = option.tp
    mesh = _mesh(tp)
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = {name: torch.nn.Parameter(torch.empty(tuple(ph.meta["val"].shape), dtype=ph.meta["val"].dtype),
                                           requires_grad=ph.meta["val"].is_floating_point())
                  for ph, name, role in zip(dl.inputs, dl.input_names, dl.input_roles) if role == "param"}
        ex = _Executor(dl, option, mesh, params)
        ex.localize()
        if not interpreted:
            ex.lower()
        param_shapes = {tuple(p.shape) for p in ex.params.values()} | {tuple(m[1]) for m in ex._meta.values()}

        def inputs():
            xs = []
            for (ph, _role), pl in zip(ex._inputs, ex.input_placements()):
                v = ph.meta["val"]
                full = torch.empty(tuple(v.shape), dtype=v.dtype) if v.is_floating_point() else \
                    torch.zeros(tuple(v.shape), dtype=v.dtype)
                d = distribute_tensor(full, mesh, list(pl), src_data_rank=None)
                xs.append(d.detach().requires_grad_(True) if v.is_floating_point() else d)
            return xs

        def step(rec: _Recorder | None):
            xs = inputs()
            saved: dict[int, int] = {}
            own = {id(p.untyped_storage()) for p in ex.params.values()}

            def pack(t):
                st = t.untyped_storage()
                if id(st) not in own and id(st) not in saved:
                    saved[id(st)] = st.nbytes()
                    if rec is not None:
                        rec.watch_saved(st, st.nbytes())
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = ex(*xs)
            outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            grads = [torch.ones_like(o) for o in outs]
            hooks = []
            if rec is not None:
                rec.phase = "bwd"
                rec.track = True
                for g in grads:
                    rec.alloc(g.to_local() if isinstance(g, DTensor) else g)
                hooks = [p.register_post_accumulate_grad_hook(
                    lambda p: rec.exclude(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad))
                    for p in ex.params.values() if p.requires_grad]
            del out
            torch.autograd.backward(outs, grads)
            for h in hooks:
                h.remove()
            del outs, grads
            for x in xs:  # the producer's backward moves each input gradient to the input's layout
                g = getattr(x, "grad", None)
                if isinstance(g, DTensor) and tuple(g.placements) != tuple(x.placements):
                    g.redistribute(mesh, x.placements)
            for p in ex.params.values():
                p.grad = None
            return sum(saved.values())

        step(None)  # AOTAutograd traces forward and backward here
        rec = _Recorder()
        with rec:
            saved_bytes = step(rec)
    comm = []
    for phase, op, shape, nbytes in rec.events:
        coll = _COLLECTIVES[op]
        total = nbytes * tp if coll in (Collective.ALL_GATHER, Collective.ALL_TO_ALL) else nbytes
        comm.append(CommEvent(phase, f"runtime:{op}{list(shape)}", str(coll), total, 0.0,
                              per_sample=shape not in param_shapes))
    return RuntimeTrace(comm=tuple(comm), saved_bytes=int(saved_bytes), bwd_transient_bytes=int(rec.peak))
