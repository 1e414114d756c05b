"""LayerExecutor — run one planned layer with DTensor, exactly as its intra-layer plan says.

Contract: takes a :class:`~galvatron_fx.passes.decompose_layer.DecomposedLayer` traced at the
*runtime* micro-batch shape (view/reshape arguments are global shapes, and DTensor ops take
global shapes), the :class:`~galvatron_fx.ir.layer_option.LayerOption` solved for it (one
placement string per decomposed node on the 1-D ``tp`` mesh), a 2-D device mesh with
``mesh_dim_names == ("dp", "tp")`` and the layer's parameters (the user's real tensors). It
produces an ``nn.Module`` whose forward takes the layer's non-parameter inputs as DTensors laid
out as :meth:`LayerExecutor.input_placements` says, and returns DTensors.

Terms: *storage* placement of a parameter: ``(Replicate on dp, the plan's placeholder
placement on tp)``, never ``Partial`` (a planned ``P`` is stored replicated). *Use* placement:
the plan's input placement of the node that reads a value. Activations are batch-sharded on dp
(``Shard(0)``); values every layer reads (role ``other``: rotary tables, masks) are replicated.

Algorithm: an interpreter over the decomposed graph. Before each node, every tensor input is
redistributed to ``(its current dp placement, the plan's tp placement)``; the dp placement is
left to DTensor's propagation (a batch ``Shard(0)`` survives the ``(B, T, C) -> (B*T, C)`` flatten
and the matching unflatten). A value redistributed to the same layout for several readers is
redistributed once (the plan charges it once), so the runtime's forward collectives equal
``option.collectives("fwd")``. A planned ``Partial`` input (``R -> P`` or ``S(d) -> P`` on tp,
which DTensor's public ``redistribute`` refuses) is made locally by :func:`_to_partial`, with no
collective, as the plan assumes. The op then runs on DTensors; its output tp placement is checked
against the plan (mismatches are recorded in :attr:`LayerExecutor.mismatches`).

Attention: the CPU flash-attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu``
and its backward) has no DTensor rule; :func:`register_cpu_flash_attention_rules` registers one
through DTensor's own API (``register_op_strategy``): all-replicated, heads-sharded (dim 1) and
batch-sharded (dim 0); a 4-D mask follows q on the sharded dim where it has that size.

Data parallelism: after backward, a parameter's grad is ``Partial`` on dp (its readers saw a
batch-sharded activation) and, under sequence parallelism, possibly ``Partial`` on tp (LayerNorm
weights). :meth:`LayerExecutor.sync_grads` redistributes every grad to its parameter's storage
placement: an all-reduce (sum) over dp and, where needed, tp. The sum is the gradient of the sum
of the per-rank losses; a mean loss must be divided by the dp degree by the caller's loss.

Beside it: the layout autograd functions (:mod:`galvatron_fx.runtime.layout_autograd`), the
executor traced to local graphs (:mod:`galvatron_fx.runtime.lowered`), and the passes over those
graphs (:mod:`galvatron_fx.passes.clean_up_graphs`, :mod:`galvatron_fx.passes.hoist_saved_collectives`).
"""

from __future__ import annotations

import collections
import copy
import logging
import operator

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx import shardings  # noqa: F401 (registers our DTensor rules)
from galvatron_fx import vocab_parallel
from galvatron_fx.runtime.layout_autograd import _AsDTensor, _storage, _sum_grad_here, _to_partial
from galvatron_fx.runtime.lowered import _Lowered
from galvatron_fx.ir.layer_option import LayerOption
from galvatron_fx.ir.placements import parse_placement, pstr
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer

log = logging.getLogger(__name__)
aten = torch.ops.aten

_IGNORED = {aten._assert_tensor_metadata.default}
R = Replicate()


# ---- DTensor rules for the CPU flash-attention kernel -------------------------------------------

_REGISTERED = False


