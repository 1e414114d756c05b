"""Checkpoints that reshard: save a parallel module (pipelined or not) and its optimizer under one
plan and world size, load them under another (:mod:`.state`); the directory's files, manifest and
atomic swap (:mod:`.files`); the stored copies of the parameters on a rank (:mod:`.slots`).

The public API is what this package exports: :func:`save`, :func:`load`,
:func:`load_full_state_dict` (collective), and the file-level readers :func:`verify`,
:func:`read_manifest`, :func:`read_dcp_metadata`, :func:`step_checkpoints`,
:func:`newest_checkpoint`, :func:`prune_steps` (no process group)."""

from __future__ import annotations

from galvatron_fx.runtime.checkpoint.files import (
    FORMAT,
    MANIFEST,
    PLAN,
    STEP_PREFIX,
    TRAINER,
    VERSION,
    newest_checkpoint,
    prune_steps,
    read_dcp_metadata,
    read_manifest,
    step_checkpoints,
    verify,
)
from galvatron_fx.runtime.checkpoint.state import LoadedCheckpoint, load, load_full_state_dict, save

__all__ = ["FORMAT", "MANIFEST", "PLAN", "STEP_PREFIX", "TRAINER", "VERSION", "LoadedCheckpoint", "load",
           "load_full_state_dict", "newest_checkpoint", "prune_steps", "read_dcp_metadata", "read_manifest", "save",
           "step_checkpoints", "verify"]
