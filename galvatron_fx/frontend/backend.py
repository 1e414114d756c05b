"""The ``galvatron_fx`` Dynamo backend: ``torch.compile(model, backend="galvatron_fx", options={...})``.

Contract: found under the name ``"galvatron_fx"`` (an installed entry point; see :func:`register`). Dynamo
hands it one FX graph of torch-level ops (parameters and buffers lifted as graph inputs) with
real example inputs; ``options`` (see :class:`BackendOptions`) are ``cluster``,
``global_batch_size``, ``memory_budget``, ``plan`` (a :class:`~galvatron_fx.ir.plan.ParallelPlan`
or a path: *strategy locking*), ``search``, ``dump_dir`` and ``name``. The user's loop is the
ordinary one::

    cmodel = torch.compile(model, backend="galvatron_fx", options={"cluster": cluster})
    opt = torch.optim.AdamW(model.parameters())
    loss = cmodel(idx, targets); loss.backward(); opt.step(); opt.zero_grad()

- One process (no process group, or a group of one): the compiled model *is* eager — the
  backend runs Dynamo's graph as it is (graph breaks allowed). With ``dump_dir`` the graph is
  also captured and written there (pass dumps, the layer table) and, given a ``cluster``, the
  plan it would run on that cluster (``plan.json``, ``plan.txt``: a dry run that can later be
  locked with ``plan=``).
- Under ``torchrun`` (an initialised group of two or more ranks): the graph must be whole (one
  graph that returns the scalar loss). At the first call the backend captures it, plans it (or
  takes ``plan``), builds a :class:`~galvatron_fx.runtime.parallel_module.ParallelModule` over it
  and from then on runs the sharded computation. Inputs: every rank passes the *whole global
  batch*, identical on every rank (the convention of ``ParallelModule.forward``); the returned
  loss is the global mean, the same on every rank.

Limitation — what is sharded and what is not: the *compute* follows the plan (the activations'
data/tensor/sequence-parallel split, per-layer strategies, recomputation), but the *parameters,
their gradients and the optimizer state stay whole on every rank*, as the user holds them (the
user's optimizer steps the user's parameters). ZeRO-2/ZeRO-3 layers are therefore run as plain
data parallel; plans are searched with ``dp_types=("ddp",)``, ``pp=(1,)`` and one micro-batch
(the user's loop owns backward, so there is no gradient accumulation inside a call), and the
replicated state (parameters, gradients and two AdamW moments: four times the parameter bytes)
is taken off the memory budget before the search. For sharded parameters and optimizer state,
micro-batching and ``train_step``, use ``galvatron_fx.compile()``.

Terms (*state input*, *FQN*, *roots*, *shell*): see :mod:`galvatron_fx.frontend.dynamo_graph`.

Algorithm (under ``torchrun``):
1. At compile time: parse the options; map graph inputs to user inputs and state FQNs
   (:class:`GraphSignature`); refuse graphs that end at or resume from a graph break, return
   something other than one scalar, or have dynamic shapes (:func:`check_whole_graph`).
2. At the first call, with real tensors: broadcast the user's parameters and buffers from rank 0
   (as DDP does); build the shell; capture it (``torch.export`` runs the shell through an FX
   interpreter that keeps Dynamo's ``nn_module_stack``, so layers are found as for the eager
   model); search on rank 0 and broadcast the plan (or the error), or check the given plan on
   every rank (same world size, one micro-batch, the same plan on every rank); build the
   ``ParallelModule``.
3. Wire every executor to read the user's parameters (its ``param_source``, which
   :meth:`LayerExecutor.local_params` and the op-by-op path read):
   :class:`_ReadShard` slices this rank's shard ``(Replicate, tp placement)`` of the full
   parameter — a local step — and in backward turns the executor's dp-partial local gradient into
   the full gradient on every rank (sum over dp, all-gather over tp where sharded); autograd then
   accumulates it (summed over the layers that read a tied weight) into the user's ``.grad``.
   The executors' own parameter copies are released: the user's tensors are the only copy.
4. Each call: ``ParallelModule.forward`` on the user inputs with the parameters and buffers
   Dynamo passes in this call; returns ``(loss,)`` as Dynamo's graph does. A call with another
   input shape recompiles (Dynamo's automatic dynamic shapes are switched off in the process at
   the first graph: a plan is for one shape) and is planned and built on its own.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from torch.distributed.tensor.placement_types import Placement

from galvatron_fx.build import plan_on_rank0
from galvatron_fx.cluster import Cluster
from galvatron_fx.errors import CaptureError, ConfigError, PlanError
from galvatron_fx.frontend.dynamo_graph import (
    _USE_COMPILE,
    BACKEND_NAME,
    GraphSignature,
    check_whole_graph,
    source_path,
    to_shell,
)
from galvatron_fx.ir.plan import ParallelPlan
from galvatron_fx.ir.strategy import DPType
from galvatron_fx.search.candidates import SearchSpace

if TYPE_CHECKING:
    from galvatron_fx.runtime.parallel_module import ParallelModule

log = logging.getLogger(__name__)


def ignore_hf_logging() -> None:
    """Let Dynamo trace through Hugging Face's ``logger.warning_once`` (an ``lru_cache``d
    function it cannot trace: a graph break in every causal LM's loss) by ignoring it, as it
    ignores the standard logging calls. Done at import when ``transformers`` is loaded already;
    call it after importing ``transformers`` otherwise."""
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None and hasattr(hf_logging, "warning_once"):
        torch._dynamo.config.ignore_logging_functions.add(hf_logging.warning_once)

__all__ = ["BACKEND_NAME", "BackendOptions", "GraphSignature", "check_whole_graph", "galvatron_fx_backend",
           "parallel_modules", "source_path", "to_shell"]


# ---- options --------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """The backend's ``options=``, checked (see :meth:`parse` for the accepted forms).

    ``search`` is always set: the caller's space (or the default one) constrained to what the
    backend runs — ``pp=(1,)``, ``num_microbatches=(1,)``, ``dp_types=("ddp",)``.
    """

    cluster: Cluster | None = None
    global_batch_size: int | None = None
    memory_budget: int | None = None
    plan: ParallelPlan | None = None
    search: SearchSpace = field(default_factory=lambda: _constrain(SearchSpace()))
    dump_dir: Path | None = None
    name: str = "model"

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """Check ``options`` and turn them into :class:`BackendOptions`; ``ConfigError`` says
        which option is wrong and what it takes.

        ``cluster``: a :class:`Cluster`, a preset name (``"dgx-a100-80g"``) or a cluster JSON
        path; ``plan``: a :class:`ParallelPlan` or a plan JSON path; ``search``: a
        :class:`SearchSpace` or a dict of its fields; ``global_batch_size``: int >= 1;
        ``memory_budget``: bytes per device; ``dump_dir``: a directory; ``name``: a label for
        the captured graph and the plan.
        """
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise ConfigError(f"options for the {BACKEND_NAME} backend must be a dict, got {type(options).__name__}: "
                              f"torch.compile(model, backend={BACKEND_NAME!r}, options={{'cluster': ...}})")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in options if k not in known]
        if unknown:
            close = {k: difflib.get_close_matches(str(k), known, 1) for k in unknown}
            hints = [f"{k!r} (did you mean {close[k][0]!r}?)" if close[k] else repr(k) for k in unknown]
            raise ConfigError(f"unknown option(s) {', '.join(hints)} for the {BACKEND_NAME} backend; "
                              f"it takes: {', '.join(known)}")
        kw: dict[str, Any] = {}
        if (c := options.get("cluster")) is not None:
            kw["cluster"] = _parse_cluster(c)
        for key in ("global_batch_size", "memory_budget"):
            v = options.get(key)
            if v is None:
                continue
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
            if key == "memory_budget":
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                v = int(v) if ok else v
            if not ok:
                what = "a positive number of bytes per device" if key == "memory_budget" else "an int >= 1"
                raise ConfigError(f"option {key}={v!r} for the {BACKEND_NAME} backend: expected {what}")
            kw[key] = v
        if (p := options.get("plan")) is not None:
            if isinstance(p, ParallelPlan):
                kw["plan"] = p
            elif isinstance(p, (str, os.PathLike)):
                kw["plan"] = ParallelPlan.load(p)
            else:
                raise ConfigError(f"option plan= takes a ParallelPlan or the path of a plan JSON file, "
                                  f"got {type(p).__name__}")
            steer = [k for k in ("search", "memory_budget") if options.get(k) is not None]
            if steer:
                raise ConfigError(f"option plan= locks the strategy, but {' and '.join(steer)} only steer a new "
                                  f"search: drop {' and '.join(steer)}, or drop plan= to search")
        search = options.get("search")
        try:
            space = SearchSpace.coerce(search)
        except (TypeError, ValueError) as e:
            fields = ", ".join(f.name for f in dataclasses.fields(SearchSpace))
            raise ConfigError(f"option search={search!r} for the {BACKEND_NAME} backend: {e}; it takes a SearchSpace "
                              f"or a dict of its fields ({fields})") from None
        kw["search"] = _constrain(space)
        if (d := options.get("dump_dir")) is not None:
            if not isinstance(d, (str, os.PathLike)):
                raise ConfigError(f"option dump_dir= takes a directory path, got {type(d).__name__}")
            kw["dump_dir"] = Path(d)
        if (n := options.get("name")) is not None:
            if not isinstance(n, str) or not n:
                raise ConfigError(f"option name= takes a non-empty string, got {n!r}")
            kw["name"] = n
        return cls(**kw)


def _parse_cluster(c: Any) -> Cluster:
    if isinstance(c, Cluster):
        return c
    if isinstance(c, (str, os.PathLike)):
        if Path(c).is_file():
            return Cluster.from_json(c)
        if isinstance(c, str) and not c.lower().endswith(".json"):
            return Cluster.preset(c)  # ConfigError lists the presets
        raise ConfigError(f"option cluster={str(c)!r}: no such cluster JSON file; write one with "
                          "`galvatron-fx profile`, or pass a Cluster or a preset name")
    raise ConfigError(f"option cluster= takes a galvatron_fx.Cluster, a preset name or a cluster JSON path, "
                      f"got {type(c).__name__}; e.g. galvatron_fx.Cluster.local_cpu(world_size) for CPU processes")


def _constrain(space: SearchSpace) -> SearchSpace:
    """The part of ``space`` the backend can run: pp 1, one micro-batch, DDP (see module doc)."""
    if space.pp is not None and 1 not in space.pp:
        raise ConfigError(f"search pp={space.pp}: the {BACKEND_NAME} backend runs plans without pipeline stages; "
                          "drop 'pp' from search (pipelined plans are not supported yet)")
    if space.num_microbatches is not None and 1 not in space.num_microbatches:
        raise ConfigError(f"search num_microbatches={space.num_microbatches}: the {BACKEND_NAME} backend runs the "
                          "global batch as one micro-batch (your loop owns backward); drop 'num_microbatches', "
                          f"or {_USE_COMPILE} and accumulates micro-batches in train_step")
    if DPType.DDP not in space.dp_types:
        raise ConfigError(f"search dp_types={tuple(str(d) for d in space.dp_types)}: under the {BACKEND_NAME} "
                          "backend parameters and optimizer state stay whole on every rank, so only 'ddp' runs; "
                          f"drop 'dp_types', or {_USE_COMPILE}")
    return dataclasses.replace(space, pp=(1,), num_microbatches=(1,), dp_types=(DPType.DDP,))


# ---- the parameter read ----------------------------------------------------------------------

class _ReadShard(torch.autograd.Function):
    """This rank's ``(Replicate, tp_p)`` shard of a full parameter (held whole and equal on
    every rank): a local slice, no communication. Backward: the executor's local gradient is
    dp-partial in the shard's layout (its sum over dp is the shard's gradient); summing over dp
    and all-gathering over tp where sharded gives the full gradient, the same on every rank."""

    @staticmethod
    def forward(ctx, full: torch.Tensor, mesh: DeviceMesh, tp_p: Placement) -> torch.Tensor:
        ctx.mesh, ctx.tp_p, ctx.shape, ctx.stride = mesh, tp_p, full.shape, full.stride()
        if isinstance(tp_p, Replicate):
            return full.view_as(full)
        return distribute_tensor(full.detach(), mesh, [Replicate(), tp_p], src_data_rank=None).to_local()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        d = DTensor.from_local(g.contiguous(), ctx.mesh, (Partial(), ctx.tp_p), run_check=False, shape=ctx.shape,
                               stride=ctx.stride)
        return d.full_tensor(), None, None


# ---- the compiled callables ---------------------------------------------------------------------

_BUILT: list[weakref.ref] = []


def parallel_modules() -> list[ParallelModule]:
    """The :class:`~galvatron_fx.runtime.parallel_module.ParallelModule` s the backend has built
    in this process and that are still in use, oldest first (to inspect their plans)."""
    out = []
    for r in _BUILT:
        runner = r()
        if runner is not None and runner.pm is not None:
            out.append(runner.pm)
    return out


def _world() -> int:
    """Ranks of the job: 1 without a process group, or with the planner's ``fake`` stand-in group
    (``search.node_strategies`` initialises one for DTensor's strategy functions)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "fake":
        return 1
    return dist.get_world_size()


def _graph_dir(opts: BackendOptions, gm: fx.GraphModule) -> Path | None:
    if opts.dump_dir is None:
        return None
    cid = str(gm.meta.get("dynamo_compile_id", "0/0")).replace("/", "_")
    return opts.dump_dir / f"graph_{cid}"


def _global_batch(inputs: Sequence[torch.Tensor], opts: BackendOptions) -> int:
    batched = [x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.ndim >= 1]
    if not batched:
        raise CaptureError("the compiled call has no batched tensor input to split over data-parallel ranks")
    gbs = batched[0]
    if opts.global_batch_size is not None and opts.global_batch_size != gbs:
        raise ConfigError(f"option global_batch_size={opts.global_batch_size}, but the inputs hold {gbs} samples: "
                          "every rank passes the whole global batch (identical on every rank) to the compiled model; "
                          f"pass batches of {opts.global_batch_size} samples or drop the option")
    return gbs


def _search(mg, cluster: Cluster, gbs: int, opts: BackendOptions, world: int | None = None) -> ParallelPlan:
    """A plan the backend runs (``opts.search`` is constrained), with the replicated parameter,
    gradient and AdamW state taken off the budget (see module doc)."""
    import galvatron_fx as gfx
    from galvatron_fx.report.inspect import fmt_bytes

    if world is not None and cluster.world_size != world:
        raise PlanError(f"the cluster describes {cluster.world_size} devices, this job has {world}: pass a cluster "
                        f"of {world} devices (e.g. Cluster.local_cpu({world}), or a preset with the right node count)")
    budget = opts.memory_budget or cluster.min_memory_bytes()
    replicated = sum(p.nbytes * (4 if p.requires_grad else 1) for p in mg.params.values() if not p.is_buffer)
    if replicated >= budget:
        raise PlanError(f"the replicated parameters, gradients and AdamW state alone take {fmt_bytes(replicated)} "
                        f"per device, over the {fmt_bytes(budget)} budget: under the {BACKEND_NAME} backend they stay "
                        f"whole on every rank; {_USE_COMPILE}")
    log.info("planning with %s of the %s budget: %s of replicated parameters, gradients and AdamW state held apart",
             fmt_bytes(budget - replicated), fmt_bytes(budget), fmt_bytes(replicated))
    return gfx.plan(mg, cluster, global_batch_size=gbs, memory_budget=budget - replicated, search=opts.search,
                    name=opts.name)


def _search_on_rank0(mg, cluster: Cluster, gbs: int, opts: BackendOptions) -> ParallelPlan:
    """Search on rank 0 and broadcast the plan, or the error (:func:`plan_on_rank0`)."""
    return plan_on_rank0(lambda: _search(mg, cluster, gbs, opts, dist.get_world_size()))


def _write_dumps(d: Path, mg, plan: ParallelPlan | None) -> None:
    from galvatron_fx.report.inspect import format_layer_table

    d.mkdir(parents=True, exist_ok=True)
    (d / "layers.txt").write_text(format_layer_table(mg) + "\n")
    if plan is not None:
        plan.save(d / "plan.json")
        (d / "plan.txt").write_text(plan.explain() + "\n")


class _Eager:
    """One process: Dynamo's graph as it is; with ``dump_dir``, the graph (and, given a cluster,
    the plan for it) written once, at the first call. A dump that fails is logged and skipped:
    it never changes what runs."""

    def __init__(self, gm: fx.GraphModule, opts: BackendOptions):
        self.gm, self.opts = gm, opts
        self.dumped = False

    def __call__(self, *args):
        if not self.dumped:
            self.dumped = True
            try:
                self._dump(args)
            except Exception as e:  # a debugging aid must not break the run
                log.warning("%s backend: could not dump the graph to %s (%s: %s); running it eagerly anyway",
                            BACKEND_NAME, self.opts.dump_dir, type(e).__name__, e)
        return self.gm.forward(*args)

    def _dump(self, args) -> None:
        from galvatron_fx.frontend.capture import capture

        d = cast(Path, _graph_dir(self.opts, self.gm))  # dumped with a dump_dir
        sig = GraphSignature.of(self.gm, args)
        if sig.unmapped:
            raise CaptureError(f"graph inputs {list(sig.unmapped)} are not module state or call inputs")
        inputs = [args[i] for i in sig.inputs]
        mg = capture(to_shell(self.gm, sig, args), inputs, name=self.opts.name, dump_dir=d / "passes")
        plan = None
        if self.opts.cluster is not None:
            plan = _search(mg, self.opts.cluster, _global_batch(inputs, self.opts), self.opts)
        _write_dumps(d, mg, plan)
        log.info("%s backend: wrote the graph%s to %s", BACKEND_NAME, " and its plan" if plan else "", d)


class _Parallel:
    """Under ``torchrun``: build the ParallelModule at the first call, then run it (module doc,
    steps 2-4)."""

    def __init__(self, gm: fx.GraphModule, sig: GraphSignature, opts: BackendOptions):
        self.gm, self.sig, self.opts = gm, sig, opts
        self.pm: ParallelModule | None = None
        self.plan: ParallelPlan | None = None
        self._current: dict[str, torch.Tensor] = {}
        self._buffers: list[tuple[int, str]] = []
        _BUILT[:] = [r for r in _BUILT if r() is not None] + [weakref.ref(self)]

    def __call__(self, *args):
        if self.pm is None:
            self._build(args)
        for i, fqn in self.sig.state:
            self._current[fqn] = args[i]
        for i, fqn in self._buffers:  # buffers are read whole, in their current value
            self.pm._buffers_full[fqn] = args[i]
        inputs = [args[i] for i in self.sig.inputs]
        if not self.pm.mg.extra_output_names:
            return (self.pm(*inputs),)
        return self.pm.forward_all(*inputs)  # the loss, and the other outputs gathered whole

    def _build(self, args) -> None:
        from galvatron_fx.build import check_same_plan
        from galvatron_fx.frontend.capture import capture
        from galvatron_fx.runtime.parallel_module import ParallelModule

        world, rank = dist.get_world_size(), dist.get_rank()
        opts = self.opts
        inputs = [args[i] for i in self.sig.inputs]
        gbs = _global_batch(inputs, opts)
        with torch.no_grad():  # the user's state is replicated: start from rank 0's, as DDP does
            for i, _ in self.sig.state:
                if isinstance(args[i], torch.Tensor):
                    dist.broadcast(args[i].data, src=0)
        shell = to_shell(self.gm, self.sig, args)
        d = _graph_dir(opts, self.gm) if rank == 0 else None
        mg = capture(shell, inputs, name=opts.name, dump_dir=None if d is None else d / "passes")
        plan = opts.plan if opts.plan is not None else _search_on_rank0(mg, cast(Cluster, opts.cluster), gbs, opts)
        plan = _runnable(plan, world, gbs)
        check_same_plan(plan)
        self.pm = ParallelModule(shell, mg, plan)
        self.pm.sync_on_backward = False  # the user's own parameters take the gradients (_ReadShard)
        self.plan = plan
        buffers = dict(shell.named_buffers())
        self._buffers = [(i, fqn) for i, fqn in self.sig.state if fqn in buffers and fqn in self.pm._buffers_full]
        for ex in self.pm.executors:
            self._wire(ex)
        if d is not None:
            _write_dumps(d, mg, plan)
        if rank == 0:
            log.info("%s backend: %s on %d ranks, %s; compute sharded as planned, parameters, gradients and "
                     "optimizer state whole on every rank (galvatron_fx.compile() shards them)", BACKEND_NAME,
                     plan.model, world,
                     ", ".join(f"{lp.name} dp{lp.dp}·tp{lp.strategy.tp}" for lp in plan.layers))

    def _wire(self, ex) -> None:
        """Make ``ex`` read the user's parameters (module doc, step 3)."""
        specs = [(ex.fqn_of_key[k], ex._meta[k][0]) for k in ex.params]
        ex.param_source = functools.partial(self._shards, ex.mesh, specs)
        for k, p in list(ex.params.items()):  # the user's tensors are the only copy
            ex.params[k] = nn.Parameter(torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False)

    def _shards(self, mesh: DeviceMesh, specs: list[tuple[str, Placement]]) -> list[torch.Tensor]:
        return [_ReadShard.apply(self._current[fqn], mesh, tp_p) for fqn, tp_p in specs]


def _runnable(plan: ParallelPlan, world: int, gbs: int) -> ParallelPlan:
    """``plan`` checked against the job and made runnable here: ZeRO and offloaded layers run as
    DDP on the device (logged)."""
    if plan.world_size != world:
        raise PlanError(f"plan {plan.model!r} was made for world size {plan.world_size}, this job has {world}: "
                        f"launch with torchrun --nproc-per-node {plan.world_size}, or re-plan for {world} devices")
    if plan.num_microbatches != 1:
        raise PlanError(f"plan {plan.model!r} has {plan.num_microbatches} micro-batches; the {BACKEND_NAME} backend "
                        "runs the global batch as one (your loop owns backward): re-plan with "
                        f"search={{'num_microbatches': (1,)}}, or {_USE_COMPILE} and accumulates micro-batches")
    if plan.global_batch_size != gbs:
        raise PlanError(f"plan {plan.model!r} is for a global batch of {plan.global_batch_size} samples, but the "
                        f"compiled model got {gbs}: every rank passes the whole global batch; pass "
                        f"{plan.global_batch_size} samples per call or re-plan")
    zero = [lp.name for lp in plan.layers if lp.strategy.dp_type != DPType.DDP or lp.strategy.offload]
    if not zero:
        return plan
    if dist.get_rank() == 0:
        log.warning("%s backend: layers %s are planned with ZeRO or CPU offload; they run as plain data parallel "
                    "on the device here (parameters and optimizer state stay whole on every rank; numerics are the "
                    "same, memory is not): %s",
                    BACKEND_NAME, zero, _USE_COMPILE)
    layers = tuple(dataclasses.replace(lp, strategy=dataclasses.replace(lp.strategy, dp_type=DPType.DDP, offload=False))
                   for lp in plan.layers)
    return dataclasses.replace(plan, layers=layers)


# ---- the registered backend ---------------------------------------------------------------------

def galvatron_fx_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                         options: Mapping[str, Any] | None = None, mode: str | None = None) -> Callable:
    """The Dynamo backend (see module doc): eager in one process, the planned parallel module
    under ``torchrun``."""
    opts = BackendOptions.parse(options)
    if mode not in (None, "default"):
        log.warning("%s backend: mode=%r is ignored; steer it through options=", BACKEND_NAME, mode)
    if _world() == 1:
        return gm.forward if opts.dump_dir is None else _Eager(gm, opts)
    if opts.plan is None and opts.cluster is None:
        raise ConfigError(f"under torchrun the {BACKEND_NAME} backend needs options={{'cluster': ...}} to plan "
                          "(a galvatron_fx.Cluster, a preset name or a cluster JSON; Cluster.local_cpu(world_size) "
                          "for CPU processes) or options={'plan': ...} to run a saved plan")
    sig = GraphSignature.of(gm, example_inputs)
    check_whole_graph(gm, example_inputs, sig)
    _static_recompiles()
    return _Parallel(gm, sig, opts)


