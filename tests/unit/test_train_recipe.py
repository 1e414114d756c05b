"""The pieces of a training run around its step (galvatron_fx.cli.train_recipe) and the run config's
checks of them: token files, the learning-rate schedule, parameter groups, weights from a
``save_pretrained`` directory."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from galvatron_fx.cli import parse_args
from galvatron_fx.cli.train import resolve_run
from galvatron_fx.cli.train_recipe import TokenFile, init_from_hf, lr_at, param_groups, vocab_size
from galvatron_fx.errors import ConfigError


def test_schedules_warm_up_then_fall_to_min_lr():
    kw = dict(lr=1.0, steps=12, warmup=2, min_lr=0.1)
    for schedule in ("cosine", "linear"):
        got = [lr_at(i, schedule=schedule, **kw) for i in range(12)]
        assert got[:2] == [0.5, 1.0] and got[2] == pytest.approx(1.0) and got[-1] == pytest.approx(0.1)
        assert all(a >= b for a, b in zip(got[2:], got[3:])), got  # never rises after warmup
    assert lr_at(5, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 9)))
    assert lr_at(5, schedule="linear", **kw) == pytest.approx(0.1 + 0.9 * (1 - 3 / 9))
    assert [lr_at(i, lr=2.0, steps=5) for i in range(5)] == [2.0] * 5


def test_parameter_groups_spare_biases_and_norms():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, rest = param_groups(model.named_parameters(), 0.1)
    assert decay["weight_decay"] == 0.1 and [p.shape for p in decay["params"]] == [(4, 4)]
    assert rest["weight_decay"] == 0.0 and len(rest["params"]) == 3


def _tokens(path, values, dtype=np.uint16):
    np.asarray(values, dtype=dtype).tofile(path)
    return path


def test_token_file_batches_are_seeded_by_step_and_split(tmp_path):
    path = _tokens(tmp_path / "t.bin", np.arange(1000) % 50)
    tf = TokenFile(path, val_fraction=0.2, seed=3)
    assert tf.split == 800 and tf.has_val
    a, b = tf.train_batch(7, 4, 16), tf.train_batch(7, 4, 16)
    assert a.shape == (4, 17) and torch.equal(a, b) and not torch.equal(a, tf.train_batch(8, 4, 16))
    assert torch.equal(a, TokenFile(path, val_fraction=0.2, seed=3).train_batch(7, 4, 16))  # a resumed run's
    # windows are consecutive tokens, the training ones from the first 800, the validation ones after
    assert bool(((a[:, 1:] - a[:, :-1]) % 50 == 1).all())
    v = tf.val_batch(0, 4, 16)
    assert torch.equal(v, tf.val_batch(0, 4, 16))
    hf = TokenFile.fill(a, TokenFile.layout({"input_ids": a, "labels": a}), {"input_ids": a, "labels": a}, 64, "t")
    assert torch.equal(hf["input_ids"], a[:, :-1]) and torch.equal(hf["labels"], a[:, :-1])  # HF shifts its labels
    x, y = TokenFile.fill(a, "pair", (a, a), 64, "t")
    assert torch.equal(x, a[:, :-1]) and torch.equal(y, a[:, 1:])  # next-token targets


def test_token_files_that_cannot_feed_the_model_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        TokenFile(tmp_path / "missing.bin")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ConfigError, match="not a whole number of uint16"):
        TokenFile(odd)
    short = TokenFile(_tokens(tmp_path / "s.bin", range(20)), val_fraction=0.5)
    with pytest.raises(ConfigError, match="fewer than one window"):
        short.train_batch(0, 2, 16)
    big = TokenFile(_tokens(tmp_path / "b.bin", [70000] * 100, np.uint32), dtype="uint32", val_fraction=0.0)
    with pytest.raises(ConfigError, match="beyond the model's vocabulary of 50257"):
        TokenFile.fill(big.train_batch(0, 2, 8), "pair", (torch.zeros(2, 8, dtype=torch.long),) * 2, 50257, "data")
    with pytest.raises(ConfigError, match="feeds causal language models"):
        TokenFile.layout({"pixel_values": torch.zeros(2, 3), "labels": torch.zeros(2)})
    with pytest.raises(ConfigError, match="feeds causal language models"):
        TokenFile.layout((torch.zeros(2, 3),))


@pytest.mark.parametrize("text,expect", [
    ("lr = nan\n", "lr = nan: give a positive"), ("lr = -1\n", "lr = -1: give a positive"),
    ("max_norm = 0\n", "max_norm = 0"), ("schedule = \"step\"\n", "one of cosine, linear, constant"),
    ("warmup = 30\n", "fewer steps than training.steps = 20"), ("eval_every = 5\n", "eval_every needs data"),
    ("log_every = 0\n", "log_every = 0"), ("checkpoint_every = -1\n", "checkpoint.every = -1"),
    ("val_fraction = 1.5\n", "val_fraction = 1.5"), ("init = \"weights/\"\n", "hf:DIR"),
    ("weight_decay = -0.1\n", "weight_decay = -0.1"), ("min_lr = 1.0\n", "min_lr = 1.0: give a learning rate in"),
    ("nodes = 0\n", "parallelism.nodes = 0: give a number of nodes >= 1"), ("batch = 0\n", "training.batch = 0"),
    ("batch = 1000000000000000\n", "training.batch = 1000000000000000: give a global batch of 1 to"),
    ("batch = \"9:3\"\n", "training.batch = '9:3'"), ("batch = \"many\"\n", "training.batch = 'many'"),
    ("seq = -1\n", "training.seq = -1"), ("memory = -2\n", "parallelism.memory = -2"), ("tp = [0]\n", "parallelism.tp"),
    ("max_pp = 0\n", "parallelism.max_pp = 0"), ("tokens_per_step = 0\n", "training.tokens_per_step = 0"),
    ("out = \"run.toml\"\n", "metrics.out = "),
])
def test_a_run_config_with_a_nonsense_recipe_is_refused(tmp_path, text, expect):
    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "gpt-tiny"\n' + text)
    with pytest.raises(ConfigError, match=expect.replace("[", r"\[").replace("(", r"\(")):
        resolve_run(parse_args(["train", "--config", str(cfg)]))


def test_init_from_a_save_pretrained_directory(tmp_path):
    hf_tiny = pytest.importorskip("hf_tiny")

    trained, _ = hf_tiny.build("llama", seed=1)
    trained.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    fresh, _ = hf_tiny.build("llama", seed=2)
    assert any(not torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    assert init_from_hf(fresh, tmp_path / "hf") > 0
    for (k, a), b in zip(fresh.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(a, b), k
    assert vocab_size(fresh) == fresh.config.vocab_size
    with pytest.raises(ConfigError, match="no model.safetensors"):
        init_from_hf(fresh, tmp_path)
    other, _ = hf_tiny.build("gpt2")
    with pytest.raises(ConfigError, match="do not fit this model"):
        init_from_hf(other, tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ConfigError, match="cannot read model.safetensors"):
        init_from_hf(fresh, tmp_path / "hf")


@pytest.mark.timing
def test_a_bad_run_config_is_refused_before_torch_is_imported(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "gpt-tiny"\nlr = nan\n')
    code = ("import sys\nfrom galvatron_fx.cli import main\n"
            f"rc = main(['train', '--config', {str(cfg)!r}])\n"
            "print(rc, 'TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "NO-TORCH"], proc.stdout + proc.stderr[-2000:]
    assert "lr = nan: give a positive learning rate" in proc.stderr


def test_a_saved_datasets_dataset_feeds_the_same_windows(tmp_path):
    """A tokenized Hugging Face dataset saved with save_to_disk: its input_ids rows as one stream,
    a DatasetDict's validation split held out, one Dataset's tail by val_fraction; bad ones refused."""
    datasets = pytest.importorskip("datasets")
    rows = [[int(t) for t in np.arange(i * 10, i * 10 + 7) % 50] for i in range(40)]
    flat = np.concatenate([np.asarray(r) for r in rows])
    ds = datasets.Dataset.from_dict({"input_ids": rows, "text": ["x"] * 40})
    ds.save_to_disk(str(tmp_path / "one"))
    tf = TokenFile.from_datasets(tmp_path / "one", val_fraction=0.25, seed=3)
    assert np.array_equal(tf.tokens, flat) and tf.split == len(flat) - int(len(flat) * 0.25)
    a = tf.train_batch(2, 4, 8)
    assert a.shape == (4, 9) and torch.equal(a, TokenFile.from_datasets(tmp_path / "one", val_fraction=0.25,
                                                                        seed=3).train_batch(2, 4, 8))
    train_part = flat[: tf.split]
    for row in a.numpy():  # each a window of the stream's training part (rows joined, no padding)
        assert any(np.array_equal(train_part[s:s + 9], row) for s in range(len(train_part) - 8)), row
    dd = datasets.DatasetDict({"train": ds, "validation": datasets.Dataset.from_dict({"input_ids": [[1, 2, 3] * 5]})})
    dd.save_to_disk(str(tmp_path / "dict"))
    tf = TokenFile.from_datasets(tmp_path / "dict", val_fraction=0.5)
    assert tf.split == len(flat) and len(tf.tokens) == len(flat) + 15 and tf.has_val  # the split given, not 50%
    assert set(tf.val_batch(0, 2, 8).flatten().tolist()) <= {1, 2, 3}
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(tmp_path / "raw"))
    with pytest.raises(ConfigError, match="no input_ids; tokenize it first"):
        TokenFile.from_datasets(tmp_path / "raw")
    with pytest.raises(ConfigError, match="no such directory"):
        TokenFile.from_datasets(tmp_path / "missing")
    (tmp_path / "junk").mkdir()
    with pytest.raises(ConfigError, match="not a dataset saved with save_to_disk"):
        TokenFile.from_datasets(tmp_path / "junk")


def test_the_tensorboard_writer_records_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from galvatron_fx.cli.train_recipe import tensorboard_writer

    w = tensorboard_writer(tmp_path / "tb")
    for step, loss in enumerate([3.0, 2.5, 2.0], start=1):
        w.add_scalar("loss", loss, step)
    w.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 3.0), (2, 2.5), (3, 2.0)]


@pytest.mark.parametrize("argv, expect", [
    (["plan", "gpt-tiny", "--batch", "0"], "expected a batch of 1 to 2**30"),
    (["plan", "gpt-tiny", "--batch", "64:8"], "LO <= HI"), (["plan", "gpt-tiny", "--seq", "-1"], "expected a whole number"),
    (["plan", "gpt-tiny", "--nodes", "0"], "expected a whole number >= 1, got 0"),
    (["plan", "gpt-tiny", "--memory", "nan"], "expected a finite number > 0"),
    (["plan", "gpt-tiny", "--tp", "-2"], "integers >= 0"),
])
def test_nonsense_flags_are_refused_by_the_parser(argv, expect, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert expect in capsys.readouterr().err
