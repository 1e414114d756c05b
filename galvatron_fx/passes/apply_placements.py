"""apply_placements — one layer run under its intra-layer plan with DTensor, and traced.

Contract: :class:`PlacedLayer` takes a :class:`~galvatron_fx.passes.decompose_layer.DecomposedLayer`
traced at the *runtime* micro-batch shape (view/reshape arguments are global shapes, and DTensor
ops take global shapes), the :class:`~galvatron_fx.ir.layer_option.LayerOption` solved for it
(one placement per decomposed node on the ``tp`` mesh axis) and a 2-D device mesh with
``mesh_dim_names == ("dp", "tp")``. :meth:`PlacedLayer._interpret` runs the layer on DTensors
laid out as :meth:`PlacedLayer.input_placements` says and returns DTensors; the runtime's
executor (:class:`~galvatron_fx.runtime.layer_exec.LayerExecutor`) is a ``PlacedLayer`` that
holds the parameters. :func:`apply_placements_pass`, the first pass of the lowering
(:mod:`galvatron_fx.passes.lower_program`), traces a ``PlacedLayer`` on fake tensors into the
joint forward-backward graph of local ATen ops and functional collectives that will run.

Terms: *storage* placement of a parameter: ``(Replicate on dp, the plan's placeholder placement
on tp)``, never ``Partial`` (a planned ``P`` is stored replicated). Activations are
batch-sharded on dp (``Shard(0)``); values every layer reads (role ``other``: rotary tables,
masks) are replicated.

Algorithm: an interpreter over the decomposed graph. Before each node, every tensor input is
redistributed to ``(its current dp placement, the plan's tp placement)``; the dp placement is
left to DTensor's propagation. A value redistributed to the same layout for several readers is
redistributed once (the plan charges it once). A planned ``Partial`` input (``R -> P`` or
``S(d) -> P`` on tp, which DTensor's ``redistribute`` refuses) is made locally
(:func:`~galvatron_fx.passes.layout_autograd._to_partial`), with no collective. The op then runs
on DTensors (the rules we add for kernels DTensor has none for: :mod:`galvatron_fx.ops.shardings`);
its output tp placement is checked against the plan (:attr:`PlacedLayer.mismatches`). Each value
a node makes has its partial gradient summed once, where it is made
(:func:`~galvatron_fx.passes.layout_autograd._sum_grad_here`). The trace: AOTAutograd over a
function of *local* tensors (parameters as local shards, inputs wrapped with ``from_local`` in
their recorded layouts), so that DTensor's propagation and redistribution, forward and backward,
happen at trace time and only local ops and functional collectives remain (:mod:`~galvatron_fx.passes.trace_layer`).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx as fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_flatten, tree_map

from galvatron_fx.ir.layer_option import LayerOption
from galvatron_fx.ir.placements import NodePlacement, pstr
from galvatron_fx.ir.program import ParamMeta
from galvatron_fx.ir.strategy import LAYER_MESH_DIMS
from galvatron_fx.ops import (
    shardings,  # noqa: F401 (registers our DTensor rules)
    vocab_parallel,
)
from galvatron_fx.passes.decompose_layer import DecomposedLayer
from galvatron_fx.passes.layout_autograd import (
    _AsDTensor,
    _grad_together,
    _move_on_tp,
    _storage,
    _sum_grad_here,
    _to_partial,
)
from galvatron_fx.passes.runner import PassContext, graph_pass
from galvatron_fx.passes.state_writes import HIDDEN_WRITES, written_through  # noqa: F401 (re-exported)
from galvatron_fx.passes.trace_layer import Trace, trace_local, trace_placed

__all__ = ["HIDDEN_WRITES", "IGNORED", "PlacedLayer", "Trace", "apply_placements_pass", "option_from_plan", "tensor_args", "trace_local",
           "trace_placed"]

log = logging.getLogger(__name__)

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten._unsafe_view.default}  # views the runtime may have to copy (see _run)
IGNORED = {aten._assert_tensor_metadata.default}
R = Replicate()


def tensor_args(n: fx.Node) -> list[fx.Node]:
    return [a for a in tree_flatten((n.args, n.kwargs))[0] if isinstance(a, fx.Node)]


def _kwargs_follow_dp(args, kwargs: dict, mesh: DeviceMesh) -> dict:
    """Keyword tensor arguments laid out on dp like the op's first positional DTensor, where
    they have its rank and its size on the dim it is sharded on, else replicated: DTensor
    redistributes positional arguments only, so an attention mask (``attn_mask=`` of the SDPA
    kernels, made replicated from factories) would otherwise meet a batch-sharded query with
    its whole batch. A redistribute to a shard is a local slice."""
    ref = next((a for a in tree_flatten(args)[0] if isinstance(a, DTensor)), None)
    if ref is None:
        return kwargs
    ref_dp = ref.placements[0]

    def follow(v):
        if not isinstance(v, DTensor) or v.ndim != ref.ndim or v.device_mesh is not ref.device_mesh:
            return v
        want = ref_dp if isinstance(ref_dp, Shard) and v.shape[ref_dp.dim] == ref.shape[ref_dp.dim] else R
        if v.placements[0] == want:
            return v
        return v.redistribute(mesh, (want, *v.placements[1:]))

    return {k: follow(v) for k, v in kwargs.items()}


def _fresh(n: fx.Node) -> bool:
    """Whether ``n`` makes new tensors: not a view or alias of its input, nor an op that writes
    one in place (relaying those out would lose the aliasing)."""
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and not t.is_view and not t._schema.is_mutable \
        and t._overloadpacket not in (torch.ops.aten.alias, torch.ops.aten._unsafe_view, torch.ops.aten.detach)


def _calls(dl: DecomposedLayer) -> list[fx.Node]:
    return [n for n in dl.gm.graph.nodes if n.op == "call_function" and n.target not in IGNORED
            and n.target is not operator.getitem]


def option_from_plan(dl: DecomposedLayer, kind: str, strategy, placements: dict[str, str]) -> LayerOption | None:
    """The :class:`LayerOption` the executor needs, rebuilt from a plan's saved placements; an
    all-replicated one at tp=1. Nodes the placements do not name that only cast a value (the
    compute-dtype graph's upcasts, which the fp32 graph the plan was made on lacks) keep their
    input's placement; None when other decomposed nodes are not named."""
    tp = strategy.tp
    needed = [ph.name for ph in dl.inputs] + [n.name for n in _calls(dl)]
    if tp == 1 and not placements:
        placements = {ph.name: "->R" for ph in dl.inputs}
        placements |= {n.name: ",".join("R" for _ in tensor_args(n)) + "->R" for n in _calls(dl)}
    if any(n not in placements for n in needed):
        completed = _with_casts_following(dl, placements)
        if completed is None:
            return None
        placements = completed
    return LayerOption(kind=kind, tp=tp, sp=strategy.sp, placements=dict(placements), compute_s=0.0,
                       compute_ratio=1.0 / tp, comm_fwd_s=0.0, comm_bwd_s=0.0, param_fraction=1.0,
                       activation_fraction=1.0, comm=(), input_layout=(), output_layout=(),
                       objective_s=0.0, solve_s=0.0, num_variables=0)


# ops that change a value's dtype or identity but not its layout: a plan made on the fp32 graph
# names none of those the compute-dtype graph adds (a norm's upcast, vanishing in fp32), and each
# simply keeps its input's placement
_FOLLOWERS = {aten._to_copy.default, aten.clone.default, aten.detach.default, aten.alias.default}


def _with_casts_following(dl: DecomposedLayer, placements: dict[str, str]) -> dict[str, str] | None:
    """``placements`` completed for the nodes it does not name, when each is a cast-like op of
    one tensor (:data:`_FOLLOWERS`); None when another is missing. A cast keeps its input's
    placement, except an upcast (to a wider dtype: a norm's ``x.float()``), which takes the
    placement its first reader wants, so that a redistribution moves the narrower tensor."""
    out = dict(placements)
    made: dict[str, list[str]] = {}  # node -> its planned output placements

    def placed(a: fx.Node) -> str | None:
        if a.op == "call_function" and a.target is operator.getitem:
            src, k = cast(tuple[fx.Node, int], a.args)
            outs = made.get(src.name)
            return outs[k] if outs is not None and k < len(outs) else None
        outs = made.get(a.name)
        return outs[0] if outs else None

    def wanted(n: fx.Node) -> str | None:
        for user in n.users:
            s = out.get(user.name)
            if s is not None:
                ins = s.split("->")[0].split(",")
                for a, p in zip(tensor_args(user), ins):
                    if a is n:
                        return p
        return None

    def upcast(n: fx.Node, a: fx.Node) -> bool:
        v, w = n.meta.get("val"), a.meta.get("val")
        return isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) and v.element_size() > w.element_size()

    for n in dl.gm.graph.nodes:
        if n.op == "placeholder" or (n.op == "call_function" and n.target not in IGNORED
                                     and n.target is not operator.getitem):
            if n.name not in out:
                args = tensor_args(n)
                if not (n.op == "call_function" and n.target in _FOLLOWERS and len(args) == 1):
                    return None
                p = placed(args[0])
                if upcast(n, args[0]):
                    p = wanted(n) or p
                if p is None or p == "-":
                    return None
                out[n.name] = f"{p}->{p}"
            made[n.name] = out[n.name].split("->")[1].split(",")
    return out


