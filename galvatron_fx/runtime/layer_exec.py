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


def _sum_grad_here(x: DTensor) -> DTensor:
    """``x``, whose gradient is summed over tp where ``x`` is made (see :class:`_GradInLayout`)."""
    if not x.requires_grad or x.placements[1].is_partial():
        return x
    return _GradInLayout.apply(x)


class _GradInLayout(torch.autograd.Function):
    """Identity on a layer's value; its gradient, when it arrives partial over tp, is brought to
    the value's own tp placement: the partial sums of a value's gradient are reduced once, where
    the value is made (Megatron's rule, and what the intra-layer ILP charges). Left alone, DTensor
    carries a partial gradient on through the backward kernels before it, which costs more
    collectives (a reduce-scatter and later gathers, and an all-reduce per replicated weight such
    as a norm's)."""

    @staticmethod
    def forward(ctx, x: DTensor) -> DTensor:
        ctx.mesh, ctx.tp = x.device_mesh, x.placements[1]
        return DTensor.from_local(x._local_tensor, x.device_mesh, x.placements, run_check=False,
                                  shape=x.shape, stride=x.stride())

    @staticmethod
    def backward(ctx, g: DTensor) -> DTensor:
        if isinstance(g, DTensor) and g.placements[1].is_partial():
            g = g.redistribute(ctx.mesh, (g.placements[0], ctx.tp))
        return g


class _AsDTensor(torch.autograd.Function):
    """A local parameter shard read as its ``(Replicate, tp_p)`` DTensor. Backward returns a
    plain local gradient in the storage layout whose *sum over dp* is the gradient: the tp
    placement is redistributed to ``tp_p`` (a tp-``Partial`` grad under sequence parallelism is
    all-reduced over tp here), and a dp-``Replicate`` or ``Partial(avg)`` grad is divided by dp
    so that one all-reduce (sum) over dp finishes it."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, mesh: DeviceMesh, tp_p: Placement, shape, stride) -> DTensor:
        ctx.mesh, ctx.tp_p = mesh, tp_p
        return DTensor.from_local(local, mesh, (R, tp_p), run_check=False, shape=shape, stride=stride)

    @staticmethod
    def backward(ctx, g: DTensor):
        dp_p, tp_g = g.placements
        if tp_g != ctx.tp_p:
            g = g.redistribute(ctx.mesh, (dp_p, ctx.tp_p))
        local = g._local_tensor
        if isinstance(dp_p, Replicate) or (isinstance(dp_p, Partial) and dp_p.reduce_op == "avg"):
            local = local / ctx.mesh.size(0)
        return local, None, None, None, None


def _recompiled(gm: fx.GraphModule, changed: int) -> int:
    """Lint and regenerate ``gm``'s code after ``changed`` edits (none: nothing to do)."""
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def drop_unused_ops(gm: fx.GraphModule) -> int:
    """Remove ATen ops whose results nothing reads; returns how many.

    fx's own dead-code elimination keeps ops tagged ``nondeterministic_seeded``, and AOTAutograd's
    backward graph can hold such a leftover: the CPU flash-attention forward (its dropout makes it
    "seeded" even at ``dropout_p=0``), recomputed and discarded in every attention layer's
    backward. Mutating ops and collectives are kept."""
    removed = 0
    for n in reversed(list(gm.graph.nodes)):
        t = n.target
        if n.op != "call_function" or n.users or not isinstance(t, torch._ops.OpOverload):
            continue
        if t._schema.is_mutable or t.namespace in ("_c10d_functional", "c10d_functional", "_dtensor"):
            continue
        gm.graph.erase_node(n)
        removed += 1
    return _recompiled(gm, removed)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def drop_identity_views(gm: fx.GraphModule) -> int:
    """Replace views to a tensor's own shape and strides (AOTAutograd's graphs hold one per
    parameter and layer boundary, each a dispatched op at run time), and double transposes, by
    their input; returns how many. The graphs are functional (no op mutates a view), so the alias
    is safe. Run :func:`drop_unused_ops` after it."""
    removed = 0
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is aten.t.default and isinstance(n.args[0], fx.Node) \
                and n.args[0].op == "call_function" and n.args[0].target is aten.t.default:
            n.replace_all_uses_with(n.args[0].args[0])  # t(t(x)) is x (a weight gradient's double transpose)
            gm.graph.erase_node(n)
            removed += 1
            continue
        if n.op != "call_function" or n.target not in _VIEWS or not isinstance(n.args[0], fx.Node):
            continue
        src, out = n.args[0].meta.get("val"), n.meta.get("val")
        if isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.shape == out.shape \
                and src.stride() == out.stride() and src.dtype == out.dtype:
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
            removed += 1
    return _recompiled(gm, removed)


