"""``ParallelModule`` — a plan without pipeline stages (``pp == 1``) as a chain of LayerExecutors.

Contract: built from the user's model, its :class:`~galvatron_fx.ir.graph.ModelGraph` captured at
the *per-micro-batch global* shape (``global_batch_size / num_microbatches`` samples) and a
:class:`~galvatron_fx.ir.plan.ParallelPlan` with ``pp == 1``, on every rank of an initialised
process group whose size is the plan's. ``forward(*inputs)`` takes one micro-batch of full
(identical on every rank) user inputs and returns the loss as a plain tensor on every rank;
``train_step`` runs a whole global batch. Parameters are DTensors, or their local tensors (a
tied weight read by two layers is one parameter where both store it alike, else one copy per
layout, kept equal by summing their grads).

Terms: per layer, the *mesh* is ``(dp, tp)`` with ``dp = plan.layers[i].dp``, over the stage's
ranks (one mesh per shape, shared); a *value* is a tensor one layer makes and others read
(named by the captured graph); a *transition* moves a value to the layout the reader wants:
DTensor ``redistribute`` on one mesh, :func:`~galvatron_fx.runtime.reshard.reshard` across meshes.

Layouts: user inputs with a batch dim are ``Shard(0)`` on dp (and as planned on tp); buffers are
replicated; a hidden state keeps its dp placement (``Shard(0)``) and takes the reader's planned tp
placement. A parameter no layer reads (declared in the model, not reached by the traced graph) is
held whole on every rank outside ``parameters()`` (no gradient reaches it), untouched, and kept in
``state_dict()`` and checkpoints like a buffer. The loss layer's mean over the local batch is made
a global mean by dividing the dp-partial gradients' sum (``sync_grads``) — see
:meth:`ParallelModule.forward`.

Options: each executor follows the saved plan: its ``placements`` (node -> ``"in->out"``) are
the ILP's solution for the layer, rebuilt into a ``LayerOption`` without solving again; a tp=1
layer (the plan stores no placements) is all-replicated. If the saved placements do not name the
decomposed nodes (another torch version traced other names), the layer is re-solved and a
warning is logged.

Data parallel flavours, per layer: a DDP layer keeps full replicas over dp and all-reduces
(sums) its gradients once per step (:meth:`LayerExecutor.sync_grads`). A ZeRO-2/ZeRO-3 layer with
``dp > 1`` is wrapped by FSDP2's ``fully_shard`` on its 2-D ``(dp, tp)`` mesh in the SPMD form
(``dp_mesh_dims=DataParallelMeshDims(shard="dp")``): the executor's ``(Replicate, tp)`` DTensor
parameters become ``(Shard(0) | _StridedShard(0), tp)`` shards (dim 0 split over dp, the tp
placement kept), FSDP all-gathers them back to ``(Replicate, tp)`` around the layer's forward
(ZeRO-3: again in backward, ``reshard_after_forward=True``; ZeRO-2 keeps them from forward to
backward) and reduce-scatters the dp-``Partial`` gradients after each backward. Scaling: the
executor's convention is a *sum* over dp of partial grads (the loss's mean already
divided each rank's share), so FSDP's default average is turned off
(``set_gradient_divide_factor(1.0)`` with plain-sum collectives, which gloo supports).
Accumulation: FSDP reduce-scatters once per micro-batch backward and accumulates the sharded
grads (the memory model's ZeRO-2/3: only ``1/dp`` gradients persist); no ``no_sync``.
The optimizer must be built after the ``ParallelModule`` (it sees the sharded parameters).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import DataParallelMeshDims
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement

from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.placements import check_layer_placements
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.recompute import checkpoint_fn
from galvatron_fx.runtime.layer_exec import _IGNORED, LayerExecutor, LocalValue, _tensor_args, wait_in_flight
from galvatron_fx.runtime.buckets import GradBucketer
from galvatron_fx.runtime.guard import StepGuard
from galvatron_fx.runtime.precision import COMPUTE_DTYPES, LossScaler
from galvatron_fx.runtime.reshard import reshard
from galvatron_fx.search.intra_layer import DecomposedLayer, LayerOption, decompose_layer

log = logging.getLogger(__name__)

__all__ = ["ParallelModule", "device_type", "option_from_plan"]

R = Replicate()

# A lowered layer's outputs are its graph's local tensors, often views; FSDP warns that an in-place
# op on one would skip its pre-backward hook. The runtime never writes to a layer's output.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
_MESHES: dict[tuple, DeviceMesh] = {}  # (world group, ranks, dp, tp) -> mesh, see ParallelModule.mesh


def device_type() -> str:
    """The meshes' device type: ``cuda`` under NCCL with GPUs, else ``cpu`` (gloo)."""
    return "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"


def _calls(dl: DecomposedLayer) -> list[fx.Node]:
    return [n for n in dl.gm.graph.nodes if n.op == "call_function" and n.target not in _IGNORED
            and n.target is not operator.getitem]


