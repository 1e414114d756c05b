"""One layer run as traced graphs of plain local tensors (:class:`_Lowered`), the values that
travel between such layers unwrapped (:class:`LocalValue`), and the hoisted all-reduces in
flight between a forward and its backward (:func:`wait_in_flight`).

Contract: :class:`_Lowered` wraps a :class:`~galvatron_fx.runtime.layer_exec.LayerExecutor`
and runs the forward and backward graphs of the layer's lowered program
(:class:`~galvatron_fx.ir.program.LayerGraphs`, made by the passes of
:mod:`galvatron_fx.passes.lower_program` before the first step), turned into direct calls
(:func:`~galvatron_fx.runtime.graph_code.graph_callable`), with the saved-value all-reduces
the program hoisted launched from forward. Two cases trace at the first call instead, with
AOTAutograd over the same interpreter and the same clean-up and hoisting: a call whose input
layouts or dtypes differ from the program's (logged), and a layer without a program (built
directly, not through :func:`galvatron_fx.compile` or ``ParallelModule``). Calls without
gradients run AOTAutograd's inference trace of the same function.
"""

from __future__ import annotations

import collections
import copy
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from galvatron_fx.ir.recompute import tag_selective
from galvatron_fx.passes.clean_up_graphs import drop_identity_views, drop_unused_ops
from galvatron_fx.passes.hoist_saved_collectives import hoist_saved_all_reduces, simple_form
from galvatron_fx.runtime.graph_code import graph_callable

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName


class _Layer(Protocol):
    """What a lowered layer reads of the executor that runs it
    (:class:`~galvatron_fx.runtime.layer_exec.LayerExecutor`, which imports this module)."""

    mesh: DeviceMesh
    written_values: list

    def local_function(self, in_specs, record) -> Callable: ...

    def local_params(self) -> list[torch.Tensor]: ...

log = logging.getLogger(__name__)

__all__ = ["LocalValue", "wait_in_flight"]


_IN_FLIGHT: collections.deque = collections.deque()  # hoisted all-reduces not yet waited
_MAX_IN_FLIGHT = 64


def _launch(work):
    """Track a hoisted all-reduce's ``work`` until its backward waits for it (:func:`_done`):
    beyond ``_MAX_IN_FLIGHT`` the oldest are waited here (done long since: every rank launched
    them), so that forwards with no backward never pile up collectives nobody waits for. A
    training loop leaves none behind: no work object is left for interpreter shutdown to free."""
    _IN_FLIGHT.append(work)
    while len(_IN_FLIGHT) > _MAX_IN_FLIGHT:
        _IN_FLIGHT.popleft().wait()
    return work


def wait_in_flight() -> None:
    """Wait for every hoisted all-reduce still tracked: those of forwards that had no backward
    (a training step's are waited by its backward). Every rank launched them, so this returns
    at once; a module calls it before a new forward so that none is left for long."""
    while _IN_FLIGHT:
        _IN_FLIGHT.popleft().wait()


def _done(work) -> None:
    if work in _IN_FLIGHT:  # else waited already, as one of the oldest
        _IN_FLIGHT.remove(work)


def _strided(g: torch.Tensor, want: tuple | None) -> torch.Tensor:
    """``g`` laid out with strides ``want`` (a copy where it is not), or contiguous when unknown."""
    if want is None or len(want) != g.ndim:
        return g.contiguous()
    if tuple(g.stride()) == want or g.numel() <= 1:
        return g
    out = torch.empty_strided(g.shape, want, dtype=g.dtype, device=g.device)
    return out.copy_(g)


def _contiguous(t):
    return t if not isinstance(t, torch.Tensor) or t.is_contiguous() else t.contiguous()


