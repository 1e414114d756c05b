"""``galvatron-fx export`` never deletes what it did not write: every target checked before
anything is written, ``--overwrite`` replaces only an earlier export (its marker file), a full
disk named as such with no partial files left."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from galvatron_fx.errors import ConfigError
from galvatron_fx.runtime import weights


def test_targets_are_checked_before_anything_is_written(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    # --overwrite on a directory of the user's files: refused, the files kept
    with pytest.raises(ConfigError, match="holds files an export did not write"):
        weights.export_checkpoint(tmp_path / "no-ckpt", hf_dir=mine, hf_config=tmp_path / "c.json", overwrite=True)
    assert (mine / "notes.txt").read_text() == "the user's"
    # --out NEW beside an existing --hf-dir: refused before NEW is written
    new = tmp_path / "new.safetensors"
    with pytest.raises(ConfigError, match="exists: choose another path"):
        weights.export_checkpoint(tmp_path / "no-ckpt", out=new, hf_dir=mine, hf_config=tmp_path / "c.json")
    assert not new.exists()
    with pytest.raises(ConfigError, match="is a directory"):
        weights.export_checkpoint(tmp_path / "no-ckpt", out=mine, overwrite=True)


def test_an_earlier_export_is_replaced_and_marked(tmp_path):
    hf_tiny = pytest.importorskip("hf_tiny")
    model, _ = hf_tiny.build("llama")
    model.config.to_json_file(str(tmp_path / "config.json"))
    out = tmp_path / "hf"
    weights.save_hf_pretrained(model.state_dict(), tmp_path / "config.json", out)
    assert (out / weights.EXPORT_MARKER).exists() and (out / "model.safetensors").exists()
    weights.save_hf_pretrained(model.state_dict(), tmp_path / "config.json", out, overwrite=True)  # ours: replaced
    assert json.loads((out / weights.EXPORT_MARKER).read_text())["format"] == "galvatron_fx-export"


def test_a_full_disk_is_named_and_leaves_no_partial_file(tmp_path, monkeypatch):
    import safetensors.torch

    def full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "w.safetensors"
    with pytest.raises(ConfigError, match="is full"):
        weights.save_safetensors({"a": torch.zeros(2)}, out)
    assert list(tmp_path.iterdir()) == []  # neither the target nor the temporary
