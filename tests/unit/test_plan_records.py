"""The plan's typed records at its seams: search statistics, the baseline and the collectives are
records, read from and written to the plan's JSON unchanged (a key this version does not know is
kept), and read as their JSON objects too."""

from __future__ import annotations

import pytest

from galvatron_fx.ir.plan_records import Baseline, CollectiveRecord, SearchStats
from galvatron_fx.ir.program import CollectiveRecord as ProgramCollective


def test_search_stats_keep_what_they_read_and_write_it_back():
    d = {"search_s": 1.5, "points": 12, "batch_search": {"objective": "largest"}, "from_a_newer_version": [1, 2]}
    s = SearchStats.of(d)
    assert s.search_s == 1.5 and s.points == 12 and s.batch_search == {"objective": "largest"}
    assert s.extra == {"from_a_newer_version": [1, 2]}
    assert s.to_dict() == d and dict(s) == d and s["search_s"] == 1.5 and s.get("ilp_s") is None
    assert "kept_baseline" not in s and SearchStats.of(s) is s
    assert SearchStats.of({}).get("search_s") is None  # (the plan's check names it missing)


def test_a_baseline_and_a_collective_read_as_their_json():
    b = Baseline.of({"name": "megatron-tp2", "step_time_s": 0.04})
    assert (b.name, b["step_time_s"], b.to_dict()) == ("megatron-tp2", 0.04, {"name": "megatron-tp2", "step_time_s": 0.04})
    c = CollectiveRecord.of({"phase": "fwd", "op": "all_reduce", "group_size": 2, "bytes": 64, "axis": "tp"})
    assert c.bytes == 64 and c["axis"] == "tp" and dict(c)["phase"] == "fwd"
    # the program's collectives are the same record: a plan's and a program's compare directly
    assert ProgramCollective is CollectiveRecord
    assert CollectiveRecord("fwd", "all_reduce", 2, 64) != c and CollectiveRecord("fwd", "all_reduce", 2, 64, "tp") == c
    assert "axis" not in CollectiveRecord("step", "all_reduce", 2, 8).to_dict()
    with pytest.raises(KeyError):
        CollectiveRecord.of({"phase": "fwd", "op": "all_reduce", "bytes": 1})
