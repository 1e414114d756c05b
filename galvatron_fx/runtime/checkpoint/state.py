"""Checkpoints that reshard: save a :class:`ParallelModule` or a pipelined
:class:`~galvatron_fx.runtime.pipeline.PipelineModule` and its optimizer under one plan and world
size, load them under another, pipelined or not (DESIGN §5, "Checkpoints").

Contract: :func:`save` and :func:`load` are collective: every rank of the module's process group
calls them with the same arguments (``extra``: rank 0's value is kept), on a filesystem that every
rank sees at the same path. The optimizer is an ordinary ``torch.optim`` optimizer built over
``pm.parameters()`` after the module, whose per-parameter state is elementwise (tensors of the
parameter's shape, like Adam's ``exp_avg``) or scalar (``step``); it may be fresh (empty state)
when loading. :func:`load_full_state_dict` takes full tensors, identical on every rank.

Terms (*body*, *slot*, *copy*, *layer*, *owner*, *layout*): see :mod:`galvatron_fx.runtime.checkpoint.slots`.

On disk: see :mod:`galvatron_fx.runtime.checkpoint.files` (DCP's files, ``plan.json``,
``trainer_state.pt`` and, written last, ``manifest.json``).

Algorithm (save): every rank gathers each FQN's lowest layer (the owner), its optimizer groups,
non-tensor state, the keys and shapes it holds and any problem (a foreign parameter, unsupported
state) from every rank; rank 0 checks the target (a checkpoint already there must be of the same
model, one :func:`load` would take into this module: the same parameters and buffers by FQN and
shape, whatever plan or world size saved it; another model's is replaced only with
``overwrite=True``, a directory that is not a checkpoint never) and draws a token; every rank
writes the tensors its owner slots (and the whole tensors, below) hold with ``dcp.save`` into the
sibling ``.<name>.tmp-<token>`` (DCP merges the ranks' plans: each key comes from the ranks that
hold it, replicas written once) and hashes its own ``__<rank>_*`` files; the hashes are gathered to rank 0, which writes ``plan.json``,
``trainer_state.pt`` and, last, ``manifest.json`` (each fsynced), then swaps the directory in:
``path -> .<name>.old-<token>``, ``tmp -> path``, removes the old one and any stale siblings of
crashed saves. Until the second rename the previous checkpoint is untouched at ``path``; between
the two renames (a window of two syscalls) ``path`` is missing and :func:`load` falls back to the
``.old-*`` sibling. Errors on any rank are gathered or broadcast, so every rank raises the same
error and none waits in a collective.

Algorithm (load): every rank gathers the keys and global shapes the module expects (the union
over ranks: stages hold different parameters) and the most copies any rank holds; it reads the
manifest, checks every file's size and the sha256 of its round-robin share of the files, reads
DCP's metadata and checks it names exactly those parameters and buffers with their shapes; the
problems of all ranks are gathered, so a damaged checkpoint raises the same ``ConfigError``
everywhere. Missing optimizer state is created (zeros in the slot's layout, scalars from the
metadata's dtype), then ``dcp.load`` fills every tensor this rank holds in place: DCP's planner
reads, for each local shard, the overlapping pieces of the saved shards, whatever plan or world
size wrote them (resharding). Later copies of a tied weight (within a body, or across the bodies
of this rank) are loaded by further ``dcp.load`` calls from the same saved entry, each into its
own layout; every rank makes as many calls as the rank with the most copies. Buffers and the
parameters no layer reads (*whole* tensors: every body holds all of them) are read into the first
body and copied into the others; a checkpoint that lacks such a parameter (saved before they were
kept) leaves the module's value, with a warning.
"""

from __future__ import annotations

import io
import logging
import operator
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import _IncompatibleKeys

from galvatron_fx.errors import ConfigError
from galvatron_fx.runtime.checkpoint.files import (
    DCP_METADATA,
    TRAINER,
    SafeReader,
    check_metadata,
    check_save_target,
    describe_file,
    finish_save,
    read_dcp_metadata,
    resolve_checkpoint,
    some_names,
    verify,
)
from galvatron_fx.runtime.checkpoint.slots import (
    Slot,
    all_slots,
    bodies_of,
    buffers_of,
    copy_whole,
    is_elementwise,
    optimizer_slots,
    reshard_fsdp,
    set_full,
    slot_view,
    unused_params,
    whole_tensors,
)
from galvatron_fx.runtime.guard import guarded