def _run_replicated(n: fx.Node, args, kwargs, mesh: DeviceMesh):
    """An op DTensor has no rule for, run on whole tensors: every DTensor argument replicated on
    every mesh axis (gathered, partial sums reduced), the op run on the local tensors, its tensor
    outputs replicated DTensors. Exact whatever the op does; the intra-layer ILP offers such a
    node only its replicated strategy, so the gathers and the unsplit compute are priced."""
    def whole(v):
        if not isinstance(v, DTensor):
            return v
        if any(not isinstance(p, Replicate) for p in v.placements):
            v = v.redistribute(mesh, (R,) * mesh.ndim)
        return v.to_local()

    schema: Any = getattr(n.target, "_schema", None)
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write} \
        if schema is not None else set()
    args, kwargs = tree_map(whole, args), tree_map(whole, kwargs)
    if written:  # an in-place op writes a copy (the local tensor of a DTensor is not its own to write)
        names = [a.name for a in schema.arguments]
        args = tuple(a.clone() if i < len(names) and names[i] in written and isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(args))
        kwargs = {k: v.clone() if k in written and isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = cast(Callable[..., Any], n.target)(*args, **kwargs)
    return tree_map(lambda t: DTensor.from_local(t, mesh, (R,) * mesh.ndim, run_check=False)
                    if isinstance(t, torch.Tensor) else t, out)


class PlacedLayer:
    """One decomposed layer under its plan on a ``(dp, tp)`` mesh (see module doc).

    ``fqns`` maps the decomposed layer's parameter input names (``dl.input_names``) to the
    user's FQNs; a parameter's *key* is its FQN with ``.`` as ``__`` (tied placeholders share
    one). ``replicate_plain`` (the runtime's and the lowering's choice): a factory op's plain
    tensor output (``arange`` of positions, ``full`` of a mask) becomes a replicated DTensor, so
    that later ops do not mix plain tensors and DTensors.
    """

    replicate_plain = True

    def __init__(self, dl: DecomposedLayer, option: LayerOption, mesh: DeviceMesh,
                 fqns: dict[str, str] | None = None):
        assert mesh.ndim == 2 and mesh.mesh_dim_names == tuple(str(a) for a in LAYER_MESH_DIMS), \
            f"a placed layer needs a 2-D mesh named ('dp', 'tp'), got {mesh.mesh_dim_names}"
        assert mesh.size(1) == option.tp, f"mesh tp={mesh.size(1)} but the plan is for tp={option.tp}"
        self.gm = dl.gm
        self.mesh = mesh
        self.option = option
        self._plan = {n: NodePlacement.parse(s) for n, s in option.placements.items()}
        self._in_place = written_through(self.gm)
        self._written = {base for _user, base in self._in_place}  # values some op writes into, or through a view
        fqns = fqns or {}
        self._param_of: dict[str, str] = {}  # decomposed placeholder -> parameter key
        self._inputs: list[tuple[fx.Node, str]] = []  # non-parameter placeholders, with roles
        self.input_names: list[str] = []  # the values they read (the captured graph's names)
        self.input_grads: list[bool] = []  # which require grad in training
        self.param_keys: dict[str, tuple[str, str, fx.Node]] = {}  # key -> (FQN, input name, first placeholder)
        grads = dl.input_grads or [True] * len(dl.inputs)
        for ph, name, role, grad in zip(dl.inputs, dl.input_names, dl.input_roles, grads):
            if role != "param":
                self._inputs.append((ph, role))
                self.input_names.append(name)
                self.input_grads.append(grad)
                continue
            fqn = fqns.get(name, name)
            key = fqn.replace(".", "__")
            self._param_of[ph.name] = key
            self.param_keys.setdefault(key, (fqn, name, ph))
        self.mismatches: set[str] = set()  # planned vs. DTensor's output placements, if any differ
        self.compute_dtype: torch.dtype | None = None  # mixed precision: parameters are read in this dtype
        # key -> (tp storage placement, global shape, global stride)
        self._meta = {k: (_storage(cast(Placement, self._plan[ph.name].outputs[0])), tuple(ph.meta["val"].shape),
                          ph.meta["val"].stride())
                      for k, (_, _, ph) in self.param_keys.items()}

    # -- layouts -----------------------------------------------------------------------------

    def input_placements(self, inputs: set[str] | frozenset = frozenset(), batched: set[str] | frozenset = frozenset(),
                         propagated: set[str] | frozenset = frozenset()) -> list[tuple[Placement, Placement]]:
        """The ``(dp, tp)`` layout of each non-parameter input, in forward-argument order, as the
        runtime lays them out: a user input (in ``inputs``) and a value computed from one (in
        ``propagated``: hidden states, an encoder's output; with nothing known, every hidden
        state) are batch-sharded on dp, as DTensor propagates them (a batch of one on one dp rank
        is whole); a value
        made from factories with the batch in dim 0 (in ``batched``: a mask) is split on dp
        where dp > 1, else replicated."""
        out: list[tuple[Placement, Placement]] = []
        split = self.mesh.size(0) > 1
        for (ph, role), name in zip(self._inputs, self.input_names):
            tp_p = cast(Placement, self._plan[ph.name].outputs[0])  # an input is a tensor
            v = ph.meta["val"]
            if name in inputs or name in propagated or (role == "activation" and not propagated):
                # (with nothing known, a hidden state is batched; a batch of one on one dp rank is
                # whole: DTensor cannot fold a Shard(0) dim of size one into another)
                batch = split or (v.ndim >= 1 and v.shape[0] > 1)
            else:  # made from factories: split on dp where dp > 1 and it has the batch
                batch = split and name in batched and v.shape[0] % self.mesh.size(0) == 0
            out.append((Shard(0) if batch and v.ndim >= 1 else R, tp_p))
        return out

    # -- running ------------------------------------------------------------------------------

    def _param(self, key: str, local: torch.Tensor | None = None) -> DTensor:
        """The parameter ``key`` as the graph reads it, a ``(Replicate, tp)`` DTensor, from its
        local shard ``local`` (a hook: the runtime's executor reads its own storage)."""
        tp_p, shape, stride = self._meta[key]
        return _AsDTensor.apply(self._cast(cast(torch.Tensor, local)), self.mesh, tp_p, shape, stride)

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in the compute dtype (mixed precision: a differentiable copy, whose gradient
        comes back in the parameter's dtype)."""
        dtype = self.compute_dtype
        return t if dtype is None or not t.is_floating_point() or t.dtype == dtype else t.to(dtype)

    def _interpret(self, xs, params: dict | None = None):
        """Run the decomposed graph op by op on DTensors (``params``: key -> local shard, read
        in place of the holder's own)."""
        env: dict[fx.Node, Any] = {}
        moved: dict[tuple[str, tuple], DTensor] = {}  # one redistribute per (value, layout)
        given = dict(zip((ph for ph, _ in self._inputs), xs))
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                if n.name in self._param_of:
                    key = self._param_of[n.name]
                    env[n] = self._param(key, None if params is None else params[key])
                else:
                    env[n] = given[n]
            elif n.op == "call_function":
                if n.target in IGNORED:
                    env[n] = None
                elif n.target is operator.getitem:
                    src, idx = n.args
                    env[n] = env[src][idx]
                else:
                    env[n] = self._run(n, env, moved)
            elif n.op == "get_attr":
                env[n] = distribute_tensor(getattr(self.gm, n.target), self.mesh, [R, R], src_data_rank=None)
            elif n.op == "output":
                return tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, n.args[0])
        raise AssertionError("decomposed graph without output")

    def _run(self, n: fx.Node, env: dict, moved: dict):
        want_in, want_out = self._plan[n.name].inputs, self._plan[n.name].outputs
        targs = tensor_args(n)
        assert len(want_in) == len(targs), f"plan {self.option.placements[n.name]!r} vs {n.format_node()}"
        want = dict(zip(targs, want_in))

        def load(a):
            if not isinstance(a, fx.Node):
                return a
            v = env[a]
            if not isinstance(v, DTensor):
                return v
            dst = (v.placements[0], want[a])
            if tuple(v.placements) == dst or (n, a) in self._in_place:
                return v  # (a value written in place, or a view of one, must stay that tensor)
            key = (a.name, dst)
            if key not in moved:
                if isinstance(want[a], Partial):
                    moved[key] = _to_partial(v, self.mesh)
                elif isinstance(v.placements[0], Replicate) and v.requires_grad:
                    moved[key] = _move_on_tp(v, self.mesh, want[a])  # (its gradient stays a dp sum)
                else:
                    moved[key] = v.redistribute(self.mesh, dst)
            return moved[key]

        args = fx.node.map_aggregate(n.args, load)
        kwargs = fx.node.map_aggregate(n.kwargs, load)
        if kwargs:
            kwargs = _kwargs_follow_dp(args, kwargs, self.mesh)
        if vocab_parallel.runs(n, tuple(want_in), args):  # class-sharded, or a mean over split rows
            out = vocab_parallel.run(n, args, kwargs, axis=1)
        else:
            try:
                out = cast(Callable[..., Any], n.target)(*args, **kwargs)
            except NotImplementedError as e:
                if "sharding strategy" not in str(e):
                    raise
                out = _run_replicated(n, args, kwargs, self.mesh)
            except (RuntimeError, ValueError) as e:  # NotImplementedError, a RuntimeError, is handled above
                if n.target not in _VIEWS or "view" not in str(e):
                    raise
                # the local tensor is laid out otherwise than the graph was traced with (DTensor's
                # kernels and redistributions keep their own memory layouts): the same values as a
                # copy that the view can read
                out = n.target(aten.clone.default(args[0], memory_format=torch.contiguous_format), *args[1:], **kwargs)
        got = [o.placements[1] if isinstance(o, DTensor) else None
               for o in (out if isinstance(out, (tuple, list)) else [out])]
        for g, w in zip(got, want_out):
            if g is not None and w is not None and g != w:
                self.mismatches.add(f"{n.name}: planned {pstr(w)}, DTensor gave {pstr(g)}")
        if any(g is not None and w is not None and g != w for g, w in zip(got, want_out)) and _fresh(n):
            # DTensor's dispatch picked another of its strategies than the plan's (a new_zeros of a
            # sharded input follows it, where the plan may keep it whole): laid out as planned,
            # so that what later reads or writes it in place sees the plan's layout
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            for j, (o, w) in enumerate(zip(outs, want_out)):
                if isinstance(o, DTensor) and w is not None and o.placements[1] != w:
                    outs[j] = _to_partial(o, self.mesh) if isinstance(w, Partial) else \
                        o.redistribute(self.mesh, (o.placements[0], w))
            out = type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]
        if torch.is_grad_enabled() and n not in self._written:  # (a value written through must stay that tensor)
            if isinstance(out, DTensor) and self.mesh.size(1) > 1:
                out = _sum_grad_here(out)
            elif isinstance(out, (tuple, list)):
                # (also at tp 1: an output of a split that no later op reads gets a zero gradient
                # as a DTensor, where autograd's own would be a plain tensor its backward's cat refuses)
                out = type(out)(_grad_together(list(out)))
        if self.replicate_plain and isinstance(out, torch.Tensor) and not isinstance(out, DTensor):
            out = DTensor.from_local(out, self.mesh, [R, R], run_check=False)
        return out

    # -- the function the lowering traces --------------------------------------------------------

    def local_function(self, in_specs, record):
        """``f(*param_shards, *input_locals) -> flat local outputs``: the layer on local tensors,
        inputs wrapped in the layouts ``in_specs()`` gives (``(placements, shape, stride)`` each),
        outputs unwrapped; ``record`` (a :class:`Trace`, or the runtime's holder) receives the
        outputs' layouts and non-tensor leaves while it is traced."""
        keys = list(self.param_keys)
        n = len(keys)

        def traced(*flat):
            xs = [DTensor.from_local(x, self.mesh, pl, run_check=False, shape=sh, stride=st)
                  for x, (pl, sh, st) in zip(flat[n:], in_specs())]
            outs = self._interpret(xs, dict(zip(keys, flat[:n])))
            leaves, record.out_tree = tree_flatten(outs)
            record.out_specs, record.out_consts, ret = [], {}, []
            for i, o in enumerate(leaves):
                if isinstance(o, DTensor):
                    record.out_specs.append((tuple(o.placements), o.shape, o.stride()))
                    ret.append(o.to_local())
                elif isinstance(o, torch.Tensor):
                    record.out_specs.append(None)
                    ret.append(o)
                else:
                    record.out_consts[i] = o
            return tuple(ret)

        return traced