def option_from_plan(dl: DecomposedLayer, kind: str, strategy, placements: dict[str, str]) -> LayerOption | None:
    """The :class:`LayerOption` the executor needs, rebuilt from a plan's saved placements; an
    all-replicated one at tp=1; None when the saved placements do not cover the decomposed nodes."""
    tp = strategy.tp
    needed = [ph.name for ph in dl.inputs] + [n.name for n in _calls(dl)]
    if tp == 1 and not placements:
        placements = {ph.name: "->R" for ph in dl.inputs}
        placements |= {n.name: ",".join("R" for _ in _tensor_args(n)) + "->R" for n in _calls(dl)}
    if any(n not in placements for n in needed):
        return None
    return LayerOption(kind=kind, tp=tp, sp=strategy.sp, placements=dict(placements), compute_s=0.0,
                       compute_ratio=1.0 / tp, comm_fwd_s=0.0, comm_bwd_s=0.0, param_fraction=1.0,
                       activation_fraction=1.0, comm=(), input_layout=(), output_layout=(),
                       objective_s=0.0, solve_s=0.0, num_variables=0)


class _DpPartialGrad(torch.autograd.Function):
    """Identity on a ``(Replicate, tp)`` parameter whose backward hands FSDP a gradient that is a
    *sum* over dp: a dp-``Replicate`` grad (a parameter read through a dp-replicated value, such
    as positions from ``arange``) holds the full gradient on every rank, so its reduce-scatter
    (sum) would count it dp times; it is made ``Partial`` by dividing the local copy by dp. A
    ``Partial(avg)`` grad likewise becomes ``Partial(sum)``."""

    @staticmethod
    def forward(ctx, p: DTensor) -> DTensor:
        ctx.mesh = p.device_mesh
        return DTensor.from_local(p._local_tensor, p.device_mesh, p.placements, run_check=False,
                                  shape=p.shape, stride=p.stride())

    @staticmethod
    def backward(ctx, g: DTensor) -> DTensor:
        dp_p, rest = g.placements[0], tuple(g.placements[1:])
        if isinstance(dp_p, Replicate) or (isinstance(dp_p, Partial) and dp_p.reduce_op == "avg"):
            g = DTensor.from_local(g._local_tensor / ctx.mesh.size(0), ctx.mesh, (Partial(),) + rest,
                                   run_check=False, shape=g.shape, stride=g.stride())
        return g


class _Executor(LayerExecutor):
    """A :class:`LayerExecutor` whose factory ops (``arange`` of positions, ``full`` of a mask),
    which make plain tensors from no DTensor input, yield replicated DTensors, so that later ops
    do not mix plain tensors and DTensors. Under FSDP (``fsdp``), parameters are read through
    :class:`_DpPartialGrad` so that every gradient reaches FSDP's reduce-scatter dp-partial."""

    fsdp = False

    def _param(self, key, local=None):
        p = super()._param(key, local)
        # FSDP's DTensor parameters (a lowered trace reads local shards; a plain gathered
        # parameter is read as a local one, whose gradient is already a dp sum)
        if local is None and self.fsdp and key not in self._local and p.requires_grad:
            p = _DpPartialGrad.apply(p)
        return p

    def _run(self, n, env, moved):
        out = super()._run(n, env, moved)
        if isinstance(out, torch.Tensor) and not isinstance(out, DTensor):
            out = DTensor.from_local(out, self.mesh, [R, R], run_check=False)
        return out


def _local_and_layout(v) -> tuple[torch.Tensor, tuple[DeviceMesh, tuple] | None]:
    """A layer output as its local tensor and ``(mesh, placements)`` (None for a plain tensor)."""
    if isinstance(v, LocalValue):
        return v.local, (v.mesh, tuple(v.placements))
    if isinstance(v, DTensor):
        return v.to_local(), (v.device_mesh, tuple(v.placements))
    return v, None


def _unused_params(model: nn.Module, mg: ModelGraph) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The parameters of the user's ``model`` that no layer of ``mg`` reads (declared but not
    reached by the traced graph), as whole copies by FQN (a tied one's first name), and their
    other names -> FQN. Every layer counts, not only this module's (a pipeline chunk's)."""
    read = {fqn for layer in mg.layers for fqn in layer.param_names}
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        tensors[id(p)] = p
    full: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for key, ns in names.items():
        if read.isdisjoint(ns):
            full[ns[0]] = tensors[key].detach().clone()
            aliases |= {n: ns[0] for n in ns[1:]}
    return full, aliases


class _FSDPRoot(nn.Module):
    """The FSDP root of a :class:`ParallelModule`'s sharded layers (see ``_fsdp_root``)."""

    def __init__(self, units: list[nn.Module]):
        super().__init__()
        self.units = nn.ModuleList(units)

    def forward(self) -> None:
        return None