def register_cpu_flash_attention_rules() -> None:
    """Register DTensor sharding strategies for the CPU flash-attention forward and backward.

    Strategies per mesh dim: all replicated; heads sharded (``Shard(1)`` on q, k, v, out, lse and
    grads); batch sharded (``Shard(0)``). An ``attn_mask`` follows q on the sharded dim where it
    has q's size there (else it stays replicated, i.e. broadcast).
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy

    def mask_placement(op_schema: OpSchema, q_index: int, d: int) -> list[Placement]:
        mask = op_schema.kwargs_schema.get("attn_mask")
        if not isinstance(mask, OpStrategy):
            return []
        q_shape = op_schema.args_schema[q_index].shape
        m_shape = mask.shape
        keep = len(m_shape) == 4 and m_shape[d] == q_shape[d]
        return [Shard(d) if keep else R]

    @register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default,
                          schema_info=RuntimeSchemaInfo(3, static_kwargkey=["scale"]))
    def _fwd(op_schema: OpSchema):
        mesh = op_schema.get_mesh_from_args()
        # [out, logsumexp, q, k, v, (attn_mask)]
        strategies = [[R] * 5 + ([R] if mask_placement(op_schema, 0, 1) else [])]
        for d in (1, 0):
            strategies.append([Shard(d)] * 5 + mask_placement(op_schema, 0, d))
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)

    @register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                          schema_info=RuntimeSchemaInfo(6, static_kwargkey=["scale"]))
    def _bwd(op_schema: OpSchema):
        mesh = op_schema.get_mesh_from_args(validate=False)
        # [grad_q, grad_k, grad_v, grad_out, q, k, v, out, logsumexp, (attn_mask)]
        strategies = [[R] * 9 + ([R] if mask_placement(op_schema, 1, 1) else [])]
        for d in (1, 0):
            strategies.append([Shard(d)] * 9 + mask_placement(op_schema, 1, d))
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=3)

    _REGISTERED = True


# ---- the executor -----------------------------------------------------------------------------

def _parse_strategy(s: str) -> tuple[list[Placement], list[Placement | None]]:
    """``"S(0),R->S(1),-"`` → ([Shard(0), R], [Shard(1), None])."""
    ins, outs = s.split("->")
    return ([parse_placement(p) for p in ins.split(",") if p],
            [None if p == "-" else parse_placement(p) for p in outs.split(",") if p])


def _tensor_args(n: fx.Node) -> list[fx.Node]:
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
        dp_p = v.placements[0]
        if dp_p == want:
            return v
        return v.redistribute(mesh, (want, *v.placements[1:]))

    return {k: follow(v) for k, v in kwargs.items()}


def _written_through(gm: fx.GraphModule) -> set[tuple[fx.Node, fx.Node]]:
    """``(op, argument)`` pairs the executor must pass as they are: an argument an op writes in
    place, and along its chain of views the base each view reads. Redistributing any of them
    would hand the op a copy, and the write would be lost (``ids.new_zeros(...)`` filled through
    ``[..., 1:] = labels[..., :-1]``: T5's decoder-input shift)."""
    out: set[tuple[fx.Node, fx.Node]] = set()
    for n in gm.graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
            continue
        for a, arg in zip(n.args, t._schema.arguments):
            if not (isinstance(a, fx.Node) and arg.alias_info is not None and arg.alias_info.is_write):
                continue
            user, base = n, a
            while True:
                out.add((user, base))
                bt = base.target
                if base.op != "call_function" or not isinstance(bt, torch._ops.OpOverload) or not bt.is_view \
                        or not base.args or not isinstance(base.args[0], fx.Node):
                    break
                user, base = base, base.args[0]
    return out


class LayerExecutor(nn.Module):
    """One planned layer on a ``(dp, tp)`` mesh (see module doc).

    ``params`` maps the decomposed layer's parameter input names (``dl.input_names``, the
    captured graph's placeholder names) to real tensors; ``fqns`` maps the same names to the
    user's FQNs (used to name the executor's parameters; tied placeholders share one).
    """

    def __init__(self, dl: DecomposedLayer, option: LayerOption, mesh: DeviceMesh,
                 params: dict[str, torch.Tensor], fqns: dict[str, str] | None = None):
        super().__init__()
        assert mesh.ndim == 2 and mesh.mesh_dim_names == ("dp", "tp"), \
            f"LayerExecutor needs a 2-D mesh named ('dp', 'tp'), got {mesh.mesh_dim_names}"
        assert mesh.size(1) == option.tp, f"mesh tp={mesh.size(1)} but the plan is for tp={option.tp}"
        register_cpu_flash_attention_rules()
        self.gm = dl.gm
        self.mesh = mesh
        self.option = option
        self._plan = {n: _parse_strategy(s) for n, s in option.placements.items()}
        self._in_place = _written_through(self.gm)
        fqns = fqns or {}
        self._param_of: dict[str, str] = {}  # decomposed placeholder -> key in self.params
        self._inputs: list[tuple[fx.Node, str]] = []  # non-parameter placeholders, with roles
        self.params = nn.ParameterDict()
        self.fqn_of_key: dict[str, str] = {}
        for ph, name, role in zip(dl.inputs, dl.input_names, dl.input_roles):
            if role != "param":
                self._inputs.append((ph, role))
                continue
            fqn = fqns.get(name, name)
            key = fqn.replace(".", "__")
            self._param_of[ph.name] = key
            if key in self.params:  # a tied weight read twice: one storage, redistributed at use
                continue
            tp_p = _storage(self._plan[ph.name][1][0])
            dt = distribute_tensor(params[name].detach().clone(), mesh, [R, tp_p])
            self.params[key] = nn.Parameter(dt, requires_grad=params[name].requires_grad)
            self.fqn_of_key[key] = fqn
        self.mismatches: set[str] = set()  # planned vs. DTensor's output placements, if any differ
        self.lowered = None  # the traced local-op function (see lower())
        self.compute_dtype: torch.dtype | None = None  # mixed precision: parameters are read in this dtype
        self._local: set[str] = set()  # parameters stored as plain local shards (localize())
        # key -> (tp storage placement, global shape, global stride)
        self._meta = {k: (p.placements[1], p.shape, p.stride()) for k, p in self.params.items()}

    @classmethod
    def from_model(cls, mg: ModelGraph, layer: LayerInfo, option: LayerOption, mesh: DeviceMesh,
                   model: nn.Module, *, decomposed: DecomposedLayer | None = None) -> LayerExecutor:
        """Build from a captured model (captured at the runtime micro-batch shape) and the user's
        module, whose parameters are matched by FQN."""
        dl = decomposed or decompose_layer(mg, layer)
        fqns = {node: fqn for fqn, p in mg.params.items() for node in p.nodes}
        named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
        params = {name: named[fqns[name]] for name, role in zip(dl.input_names, dl.input_roles) if role == "param"}
        return cls(dl, option, mesh, params, fqns)

    # -- layouts -----------------------------------------------------------------------------

    def input_placements(self) -> list[tuple[Placement, Placement]]:
        """The ``(dp, tp)`` layout of each non-parameter input, in forward-argument order."""
        out = []
        for ph, role in self._inputs:
            tp_p = self._plan[ph.name][1][0]
            batch = role == "activation" and ph.meta["val"].ndim >= 1
            out.append((Shard(0) if batch else R, tp_p))
        return out

    def distribute_inputs(self, *xs: torch.Tensor) -> list[DTensor]:
        """Lay out full (identical on every rank) input tensors as :meth:`input_placements` says."""
        return [distribute_tensor(x, self.mesh, list(p)) for x, p in zip(xs, self.input_placements())]

    # -- forward ------------------------------------------------------------------------------

    def forward(self, *xs: DTensor | torch.Tensor, unwrapped: bool = False):
        """The layer's outputs (DTensors) for its inputs laid out as :meth:`input_placements`
        says. ``unwrapped`` (for callers that chain lowered layers): inputs may also be local
        tensors the lowered graph :meth:`_Lowered.accepts`, and DTensor outputs come back as
        their local tensors (:meth:`_Lowered.rewrap` gives their layouts). Called as a module
        (``ex(*xs, unwrapped=True)``), so that FSDP's hooks see it."""
        assert len(xs) == len(self._inputs), f"expected {len(self._inputs)} inputs, got {len(xs)}"
        if self.lowered is not None:
            return self.lowered(self, xs, unwrapped=unwrapped)
        return self._interpret(xs)

    def _interpret(self, xs, params: dict | None = None):
        """Run the decomposed graph op by op on DTensors (``params``: key -> stored tensor, in
        place of the executor's own, for :meth:`lower`)."""
        env: dict[fx.Node, object] = {}
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
                if n.target in _IGNORED:
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

    # -- lowering -----------------------------------------------------------------------------

    def lower(self, share_with: LayerExecutor | None = None) -> None:
        """Run the layer as one traced graph of local ATen ops and functional collectives
        (:class:`_Lowered`); ``share_with``: an executor of the same kind, option, mesh and
        parameter storage whose trace this one reuses (parameters line up by position)."""
        if share_with is not None and share_with is not self and share_with.lowered is not None:
            self.lowered = share_with.lowered
        else:
            self.lowered = _Lowered(self)

    def localize(self) -> None:
        """Store each parameter as its plain local shard (``tp`` placement kept as metadata).

        The optimizer then steps ordinary tensors, and a gradient arrives as a plain local
        tensor holding this rank's share of a sum over dp (:class:`_AsDTensor`), ready for a
        bucketed all-reduce (:func:`~galvatron_fx.runtime.buckets.all_reduce_coalesced`).
        Not for parameters that FSDP shards (FSDP wants DTensors)."""
        for key, p in list(self.params.items()):
            if key in self._local:
                continue
            self._local.add(key)
            self.params[key] = nn.Parameter(p.detach()._local_tensor, requires_grad=p.requires_grad)

    def local_params(self) -> list[torch.Tensor]:
        """This rank's shard of every parameter, in ``self.params`` order, as a lowered layer
        reads them (differentiably: an FSDP-unsharded DTensor's local tensor; a hook for callers
        that keep the parameters elsewhere)."""
        # the ParameterDict's own storage (its values() goes through __getitem__ per key; FSDP
        # swaps parameters in place there, so this sees the current ones)
        stored = self.params._parameters
        return [p.to_local() if isinstance(p, DTensor) else p for p in (stored[k] for k in self.params._keys)]

    def _param(self, key: str, local: torch.Tensor | None = None) -> DTensor:
        """The parameter ``key`` as the graph reads it: a ``(Replicate, tp)`` DTensor (a hook for
        wrappers such as FSDP's). ``local``: its local shard to read instead (:meth:`lower`)."""
        if local is None and key not in self._local:
            return self._cast(self.params[key])
        tp_p, shape, stride = self._meta[key]
        t = self._cast(self.params[key] if local is None else local)
        return _AsDTensor.apply(t, self.mesh, tp_p, shape, stride)

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in the compute dtype (mixed precision: a differentiable copy, whose gradient
        comes back in the parameter's dtype)."""
        dtype = self.compute_dtype
        return t if dtype is None or not t.is_floating_point() or t.dtype == dtype else t.to(dtype)

    def full_param(self, key: str) -> torch.Tensor:
        """Parameter ``key`` as one full tensor (a collective over the mesh)."""
        return self._as_dtensor(key, self.params[key].detach()).full_tensor()

    def full_grad(self, key: str) -> torch.Tensor | None:
        """The (synchronised) gradient of ``key`` as one full tensor, or None."""
        g = self.params[key].grad
        return None if g is None else self._as_dtensor(key, g).full_tensor()

    def set_full_grad(self, key: str, full: torch.Tensor) -> None:
        """Set the gradient of ``key`` from a full tensor (identical on every rank)."""
        p = self.params[key]
        if not isinstance(p, DTensor):  # a local shard (FSDP's sharded parameters are DTensors)
            tp_p = self._meta[key][0]
            d = DTensor.from_local(full, self.mesh, [R, R], run_check=False).redistribute(self.mesh, (R, tp_p))
            p.grad = d.to_local().clone()
        else:
            # redistribute (not distribute_tensor): FSDP shards may be _StridedShard
            d = DTensor.from_local(full, p.device_mesh, [R] * p.device_mesh.ndim, run_check=False)
            p.grad = d.redistribute(p.device_mesh, p.placements)

    def _as_dtensor(self, key: str, t: torch.Tensor) -> DTensor:
        if isinstance(t, DTensor):
            return t
        tp_p, shape, stride = self._meta[key]
        return DTensor.from_local(t, self.mesh, (R, tp_p), run_check=False, shape=shape, stride=stride)

    def _run(self, n: fx.Node, env: dict, moved: dict):
        want_in, want_out = self._plan[n.name]
        targs = _tensor_args(n)
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
                moved[key] = _to_partial(v, self.mesh) if isinstance(want[a], Partial) else \
                    v.redistribute(self.mesh, dst)
            return moved[key]

        args = fx.node.map_aggregate(n.args, load)
        kwargs = fx.node.map_aggregate(n.kwargs, load)
        if kwargs:
            kwargs = _kwargs_follow_dp(args, kwargs, self.mesh)
        if vocab_parallel.runs(n, tuple(want_in), args):  # class-sharded, or a mean over split rows
            out = vocab_parallel.run(n, args, kwargs, axis=1)
        else:
            out = n.target(*args, **kwargs)
        got = [o.placements[1] if isinstance(o, DTensor) else None
               for o in (out if isinstance(out, (tuple, list)) else [out])]
        for g, w in zip(got, want_out):
            if g is not None and w is not None and g != w:
                self.mismatches.add(f"{n.name}: planned {pstr(w)}, DTensor gave {pstr(g)}")
        if self.mesh.size(1) > 1 and torch.is_grad_enabled():
            if isinstance(out, DTensor):
                out = _sum_grad_here(out)
            elif isinstance(out, (tuple, list)):
                out = type(out)(_sum_grad_here(o) if isinstance(o, DTensor) else o for o in out)
        return out

    # -- gradients ----------------------------------------------------------------------------

    @torch.no_grad()
    def sync_grads(self) -> None:
        """All-reduce (sum) each grad to its parameter's storage layout: over dp (batch-sharded
        readers leave it ``Partial``) and over tp where sequence parallelism left it ``Partial``.
        Local parameters (:meth:`localize`) are summed over dp in buckets."""
        from galvatron_fx.runtime.buckets import all_reduce_coalesced

        local = [p.grad for k, p in self.params.items() if k in self._local and p.grad is not None]
        if local and self.mesh.size(0) > 1:
            all_reduce_coalesced(local, self.mesh.get_group("dp"))
        for k, p in self.params.items():
            if k not in self._local and p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
