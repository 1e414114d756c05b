"""Cluster: presets, JSON round trip, validation, topology helpers, local_cpu and fingerprints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cached_profiles import write_cached_profile

from galvatron_fx.cluster import (
    PRESET_NAMES,
    Cluster,
    Collective,
    CollectiveFit,
    TierName,
    heterogeneous,
)
from galvatron_fx.cluster.host import local_fingerprint
from galvatron_fx.errors import ConfigError
from galvatron_fx.profiler.hardware_profile import load_profile


@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("nodes", [1, 3])
def test_preset_round_trip(name: str, nodes: int) -> None:
    c = Cluster.preset(name, nodes=nodes)
    assert c.world_size == 8 * nodes
    back = Cluster.from_json(c.to_json())
    assert back == c
    assert back.to_json() == c.to_json()


def test_preset_datasheet_figures() -> None:
    a100 = Cluster.preset("dgx-a100-80g", nodes=2)
    assert a100.device(0).flops("bfloat16") == 312e12
    assert a100.device(15).flops("torch.float32") == 19.5e12
    assert a100.memory_bytes(3) == 80 * 2**30
    assert a100.intra_node.bandwidth_bytes_s == 240e9
    h100 = Cluster.preset("dgx-h100")
    assert h100.device(0).peak_flops["bfloat16"] == 989e12
    assert h100.device(0).memory_bandwidth_bytes_s == 3.35e12
    assert Cluster.preset("h200").device(0).memory_bandwidth_bytes_s == 4.8e12
    rtx = Cluster.preset("rtx4090-pcie")
    assert rtx.memory_bytes(0) == 24 * 2**30 and rtx.intra_node.bandwidth_bytes_s == 25e9
    with pytest.raises(ConfigError, match="unknown cluster preset"):
        Cluster.preset("tpu-v5")


def test_topology_helpers() -> None:
    c = Cluster.preset("dgx-h100", nodes=2)
    assert [c.node_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert c.tier_of([0, 1, 2]).name is TierName.INTRA_NODE
    assert c.tier_of([0, 8]).name is TierName.INTER_NODE
    with pytest.raises(ConfigError, match="outside the cluster"):
        c.node_of(16)


def test_heterogeneous_nodes() -> None:
    c = heterogeneous("mixed", [Cluster.preset("dgx-a100-80g"), Cluster.preset("h200")])
    assert c.world_size == 16 and c.is_heterogeneous
    assert c.memory_bytes(0) == 80 * 2**30 and c.memory_bytes(8) == 143771 * 2**20
    assert c.min_memory_bytes() == 80 * 2**30
    assert c.device(9).kind == "H200-SXM-141GB"
    assert Cluster.from_json(c.to_json()) == c


def _preset_dict() -> dict:
    return json.loads(Cluster.preset("dgx-a100-80g").to_json())


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(bogus=1), r"unknown key\(s\) \['bogus'\]"),
        (lambda d: d.pop("num_nodes"), r"missing required key\(s\) \['num_nodes'\]"),
        (lambda d: d.update(devices_per_node=0), r"cluster\.devices_per_node: must be > 0"),
        (lambda d: d.update(num_nodes=-1), r"cluster\.num_nodes: must be > 0"),
        (lambda d: d["device_specs"]["A100-SXM-80GB"].update(memory_bytes=0), r"device_specs\['A100-SXM-80GB'\]\.memory_bytes: must be > 0"),
        (lambda d: d["device_specs"]["A100-SXM-80GB"].update(memory_bytes=-5), r"memory_bytes: must be > 0"),
        (lambda d: d["device_specs"]["A100-SXM-80GB"]["peak_flops"].update(bfloat16=-1.0), r"peak_flops\.bfloat16: must be > 0"),
        (lambda d: d["intra_node"].update(bandwidth_bytes_s="fast"), r"intra_node\.bandwidth_bytes_s: expected a finite number"),
        (lambda d: d["inter_node"].pop("latency_s"), r"inter_node: missing required key\(s\) \['latency_s'\]"),
        (lambda d: d.update(node_kinds=["A100-SXM-80GB", "A100-SXM-80GB"]), r"node_kinds has 2 entries but num_nodes is 1"),
        (lambda d: d.update(node_kinds=["V100"]), r"node_kinds\[0\] = 'V100' is not in device_specs"),
        (lambda d: d["intra_node"].update(fits={"all_reduce": {"2": {"alpha_s": -1.0, "beta_s_per_byte": 0.0}}}), r"fits\['all_reduce'\]\['2'\]\.alpha_s: must be >= 0"),
        (lambda d: d["intra_node"].update(fits={"allreduce": {}}), r"unknown collective 'allreduce'"),
        (lambda d: d.update(overlap_slowdown=0.5), r"overlap_slowdown must be >= 1"),
        (lambda d: d.update(schema_version=99), r"schema_version"),
    ],
)
def test_bad_cluster_json_names_the_field(mutate, match: str) -> None:
    d = _preset_dict()
    mutate(d)
    with pytest.raises(ConfigError, match=match):
        Cluster.from_json(json.dumps(d))


def test_malformed_json_and_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="malformed"):
        Cluster.from_json('{"name": ')
    with pytest.raises(ConfigError, match="does not exist"):
        Cluster.from_json(tmp_path / "nope.json")
    p = tmp_path / "c.json"
    Cluster.preset("h200", nodes=2).to_json(p)
    assert Cluster.from_json(p).world_size == 16


def test_fits_round_trip_with_points() -> None:
    fit = CollectiveFit(alpha_s=1e-4, beta_s_per_byte=1e-9, points=((4096, 2e-4), (65536, 5e-4)))
    c = Cluster.preset("dgx-a100-80g").with_fits(TierName.INTRA_NODE, {Collective.ALL_REDUCE: {2: fit}})
    back = Cluster.from_json(c.to_json())
    assert back.intra_node.fit("all_reduce", 2) == fit
    assert back == c


def test_local_cpu_defaults_then_cached_profile(tmp_path) -> None:
    c = Cluster.local_cpu(2, cache_dir=tmp_path)
    assert c.world_size == 2 and c.backend == "gloo" and c.all_to_all_via_all_gather
    assert c.fingerprint == local_fingerprint(2)
    assert c.intra_node.fits == {}  # conservative defaults, no cached profile
    # a cached profile with this fingerprint is picked up
    fit = CollectiveFit(alpha_s=3e-4, beta_s_per_byte=2e-9)
    measured = c.with_fits(TierName.INTRA_NODE, {Collective.ALL_REDUCE: {2: fit}})
    path = write_cached_profile(tmp_path, measured, 2)
    assert path.name == f"hardware-{c.fingerprint}.json"
    assert Cluster.local_cpu(2, cache_dir=tmp_path).intra_node.fit("all_reduce", 2) == fit
    # ... but not for another world size (different fingerprint)
    assert Cluster.local_cpu(4, cache_dir=tmp_path).intra_node.fits == {}
    # nor a file of this name that records another machine (another CPU, torch 1.0), nor one edited
    # (its fields no longer hash to its fingerprint), nor one that is not a profile at all (/dev/zero)
    from galvatron_fx.cluster.spec import cached_profile

    write_cached_profile(tmp_path, measured, 2, device_model="cpu:Other 9000", torch_version="1.0")
    got, why = cached_profile(2, tmp_path)
    assert got is None and "measured on another machine" in why and "torch_version '1.0'" in why, why
    assert Cluster.local_cpu(2, cache_dir=tmp_path).intra_node.fits == {}
    data = json.loads(write_cached_profile(tmp_path, measured, 2).read_text())
    data["fingerprint"] = "0" * 16  # this machine's fields, but not the fingerprint they hash to
    path.write_text(json.dumps(data))
    assert "does not record the machine" in cached_profile(2, tmp_path)[1]
    path.unlink()
    os.symlink("/dev/zero", path)
    got, why = cached_profile(2, tmp_path)
    assert got is None and "larger than" in why and Cluster.local_cpu(2, cache_dir=tmp_path).intra_node.fits == {}
    with pytest.raises(ConfigError, match="world_size must be >= 1"):
        Cluster.local_cpu(0)


def _fake_profile(tmp_path, fields: dict) -> str:
    from galvatron_fx.cluster.host import make_fingerprint

    fp = make_fingerprint(fields)
    cluster = Cluster.local_cpu(2, cache_dir=tmp_path)
    d = dict(fingerprint=fp, fingerprint_fields=fields, cluster=cluster.to_dict(), hosts=["a", "a"], measurements=[])
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(d))
    return str(p)


def test_profile_from_other_machine_is_refused(tmp_path) -> None:
    from galvatron_fx.profiler.hardware_profile import current_fingerprint_fields

    here = current_fingerprint_fields(backend="gloo", world_size=2)
    assert load_profile(_fake_profile(tmp_path, here)).fingerprint_fields == here
    other = dict(here, device_model="Some Other CPU", torch_version="1.0")
    with pytest.raises(ConfigError, match=r"different hardware \(device_model: profile 'Some Other CPU'"):
        load_profile(_fake_profile(tmp_path, other))
    assert load_profile(_fake_profile(tmp_path, other), check_fingerprint=False).fingerprint_fields == other
    # a hand-edited fingerprint is caught too
    p = _fake_profile(tmp_path, here)
    d = json.loads(Path(p).read_text())
    d["fingerprint_fields"]["world_size"] = 8
    Path(p).write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="does not match its recorded fields"):
        load_profile(p)
