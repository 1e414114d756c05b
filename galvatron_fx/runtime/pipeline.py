"""``PipelineModule`` — a pipelined plan (``pp > 1``) run by ``torch.distributed.pipelining``.

Contract: built on every rank of an initialised process group of the plan's world size from the
user's model, its :class:`~galvatron_fx.ir.graph.ModelGraph` captured at the per-micro-batch
global shape, and a plan whose stages split the ranks evenly (``stage_ranks``: contiguous blocks,
or whole nodes laid off slow links, :mod:`galvatron_fx.cluster.topology`). ``train_step(batch, optimizer)`` takes the
whole global batch (full tensors, identical on every rank; only the first stage reads them) and
returns the mean loss on every rank, like :meth:`ParallelModule.train_step`.

Terms: chunk ``c`` holds layers ``plan.chunk_layers()[c]`` and runs on stage ``c % pp`` (one
chunk per stage, or ``virtual_stages`` of them under interleaved 1F1B). A *crossing* value at a
boundary ``b`` is one made before layer ``b`` (or a user input) and read at or after it; a chunk
takes the values crossing its start and returns those crossing its end (the last chunk returns
the loss).

Algorithm:

* Meshes: for every ``(dp, tp)`` shape the plan uses, one ``(pp, dp, tp)`` world mesh over the
  plan's ``stage_ranks`` (a ``DeviceMesh`` on every rank, in the same order); a stage's layers use its ``(dp, tp)``
  sub-mesh, and the ``pp`` sub-mesh's group (the ranks with this rank's coordinate in every
  stage) carries the stage-to-stage sends.
* Each chunk is a :class:`~galvatron_fx.runtime.parallel_module.ParallelModule` over its layers
  (``layers=``, ``meshes=``), wrapped by :class:`_Chunk`, whose forward takes and returns plain
  local tensors, as ``PipelineStage`` sends them: a user input travels whole; an activation is
  sent in a *canonical* layout on the producer's ``(dp, tp)`` shape — ``(Shard(0), Replicate)``
  for a batch activation (a value one layer reads), ``(Replicate, Replicate)`` for a value many
  layers read or a batch of one on one dp rank — so rank ``i`` of the next stage rebuilds the same DTensor on its own
  same-shaped mesh with ``from_local`` and reshards it to what its reader wants. Both sides
  derive the layout from the plan and the graph; nothing about layouts is sent.
* Schedules: ``gpipe`` → ``ScheduleGPipe``, ``1f1b`` → ``Schedule1F1B``, ``interleaved_1f1b`` →
  ``ScheduleInterleaved1F1B`` over this rank's chunks; the loss function divides by the number
  of micro-batches (``scale_grads=False``), as ``ParallelModule.train_step`` does.
* Gradients: after the schedule, each chunk syncs its own (dp buckets, FSDP, tied copies inside
  the chunk; an offloaded layer's then sit on its host masters); a weight tied across chunks (an
  embedding and its head) is summed over the ``pp`` group as full tensors and written back to
  every copy (``full_grad``/``set_full_grad`` read and write an offloaded copy's on its master).
* Other batch shapes: :mod:`~galvatron_fx.runtime.pipeline_shapes` (a schedule per micro-batch
  shape and count). ``pm(batch, outputs=True)`` under ``no_grad``: the last chunk keeps each
  micro-batch's other outputs (whole) beside the loss it hands the schedule, and the last stage's
  first rank broadcasts them joined.
* Checkpoints (``save``/``load``/``load_state_dict``): :mod:`galvatron_fx.runtime.checkpoint`
  over this rank's chunk bodies, in the format of :class:`ParallelModule`'s, so that pipelined and
  non-pipelined plans of any shape load each other's checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from galvatron_fx.cluster.topology import runnable
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.passes.decompose_layer import requires_grad_values
from galvatron_fx.runtime.adaptive import AdaptiveMixin
from galvatron_fx.runtime.grad_norm import clip_grad_norm_
from galvatron_fx.runtime.guard import StepGuard
from galvatron_fx.runtime.hooks import Hooks
from galvatron_fx.runtime.layer_exec import LayerExecutor
from galvatron_fx.runtime.local_inputs import LocalInputs
from galvatron_fx.runtime.meshes import device_type
from galvatron_fx.runtime.meshes import owner as mesh_owner
from galvatron_fx.runtime.parallel_module import ParallelModule
from galvatron_fx.runtime.pipeline_shapes import PipelineShapes
from galvatron_fx.runtime.precision import LossScaler
from galvatron_fx.runtime.user_loop import UserLoop, finish_step
from galvatron_fx.runtime.weights import WeightsOut

log = logging.getLogger(__name__)

__all__ = ["PipelineModule"]

R = Replicate()


def _stage_meshes(plan: ParallelPlan) -> tuple[int, dict[tuple[int, int], DeviceMesh], dist.ProcessGroup]:
    """This rank's stage, its ``(dp, tp)`` meshes and its ``pp`` group (see module doc)."""
    pp, world = plan.pp, dist.get_world_size()
    k = world // pp
    if sorted(r for ranks in plan.stage_ranks for r in ranks) != list(range(world)) or any(
            len(r) != k for r in plan.stage_ranks):
        raise PlanError(f"stage_ranks {[list(r) for r in plan.stage_ranks]} do not split the {world} ranks into {pp} "
                        f"stages of {k}: re-plan")
    if not runnable(plan.stage_ranks):
        raise PlanError(f"stage_ranks {[list(r) for r in plan.stage_ranks]}: each stage's ranks must ascend and the "
                        "j-th rank of every stage lie above the j-th of the stage before (torch.distributed.pipelining "
                        "runs stage s on rank s of its pipeline group, whose ranks ascend): re-plan")
    rank = dist.get_rank()
    meshes: dict[tuple[int, int], DeviceMesh] = {}
    pp_group: dist.ProcessGroup | None = None
    for dp, tp in sorted({(lp.dp, lp.strategy.tp) for lp in plan.layers}):
        if dp * tp != k:
            raise PlanError(f"a layer's dp={dp} × tp={tp} does not cover a stage's {k} ranks: re-plan")
        meshes[(dp, tp)], group = mesh_owner().pipeline(plan.stage_ranks, dp, tp)  # (made once per process)
        pp_group = pp_group or group
    assert pp_group is not None  # (a plan has layers)
    return next(s for s, ranks in enumerate(plan.stage_ranks) if rank in ranks), meshes, pp_group