def graph_callable(gm: fx.GraphModule):
    """``gm``'s forward as a plain Python function that calls each ATen overload's C++ entry
    point (``OpOverload._op``) directly, bound as a global; ``gm.forward`` as it is when the
    graph holds anything but placeholders, ``call_function`` nodes and the output.

    fx's generated code looks up ``torch.ops.<ns>.<op>.<overload>`` and goes through
    ``OpOverload.__call__`` per op: about 1 µs of Python each, and a layer's graphs dispatch
    100-odd small ops per step. Values are dropped after their last use, as fx's code does, so
    that the backward frees activations as it goes."""
    nodes = list(gm.graph.nodes)
    if any(n.op not in ("placeholder", "call_function", "output") for n in nodes):
        return gm.forward
    last_use: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            last_use[a] = n
    dead_after: dict[fx.Node, list[fx.Node]] = {}
    for a, n in last_use.items():
        dead_after.setdefault(n, []).append(a)
    glob: dict[str, object] = {}

    def bind(v, hint: str = "const") -> str:
        name = f"_{hint}_{len(glob)}"
        glob[name] = v
        return name

    def arg(a) -> str:
        if isinstance(a, fx.Node):
            return a.name  # fx keeps node names unique identifiers
        if isinstance(a, (list, tuple)):
            items = "".join(f"{arg(x)}, " for x in a)
            return f"[{items}]" if isinstance(a, list) else f"({items})"
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        return bind(a)  # floats (inf, nan), dtypes, devices, layouts, memory formats

    params, body = [], []
    for n in nodes:
        if n.op == "placeholder":
            params.append(n.name)
            continue
        if n.op == "output":
            body.append(f"return {arg(n.args[0])}")
            break
        call_args = [arg(a) for a in n.args] + [f"{k}={arg(v)}" for k, v in n.kwargs.items()]
        if n.target is operator.getitem and not n.kwargs:
            body.append(f"{n.name} = {call_args[0]}[{call_args[1]}]")
        else:
            if isinstance(n.target, torch._ops.OpOverload):
                fn, hint = n.target._op, n.target._opname
            else:
                fn, hint = n.target, "fn"
            body.append(f"{n.name} = {bind(fn, hint)}({', '.join(call_args)})")
        dead = [a.name for a in dead_after.get(n, ())] + ([n.name] if not n.users else [])
        if dead:
            body.append(f"del {', '.join(dead)}")
    src = f"def graph_fn({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    code = compile(src, f"<galvatron_fx graph {id(gm):x}>", "exec")
    exec(code, glob)  # noqa: S102 - source generated above from the graph's own nodes
    fn = glob["graph_fn"]
    fn.source = src  # for inspection
    return fn


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT}
HOIST_MAX_BYTES = 64 * 2**10  # larger saved tensors are not held reduced from forward to backward


