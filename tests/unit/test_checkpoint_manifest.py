"""A checkpoint's manifest is data, not a map of the file system: only plain names of regular
files inside the checkpoint directory are read (``verify``, no process group needed)."""

from __future__ import annotations

import json
import os
import time

import pytest

from galvatron_fx.errors import ConfigError
from galvatron_fx.runtime import checkpoint as ck
from galvatron_fx.runtime.checkpoint import files as ckf


def _checkpoint(root, files: dict[str, dict]):
    d = root / "ck"
    d.mkdir()
    (d / "plan.json").write_text("{}")
    files = {"plan.json": ckf.describe_file(d / "plan.json")} | files
    (d / ck.MANIFEST).write_text(json.dumps({"format": ck.FORMAT, "version": ck.VERSION, "files": files}))
    return d


def test_a_plain_checkpoint_verifies(tmp_path):
    assert "plan.json" in ck.verify(_checkpoint(tmp_path, {}))["files"]


@pytest.mark.parametrize("name", ["../secret", "../../etc/hostname", "/etc/hostname", "sub/plan.json", ".", "..",
                                  "a\\b", "nul\0byte"])
def test_names_that_reach_outside_are_refused(tmp_path, name):
    (tmp_path / "secret").write_text("not part of the checkpoint")
    d = _checkpoint(tmp_path, {name: ckf.describe_file(tmp_path / "secret")})
    with pytest.raises(ConfigError, match="not a plain file name"):
        ck.verify(d)


@pytest.mark.timing
def test_a_device_or_link_is_refused_at_once(tmp_path):
    """``../../dev/zero`` of size 0 used to make ``verify`` hash forever; a link inside the
    directory to a file outside it read that file."""
    d = _checkpoint(tmp_path, {})
    os.symlink("/dev/zero", d / "zero")
    (tmp_path / "outside").write_text("x")
    os.symlink(tmp_path / "outside", d / "link")
    manifest = json.loads((d / ck.MANIFEST).read_text())
    for name, want in (("zero", {"bytes": 0, "sha256": "0" * 64}), ("link", ckf.describe_file(tmp_path / "outside"))):
        (d / ck.MANIFEST).write_text(json.dumps(manifest | {"files": manifest["files"] | {name: want}}))
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="link or not a regular file"):
            ck.verify(d)
        assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("want", [None, {}, {"bytes": "12", "sha256": "x"}, {"bytes": -1, "sha256": "x"},
                                  {"bytes": 1}])
def test_a_malformed_entry_is_a_clear_error(tmp_path, want):
    d = _checkpoint(tmp_path, {})
    (d / "x.distcp").write_bytes(b"x")
    manifest = json.loads((d / ck.MANIFEST).read_text())
    (d / ck.MANIFEST).write_text(json.dumps(manifest | {"files": manifest["files"] | {"x.distcp": want}}))
    with pytest.raises(ConfigError, match="is not \\{bytes, sha256\\}"):
        ck.verify(d)


# ---- DCP's metadata: an allow-listed unpickler -----------------------------------------------

