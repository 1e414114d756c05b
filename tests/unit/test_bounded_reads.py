"""Every file the project reads is read bounded and checked: a file that never ends (/dev/zero,
or a symlink to it), JSON nested 100,000 deep, fields of the wrong type, a model config no model
has, an output path that is a directory: each a ConfigError naming the file and what to do,
at once, never a MemoryError, RecursionError, KeyError or a build that runs for minutes."""

from __future__ import annotations

import json
import os
import time

import pytest

import galvatron_fx as gfx
from galvatron_fx.errors import ConfigError

ZERO = "/dev/zero"
DEEP = "[" * 100_000 + "]" * 100_000


def _zero_link(path):
    os.symlink(ZERO, path)
    return path


@pytest.mark.timing
def test_a_plan_or_cluster_file_that_never_ends_or_nests_too_deep_is_refused(tmp_path):
    for bad in (_zero_link(tmp_path / "plan.json"), ZERO):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="larger than 16 MiB"):
            gfx.ParallelPlan.load(bad)
        assert time.perf_counter() - t0 < 10
    (tmp_path / "deep.json").write_text(DEEP)
    with pytest.raises(ConfigError, match="nests deeper than 64"):
        gfx.ParallelPlan.load(tmp_path / "deep.json")
    with pytest.raises(ConfigError, match="larger than 16 MiB"):
        gfx.Cluster.from_json(_zero_link(tmp_path / "cluster.json"))
    with pytest.raises(ConfigError, match="cannot be read"):
        gfx.ParallelPlan.load(tmp_path)  # a directory


def test_a_runs_report_and_metrics_are_read_bounded_and_checked(tmp_path):
    from galvatron_fx.report.html import read_run

    run = tmp_path / "run"
    run.mkdir()
    _zero_link(run / "metrics.jsonl")  # a line that never ends
    with pytest.raises(ConfigError, match="a line longer than 64 KiB"):
        read_run(run)
    (run / "metrics.jsonl").unlink()
    (run / "report.json").write_text(DEEP)
    with pytest.raises(ConfigError, match="nests deeper than 64"):
        read_run(run)
    (run / "report.json").write_text(json.dumps({"predicted": "fast", "measured": {}}))
    with pytest.raises(ConfigError, match="'predicted' holds str, not an object"):
        read_run(run)
    (run / "report.json").unlink()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": "abc", "loss": 1.0}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: step 'abc' is not a step number"):
        read_run(run)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": "low", "compute_density": [0.5], "x": {"a": 1}}\n')
    assert read_run(run)["metrics"] == [{"step": 1, "compute_density": [0.5]}]  # only figures are kept


@pytest.mark.timing
def test_a_hugging_face_config_no_model_has_is_refused_before_building(tmp_path):
    from galvatron_fx.frontend import model_source

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 10**7, "hidden_size": 64,
                               "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 128}))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="num_hidden_layers = 10000000: a model of more than 4096 layers"):
        model_source.build_hf(cfg, batch_size=1, seq_len=8)
    assert time.perf_counter() - t0 < 10
    _zero_link(tmp_path / "zero.json")
    with pytest.raises(ConfigError, match="larger than 16 MiB"):
        model_source.hf_config(tmp_path / "zero.json")
    # an Auto* factory named as the architecture: the model class for its type is built instead
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64,
                               "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 128,
                               "architectures": ["AutoModel"]}))
    model, _args, kwargs = model_source.build_hf(cfg, batch_size=1, seq_len=8)
    assert type(model).__name__ == "LlamaForCausalLM" and kwargs["input_ids"].shape == (1, 8)


def test_outputs_named_as_directories_are_refused(tmp_path):
    from galvatron_fx.report import html as report_html

    plan_dir = tmp_path / "out"
    plan_dir.mkdir()
    from galvatron_fx import zoo

    model, inputs = zoo.build("gpt-tiny", batch_size=2, seq_len=16, device="cpu")
    plan = gfx.plan(gfx.capture(model, inputs), gfx.Cluster.local_cpu(1), global_batch_size=2)
    with pytest.raises(ConfigError, match="is a directory; give the plan a file name"):
        plan.save(plan_dir)
    with pytest.raises(ConfigError, match="is a directory; give the report a file name"):
        report_html.write(plan, plan_dir)


def test_a_checkpoint_manifest_that_never_ends_is_refused(tmp_path):
    from galvatron_fx.runtime.checkpoint.files import MANIFEST, read_manifest

    (tmp_path / "ck").mkdir()
    _zero_link(tmp_path / "ck" / MANIFEST)
    with pytest.raises(ConfigError, match="larger than 256 MiB"):
        read_manifest(tmp_path / "ck")


@pytest.mark.timing
def test_dcp_metadata_that_never_ends_is_refused(tmp_path):
    from galvatron_fx.runtime.checkpoint.files import read_dcp_metadata

    (tmp_path / "ck").mkdir()
    _zero_link(tmp_path / "ck" / ".metadata")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="larger than 256 MiB"):
        read_dcp_metadata(tmp_path / "ck")
    assert time.perf_counter() - t0 < 30
