"""``galvatron-fx inspect``: table, JSON and DOT outputs; errors for unknown models."""

from __future__ import annotations

import json
import subprocess
import sys

from galvatron_fx.cli import main


def test_inspect_writes_json_and_dot(tmp_path, capsys):
    js, dot = tmp_path / "g.json", tmp_path / "g.dot"
    rc = main(["inspect", "gpt-tiny", "--batch", "2", "--seq", "32", "--json", str(js), "--dot", str(dot), "--node-table"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "blocks.3" in out and "activations" in out and "fwd FLOPs" in out
    assert "linear" in out  # the per-node table
    data = json.loads(js.read_text())
    assert data["model"] == "gpt-tiny"
    layers = data["layers"]
    assert [l["role"] for l in layers] == ["embedding"] + ["block"] * 4 + ["head", "loss"]
    for l in layers:
        assert {"name", "kind", "role", "params", "fwd_flops", "bwd_flops", "activation_bytes", "output_bytes"} <= set(l)
    assert len({l["kind"] for l in layers if l["role"] == "block"}) == 1
    assert layers[1]["fwd_flops"] > 0 and layers[1]["activation_bytes"] > 0
    assert sum(1 for n in data["nodes"] if n["layer"] == "blocks.0") == len(layers[1]["nodes"])
    text = dot.read_text()
    assert text.startswith("digraph") and text.count("subgraph cluster_") == len(layers)


def test_summary_matches_cli_table():
    from galvatron_fx import capture, zoo

    mg = capture(*zoo.build("llama-tiny", batch_size=1, seq_len=16), name="llama-tiny")
    text = mg.summary()
    assert text.splitlines()[0].startswith("llama-tiny: 7 layers, 4 kinds")
    assert all(l.name in text for l in mg.layers)


def test_unknown_model_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "galvatron_fx.cli", "inspect", "gpt-nope"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "gpt-nope" in proc.stderr and "gpt-tiny" in proc.stderr  # lists the known names
    assert "Traceback" not in proc.stderr