class _GraphPair:
    """A layer's traced forward and backward graphs and how to call them: the forward returns
    the user outputs then the tensors saved for backward; the backward takes the saved tensors,
    then one gradient per output that requires grad, and returns one gradient per input.
    ``hoisted``: saved tensors all-reduced from forward to backward (:func:`hoist_saved_all_reduces`);
    the forward takes ``num_whole`` whole user inputs after the layer's inputs, which get no gradient
    (:mod:`~galvatron_fx.passes.fold_input_reductions`)."""

    def __init__(self, fw: fx.GraphModule, bw: fx.GraphModule, num_outputs: int, out_grad: list[bool],
                 hoisted: list | None = None, num_whole: int = 0):
        if hoisted is None:  # graphs traced here: hoist from a copy (AOTAutograd's runtime keeps the original)
            bw = fx.GraphModule(bw, copy.deepcopy(bw.graph))
            num_saved = sum(1 for n in bw.graph.nodes if n.op == "placeholder") - sum(out_grad)
            hoisted = hoist_saved_all_reduces(bw, num_saved)
        self.hoisted = [(i, op, _resolve_process_group(cast("GroupName", g))) for i, op, g in hoisted]
        # the strides the backward was traced with for each gradient it takes (a permuted layer
        # output's gradient may be expected channels-last; a view in the backward depends on it)
        phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
        vals = [n.meta.get("val") for n in phs[len(phs) - sum(out_grad):]]
        self.tangent_strides = [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in vals]
        self.fw, self.bw = graph_callable(fw), graph_callable(bw)
        self.num_outputs = num_outputs
        self.num_whole = num_whole
        self.out_grad = out_grad
        self.any_constant = not all(out_grad)

    @classmethod
    def make(cls, fw: fx.GraphModule, bw: fx.GraphModule, out_grad: list[bool]) -> _GraphPair | None:
        """The pair, or None when the graphs do not have that simple form (input mutations,
        outputs AOTAutograd regenerates, saved symbolic sizes): AOTAutograd's own runtime, which
        handles every case, keeps running them."""
        if not simple_form(fw, bw, out_grad):
            log.debug("lowered layer keeps AOTAutograd's runtime (its graphs are not of the simple form)")
            return None
        return cls(fw, bw, len(out_grad), out_grad)


class _RunGraphs(torch.autograd.Function):
    """A :class:`_GraphPair` as one autograd node, with none of AOTAutograd's runtime wrappers
    (Python per layer and backward that, on a CPU, outweighs a small layer's ops)."""

    @staticmethod
    def forward(ctx, graphs: _GraphPair, *args):
        outs = graphs.fw(*args)
        n = graphs.num_outputs
        ctx.graphs = graphs
        saved = outs[n:]
        if graphs.hoisted:
            # the reduced copies are kept on ctx: under activation checkpointing a recomputed
            # forward's saved tensors replace the saved ones, while ctx keeps this forward's. The
            # unreduced tensors stay saved, so that as many are saved as AOT's runtime saves.
            ctx.hoisted, ctx.works = [], []
            for i, op, group in graphs.hoisted:
                t = saved[i].clone()  # reduced in place, while the forward goes on
                ctx.works.append(_launch(dist.all_reduce(t, op=op, group=group, async_op=True)))
                ctx.hoisted.append((i, t))
        ctx.save_for_backward(*saved)
        user = tuple(outs[:n])
        if graphs.any_constant:
            ctx.mark_non_differentiable(*(o for o, g in zip(user, graphs.out_grad) if not g))
        return user

    @classmethod
    def run(cls, graphs: _GraphPair, args) -> tuple:
        """``apply`` without ``autograd.Function``'s Python prologue, which walks every argument
        (a layer's parameters and inputs) for dead functorch wrappers: there can be none outside
        a functorch transform, and inside one the full ``apply`` runs."""
        if torch._C._are_functorch_transforms_active():
            return cls.apply(graphs, *args)
        return super(torch.autograd.Function, cls).apply(graphs, *args)  # type: ignore[misc]  # (torch's stubs lack it)

    @staticmethod
    def backward(ctx, *grads):
        graphs = ctx.graphs
        saved = ctx.saved_tensors
        if graphs.hoisted:
            saved = list(saved)
            for work in ctx.works:
                work.wait()
                _done(work)
            ctx.works = ()
            for i, t in ctx.hoisted:
                saved[i] = t
        # each gradient in the strides the backward graph was traced with (as AOTAutograd's runtime makes them)
        tangents = [_strided(g, want) for g, want in zip((g for g, req in zip(grads, graphs.out_grad) if req),
                                                        graphs.tangent_strides)]
        return (None, *graphs.bw(*saved, *tangents), *(None,) * graphs.num_whole)


