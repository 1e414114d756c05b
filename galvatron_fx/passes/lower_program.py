"""lower — a plan applied to a captured model by graph passes: the program the runtime executes.

Contract: :func:`lower` takes a :class:`~galvatron_fx.ir.graph.ModelGraph` captured at the
plan's per-micro-batch global shape and a :class:`~galvatron_fx.ir.plan.ParallelPlan`; returns a
:class:`~galvatron_fx.ir.program.LoweredProgram`. It needs no process group: without
``mesh_of``, layers are laid out on meshes of a stand-in ("fake") process group in this
process, as rank 0 sees them; the runtime passes its real meshes (``mesh_of(stage, dp, tp)``)
and gets this rank's program. Nothing is sent anywhere and the captured graph is not changed;
with ``dump_dir`` the runner writes every pass's graphs before and after under it.

Algorithm: per distinct (layer kind, placements, recomputation, ``(dp, tp)``, dtype) one
:class:`~galvatron_fx.ir.program.LayerGraphs`, made by the layer passes in order, each checked
by the runner (:mod:`galvatron_fx.passes.runner`):

1. ``apply_placements`` — the layer laid out as the plan says and traced with DTensor into the
   joint forward-backward graph of local ops and functional collectives;
2. ``tag_recompute`` — a selectively recomputed layer's forward ops tagged with the policy;
3. ``partition_graphs`` — forward and backward (a selective layer's backward makes the tagged
   values again);
4. ``clean_up_graphs`` — no dead ops or identity views; the collectives recorded;
5. ``hoist_saved_collectives`` — small saved-value all-reduces taken out of the backward, to be
   launched from forward;
6. ``fold_input_reductions`` — a dp sum of an exact count over a user input (a mean loss's
   count of targets) computed from the whole input, which every rank holds: no collective;
7. ``schedule_collectives`` — each collective issued as soon as its inputs exist and waited for
   where its result is first read;
8. ``mark_recompute`` — the backward of a fully recomputed layer with its forward ops again.

Then the program passes: ``bucket_gradients`` (the fused data-parallel communication: DDP
buckets, FSDP gathers and reduce-scatters per layer) and ``split_stages`` (per stage, the step
graph with its pipeline sends and receives). A plan whose saved placements do not name this
torch's decomposed nodes is re-solved by ``resolve(layer, decomposed, strategy)`` when given
(:func:`galvatron_fx.compile` passes one that solves on the plan's own cluster, with a
warning), else refused with a :class:`~galvatron_fx.errors.PlanError`.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from galvatron_fx.errors import PlanError
from galvatron_fx.ir.graph import ModelGraph
from galvatron_fx.ir.placements import check_layer_placements
from galvatron_fx.ir.program import LayerGraphs, LoweredLayer, LoweredProgram, LoweringKey
from galvatron_fx.ir.strategy import LAYER_MESH_DIMS
from galvatron_fx.passes.apply_placements import apply_placements_pass, option_from_plan
from galvatron_fx.passes.bucket_gradients import bucket_gradients_pass
from galvatron_fx.passes.clean_up_graphs import clean_up_graphs_pass
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer, decomposed_kind
from galvatron_fx.passes.fold_input_reductions import fold_input_reductions_pass
from galvatron_fx.passes.hoist_saved_collectives import hoist_saved_collectives_pass
from galvatron_fx.passes.mark_recompute import mark_recompute_pass, tag_recompute_pass
from galvatron_fx.passes.partition_graphs import partition_graphs_pass
from galvatron_fx.passes.runner import PassContext, run_passes
from galvatron_fx.passes.schedule_collectives import schedule_collectives_pass
from galvatron_fx.passes.split_stages import split_stages_pass
from galvatron_fx.passes.state_writes import stateful_kinds

log = logging.getLogger(__name__)

__all__ = ["LAYER_PASSES", "PROGRAM_PASSES", "fake_mesh", "init_stand_in_group", "lower", "lower_layer"]

LAYER_PASSES = (apply_placements_pass, tag_recompute_pass, partition_graphs_pass, clean_up_graphs_pass,
                hoist_saved_collectives_pass, fold_input_reductions_pass, schedule_collectives_pass, mark_recompute_pass)
PROGRAM_PASSES = (bucket_gradients_pass, split_stages_pass)

_FAKE_MESHES: dict[tuple[int, int], object] = {}
_FAKE_WORLD = 1 << 16


class _StandInNoise(logging.Filter):
    """Drops DTensor's CPU-alltoall note while the process group is the stand-in one."""

    def filter(self, record: logging.LogRecord) -> bool:
        import torch.distributed as dist

        return not (dist.is_initialized() and dist.get_backend() == "fake" and "alltoall" in record.getMessage())