if TYPE_CHECKING:
    from galvatron_fx.ir.plan import ParallelPlan
    from galvatron_fx.runtime.parallel_module import ParallelModule

log = logging.getLogger(__name__)

__all__ = ["save", "load", "load_full_state_dict", "LoadedCheckpoint"]


@dataclass(frozen=True, kw_only=True)
class LoadedCheckpoint:
    """What :func:`load` read besides the tensors."""

    path: Path  # the directory actually read (``path`` or, after a crash mid-swap, its ``.old-*``)
    step: int | None
    extra: Any
    world_size: int  # of the run that saved it
    plan_hash: str  # of the plan that saved it
    resharded: bool  # saved under another plan or world size than the loading module's


# ---- collective agreement ----------------------------------------------------------------------

def _agree(problem: str | None) -> None:
    """Gather every rank's problem (None if fine); raise one ``ConfigError`` on every rank if any."""
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    found = list(dict.fromkeys(p for p in problems if p))
    if found:
        raise ConfigError(found[0] if len(found) == 1 else "; ".join(found))


def _gather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _failure(e: dcp.CheckpointException) -> str:
    """The first failure of a DCP exception, as ``rank r: Type: message``."""
    for rank, failure in sorted(e.failures.items()):
        exc = failure[0] if isinstance(failure, tuple) else failure
        return f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return str(e).splitlines()[0]


def _disk_full(e: dcp.CheckpointException, path: Path) -> str | None:
    """``"the disk is full ..."`` when a rank's failure was a full disk (``ENOSPC``, or the zip
    writer's short write that a full disk causes), else None."""
    import errno

    for failure in e.failures.values():
        exc = failure[0] if isinstance(failure, tuple) else failure
        chain = [exc, getattr(exc, "__cause__", None), getattr(exc, "__context__", None)]
        if any(getattr(x, "errno", None) == errno.ENOSPC for x in chain if x is not None) or \
                any(m in str(exc) for m in ("No space left", "unexpected pos")):
            try:
                free = shutil.disk_usage(path.parent).free
            except OSError:
                free = None
            return "the disk holding it is full" + (f" ({free / 2**20:.0f} MiB free)" if free is not None else "")
    return None


