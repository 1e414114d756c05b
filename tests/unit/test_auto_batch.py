"""The automatic global batch: the largest batch that fits, the fastest in a range (gradient
accumulation allowed), the batch nearest a tokens-per-step target; why each was chosen; and the
errors that say what to pass instead."""

from __future__ import annotations

import json

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cli import main
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir.strategy import Precision
from galvatron_fx.search.auto_batch import AutoBatch
from galvatron_fx.search.candidates import SearchSpace
from galvatron_fx.search.outer_search import _Search

GiB = 2**30


@pytest.fixture(scope="module")
def gpt2():
    model, inputs = zoo.build("gpt2-small", batch_size=1, seq_len=1024, device="meta")
    return gfx.capture(model, inputs, name="gpt2-small")


@pytest.fixture(scope="module")
def rtx():
    return gfx.Cluster.preset("rtx4090-pcie", nodes=1)


def _plan(mg, cluster, batch, mem_gib, **kw):
    return gfx.plan(mg, cluster, global_batch_size=batch, memory_budget=int(mem_gib * GiB), precision="bf16",
                    baselines=False, **kw)


def _fits_at_once(mg, cluster, batch, mem_gib, space: SearchSpace | None = None) -> bool:
    """Whether some plan holds ``batch`` in one pass (the fewest micro-batches its schedule
    allows), asked of the probe and of the full search (every chain solved by the DP): they agree."""
    cm = AnalyticCostModel(cluster, precision=Precision.bf16())

    def search():
        return _Search(mg, cluster, cm, space or SearchSpace(), batch, int(mem_gib * GiB), False, microbatches="fewest")

    probe = search().fits()
    try:
        search().run()
        full = True
    except PlanError:
        full = False
    assert probe == full, (batch, mem_gib, probe, full)
    return probe


@pytest.mark.parametrize("mem", [7, 14])
def test_auto_is_the_largest_batch_that_fits_at_once(gpt2, rtx, mem):
    p = _plan(gpt2, rtx, "auto", mem)
    b, q = p.global_batch_size, p.solver_stats["batch_search"]["multiple_of"]
    assert q == 8 and b % q == 0
    assert max(p.predicted.device_peak_bytes) <= mem * GiB
    # checked apart from the search's own record: b fits at once, the next batch on the grid does not
    assert _fits_at_once(gpt2, rtx, b, mem) and not _fits_at_once(gpt2, rtx, b + q, mem)
    record = p.solver_stats["batch_search"]
    assert record["objective"] == "largest" and {"batch": b + q, "fits": False} in record["tried"]
    assert p.notes[0].startswith(f"global batch {b} in {p.num_microbatches} micro-batch(es) chosen automatically: "
                                 "the largest that fits at once")


def test_more_memory_allows_a_larger_batch(gpt2, rtx):
    assert _plan(gpt2, rtx, "auto", 14).global_batch_size > _plan(gpt2, rtx, "auto", 7).global_batch_size


def test_a_range_takes_the_fastest_batch_and_accumulates_when_memory_is_short(gpt2, rtx):
    p = _plan(gpt2, rtx, AutoBatch(max_batch=256), 7)
    record = p.solver_stats["batch_search"]
    assert record["objective"] == "throughput" and record["range"] == [8, 256]
    assert [t["batch"] for t in record["tried"]] == [256, 128, 64, 32, 16, 8]
    # every batch that fits without a bound is no faster per sample than the one chosen
    for b in (32, 64):
        fixed = _plan(gpt2, rtx, b, 7)
        assert fixed.predicted.throughput_samples_s <= p.predicted.throughput_samples_s * (1 + 1e-9), b
    # 256 samples do not fit one pass at 7 GiB: the plan accumulates (or pipelines) micro-batches
    assert p.global_batch_size == 256 and not _fits_at_once(gpt2, rtx, 256, 7)
    assert p.num_microbatches > 1 and max(p.predicted.device_peak_bytes) <= 7 * GiB
    assert "highest predicted throughput" in p.notes[0]


def test_a_token_target_takes_the_nearest_batch(gpt2, rtx):
    p = _plan(gpt2, rtx, AutoBatch(tokens_per_step=2**17), 7)  # 128 samples of 1,024 tokens
    assert p.global_batch_size == 128 and "131072 tokens per step" in p.notes[0]
    # the grid keeps ~8 batches of the ±25% range [75, 125]: steps of 4, so 100 samples exactly
    p = _plan(gpt2, rtx, AutoBatch(tokens_per_step=100 * 1024), 7)
    assert p.global_batch_size == 100 and p.solver_stats["batch_search"]["multiple_of"] == 4
    # on a grid of 8, 100 samples' worth lies between 96 and 104: the faster of the two
    p = _plan(gpt2, rtx, AutoBatch(tokens_per_step=100 * 1024, multiple_of=8), 7)
    tried = {t["batch"]: t for t in p.solver_stats["batch_search"]["tried"]}
    assert set(tried) == {96, 104} and p.global_batch_size in tried
    assert tried[p.global_batch_size]["throughput_samples_s"] == max(t["throughput_samples_s"] for t in tried.values())