def init_stand_in_group() -> None:
    """This process's stand-in ("fake") process group of ``2**16`` ranks, for laying layers out
    with no real peers (planning, lowering without meshes). Its errors are not a rank's: torch's
    ``[rank0]:`` prefix on every traceback line is undone, and DTensor's note that CPU groups
    lack alltoall (about real ones) is dropped."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=_FAKE_WORLD)
    sys.excepthook = hook
    logging.getLogger("torch.distributed.tensor._collective_utils").addFilter(_StandInNoise())


def fake_mesh(dp: int, tp: int):
    """A ``(dp, tp)`` mesh of the stand-in process group (created if this process has none)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if (dp, tp) in _FAKE_MESHES:
        return _FAKE_MESHES[(dp, tp)]
    if not dist.is_initialized():
        init_stand_in_group()
    elif dist.get_backend() != "fake":
        raise PlanError("lowering without meshes needs a process with no process group (it makes a stand-in "
                        "one); in a distributed job, pass mesh_of=, or let galvatron_fx.compile() lower")
    if dp * tp > dist.get_world_size():
        raise PlanError(f"dp={dp} × tp={tp} is larger than the stand-in process group ({dist.get_world_size()})")
    mesh = DeviceMesh("cpu", torch.arange(dp * tp).view(dp, tp), mesh_dim_names=tuple(str(a) for a in LAYER_MESH_DIMS))
    _FAKE_MESHES[(dp, tp)] = mesh
    return mesh


def _param_fqns(mg: ModelGraph, dl: DecomposedLayer) -> list[str]:
    """The FQNs of the parameters a layer's graphs take, in their order (a tied one once)."""
    fqn_of = {node: fqn for fqn, p in mg.params.items() for node in p.nodes}
    out: list[str] = []
    for name, role in zip(dl.input_names, dl.input_roles):
        fqn = fqn_of.get(name, name)
        if role == "param" and fqn not in out:
            out.append(fqn)
    return out