def _static_recompiles() -> None:
    """Dynamo's *automatic* dynamic shapes off in this process (a plan is for one shape): a call
    with another batch or sequence length then recompiles a static graph, which the backend plans
    and builds on its own, instead of handing it one with symbolic sizes. ``torch.compile(...,
    dynamic=True)`` still asks for symbolic sizes, and is refused by :func:`check_whole_graph`."""
    import torch._dynamo.config as dynamo_config

    if dynamo_config.automatic_dynamic_shapes:
        dynamo_config.automatic_dynamic_shapes = False
        log.info("%s backend: Dynamo's automatic dynamic shapes are off in this process: each new input shape "
                 "compiles, plans and builds once (up to torch._dynamo.config.recompile_limit shapes)", BACKEND_NAME)


def _entry_point_declared() -> bool:
    """Whether the installed package declares the ``torch_dynamo_backends`` entry point (then
    Dynamo registers the backend itself on first lookup, importing this module to do so)."""
    from importlib.metadata import entry_points

    try:
        return any(ep.name == BACKEND_NAME and ep.value.startswith(__name__ + ":")
                   for ep in entry_points(group="torch_dynamo_backends"))
    except Exception:  # broken metadata: register by hand
        return False


def register() -> None:
    """Make ``torch.compile(..., backend="galvatron_fx")`` find :func:`galvatron_fx_backend`
    (idempotent). An installed package declares it as a ``torch_dynamo_backends`` entry point,
    which Dynamo loads on first lookup (``import galvatron_fx`` need not import torch); a
    source tree without that metadata registers it here."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if not _entry_point_declared() and BACKEND_NAME not in _COMPILER_FNS:
        register_backend(galvatron_fx_backend, name=BACKEND_NAME)
    ignore_hf_logging()


register()
