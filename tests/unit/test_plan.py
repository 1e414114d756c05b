"""ParallelPlan: JSON round trip, atomic save, validation naming the field, hashes, diff, explain."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from galvatron_fx.errors import ConfigError, PlanError
from galvatron_fx.ir import plan as plan_mod
from galvatron_fx.ir.plan import (
    Alternative,
    LayerPlan,
    LayerPrediction,
    ParallelPlan,
    PlanPrediction,
    cluster_hash,
    graph_hash,
)
from galvatron_fx.ir.strategy import LayerStrategy

GiB = 2**30
MiB = 2**20


def _pred(fwd_ms: float, mem_mib: int, *, comm_ms: float = 0.5, trans_ms: float = 0.0) -> LayerPrediction:
    mem = mem_mib * MiB
    return LayerPrediction(
        fwd_s=fwd_ms / 1e3, bwd_s=2 * fwd_ms / 1e3, comm_s=comm_ms / 1e3, transition_s=trans_ms / 1e3,
        memory_bytes=mem, memory_breakdown={"params": mem // 4, "grads": mem // 4, "optimizer": mem // 4,
                                            "activations": mem - 3 * (mem // 4), "temp": 0},
    )


def _layer(name: str, role: str, kind: str, stage: int, tp: int, dp_type: str = "ddp", **kw) -> LayerPlan:
    devices = 4  # every stage of the test plan has 4 ranks
    alts = (
        Alternative(strategy=LayerStrategy(tp=4, dp_type="ddp"), predicted=_pred(1.5, 300, comm_ms=2.0),
                    reason="+2.40 ms per step"),
        Alternative(strategy=LayerStrategy(tp=1, dp_type="ddp"), predicted=_pred(4.0, 9000),
                    reason="over memory budget by 3.20 GiB"),
    ) if role == "block" else ()
    return LayerPlan(name=name, kind=kind, role=role, stage=stage, strategy=LayerStrategy(tp=tp, dp_type=dp_type),
                     dp=devices // tp, placements={f"{name}_mm": "S(0),R->S(1)" if tp > 1 else "R,R->R"},
                     predicted=kw.pop("predicted", _pred(1.0, 500)), alternatives=alts, **kw)


def make_plan(**overrides) -> ParallelPlan:
    """2 stages × 4 ranks, 6 layers: embedding + blocks.0-2 on stage 0, blocks.3 + head on stage 1."""
    layers = (
        _layer("embedding", "embedding", "kE", 0, 1, "zero2"),
        _layer("blocks.0", "block", "kB", 0, 2),
        _layer("blocks.1", "block", "kB", 0, 2),
        _layer("blocks.2", "block", "kB", 0, 2),
        _layer("blocks.3", "block", "kB", 1, 2),
        _layer("head", "head", "kH", 1, 1, "zero3"),
    )
    kw = dict(
        model="gpt-test", graph_hash="a" * 64, cluster_hash="c" * 64, world_size=8, pp=2,
        num_microbatches=4, schedule="1f1b", virtual_stages=1, global_batch_size=32, micro_batch_size=2,
        stage_boundaries=(0, 4), stage_ranks=((0, 1, 2, 3), (4, 5, 6, 7)), precision="bf16", layers=layers,
        predicted=PlanPrediction(step_time_s=0.0321, throughput_samples_s=996.9,
                                 peak_memory_bytes=(12 * GiB, 9 * GiB), memory_budget_bytes=80 * GiB,
                                 bubble_fraction=0.2, breakdown={"compute": 0.024, "comm": 0.002, "bubble": 0.0061}),
        solver_stats={"search_s": 1.25, "num_candidates": 96, "ilp_solves": 6, "dp_frontier_max": 41},
        baseline={"name": "megatron-tp2-pp2", "step_time_s": 0.0449},
        notes=("hand-made test plan",),
    )
    kw.update(overrides)
    return ParallelPlan(**kw)


# ---- JSON --------------------------------------------------------------------------------------

def test_json_round_trip_is_exact():
    p = make_plan()
    q = ParallelPlan.from_json(p.to_json())
    assert q == p
    assert q.plan_hash() == p.plan_hash()
    assert ParallelPlan.from_dict(p.to_dict()) == p
    assert q.layers[1].strategy == LayerStrategy(tp=2)
    assert q.layers[1].alternatives[1].reason == "over memory budget by 3.20 GiB"
    assert q.predicted.peak_memory_bytes == (12 * GiB, 9 * GiB)


def test_required_json_keys_present():
    d = json.loads(make_plan().to_json())
    assert d["predicted"]["step_time_s"] == 0.0321
    assert d["predicted"]["throughput_samples_s"] == 996.9
    assert d["predicted"]["peak_memory_bytes"] == [12 * GiB, 9 * GiB]
    assert d["solver_stats"]["search_s"] == 1.25
    assert d["pp"] == 2 and d["num_microbatches"] == 4
    assert [l["name"] for l in d["layers"]] == ["embedding", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    assert d["layers"][5]["strategy"] == {"tp": 1, "sp": "none", "dp_type": "zero3", "recompute": "none"}


def test_save_and_load(tmp_path):
    p = make_plan()
    path = p.save(tmp_path / "plan.json")
    assert ParallelPlan.load(path) == p
    assert json.loads(path.read_text())["schema_version"] == 1
    assert [f.name for f in tmp_path.iterdir()] == ["plan.json"]  # no temp file left behind


@pytest.mark.parametrize("broken", ["json.dump", "os.replace"])
def test_save_is_atomic(tmp_path, monkeypatch, broken):
    path = tmp_path / "plan.json"
    old = make_plan()
    old.save(path)
    before = path.read_text()

    def torn_dump(obj, f, **kw):
        f.write('{"schema_version": 1, "mod')  # half a file, then the crash
        raise OSError("disk full")

    def failing_replace(src, dst):
        raise OSError("rename failed")

    if broken == "json.dump":
        monkeypatch.setattr(plan_mod.json, "dump", torn_dump)
    else:
        monkeypatch.setattr(plan_mod.os, "replace", failing_replace)
    with pytest.raises(OSError):
        make_plan(num_microbatches=8, micro_batch_size=1).save(path)
    monkeypatch.undo()
    assert path.read_text() == before
    assert ParallelPlan.load(path) == old
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]


# ---- validation -----------------------------------------------------------------------------

def test_malformed_json_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "pp": 2,\n  "layers": [1, 2,]\n}\n')
    with pytest.raises(ConfigError) as e:
        ParallelPlan.load(path)
    msg = str(e.value)
    assert "bad.json" in msg and "line 3" in msg and "column" in msg and "galvatron-fx plan" in msg


def test_missing_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ParallelPlan.load(tmp_path / "nope.json")


def _set(d: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        d = d[k]
    if value is _DELETE:
        del d[path[-1]]
    else:
        d[path[-1]] = value


_DELETE = object()

# (where, new value, field the message must name, a phrase it must contain)
BAD = [
    (("schema_version",), 2, "schema_version", "reads plans of schema 1"),
    (("schema_version",), _DELETE, "schema_version", "is missing"),
    (("pp",), _DELETE, "pp", "is missing"),
    (("pp",), "2", "pp", "must be an integer"),
    (("layers", 2, "predicted", "fwd_s"), "fast", "layers[2].predicted.fwd_s", "must be a finite number"),
    (("layers", 3, "strategy", "dp_type"), "zero4", "layers[3].strategy.dp_type", "is not one of ddp, zero2, zero3"),
    (("layers", 3, "strategy", "recompute"), "some", "layers[3].strategy.recompute", "is not one of"),
    (("layers", 3, "strategy", "sp"), "megatron", "layers[3].strategy", None),  # allowed: tp=2
    (("layers", 0, "strategy", "sp"), "megatron", "layers[0].strategy", "needs a group of tp > 1"),
    (("layers", 1, "strategy", "tp"), 3, "layers[1].strategy.tp", "does not divide the 4 devices of stage 0"),
    (("layers", 3, "dp"), 4, "layers[3].dp", "must equal the 4 devices of stage 0"),
    (("layers", 4, "stage"), 0, "layers[4].stage", "put layer 4 (blocks.3) on stage 1"),
    (("layers", 1, "role"), "decoder", "layers[1].role", "is not one of"),
    (("layers", 1, "extra"), 1, "layers[1].extra", "is not a field"),
    (("schedule",), "zigzag", "schedule", "is not one of gpipe, 1f1b, interleaved_1f1b"),
    (("precision",), "fp8", "precision", "is not one of fp32, bf16"),
    (("stage_boundaries",), [0, 0], "stage_boundaries[1]", "is not greater than"),
    (("stage_boundaries",), [0, 6], "stage_boundaries[1]", "leaves no layer for the last stage"),
    (("stage_boundaries",), [1, 4], "stage_boundaries[0]", "must start at layer 0"),
    (("stage_boundaries",), [0, 2, 4], "stage_boundaries", "expected pp × virtual_stages = 2"),
    (("stage_ranks",), [[0, 1, 2, 3, 4, 5, 6, 7]], "stage_ranks", "expected pp = 2"),
    (("stage_ranks",), [[0, 1, 2, 3], [3, 5, 6, 7]], "stage_ranks[1]", "repeats rank 3"),
    (("stage_ranks",), [[0, 1, 2, 3], [4, 5, 6, 9]], "stage_ranks[1]", "outside 0..7"),
    (("world_size",), 9, "stage_ranks", "leaves ranks 8 of world size 9 unused"),
    (("predicted", "peak_memory_bytes"), [1, 2, 3], "predicted.peak_memory_bytes", "one per stage (2)"),
    (("solver_stats",), {"num_candidates": 3}, "solver_stats.search_s", "is missing"),
    (("global_batch_size",), 30, "global_batch_size", "2 × 4 × 4 = 32"),
    (("num_microbatches",), 1, "num_microbatches", "1F1B needs at least one micro-batch per stage"),
    (("virtual_stages",), 2, "virtual_stages", "use 'interleaved_1f1b'"),
    (("layers", 0, "predicted", "memory_bytes"), 7, "layers[0].predicted.memory_breakdown", "memory_bytes = 7"),
]


@pytest.mark.parametrize("where,value,field,phrase", BAD, ids=[f"{b[2]}={'(deleted)' if b[1] is _DELETE else repr(b[1])}"[:40] for b in BAD])
def test_invalid_plan_names_the_field(tmp_path, where, value, field, phrase):
    d = make_plan().to_dict()
    _set(d, where, value)
    if phrase is None:  # a legal change: must load
        assert ParallelPlan.from_dict(d).layers[3].strategy.sp == "megatron"
        return
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as e:
        ParallelPlan.load(path)
    msg = str(e.value)
    assert f"{field} " in msg, msg
    assert phrase in msg, msg
    assert "p.json" in msg and "galvatron-fx plan" in msg, msg


def test_construction_checks_invariants_too():
    p = make_plan()
    bad_layer = dataclasses.replace(p.layers[2], dp=1)
    with pytest.raises(ConfigError, match=r"layers\[2\]\.dp = 1"):
        dataclasses.replace(p, layers=(*p.layers[:2], bad_layer, *p.layers[3:]))
    with pytest.raises(ConfigError, match="stage_ranks"):
        make_plan(stage_ranks=((0, 1, 2, 3),))


def test_interleaved_chunks_map_round_robin():
    # 4 chunks over 2 stages: chunk c on stage c % 2
    p = make_plan()
    stages = [0, 0, 1, 1, 0, 1]
    layers = tuple(dataclasses.replace(lp, stage=s) for lp, s in zip(p.layers, stages))
    q = make_plan(schedule="interleaved_1f1b", virtual_stages=2, stage_boundaries=(0, 2, 4, 5), layers=layers)
    assert ParallelPlan.from_json(q.to_json()) == q
    with pytest.raises(ConfigError, match=r"layers\[2\]\.stage = 0"):
        make_plan(schedule="interleaved_1f1b", virtual_stages=2, stage_boundaries=(0, 2, 4, 5), layers=p.layers)


# ---- identity ---------------------------------------------------------------------------------

def test_plan_hash_ignores_solver_stats_but_not_decisions():
    p = make_plan()
    assert make_plan(solver_stats={"search_s": 99.0}).plan_hash() == p.plan_hash()
    assert make_plan(num_microbatches=8, micro_batch_size=1).plan_hash() != p.plan_hash()


def test_check_matches_raises_with_the_numbers():
    p = make_plan()
    p.check_matches(graph_hash="a" * 64, cluster_hash="c" * 64, world_size=8)  # all match
    with pytest.raises(PlanError) as e:
        p.check_matches(world_size=4)
    msg = str(e.value)
    assert "world size 8, this job has 4" in msg and "launch with 8 processes" in msg
    with pytest.raises(PlanError, match="another model graph .*aaaaaaaaaaaa.*bbbbbbbbbbbb"):
        p.check_matches(graph_hash="b" * 64)
    with pytest.raises(PlanError, match="another cluster"):
        p.check_matches(cluster_hash="d" * 64, world_size=8)


def test_graph_hash_is_stable_and_tells_models_apart():
    import galvatron_fx as gfx
    from galvatron_fx import zoo

    def h(name: str, **kw) -> str:
        model, inputs = zoo.build(name, batch_size=2, seq_len=16, **kw)
        return graph_hash(gfx.capture(model, inputs, annotate=False))

    a, b = h("gpt-tiny"), h("gpt-tiny", seed=1)  # a second capture, different weights
    assert a == b and len(a) == 64
    assert h("llama-tiny") != a
    assert h("gpt-tiny", overrides={"n_layers": 3}) != a


def test_cluster_hash():
    from galvatron_fx.cluster import Cluster

    a = cluster_hash(Cluster.preset("dgx-h100"))
    assert a == cluster_hash(Cluster.from_json(Cluster.preset("dgx-h100").to_json()))
    assert a != cluster_hash(Cluster.preset("dgx-h100", nodes=2))


# ---- diff ---------------------------------------------------------------------------------------

def _with_layers(p: ParallelPlan, **changes: LayerPlan) -> ParallelPlan:
    layers = tuple(changes.get(lp.name.replace(".", "_"), lp) for lp in p.layers)
    return dataclasses.replace(p, layers=layers)


def test_diff_lists_exactly_the_changed_layers():
    a = make_plan()
    assert a.diff(make_plan()) == "plans are identical"
    assert a.diff_dict(make_plan(solver_stats={"search_s": 3.0})) == {}
    b = _with_layers(
        a,
        blocks_1=dataclasses.replace(a.layers[2], strategy=LayerStrategy(tp=4, dp_type="zero3"), dp=1,
                                     predicted=_pred(1.2, 200)),
        head=dataclasses.replace(a.layers[5], strategy=LayerStrategy(tp=1, dp_type="ddp", recompute="full")),
    )
    d = a.diff_dict(b)
    assert set(d["layers"]) == {"blocks.1", "head"}
    assert d["layers"]["blocks.1"]["strategy"] == ["tp2·ddp", "tp4·zero3"]
    assert d["layers"]["blocks.1"]["dp"] == [2, 1]
    assert d["layers"]["head"] == {"strategy": ["tp1·zero3", "tp1·ddp·full"]}
    assert "plan" not in d and "predicted" not in d
    text = a.diff(b)
    assert "2 changed of 6" in text and "blocks.1" in text and "tp4·zero3" in text and "head" in text
    assert "blocks.0" not in text and "blocks.2" not in text and "embedding" not in text
    assert "-300.00 MiB" in text  # 500 MiB -> 200 MiB per rank


def test_diff_reports_pipeline_and_prediction_changes():
    a = make_plan()
    b = make_plan(num_microbatches=8, micro_batch_size=1,
                  predicted=dataclasses.replace(a.predicted, step_time_s=0.0300, peak_memory_bytes=(10 * GiB, 9 * GiB)))
    d = a.diff_dict(b)
    assert d["plan"] == {"num_microbatches": [4, 8], "micro_batch_size": [2, 1]}
    assert d["predicted"]["step_time_s"] == [0.0321, 0.03]
    text = a.diff(b)
    assert "num_microbatches: 4 -> 8" in text
    assert "step time: 32.10 ms -> 30.00 ms (-6.5%)" in text
    assert "peak memory stage 0: 12.00 GiB -> 10.00 GiB (-2.00 GiB)" in text
    assert "stage 1" not in text


def test_diff_speaks_in_units():
    a = make_plan()
    b = make_plan(baseline={"name": "megatron-tp1", "step_time_s": 0.05},
                  predicted=dataclasses.replace(a.predicted, memory_budget_bytes=16 * GiB, bubble_fraction=0.25,
                                                breakdown={**a.predicted.breakdown, "compute": 0.0125},
                                                tensor_budget_bytes=12 * GiB))
    text = a.diff(b)
    assert "memory budget bytes: 80.00 GiB -> 16.00 GiB" in text, text
    assert "tensor budget bytes: - -> 12.00 GiB" in text
    assert "bubble fraction:" in text and "-> 25.0%" in text
    assert "step breakdown: compute " in text and "-> 12.50 ms" in text
    assert "baseline:" in text and "megatron-tp1 (50.00 ms)" in text
    assert not re.search(r"\d\.\d{4,}", text), text  # no raw JSON seconds


# ---- explain ------------------------------------------------------------------------------------

def test_explain_collapses_blocks_and_shows_layout_and_budget():
    text = make_plan().explain()
    assert "plan for gpt-test on 8 devices in bf16: pp2 × per layer (dp4×tp1, dp2×tp2)" in text
    assert "1f1b, 4 micro-batches, global batch 32" in text and "bf16" in text
    rows = [l for l in text.splitlines() if l.startswith("blocks.")]
    assert len(rows) == 2 and rows[0].startswith("blocks.0–2 ×3"), rows  # stage 1's blocks.3 is its own row
    assert "tp2·ddp" in rows[0]
    assert "stage 0: ranks 0–3 (4 devices); layers 0–3 (embedding … blocks.2); peak 12.00 GiB / 80.00 GiB budget (15%)" in text
    assert "stage 1: ranks 4–7" in text
    assert "step time 32.10 ms" in text and "bubble 20.0%" in text
    assert "1.40× faster than megatron-tp2-pp2 (44.90 ms per step)" in text
    assert "search_s=1.25" in text and "ilp_solves=6" in text


def test_explain_layer_shows_alternatives_and_why_they_lost():
    p = make_plan()
    text = p.explain("blocks.1")
    assert "chosen: tp2·ddp (dp2 × tp2)" in text
    assert "tp4·ddp" in text and "tp1·ddp" in text
    assert "+2.40 ms per step" in text and "over memory budget by 3.20 GiB" in text
    one = p.explain("blocks.1", "tp4.ddp")
    assert "tp4·ddp" in one and "tp1·ddp" not in one
    # totals: chosen 1 + 2 + 0.5 = 3.5 ms, the alternative 1.5 + 3 + 2 = 6.5 ms
    assert "3.50" in one and "6.50" in one and "+3.00 ms" in one
    assert "over memory budget" not in one and "+2.40 ms per step" in one
    by_strategy = p.explain("blocks.1", LayerStrategy(tp=1))
    assert "over memory budget by 3.20 GiB" in by_strategy and "8.79 GiB" in by_strategy
    with pytest.raises(ConfigError, match="not among the alternatives kept for layer blocks.1"):
        p.explain("blocks.1", "tp8·zero3")
    with pytest.raises(ConfigError, match="did you mean blocks.1"):
        p.explain("block.1")


def test_verdicts_from_the_printed_numbers():
    from galvatron_fx.ir.plan_report import verdict

    def pred(fwd, trans=0.0, stage=None):
        return LayerPrediction(fwd_s=fwd, bwd_s=0.0, transition_s=trans, stage_bytes=stage)

    chosen = pred(0.010, 0.0, 100)
    # faster, but its stage would not fit: the memory decides, with the printed figures
    assert verdict(chosen, 0.0, pred(0.005, 0.0, 150), 0.0, 120) == (
        "does not fit: its stage would hold 150 B, 30 B over the 120 B the search holds it to")
    # faster by itself, slower once resharding in and out is paid
    assert verdict(chosen, 0.0, pred(0.009, 0.001, 100), 0.001, 120) == (
        "-1.00 ms by itself, but resharding to its neighbours' layouts costs +2.00 ms: +1.00 ms per step")
    assert verdict(chosen, 0.0, pred(0.012, 0.0, 100), 0.0, 120) == "+2.00 ms per step"
    assert "a tie" in verdict(chosen, 0.0, pred(0.010, 0.0, 100), 0.0, 120)
    # the chosen one's resharding out counts on its side too
    assert verdict(chosen, 0.003, pred(0.012, 0.0, 100), 0.0, 120).startswith("-1.00 ms per step")