class _Chunk(nn.Module):
    """One pipeline chunk: local tensors in, local tensors out (see module doc)."""

    body: ParallelModule

    def __init__(self, body: ParallelModule, in_names: list[str], out_names: list[str], layout: dict,
                 is_last: bool):
        super().__init__()
        self.body = body
        self.in_names, self.out_names = in_names, out_names
        self.layout = layout  # value -> ((dp, tp) of its producer, canonical placements, shape)
        self.is_last = is_last
        self.loss_spec: tuple[DeviceMesh, tuple] | None = None  # (mesh, placements) of the loss, on the last chunk
        self.collect: list | None = None  # the last chunk under outputs=True: each micro-batch's other outputs
        grads = requires_grad_values(body.mg)
        self.constant = {n for n in in_names if n not in grads}  # inputs that need no gradient

    def forward(self, *xs: torch.Tensor):
        env: dict[str, object] = {}
        for name, x in zip(self.in_names, xs):
            if name in self.constant:
                # a value that needs no gradient in training (a mask): the schedule hands every
                # received tensor over requiring one, which would take its readers off the
                # kernels the layers were traced with (a mask requiring grad is not one CPU flash
                # attention takes); its gradient goes back as zeros
                x = x.detach()
            if name not in self.layout:  # a user input, whole
                env[name] = x
                continue
            shape_dp_tp, placements, shape = self.layout[name]
            env[name] = DTensor.from_local(x, self.body.mesh(*shape_dp_tp), placements, run_check=False,
                                           shape=shape, stride=_contiguous_stride(shape))
        extra = list(self.body.mg.extra_output_names) if self.is_last and self.collect is not None else []
        values = self.body.run_layers(env, self.out_names + extra)
        if extra:  # pm(batch, outputs=True): the model's other outputs, whole, beside the schedule's loss
            assert self.collect is not None  # (extra only when collecting)
            self.collect.append([v.full_tensor().detach() if isinstance(v, DTensor) else v.detach()
                                 for v in values[len(self.out_names):]])
            values = values[: len(self.out_names)]
        if self.is_last:
            (loss,) = values
            if isinstance(loss, DTensor):
                self.loss_spec = (loss.device_mesh, tuple(loss.placements))
                loss = loss.to_local()
            return loss.reshape(1)  # the schedule concatenates outputs along dim 0
        outs = []
        for name, v in zip(self.out_names, values):
            if name in self.layout:
                _, placements, _ = self.layout[name]
                if tuple(v.placements) != placements:
                    v = v.redistribute(v.device_mesh, placements)
                v = v.to_local()
            outs.append(v.contiguous())  # p2p sends take contiguous tensors (an expanded mask is not)
        return tuple(outs)


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(stride))


