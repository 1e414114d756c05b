"""The ``galvatron-fx`` command line: fast help, ``-v`` anywhere, one precision default, and a
model from a zoo name, a Hugging Face config.json or the user's own ``module:function``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from galvatron_fx.cli import build_parser, main
from galvatron_fx.ir.plan import ParallelPlan

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128, "tie_word_embeddings": False,
}

USER_MODULE = '''
import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return nn.functional.mse_loss(self.out(x).squeeze(-1), y)


def build(batch_size, seq_len, device):
    with torch.device(device):
        model = Regressor()
        return model, (torch.zeros(batch_size, 32), torch.zeros(batch_size))
'''


@pytest.mark.timing
def test_help_answers_without_importing_torch():
    code = ("import sys\nfrom galvatron_fx.cli import main\n"
            "for argv in (['--help'], ['plan', '--help'], ['inspect', '--help'], ['--version']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().endswith("NO-TORCH"), proc.stdout[-500:]
    assert "--hf-config" in proc.stdout and "--node-table" in proc.stdout
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "galvatron_fx.cli", "plan", "--help"], capture_output=True, check=True)
    assert time.perf_counter() - t0 < 1.0


def test_version_says_what_is_installed(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    import torch

    assert out.startswith("galvatron-fx 0.") and f"torch {torch.__version__.split('+')[0]}" in out, out


def test_verbose_before_or_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["-v", "plan", "gpt-tiny"]).verbose
    assert parser.parse_args(["plan", "gpt-tiny", "-v"]).verbose
    assert parser.parse_args(["inspect", "--verbose", "gpt-tiny"]).verbose
    assert not parser.parse_args(["plan", "gpt-tiny"]).verbose


def test_the_same_flags_in_every_model_command():
    parser = build_parser()
    for cmd in ("inspect", "plan", "lower"):
        extra = ["--plan", "p.json", "--out", "o"] if cmd == "lower" else []
        args = parser.parse_args([cmd, "--hf-config", "c.json", "--seq", "16", *extra])
        assert args.zoo_name is None and str(args.hf_config) == "c.json" and args.factory is None and args.seq == 16
        assert parser.parse_args([cmd, "--model", "m:f", *extra]).factory == "m:f"
    assert parser.parse_args(["plan", "gpt-tiny"]).precision is None  # the API's default, fp32, applies


def test_plan_on_a_hugging_face_config(tmp_path, capsys):
    cfg = tmp_path / "tiny-llama" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY_LLAMA))
    out = tmp_path / "plan.json"
    # a directory holding config.json works as well as the file
    rc = main(["plan", "--hf-config", str(cfg.parent), "--cluster", "dgx-a100-80g", "--nodes", "1", "--batch", "16",
               "--seq", "64", "--no-baselines", "--ilp-prices", "--tp", "1,2", "--pp", "1", "--out", str(out)])
    assert rc == 0
    said = capsys.readouterr()
    first = said.out.splitlines()[0]
    # no --precision on GPUs: bf16, and a line says so
    assert first.startswith("plan for tiny-llama on 8 devices in bf16:"), first
    assert "precision bf16 (mixed: fp32 masters), the default on A100" in said.err, said.err
    p = ParallelPlan.load(out)
    assert p.model == "tiny-llama" and p.precision == "bf16" and p.world_size == 8
    names = [lp.name for lp in p.layers]
    assert any("layers.0" in n for n in names) and any("layers.1" in n for n in names)
    # the saved plan explained from its file alone, a layer against its alternatives
    capsys.readouterr()
    assert main(["explain", str(out), "--layer", names[1]]) == 0
    said = capsys.readouterr().out
    assert said.startswith("plan for tiny-llama on 8 devices") and names[1] in said.split("\n\n", 1)[1]
    assert main(["explain", str(out), "--layer", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--layer 'nope': the plan has no such layer" in err and names[0] in err
    # the saved plan lowers for the same config
    assert main(["lower", "--hf-config", str(cfg), "--plan", str(out), "--out", str(tmp_path / "low")]) in (0, 1)
    summary = json.loads((tmp_path / "low" / "summary.json").read_text())
    assert len(summary["layers"]) == len(p.layers)


def test_plan_on_the_users_own_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_models.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["inspect", "--model", "my_models:build", "--batch", "4"])
    assert rc == 0 and "layers.2" in capsys.readouterr().out
    rc = main(["plan", "--model", "my_models:build", "--cluster", "dgx-a100-80g", "--batch", "16", "--precision",
               "bf16", "--no-baselines", "--ilp-prices"])
    assert rc == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("plan for my_models:build on 8 devices in bf16:")
    # lossy gradient communication, allowed from the command line: bf16 sums where there are dp sums
    rc = main(["plan", "--model", "my_models:build", "--cluster", "dgx-a100-80g", "--nodes", "2", "--batch", "16",
               "--no-baselines", "--ilp-prices", "--max-tp", "1", "--pp", "1", "--reduce-dtypes", "float32,bfloat16",
               "--powersgd-ranks", "0"])
    assert rc == 0 and "(gradient sums bf16)" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("argv, expect", [
    (["plan"], "give one model"),
    (["plan", "gpt-tiny", "--hf-config", "x.json"], "a zoo name and --hf-config"),
    (["plan", "--hf-config", "/nonexistent/config.json"], "no such file"),
    (["plan", "--model", "no_colon"], "expected module:function"),
    (["plan", "--model", "no_such_module_xyz:build"], "cannot import build"),
    (["plan", "gpt-nope"], "known: "),
    (["plan", "gpt-tiny", "--cluster", "nowhere-9000"], "neither a preset"),
])
def test_bad_model_or_cluster_is_a_clear_error(argv, expect, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err


def test_nodes_next_to_a_cluster_file_is_an_error(tmp_path, capsys):
    from galvatron_fx.cluster import Cluster

    path = tmp_path / "c.json"
    Cluster.preset("dgx-a100-80g").to_json(path)
    assert main(["plan", "gpt-tiny", "--cluster", str(path), "--nodes", "2"]) == 2
    assert "describes its own nodes" in capsys.readouterr().err


def test_hf_config_without_model_type(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 8}))
    assert main(["inspect", "--hf-config", str(cfg)]) == 2
    assert "model_type" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expect", [
    (["export", "ckpt"], "--out model.safetensors and/or --hf-dir"),
    (["export", "ckpt", "--hf-dir", "d"], "needs --hf-config"),
    (["export", "/nonexistent/ckpt", "--out", "m.safetensors"], "no checkpoint at"),
])
def test_export_errors_say_what_to_pass(argv, expect, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err


def test_export_refuses_a_directory_that_is_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "m.safetensors")]) == 2
    assert "manifest" in capsys.readouterr().err
    assert not (tmp_path / "m.safetensors").exists()