class ParallelModule(nn.Module):
    """The planned model on this rank: one :class:`LayerExecutor` per layer (see module doc)."""

    def __init__(self, model: nn.Module, mg: ModelGraph, plan: ParallelPlan, *, cost_model=None,
                 lower: bool = True, layers: Sequence[int] | None = None,
                 meshes: dict[tuple[int, int], DeviceMesh] | None = None):
        """``layers``/``meshes``: build only these layers (a pipeline chunk) on the given ``(dp,
        tp)`` meshes over their stage's ranks (:class:`~galvatron_fx.runtime.pipeline.PipelineModule`
        does); by default every layer of a ``pp == 1`` plan on meshes over all ranks."""
        super().__init__()
        if plan.pp != 1 and layers is None:
            raise PlanError(f"ParallelModule runs plans without pipeline stages; this plan has pp={plan.pp}: "
                            "build it with galvatron_fx.compile(), which runs pipelined plans")
        if len(plan.layers) != len(mg.layers) or any(lp.name != l.name for lp, l in zip(plan.layers, mg.layers)):
            raise PlanError(f"plan {plan.model!r} names other layers than the captured model: "
                            f"{[lp.name for lp in plan.layers][:6]} vs {[l.name for l in mg.layers][:6]}; re-plan")
        self.plan = plan
        self.mg = mg
        self.compute_dtype = COMPUTE_DTYPES[plan.precision]
        self.scaler = LossScaler() if plan.precision == "fp16" else None
        self.guard = StepGuard()
        self.layer_ids = list(range(len(mg.layers)) if layers is None else layers)
        self._ranks = tuple(plan.stage_ranks[plan.layers[self.layer_ids[0]].stage])
        self._meshes: dict[tuple[int, int], DeviceMesh] = dict(meshes or {})
        self.executors = nn.ModuleList()
        self._ckpt = []
        self.option_source: list[str] = []  # "plan" | "tp1" | "re-solved", per layer
        named = dict(model.named_buffers())
        self._buffers_full = {fqn: b.detach().clone() for fqn, b in named.items()}
        self._unused_full, self._unused_aliases = _unused_params(model, mg)
        # tensors the graph reads besides parameters: buffers and lifted constants (not state)
        self._constants = {fqn: t.detach().clone() for fqn, t in mg.constants.items()}
        self._node_fqn = {node: p.name for p in mg.params.values() for node in p.nodes}
        self._is_buffer = {node for p in mg.params.values() if p.is_buffer for node in p.nodes}
        decomposed: dict[str, DecomposedLayer] = {}
        traced: dict[tuple, LayerExecutor] = {}
        # the last layer holding parameters: its backward starts right after its forward
        last_with_params = max((i for i in self.layer_ids if mg.layers[i].param_names), default=-1)
        for i in self.layer_ids:
            layer, lp = mg.layers[i], plan.layers[i]
            st = lp.strategy
            mesh = self.mesh(lp.dp, st.tp)
            if layer.kind not in decomposed:
                decomposed[layer.kind] = decompose_layer(mg, layer)
            # layers of one kind share the traced graph; only the names of their inputs differ
            dl = dataclasses.replace(decomposed[layer.kind], input_names=[a.name for a in mg.layer_inputs(layer)])
            check_layer_placements(lp.name, lp.placements, dl.gm)  # S(d) within each tensor's rank
            option = option_from_plan(dl, layer.kind, st, lp.placements)
            self.option_source.append("plan" if lp.placements else "tp1")
            if option is None:
                log.warning("layer %s: the plan's placements do not name this torch's decomposed nodes; "
                            "re-solving its intra-layer ILP", layer.name)
                option = self._resolve(layer, dl, st, cost_model)
                self.option_source[-1] = "re-solved"
            ex = _Executor.from_model(mg, layer, option, mesh, model, decomposed=dl)
            ex.compute_dtype = self.compute_dtype if self.compute_dtype != torch.float32 else None
            input_name_of = {ph.name: n for ph, n in zip(dl.inputs, dl.input_names)}
            # per forward input: the value it reads and the tp placement the plan wants
            ex.feeds = [(input_name_of[ph.name], pl[1]) for (ph, _), pl in zip(ex._inputs, ex.input_placements())]
            ex.layer_outputs = list(layer.output_names)
            self.executors.append(ex)
        self._shard_all(last_with_params)
        for ex in self.executors:
            if not ex.fsdp:
                ex.localize()
        self._share_tied()
        for i, ex in zip(self.layer_ids, self.executors):
            layer, lp = mg.layers[i], plan.layers[i]
            st = lp.strategy
            if lower and st.recompute != "selective":
                # one trace per (kind, placements, mesh, storage); selective recompute keeps the
                # interpreter, whose per-op dispatch the selective policy needs
                key = (layer.kind, tuple(sorted(ex.option.placements.items())), (lp.dp, st.tp), ex.fsdp)
                ex.lower(share_with=traced.setdefault(key, ex))
            wrap = checkpoint_fn(st.recompute)
            run = functools.partial(ex, unwrapped=True)
            self._ckpt.append(wrap(run) if wrap is not None else run)
        self._tied = self._tied_groups()  # after sharding: FSDP replaced the parameters
        self._dtensor_params = [(ex, k) for ex in self.executors for k in ex.params if k not in ex._local]
        self._bucketers = self._grad_bucketers()
        self.num_microbatches = plan.num_microbatches

    # ---- meshes and options -------------------------------------------------------------------
    def mesh(self, dp: int, tp: int) -> DeviceMesh:
        """The ``(dp, tp)`` mesh over the stage's ranks (one per shape, shared by every module of
        this process and process group: new meshes would make new process groups, and DTensor's
        spec cache may hand back an earlier, equal mesh object anyway)."""
        if (dp, tp) not in self._meshes:
            if dp * tp != len(self._ranks):
                raise PlanError(f"a layer's dp={dp} × tp={tp} does not cover the stage's {len(self._ranks)} ranks")
            key = (id(dist.group.WORLD), self._ranks, dp, tp)
            if key not in _MESHES:
                device = device_type()
                if self._ranks == tuple(range(dist.get_world_size())):
                    _MESHES[key] = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
                else:
                    _MESHES[key] = DeviceMesh(device, torch.tensor(self._ranks).view(dp, tp),
                                              mesh_dim_names=("dp", "tp"))
            self._meshes[(dp, tp)] = _MESHES[key]
        return self._meshes[(dp, tp)]

    def _shard_all(self, last_with_params: int) -> None:
        """ZeRO-2/3 (``dp > 1``): FSDP2 over each layer's dp axis, summing (not averaging) grads.

        A *unit* is what one ``fully_shard`` call covers: one layer, or the layers that read one
        tied weight when all are sharded alike (same mesh, same stored layout of the weight, ZeRO
        on each); those share a single parameter (its gradient sums both uses in autograd) and
        gather it once, as FSDP's root does for a model's embedding and head. ZeRO-3 reshards after
        forward, except the unit of the last layer with parameters, whose backward follows at once
        (FSDP2's own advice; the memory model charges a gathered layer anyway). Every unit then
        joins one FSDP root without parameters (:meth:`_fsdp_root`), so that they share FSDP's
        context: a gather is prefetched during the backward of the unit after it."""
        layers = dict(zip(self.layer_ids, self.executors))
        dp_type = {i: str(self.plan.layers[i].strategy.dp_type) for i in self.layer_ids}
        for i, ex in layers.items():
            ex.fsdp = dp_type[i] in ("zero2", "zero3") and self.plan.layers[i].dp > 1 and \
                any(True for _ in ex.parameters())
        # units: union of FSDP layers sharing a tied weight stored alike on the same mesh
        unit = {i: i for i, ex in layers.items() if ex.fsdp}

        def find(i):
            while unit[i] != i:
                i = unit[i]
            return i

        owner: dict[str, tuple[int, str]] = {}  # fqn -> (first layer, key)
        for i, ex in layers.items():
            if not ex.fsdp:
                continue
            for key, fqn in ex.fqn_of_key.items():
                if fqn not in owner:
                    owner[fqn] = (i, key)
                    continue
                j, jkey = owner[fqn]
                a, b = layers[j].params[jkey], ex.params[key]
                if layers[j].mesh is ex.mesh and tuple(a.placements) == tuple(b.placements) and a.shape == b.shape:
                    unit[find(i)] = find(j)
                    ex.params[key] = a  # one parameter for both uses
        groups: dict[int, list[int]] = {}
        for i in unit:
            groups.setdefault(find(i), []).append(i)
        for members in groups.values():
            exs = [layers[i] for i in members]
            ex = exs[0]
            # mixed precision: FSDP gathers the parameters in the compute dtype and reduces in fp32
            mp = MixedPrecisionPolicy(param_dtype=ex.compute_dtype, reduce_dtype=torch.float32) \
                if ex.compute_dtype is not None else MixedPrecisionPolicy()
            reshard = all(dp_type[i] == "zero3" for i in members) and last_with_params not in members
            if ex.mesh.size(1) == 1:
                # no tp: plain FSDP over the 1-D dp mesh; its gathered parameters are plain
                # tensors the layer graph reads as they are (no DTensor per parameter and step)
                self._plain_parameters(exs)
                fully_shard(exs if len(exs) > 1 else ex, mesh=ex.mesh["dp"], reshard_after_forward=reshard,
                            mp_policy=mp)
            else:
                # FSDP's SPMD form wants every parameter on the very mesh object it is given
                # (meshes are process-wide, see mesh(), so DTensor's spec cache hands back the same one)
                meshes = {id(p.device_mesh): p.device_mesh for e in exs for p in e.parameters()}
                if len(meshes) != 1 or next(iter(meshes.values())) is not ex.mesh:
                    raise PlanError(f"layer {self.plan.layers[members[0]].name}: its parameters are not all on "
                                    f"the layer's (dp, tp) mesh {ex.mesh} (found {list(meshes.values())}); cannot "
                                    "shard them with FSDP")
                fully_shard(exs if len(exs) > 1 else ex, mesh=ex.mesh, reshard_after_forward=reshard,
                            dp_mesh_dims=DataParallelMeshDims(shard="dp"), mp_policy=mp)
            for e in exs:
                e.set_gradient_divide_factor(1.0)
                e.set_force_sum_reduction_for_comms(True)  # gloo has neither AVG nor PREMUL_SUM
        if groups:
            self._fsdp_root([layers[i] for members in groups.values() for i in members])

    @staticmethod
    def _plain_parameters(exs: list[LayerExecutor]) -> None:
        """The ``(Replicate, Replicate)`` parameters of tp=1 layers as plain tensors (shared ones
        stay shared), read like local ones (``ex._local``) by the layer's graph and interpreter."""
        plain: dict[int, nn.Parameter] = {}
        for ex in exs:
            for key, p in list(ex.params.items()):
                if id(p) not in plain:
                    plain[id(p)] = nn.Parameter(p.detach()._local_tensor, requires_grad=p.requires_grad)
                ex.params[key] = plain[id(p)]
                ex._local.add(key)

    def _fsdp_root(self, units: list[LayerExecutor]) -> None:
        """An FSDP root over ``units`` (no parameters of its own), run once so that FSDP takes
        it as the root: the units then share FSDP's state and communication context (backward
        prefetch, one end-of-backward callback), and a unit of several layers is not taken for a
        root, which FSDP refuses. Each step's first unit to run does the root's per-step work."""
        root = _FSDPRoot(units)
        fully_shard(root, mesh=units[0].mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
        root()
        object.__setattr__(self, "_fsdp_root_module", root)  # not a submodule: no parameters of its own

    def _resolve(self, layer, dl, st, cost_model) -> LayerOption:
        from galvatron_fx.cluster import Cluster
        from galvatron_fx.cost_models import AnalyticCostModel
        from galvatron_fx.search.intra_layer import solve_intra_layer

        cm = cost_model or AnalyticCostModel(Cluster.preset("dgx-a100-80g"))
        return solve_intra_layer(self.mg, layer, st.tp, st.sp, cm, decomposed=dl, shard_params=st.tp > 1)

    def _share_tied(self) -> None:
        """Layers outside FSDP that read one tied weight stored alike (plain local tensors of one
        shape and dtype, the same tp layout, the same mesh) share a single parameter, as the user's
        model does: autograd sums both uses into one gradient, which is reduced once, and the
        optimizer steps it once (FSDP units share theirs in :meth:`_shard_all`)."""
        first: dict[str, tuple[LayerExecutor, str]] = {}
        for ex in self.executors:
            if ex.fsdp:
                continue
            for key, fqn in ex.fqn_of_key.items():
                if key not in ex._local:
                    continue
                if fqn not in first:
                    first[fqn] = (ex, key)
                    continue
                other, okey = first[fqn]
                a, b = other.params[okey], ex.params[key]
                if other.mesh is ex.mesh and other._meta[okey] == ex._meta[key] and a.shape == b.shape \
                        and a.dtype == b.dtype and a.requires_grad == b.requires_grad:
                    ex.params[key] = a

    def _tied_groups(self) -> list[list[tuple[LayerExecutor, str]]]:
        """Per tied FQN, one ``(executor, key)`` per distinct parameter holding it (layers of one
        FSDP unit share theirs), where there are several."""
        by_fqn: dict[str, dict[int, tuple[LayerExecutor, str]]] = {}
        for ex in self.executors:
            for key, fqn in ex.fqn_of_key.items():
                by_fqn.setdefault(fqn, {}).setdefault(id(ex.params[key]), (ex, key))
        return [list(ps.values()) for ps in by_fqn.values() if len(ps) > 1]

    def _grad_bucketers(self) -> dict[tuple[int, int], GradBucketer]:
        """Every plain local parameter of a ``dp > 1`` layer joins its dp group's
        :class:`GradBucketer`, last layer first. Tied copies stored whole (tp ``Replicate``) on
        equal mesh shapes are one bucket entry (summed locally, reduced once; at ``dp == 1`` only
        summed: ``_local_tied``); other tied copies are summed as full tensors (``_slow_tied``)."""
        self._local_tied, self._slow_tied = [], []
        fast: dict[tuple[int, int], list[list[nn.Parameter]]] = {}
        for ps in self._tied:
            whole = all(k in ex._local and not ex.fsdp and isinstance(ex._meta[k][0], Replicate) for ex, k in ps)
            shapes = {(ex.mesh.size(0), ex.mesh.size(1)) for ex, _ in ps}
            if not (whole and len(shapes) == 1):
                self._slow_tied.append(ps)
            elif next(iter(shapes))[0] == 1:
                self._local_tied.append(ps)
            else:
                fast.setdefault(next(iter(shapes)), []).append([ex.params[k] for ex, k in ps])
        in_fast = {id(p) for groups in fast.values() for g in groups for p in g}
        by_group: dict[tuple[int, int], list] = {}
        seen: set[int] = set()
        for ex in self.executors:  # in forward order, then reversed: a parameter shared by layers
            if ex.fsdp or ex.mesh.size(0) == 1:  # (_share_tied) joins where backward finishes it
                continue
            for k, p in ex.params.items():
                if k in ex._local and p.requires_grad and id(p) not in in_fast and id(p) not in seen:
                    seen.add(id(p))
                    by_group.setdefault((ex.mesh.size(0), ex.mesh.size(1)), []).append(p)
        for ps in by_group.values():
            ps.reverse()
        for shape, groups in fast.items():  # ready when the last copy is: at the end of backward
            by_group.setdefault(shape, []).extend(groups)
        return {shape: GradBucketer(es, self.mesh(*shape).get_group("dp")) for shape, es in by_group.items() if es}

    # ---- forward ----------------------------------------------------------------------------
    def _layout_input(self, ex: LayerExecutor, i: int, name: str, tp_p: Placement, env: dict,
                      batched: set[str]) -> DTensor | torch.Tensor:
        """Layer input ``name`` (the executor's input ``i``) laid out for ``ex``: a value of an
        earlier layer keeps its dp placement (a replicated one with a batch dim, such as a mask
        made from factories, is split on dp: a local slice) and takes the planned tp one (a
        transition); a full
        tensor (user input, buffer) is distributed, batch-sharded on dp when it is a batched user
        input. A :class:`LocalValue` already in the layout ``ex``'s lowered graph was traced for
        is passed as its local tensor."""
        mesh = ex.mesh
        tp_p = R if isinstance(tp_p, Partial) else tp_p  # a planned P input is made by the executor
        if name in env:
            v = env[name]
            if isinstance(v, LocalValue):
                if ex.lowered is not None and ex.lowered.accepts(i, v):
                    return v.local
                v = env[name] = v.dtensor()
            if isinstance(v, DTensor):
                dp_p = R if isinstance(v.placements[0], Partial) else v.placements[0]
                if isinstance(dp_p, Replicate) and name in self.mg.batched and mesh.size(0) > 1 \
                        and v.shape[0] % mesh.size(0) == 0:
                    dp_p = Shard(0)  # made whole from factories (a mask, positions): each rank its rows
                return reshard(v, mesh, (dp_p, tp_p))
            full = v
        elif name in self._is_buffer:
            fqn = self._node_fqn[name]
            full = self._buffers_full[fqn] if fqn in self._buffers_full else self._constants[fqn]
        else:
            raise AssertionError(f"layer input {name} is neither a user input, a buffer nor made by an earlier layer")
        if full.is_floating_point() and full.dtype != self.compute_dtype:
            full = full.to(self.compute_dtype)  # mixed precision: float inputs and buffers too
        # every rank holds the same full tensor: each takes its piece, no collective
        dp_p = Shard(0) if name in batched else R
        if ex.lowered is not None and isinstance(tp_p, Replicate) and full.ndim >= 1:
            # the piece straight away, for a graph that takes it (DTensor's even Shard(0) split)
            dp = mesh.size(0)
            local = full if dp_p is R else full.chunk(dp)[mesh.get_local_rank(0)]
            v = LocalValue(local, mesh, (dp_p, tp_p), full.shape, full.stride())
            if (dp_p is R or full.shape[0] % dp == 0) and ex.lowered.accepts(i, v):
                return local
        return distribute_tensor(full, mesh, [dp_p, tp_p], src_data_rank=None)

    def forward(self, *inputs: torch.Tensor, **kwargs) -> torch.Tensor:
        """Loss of one micro-batch (full user inputs, identical on every rank, at the captured
        shape; positional and keyword as the model was captured, or one mapping of names to
        tensors) as a plain tensor, the same on every rank.

        The loss layer's mean over a batch-sharded input comes out ``Partial`` on dp (each
        rank's sum over the global count of targets, :mod:`~galvatron_fx.vocab_parallel`; a
        mean DTensor's own rules make is ``Partial(avg)``); its ``full_tensor()`` is the global
        mean, and backward through it leaves dp-``Partial`` grads whose sum (:meth:`sync_grads`)
        is the gradient of that mean.
        """
        inputs = self.mg.bind_inputs(inputs[0] if len(inputs) == 1 and not kwargs and isinstance(inputs[0], dict)
                                     else inputs, kwargs)
        self._check_inputs(inputs)
        loss = self._loss(inputs)
        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    def forward_all(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The loss of one micro-batch (as :meth:`forward`) and the model's other outputs
        (``ModelGraph.extra_output_names``: a Hugging Face model's logits), each gathered whole on
        every rank, differentiably (the ``torch.compile`` backend hands them back to the user's
        code)."""
        inputs = self.mg.bind_inputs(inputs)
        self._check_inputs(inputs)
        wait_in_flight()
        names = list(self.mg.output_names) + list(self.mg.extra_output_names)
        values = self.run_layers(dict(zip(self.mg.input_names, inputs)), names)
        return tuple(v.full_tensor() if isinstance(v, DTensor) else v for v in values)

    def _check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        names, shapes = self.mg.input_names, [tuple(s) for s in self.mg.example_shapes]
        got = [tuple(x.shape) for x in inputs]
        if len(inputs) != len(names) or (shapes and got != shapes):
            raise ValueError(f"expected inputs ({', '.join(names)}) of shapes {shapes} (one micro-batch of "
                             f"{self.plan.global_batch_size} / {self.plan.num_microbatches} samples), got {got}; "
                             "use train_step for a whole global batch")

    def _loss(self, inputs: Sequence[torch.Tensor], *, wrap: bool = True):
        """The loss of one micro-batch as the last layer leaves it (a DTensor, typically
        ``Partial`` over dp; ``wrap=False``: possibly a :class:`LocalValue`): no collective."""
        wait_in_flight()  # earlier forwards' that had no backward
        (loss,) = self.run_layers(dict(zip(self.mg.input_names, inputs)), self.mg.output_names, wrap=wrap)
        return loss

    def run_layers(self, env: dict[str, object], outputs: Sequence[str], *, wrap: bool = True) -> list:
        """Run this module's layers on ``env`` (value name -> DTensor, or a full tensor for user
        inputs), adding their outputs to it; returns the values named ``outputs`` (DTensors for
        layer outputs; ``wrap=False``: as they travel). Between lowered layers values travel
        unwrapped (:class:`LocalValue`)."""
        batched = {n for n in self.mg.input_names if n in env and getattr(env[n], "ndim", 0) >= 1}
        for ex, run in zip(self.executors, self._ckpt):
            xs = [self._layout_input(ex, i, name, tp_p, env, batched) for i, (name, tp_p) in enumerate(ex.feeds)]
            outs = run(*xs)
            if ex.lowered is not None:
                outs = ex.lowered.rewrap(outs)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            env.update(zip(ex.layer_outputs, outs))
        return [v.dtensor() if wrap and isinstance(v, LocalValue) else v for v in (env[n] for n in outputs)]

    # ---- training ---------------------------------------------------------------------------
    @torch.no_grad()
    def sync_grads(self) -> None:
        """Reduce every grad to its parameter's layout and sum tied copies (see
        :meth:`_grad_bucketers`). FSDP layers reduce-scattered theirs in backward; the plain
        (DDP-flavour) local grads of all layers sharing a dp group are summed in buckets, launched
        during the last backward when :meth:`train_step` armed them, else here."""
        for bucketer in self._bucketers.values():
            bucketer.finish()
        for ps in self._local_tied:
            grads = [g for g in (ex.params[k].grad for ex, k in ps) if g is not None]
            if grads:
                total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]
                for ex, k in ps:
                    ex.params[k].grad = total.clone()
        for ex, k in self._dtensor_params:  # parameters kept as DTensors (FSDP reduced theirs)
            p = ex.params[k]
            if p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        for ps in self._slow_tied:
            self._sum_full(ps)

    @staticmethod
    def _sum_full(ps) -> None:
        grads = [ex.params[k].grad for ex, k in ps]
        if all(isinstance(g, DTensor) for g in grads) and \
                len({(tuple(g.placements), tuple(g.device_mesh.mesh.flatten().tolist()), g.device_mesh.mesh.shape,
                      tuple(g._local_tensor.shape)) for g in grads}) == 1:
            # copies sharded alike (FSDP on equal meshes): the sum of the shards is the shard of the sum
            total = grads[0]._local_tensor.clone()
            for g in grads[1:]:
                total += g._local_tensor
            for (ex, k), g in zip(ps, grads):
                ex.params[k].grad = DTensor.from_local(total.clone(), g.device_mesh, g.placements, run_check=False,
                                                       shape=g.shape, stride=g.stride())
            return
        fulls = [g for g in (ex.full_grad(k) for ex, k in ps) if g is not None]
        if fulls:
            total = torch.stack(fulls).sum(0) if len(fulls) > 1 else fulls[0]
            for ex, k in ps:
                ex.set_full_grad(k, total)

    def train_step(self, batch, optimizer: torch.optim.Optimizer) -> float:
        """One step on a global batch (full tensors on every rank; a sequence in the model's
        positional order, or a mapping of input names to tensors): ``num_microbatches``
        micro-batches with accumulated grads, one dp sync, ``optimizer.step()``, ``zero_grad()``.
        Returns the mean loss. Under ``fp16`` the loss is scaled (:class:`LossScaler`) and a step
        whose gradients overflow is skipped on every rank. The ranks' batches are compared on the
        first step and every ``guard.check_every`` steps, and a peer that stops answering ends the
        step with a ``RankFailureError`` (:class:`~galvatron_fx.runtime.guard.StepGuard`)."""
        batch = self.mg.bind_inputs(batch)
        with self.guard.step((batch, self.mg.input_names)):
            return self._train_step(batch, optimizer)

    def _train_step(self, batch: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> float:
        m = self.num_microbatches
        chunks = [x.chunk(m, dim=0) if x.ndim >= 1 else [x] * m for x in batch]
        if any(len(c) != m for c in chunks):
            raise ValueError(f"the batch of {batch[0].shape[0]} samples does not split into {m} micro-batches")
        total, carrier = None, None
        for i in range(m):
            mb = [c[i] for c in chunks]
            self._check_inputs(mb)
            # the loss's local tensor and its layout (no DTensor per step)
            local, layout = _local_and_layout(self._loss(mb, wrap=False))
            value = local.detach().float()
            total = value if total is None else total + value
            if i == m - 1:
                # the dp sums of the gradients overlap the last micro-batch's backward; the mean
                # loss (a value only: backward starts from the partial loss, whose own backward is
                # a local step) is summed with the last gradient bucket, or else reduced while
                # backward runs
                carrier = self._loss_carrier(layout)
                if carrier is None:
                    total = self._reduce_async(total, layout)
                for bucketer in self._bucketers.values():
                    bucketer.arm(extra=total if bucketer is carrier else None)
            scale = self.scaler.scale if self.scaler is not None else 1.0
            (local * (scale / m)).backward()
        self.sync_grads()
        if carrier is not None:
            mesh, (dp_p, _) = layout
            total = carrier.extra_sum / (mesh.size(0) if dp_p.reduce_op == "avg" else 1)
        if self.scaler is None or self.scaler.unscale(list(self.parameters())):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total.item() / m

    def _loss_carrier(self, layout) -> GradBucketer | None:
        """The gradient bucketer that can sum a loss laid out as ``layout`` (``(mesh,
        placements)`` or None, see :func:`_local_and_layout`) with its last bucket: a sum or mean
        over dp (``Partial``), replicated over tp, on a mesh whose dp group that bucketer reduces
        over."""
        if layout is None or layout[0].ndim != 2:
            return None
        mesh, (dp_p, tp_p) = layout
        bucketer = self._bucketers.get((mesh.size(0), mesh.size(1)))
        if bucketer is None or mesh is not self.mesh(mesh.size(0), mesh.size(1)) or not isinstance(tp_p, Replicate) \
                or not (isinstance(dp_p, Partial) and dp_p.reduce_op in ("sum", "avg")):
            return None
        return bucketer

    @staticmethod
    def _reduce_async(value: torch.Tensor, layout) -> torch.Tensor:
        """The local loss ``value`` laid out as ``layout`` made replicated, its collective
        launched now and waited for when the result is read; as it is without a layout."""
        if layout is None:
            return value
        mesh, placements = layout
        dt = DTensor.from_local(value, mesh, placements, run_check=False, shape=value.shape, stride=value.stride())
        return dt.redistribute(mesh, [R] * mesh.ndim, async_op=True).to_local()

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:  # noqa: D401
        """Full (unsharded) tensors keyed by the original model's FQNs (aliases included): every
        parameter and buffer of the user's model, the parameters no layer reads as they came."""
        out: dict[str, torch.Tensor] = {}
        for ex in self.executors:
            for key, fqn in ex.fqn_of_key.items():
                if fqn not in out:
                    out[fqn] = ex.full_param(key)
        for info in self.mg.params.values():
            if info.name in out:
                for alias in info.aliases:
                    out[alias] = out[info.name]
        for fqn, t in self._unused_full.items():
            out.setdefault(fqn, t.clone())
        for alias, fqn in self._unused_aliases.items():
            out.setdefault(alias, out[fqn])
        for fqn, b in self._buffers_full.items():
            out.setdefault(fqn, b.clone())
        return out

    # ---- checkpoints (galvatron_fx.runtime.checkpoint) ----------------------------------------
    def save(self, path, optimizer: torch.optim.Optimizer | None, *, step: int | None = None,
             extra: dict | None = None, overwrite: bool = False):
        """Save parameters, buffers and ``optimizer``'s state to the directory ``path``, sharded
        and atomically, with the plan beside them; collective (every rank calls it). Any plan or
        world size can :meth:`load` it. A checkpoint of another model at ``path`` is replaced
        only with ``overwrite=True``. See :func:`galvatron_fx.runtime.checkpoint.save`."""
        from galvatron_fx.runtime.checkpoint import save

        return save(self, optimizer, path, step=step, extra=extra, overwrite=overwrite)

    def load(self, path, optimizer: torch.optim.Optimizer | None):
        """Load a checkpoint written by :meth:`save` under any plan or world size into this
        module's layout and ``optimizer`` (which may be fresh); collective. Returns a
        :class:`~galvatron_fx.runtime.checkpoint.LoadedCheckpoint` (``step``, ``extra``, ...)."""
        from galvatron_fx.runtime.checkpoint import load

        return load(self, optimizer, path)

    def load_state_dict(self, state_dict, strict: bool = True):  # type: ignore[override]
        """Copy full tensors keyed by the user's FQNs (``state_dict()`` of this module or of the
        plain model, identical on every rank) into the sharded parameters and buffers. Returns
        ``nn.Module``'s ``_IncompatibleKeys(missing_keys, unexpected_keys)``; raises
        ``ConfigError`` on shape mismatches, and on missing or unexpected keys when ``strict``.
        See :func:`galvatron_fx.runtime.checkpoint.load_full_state_dict`."""
        from galvatron_fx.runtime.checkpoint import load_full_state_dict

        return load_full_state_dict(self, state_dict, strict=strict)