class _Chunks(nn.ModuleList):
    """This stage's chunks, in order: an ``nn.ModuleList`` typed as holding :class:`_Chunk` s."""

    def __iter__(self) -> Iterator[_Chunk]:
        return cast("Iterator[_Chunk]", super().__iter__())


class PipelineModule(WeightsOut, AdaptiveMixin, LocalInputs, UserLoop, PipelineShapes, nn.Module):
    """The pipelined plan on this rank (see module doc)."""

    chunks: _Chunks

    def __init__(self, model: nn.Module, mg: ModelGraph, plan: ParallelPlan, *, resolve=None, dump_dir=None):
        super().__init__()
        if plan.pp < 2:
            raise PlanError("PipelineModule runs pipelined plans (pp > 1); use ParallelModule for pp == 1")
        if dist.get_world_size() != plan.world_size:
            raise PlanError(f"plan for world size {plan.world_size}, this job has {dist.get_world_size()}")
        self.plan, self.mg = plan, mg
        self.stage, meshes, self.pp_group = _stage_meshes(plan)
        pp = plan.pp
        chunks = plan.chunk_layers()
        mine = [c for c in range(len(chunks)) if c % pp == self.stage]
        bounds = [r.start for r in chunks] + [len(mg.layers)]
        crossing = self._crossing(bounds)
        layout = self._layout()
        self.__dict__["_base_layout"] = layout  # (the chunks' at the planned shape: runtime/pipeline_shapes)
        self.chunks = _Chunks()
        self.scaler = LossScaler() if plan.precision == "fp16" else None
        self.guard = StepGuard()
        self.hooks = Hooks()  # step, layer-call and sync hooks; the chunks' bodies share them
        self._recorder = None  # the observer, once observed (runtime/observe.py)
        device = torch.device("cuda", torch.cuda.current_device()) if device_type() == "cuda" else torch.device("cpu")
        self.device = device
        self._mine = mine
        self._init_batch_shapes(model, True, range(len(mg.layers)))  # batches of other shapes (module doc)
        self.__dict__["_schedules"] = {}  # (variant signature or None, micro-batches) -> schedule
        self.__dict__["_active"] = None
        try:
            self._build(model, mg, plan, mine, chunks, crossing, layout, meshes, resolve, dump_dir)
        except Exception as e:  # a stage that cannot be built: every rank hears of it (below), none waits
            self._check_chunks_run(crossing, layout, failed=e)
        self._check_chunks_run(crossing, layout)

    def _build(self, model, mg, plan, mine, chunks, crossing, layout, meshes, resolve, dump_dir) -> None:
        """This rank's chunks, their ``PipelineStage`` and the schedule (no collective across stages)."""
        pp, m = plan.pp, plan.num_microbatches
        for c in mine:
            body = ParallelModule(model, mg, plan, resolve=resolve, layers=chunks[c], meshes=meshes,
                                  dump_dir=None if dump_dir is None else Path(dump_dir) / f"chunk{c}", keep_model=False)
            body.hooks = self.hooks
            last = c == len(chunks) - 1
            outs = list(mg.output_names) if last else crossing[c + 1]
            self.chunks.append(_Chunk(body, crossing[c], outs, layout, last))
        self._last: _Chunk | None = cast(_Chunk, self.chunks[-1]) if self.stage == (len(chunks) - 1) % pp else None
        self._first = self.stage == 0
        self.schedule = self._make_schedule(mg, m)
        self._cross_tied = self._cross_chunk_ties()
        self.global_batch_size, self.num_microbatches = plan.global_batch_size, m  # what train_step takes

    def bodies(self) -> list[ParallelModule]:
        """The :class:`ParallelModule` bodies of this rank's chunks."""
        return [ch.body for ch in self.chunks]

    @property
    def program(self):
        """This rank's lowered program: its chunks' layers, graphs and buckets in order, one
        step graph per chunk (``stages`` keyed ``"<stage>.<chunk>"``)."""
        from galvatron_fx.ir.program import LoweredProgram

        out = LoweredProgram(plan=self.plan)
        for i, chunk in enumerate(self.chunks):
            p = chunk.body.program
            if p is None:
                continue
            out.layers += p.layers
            out.layer_graphs |= p.layer_graphs
            out.buckets += p.buckets
            out.stages |= {f"{s}.{i}": g for s, g in p.stages.items()}
            for k, v in p.timings_s.items():
                out.timings_s[k] = out.timings_s.get(k, 0.0) + v
        return out

    def _check_chunks_run(self, crossing: list[list[str]], layout: dict, failed: Exception | None = None) -> None:
        """Run each of this rank's chunks forward and backward once on zeros, apart from the
        schedule, and agree over the world on the outcome: a chunk that fails (an op the runtime
        cannot run, a value it cannot send), or could not be built at all (``failed``: its
        lowering's error), raises the same ``PlanError`` on every rank here, naming the error,
        instead of leaving the other stages blocked in a receive until the process group's
        timeout. The random state, gradients, written buffers and in-flight work are as they were
        before."""
        from galvatron_fx.runtime.lowered import wait_in_flight

        if failed is not None:
            errors: list = [None] * dist.get_world_size()
            dist.all_gather_object(errors, f"{type(failed).__name__}: {failed}")
            self._raise_failed(errors)
        error = None
        rng = torch.get_rng_state()
        # buffers the forward writes (BatchNorm's statistics) are as they were after the check too
        written = [(ch.body._buffers_full[fqn], ch.body._buffers_full[fqn].clone())
                   for ch in self.chunks for fqn, _ in ch.body._written_buffers]
        try:
            for c, chunk in zip([c for c in range(len(crossing) - 1) if c % self.plan.pp == self.stage], self.chunks):
                ins = [x.detach().zero_().requires_grad_(x.requires_grad)
                       for x in (self._example(self.mg, n, layout) for n in crossing[c])]
                outs = chunk(*ins)
                outs = outs if isinstance(outs, tuple) else (outs,)
                for name, o in zip(chunk.out_names, outs):
                    if not chunk.is_last and not o.is_contiguous():
                        raise PlanError(f"chunk {c} sends {name} non-contiguous")
                grads = [o for o in outs if o.requires_grad]
                if grads:
                    torch.autograd.backward(grads, [torch.ones_like(o) for o in grads])
                wait_in_flight()
        except Exception as e:  # every rank must hear of it
            error = f"{type(e).__name__}: {e}"
        finally:
            torch.set_rng_state(rng)
            with torch.no_grad():
                for b, before in written:
                    b.copy_(before)
            for p in self.parameters():
                p.grad = None
            for ch in self.chunks:  # offloaded layers' working copies (no parameters of the module)
                for w in ch.body._working:
                    w.copy.grad = None
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        self._raise_failed(errors)

    def _raise_failed(self, errors: list) -> None:
        """The ``PlanError`` every rank raises when some rank's chunks failed (``errors``: each
        rank's error, or None)."""
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            ranks = [r for r, _ in failed]
            raise PlanError(f"pipeline stage(s) on rank(s) {ranks} cannot run their layers ({failed[0][1][:500]}); "
                            "no step was run. Re-plan without pipeline stages (search={'pp': (1,)}) to train this "
                            "model, or report the error")

    # ---- structure --------------------------------------------------------------------------
    def _example(self, mg: ModelGraph, name: str, layout: dict) -> torch.Tensor:
        """An empty tensor shaped as value ``name`` of ``mg`` travels (a user input whole, an
        activation as its canonical local shard)."""
        val = mg.nodes_by_name()[name].meta["val"]
        shape = list(val.shape)
        if name in layout:
            (dp, _tp), placements, _ = layout[name]
            if isinstance(placements[0], Shard):
                shape[0] //= dp
        return torch.empty(shape, dtype=val.dtype, device=self.device, requires_grad=val.dtype.is_floating_point)

    def _crossing(self, bounds: list[int], mg: ModelGraph | None = None) -> list[list[str]]:
        """Per chunk start (and the end), the values crossing it, user inputs first."""
        mg = mg or self.mg
        buffers = {node for p in mg.params.values() if p.is_buffer for node in p.nodes}
        producer = {n: -1 for n in mg.input_names}
        order = list(mg.input_names)
        for i, layer in enumerate(mg.layers):
            for n in layer.output_names:
                producer.setdefault(n, i)
                order.append(n)
        last_reader: dict[str, int] = {}
        for i, layer in enumerate(mg.layers):
            for n in layer.input_names:
                if n not in buffers:
                    last_reader[n] = i
        return [[n for n in dict.fromkeys(order) if producer[n] < b <= last_reader.get(n, -1)] for b in bounds]

    def _layout(self, mg: ModelGraph | None = None) -> dict[str, tuple]:
        """Layer outputs -> (producer's (dp, tp), canonical placements, global shape)."""
        mg, plan = mg or self.mg, self.plan
        by_name = mg.nodes_by_name()
        readers: dict[str, int] = {}
        for layer in mg.layers:
            for n in layer.input_names:
                readers[n] = readers.get(n, 0) + 1
        out = {}
        for i, layer in enumerate(mg.layers):
            lp = plan.layers[i]
            for n in layer.output_names:
                val = by_name[n].meta["val"]
                batch = val.ndim >= 1 and val.is_floating_point() and readers.get(n, 0) == 1 and \
                    (lp.dp > 1 or val.shape[0] > 1)
                out[n] = ((lp.dp, lp.strategy.tp), (Shard(0) if batch else R, R), tuple(val.shape))
        return out

    def _cross_chunk_ties(self) -> list[tuple[str, tuple[int, ...], list[list[tuple[LayerExecutor, str]]]]]:
        """Weights read by layers of several chunks: (fqn, shape, this rank's copies)."""
        chunk_of = {i: c for c, r in enumerate(self.plan.chunk_layers()) for i in r}
        index = {layer.name: i for i, layer in enumerate(self.mg.layers)}
        out = []
        for fqn, info in sorted(self.mg.params.items()):
            if info.is_buffer or len({chunk_of[index[name]] for name in info.layers}) < 2:
                continue
            copies = []
            for ch in self.chunks:
                hits = [(ex, k) for ex in ch.body.executors for k, f in ex.fqn_of_key.items() if f == fqn]
                copies.append(hits)
            out.append((fqn, tuple(info.shape), copies))
        return out

    # ---- training ---------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs) -> torch.Tensor | dict[str, torch.Tensor]:
        """Evaluation, under ``torch.no_grad()``: the mean loss of a batch (the global batch, or
        one of another size or a shorter sequence; each rank's share with ``inputs="local"``)
        through the schedule's forward only, on every rank. With gradients on it is refused: a pipeline's
        backward runs inside its schedule (:meth:`forward_backward`)."""
        if torch.is_grad_enabled():
            raise PlanError("a pipelined plan runs whole steps through its schedule, so pm(batch).backward() cannot "
                            "drive it: call loss = pm.forward_backward(batch) (then clip, step and zero_grad "
                            "yourself) or pm.train_step(batch, optimizer); or plan without pipeline stages "
                            "(search={'pp': (1,)}) to keep a loss.backward() loop. Under torch.no_grad(), "
                            "pm(batch) evaluates the batch's loss")
        batch, outputs = self._call_inputs(inputs, kwargs)
        args = tuple(batch)
        schedule, m = self._schedule_for(args)  # (every rank: each was given the batch)
        args = args if self._first else ()
        losses: list[torch.Tensor] = []
        if self._last is not None:
            self._last.collect = [] if outputs else None
            try:
                schedule.eval(*args, target=torch.zeros(m, device=self.device), losses=losses)
            finally:
                collected, self._last.collect = self._last.collect, None
        else:
            schedule.eval(*args)
        scale = self.scaler.scale if self.scaler is not None else 1.0
        loss = torch.tensor(self._mean_loss(losses) / scale)
        return self._outputs_from_last(loss, collected if self._last is not None else None) if outputs else loss

    def _outputs_from_last(self, loss: torch.Tensor, collected: list | None) -> dict[str, torch.Tensor]:
        """``pm(batch, outputs=True)``: the loss and the model's other outputs by their keys (a
        Hugging Face model's ``logits``), each whole on every rank: the last stage's first rank
        joins its micro-batches' (batched ones concatenated, others averaged) and broadcasts them."""
        src = self.plan.stage_ranks[-1][0]
        names = list(self.mg.extra_output_names)
        joined: list = [None] * len(names)
        if dist.get_rank() == src:
            for k, name in enumerate(names):
                vs = [c[k] for c in collected or ()]
                batched = all(v.ndim >= 1 for v in vs) and (name in self.mg.batched if self.mg.batched else True)
                joined[k] = vs[0] if len(vs) == 1 else torch.cat(vs) if batched else \
                    torch.stack([v.float() for v in vs]).mean(0).to(vs[0].dtype)
        meta: list[list[tuple[tuple, torch.dtype]] | None] = \
            [[(tuple(v.shape), v.dtype) for v in joined] if dist.get_rank() == src else None]
        dist.broadcast_object_list(meta, src=src)
        assert meta[0] is not None  # (broadcast from src)
        out = {self.mg.output_keys.get(n, n): loss for n in self.mg.output_names}
        for k, (name, (shape, dtype)) in enumerate(zip(names, meta[0])):
            t = joined[k].contiguous() if dist.get_rank() == src else torch.empty(shape, dtype=dtype, device=self.device)
            dist.broadcast(t, src=src)
            out[self.mg.output_keys.get(name, name)] = t
        return out

    def train_step(self, batch, optimizer: torch.optim.Optimizer | None, *, max_norm: float | None = None,
                   scheduler=None) -> float:
        """One step on a global batch (full tensors on every rank; a sequence in the model's
        positional order, or a mapping of input names to tensors): the schedule's forward and
        backward over ``num_microbatches`` micro-batches, gradient sync, clipping to ``max_norm``
        when given, ``optimizer.step()``, ``scheduler.step()`` when given, and ``zero_grad()``
        (with ``optimizer=None``: gradients only, left in ``.grad``). Returns the mean loss on
        every rank. The first stage's ranks, which read the batch, compare it on the first step and
        every ``guard.check_every`` steps; a peer that stops answering ends the step with a
        ``RankFailureError`` (:class:`~galvatron_fx.runtime.guard.StepGuard`). ``hooks.step`` run around it."""
        if self.hooks.step:
            return self.hooks.run_step(self._guarded_step, batch, optimizer, max_norm=max_norm, scheduler=scheduler)
        return self._guarded_step(batch, optimizer, max_norm=max_norm, scheduler=scheduler)

    def _guarded_step(self, batch, optimizer: torch.optim.Optimizer | None, *, max_norm: float | None = None,
                      scheduler=None) -> float:
        if self.inputs_mode != "global":  # every rank's share, gathered; the first stage reads the whole
            args = tuple(self.mg.bind_inputs(batch))
            with self.guard.step((args, self.mg.input_names)):
                whole = tuple(self._global_inputs(args))  # (a collective: every rank gathers)
                run = self._schedule_for(whole)
                args = whole if self._first else ()
                return self._train_step(args, optimizer, run, max_norm=max_norm, scheduler=scheduler)
        args = tuple(self.mg.bind_inputs(batch))
        run = self._schedule_for(args)  # (every rank: each was given the global batch)
        args = args if self._first else ()
        with self.guard.step((args, self.mg.input_names) if self._first else None):
            return self._train_step(args, optimizer, run, max_norm=max_norm, scheduler=scheduler)

    def forward_backward(self, batch) -> torch.Tensor:
        """The schedule's forward and backward and the gradient sync, the gradients left in
        ``.grad`` (see :meth:`ParallelModule.forward_backward`); the global mean loss on every rank."""
        return torch.tensor(self._guarded_step(batch, None))

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
        """:meth:`ParallelModule.clip_grad_norm_` over every stage's parameters (collective)."""
        return clip_grad_norm_(self, max_norm, norm_type, error_if_nonfinite)

    def _train_step(self, args: tuple, optimizer: torch.optim.Optimizer | None, run: tuple, *,
                    max_norm: float | None = None, scheduler=None) -> float:
        if not self.syncing and optimizer is not None:
            raise ConfigError("train_step steps the optimizer, so it cannot run inside no_sync(): accumulate "
                              "with pm.forward_backward(batch) there, then step after the last one outside")
        schedule, m = run
        losses: list[torch.Tensor] = []
        if self._last is not None:  # the loss is the last chunk's output: a dummy target per micro-batch
            schedule.step(*args, target=torch.zeros(m, device=self.device), losses=losses)
        else:
            schedule.step(*args)
        scale = self.scaler.scale if self.scaler is not None else 1.0
        if not self.syncing:  # inside no_sync(): the gradients accumulate, unsynced and scaled
            return self._mean_loss(losses) / scale
        self.hooks.run_sync(self.sync_grads)
        scale = self.scaler.scale if self.scaler is not None else 1.0
        ok = self.scaler is None or self.scaler.unscale(list(self.parameters()))  # fp16: skip on overflow
        finish_step(self, optimizer, ok, max_norm, scheduler)
        return self._mean_loss(losses) / scale

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Each chunk's own sync, then weights tied across chunks summed over the pp group."""
        for ch in self.chunks:
            ch.body.sync_grads()
        for _fqn, shape, copies in self._cross_tied:
            total = torch.zeros(shape, device=self.device)
            for hits in copies:  # a chunk's copies are equal after its own sync: count one
                grads = [g for g in (ex.full_grad(k) for ex, k in hits) if g is not None]
                if grads:
                    total += grads[0]
            dist.all_reduce(total, group=self.pp_group)
            for hits in copies:
                for ex, k in hits:
                    ex.set_full_grad(k, total)

    def _mean_loss(self, losses: list[torch.Tensor]) -> float:
        """The global mean loss, on every rank: the last stage reduces its (dp-partial) sum, and
        its first rank shares it with the world."""
        value = torch.zeros((), device=self.device)
        if self._last is not None and losses:
            total = torch.stack([x.detach().float() for x in losses]).sum()
            mesh, placements = self._last.loss_spec or (None, None)
            if mesh is not None:
                total = DTensor.from_local(total, mesh, placements, run_check=False).full_tensor()
            if dist.get_rank() == self.plan.stage_ranks[-1][0]:
                value = total
        dist.all_reduce(value)
        return value.item()

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:  # type: ignore[override]  # (full tensors by FQN: no destination or prefix)
        """Full tensors keyed by the user's FQNs, gathered from every stage (on every rank)."""
        mine: dict[str, torch.Tensor] = {}
        for ch in self.chunks:
            for fqn, t in ch.body.state_dict().items():
                mine.setdefault(fqn, t)
        parts: list[dict | None] = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(parts, mine, group=self.pp_group)
        out: dict[str, torch.Tensor] = {}
        for part in parts:
            for fqn, t in (part or {}).items():  # (every part was gathered)
                out.setdefault(fqn, t)
        return out

    # ---- checkpoints (galvatron_fx.runtime.checkpoint) ----------------------------------------
    def save(self, path, optimizer: torch.optim.Optimizer | None, *, step: int | None = None,
             extra: dict | None = None, overwrite: bool = False):
        """Save parameters, buffers and ``optimizer``'s state to the directory ``path`` in the
        format of :meth:`ParallelModule.save` (each parameter once, a weight tied across stages
        from its first stage), sharded and atomically, with the plan beside them; collective (every
        rank calls it). Any plan or world size, pipelined or not, can load it. A checkpoint of
        another model at ``path`` is replaced only with ``overwrite=True``. See
        :func:`galvatron_fx.runtime.checkpoint.save`."""
        from galvatron_fx.runtime.checkpoint import save

        return save(self, optimizer, path, step=step, extra=extra, overwrite=overwrite)

    def load(self, path, optimizer: torch.optim.Optimizer | None):
        """Load a checkpoint written by :meth:`save` or :meth:`ParallelModule.save` under any plan
        or world size into this rank's chunks (every copy of a weight tied across stages) and
        ``optimizer`` (which may be fresh); collective. Returns a
        :class:`~galvatron_fx.runtime.checkpoint.LoadedCheckpoint` (``step``, ``extra``, ...)."""
        from galvatron_fx.runtime.checkpoint import load

        return load(self, optimizer, path)

    def load_state_dict(self, state_dict, strict: bool = True):  # type: ignore[override]
        """Copy full tensors keyed by the user's FQNs (``state_dict()`` of this module or of the
        plain model, identical on every rank) into this rank's chunks; collective (one gather of
        which parameters each stage holds). Returns ``nn.Module``'s ``_IncompatibleKeys``; raises
        ``ConfigError`` on every rank on shape mismatches, and on missing or unexpected keys when
        ``strict``. See :func:`galvatron_fx.runtime.checkpoint.load_full_state_dict`."""
        from galvatron_fx.runtime.checkpoint import load_full_state_dict

        return load_full_state_dict(self, state_dict, strict=strict)
