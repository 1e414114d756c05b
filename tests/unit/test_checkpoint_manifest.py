"""A checkpoint's manifest is data, not a map of the file system: only plain names of regular
files inside the checkpoint directory are read (``verify``, no process group needed)."""

from __future__ import annotations

import json
import os
import time

import pytest

from galvatron_fx.errors import ConfigError
from galvatron_fx.runtime import checkpoint as ck


def _checkpoint(root, files: dict[str, dict]):
    d = root / "ck"
    d.mkdir()
    (d / "plan.json").write_text("{}")
    files = {"plan.json": ck._describe(d / "plan.json")} | files
    (d / ck.MANIFEST).write_text(json.dumps({"format": ck.FORMAT, "version": ck.VERSION, "files": files}))
    return d


def test_a_plain_checkpoint_verifies(tmp_path):
    assert "plan.json" in ck.verify(_checkpoint(tmp_path, {}))["files"]


@pytest.mark.parametrize("name", ["../secret", "../../etc/hostname", "/etc/hostname", "sub/plan.json", ".", "..",
                                  "a\\b", "nul\0byte"])
def test_names_that_reach_outside_are_refused(tmp_path, name):
    (tmp_path / "secret").write_text("not part of the checkpoint")
    d = _checkpoint(tmp_path, {name: ck._describe(tmp_path / "secret")})
    with pytest.raises(ConfigError, match="not a plain file name"):
        ck.verify(d)


def test_a_device_or_link_is_refused_at_once(tmp_path):
    """``../../dev/zero`` of size 0 used to make ``verify`` hash forever; a link inside the
    directory to a file outside it read that file."""
    d = _checkpoint(tmp_path, {})
    os.symlink("/dev/zero", d / "zero")
    (tmp_path / "outside").write_text("x")
    os.symlink(tmp_path / "outside", d / "link")
    manifest = json.loads((d / ck.MANIFEST).read_text())
    for name, want in (("zero", {"bytes": 0, "sha256": "0" * 64}), ("link", ck._describe(tmp_path / "outside"))):
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
