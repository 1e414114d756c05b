"""Golden-plan regression tests: a few zoo models are planned on preset clusters, and each plan's
decisions (pipeline layout, schedule, batch, every layer's stage, dp and strategy) and headline
predictions (step time, peak memory per stage, within 2%) must equal ``tests/golden/<case>.json``.

After an intended planner change, rewrite the files and review their diff:
``GFX_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_golden_plans.py -q``
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models.memory import BUDGET_COMMUNICATORS

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
UPDATE = os.environ.get("GFX_UPDATE_GOLDEN") == "1"
REL_TOL = 0.02  # on the predictions; every decision must match exactly
UPDATE_HINT = ("if the change is intended, rerun with `GFX_UPDATE_GOLDEN=1 .venv/bin/pytest "
               "tests/unit/test_golden_plans.py` and review the diff of tests/golden/")
MiB, GiB = 2**20, 2**30


@dataclass(frozen=True)
class Case:
    name: str  # the golden file is tests/golden/<name>.json
    model: str
    seq_len: int
    preset: str
    nodes: int
    global_batch_size: int
    memory_budget: int | None  # bytes per device; None: the devices' own memory (names: the tensors' share)
    covers: str  # what the case is there for ...
    check: Callable[[dict], bool]  # ... tested on its golden subset, so an update cannot lose it


def _device_budget(tensor_bytes: int, preset: str = "rtx4090-pcie") -> int:
    """The device budget that leaves ``tensor_bytes`` to the tensors of a plan (the device's
    context, communicator buffers and allocator reserve on top: cost_models.memory)."""
    d = gfx.Cluster.preset(preset).device(0)
    return int(d.context_bytes + BUDGET_COMMUNICATORS * d.comm_buffer_bytes + d.allocator_factor * tensor_bytes)


CASES = [
    Case("gpt-tiny_a100x8", "gpt-tiny", 128, "dgx-a100-80g", 1, 16, None,
         "one node of 8 GPUs", lambda g: g["world_size"] == 8),
    Case("llama-tiny_a100x16_2nodes_gb8", "llama-tiny", 256, "dgx-a100-80g", 2, 8, None,
         "two nodes, a batch below the world size", lambda g: g["world_size"] == 16),
    Case("bert-tiny_rtx4090x8_20mib", "bert-tiny", 256, "rtx4090-pcie", 1, 64, _device_budget(20 * MiB),
         "memory pressure (ZeRO, recompute and CPU offload)",
         lambda g: any(l["strategy"]["dp_type"] != "ddp" or l["strategy"]["recompute"] != "none"
                       for l in g["layers"]) and any(l["strategy"].get("offload") for l in g["layers"])),
    Case("gpt2-small_rtx4090x8_2gib_pipeline", "gpt2-small", 1024, "rtx4090-pcie", 1, 64, _device_budget(2 * GiB),
         "pipeline parallelism (pp > 1)", lambda g: g["pp"] > 1),
    Case("gpt2-small_a100x8_gb2_tensor_parallel", "gpt2-small", 1024, "dgx-a100-80g", 1, 2, None,
         "tensor parallelism in the blocks (tp > 1)",
         lambda g: any(l["strategy"]["tp"] > 1 for l in g["layers"] if l["name"].startswith("blocks."))),
]

# ---- the compared subset -----------------------------------------------------------------------

_PLAN_FIELDS = ("world_size", "pp", "virtual_stages", "num_microbatches", "schedule", "global_batch_size",
                "micro_batch_size", "stage_boundaries")
_LAYER_FIELDS = ("name", "kind", "stage", "dp")
_STRATEGY_FIELDS = ("tp", "sp", "dp_type", "recompute", "offload")  # offload: only where on
# the order in which fields are compared (first difference reported); other keys follow, sorted
_KEY_ORDER = (*_PLAN_FIELDS, "layers", "predicted", *_LAYER_FIELDS, "strategy", *_STRATEGY_FIELDS,
              "step_time_s", "peak_memory_bytes")


def golden_subset(plan: gfx.ParallelPlan | dict) -> dict:
    """What a golden file holds and the test compares: the plan's decisions and headline
    predictions (step time to 6 significant digits), as plain JSON. Fields not named here are
    ignored, so new fields in the plan JSON leave the golden files alone."""
    d = plan.to_dict() if isinstance(plan, gfx.ParallelPlan) else plan
    subset = {
        **{k: d[k] for k in _PLAN_FIELDS},
        "layers": [{**{k: l[k] for k in _LAYER_FIELDS},
                    "strategy": {k: l["strategy"][k] for k in _STRATEGY_FIELDS if k in l["strategy"]}}
                   for l in d["layers"]],
        "predicted": {"step_time_s": float(f"{d['predicted']['step_time_s']:.6g}"),
                      "peak_memory_bytes": list(d["predicted"]["peak_memory_bytes"])},
    }
    return json.loads(json.dumps(subset))


def golden_text(subset: dict) -> str:
    return json.dumps(subset, indent=2, sort_keys=True) + "\n"


def first_difference(golden: Any, now: Any, path: str = "") -> str | None:
    """The first field where ``now`` differs from ``golden`` (``field: golden X, now Y``), or None.
    Numbers under ``predicted`` may differ by ``REL_TOL``; everything else must be equal."""
    where = path or "plan"
    if isinstance(golden, dict) and isinstance(now, dict):
        rank = {k: i for i, k in enumerate(_KEY_ORDER)}
        for k in sorted(set(golden) | set(now), key=lambda k: (rank.get(k, len(rank)), k)):
            sub = f"{path}.{k}" if path else k
            if k not in now:
                return f"{sub}: in the golden file, missing from the plan"
            if k not in golden:
                return f"{sub}: in the plan, missing from the golden file"
            if (diff := first_difference(golden[k], now[k], sub)) is not None:
                return diff
        return None
    if isinstance(golden, list) and isinstance(now, list):
        for i, (a, b) in enumerate(zip(golden, now)):
            named = f"({a['name']})" if isinstance(a, dict) and "name" in a else ""
            if (diff := first_difference(a, b, f"{path}[{i}]{named}")) is not None:
                return diff
        if len(golden) != len(now):
            return f"{where}: {len(golden)} entries in the golden file, {len(now)} now"
        return None
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (golden, now))
    if numbers and path.startswith("predicted"):
        if not math.isclose(golden, now, rel_tol=REL_TOL):
            return f"{where}: golden {golden!r}, now {now!r} (more than {REL_TOL:.0%} apart)"
        return None
    if type(golden) is not type(now) or golden != now:
        return f"{where}: golden {golden!r}, now {now!r}"
    return None


def assert_matches_golden(golden: dict, now: dict, source: str) -> None:
    diff = first_difference(golden, now)
    if diff is not None:
        raise AssertionError(f"plan differs from {source} at {diff}; {UPDATE_HINT}")


# ---- planning ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _graph(model: str, seq_len: int):
    m, inputs = zoo.build(model, batch_size=1, seq_len=seq_len, device="meta")
    return gfx.capture(m, inputs, name=model)


@functools.lru_cache(maxsize=None)
def _plan(case: Case) -> gfx.ParallelPlan:
    return gfx.plan(_graph(case.model, case.seq_len), gfx.Cluster.preset(case.preset, nodes=case.nodes),
                    global_batch_size=case.global_batch_size, memory_budget=case.memory_budget,
                    precision="bf16", baselines=False)


# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan_matches_golden(case: Case):
    now = golden_subset(_plan(case))
    path = GOLDEN_DIR / f"{case.name}.json"
    source = f"tests/golden/{path.name}"
    if UPDATE:
        assert case.check(now), (f"case {case.name} no longer covers {case.covers}; change its model, "
                                 "cluster, batch or budget so that it does before writing its golden file")
        GOLDEN_DIR.mkdir(exist_ok=True)
        text = golden_text(now)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{source} does not exist; write it with `GFX_UPDATE_GOLDEN=1 .venv/bin/pytest "
                    "tests/unit/test_golden_plans.py`")
    assert_matches_golden(json.loads(path.read_text()), now, source)
    assert case.check(now), f"case {case.name} no longer covers {case.covers}"


def test_comparison_reports_the_first_difference():
    golden = json.loads(golden_text(golden_subset(_plan(CASES[-1]))))  # as loaded from a golden file
    assert first_difference(golden, copy.deepcopy(golden)) is None

    def perturbed(edit: Callable[[dict], Any]) -> dict:
        g = copy.deepcopy(golden)
        edit(g)
        return g

    def tp(g):
        g["layers"][3]["strategy"]["tp"] *= 2

    def pp_and_tp(g):
        g["pp"] += 1
        tp(g)

    def step(factor):
        return lambda g: g["predicted"].update(step_time_s=g["predicted"]["step_time_s"] * factor)

    def peak(g):
        g["predicted"]["peak_memory_bytes"][0] = int(g["predicted"]["peak_memory_bytes"][0] * 1.03)

    layer, old_tp, n = golden["layers"][3]["name"], golden["layers"][3]["strategy"]["tp"], len(golden["layers"])
    assert first_difference(golden, perturbed(tp)) == \
        f"layers[3]({layer}).strategy.tp: golden {old_tp}, now {old_tp * 2}"
    assert first_difference(golden, perturbed(pp_and_tp)) == f"pp: golden {golden['pp']}, now {golden['pp'] + 1}"
    assert first_difference(golden, perturbed(step(1.01))) is None  # within the tolerance
    assert first_difference(golden, perturbed(step(1.05))).startswith("predicted.step_time_s: golden ")
    assert first_difference(golden, perturbed(peak)).startswith("predicted.peak_memory_bytes[0]: golden ")
    assert first_difference(golden, perturbed(lambda g: g["layers"].pop())) == \
        f"layers: {n} entries in the golden file, {n - 1} now"
    first = golden["layers"][0]
    assert first_difference(golden, perturbed(lambda g: g["layers"][0]["strategy"].update(sp=None))) == \
        f"layers[0]({first['name']}).strategy.sp: golden {first['strategy']['sp']!r}, now None"
    assert first_difference(golden, perturbed(lambda g: g["layers"][1].pop("kind"))) == \
        f"layers[1]({golden['layers'][1]['name']}).kind: in the golden file, missing from the plan"
    with pytest.raises(AssertionError, match=r"at schedule: golden '.*', now 'no-such-schedule'.*GFX_UPDATE_GOLDEN=1"):
        assert_matches_golden(golden, perturbed(lambda g: g.update(schedule="no-such-schedule")), "tests/golden/x.json")


def test_subset_ignores_fields_it_does_not_name():
    d = _plan(CASES[0]).to_dict()
    extended = copy.deepcopy(d)
    extended["new_top_field"] = 1
    extended["layers"][0]["new_layer_field"] = 2
    extended["layers"][0]["strategy"]["new_strategy_field"] = 3
    extended["predicted"]["new_prediction"] = 4.0
    assert golden_subset(extended) == golden_subset(d)
