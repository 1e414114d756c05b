"""Trained weights out: back into the user's module, or from a checkpoint to a file.

- ``pm.state_dict()`` (a :class:`~galvatron_fx.runtime.parallel_module.ParallelModule` or a
  :class:`~galvatron_fx.runtime.pipeline.PipelineModule`) returns full, plain tensors keyed by the
  user's names on every rank (collective);
- ``pm.to_module(model)`` copies them into ``model`` (by default the module ``compile`` was given,
  while it is alive) and returns it; ``pm.unwrap()`` is ``pm.to_module()``. A model on the meta
  device gets the tensors assigned; a model in another dtype gets them converted;
- :func:`export_checkpoint` reads a checkpoint that :func:`galvatron_fx.runtime.checkpoint.save`
  wrote — checked against its manifest first, its DCP metadata read through the allow-list, so no
  code in it runs — in one process with no process group, and writes the model's tensors as one
  ``safetensors`` file (every tensor the checkpoint holds: a tied weight once, under its owner's
  name; non-persistent buffers such as rotary tables too, so load it with ``strict=False``) and/or,
  given the Hugging Face ``config.json`` it was built from, a ``save_pretrained`` directory (which
  ``from_pretrained`` reads as it reads any). Nothing existing is replaced unless asked (``overwrite=True``),
  and then only once the new file is complete (written beside it, then renamed).
"""

from __future__ import annotations

import os
import shutil
import warnings
import weakref
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from galvatron_fx.errors import ConfigError

_MODEL_PREFIX = "model."


class WeightsOut:
    """``to_module`` / ``unwrap`` for the parallel modules (see module doc)."""

    _user_model_ref: weakref.ReferenceType | None = None

    def remember_user_model(self, model: nn.Module) -> None:
        """Keep a weak reference to the module this one was built from (``compile`` does)."""
        object.__setattr__(self, "_user_model_ref", weakref.ref(model))

    def to_module(self, model: nn.Module | None = None) -> nn.Module:
        """Copy the trained weights (full tensors) into ``model`` and return it; collective: call
        it on every rank. ``model`` defaults to the module ``compile`` was given."""
        target = model if model is not None else (self._user_model_ref() if self._user_model_ref else None)
        if target is None:
            raise ConfigError("to_module(): no model to write into (the module compile() was given is gone, or "
                              "this one was not built by compile()): pass it, pm.to_module(model)")
        copy_into(target, cast(nn.Module, self).state_dict())
        return target

    def unwrap(self) -> nn.Module:
        """The user's module holding the trained weights (:meth:`to_module` with no argument)."""
        return self.to_module()


