"""``galvatron-fx train``: a TOML run config under torchrun, flags overriding its keys, metrics
lines, a checkpoint resumed, and its weights exported (and read back into a fresh model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from galvatron_fx.cli import main, parse_args
from galvatron_fx.cli.train import resolve_run
from galvatron_fx.errors import ConfigError

RUN = """[model]
name = "gpt-tiny"

[parallelism]
pp = [1]

[training]
batch = 8
seq = 32
steps = 4

[optimizer]
lr = 3e-3

[checkpoint]
dir = "ckpt"

[metrics]
out = "out"
"""
# a real run's recipe: token-file data with a validation split, warmup then cosine, weight decay,
# clipping, a line every 2 steps and a val loss every 2 (flat names: the flags')
RECIPE = """data = "tokens.bin"
warmup = 2
schedule = "cosine"
min_lr = 3e-4
weight_decay = 0.1
max_norm = 0.5
log_every = 2
eval_every = 2
"""


def write_tokens(path: Path, n: int = 20_000, vocab: int = 64) -> None:
    """A token file (uint16) of short motifs repeated in random order: a language model learns it."""
    import numpy as np

    rng = np.random.default_rng(0)
    motifs = [rng.integers(0, vocab, size=int(rng.integers(5, 12))) for _ in range(8)]
    tokens = np.concatenate([motifs[i] for i in rng.integers(0, 8, size=n // 8)])[:n]
    tokens.astype(np.uint16).tofile(path)


def _train_alone(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``galvatron-fx train --config run.toml ARGS`` in one process (no torchrun) in ``cwd``."""
    cmd = [sys.executable, "-m", "galvatron_fx.cli", "train", "--config", "run.toml", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _torchrun(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "galvatron_fx.cli", "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def test_run_config_sections_types_and_overrides(tmp_path):
    from galvatron_fx.cli import run_config

    cfg = tmp_path / "sub" / "run.toml"
    cfg.parent.mkdir()
    cfg.write_text(RUN)
    run = run_config.load(cfg)
    assert run.metrics.out == str(cfg.parent / "out") and run.checkpoint.dir == str(cfg.parent / "ckpt")  # beside it
    assert (run.model.name, run.training.steps, run.optimizer.lr, run.parallelism.pp) == ("gpt-tiny", 4, 3e-3, [1])
    # the file, then --section.key overrides (TOML literals; a bare word a string), then the flags
    args = parse_args(["train", "--config", str(cfg), "--training.steps", "7", "--optimizer.schedule=cosine",
                       "--optimizer.warmup", "2", "--parallelism.tp", "[1, 2]", "--lr", "0.5", "--data.source",
                       "my.mod:batches"])
    run = resolve_run(args)
    assert run.training.steps == 7 and run.optimizer.schedule == "cosine" and run.optimizer.warmup == 2
    assert run.parallelism.tp == [1, 2] and run.optimizer.lr == 0.5 and run.data.source == "my.mod:batches"
    assert run.training.batch == 8 and run.parallelism.precision is None and run.optimizer.name == "adamw"
    assert resolve_run(parse_args(["train", "--config", str(cfg), "--training.steps", "7", "--steps", "9"])
                       ).training.steps == 9  # a flag over an override
    # flat names (the flags') at the top level are the same keys
    cfg.write_text('model = "gpt-tiny"\nsteps = 3\ncheckpoint_dir = "c"\noptimizer = "sgd"\n')
    run = run_config.load(cfg)
    assert (run.training.steps, run.checkpoint.dir, run.optimizer.name) == (3, str(cfg.parent / "c"), "sgd")
    json.dumps(run.to_dict())  # (written beside the run's metrics)
    for text, expect in [("stepz = 3\n", "unknown key 'stepz'"), ("[training]\nstepz = 3\n", "has no key 'stepz'"),
                         ("[trainin]\nsteps = 3\n", "unknown key 'trainin'"),
                         ("[training]\nsteps = \"4\"\n", "training.steps = '4' should be a int"),
                         ("tp = [\"a\"]\n", "list of ints"), ("steps = [\n", "not valid TOML")]:
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=expect.replace("[", r"\[")):
            run_config.load(cfg)
    cfg.write_text(RUN)
    for argv, expect in [(["--training.stepz", "3"], "has no key 'stepz'"), (["--trainin.steps", "3"], "unknown section"),
                         (["--training.steps", "x"], "should be a int"),
                         (["--optimizer.warmup", "9"], "optimizer.warmup = 9: give fewer steps")]:
        with pytest.raises(ConfigError, match=expect):
            resolve_run(parse_args(["train", "--config", str(cfg), *argv]))
    with pytest.raises(SystemExit):  # only train takes them
        parse_args(["plan", "gpt-tiny", "--training.steps", "3"])
    big = tmp_path / "big.toml"  # a file that is no config: refused unread, not loaded into memory
    with big.open("wb") as f:
        f.truncate(17 * 2**20)
    with pytest.raises(ConfigError, match="larger than 16 MiB"):
        run_config.load(big)


def test_train_resume_and_export(tmp_path):
    from galvatron_fx.cli.train_recipe import lr_at

    (tmp_path / "run.toml").write_text(RECIPE + RUN)  # (flat keys before the first [section])
    write_tokens(tmp_path / "tokens.bin")
    proc = _torchrun(tmp_path, "--config", "run.toml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "plan for" in proc.stderr and "in fp32" in proc.stderr
    assert "precision fp32, the default on " in proc.stderr  # CPUs: fp32, said once
    # it says what it trains on and how, and logs its lines (and the val loss) on rank 0
    assert "data: " in proc.stderr and "tokens.bin (20,000 tokens, 2,000 held out)" in proc.stderr, proc.stderr[-3000:]
    assert "2 warmup steps, then cosine" in proc.stderr and "clipped to norm 0.5" in proc.stderr
    logged = [l for l in proc.stderr.splitlines() if l.startswith("step ") and " | " in l]
    assert [l.split(" | ")[0] for l in logged] == ["step 2/4", "step 4/4"], logged
    assert all("val loss" in l and "grad norm" in l and "lr " in l for l in logged), logged
    # compile() says what runs and on which figures, once (rank 0)
    said = [l for l in proc.stderr.splitlines() if l.startswith("galvatron_fx: plan for")]
    assert len(said) == 1 and "ms per step" in said[0] and "hardware: " in said[0], proc.stderr[-3000:]
    lines = [json.loads(l) for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3, 4]
    assert {"loss", "tokens_per_s", "step_s", "memory_bytes", "mfu"} <= set(lines[0])
    assert lines[-1]["loss"] < lines[0]["loss"]  # it learns the token file
    assert all(l["tokens_per_s"] > 0 and l["mfu"] > 0 for l in lines)
    assert [l["lr"] for l in lines] == pytest.approx([lr_at(i, lr=3e-3, steps=4, warmup=2, schedule="cosine",
                                                            min_lr=3e-4) for i in range(4)])
    assert all(l["grad_norm"] > 0.5 for l in lines)  # (the norm before clipping: every step clipped)
    assert [("val_loss" in l) for l in lines] == [False, True, False, True] and lines[3]["val_loss"] < lines[1]["val_loss"]
    # the third step is profiled: each stage's measured compute density
    assert [l["profiled"] for l in lines] == [False, False, True, False], lines
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    # the plan's predicted step and the profiled one as Chrome traces (Perfetto)
    predicted = json.loads((tmp_path / "out" / "predicted_trace.json").read_text())
    spans = [e for e in predicted["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * plan["num_microbatches"] * plan["pp"] * plan.get("virtual_stages", 1), spans[:3]
    assert all(e["dur"] > 0 for e in spans)
    for r in range(2):
        profiled = json.loads((tmp_path / "out" / f"step_trace.rank{r}.json").read_text())
        assert any(e.get("name", "").startswith("aten::") for e in profiled["traceEvents"])
    density = lines[2]["compute_density"]
    assert len(density) == plan["pp"] and all(0 < d <= 1 for d in density), density
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["measured"]["step_time_s"] > 0 and report["predicted"]["step_time_s"] > 0
    assert report["measured"]["compute_density"] == density and 0 < report["measured"]["mfu"] < 1
    assert report["predicted"]["mfu"] == plan["predicted"]["mfu"] > 0
    # the same scalars for TensorBoard (its package is a dev dependency: make test installs it)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "out" / "tensorboard"))
    board.Reload()
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss"} <= set(board.Tags()["scalars"]), board.Tags()
    assert [e.step for e in board.Scalars("loss")] == [1, 2, 3, 4]
    assert [e.value for e in board.Scalars("loss")] == pytest.approx([l["loss"] for l in lines])
    page = (tmp_path / "out" / "report.html").read_text()  # the run's page, its measurements in it
    assert 'id="pvm"' in page and 'id="step_chart"' in page and 'id="loss_chart"' in page
    assert "<td>MFU</td>" in page and "<td>compute density (stage 0)</td>" in page
    config = json.loads((tmp_path / "out" / "run_config.json").read_text())  # what the run resolved, by section
    assert config["training"]["steps"] == 4 and config["optimizer"]["schedule"] == "cosine"
    # a flag and a --section.key override the file: 2 more steps, resumed from the checkpoint at
    # step 4, a line each
    proc = _torchrun(tmp_path, "--config", "run.toml", "--steps", "6", "--metrics.log_every", "1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr and "at step 4" in proc.stderr
    logged = [l.split(" | ")[0] for l in proc.stderr.splitlines() if l.startswith("step ") and " | " in l]
    assert logged == ["step 5/6", "step 6/6"], logged
    steps = [json.loads(l)["step"] for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    # the trained weights out, into a fresh model of the same kind
    import torch
    from safetensors.torch import load_file

    from galvatron_fx import zoo

    out = tmp_path / "model.safetensors"
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    weights = load_file(str(out))
    fresh, inputs = zoo.build("gpt-tiny", batch_size=8, seq_len=32, device="cpu", seed=0)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    got = fresh.load_state_dict(weights, strict=False)
    assert not got.unexpected_keys and set(got.missing_keys) <= {"head.weight", "lm_head.weight"}, got
    assert any(not torch.equal(before[k], v) for k, v in fresh.state_dict().items())  # trained, not the init


def _agents(cwd: Path, nodes: int, per_node: int, *args: str) -> list[subprocess.CompletedProcess]:
    """``nodes`` torchrun agents on this host (static rendezvous on loopback), each starting
    ``per_node`` processes of ``galvatron-fx train``: several nodes as a user launches them
    (with an empty hardware-profile cache: the session's may hold a profile of this machine)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (cwd / "cache").mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GFX_CACHE_DIR": str(cwd / "cache")}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(r),
         "--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "galvatron_fx.cli", "train", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in range(nodes)]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=900)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return done


@pytest.mark.slow
def test_two_agents_as_two_nodes_train_as_one_agent(tmp_path):
    """Two torchrun agents of two processes each on loopback are a two-node cluster (the train
    command counts the agents): the same plan and the same losses as one agent of four processes
    told ``--nodes 2``, no host warning, and the run's report marks the groups that cross nodes."""
    args = ["gpt-tiny", "--batch", "8", "--seq", "32", "--steps", "3", "--lr", "3e-3", "--pp", "1,2"]
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir(), one.mkdir()
    procs = _agents(two, 2, 2, *args, "--out", "out")
    for p in procs:
        assert p.returncode == 0, p.stderr[-4000:]
    said = procs[0].stderr
    assert "on 4 devices (2 nodes × 2)" in said and "different hosts" not in said, said[-3000:]
    assert "--nproc-per-node 4 -m galvatron_fx.cli profile" in said  # one host's profile measures it
    (proc,) = _agents(one, 1, 4, *args, "--nodes", "2", "--out", "out")
    assert proc.returncode == 0, proc.stderr[-4000:]
    plans = [{k: v for k, v in json.loads((d / "out" / "plan.json").read_text()).items() if k != "solver_stats"}
             for d in (two, one)]  # (the search's own timings differ)
    assert plans[0]["cluster"]["num_nodes"] == 2 and plans[0] == plans[1]
    losses = [[json.loads(l)["loss"] for l in (d / "out" / "metrics.jsonl").read_text().splitlines()]
              for d in (two, one)]
    assert len(losses[0]) == 3 and losses[0] == losses[1], losses
    page = (two / "out" / "report.html").read_text()
    assert 'class="cross">inter-node<' in page  # four devices on two nodes: some group crosses


@pytest.mark.slow
def test_two_agents_train_with_stages_laid_off_a_slow_link(tmp_path):
    """Four one-process "nodes" whose link 0-1 is slow, started by two torchrun agents: the plan
    lays its two stages on nodes {0, 2} and {1, 3} (data-parallel groups off the slow link), the
    runtime builds its meshes in that order, and the losses are those of the node-major layout
    (a cluster without the slow link) within fp32 rounding."""
    import dataclasses

    from galvatron_fx.cluster import Cluster

    runs = {}
    for name, links in (("slow", ((0, 1, 0.1),)), ("fast", ())):
        d = tmp_path / name
        d.mkdir()
        cluster = Cluster.local_cpu(4, nodes=4, devices_per_node=1)
        dataclasses.replace(cluster, slow_links=links).to_json(d / "cluster.json")
        args = ["gpt-tiny", "--batch", "8", "--seq", "32", "--steps", "3", "--lr", "3e-3", "--pp", "2",
                "--cluster", "cluster.json", "--out", "out"]
        procs = _agents(d, 2, 2, *args) if name == "slow" else _agents(d, 1, 4, *args)
        for p in procs:
            assert p.returncode == 0, p.stderr[-4000:]
        plan = json.loads((d / "out" / "plan.json").read_text())
        losses = [json.loads(l)["loss"] for l in (d / "out" / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (plan, losses, procs[0].stderr)
    (slow, slow_losses, said), (fast, fast_losses, _) = runs["slow"], runs["fast"]
    assert slow["stage_ranks"] == [[0, 2], [1, 3]] and fast["stage_ranks"] == [[0, 1], [2, 3]]
    from galvatron_fx.ir.plan import ParallelPlan

    assert "stages laid on nodes 0,2 | 1,3" in ParallelPlan.load(tmp_path / "slow" / "out" / "plan.json").explain()
    assert "different hosts" not in said
    assert len(slow_losses) == 3 and slow_losses == pytest.approx(fast_losses, rel=1e-5), (slow_losses, fast_losses)


ELASTIC = """model = "gpt-tiny"
batch = 8
seq = 32
steps = 30
lr = 3e-3
out = "out"
checkpoint_dir = "ckpt"
checkpoint_every = 2
""" + RECIPE.replace("eval_every = 2", "eval_every = 10")


@pytest.mark.slow
def test_a_job_that_loses_a_rank_resumes_on_the_rest(tmp_path):
    """Elastic resume: a world-4 ``galvatron-fx train`` checkpointing every 2 steps loses a rank
    (SIGKILL) mid-run; the same command at world 2 re-plans for 2 devices, loads the last
    checkpoint under its plan and finishes, its losses those of an uninterrupted world-2 run
    from the resumed step on (fp32: within float rounding of two plans' sums)."""
    import signal
    import time

    job, ref = tmp_path / "job", tmp_path / "ref"
    job.mkdir(), ref.mkdir()
    for d in (job, ref):
        (d / "run.toml").write_text(ELASTIC)
        write_tokens(d / "tokens.bin")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "-m", "galvatron_fx.cli", "train", "--config", "run.toml"]
    four = subprocess.Popen(cmd, cwd=job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = job / "out" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and four.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 7:
                break
            time.sleep(0.05)
        assert four.poll() is None, "the world-4 job ended before a rank could be lost: " + four.stderr.read()[-3000:]
        workers = subprocess.run(["ps", "-o", "pid=", "--ppid", str(four.pid)], capture_output=True, text=True)
        pids = [int(p) for p in workers.stdout.split()]
        assert len(pids) == 4, workers.stdout
        os.kill(pids[-1], signal.SIGKILL)  # a rank is lost
        _, err = four.communicate(timeout=600)
    finally:
        if four.poll() is None:
            four.kill()
    assert four.returncode != 0
    lost_at = len(metrics.read_text().splitlines())
    assert lost_at < 30, "the job finished before the rank was lost"
    resumed = _torchrun(job, "--config", "run.toml")  # the same command, 2 processes
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    said = [l for l in resumed.stderr.splitlines() if l.startswith("resumed from")]
    assert said, resumed.stderr[-3000:]
    start = int(said[0].rsplit(" ", 1)[1])
    assert 2 <= start <= lost_at and start % 2 == 0
    plan = json.loads((job / "out" / "plan.json").read_text())
    assert plan["world_size"] == 2
    assert _torchrun(ref, "--config", "run.toml").returncode == 0
    by_step = {}
    for line in metrics.read_text().splitlines():  # the resumed run's lines come last
        by_step[json.loads(line)["step"]] = json.loads(line)["loss"]
    want = {json.loads(l)["step"]: json.loads(l)["loss"] for l in (ref / "out" / "metrics.jsonl").read_text().splitlines()}
    assert sorted(by_step) == list(range(1, 31))
    after = [s for s in range(start + 1, 31)]
    assert [by_step[s] for s in after] == pytest.approx([want[s] for s in after], rel=1e-4, abs=1e-5)
    # the schedule and the data went on from the checkpoint's step: the same rates, the same val losses
    lines = {json.loads(l)["step"]: json.loads(l) for l in metrics.read_text().splitlines()}
    ref_lines = {json.loads(l)["step"]: json.loads(l) for l in (ref / "out" / "metrics.jsonl").read_text().splitlines()}
    assert [lines[s]["lr"] for s in after] == pytest.approx([ref_lines[s]["lr"] for s in after])
    assert lines[30]["val_loss"] == pytest.approx(ref_lines[30]["val_loss"], rel=1e-4)


def test_train_starts_from_a_save_pretrained_directory(tmp_path):
    """``init = "hf:DIR"``: the model is DIR's (its config.json), with DIR's weights; the first
    step's loss is that of the saved model on the first batch of the data: a tokenized
    ``datasets`` dataset saved with ``save_to_disk`` (``data.source = "datasets:DIR"``)."""
    import numpy as np
    import torch

    hf_tiny = pytest.importorskip("hf_tiny")
    datasets = pytest.importorskip("datasets")
    from galvatron_fx.cli.train_recipe import TokenFile

    model, _ = hf_tiny.build("llama", seed=5)
    model.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    write_tokens(tmp_path / "tokens.bin")
    rows = np.fromfile(tmp_path / "tokens.bin", dtype=np.uint16).astype(np.int64).reshape(-1, 100).tolist()
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "ds"))
    (tmp_path / "run.toml").write_text('[model]\ninit = "hf:hf"\n[data]\nsource = "datasets:ds"\n'
                                       '[training]\nbatch = 4\nseq = 16\nsteps = 1\n'
                                       '[metrics]\nout = "out"\nefficiency_every = 0\n')
    proc = _torchrun(tmp_path, "--config", "run.toml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "initialised" in proc.stderr and "tensors from" in proc.stderr
    assert "data: " in proc.stderr and "(20,000 tokens, 2,000 held out)" in proc.stderr, proc.stderr[-2000:]
    (line,) = [json.loads(l) for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    windows = TokenFile.from_datasets(tmp_path / "ds").train_batch(0, 4, 16)
    with torch.no_grad():
        want = model(**TokenFile.fill(windows, "hf", {"input_ids": windows, "labels": windows}, None, "t")).loss
    assert line["loss"] == pytest.approx(want.item(), rel=1e-5)


def test_a_non_finite_loss_stops_the_run_or_is_skipped_as_told(tmp_path):
    """An exploding run (lr 1e30): the first non-finite loss stops it with a clear error naming the
    step (exit 2), its metrics line strict JSON with null and the reason; with nan_tolerance the
    bad steps are skipped (the optimizer does not step on them) and the run ends."""
    (tmp_path / "run.toml").write_text('[model]\nname = "gpt-tiny"\n[training]\nbatch = 2\nseq = 16\nsteps = 3\n'
                                       '[optimizer]\nlr = 1e30\n[metrics]\nout = "out"\nefficiency_every = 0\n')
    run = lambda *a: _train_alone(tmp_path, *a)  # noqa: E731
    proc = run()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: step 2: the loss is nan" in proc.stderr and "nan_tolerance" in proc.stderr, proc.stderr[-2000:]
    lines = [json.loads(l) for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]  # strict JSON
    assert [l["loss"] is None for l in lines] == [False, True] and "did not step" in lines[1]["skipped"]
    (tmp_path / "out" / "metrics.jsonl").unlink()
    proc = run("--training.nan_tolerance", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 3: non-finite loss nan" in proc.stderr and "(2 of 5 tolerated)" in proc.stderr
    lines = [json.loads(l) for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [l["loss"] is None for l in lines] == [False, True, True]


def test_a_runs_checkpoints_are_kept_resumed_from_the_newest_that_loads_or_refused_first(tmp_path):
    """checkpoint.dir holds step-<N> checkpoints, the newest checkpoint.keep kept; a rerun resumes
    from the newest that loads (a damaged newest one is said and passed over); a directory of
    other files, or of checkpoints none of which loads, is refused before the first step."""
    (tmp_path / "run.toml").write_text('[model]\nname = "gpt-tiny"\n[training]\nbatch = 2\nseq = 16\nsteps = 4\n'
                                       '[checkpoint]\ndir = "ck"\nevery = 1\nkeep = 2\n'
                                       '[metrics]\nout = "out"\nefficiency_every = 0\n')
    run = lambda *a: _train_alone(tmp_path, *a)  # noqa: E731
    proc = run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-3", "step-4"]  # keep = 2
    (tmp_path / "ck" / "step-4" / "manifest.json").unlink()  # the newest is damaged (an unfinished save)
    proc = run("--steps", "6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not resuming from" in proc.stderr and "step-4" in proc.stderr
    assert "step-3 at step 3" in proc.stderr and "set aside as .step-4.unloadable-" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.startswith(".")) == ["step-5", "step-6"]
    steps = [json.loads(l)["step"] for l in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 4, 5, 6]
    # a directory of the user's files, or of checkpoints none of which loads: refused before any step
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    proc = run("--checkpoint.dir", str(other))
    assert proc.returncode == 2 and "holds files that are not checkpoints (notes.txt)" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out2").exists() and (other / "notes.txt").read_text() == "mine"
    broken = tmp_path / "broken"
    (broken / "step-9").mkdir(parents=True)
    proc = run("--checkpoint.dir", str(broken), "--metrics.out", str(tmp_path / "out3"))
    assert proc.returncode == 2 and "none of which loads into this run" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out3" / "metrics.jsonl").exists() or not (tmp_path / "out3" / "metrics.jsonl").read_text()