def test_the_record_and_note_survive_json(gpt2, rtx, tmp_path):
    p = _plan(gpt2, rtx, AutoBatch(min_batch=32, max_batch=64), 14)
    q = gfx.ParallelPlan.load(p.save(tmp_path / "plan.json"))
    assert q == p and q.solver_stats["batch_search"]["range"] == [32, 64]
    assert "chosen automatically" in q.explain()


@pytest.mark.parametrize("value, match", [
    ("biggest", "give an int, a list of ints"),
    ({"max_batch": 8, "maximum": 3}, "unknown key"),
])
def test_bad_batches_say_what_to_pass(gpt2, rtx, value, match):
    with pytest.raises(ConfigError, match=match):
        _plan(gpt2, rtx, value, 7)


@pytest.mark.parametrize("kw, match", [
    ({"objective": "throughput"}, "needs a bound"), ({"min_batch": 9, "max_batch": 4}, "is empty"),
    ({"objective": "tokens"}, "needs tokens_per_step"), ({"objective": "most"}, "is not one of"),
    ({"max_batch": 0}, "outside its sane range"),
])
def test_bad_automatic_batches_say_what_to_pass(kw, match):
    with pytest.raises(ConfigError, match=match):
        AutoBatch(**kw)


def test_a_range_without_a_grid_batch_says_what_to_widen(gpt2, rtx):
    with pytest.raises(ConfigError, match="holds no multiple of 8"):
        _plan(gpt2, rtx, AutoBatch(min_batch=9, max_batch=15, multiple_of=8), 7)
    with pytest.raises(ConfigError, match="holds no multiple of 8"):
        _plan(gpt2, rtx, AutoBatch(tokens_per_step=10 * 1024, tolerance=0.1, multiple_of=8), 7)
    # by default a narrow range takes a finer grid: [9, 15] has 8 batches of the 8 devices' grid 1
    assert _plan(gpt2, rtx, AutoBatch(min_batch=9, max_batch=15), 14).solver_stats["batch_search"]["multiple_of"] == 1


def test_a_token_target_needs_token_inputs():
    model, inputs = zoo.build("vit-tiny", batch_size=2, seq_len=None, device="meta")
    mg = gfx.capture(model, inputs)
    with pytest.raises(ConfigError, match="needs token inputs"):
        gfx.plan(mg, gfx.Cluster.preset("rtx4090-pcie"), global_batch_size=AutoBatch(tokens_per_step=4096),
                 baselines=False)


def test_a_smallest_batch_that_needs_more_micro_batches_is_still_a_plan(gpt2, rtx):
    # at 2.4 GiB without CPU offload not even 8 samples fit in the fewest micro-batches a pipeline
    # allows, but they fit in more: the plan says so rather than failing (with offload they fit)
    p = _plan(gpt2, rtx, "auto", 2.4, search={"offload": (False,)})
    assert not _fits_at_once(gpt2, rtx, 8, 2.4, SearchSpace(offload=(False,)))
    assert _fits_at_once(gpt2, rtx, 8, 2.4)
    assert p.global_batch_size == 8 and p.pp > 1 and p.num_microbatches > p.pp
    assert "the smallest of the range, which fits only in more micro-batches" in p.notes[0]


def test_nothing_fitting_is_the_smallest_batch_s_plan_error(gpt2, rtx):
    with pytest.raises(PlanError, match="no plan fits"):
        _plan(gpt2, rtx, "auto", 0.5)


def test_parse_reads_the_command_line_forms():
    assert AutoBatch.parse(64) == 64 and AutoBatch.parse(None) is None
    assert AutoBatch.parse("auto") == AutoBatch()
    assert AutoBatch.parse("16:256") == AutoBatch(min_batch=16, max_batch=256)
    assert AutoBatch.parse(None, 4096) == AutoBatch(tokens_per_step=4096) == AutoBatch.parse("auto", 4096)
    with pytest.raises(ConfigError, match="give one of them"):
        AutoBatch.parse(64, 4096)


def test_cli_plan_with_an_automatic_batch(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main(["plan", "gpt-tiny", "--cluster", "rtx4090-pcie", "--batch", "auto", "--seq", "64", "--memory", "2",
               "--no-baselines", "--ilp-prices", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["solver_stats"]["batch_search"]["objective"] == "largest"
    assert f"global batch {d['global_batch_size']} in" in text and "chosen automatically" in text
    assert main(["plan", "gpt-tiny", "--cluster", "rtx4090-pcie", "--batch", "8:32", "--seq", "64",
                 "--no-baselines", "--ilp-prices", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["global_batch_size"] == 32
    with pytest.raises(SystemExit):
        main(["plan", "gpt-tiny", "--batch", "lots"])
    assert "expected a batch (64), auto, or a range" in capsys.readouterr().err