class _Lowered:
    """One layer as a traced graph of plain local tensors.

    AOTAutograd traces :meth:`LayerExecutor._interpret` forward and backward once (at the first
    call, from real inputs) into local ATen ops and functional collectives: DTensor's
    propagation and redistribution happen at trace time, so a step pays plain eager ops, as
    hand-written code does. The traced function takes and returns *local* tensors only: inside,
    inputs are wrapped with ``DTensor.from_local`` in the layouts recorded at the first call and
    outputs unwrapped with ``to_local``; parameters come in as local shards (:class:`_AsDTensor`
    inside, so their gradients leave as dp-partial local sums). Outside, the executor unwraps its
    DTensor inputs and rewraps the outputs in the recorded layouts (one autograd node each, whose
    backward moves an incoming gradient to that layout). Inputs whose layouts differ from the
    recorded ones are refused (the interpreter handles any layout).
    """

    def __init__(self, ex: _Layer, program=None, *, selective: bool = False):
        from functorch.compile import aot_function, make_boxed_func
        from torch._functorch.partitioners import default_partition

        self.mesh = ex.mesh
        self.in_specs: list | None = None   # (placements, shape, stride) per input
        self.in_dtypes: list | None = None  # the program's input dtypes (None: not checked)
        self.out_specs: list | None = None  # per flat output: (placements, shape, stride) | None
        self.out_tree: Any = None  # the outputs' pytree spec
        self.out_consts: dict[int, object] = {}  # flat output index -> a non-tensor output
        traced = ex.local_function(lambda: self.in_specs, self)

        def compiler(slot: str | None):
            def run_eagerly(gm, _example_inputs):
                drop_unused_ops(gm)
                if slot is not None and drop_identity_views(gm):  # graphs this module runs itself
                    drop_unused_ops(gm)
                if slot is not None:
                    self._graphs[slot] = gm
                return make_boxed_func(gm.forward)
            return run_eagerly

        # AOTAutograd keeps the first trace: one for training, one for no-grad calls
        self._graphs: dict[str, fx.GraphModule] = {}
        def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
            if selective:  # the policy as the program's graphs carry it (passes/mark_recompute.py)
                tag_selective(joint)
            return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)

        self.fn = {True: aot_function(traced, compiler("fw"), compiler("bw"), partition_fn=partition),
                   False: aot_function(traced, compiler(None), compiler(None))}
        self.graphs: _GraphPair | None = None  # the training graphs, run without AOT's wrappers
        self._out_grad: list[bool] | None = None  # which outputs of a training call require grad
        self.program = None  # the LayerGraphs it runs, if it was given one
        self.whole_inputs: list[int] = []  # inputs the program's forward also takes whole
        self.num_writes = 0  # inputs the layer writes (trace_local): their new values end the forward's outputs
        if program is not None and program.simple and program.fw is not None:
            tr = program.trace
            self.program = program
            self.num_writes = len(tr.buffer_inputs)
            self.whole_inputs = list(program.whole_inputs)
            self.in_specs, self.in_dtypes = list(tr.in_specs), list(tr.in_dtypes)
            self.out_specs, self.out_tree, self.out_consts = list(tr.out_specs), tr.out_tree, dict(tr.out_consts)
            self._out_grad = list(tr.out_grad)
            self.graphs = _GraphPair(program.fw, program.bw, len(tr.out_grad), list(tr.out_grad), program.hoisted,
                                     len(self.whole_inputs))

    def _unseed(self, why: str) -> None:
        """Trace at this call after all (see module doc)."""
        log.info("a lowered layer traces at its first call instead of running its program: %s", why)
        self.program, self.graphs, self.in_specs, self.in_dtypes = None, None, None, None
        self.whole_inputs = []
        self.out_specs, self.out_tree, self.out_consts, self._out_grad = None, None, {}, None

    def __call__(self, ex: _Layer, xs, *, unwrapped: bool = False, wholes=()):
        """Run on ``xs``: DTensors, or plain local tensors already in the recorded layout of
        their position (:class:`LocalValue` handed on by the caller, which checked
        :meth:`accepts`). ``unwrapped``: return DTensor outputs as :class:`LocalValue` (no
        ``from_local``; the next lowered layer takes the local tensor as it is). ``wholes``: the
        inputs :attr:`whole_inputs` names, whole (the program's forward reads them; a call that
        traces instead does not)."""
        specs = [(tuple(x.placements), x.shape, x.stride()) if isinstance(x, DTensor) else None for x in xs]
        if self.in_specs is not None and any(s is not None and s != w for s, w in zip(specs, self.in_specs)):
            # (a step's calls match and skip all this) an input in the traced layout but with other
            # strides (a mask expanded from a smaller one) is made contiguous, as the graphs were traced
            xs = [x.contiguous() if s is not None and s != w and s[:2] == w[:2] else x
                  for x, s, w in zip(xs, specs, self.in_specs)]
            specs = [(tuple(x.placements), x.shape, x.stride()) if isinstance(x, DTensor) else None for x in xs]
            if any(s is not None and s != w for s, w in zip(specs, self.in_specs)):
                if self.program is None or self.in_dtypes is None:
                    raise ValueError(f"lowered layer called with input layouts {specs}, traced for {self.in_specs}")
                # the first call of a program in other layouts: a local tensor the caller handed on
                # (accepted in the program's layout) is wrapped again, and the layer traces here
                xs = [DTensor.from_local(x, self.mesh, want[0], run_check=False, shape=want[1], stride=want[2])
                      if s is None else x for x, s, want in zip(xs, specs, self.in_specs)]
                self._unseed(f"inputs {specs}, the program's {self.in_specs}")
                specs = [(tuple(x.placements), x.shape, x.stride()) for x in xs]
        if self.program is not None and self.in_dtypes is not None:  # the first call of a program
            dtypes = [x.dtype for x in xs]
            if dtypes != self.in_dtypes:
                assert self.in_specs is not None  # (set with in_dtypes)
                xs = [DTensor.from_local(x, self.mesh, want[0], run_check=False, shape=want[1], stride=want[2])
                      if s is None else x for x, s, want in zip(xs, specs, self.in_specs)]
                self._unseed(f"input dtypes {dtypes}, the program's {self.in_dtypes}")
                specs = [(tuple(x.placements), x.shape, x.stride()) for x in xs]
            else:
                self.in_dtypes = None  # checked once
        if self.in_specs is None:
            if None in specs:
                raise ValueError("a lowered layer's first call takes DTensors (it records their layouts)")
            self.in_specs = specs
        # the graphs were traced on contiguous inputs: a non-contiguous one (a permuted output of the
        # layer before, a channels-last image) is copied, so that a view in them holds
        args = (*ex.local_params(), *(_contiguous(x.to_local() if isinstance(x, DTensor) else x) for x in xs))
        if not torch.is_grad_enabled() and self.graphs is not None:  # the program's forward, nothing saved
            call = (*args, *wholes) if self.graphs.num_whole else args
            flat = tuple(self.graphs.fw(*call)[:self.graphs.num_outputs])
        elif not torch.is_grad_enabled():
            flat = self.fn[False](*args)
        elif self.graphs is not None:
            flat = _RunGraphs.run(self.graphs, (*args, *wholes) if self.graphs.num_whole else args)
        else:
            flat = self.fn[True](*args)
            self._out_grad = [t.requires_grad for t in flat]
            if "bw" in self._graphs:  # AOT compiles the backward at the first backward
                self.graphs = _GraphPair.make(self._graphs["fw"], self._graphs["bw"], self._out_grad)
        if self.num_writes and self.graphs is not None and len(flat) == self.graphs.num_outputs:
            # the new values of the inputs it writes, for the caller to store
            ex.written_values = [t.detach() for t in flat[len(flat) - self.num_writes:]]
            flat = flat[:len(flat) - self.num_writes]
        if unwrapped and not self.out_consts:
            return tuple(flat)  # the layer's outputs, flat (see rewrap)
        it = iter(zip(flat, cast(list, self.out_specs)))
        leaves = []
        for i in range(len(flat) + len(self.out_consts)):
            if i in self.out_consts:
                leaves.append(self.out_consts[i])
                continue
            t, spec = next(it)
            if spec is None or unwrapped:
                leaves.append(t)
            else:
                leaves.append(DTensor.from_local(t, self.mesh, spec[0], run_check=False, shape=spec[1],
                                                 stride=spec[2]))
        return tree_unflatten(leaves, self.out_tree)

    def rewrap(self, outs):
        """Outputs of an ``unwrapped`` call with their DTensor leaves as :class:`LocalValue`."""
        if isinstance(outs, tuple) and len(outs) == len(self.out_specs) and not self.out_consts:  # flat
            return [t if spec is None else LocalValue(t, self.mesh, *spec) for t, spec in zip(outs, self.out_specs)]
        leaves, tree = tree_flatten(outs)
        it = iter(self.out_specs)
        for i, t in enumerate(leaves):
            if i not in self.out_consts:
                spec = next(it)
                if spec is not None:
                    leaves[i] = LocalValue(t, self.mesh, *spec)
        return tree_unflatten(leaves, tree)

    def accepts(self, i: int, v: LocalValue) -> bool:
        """Whether input ``i`` may be ``v``'s local tensor as it is (same mesh and layout as
        recorded at the trace)."""
        return self.in_specs is not None and v.mesh is self.mesh and \
            self.in_specs[i] == (v.placements, v.shape, v.stride)


class LocalValue:
    """A DTensor not yet wrapped: its local tensor and layout. Lowered layers hand their outputs
    on as these, so that a value passing between two lowered layers in the same layout costs no
    ``from_local``/``to_local`` pair (two autograd nodes and two DTensors per value, each way);
    :meth:`dtensor` wraps it where a DTensor is needed."""

    __slots__ = ("local", "mesh", "placements", "shape", "stride")

    def __init__(self, local: torch.Tensor, mesh: DeviceMesh, placements: tuple, shape, stride):
        self.local, self.mesh, self.placements, self.shape, self.stride = local, mesh, placements, shape, stride

    def dtensor(self) -> DTensor:
        return DTensor.from_local(self.local, self.mesh, self.placements, run_check=False, shape=self.shape,
                                  stride=self.stride)