class _Payload:
    """What a planted ``.metadata`` holds: unpickling it would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _dcp_checkpoint(root, state) -> object:
    import torch.distributed.checkpoint as dcp

    d = root / "dcp"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(d, single_file_per_rank=True), no_dist=True)
    return d


def test_dcp_metadata_reads_as_dcp_reads_it(tmp_path):
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    d = _dcp_checkpoint(tmp_path, {"model.w": torch.randn(4, 3), "optim.step": torch.tensor(3.0),
                                   "model.b": torch.zeros(2, dtype=torch.bfloat16)})
    got, want = ck.read_dcp_metadata(d), FileSystemReader(d).read_metadata()
    assert got.state_dict_metadata == want.state_dict_metadata
    assert got.storage_data == want.storage_data


def test_a_planted_payload_never_runs(tmp_path):
    import pickle

    d = _dcp_checkpoint(tmp_path, {"model.w": __import__("torch").randn(2)})
    marker = tmp_path / "ran"
    (d / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ConfigError, match="not DCP metadata.*posix.system|not DCP metadata.*os.system"):
        ck.read_dcp_metadata(d)
    assert not marker.exists()
    # the same pickle through DCP's own reader runs it: what the allow-list stops
    from torch.distributed.checkpoint import FileSystemReader

    with pytest.raises(Exception):  # noqa: B017 (whatever the planted payload makes the unpickling raise)
        FileSystemReader(d).read_metadata()
    assert marker.exists()


def test_non_tensor_entries_are_refused(tmp_path):
    """A non-tensor entry would be read back with a full unpickler; a save writes none."""
    import torch

    d = _dcp_checkpoint(tmp_path, {"model.w": torch.randn(2), "extra": {"a": 1}})
    with pytest.raises(ConfigError, match="BytesStorageMetadata|not tensors"):
        ck.read_dcp_metadata(d)


# ---- the save target: a checkpoint of another model is replaced only when asked --------------

def _saved(root, name: str, model: str, state: dict) -> object:
    """A checkpoint directory as a save leaves it, as far as the target check reads it."""
    import torch.distributed.checkpoint as dcp

    d = root / name
    dcp.save(state, storage_writer=dcp.FileSystemWriter(d, single_file_per_rank=True), no_dist=True)
    (d / ck.MANIFEST).write_text(json.dumps({"format": ck.FORMAT, "version": ck.VERSION, "plan_model": model,
                                             "step": 7, "files": {}}))
    return d


def test_a_save_target_holding_another_models_checkpoint_is_refused(tmp_path):
    import torch

    d = _saved(tmp_path, "ck", "gpt-tiny", {"model.w": torch.zeros(4, 3), "model.b": torch.zeros(3),
                                            "optim.w.exp_avg": torch.zeros(4, 3)})
    same = {"model.w": (4, 3), "model.b": (3,)}
    ckf.check_save_target(d, same, set(), "gpt-tiny under another plan", False)  # the same model: replaced
    ckf.check_save_target(d, same | {"model.unused": (2,)}, {"model.unused"}, "x", False)  # saved before unused were
    for want, detail in (({"model.w": (4, 3), "model.b": (3,), "model.v": (1,)},
                          "this model has v, which that checkpoint lacks"),
                         ({"model.w": (4, 3)}, "that checkpoint has b, which this model lacks"),
                         ({"model.w": (4, 4), "model.b": (3,)}, "other shapes: w (4, 3) there, (4, 4) here")):
        with pytest.raises(ConfigError) as e:
            ckf.check_save_target(d, want, set(), "llama-tiny", False)
        msg = str(e.value)
        assert "refusing to replace" in msg and "'gpt-tiny' (step 7)" in msg and "'llama-tiny'" in msg, msg
        assert detail in msg and "overwrite=True" in msg, msg
        ckf.check_save_target(d, want, set(), "llama-tiny", True)
    # after a crash between a save's two renames: the previous checkpoint beside the path counts
    os.rename(d, tmp_path / ".ck.old-0123")
    with pytest.raises(ConfigError, match="another model, 'gpt-tiny'"):
        ckf.check_save_target(d, {"model.v": (1,)}, set(), "llama-tiny", False)
    ckf.check_save_target(d, same, set(), "gpt-tiny", False)
    # an unreadable checkpoint may be anyone's; a directory that is no checkpoint is never replaced
    (tmp_path / ".ck.old-0123" / ".metadata").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="cannot be read"):
        ckf.check_save_target(d, same, set(), "gpt-tiny", False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("user data")
    with pytest.raises(ConfigError, match="not a galvatron_fx checkpoint"):
        ckf.check_save_target(tmp_path / "data", same, set(), "gpt-tiny", True)
