"""trace_layer — a placed layer traced into the joint graph of local ops that will run.

Contract: :func:`trace_placed` and :func:`trace_local` take a
:class:`~galvatron_fx.passes.apply_placements.PlacedLayer` (its decomposed graph, plan and mesh)
(``placed`` below; this module does not import it: the import runs one way) and return a
:class:`Trace`: the joint forward-backward graph AOTAutograd records over a function
of *local* tensors (parameters as local shards, inputs wrapped with ``from_local`` in their
recorded layouts), so that DTensor's propagation and redistribution, forward and backward, happen
at trace time and only local ops and functional collectives remain; beside it the layouts of the
inputs and outputs, which outputs need a gradient and the outputs that are not tensors.
:func:`~galvatron_fx.passes.apply_placements.apply_placements_pass` runs them per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx
from functorch.compile import aot_function, make_boxed_func
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.utils._pytree import tree_flatten, tree_map

from galvatron_fx.passes.decompose_layer import DecomposedLayer
from galvatron_fx.passes.state_writes import written_through

__all__ = ["Trace", "trace_local", "trace_placed"]

R = Replicate()

@dataclass
class Trace:
    """What tracing a placed layer records beside its graphs: the layouts of its inputs and
    outputs, which outputs need a gradient, and the outputs that are not tensors."""

    in_specs: list = field(default_factory=list)  # per input: (placements, shape, stride)
    in_dtypes: list = field(default_factory=list)
    out_specs: list = field(default_factory=list)  # per flat tensor output: (placements, shape, stride) | None
    out_tree: object = None
    out_consts: dict = field(default_factory=dict)
    out_grad: list = field(default_factory=list)
    joint: fx.GraphModule | None = None
    joint_inputs: object = None
    num_fwd_outputs: int = 0
    # positions of the (non-parameter) inputs the layer writes in place, whose new values the
    # forward returns after its outputs (trace_local)
    buffer_inputs: list = field(default_factory=list)


def _fake_local(v: torch.Tensor, mesh: DeviceMesh, placements, dtype: torch.dtype | None,
                requires_grad: bool) -> torch.Tensor:
    """This rank's local piece of a (fake) tensor like ``v`` laid out as ``placements``."""
    dt = dtype if dtype is not None and v.is_floating_point() else v.dtype
    full = torch.empty(tuple(v.shape), dtype=dt) if dt.is_floating_point else torch.zeros(tuple(v.shape), dtype=dt)
    local = distribute_tensor(full, mesh, list(placements), src_data_rank=None).to_local()
    return local.detach().requires_grad_(requires_grad and dt.is_floating_point)


def trace_placed(placed, *, trainable: set[str] | None = None, inputs: set[str] | frozenset = frozenset(),
                 batched: set[str] | frozenset = frozenset(), propagated: set[str] | frozenset = frozenset(),
                 param_dtype: torch.dtype | None = None) -> Trace:
    """Trace ``placed`` forward and backward on fake tensors (see module doc): the joint graph
    (:mod:`~galvatron_fx.passes.partition_graphs` splits it). Parameters are read as fake local
    shards of their captured dtype (``param_dtype``: another), those whose FQN is in
    ``trainable`` (default: all) requiring grad; inputs in the compute dtype, laid out as
    :meth:`PlacedLayer.input_placements` says for ``inputs`` and ``batched``."""
    rec = _input_specs(placed, inputs, batched, propagated)
    return _aot_trace(placed, placed.local_function(lambda: rec.in_specs, rec), rec, trainable, param_dtype)