def _from_batched_inputs(mg) -> set[str]:
    """Names of the captured graph's values computed from a user input (one walk of its nodes)."""
    seeds = set(mg.input_names)
    out: set[str] = set()
    for n in mg.gm.graph.nodes:
        if n.name in seeds or any(a.name in out for a in n.all_input_nodes):
            out.add(n.name)
    return out


@graph_pass(requires=("decomposed",), produces=("joint",))
def apply_placements_pass(prog, ctx: PassContext):
    """Lay the layer out as its plan says and trace it (see module doc): ``prog``
    (:class:`~galvatron_fx.ir.program.LayerGraphs`) gains its joint graph and layouts. A layer
    at tp 1 that can run locally (:func:`~galvatron_fx.passes.localize_batch.local_problem`)
    is traced as plain local ops on its rank's share of the batch (:func:`trace_local`)."""
    placed = PlacedLayer(prog.decomposed, prog.option, ctx.mesh, prog.fqns)
    placed.compute_dtype = prog.compute_dtype
    trainable = {p.name for p in ctx.graph.params.values() if p.requires_grad} if ctx.graph is not None else None
    mg = ctx.graph
    inputs = set(mg.input_names) if mg is not None else set()
    batched = set(mg.batched) if mg is not None else set()
    propagated = _from_batched_inputs(mg) if mg is not None else set()
    rec = None
    prog.local = False
    if mg is not None and prog.option.tp == 1:
        local = _local_layer(mg, prog, ctx.mesh.size(0), propagated)
        if isinstance(local, str):
            log.info("layer %s runs with DTensor on the data-parallel axis: %s", prog.name, local)
        else:
            dl_local, layouts = local
            rec = trace_local(placed, dl_local, layouts, trainable=trainable, inputs=inputs, batched=batched,
                              propagated=propagated, param_dtype=prog.param_dtype)
            prog.local = True
    if rec is None:
        rec = trace_placed(placed, trainable=trainable, inputs=inputs, batched=batched, propagated=propagated,
                           param_dtype=prog.param_dtype)
    prog.trace = rec
    prog.joint = rec.joint
    prog.mismatches = sorted(placed.mismatches)
    prog.param_names = [fqn for fqn, _, _ in placed.param_keys.values()]
    trainable = trainable if trainable is not None else set(prog.param_names)
    prog.param_meta = [ParamMeta(fqn, pstr(placed._meta[key][0]), tuple(ph.meta["val"].shape), ph.meta["val"].dtype,
                                 bool(ph.meta["val"].is_floating_point() and fqn in trainable))
                       for key, (fqn, _, ph) in placed.param_keys.items()]
    return prog


