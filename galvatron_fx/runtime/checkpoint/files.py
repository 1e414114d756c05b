"""The on-disk side of a checkpoint (:mod:`galvatron_fx.runtime.checkpoint`): the directory's
files, their manifest, and the atomic swap of a finished save into place. No process group is
needed here except by :func:`finish_save` (rank 0 of a save).

Contract: :func:`verify` and :func:`read_manifest` take any path and raise ``ConfigError`` (what
is wrong, what to do) for a missing, unfinished, damaged or forged checkpoint; they read only the
plain file names the manifest lists, of regular files inside the directory.
:func:`read_dcp_metadata` unpickles DCP's ``.metadata`` through an allow-list of DCP's own record
classes, so a forged file runs no code; :class:`SafeReader` is DCP's file reader using it.

On disk (one directory, DCP's files plus three of ours)::

    __<rank>_<i>.distcp, .metadata   DCP: ``model.<fqn>`` (each FQN once, from its owner slot, as
                                     a DTensor in its layout), ``model.<buffer fqn>`` and
                                     ``model.<fqn>`` of a parameter no layer reads (plain,
                                     replicated), ``optim.<fqn>.<state>`` (elementwise state as
                                     DTensors like the parameter; scalars such as ``step`` plain)
    plan.json                        the plan that wrote it (``ParallelPlan.to_json``)
    trainer_state.pt                 step, extra, the optimizer's hyper-parameters per group of
                                     every rank (matched by FQNs on load), non-tensor state values
                                     and fp16's loss scale
    manifest.json                    written last: format, version, world size, plan hash, step,
                                     every other file with its size in bytes and sha256

Terms: the *target* is the directory a save replaces; a *sibling* is ``.<name>.tmp-<token>`` (a
save being written) or ``.<name>.old-<token>`` (the previous checkpoint during the swap).

Algorithm (finishing a save, rank 0, :func:`finish_save`): write ``plan.json``, ``trainer_state.pt``
and, last, ``manifest.json`` into the temporary sibling, each fsynced; then ``path ->
.old-<token>``, ``tmp -> path``, fsync the parent, remove the old one and any stale siblings of
crashed saves. :func:`resolve_checkpoint` falls back to a complete ``.old-*`` sibling when ``path`` is
missing (a crash between the two renames).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import shutil
import time
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from galvatron_fx.cluster.limits import MAX_MANIFEST_BYTES, read_json
from galvatron_fx.errors import ConfigError

if TYPE_CHECKING:
    from galvatron_fx.ir.plan import ParallelPlan

log = logging.getLogger(__name__)

__all__ = ["read_manifest", "read_dcp_metadata", "verify", "FORMAT", "VERSION", "MANIFEST", "PLAN", "TRAINER",
           "step_checkpoints", "newest_checkpoint", "prune_steps"]

FORMAT = "galvatron_fx.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
PLAN = "plan.json"
TRAINER = "trainer_state.pt"
DCP_METADATA = ".metadata"


# ---- files -------------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def describe_file(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory; the renames are still ordered
        _fsync_file(path)


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _write_manifest(directory: Path, manifest: dict) -> None:
    """The last file of a save: a directory without it is an unfinished save."""
    _write_json(directory / MANIFEST, manifest)


STEP_PREFIX = "step-"  # a run's checkpoint directory holds one checkpoint per saved step: step-<N>


def step_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """A run's checkpoint directory: ``(step, path)`` of each ``step-<N>`` checkpoint in it,
    newest first (and the directory itself when it is one checkpoint, an earlier layout).
    Refuses, naming them, files that are neither (a directory of something else is never
    trained into and then refused at the end): ``ConfigError``. Hidden names (an unfinished or
    replaced save's ``.step-<N>.tmp-*``/``.old-*``) are left alone."""
    d = Path(directory)
    if not d.exists():
        return []
    if not d.is_dir():
        raise ConfigError(f"checkpoint.dir {str(d)!r} is a file; give a directory")
    found, other = [], []
    for p in sorted(d.iterdir()):
        if p.name.startswith("."):
            continue
        tail = p.name[len(STEP_PREFIX):]
        if p.is_dir() and p.name.startswith(STEP_PREFIX) and tail.isdigit():
            found.append((int(tail), p))
        elif p.name not in (MANIFEST, PLAN, TRAINER) and not p.name.endswith(".distcp") and p.name != ".metadata":
            other.append(p.name)
    if (d / MANIFEST).exists():  # the directory is a checkpoint itself
        try:
            found.append((int(read_manifest(d).get("step") or 0), d))
        except ConfigError:
            found.append((-1, d))  # (a damaged one: tried last, refused then)
    elif other:
        raise ConfigError(f"checkpoint.dir {str(d)!r} holds files that are not checkpoints ({', '.join(other[:5])}"
                          f"{', ...' if len(other) > 5 else ''}): point checkpoint.dir at a new or empty directory, "
                          "or at a training run's own")
    return sorted(found, key=lambda t: t[0], reverse=True)


def newest_checkpoint(path: str | os.PathLike) -> Path:
    """``path`` when it is a checkpoint, else the newest ``step-<N>`` checkpoint in it."""
    p = Path(path)
    if (p / MANIFEST).exists() or not p.is_dir():
        return p
    try:
        steps = step_checkpoints(p)
    except ConfigError:  # other files: ``p`` itself, which the reader then refuses as no checkpoint
        return p
    return steps[0][1] if steps else p


def prune_steps(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` ``step-<N>`` checkpoints of a run's directory (only
    directories with a manifest, ours); returns those removed."""
    gone = []
    for _, p in [t for t in step_checkpoints(directory) if t[1] != Path(directory)][keep:]:
        if (p / MANIFEST).exists():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def _siblings(path: Path, kind: str) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.{kind}-*"))


def check_save_target(path: Path, want: dict[str, tuple[int, ...]], optional: set[str], model: str,
                  overwrite: bool) -> None:
    """Rank 0, before anything is written: ``path`` may take a checkpoint of the model whose keys
    and shapes are ``want`` (named ``model``; ``optional``: its parameters no layer reads): it is
    missing, an empty directory, or a checkpoint of the same model (or of another one, with
    ``overwrite``)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"cannot save a checkpoint to {str(path)!r}: it is a file; choose a directory path")
    if path.is_dir() and any(path.iterdir()) and not (path / MANIFEST).exists():
        raise ConfigError(f"refusing to replace {str(path)!r}: it is a non-empty directory without {MANIFEST}, "
                          "so not a galvatron_fx checkpoint; choose another path or remove it")
    target = resolve_checkpoint(path)  # after a crash mid-swap, the previous checkpoint beside it
    if overwrite or not (target / MANIFEST).exists():
        return
    other = _other_model(target, want, optional, model)
    if other is not None:
        raise ConfigError(f"refusing to replace the checkpoint at {str(path)!r}: {other}; save this model to "
                          "another path, or pass overwrite=True to replace that checkpoint")


def _other_model(target: Path, want: dict[str, tuple[int, ...]], optional: set[str], model: str) -> str | None:
    """What tells the checkpoint at ``target`` apart from one of the model ``want`` describes
    (named ``model``), or None when it is a checkpoint of that model under any plan: one that
    :func:`load` takes into it (the same keys and shapes, but that a checkpoint an earlier
    galvatron_fx wrote may lack the ``optional`` parameters no layer reads)."""
    try:
        manifest = read_json(target / MANIFEST, what="checkpoint manifest", limit=MAX_MANIFEST_BYTES)
        saved = _saved_shapes(read_dcp_metadata(target))
    except (OSError, ValueError) as e:  # ConfigError and JSON's errors are ValueErrors
        return f"it holds a checkpoint that cannot be read ({e}), which may be another model's"
    name = manifest.get("plan_model") if isinstance(manifest, dict) else None
    missing = sorted(k[6:] for k in set(want) - set(saved) - optional)
    unexpected = sorted(k[6:] for k in set(saved) - set(want))
    shapes = [f"{k[6:]} {saved[k]} there, {want[k]} here" for k in sorted(want) if k in saved and saved[k] != want[k]]
    if not (missing or unexpected or shapes):
        return None
    diff = [f"this model has {some_names(missing, 4)}, which that checkpoint lacks"] if missing else []
    diff += [f"that checkpoint has {some_names(unexpected, 4)}, which this model lacks"] if unexpected else []
    diff += [f"other shapes: {', '.join(shapes[:3])}{' ...' if len(shapes) > 3 else ''}"] if shapes else []
    step = manifest.get("step") if isinstance(manifest, dict) else None
    return (f"it holds a checkpoint of another model, {name!r} (step {step}), not of this model {model!r} "
            f"({'; '.join(diff)})")


def _swap(tmp: Path, path: Path, token: str) -> None:
    """Move the finished ``tmp`` to ``path``; the previous checkpoint stays whole until then."""
    parent = path.parent
    if path.exists():
        old = parent / f".{path.name}.old-{token}"
        os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)
        _fsync_dir(parent)


def _remove_stale(path: Path) -> None:
    """Temp and old directories left by crashed saves (one writer per path is assumed)."""
    for stale in _siblings(path, "tmp") + _siblings(path, "old"):
        log.info("removing %s, left by an unfinished save", stale)
        shutil.rmtree(stale, ignore_errors=True)


def resolve_checkpoint(path: Path) -> Path:
    """``path``, or, when it is missing after a crash between the two renames of a save, the
    complete previous checkpoint beside it."""
    if path.exists():
        return path
    olds = [p for p in _siblings(path, "old") if (p / MANIFEST).exists()]
    if olds:
        old = max(olds, key=lambda p: p.stat().st_mtime)
        log.warning("checkpoint %s is missing but %s, the previous one a save was replacing, is complete: "
                    "loading it", path, old)
        return old
    return path


# ---- verification ------------------------------------------------------------------------------

def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the checkpoint at ``path`` (no process group needed); ``ConfigError`` if
    it is missing, unreadable or not a galvatron_fx manifest."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no checkpoint at {str(path)!r}: the directory does not exist; check the path")
    m = path / MANIFEST
    if not m.exists():
        raise ConfigError(f"checkpoint {str(path)!r} has no {MANIFEST}: the save that wrote it did not finish "
                          "(the manifest is written last); load an earlier checkpoint")
    try:
        manifest = read_json(m, what="checkpoint manifest", limit=MAX_MANIFEST_BYTES,
                             hint="the checkpoint is damaged: load an earlier one")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{str(m)!r} cannot be read ({e}); the checkpoint is damaged: load an earlier one") from None
    ok = isinstance(manifest, dict) and manifest.get("format") == FORMAT and isinstance(manifest.get("files"), dict)
    if not ok:
        raise ConfigError(f"{str(m)!r} is not a {FORMAT} manifest; the checkpoint is damaged or was written by "
                          "another tool: load an earlier one")
    if manifest.get("version") != VERSION:
        raise ConfigError(f"{str(m)!r} has format version {manifest.get('version')}, this galvatron_fx reads version "
                          f"{VERSION}; load it with the galvatron_fx that wrote it")
    return manifest


# What DCP's ``.metadata`` pickle may name, and nothing else: its metadata records, the file
# reader's storage info, sizes, dtypes, layouts, paths. Any other global (a function a forged file
# would call) is refused before it is looked up.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in _METADATA_GLOBALS.get(module, ()) or \
                (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def read_dcp_metadata(path: str | os.PathLike) -> Metadata:
    """DCP's metadata of the checkpoint at ``path``, unpickled by an allow-list of DCP's own
    record classes (no other code can run), holding tensors only; ``ConfigError`` otherwise."""
    path = Path(path)
    bad = f"checkpoint {str(path)!r} is damaged or forged: its {DCP_METADATA}"
    try:
        with open(path / DCP_METADATA, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ConfigError(f"{bad} is larger than {MAX_MANIFEST_BYTES // 2**20} MiB; load a checkpoint you trust")
        md = _MetadataUnpickler(io.BytesIO(raw)).load()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 (whatever a damaged or forged file raises)
        raise ConfigError(f"{bad} is not DCP metadata ({type(e).__name__}: {e}); load a checkpoint you trust") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise ConfigError(f"{bad} holds a {type(md).__name__}, not DCP metadata; load a checkpoint you trust")
    others = sorted(k for k, v in md.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata))
    if others:  # non-tensor entries are read back with a full unpickler: a galvatron_fx save writes none
        raise ConfigError(f"{bad} lists entries that are not tensors ({', '.join(map(str, others[:3]))}); "
                          "a galvatron_fx checkpoint holds tensors only: load a checkpoint you trust")
    return md


class SafeReader(FileSystemReader):
    """DCP's file reader, reading its metadata through :func:`read_dcp_metadata`."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        md = read_dcp_metadata(self.path)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        cast(StorageMeta, md.storage_meta).load_id = self.load_id  # (set just above when None)
        return md


def _listed_file(path: Path, name: str, want) -> Path:
    """The file a manifest entry names: only a plain file name (no directory part, no ``..``)
    of a regular file inside ``path`` — a name that reaches outside the checkpoint, a link or a
    device (``/dev/zero`` would never finish hashing) is refused, as is a malformed entry."""
    forged = f"checkpoint {str(path)!r} is damaged or forged: its manifest"
    plain = isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
    if not plain:
        raise ConfigError(f"{forged} lists {name!r}, which is not a plain file name inside the checkpoint "
                          "directory; load a checkpoint you trust")
    if not (isinstance(want, dict) and type(want.get("bytes")) is int and want["bytes"] >= 0
            and isinstance(want.get("sha256"), str)):
        raise ConfigError(f"{forged} entry for {name} is not {{bytes, sha256}}; load a checkpoint you trust")
    f = path / name
    if f.is_symlink() or (f.exists() and not f.is_file()):
        raise ConfigError(f"{forged} lists {name}, which is a link or not a regular file; a checkpoint holds only "
                          "regular files: load a checkpoint you trust")
    return f


def verify(path: str | os.PathLike, *, checksums: bool = True, share: tuple[int, int] = (0, 1),
           always: tuple[str, ...] = ()) -> dict:
    """Check the checkpoint at ``path`` against its manifest (no process group needed): every
    listed file exists with its size and, when ``checksums``, its sha256 (only files ``i`` with
    ``i % share[1] == share[0]``, so that ranks split the reading, and the files named in
    ``always``: those this rank reads before the ranks agree). Returns the manifest; raises
    ``ConfigError`` naming the first bad file."""
    path = Path(path)
    manifest = read_manifest(path)
    what = "restore the directory from a copy or load an earlier checkpoint"
    for i, (name, want) in enumerate(sorted(manifest["files"].items())):
        f = _listed_file(path, name, want)
        if not f.exists():
            raise ConfigError(f"checkpoint {str(path)!r} is damaged: {name} is missing (the manifest lists it); {what}")
        size = f.stat().st_size
        if size != want["bytes"]:
            raise ConfigError(f"checkpoint {str(path)!r} is damaged: {name} has {size} bytes, the manifest says "
                              f"{want['bytes']}{' (truncated)' if size < want['bytes'] else ''}; {what}")
        if checksums and (i % share[1] == share[0] or name in always) and _sha256(f) != want["sha256"]:
            raise ConfigError(f"checkpoint {str(path)!r} is damaged: {name} does not match its sha256 in the "
                              f"manifest; {what}")
    return manifest


# ---- finishing a save --------------------------------------------------------------------------

def finish_save(plan: ParallelPlan, tmp: Path, path: Path, token: str, trainer: dict, files: dict[str, dict],
            step: int | None) -> None:
    """Rank 0: the plan, the trainer state, the manifest last, then the swap."""
    plan.save(tmp / PLAN)
    with open(tmp / TRAINER, "wb") as f:
        torch.save(trainer, f)
        f.flush()
        os.fsync(f.fileno())
    for name in (DCP_METADATA, PLAN, TRAINER):
        files[name] = describe_file(tmp / name)
    manifest = {"format": FORMAT, "version": VERSION, "world_size": dist.get_world_size(),
                "plan_hash": plan.plan_hash(), "plan_model": plan.model, "step": step,
                "torch_version": torch.__version__, "created_unix_s": time.time(), "files": dict(sorted(files.items()))}
    _write_manifest(tmp, manifest)
    _fsync_dir(tmp)
    _swap(tmp, path, token)
    _remove_stale(path)


# ---- saved keys and shapes ----------------------------------------------------------------------

def _saved_shapes(md) -> dict[str, tuple[int, ...]]:
    """``model.<fqn>`` -> global shape, for every parameter and buffer DCP's metadata lists."""
    return {k: tuple(v.size) for k, v in md.state_dict_metadata.items()
            if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}


def check_metadata(want: dict[str, tuple[int, ...]], path: Path, md, optional: AbstractSet[str] = frozenset()) -> None:
    """The checkpoint holds every key of ``want`` (but those in ``optional``) with its shape, and
    no other ``model.`` key."""
    saved = _saved_shapes(md)
    missing = sorted(k[6:] for k in set(want) - set(saved) - optional)
    unexpected = sorted(k[6:] for k in set(saved) - set(want))
    if missing or unexpected:
        raise ConfigError(f"checkpoint {str(path)!r} holds other parameters than this module: missing "
                          f"{some_names(missing)}, unexpected {some_names(unexpected)}; load it into the model it was saved "
                          "from (same FQNs), or load matching weights with load_state_dict")
    bad = [f"{k[6:]} saved {saved[k]} vs module {want[k]}" for k in sorted(want) if k in saved and saved[k] != want[k]]
    if bad:
        raise ConfigError(f"checkpoint {str(path)!r} has other shapes than this module: {'; '.join(bad[:5])}"
                          f"{' ...' if len(bad) > 5 else ''}; load it into the model configuration it was saved from")


def some_names(names: list[str], limit: int = 8) -> str:
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
