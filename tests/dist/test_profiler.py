"""Hardware profiler on 2 real gloo ranks, spawned once for the module; checks run in the parent."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from harness import free_port

from galvatron_fx.cluster import Cluster, Collective
from galvatron_fx.cluster.host import local_fingerprint
from galvatron_fx.cost_models.communication import CommModel
from galvatron_fx.profiler.hardware_profile import load_profile

# this module checks the fitted link model against the all-reduces it timed:
# `make test` runs it alone, not beside the unit tests
pytestmark = pytest.mark.timing

WORLD = 2



def _worker(rank: int, port: int, tmp: str) -> None:
    import torch.distributed as dist

    from galvatron_fx import cli

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        argv = ["profile", "--out", f"{tmp}/out.json", "--cache-dir", f"{tmp}/cache", "--repeats", "3",
                "--sizes", "4K", "64K", "1M", "4M"]
        rc = cli.main(argv)
        # second run reuses the cache (fingerprint matches) without measuring
        rc2 = cli.main(["profile", "--cache-dir", f"{tmp}/cache", "--reuse-cache", "--sizes", "4K"])
        Path(f"{tmp}/rc{rank}").write_text(f"{rc} {rc2}")
    finally:
        dist.destroy_process_group()
    # past the interpreter's finalization, where gloo's threads can abort a finished rank (as
    # harness.run_jobs ends its ranks)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("prof")
    try:
        mp.spawn(_worker, args=(free_port(), str(tmp)), nprocs=WORLD)
    except mp.ProcessExitedException as e:  # a gloo rank aborting in C++ on a loaded host: once more (harness.spawn)
        if e.exit_code is not None and e.exit_code >= 0:
            raise
        if all((tmp / f"rc{r}").exists() for r in range(WORLD)):  # (it died on its way out: the results stand)
            warnings.warn(f"a spawned rank died by a signal after writing its results ({e})", stacklevel=2)
            return tmp
        warnings.warn(f"a spawned rank died by a signal ({e}); running the profile once more", stacklevel=2)
        tmp = tmp_path_factory.mktemp("prof")
        mp.spawn(_worker, args=(free_port(), str(tmp)), nprocs=WORLD)
    return tmp


def test_cli_ran_on_every_rank(profiled: Path) -> None:
    assert [(profiled / f"rc{r}").read_text() for r in range(WORLD)] == ["0 0"] * WORLD
    cached = list((profiled / "cache").glob("hardware-*.json"))
    assert [p.name for p in cached] == [f"hardware-{local_fingerprint(WORLD)}.json"]


def test_profile_contents(profiled: Path) -> None:
    prof = load_profile(profiled / "out.json")
    c = prof.cluster
    assert c.world_size == WORLD and c.backend == "gloo" and c.fingerprint == local_fingerprint(WORLD)
    measured = {(r["collective"], r["nbytes"]) for r in prof.measurements}
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        assert {s for k, s in measured if k == coll} == {4096, 65536, 2**20, 4 * 2**20}, coll
        fit = c.intra_node.fit(coll, 2)
        assert fit is not None and fit.beta_s_per_byte > 0, coll
        # the fitted line reproduces the measured points within a factor of 3
        for r in prof.measurements:
            if r["collective"] == coll:
                assert 1 / 3 < fit.time_s(r["nbytes"]) / r["time_s"] < 3, r
    if "all_to_all" in prof.unsupported:
        assert c.intra_node.fit("all_to_all", 2) is None
    # larger messages take longer: 4 MiB against the fastest of the smaller sizes (one stalled small
    # measurement on a busy 2-core machine, 2 ms for 4 KiB, is not the trend)
    ar = sorted((r["nbytes"], r["time_s"]) for r in prof.measurements if r["collective"] == "all_reduce")
    assert ar[-1][1] > min(t for _, t in ar[:-1]), ar
    assert [(p["src"], p["dst"]) for p in prof.p2p_bandwidth] == [(0, 1)] and prof.p2p_bandwidth[0]["bytes_s"] > 1e6
    assert prof.slow_links == []
    assert c.overlap_slowdown >= 1.0 and prof.overlap["together_s"] > 0
    assert {(r["op"], r["dtype"]) for r in prof.compute} >= {("matmul", "float32"), ("attention", "bfloat16")}
    assert all(r["flops_s"] > 1e6 for r in prof.compute if r["op"] in ("matmul", "attention"))
    # the host's fixed costs: microseconds per kernel launch, more per layer call (autograd);
    # on a CPU they stay with its calibration, not in the device spec
    fixed = {r["op"]: r["time_s"] for r in prof.compute if r["op"] in ("kernel_launch", "layer_call")}
    assert 1e-7 < fixed["kernel_launch"] < 1e-3 and 0 < fixed["layer_call"] < 1e-2
    assert c.device(0).kernel_overhead_s is None and c.device(0).context_bytes == 0
    assert c.device(0).flops("float32") == max(r["flops_s"] for r in prof.compute if r["op"] == "matmul" and r["dtype"] == "float32")
    assert Cluster.from_json(c.to_json()) == c


def test_local_cpu_uses_the_cached_profile(profiled: Path) -> None:
    c = Cluster.local_cpu(WORLD, cache_dir=profiled / "cache")
    prof = load_profile(profiled / "out.json")
    assert c == prof.cluster
    m = CommModel(c)
    fit = c.intra_node.fit(Collective.ALL_REDUCE, WORLD)
    times = [t for _, t in fit.points]
    assert times == sorted(times), "measured points are smoothed to be non-decreasing in size"
    point = dict(fit.points)[2**20]
    assert m.time_s(Collective.ALL_REDUCE, 2**20, [0, 1]) == pytest.approx(point, rel=1e-6)  # a fit point
    r = next(r for r in prof.measurements if r["collective"] == "all_reduce" and r["nbytes"] == 2**20)
    assert point == pytest.approx(r["time_s"], rel=1.0)  # smoothing moves a point, within noise


def test_profile_from_another_machine_is_refused(profiled: Path, tmp_path: Path) -> None:
    from galvatron_fx.cluster.host import make_fingerprint
    from galvatron_fx.errors import ConfigError

    d = json.loads((profiled / "out.json").read_text())
    d["fingerprint_fields"]["device_model"] = "NVIDIA H100 80GB HBM3"
    d["fingerprint"] = make_fingerprint(d["fingerprint_fields"])
    (tmp_path / "other.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="measured on different hardware"):
        load_profile(tmp_path / "other.json")