def copy_into(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy full tensors keyed by ``model``'s names into it: every parameter and persistent
    buffer must be there with its shape (non-persistent ones, such as rotary tables, are copied
    when given); a tensor on the meta device is replaced, any other copied into in place (a tied
    weight stays tied), converted to its dtype."""
    required = model.state_dict(keep_vars=True)
    own = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    missing = sorted(set(required) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ConfigError(f"the weights do not fit this model: missing {some_names(missing)}, unexpected "
                          f"{some_names(unexpected)}; pass the module the parallel one was built from")
    bad = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
           if k in state and state[k].shape != v.shape]
    if bad:
        raise ConfigError(f"the weights do not fit this model: shapes differ for {some_names(bad)}")
    with torch.no_grad():
        for name, old in own.items():
            if name not in state:
                continue
            new = state[name].detach().to(dtype=old.dtype)
            if not old.is_meta:
                old.copy_(new)
                continue
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            if leaf in owner._parameters:
                owner._parameters[leaf] = nn.Parameter(new.clone(), requires_grad=old.requires_grad)
            else:
                owner._buffers[leaf] = new.clone()


def some_names(names: list[str], limit: int = 6) -> str:
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---- checkpoint to file --------------------------------------------------------------------------

def read_checkpoint_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model tensors of the checkpoint at ``path`` (full, on CPU, keyed by the user's names),
    read in this process alone after checking every file against the manifest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from galvatron_fx.runtime.checkpoint.files import (
        SafeReader,
        newest_checkpoint,
        read_dcp_metadata,
        resolve_checkpoint,
        verify,
    )

    where = resolve_checkpoint(newest_checkpoint(path))  # (a run's directory: its newest step checkpoint)
    verify(where)
    md = read_dcp_metadata(where)
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in md.state_dict_metadata.items()
             if k.startswith(_MODEL_PREFIX) and isinstance(m, TensorStorageMetadata)}
    if not state:
        raise ConfigError(f"checkpoint {str(path)!r} holds no model tensors; is it a galvatron_fx checkpoint?")
    with warnings.catch_warnings():  # (DCP says it loads in one process: that is the intent)
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(state, storage_reader=SafeReader(where), no_dist=True)
    return {k[len(_MODEL_PREFIX):]: v for k, v in state.items()}


EXPORT_MARKER = ".galvatron_fx-export"  # in a Hugging Face directory an export wrote: what --overwrite may replace


def check_target(out: Path, overwrite: bool, *, directory: bool) -> None:
    """Refuse a target that cannot be written or must not be replaced, before anything is written:
    an existing one without ``overwrite``; a directory where a file goes (or the reverse); a
    directory holding files an export did not write (no :data:`EXPORT_MARKER`), which
    ``overwrite`` would delete."""
    if not out.exists():
        return
    if not overwrite:
        raise ConfigError(f"{out} exists: choose another path, or pass overwrite (--overwrite) to replace it")
    if out.is_dir() != directory:
        raise ConfigError(f"{out} is {'not ' if directory else ''}a directory: give the {'directory' if directory else 'file'}"
                          " to write")
    if directory and any(out.iterdir()) and not (out / EXPORT_MARKER).exists():
        names = sorted(p.name for p in out.iterdir())[:5]
        raise ConfigError(f"{out} holds files an export did not write ({', '.join(names)}, ...): --overwrite replaces only "
                          "an earlier export; choose another directory")


def _fresh(out: Path, overwrite: bool, *, directory: bool = False) -> Path:
    check_target(out, overwrite, directory=directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.parent / f".{out.name}.tmp-{os.getpid()}"


def _disk_full(e: OSError, out: Path) -> ConfigError | None:
    """A ConfigError naming a full disk when ``e`` is one (``ENOSPC``), else None."""
    import errno

    if getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e):
        return ConfigError(f"the disk holding {out.parent} is full (no space left on device) while writing {out}: "
                           "nothing was replaced and the partial files were removed; free space or write elsewhere")
    return None


def save_safetensors(state: dict[str, torch.Tensor], out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write ``state`` as one safetensors file (tensors sharing storage are written as copies)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError("writing .safetensors needs the safetensors package (pip install safetensors)") from None
    out = Path(out)
    tmp = _fresh(out, overwrite)
    try:
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in state.items()}, str(tmp),
                  metadata={"format": "pt"})
        os.replace(tmp, out)
    except OSError as e:
        raise (_disk_full(e, out) or e) from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def save_hf_pretrained(state: dict[str, torch.Tensor], hf_config: str | os.PathLike, out_dir: str | os.PathLike,
                       *, overwrite: bool = False) -> Path:
    """A Hugging Face ``save_pretrained`` directory of the model ``hf_config`` describes, holding
    ``state`` (from :func:`read_checkpoint_weights` or ``pm.state_dict()``)."""
    from galvatron_fx.frontend.model_source import hf_config as read_config
    from galvatron_fx.frontend.model_source import hf_model_class

    config = read_config(cast("str | Path", hf_config))  # (a path-like is read as a path)
    with torch.device("meta"):
        model = hf_model_class(config)(config)
    own = model.state_dict()
    tied = {k for k in own if k not in state}  # tied weights saved once, under their owner's name
    copy_into(model, {**state, **_tied_values(model, state, tied)})
    model.tie_weights()  # assigning split the tied parameters; the config says which are one
    out_dir = Path(out_dir)
    tmp = _fresh(out_dir, overwrite, directory=True)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        (tmp / EXPORT_MARKER).write_text('{"format": "galvatron_fx-export"}\n')
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except OSError as e:
        raise (_disk_full(e, out_dir) or e) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _tied_values(model: nn.Module, state: dict[str, torch.Tensor], missing: set[str]) -> dict[str, Any]:
    """The values of parameters the state lacks because they are the same tensor as one it has."""
    if not missing:
        return {}
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    out = {}
    for names in by_id.values():
        have = [n for n in names if n in state]
        for n in names:
            if n in missing and have:
                out[n] = state[have[0]]
    return out


def export_checkpoint(path: str | os.PathLike, *, out: str | os.PathLike | None = None,
                      hf_dir: str | os.PathLike | None = None, hf_config: str | os.PathLike | None = None,
                      overwrite: bool = False) -> dict[str, torch.Tensor]:
    """Write a checkpoint's model weights to ``out`` (safetensors) and/or ``hf_dir``
    (``save_pretrained``, needs ``hf_config``); returns the tensors written."""
    if out is None and hf_dir is None:
        raise ConfigError("export: say where to write: --out model.safetensors and/or --hf-dir DIR")
    if hf_dir is not None and hf_config is None:
        raise ConfigError("export --hf-dir needs --hf-config PATH: the Hugging Face config.json the model was built "
                          "from")
    for target, directory in ((out, False), (hf_dir, True)):  # every target checked before anything is written
        if target is not None:
            check_target(Path(target), overwrite, directory=directory)
    state = read_checkpoint_weights(path)
    if out is not None:
        save_safetensors(state, out, overwrite=overwrite)
    if hf_dir is not None:
        save_hf_pretrained(state, cast("str | os.PathLike", hf_config), hf_dir, overwrite=overwrite)  # (checked above)
    return state