def _local_layer(mg, prog, dp: int, propagated: set[str]):
    """The layer decomposed at this rank's share of the batch and its outputs' layouts, or why
    it cannot run locally (a string)."""
    from galvatron_fx.passes.decompose_layer import decompose_layer
    from galvatron_fx.passes.localize_batch import local_problem, localized

    layer = mg.layer(prog.name)
    why = local_problem(mg, layer, dp)
    if why is not None:
        return why
    batch = mg.example_shapes[0][0] if mg.example_shapes else 0
    local_mg = localized(mg, batch // dp) if dp > 1 else mg
    if local_mg is None:
        return f"the graph cannot be re-instantiated at {batch // dp} samples"
    cache = local_mg.gm.meta.setdefault("gfx_local_decomposed", {})
    if layer.kind not in cache:
        cache[layer.kind] = decompose_layer(local_mg, local_mg.layer(layer.name)) if local_mg is not mg \
            else prog.decomposed
    dl_local = cache[layer.kind]
    s = mg.batch_scaling
    by_name = mg.nodes_by_name()
    layouts = []
    for name in layer.output_names:
        for v in tree_flatten(by_name[name].meta.get("val"))[0]:
            if not isinstance(v, torch.Tensor):
                continue
            if dp > 1:
                dims = (s.dims.get(name) or ((),))[0] if s is not None else ()
                layouts.append((Shard(0) if 0 in dims else R, R))
            else:  # as DTensor propagates a batch-sharded input on one rank (input_placements)
                layouts.append((Shard(0) if name in propagated and v.ndim >= 1 and v.shape[0] > 1 else R, R))
    return dl_local, layouts