def trace_local(placed, local: DecomposedLayer, out_layouts: list, *, trainable: set[str] | None = None,
                inputs: set[str] | frozenset = frozenset(), batched: set[str] | frozenset = frozenset(),
                propagated: set[str] | frozenset = frozenset(), param_dtype: torch.dtype | None = None) -> Trace:
    """Trace ``placed``'s layer as plain local ops (:mod:`~galvatron_fx.passes.localize_batch`):
    ``local`` is the same layer decomposed at this rank's share of the batch; its inputs are
    laid out as :func:`trace_placed` lays them out (their local pieces are what ``local`` takes:
    checked), and ``out_layouts`` gives each flat tensor output's ``(dp, tp)`` placements; an
    output's global shape and stride are the whole-batch graph's. No DTensor and no collective:
    each rank runs its share of the batch, as ``DistributedDataParallel`` does."""
    rec = _input_specs(placed, inputs, batched, propagated)
    ph_of = list(placed.gm.graph.find_nodes(op="placeholder"))
    local_phs = list(local.gm.graph.find_nodes(op="placeholder"))
    assert len(ph_of) == len(local_phs), (len(ph_of), len(local_phs))
    keys = list(placed.param_keys)
    position = {ph: i for i, (ph, _) in enumerate(placed._inputs)}
    dp = placed.mesh.size(0)
    for (ph, _), (pl, shape, _stride) in zip(placed._inputs, rec.in_specs):
        want = list(shape)
        if isinstance(pl[0], Shard):
            want[pl[0].dim] //= dp
        got = list(local_phs[ph_of.index(ph)].meta["val"].shape)
        if got != want:
            raise ValueError(f"input {ph.name}: the local graph takes {got}, its layout gives {want}")
    glob_out = [v for v in tree_flatten(_output_vals(placed.gm))[0]]
    # inputs the layer writes in place (BatchNorm's running statistics): the graph writes a copy
    # and hands it back after its outputs, for the runtime to store (no input mutation: the
    # graphs keep the form the runtime calls directly)
    written = {local_phs.index(base) for _user, base in written_through(local.gm) if base.op == "placeholder"}
    rec.buffer_inputs = [position[ph] for i, ph in enumerate(ph_of) if i in written and ph in position]

    def traced(*flat):
        params = dict(zip(keys, flat[:len(keys)]))
        xs = list(flat[len(keys):])
        for i in rec.buffer_inputs:
            xs[i] = xs[i].clone()
        args = [placed._cast(params[placed._param_of[ph.name]]) if ph.name in placed._param_of else xs[position[ph]]
                for ph in ph_of]
        outs = local.gm(*args)
        leaves, rec.out_tree = tree_flatten(outs)
        rec.out_specs, rec.out_consts, ret = [], {}, []
        layouts = iter(out_layouts)
        for i, (o, g) in enumerate(zip(leaves, glob_out)):
            if isinstance(o, torch.Tensor):
                rec.out_specs.append((tuple(next(layouts)), g.shape, g.stride()))
                ret.append(o)
            else:
                rec.out_consts[i] = o
        return (*ret, *(xs[i] for i in rec.buffer_inputs))

    return _aot_trace(placed, traced, rec, trainable, param_dtype)


def _output_vals(gm: fx.GraphModule):
    out = next(iter(gm.graph.find_nodes(op="output")))
    return tree_map(lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a, out.args[0])


def _input_specs(placed, inputs, batched, propagated) -> Trace:
    rec = Trace()
    for (ph, _role), pl in zip(placed._inputs, placed.input_placements(inputs, batched, propagated)):
        v = ph.meta["val"]
        dt = placed.compute_dtype if placed.compute_dtype is not None and v.is_floating_point() else v.dtype
        rec.in_specs.append((tuple(pl), v.shape, torch.empty(tuple(v.shape), device="meta").stride()))
        rec.in_dtypes.append(dt)
    return rec


class _JointTraced(Exception):
    """Raised from the partition callback once AOTAutograd has traced the joint graph: what
    follows there (partitioning, compiling, running both graphs on fake tensors) is work the
    lowering does not use; :mod:`~galvatron_fx.passes.partition_graphs` partitions it."""


def _differentiable_outputs(joint: fx.GraphModule, num_outputs: int) -> list[bool]:
    """Which of the traced function's ``num_outputs`` outputs require grad: those the joint
    graph takes a tangent for (AOTAutograd's descriptors name each tangent's output)."""
    from torch._functorch._aot_autograd.descriptors import PlainAOTOutput, TangentAOTInput

    with_tangent = {n.meta["desc"].output.idx for n in joint.graph.find_nodes(op="placeholder")
                    if isinstance(n.meta.get("desc"), TangentAOTInput)
                    and isinstance(n.meta["desc"].output, PlainAOTOutput)}
    return [i in with_tangent for i in range(num_outputs)]


def _aot_trace(placed, fn, rec: Trace, trainable, param_dtype) -> Trace:
    """``fn(*param_shards, *input_locals)`` traced forward and backward by AOTAutograd on fake
    local tensors laid out as ``rec.in_specs`` says; the joint graph recorded on ``rec``, and
    which outputs require grad (from the joint's tangents; from a run when nothing does)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    returned: list[int] = []

    def counted(*flat):
        outs = fn(*flat)
        returned[:] = [len(outs)]
        return outs

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
        rec.joint, rec.joint_inputs, rec.num_fwd_outputs = joint, joint_inputs, num_fwd_outputs
        raise _JointTraced

    traced = aot_function(counted, make_boxed_func, make_boxed_func, partition_fn=partition)
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = []
        for key, (fqn, _, ph) in placed.param_keys.items():
            v = ph.meta["val"]
            dt = param_dtype if param_dtype is not None and v.is_floating_point() else None
            grad = trainable is None or fqn in trainable
            params.append(_fake_local(v, placed.mesh, (R, placed._meta[key][0]), dt, grad))
        xs = [_fake_local(ph.meta["val"], placed.mesh, pl, dt, grad)
              for (ph, _), pl, dt, grad in zip(placed._inputs, [s[0] for s in rec.in_specs], rec.in_dtypes,
                                               placed.input_grads)]
        try:
            outs = traced(*params, *xs)
        except _JointTraced:
            assert rec.joint is not None  # (recorded before it was raised)
            rec.out_grad = _differentiable_outputs(rec.joint, returned[0])
        else:  # no gradient to trace: AOTAutograd ran the inference graph
            rec.out_grad = [t.requires_grad for t in outs]
    return rec