def hoist_saved_all_reduces(bw: fx.GraphModule, num_saved: int) -> list[tuple[int, object, str]]:
    """Take out of ``bw`` (a backward graph whose first ``num_saved`` placeholders are tensors
    its forward saved) every functional all-reduce of a small saved tensor that only the
    all-reduce reads; its wait's readers read the placeholder instead. Returns ``(saved index,
    reduce op, group name)`` per all-reduce taken out: :class:`_RunGraphs` launches them
    asynchronously as soon as the forward made the tensor, and waits at the start of backward.

    Such a collective depends on forward values only, yet in the backward graph it blocks: each
    rank waits there for the slowest (DTensor's ``nll_loss_backward`` sums the loss's
    ``total_weight`` over dp this way, once per step). Launched from forward, it runs while the
    forward goes on, and backward waits only for what is not done yet. Every rank runs the same
    forward, so the collectives keep one order."""
    saved = [n for n in bw.graph.nodes if n.op == "placeholder"][:num_saved]
    index = {n: i for i, n in enumerate(saved)}
    hoisted = []
    for n in list(bw.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops._c10d_functional.all_reduce.default:
            continue
        src, op, group = n.args[:3]
        val = src.meta.get("val") if isinstance(src, fx.Node) else None
        if src not in index or len(src.users) != 1 or op not in _REDUCE_OPS or len(n.users) != 1 \
                or not isinstance(val, torch.Tensor) or val.numel() * val.element_size() > HOIST_MAX_BYTES:
            continue
        (wait,) = n.users
        if wait.target is not torch.ops._c10d_functional.wait_tensor.default:
            continue
        wait.replace_all_uses_with(src)
        bw.graph.erase_node(wait)
        bw.graph.erase_node(n)
        hoisted.append((index[src], _REDUCE_OPS[op], group))
    _recompiled(bw, len(hoisted))
    return hoisted


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


class _GraphPair:
    """A layer's traced forward and backward graphs and how to call them: the forward returns
    the user outputs then the tensors saved for backward; the backward takes the saved tensors,
    then one gradient per output that requires grad, and returns one gradient per input.
    ``hoisted``: saved tensors all-reduced from forward to backward (:func:`hoist_saved_all_reduces`)."""

    def __init__(self, fw: fx.GraphModule, bw: fx.GraphModule, num_outputs: int, out_grad: list[bool]):
        bw = fx.GraphModule(bw, copy.deepcopy(bw.graph))  # AOTAutograd's runtime keeps the original
        num_saved = sum(1 for n in bw.graph.nodes if n.op == "placeholder") - sum(out_grad)
        self.hoisted = [(i, op, _resolve_process_group(g)) for i, op, g in hoist_saved_all_reduces(bw, num_saved)]
        self.fw, self.bw = graph_callable(fw), graph_callable(bw)
        self.num_outputs = num_outputs
        self.out_grad = out_grad
        self.any_constant = not all(out_grad)

    @classmethod
    def make(cls, fw: fx.GraphModule, bw: fx.GraphModule, out_grad: list[bool]) -> _GraphPair | None:
        """The pair, or None when the graphs do not have that simple form (input mutations,
        outputs AOTAutograd regenerates, saved symbolic sizes): AOTAutograd's own runtime, which
        handles every case, keeps running them."""
        (fw_out,) = [n for n in fw.graph.nodes if n.op == "output"]
        returned = len(fw_out.args[0])
        ph = [n for n in bw.graph.nodes if n.op == "placeholder"]
        tangents = [n for n in ph if n.name.startswith("tangents")]
        saved = ph[:len(ph) - len(tangents)]
        simple = (ph[len(saved):] == tangents
                  and all(isinstance(n.meta.get("val"), torch.Tensor) for n in saved)
                  and returned - len(saved) == len(out_grad)
                  and len(tangents) == sum(out_grad))
        if not simple:
            log.debug("lowered layer keeps AOTAutograd's runtime: %d returned, %d saved, %d tangents, %d outputs",
                      returned, len(saved), len(tangents), len(out_grad))
            return None
        return cls(fw, bw, len(out_grad), out_grad)


class _RunGraphs(torch.autograd.Function):
    """A :class:`_GraphPair` as one autograd node, with none of AOTAutograd's runtime wrappers
    (about 0.8 ms of Python per layer and backward on a CPU, more than the layer's small ops)."""

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
        return super(torch.autograd.Function, cls).apply(graphs, *args)

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
        # the backward graph was traced with contiguous gradients (as AOTAutograd's runtime makes them)
        tangents = [g.contiguous() for g, req in zip(grads, graphs.out_grad) if req]
        return (None, *graphs.bw(*saved, *tangents))


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

    def __init__(self, ex: LayerExecutor):
        from functorch.compile import aot_function, make_boxed_func

        self.mesh = ex.mesh
        self.in_specs: list | None = None   # (placements, shape, stride) per input
        self.out_specs: list | None = None  # per flat output: (placements, shape, stride) | None
        self.out_tree = None
        self.out_consts: dict[int, object] = {}  # flat output index -> a non-tensor output
        keys = list(ex.params)
        n = len(keys)

        def traced(*flat):
            xs = [DTensor.from_local(x, self.mesh, pl, run_check=False, shape=sh, stride=st)
                  for x, (pl, sh, st) in zip(flat[n:], self.in_specs)]
            outs = ex._interpret(xs, dict(zip(keys, flat[:n])))
            leaves, self.out_tree = tree_flatten(outs)
            self.out_specs, self.out_consts, ret = [], {}, []
            for i, o in enumerate(leaves):
                if isinstance(o, DTensor):
                    self.out_specs.append((tuple(o.placements), o.shape, o.stride()))
                    ret.append(o.to_local())
                elif isinstance(o, torch.Tensor):
                    self.out_specs.append(None)
                    ret.append(o)
                else:
                    self.out_consts[i] = o
            return tuple(ret)

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
        self.fn = {True: aot_function(traced, compiler("fw"), compiler("bw")),
                   False: aot_function(traced, compiler(None), compiler(None))}
        self.graphs: _GraphPair | None = None  # the training graphs, run without AOT's wrappers
        self._out_grad: list[bool] | None = None  # which outputs of a training call require grad

    def __call__(self, ex: LayerExecutor, xs, *, unwrapped: bool = False):
        """Run on ``xs``: DTensors, or plain local tensors already in the recorded layout of
        their position (:class:`LocalValue` handed on by the caller, which checked
        :meth:`accepts`). ``unwrapped``: return DTensor outputs as :class:`LocalValue` (no
        ``from_local``; the next lowered layer takes the local tensor as it is)."""
        specs = [(tuple(x.placements), x.shape, x.stride()) if isinstance(x, DTensor) else None for x in xs]
        if self.in_specs is None:
            if None in specs:
                raise ValueError("a lowered layer's first call takes DTensors (it records their layouts)")
            self.in_specs = specs
        elif any(s is not None and s != want for s, want in zip(specs, self.in_specs)):
            raise ValueError(f"lowered layer called with input layouts {specs}, traced for {self.in_specs}")
        args = (*ex.local_params(), *(x.to_local() if isinstance(x, DTensor) else x for x in xs))
        if not torch.is_grad_enabled():
            flat = self.fn[False](*args)
        elif self.graphs is not None:
            flat = _RunGraphs.run(self.graphs, args)
        else:
            flat = self.fn[True](*args)
            self._out_grad = [t.requires_grad for t in flat]
            if "bw" in self._graphs:  # AOT compiles the backward at the first backward
                self.graphs = _GraphPair.make(self._graphs["fw"], self._graphs["bw"], self._out_grad)
        if unwrapped and not self.out_consts:
            return tuple(flat)  # the layer's outputs, flat (see rewrap)
        it = iter(zip(flat, self.out_specs))
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