def _from_rank0(value: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---- save --------------------------------------------------------------------------------------

def _owners(slots: list[Slot]) -> dict[str, int]:
    """FQN -> the lowest layer holding it among ``slots``."""
    out: dict[str, int] = {}
    for s in slots:
        out[s.fqn] = min(out.get(s.fqn, s.layer), s.layer)
    return out


def _state_to_save(bodies: list[ParallelModule], optimizer: torch.optim.Optimizer | None,
                   owner: dict[str, int]) -> dict[str, torch.Tensor]:
    """DCP's state dict on this rank: the owner slots it holds (``owner``: FQN -> its lowest layer
    over all ranks; tied copies hold the same values and state), their optimizer tensors, the
    buffers."""
    state: dict[str, torch.Tensor] = {}
    mine = [s for s in all_slots(bodies) if s.layer == owner[s.fqn]]
    for s in mine:
        state[f"model.{s.fqn}"] = slot_view(s, s.param)
    for fqn, b in whole_tensors(bodies).items():
        state[f"model.{fqn}"] = b.detach()
    if optimizer is None:
        return state
    for s in mine:
        p = s.param
        for name, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                # a scalar (a step count) is identical on every rank: DCP writes it once
                state[f"optim.{s.fqn}.{name}"] = slot_view(s, v) if is_elementwise(p, v) else v.detach()
    return state


def _optimizer_values(slot_of: dict[int, Slot], optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """The optimizer's non-tensor state values by ``optim.<fqn>.<name>``; ``ConfigError`` for
    state that is neither elementwise nor scalar."""
    values: dict[str, Any] = {}
    if optimizer is None:
        return values
    for s in slot_of.values():
        p = s.param
        for name, v in optimizer.state.get(p, {}).items():
            if not isinstance(v, torch.Tensor):
                values.setdefault(f"optim.{s.fqn}.{name}", v)
            elif not (is_elementwise(p, v) or (v.ndim == 0 and not isinstance(v, DTensor))):
                raise ConfigError(f"optimizer state {name!r} of {s.fqn} has shape {tuple(v.shape)}, neither the "
                                  f"parameter's local shape {tuple(p.shape)} nor a scalar: checkpoints support "
                                  "optimizers with elementwise state (SGD, Adam, AdamW, ...)")
    return values


def _param_groups(slot_of: dict[int, Slot], optimizer: torch.optim.Optimizer | None) -> list[dict]:
    if optimizer is None:
        return []
    return [{"fqns": sorted({slot_of[id(p)].fqn for p in g["params"]}),
             "hyper": {k: v for k, v in g.items() if k != "params"}} for g in optimizer.param_groups]


def _check_loadable(obj: Any, what: str) -> None:
    """``obj`` survives ``torch.save`` and ``torch.load(weights_only=True)``."""
    try:
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    except Exception as e:  # noqa: BLE001 (pickle and torch raise several kinds)
        raise ConfigError(f"{what} cannot be stored: it must hold only containers, numbers, strings and tensors "
                          f"(torch.load(weights_only=True) refuses it: {str(e).splitlines()[0]}); convert it, "
                          "e.g. a scheduler's state_dict() instead of the scheduler") from None


def _local_for_save(bodies: list[ParallelModule], optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """What this rank contributes to a save's agreement: its owners, groups, values, the keys and
    shapes it holds, or a problem."""
    try:
        slot_of = optimizer_slots(bodies, optimizer)
        return {"owners": _owners(all_slots(bodies)), "groups": _param_groups(slot_of, optimizer),
                "values": _optimizer_values(slot_of, optimizer), "expected": _expected(bodies), "problem": None}
    except ConfigError as e:
        return {"problem": str(e)}
    except Exception as e:  # noqa: BLE001 (any failure must reach every rank)
        return {"problem": f"rank {dist.get_rank()}: {type(e).__name__}: {e}"}


@guarded("checkpoint save")
def save(pm: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike, *,
         step: int | None = None, extra: dict | None = None, overwrite: bool = False) -> Path:
    """Save the parameters and buffers of ``pm`` (a :class:`ParallelModule` or a
    :class:`~galvatron_fx.runtime.pipeline.PipelineModule`) and ``optimizer``'s state to the
    directory ``path``, atomically (see module doc); collective. ``step`` and ``extra`` (rank 0's;
    containers, numbers, strings and tensors) come back from :func:`load`. A checkpoint already at
    ``path`` is replaced when it is of the same model (the same parameters and buffers, under any
    plan or world size); one of another model raises ``ConfigError`` on every rank, with nothing
    written, unless ``overwrite``. Returns ``path``."""
    bodies, plan = bodies_of(pm), cast("ParallelPlan", pm.plan)
    path = Path(path).absolute()
    rank = dist.get_rank()
    if step is not None:
        try:
            step = operator.index(step)
        except TypeError:
            raise ConfigError(f"save(step=...) takes an int, got {type(step).__name__}") from None
    reshard_fsdp(bodies)
    parts = _gather(_local_for_save(bodies, optimizer))
    problems = list(dict.fromkeys(p["problem"] for p in parts if p["problem"]))
    if problems:
        raise ConfigError("; ".join(problems))
    owner: dict[str, int] = {}
    groups: dict[tuple[str, ...], dict] = {}  # dp replicas (and pp == 1 ranks) hold the same groups
    values: dict[str, Any] = {}
    want: dict[str, tuple[int, ...]] = {}  # the keys and shapes of the whole model (stages hold parts)
    for part in parts:
        want |= part["expected"]
        for fqn, layer in part["owners"].items():
            owner[fqn] = min(owner.get(fqn, layer), layer)
        for g in part["groups"]:
            groups.setdefault(tuple(g["fqns"]), g)
        for k, v in part["values"].items():
            values.setdefault(k, v)
    state = _state_to_save(bodies, optimizer, owner)
    scaler = getattr(pm, "scaler", None)  # fp16's loss scale: the same on every rank
    trainer = {"step": step, "extra": extra, "param_groups": list(groups.values()), "optim_values": values,
               "loss_scaler": scaler.state_dict() if scaler is not None else None}
    problem, token = None, None
    if rank == 0:  # the target, and what only rank 0 writes
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            check_save_target(path, want, {f"model.{k}" for k in unused_params(bodies)}, plan.model, overwrite)
            _check_loadable(trainer, "the step, extra and optimizer hyper-parameters")
            token = uuid.uuid4().hex[:12]
        except ConfigError as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 (any failure must reach every rank)
            problem = f"cannot save a checkpoint to {str(path)!r}: {type(e).__name__}: {e}"
    problem, token = _from_rank0((problem, token))
    if problem:
        raise ConfigError(problem)
    tmp = path.parent / f".{path.name}.tmp-{token}"
    try:
        dcp.save(state, storage_writer=FileSystemWriter(tmp, single_file_per_rank=True, sync_files=True))
    except dcp.CheckpointException as e:  # raised on every rank
        full = _disk_full(e, path)
        if rank == 0:  # the unfinished save goes: it is no checkpoint
            shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"saving checkpoint {str(path)!r} failed while writing the shards ({full or _failure(e)}); "
                          "the previous checkpoint at that path is intact and the unfinished save was removed: "
                          + ("free space on that disk, or save elsewhere" if full else
                             "check the disk (space, permissions) and save again")) from None

    # each rank hashes the files it wrote; rank 0 finishes
    mine: dict[str, dict] = {}
    problem = None
    try:
        mine = {f.name: describe_file(f) for f in sorted(tmp.glob(f"__{rank}_*.distcp"))}
    except OSError as e:
        problem = f"saving checkpoint {str(path)!r} failed on rank {rank}: {e}; the previous checkpoint is intact"
    gathered: list[tuple[dict, str | None]] = _gather((mine, problem))
    problems = [p for _, p in gathered if p]
    if problems:
        raise ConfigError(problems[0])
    problem = None
    if rank == 0:
        try:
            finish_save(plan, tmp, path, token, trainer, {k: v for files, _ in gathered for k, v in files.items()}, step)
        except Exception as e:  # noqa: BLE001 (any failure must reach every rank)
            problem = (f"saving checkpoint {str(path)!r} failed on rank 0 ({type(e).__name__}: {e}); the previous "
                       f"checkpoint at that path is intact and {tmp.name} beside it holds the unfinished save "
                       "(the next save removes it)")
    problem = _from_rank0(problem)
    if problem:
        raise ConfigError(problem)
    log.info("saved checkpoint %s (step %s, world size %d)", path, step, dist.get_world_size())
    return path


# ---- load --------------------------------------------------------------------------------------

def _expected(bodies: list[ParallelModule]) -> dict[str, tuple[int, ...]]:
    """``model.<fqn>`` -> global shape, for every parameter and buffer of the bodies on this rank."""
    out = {f"model.{s.fqn}": s.global_shape for s in all_slots(bodies) if s.copy == 0}
    out |= {f"model.{fqn}": tuple(b.shape) for fqn, b in whole_tensors(bodies).items()}
    return out


def _expected_everywhere(bodies: list[ParallelModule]) -> tuple[dict[str, tuple[int, ...]], int]:
    """The keys and shapes the module expects over all ranks (stages hold different parameters),
    and the most copies of one FQN any rank holds (the number of ``dcp.load`` calls); collective."""
    want: dict[str, tuple[int, ...]] = {}
    copies = 1
    for part, n in _gather((_expected(bodies), 1 + max((s.copy for s in all_slots(bodies)), default=0))):
        want |= part
        copies = max(copies, n)
    return want, copies


def _prepare_optimizer_state(slot_of: dict[int, Slot], optimizer: torch.optim.Optimizer, md) -> None:
    """Create the optimizer state entries the checkpoint holds and the optimizer lacks: zeros in
    the parameter's layout (elementwise) or scalars, of the saved dtype; DCP fills them."""
    saved = md.state_dict_metadata
    for s in slot_of.values():
        p = s.param
        prefix = f"optim.{s.fqn}."
        names = [k[len(prefix):] for k in saved if k.startswith(prefix) and "." not in k[len(prefix):]]
        if not names:
            continue
        st = optimizer.state[p]  # a defaultdict: creates the entry
        for name in names:
            tmd = saved[prefix + name]
            if not isinstance(tmd, TensorStorageMetadata):
                continue
            if tuple(tmd.size) == s.global_shape:
                have = st.get(name)
                if not (isinstance(have, torch.Tensor) and is_elementwise(p, have)):
                    st[name] = torch.zeros_like(p.detach(), dtype=tmd.properties.dtype)
            elif len(tmd.size) == 0:
                if not isinstance(st.get(name), torch.Tensor):
                    st[name] = torch.zeros((), dtype=tmd.properties.dtype)
            else:
                raise ConfigError(f"optimizer state {name!r} of {s.fqn} was saved with shape {tuple(tmd.size)}, "
                                  f"neither the parameter's {s.global_shape} nor a scalar; the checkpoint is not "
                                  "loadable into this module")


def _state_to_load(bodies: list[ParallelModule], optimizer: torch.optim.Optimizer | None,
                   slot_of: dict[int, Slot], md, copy: int) -> dict[str, torch.Tensor]:
    """DCP's state dict of every slot number ``copy`` on this rank (and, for copy 0, the whole
    tensors the checkpoint holds); may be empty (this rank holds fewer copies than another)."""
    state: dict[str, torch.Tensor] = {}
    for s in all_slots(bodies):
        if s.copy == copy:
            state[f"model.{s.fqn}"] = slot_view(s, s.param)
    if copy == 0:
        for fqn, b in whole_tensors(bodies).items():
            if f"model.{fqn}" in md.state_dict_metadata:  # (a parameter no layer reads may be absent)
                state[f"model.{fqn}"] = b
    if optimizer is None:
        return state
    saved = md.state_dict_metadata
    for s in slot_of.values():
        if s.copy != copy:
            continue
        for name, v in optimizer.state.get(s.param, {}).items():
            key = f"optim.{s.fqn}.{name}"
            if key not in saved or not isinstance(v, torch.Tensor):
                continue
            state[key] = slot_view(s, v) if is_elementwise(s.param, v) else v
    return state


@torch.no_grad()
@guarded("checkpoint load")
def load(pm: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike, *,
         checksums: bool = True) -> LoadedCheckpoint:
    """Load the checkpoint at ``path`` into ``pm`` (a :class:`ParallelModule` or a
    :class:`~galvatron_fx.runtime.pipeline.PipelineModule`, under its current plan and world size,
    whatever saved it) and ``optimizer`` (may be fresh; its hyper-parameters are restored per
    group, as ``Optimizer.load_state_dict`` does); collective. ``checksums``: verify every file's
    sha256 (the ranks split the reading); sizes are always checked. Raises ``ConfigError`` on
    every rank, with the module untouched, if the checkpoint is incomplete, damaged or for other
    parameters."""
    bodies, plan = bodies_of(pm), cast("ParallelPlan", pm.plan)
    rank, world = dist.get_rank(), dist.get_world_size()
    where = resolve_checkpoint(Path(path).absolute())
    want, copies = _expected_everywhere(bodies)
    optional = {f"model.{k}" for k in unused_params(bodies)}  # the same on every rank
    # read below; past _agree() every rank read them
    manifest: Any
    md: Any
    trainer: Any
    problem, manifest, md, trainer, slot_of = None, None, None, None, {}
    try:
        # what every rank reads before the ranks agree, it checks itself first
        manifest = verify(where, checksums=checksums, share=(rank, world), always=(DCP_METADATA, TRAINER))
        md = read_dcp_metadata(where)
        check_metadata(want, where, md, optional)
        trainer = torch.load(where / TRAINER, weights_only=True)
        slot_of = optimizer_slots(bodies, optimizer)
    except ConfigError as e:
        problem = str(e)
    except Exception as e:  # noqa: BLE001 (an unreadable file must not leave the other ranks waiting)
        problem = (f"checkpoint {str(where)!r} cannot be read on rank {rank} ({type(e).__name__}: {e}); "
                   "the checkpoint is damaged: load an earlier one")
    _agree(problem)

    reshard_fsdp(bodies)
    if optimizer is not None:
        problem = None
        try:
            _prepare_optimizer_state(slot_of, optimizer, md)
        except ConfigError as e:
            problem = str(e)
        _agree(problem)
    reader = SafeReader(where)
    try:
        for c in range(copies):  # every rank as many calls as the rank with the most copies
            dcp.load(_state_to_load(bodies, optimizer, slot_of, md, c), storage_reader=reader)
    except dcp.CheckpointException as e:  # raised on every rank
        raise ConfigError(f"loading checkpoint {str(where)!r} failed while reading the shards ({_failure(e)}); "
                          "the module may be partly loaded: load it again, or an earlier checkpoint") from None
    copy_whole(bodies)
    lacking = sorted(k[6:] for k in optional - set(md.state_dict_metadata))
    if lacking and rank == 0:
        log.warning("checkpoint %s holds no value for %s, which no layer reads (a save of an earlier galvatron_fx "
                    "left them out): they keep the module's values", where, some_names(lacking))

    if optimizer is not None:
        _restore_hyper(optimizer, slot_of, trainer.get("param_groups", []))
        by_fqn: dict[str, list[Slot]] = {}
        for s in slot_of.values():
            by_fqn.setdefault(s.fqn, []).append(s)
        for key, v in trainer.get("optim_values", {}).items():  # non-tensor state, every copy
            fqn, name = key.removeprefix("optim.").rsplit(".", 1)
            for s in by_fqn.get(fqn, []):
                optimizer.state[s.param][name] = v
    scaler = getattr(pm, "scaler", None)
    if scaler is not None and trainer.get("loss_scaler"):  # an fp16 run goes on with its loss scale
        scaler.load_state_dict(trainer["loss_scaler"])
    resharded = manifest["plan_hash"] != plan.plan_hash() or manifest["world_size"] != world
    log.info("loaded checkpoint %s (step %s) saved at world size %d%s", where, manifest.get("step"),
             manifest["world_size"], ", resharded to this plan" if resharded else "")
    return LoadedCheckpoint(path=where, step=trainer.get("step"), extra=trainer.get("extra"),
                            world_size=manifest["world_size"], plan_hash=manifest["plan_hash"], resharded=resharded)


def _restore_hyper(optimizer: torch.optim.Optimizer, slot_of: dict[int, Slot], saved: list[dict]) -> None:
    """Hyper-parameters (lr, betas, ...) of the saved group holding the same FQNs as each current
    group; where the groups were cut otherwise (saved by pipeline stages, loaded without, or the
    reverse), of the saved groups covering its FQNs when they all agree. Other groups keep theirs
    (logged)."""
    by_fqns = {tuple(g["fqns"]): g["hyper"] for g in saved}
    for group in optimizer.param_groups:
        fqns = tuple(sorted({slot_of[id(p)].fqn for p in group["params"]}))
        hyper = by_fqns.get(fqns)
        if hyper is None and fqns:
            covering = [g for g in saved if set(g["fqns"]) & set(fqns)]
            covered = set().union(*(g["fqns"] for g in covering)) >= set(fqns)
            if covered and all(_same_hyper(covering[0]["hyper"], g["hyper"]) for g in covering[1:]):
                hyper = covering[0]["hyper"]
        if hyper is not None:
            group.update(hyper)
        elif saved:
            log.warning("optimizer group of %d parameters matches no saved group: its hyper-parameters are kept",
                        len(fqns))


def _same_hyper(a: dict, b: dict) -> bool:
    def same(x, y) -> bool:
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
            return len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
        return type(x) is type(y) and x == y

    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


# ---- full state dicts --------------------------------------------------------------------------

@torch.no_grad()
def load_full_state_dict(pm: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> _IncompatibleKeys:
    """Copy full tensors (identical on every rank: ``pm.state_dict()``, a plain model's
    ``state_dict()``) into every slot of ``pm`` (a :class:`ParallelModule` or a
    :class:`~galvatron_fx.runtime.pipeline.PipelineModule`: local shards, FSDP shards, each tied
    copy on every stage) and its buffers. Called on every rank; each rank slices its own shards. A
    ``ParallelModule`` communicates nothing; a pipelined module gathers once which parameters the
    other stages hold, so that every rank checks ``state`` against the whole model and raises the
    same errors. Optimizer state is left as it is.

    Keys are the user's FQNs; a tied weight may come under any of its names (all given must be
    equal). Parameters no layer reads are parameters here too (copied whole into every body).
    Buffers are optional: a plain model's ``state_dict()`` omits its non-persistent ones, which
    keep their values. Unknown keys and missing parameters raise ``ConfigError`` when
    ``strict``; shape mismatches always. Returns ``(missing_keys, unexpected_keys)`` like
    ``nn.Module.load_state_dict``.
    """
    bodies, plan = bodies_of(pm), cast("ParallelPlan", pm.plan)
    slots: dict[str, list[Slot]] = {}
    for s in all_slots(bodies):
        slots.setdefault(s.fqn, []).append(s)
    shapes = {fqn: ss[0].global_shape for fqn, ss in slots.items()}  # of every parameter of the model
    if plan.pp > 1:
        for part in _gather(shapes):
            shapes |= part
    unused = unused_params(bodies)  # every body (every stage) holds them all
    names: dict[str, str] = {fqn: fqn for fqn in shapes}  # any name of a parameter -> its FQN
    for info in bodies[0].mg.params.values():
        if info.name in shapes:
            names.update({alias: info.name for alias in info.aliases})
    names.update({fqn: fqn for fqn in unused} | bodies[0]._unused_aliases)
    shapes |= {fqn: tuple(t.shape) for fqn, t in unused.items()}
    buffers = buffers_of(bodies)

    given: dict[str, list[str]] = {}
    for k in state:
        if k in names:
            given.setdefault(names[k], []).append(k)
    missing = sorted(fqn for fqn in shapes if fqn not in given)
    unexpected = sorted(k for k in state if k not in names and k not in buffers)
    problems = [f"{k}: a {type(v).__name__}, not a full tensor" for k, v in state.items()
                if (k in names or k in buffers) and (not isinstance(v, torch.Tensor) or isinstance(v, DTensor))]
    if problems:
        raise ConfigError(f"cannot load the state dict: {'; '.join(problems[:6])}; pass full tensors "
                          "(DTensor.full_tensor(), or pm.state_dict())")
    for fqn, keys in given.items():
        want = shapes[fqn]
        bad = [f"{k}: shape {tuple(state[k].shape)}, the module's is {want}" for k in keys
               if tuple(state[k].shape) != want]
        if not bad and any(not torch.equal(state[keys[0]], state[k]) for k in keys[1:]):
            bad.append(f"{' and '.join(keys)} are one tied weight here but hold different values")
        problems += bad
    problems += [f"{k}: shape {tuple(state[k].shape)}, the module's buffer is {tuple(buffers[k].shape)}"
                 for k in state if k in buffers and k not in names and tuple(state[k].shape) != tuple(buffers[k].shape)]
    if problems:
        raise ConfigError(f"cannot load the state dict: {'; '.join(problems[:6])}"
                          f"{' ...' if len(problems) > 6 else ''}; load weights of the same model configuration")
    if strict and (missing or unexpected):
        raise ConfigError(f"the state dict does not match the module: missing {some_names(missing)}, unexpected "
                          f"{some_names(unexpected)}; pass the full model's state_dict() (its FQNs), or strict=False "
                          "to load the matching keys only")
    reshard_fsdp(bodies)
    for fqn, keys in given.items():
        for s in slots.get(fqn, []):  # this rank's copies
            set_full(s, s.param, state[keys[0]])
        if fqn in unused:
            for body in bodies:
                body._unused_full[fqn].copy_(state[keys[0]])
    for k, v in state.items():
        if k in buffers and k not in names:
            for body in bodies:
                body._buffers_full[k].copy_(v)
    return _IncompatibleKeys(missing, unexpected)
