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

Layouts: user inputs with a batch dim are ``Shard(0)`` on dp (whole for a batch of one on one dp
rank; and as planned on tp); buffers are
replicated; a hidden state keeps its dp placement (``Shard(0)``) and takes the reader's planned tp
placement. A parameter no layer reads (declared in the model, not reached by the traced graph) is
held whole on every rank outside ``parameters()`` (no gradient reaches it), untouched, and kept in
``state_dict()`` and checkpoints like a buffer. The loss layer's mean over the local batch is made
a global mean by dividing the dp-partial gradients' sum (``sync_grads``) — see
:meth:`ParallelModule.forward`.

Program: the module executes the plan's lowered program
(:func:`galvatron_fx.passes.lower_program.lower`, given by ``compile()`` or lowered here on this
rank's meshes before the first step): each executor follows its layer's saved ``placements``
(the ILP's solution, rebuilt without solving again; a tp=1 layer without placements is
all-replicated) and runs the layer's forward and backward graphs. Saved placements that do not
name this torch's decomposed nodes are re-solved by the caller's ``resolve`` (``compile()``: on
the plan's cluster, with a warning) or refused; nothing is re-solved silently.

Data parallel flavours per layer (DDP; ZeRO-2/ZeRO-3 through FSDP2), tied weights and the gradient
sync: :mod:`galvatron_fx.runtime.data_parallel`. The optimizer must be built after the
``ParallelModule`` (it sees the sharded parameters).

Offload (``LayerStrategy.offload``): ZeRO-2/3 layers at ``dp > 1`` through FSDP2's
``CPUOffloadPolicy``; every other offloaded layer registers host masters and computes with device
working copies, its gradients moved to the masters at the end of ``sync_grads`` (see
:mod:`~galvatron_fx.runtime.data_parallel` and :mod:`~galvatron_fx.runtime.layer_exec`). Either
way ``parameters()``, the optimizer's states, ``state_dict`` inputs and checkpoints of such a
layer live in host memory; the plan's other layers run as without offload.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement

from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.recompute import Recompute, checkpoint_fn
from galvatron_fx.passes.lower_program import lower as lower_program
from galvatron_fx.runtime import quiet_logs
from galvatron_fx.runtime.adaptive import AdaptiveMixin
from galvatron_fx.runtime.data_parallel import DataParallelMixin
from galvatron_fx.runtime.grad_norm import clip_grad_norm_
from galvatron_fx.runtime.guard import StepGuard
from galvatron_fx.runtime.hooks import Hooks
from galvatron_fx.runtime.layer_exec import Executors, LayerExecutor
from galvatron_fx.runtime.local_inputs import LocalInputs
from galvatron_fx.runtime.lowered import LocalValue, wait_in_flight
from galvatron_fx.runtime.meshes import device_type
from galvatron_fx.runtime.meshes import owner as mesh_owner
from galvatron_fx.runtime.precision import COMPUTE_DTYPES, LossScaler
from galvatron_fx.runtime.reshard import reshard
from galvatron_fx.runtime.shapes import ShapeVariants
from galvatron_fx.runtime.user_loop import SyncOnBackward, UserLoop, finish_step
from galvatron_fx.runtime.weights import WeightsOut

log = logging.getLogger(__name__)

__all__ = ["ParallelModule", "device_type", "finish_step"]

R = Replicate()

# A lowered layer's outputs are its graph's local tensors, often views; FSDP warns that an in-place
# op on one would skip its pre-backward hook. The runtime never writes to a layer's output.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
quiet_logs.install()  # DTensor's warnings from inside ops: once, on the first rank


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
    replicate_plain = True

    def _param(self, key, local=None):
        p = super()._param(key, local)
        # FSDP's DTensor parameters (a lowered trace reads local shards; a plain gathered
        # parameter is read as a local one, whose gradient is already a dp sum)
        if local is None and self.fsdp and key not in self._local and p.requires_grad:
            p = _DpPartialGrad.apply(p)
        return p


def _named_on_one_dp_rank(v: DTensor, dp_p: Placement) -> DTensor:
    """``v``, whose mesh has one dp rank, named ``dp_p`` (``Shard(0)`` or ``Replicate``) on dp
    as the program reading it was traced: on one rank both name the whole tensor, so this is no
    copy and no collective (the gradient is named back as ``v``'s)."""
    return DTensor.from_local(v.to_local(grad_placements=v.placements), v.device_mesh, (dp_p, *v.placements[1:]),
                              run_check=False, shape=v.shape, stride=v.stride())


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


class ParallelModule(WeightsOut, AdaptiveMixin, DataParallelMixin, LocalInputs, UserLoop, ShapeVariants, nn.Module):
    """The planned model on this rank: one :class:`LayerExecutor` per layer (see module doc)."""

    def __init__(self, model: nn.Module, mg: ModelGraph, plan: ParallelPlan, *, program=None, resolve=None,
                 layers: Sequence[int] | None = None,
                 meshes: dict[tuple[int, int], DeviceMesh] | None = None, dump_dir=None, keep_model: bool = True):
        """``layers``/``meshes``: build only these layers (a pipeline chunk) on the given ``(dp,
        tp)`` meshes over their stage's ranks (:class:`~galvatron_fx.runtime.pipeline.PipelineModule`
        does); by default every layer of a ``pp == 1`` plan on meshes over all ranks.
        ``program``: the plan lowered on this rank's meshes
        (:func:`galvatron_fx.passes.lower_program.lower`), else lowered here: each layer runs its
        program's graphs. ``resolve(layer, decomposed, strategy)``: the option of a layer whose
        saved placements do not name this torch's nodes, for the lowering (none: such a plan is
        refused). ``dump_dir``: the lowering's passes dump their graphs there.
        ``keep_model``: hold ``model`` to capture it again at a batch of another shape
        (:mod:`~galvatron_fx.runtime.shapes`; :meth:`release_model` lets it go)."""
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
        self.executors = Executors()
        self._ckpt = []
        self.hooks = Hooks()  # step, layer-call and sync hooks (a pipeline's chunks share the pipeline's)
        self._recorder = None  # the observer, once observed (runtime/observe.py)
        self._layer_names = [mg.layers[i].name for i in self.layer_ids]
        self.option_source: list[str] = []  # "plan" | "tp1" | "re-solved", per layer
        named = dict(model.named_buffers())
        self._buffers_full = {fqn: b.detach().clone() for fqn, b in named.items()}
        self._unused_full, self._unused_aliases = _unused_params(model, mg)
        # tensors the graph reads besides parameters: buffers and lifted constants (not state)
        self._constants = {fqn: t.detach().clone() for fqn, t in mg.constants.items()}
        self._node_fqn = {node: p.name for p in mg.params.values() for node in p.nodes}
        self._is_buffer = {node for p in mg.params.values() if p.is_buffer for node in p.nodes}
        traced: dict[tuple, LayerExecutor] = {}
        if program is None:
            program = lower_program(mg, plan, mesh_of=lambda _stage, dp, tp: self.mesh(dp, tp), resolve=resolve,
                                    layers=self.layer_ids, dump_dir=dump_dir)
        self.program = program  # the LoweredProgram this module runs
        lowered_layers = {lay.name: lay for lay in program.layers}
        for i in self.layer_ids:
            layer, lp = mg.layers[i], plan.layers[i]
            if layer.name not in lowered_layers:
                raise PlanError(f"the program given for plan {plan.model!r} does not lower layer {layer.name}: "
                                "lower the plan for this module's layers (galvatron_fx.passes.lower_program.lower)")
            graphs = lowered_layers[layer.name].graphs
            # layers of one kind share the traced graph; only the names of their inputs differ
            dl = dataclasses.replace(graphs.decomposed, input_names=[a.name for a in mg.layer_inputs(layer)])
            self.option_source.append(lowered_layers[layer.name].option_source)
            ex = _Executor.from_model(mg, layer, graphs.option, self.mesh(lp.dp, lp.strategy.tp), model, decomposed=dl)
            ex.compute_dtype = self.compute_dtype if self.compute_dtype != torch.float32 else None
            input_name_of = {ph.name: n for ph, n in zip(dl.inputs, dl.input_names)}
            # per forward input: the value it reads and the tp placement the plan wants
            ex.feeds = [(input_name_of[ph.name], pl[1]) for (ph, _), pl in zip(ex._inputs, ex.input_placements())]
            ex.layer_outputs = list(layer.output_names)
            self.executors.append(ex)
        self._shard_all()
        for i, ex in zip(self.layer_ids, self.executors):
            if not ex.fsdp:
                ex.localize()
                if plan.layers[i].strategy.offload:  # (an FSDP unit offloads through FSDP: _shard_all)
                    ex.offload()
        self._share_tied()
        self._working = self._working_copies()  # offloaded masters and their working copies
        for i, ex in zip(self.layer_ids, self.executors):
            layer, lp = mg.layers[i], plan.layers[i]
            st = lp.strategy
            # one executor's graphs per (kind, placements, mesh, storage, user inputs, selective
            # recomputation: its graphs recompute, tagged; full recomputation checkpoints the same
            # graphs' run below)
            selective = st.recompute == Recompute.SELECTIVE
            users = tuple(k for k, (name, _) in enumerate(ex.feeds) if name in mg.input_names)
            key = (layer.kind, tuple(sorted(ex.option.placements.items())), (lp.dp, st.tp), ex.fsdp, users, selective)
            ex.lower(share_with=traced.setdefault(key, ex), program=lowered_layers[layer.name].graphs,
                     selective=selective)
            wrap = checkpoint_fn(st.recompute) if st.recompute == Recompute.FULL else None
            run = functools.partial(ex, unwrapped=True)
            self._ckpt.append(wrap(run) if wrap is not None else run)
        self._tied = self._tied_groups()  # after sharding: FSDP replaced the parameters
        self._dtensor_params = [(ex, k) for ex in self.executors for k in ex.params if k not in ex._local]
        self._bucketers = self._grad_bucketers()
        # (buffer FQN, the executor of the first layer here that reads it) per buffer the forward writes
        reads = {fqn: ex for i, ex in zip(self.layer_ids, self.executors) for fqn in reversed(mg.layers[i].param_names)}
        self._written_buffers = [(fqn, reads[fqn]) for fqn in mg.mutated_buffers if fqn in reads
                                 and fqn in self._buffers_full]
        # the buffers this module's state holds: those its layers read, and those no layer reads
        # (a pipeline stage does not hold a copy of another stage's, which that stage updates)
        read_anywhere = {fqn for layer in mg.layers for fqn in layer.param_names}
        self._own_buffers = {fqn for fqn in self._buffers_full if fqn in reads or fqn not in read_anywhere}
        # what train_step takes (the plan's; the search's when compile was given an automatic batch)
        self.global_batch_size, self.num_microbatches = plan.global_batch_size, plan.num_microbatches
        self._init_shapes(model, resolve, keep_model)  # batches of other shapes (runtime/shapes.py)

    def bodies(self) -> list[ParallelModule]:
        """The modules that hold this one's layers: itself (a pipeline's are its chunks' bodies)."""
        return [self]

    # ---- meshes and options -------------------------------------------------------------------
    def mesh(self, dp: int, tp: int) -> DeviceMesh:
        """The ``(dp, tp)`` mesh over the stage's ranks: the process's one, from the mesh owner
        (:mod:`galvatron_fx.runtime.meshes`), or the pipeline's stage submesh it was given."""
        if (dp, tp) not in self._meshes:
            self._meshes[(dp, tp)] = mesh_owner().layer_mesh(self._ranks, dp, tp)
        return self._meshes[(dp, tp)]

    # ---- forward ----------------------------------------------------------------------------
    def _layout_input(self, ex: LayerExecutor, i: int, name: str, tp_p: Placement, env: dict,
                      batched: set[str]) -> DTensor | torch.Tensor:
        """Layer input ``name`` (the executor's input ``i``) laid out for ``ex``: a value of an
        earlier layer keeps its dp placement (a replicated one that is a batched value or that the
        program reads split on dp is split: a local slice) and takes the planned tp one (a
        transition); a full
        tensor (user input, buffer) is distributed, batch-sharded on dp when it is a batched user
        input. A :class:`LocalValue` already in the layout ``ex``'s lowered graph was traced for
        is passed as its local tensor."""
        mesh = ex.mesh
        tp_p = R if isinstance(tp_p, Partial) else tp_p  # a planned P input is made by the executor
        want = ex.lowered.in_specs[i] if ex.lowered is not None and ex.lowered.in_specs is not None else None
        # a replicated value the program reads split on dp: each rank takes its rows (no collective)
        split = want is not None and want[0][0] == Shard(0) and mesh.size(0) > 1
        if name in env:
            v = env[name]
            if isinstance(v, LocalValue):
                if ex.lowered is not None and ex.lowered.accepts(i, v):
                    return v.local
                v = env[name] = v.dtensor()
            if isinstance(v, DTensor):
                dp_p = R if isinstance(v.placements[0], Partial) else v.placements[0]
                # (made whole from factories, a mask or positions, or by a layer on fewer dp ranks)
                if isinstance(dp_p, Replicate) and mesh.size(0) > 1 and v.ndim >= 1 and \
                        v.shape[0] % mesh.size(0) == 0 and (name in self.mg.batched or split):
                    dp_p = Shard(0)
                if want is not None and want[0][0] != dp_p and mesh.size(0) == 1 and v.device_mesh.size(0) == 1 \
                        and {want[0][0], dp_p} <= {Shard(0), R} and v.ndim >= 1:
                    v, dp_p = _named_on_one_dp_rank(v, want[0][0]), want[0][0]
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
        # (a batch of one on one dp rank is whole, as the lowering lays it out)
        dp_p = Shard(0) if name in batched and (mesh.size(0) > 1 or (full.ndim >= 1 and full.shape[0] > 1)) or \
            (split and full.ndim >= 1 and full.shape[0] % mesh.size(0) == 0) else R
        if ex.lowered is not None and isinstance(tp_p, Replicate) and full.ndim >= 1:
            # the piece straight away, for a graph that takes it (DTensor's even Shard(0) split)
            dp = mesh.size(0)
            local = full if dp_p is R else full.chunk(dp)[mesh.get_local_rank(0)]
            v = LocalValue(local, mesh, (dp_p, tp_p), full.shape, full.stride())
            if (dp_p is R or full.shape[0] % dp == 0) and ex.lowered.accepts(i, v):
                return local
        return distribute_tensor(full, mesh, [dp_p, tp_p], src_data_rank=None)

    def _whole_input(self, name: str, env: dict) -> torch.Tensor:
        """User input ``name`` whole, in the dtype its layer reads it in (every rank holds it)."""
        full = env[name]
        if isinstance(full, DTensor):
            full = full.full_tensor()
        if full.is_floating_point() and full.dtype != self.compute_dtype:
            full = full.to(self.compute_dtype)
        return full.contiguous()  # (the program was traced on contiguous inputs: a sliced one is copied)

    def forward(self, *inputs: torch.Tensor, **kwargs) -> torch.Tensor | dict[str, torch.Tensor]:
        """The mean loss of a batch as a plain tensor, the same on every rank: a batch of any size
        (the global batch runs as its ``num_microbatches`` micro-batches, one after another,
        every one's activations kept for backward; other sizes as :mod:`~galvatron_fx.runtime.shapes`
        splits them); ``outputs=True``: a dict of the loss and the model's other outputs by key;
        full inputs identical on
        every rank, or each rank's data-parallel share with ``inputs="local"``; positional and
        keyword as the model was captured, or the batch as one value (a mapping of names to tensors, or
        a sequence in the model's positional order).

        ``loss.backward()`` then leaves every gradient synced, as under
        ``DistributedDataParallel`` (the sync runs when backward ends; inside :meth:`no_sync` the
        gradients accumulate instead). :meth:`forward_backward` runs the same step at the plan's
        memory (one micro-batch's activations at a time) and overlaps the sync with backward.

        The loss layer's mean over a batch-sharded input comes out ``Partial`` on dp (each
        rank's sum over the global count of targets, :mod:`~galvatron_fx.ops.vocab_parallel`; a
        mean DTensor's own rules make is ``Partial(avg)``); its ``full_tensor()`` is the global
        mean, and backward through it leaves dp-``Partial`` grads whose sum (:meth:`sync_grads`)
        is the gradient of that mean.
        """
        batch, outputs = self._call_inputs(inputs, kwargs)
        if outputs:
            return self._with_outputs(batch)
        losses = []
        for mb in self._micro_batches(batch):
            loss = self._loss(mb)
            losses.append(loss.full_tensor() if isinstance(loss, DTensor) else loss)
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        if torch.is_grad_enabled() and loss.requires_grad and self.sync_on_backward:
            loss = SyncOnBackward.apply(loss, self)
        return loss

    def _loss_prepare(self, inputs: Sequence[torch.Tensor]) -> None:
        wait_in_flight()
        self._activate(inputs)

    def forward_all(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The loss of one micro-batch (as :meth:`forward`) and the model's other outputs
        (``ModelGraph.extra_output_names``: a Hugging Face model's logits), each gathered whole on
        every rank, differentiably (the ``torch.compile`` backend hands them back to the user's
        code)."""
        bound = self.mg.bind_inputs(inputs)
        self._check_inputs(bound)
        return tuple(self._gathered_outputs(bound))

    def _check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        names, shapes = self.mg.input_names, [tuple(s) for s in self.mg.example_shapes]
        got = [tuple(x.shape) for x in inputs]
        if len(inputs) != len(names) or (shapes and got != shapes):
            raise ValueError(f"expected inputs ({', '.join(names)}) of shapes {shapes} (one micro-batch of "
                             f"{self.plan.global_batch_size} / {self.plan.num_microbatches} samples) or the whole "
                             f"global batch of {self.plan.global_batch_size} samples, got {got}")

    def _loss(self, inputs: Sequence[torch.Tensor], *, wrap: bool = True):
        """The loss of one micro-batch as the last layer leaves it (a DTensor, typically
        ``Partial`` over dp; ``wrap=False``: possibly a :class:`LocalValue`): no collective
        (but the first micro-batch of a new shape captures and lowers it: runtime/shapes.py)."""
        self._loss_prepare(inputs)  # earlier forwards' collectives waited; this shape's program in place
        (loss,) = self.run_layers(dict(zip(self.mg.input_names, inputs)), self.mg.output_names, wrap=wrap)
        return loss

    @torch.no_grad()
    def _store_written(self, ex) -> None:
        """The buffers ``ex``'s layer wrote (a local layer's graph hands their new values back)."""
        names = [ex.feeds[i][0] for i in ex.lowered.program.trace.buffer_inputs]
        for name, value in zip(names, ex.written_values):
            fqn = self._node_fqn.get(name)
            if fqn in self._buffers_full:
                self._buffers_full[fqn].copy_(value)
        ex.written_values = []

    @torch.no_grad()
    def sync_buffers(self) -> None:
        """Buffers the forward wrote (BatchNorm's running statistics, ``mg.mutated_buffers``)
        made rank 0's on every rank of the layer that writes them, as ``DistributedDataParallel``
        broadcasts them: each rank updated its copy from its own share of the batch."""
        for fqn, ex in self._written_buffers:
            b = self._buffers_full[fqn]
            for axis, dim in (("tp", 1), ("dp", 0)):  # from tp coordinate 0, then from dp coordinate 0
                if ex.mesh.size(dim) > 1:
                    group = ex.mesh.get_group(axis)
                    dist.broadcast(b, src=dist.get_global_rank(group, 0), group=group)

    def run_layers(self, env: dict[str, object], outputs: Sequence[str], *, wrap: bool = True) -> list:
        """Run this module's layers on ``env`` (value name -> DTensor, or a full tensor for user
        inputs), adding their outputs to it; returns the values named ``outputs`` (DTensors for
        layer outputs; ``wrap=False``: as they travel). Between lowered layers values travel
        unwrapped (:class:`LocalValue`); a lowered layer whose program counts over a user input
        whole (:mod:`~galvatron_fx.passes.fold_input_reductions`) gets it whole too."""
        batched = {n for n in self.mg.input_names if n in env and getattr(env[n], "ndim", 0) >= 1}
        hooks = self.hooks.layer
        for ex, run, layer_name in zip(self.executors, self._ckpt, self._layer_names):
            xs = [self._layout_input(ex, i, name, tp_p, env, batched) for i, (name, tp_p) in enumerate(ex.feeds)]
            if ex.lowered is not None and ex.lowered.whole_inputs:
                xs += [self._whole_input(ex.feeds[i][0], env) for i in ex.lowered.whole_inputs]
            outs = self.hooks.run_layer(layer_name, run, *xs) if hooks else run(*xs)
            if ex.lowered is not None and ex.lowered.num_writes:
                self._store_written(ex)
            if ex.lowered is not None:
                outs = ex.lowered.rewrap(outs)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            env.update(zip(ex.layer_outputs, outs))
        if self._written_buffers:
            self.sync_buffers()
        return [v.dtensor() if wrap and isinstance(v, LocalValue) else v for v in (env[n] for n in outputs)]

    # ---- training ---------------------------------------------------------------------------
    def train_step(self, batch, optimizer: torch.optim.Optimizer, *, max_norm: float | None = None,
                   scheduler=None) -> float:
        """One step on a global batch (full tensors on every rank; a sequence in the model's
        positional order, or a mapping of input names to tensors): ``num_microbatches``
        micro-batches with accumulated grads, one dp sync, the gradients clipped to a global norm
        of ``max_norm`` (:meth:`clip_grad_norm_`) when given, ``optimizer.step()``,
        ``scheduler.step()`` when given, ``zero_grad()``. Returns the mean loss. Under ``fp16`` the
        loss is scaled (:class:`LossScaler`) and a step whose gradients overflow is skipped on every
        rank. The ranks' batches are compared on the first step and every ``guard.check_every``
        steps, and a peer that stops answering ends the step with a ``RankFailureError``
        (:class:`~galvatron_fx.runtime.guard.StepGuard`). The short form of :meth:`forward_backward`,
        :meth:`clip_grad_norm_` and the user's own optimizer calls. ``hooks.step`` run around it."""
        if self.hooks.step:
            return self.hooks.run_step(self._guarded_step, batch, optimizer, max_norm=max_norm, scheduler=scheduler)
        return self._guarded_step(batch, optimizer, max_norm=max_norm, scheduler=scheduler)

    def _guarded_step(self, batch, optimizer: torch.optim.Optimizer | None, *, max_norm: float | None = None,
                      scheduler=None) -> float:
        batch = self.mg.bind_inputs(batch)
        with self.guard.step((batch, self.mg.input_names)):
            return self._train_step(self._global_inputs(batch), optimizer, max_norm=max_norm, scheduler=scheduler)

    def forward_backward(self, batch) -> torch.Tensor:
        """Every micro-batch's forward and backward on a global batch (as :meth:`train_step`
        takes it) and the data-parallel gradient sync, the gradients left in ``.grad`` (unscaled
        under ``fp16``; none at all after an overflow, so that the step that follows changes
        nothing): the user's loop then clips (:meth:`clip_grad_norm_`), steps its optimizer and
        its LR schedule and zeroes the gradients itself. Returns the global mean loss (a 0-dim
        float tensor, equal on every rank)."""
        batch = self.mg.bind_inputs(batch)
        with self.guard.step((batch, self.mg.input_names)):
            return torch.tensor(self._train_step(self._global_inputs(batch), None))

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the single-process model's parameters, whatever
        mesh, shard or host each lives on here (:mod:`~galvatron_fx.runtime.grad_norm`); returns
        the total norm before clipping. Collective: every rank calls it."""
        return clip_grad_norm_(self, max_norm, norm_type, error_if_nonfinite)

    def _train_step(self, batch: list[torch.Tensor], optimizer: torch.optim.Optimizer | None, *,
                    max_norm: float | None = None, scheduler=None) -> float:
        sync = self.syncing  # False inside no_sync(): the gradients accumulate, unsynced and scaled
        if not sync and optimizer is not None:
            raise ConfigError("train_step steps the optimizer, so it cannot run inside no_sync(): accumulate "
                              "with pm.forward_backward(batch) there, then step after the last one outside")
        micro = self._micro_batches(batch)  # the plan's m, or as many as a batch of another size needs
        m = len(micro)
        total: torch.Tensor | None = None
        carrier, layout = None, None
        for i, mb in enumerate(micro):
            # the loss's local tensor and its layout (no DTensor per step)
            local, layout = _local_and_layout(self._loss(mb, wrap=False))
            value = local.detach().float()
            total = value if total is None else total + value
            if i == m - 1:
                # the dp sums of the gradients overlap the last micro-batch's backward; the mean
                # loss (a value only: backward starts from the partial loss, whose own backward is
                # a local step) is summed with the last gradient bucket, or else reduced while
                # backward runs
                carrier = self._loss_carrier(layout) if sync else None
                if carrier is None:
                    total = self._reduce_async(total, layout)
                if sync:
                    for bucketer in self._bucketers.values():
                        bucketer.arm(extra=total if bucketer is carrier else None)
            scale = self.scaler.scale if self.scaler is not None else 1.0
            (local * (scale / m)).backward()
        assert total is not None  # (a step has a micro-batch or more)
        if not sync:
            return total.item() / m
        self.hooks.run_sync(self.sync_grads)
        if carrier is not None:
            assert layout is not None and carrier.extra_sum is not None  # (a carrier sums a laid-out loss)
            mesh, (dp_p, _) = layout
            total = carrier.extra_sum / (mesh.size(0) if dp_p.reduce_op == "avg" else 1)
        ok = self.scaler is None or self.scaler.unscale(list(self.parameters()))
        finish_step(self, optimizer, ok, max_norm, scheduler)
        return total.item() / m

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:  # type: ignore[override]  # (full tensors by FQN: no destination or prefix)
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
            if fqn in self._own_buffers:
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