def _compute_dtype(plan) -> torch.dtype | None:
    """The dtype parameters are read in and activations kept in, where not fp32."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(getattr(plan, "precision", "fp32")))


def lower_layer(mg: ModelGraph, layer, option, strategy, mesh, *, decomposed: DecomposedLayer | None = None,
                compute_dtype: torch.dtype | None = None, dump_dir: Path | None = None,
                key: LoweringKey | None = None) -> LayerGraphs:
    """One layer under ``option`` and ``strategy`` on ``mesh``, lowered by :data:`LAYER_PASSES`;
    ``compute_dtype`` (mixed precision: ``mg`` captured in it): parameters are fp32, read in it."""
    dl = decomposed or decompose_layer(mg, layer)
    fqns = {node: fqn for fqn, p in mg.params.items() for node in p.nodes}
    prog = LayerGraphs(name=layer.name, kind=layer.kind, key=key, decomposed=dl, option=option, strategy=strategy,
                       fqns=fqns, compute_dtype=compute_dtype,
                       param_dtype=torch.float32 if compute_dtype is not None else None)
    ctx = PassContext(graph=mg, mesh=mesh, dump_dir=dump_dir, produced={"decomposed"})
    prog = run_passes(LAYER_PASSES, prog, ctx)
    prog.timings_s = dict(ctx.timings_s)
    return prog


def _lowerings(mg: ModelGraph) -> dict:
    """The layer lowerings made for ``mg``, kept on its graph module (they live as long as it):
    a layer's graphs depend only on its kind, placements, recompute, mesh, dtype and which
    values are batched, all in the key."""
    return mg.gm.meta.setdefault("gfx_lowered_layers", {})


def _mesh_key(mesh) -> tuple:
    """A mesh by what its lowered graphs name: its device type, ranks and process groups."""
    return (mesh.device_type, tuple(mesh.mesh.flatten().tolist()),
            tuple(mesh.get_group(i).group_name for i in range(mesh.ndim)))


def lower(mg: ModelGraph, plan, *, mesh_of: Callable | None = None, dump_dir: str | Path | None = None,
          resolve: Callable | None = None, layers=None) -> LoweredProgram:
    """The program ``plan`` runs on ``mg`` (see module doc); ``layers``: only these layer
    indices (a pipeline chunk), else all."""
    t0 = time.perf_counter()
    if len(plan.layers) != len(mg.layers) or any(lp.name != l.name for lp, l in zip(plan.layers, mg.layers)):
        raise PlanError(f"plan {plan.model!r} names other layers than the captured model: "
                        f"{[lp.name for lp in plan.layers][:6]} vs {[l.name for l in mg.layers][:6]}; re-plan")
    coupled = mg.coupled()
    if plan.num_microbatches > 1 and coupled:
        name, node = next(iter(coupled.items()))
        raise PlanError(f"plan {plan.model!r} splits each step into {plan.num_microbatches} micro-batches, but layer "
                        f"{name} couples samples (its value {node} holds the batch in two dims: a contrastive loss "
                        "over a micro-batch is not the batch's loss); re-plan (the search keeps such a model to one "
                        "micro-batch per step), or give a plan with num_microbatches=1")
    recomputed = [(lp, layer) for lp, layer in zip(plan.layers, mg.layers) if str(lp.strategy.recompute) != "none"]
    for lp, layer in recomputed:
        if layer.kind in stateful_kinds(mg):
            raise PlanError(f"plan {plan.model!r} recomputes layer {layer.name} ({lp.strategy.recompute}), which "
                            "writes state in place (BatchNorm's running statistics): a recomputation would write it "
                            "twice; re-plan (the search never recomputes such a layer), or give it recompute='none'")
    dump = Path(dump_dir) if dump_dir is not None else None
    mesh_of = mesh_of or (lambda stage, dp, tp: fake_mesh(dp, tp))
    dtype = _compute_dtype(plan)
    program = LoweredProgram(plan=plan)
    decomposed: dict[str, DecomposedLayer] = {}
    for i in (range(len(mg.layers)) if layers is None else layers):
        layer, lp = mg.layers[i], plan.layers[i]
        st = lp.strategy
        if layer.kind not in decomposed:
            decomposed[layer.kind] = decomposed_kind(mg, layer)
        # layers of one kind share the traced graph; only the names of their inputs differ
        dl = dataclasses.replace(decomposed[layer.kind], input_names=[a.name for a in mg.layer_inputs(layer)])
        check_layer_placements(lp.name, lp.placements, dl.gm)
        option = option_from_plan(dl, layer.kind, st, lp.placements)
        source = "plan" if lp.placements else "tp1"
        if option is None:
            source = "re-solved"
            if resolve is None:
                missing = sorted(set(n.name for n in dl.gm.graph.nodes if n.op != "output") - set(lp.placements))[:4]
                raise PlanError(f"layer {lp.name}: the plan's placements do not name this torch's decomposed nodes "
                                f"(missing e.g. {missing}); re-plan with this torch, or compile the plan, which "
                                "re-solves the layer on the plan's cluster")
            option = resolve(layer, dl, st)
        mesh = mesh_of(lp.stage, lp.dp, st.tp)
        # (which inputs are the user's: the forward may take those whole, fold_input_reductions)
        users = tuple(i for i, (n, r) in enumerate(zip(dl.input_names, dl.input_roles))
                      if r != "param" and n in mg.input_names)
        key = LoweringKey(kind=layer.kind, placements=tuple(sorted(option.placements.items())),
                          recompute=str(st.recompute), dp=lp.dp, tp=st.tp, compute_dtype=str(dtype),
                          user_inputs=users, mesh_id=id(mesh))
        if key not in program.layer_graphs:
            # lowerings of this graph are kept with it (another plan of the same model reuses
            # those it shares), unless this lowering dumps its passes
            shared = _lowerings(mg) if dump is None else {}
            gkey = key.across_meshes(_mesh_key(mesh), tuple(sorted(mg.batched)))
            if gkey not in shared:
                sub = dump / "passes" / layer.name if dump is not None else None
                shared[gkey] = lower_layer(mg, layer, option, st, mesh, decomposed=dl, compute_dtype=dtype,
                                           dump_dir=sub, key=key)
            program.layer_graphs[key] = shared[gkey]
        program.layers.append(LoweredLayer(name=lp.name, kind=layer.kind, stage=lp.stage, strategy=st, dp=lp.dp,
                                           graphs=program.layer_graphs[key], param_names=_param_fqns(mg, dl),
                                           option_source=source))
    ctx = PassContext(graph=mg, plan=plan, dump_dir=dump / "passes" if dump is not None else None,
                      produced={"lowered"})
    program = run_passes(PROGRAM_PASSES, program, ctx)
    program.timings_s = {"total": time.perf_counter() - t0, **ctx.timings_s}
    return program
