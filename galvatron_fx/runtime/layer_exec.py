"""LayerExecutor — run one planned layer with DTensor, exactly as its intra-layer plan says.

Contract: takes a :class:`~galvatron_fx.search.intra_layer.DecomposedLayer` traced at the
*runtime* micro-batch shape (view/reshape arguments are global shapes, and DTensor ops take
global shapes), the :class:`~galvatron_fx.search.intra_layer.LayerOption` solved for it (one
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
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_flatten, tree_map

from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.search.intra_layer import DecomposedLayer, LayerOption, decompose_layer, parse_placement, pstr

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


def _storage(p: Placement) -> Placement:
    """A parameter is never stored partial: a planned ``P`` is stored replicated."""
    return R if isinstance(p, Partial) else p


def _to_partial(v: DTensor, mesh: DeviceMesh) -> DTensor:
    """``(dp, R | S(d)) -> (dp, P)`` on the tp axis: a local step (DTensor's ``redistribute``
    refuses targets that are ``Partial``). Rank 0 of the tp group keeps a replicated value, the
    others hold zeros; a shard is zero-padded to its full extent. Backward: a replicated input
    receives a partial gradient, a sharded input the slice of the (tp-replicated) gradient; the
    gradient's dp placement is passed through as it comes (a dp-``Partial`` grad stays partial,
    so FSDP can reduce-scatter it and DDP all-reduces it once, in ``sync_grads``)."""
    return _ToPartial.apply(v, mesh)


class _ToPartial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: DTensor, mesh: DeviceMesh) -> DTensor:
        dp_p, tp_p = v.placements
        coord = mesh.get_local_rank("tp")
        tp = mesh.size(1)
        local = v._local_tensor
        ctx.mesh, ctx.tp_p, ctx.coord, ctx.shape, ctx.stride = mesh, tp_p, coord, v.shape, v.stride()
        if isinstance(tp_p, Replicate):
            local = local if coord == 0 else torch.zeros_like(local)
        else:
            assert isinstance(tp_p, Shard), f"cannot make {v.placements} partial"
            d = tp_p.dim
            # (dp, tp) order: tp splits the dp-local block, so the padded extent is the dp-local one
            chunk = local.shape[d]
            dp_extent = v.shape[d] // mesh.size(0) if isinstance(dp_p, Shard) and dp_p.dim == d else v.shape[d]
            assert chunk * tp == dp_extent, f"uneven tp shard of dim {d}: {tuple(v.shape)} on {v.placements}"
            pad = [0, 0] * (local.ndim - 1 - d) + [coord * chunk, (tp - 1 - coord) * chunk]
            local = torch.nn.functional.pad(local, pad)
            ctx.chunk = chunk
        return DTensor.from_local(local, mesh, (dp_p, Partial()), run_check=False, shape=v.shape, stride=v.stride())

    @staticmethod
    def backward(ctx, g: DTensor):
        mesh, tp_p, coord = ctx.mesh, ctx.tp_p, ctx.coord
        g_dp = g.placements[0]
        if not isinstance(g.placements[1], Replicate):
            g = g.redistribute(mesh, (g_dp, R))
        local = g._local_tensor
        if isinstance(tp_p, Replicate):
            local, tp_g = (local if coord == 0 else torch.zeros_like(local)), Partial()
        else:
            local, tp_g = local.narrow(tp_p.dim, coord * ctx.chunk, ctx.chunk), tp_p
        grad = DTensor.from_local(local.contiguous(), mesh, (g_dp, tp_g), run_check=False,
                                  shape=ctx.shape, stride=ctx.stride)
        return grad, None


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

    def forward(self, *xs: DTensor):
        assert len(xs) == len(self._inputs), f"expected {len(self._inputs)} inputs, got {len(xs)}"
        env: dict[fx.Node, object] = {}
        moved: dict[tuple[str, tuple], DTensor] = {}  # one redistribute per (value, layout)
        given = dict(zip((ph for ph, _ in self._inputs), xs))
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = self._param(self._param_of[n.name]) if n.name in self._param_of else given[n]
            elif n.op == "call_function":
                if n.target in _IGNORED:
                    env[n] = None
                elif n.target is operator.getitem:
                    src, idx = n.args
                    env[n] = env[src][idx]
                else:
                    env[n] = self._run(n, env, moved)
            elif n.op == "get_attr":
                env[n] = distribute_tensor(getattr(self.gm, n.target), self.mesh, [R, R])
            elif n.op == "output":
                return tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, n.args[0])
        raise AssertionError("decomposed graph without output")

    def _param(self, key: str) -> torch.Tensor:
        """The parameter ``key`` as the graph reads it (a hook for wrappers such as FSDP's)."""
        return self.params[key]

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
            if tuple(v.placements) == dst:
                return v
            key = (a.name, dst)
            if key not in moved:
                moved[key] = _to_partial(v, self.mesh) if isinstance(want[a], Partial) else \
                    v.redistribute(self.mesh, dst)
            return moved[key]

        args = fx.node.map_aggregate(n.args, load)
        kwargs = fx.node.map_aggregate(n.kwargs, load)
        out = n.target(*args, **kwargs)
        got = [o.placements[1] if isinstance(o, DTensor) else None
               for o in (out if isinstance(out, (tuple, list)) else [out])]
        for g, w in zip(got, want_out):
            if g is not None and w is not None and g != w:
                self.mismatches.add(f"{n.name}: planned {pstr(w)}, DTensor gave {pstr(g)}")
        return out

    # -- gradients ----------------------------------------------------------------------------

    @torch.no_grad()
    def sync_grads(self) -> None:
        """All-reduce (sum) each grad to its parameter's storage layout: over dp (batch-sharded
        readers leave it ``Partial``) and over tp where sequence parallelism left it ``Partial``."""
        for p in self.params.values():
            if p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)

    def named_fqn_parameters(self):
        """``(fqn, parameter)`` pairs, in the user's names."""
        for key, p in self.params.items():
            yield self.fqn_of_key[key], p
