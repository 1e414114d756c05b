"""Per-node device kinds in a hardware profile: a node much slower than its peers of the same
device, or a node of another device, is its own kind; noise between equal nodes is not."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from cached_profiles import write_cached_profile

import galvatron_fx as gfx
from galvatron_fx.profiler import hardware_profile as hp
from galvatron_fx.profiler.hardware import _node_devices, _slow_node_lines, node_name


def _node(name, fp32, bw=10e9, mem=0):
    return hp.NodeDevice(name=name, memory_bytes=mem, peak_flops={"float32": fp32}, memory_bandwidth_bytes_s=bw)


def _cluster(nodes):
    rows = [dict(op="matmul", size=512, dtype="float32", time_s=1e-3, flops_s=nodes[0].peak_flops["float32"])]
    return hp.build_cluster([], rows, 10e9, {}, backend="gloo", device=torch.device("cpu"), num_nodes=len(nodes),
                            dpn=2, fingerprint="f", hosts=[f"h{i}" for i in range(len(nodes))], colls_supported=[],
                            nodes=nodes)


def test_a_slow_node_is_its_own_kind_at_its_own_rate():
    cl = _cluster([_node("cpu:X", 20e9), _node("cpu:X", 7e9, bw=4e9), _node("cpu:X", 18e9)])
    assert cl.node_kinds == ("cpu:X", "cpu:X @node1", "cpu:X")
    assert cl.device_specs["cpu:X"].flops("float32") == 20e9  # the fastest of the kind's nodes
    slow = cl.device_specs["cpu:X @node1"]
    assert slow.flops("float32") == 7e9 and slow.memory_bandwidth_bytes_s == 4e9
    assert [cl.device(r).kind for r in (1, 2, 3, 4)] == ["cpu:X", "cpu:X @node1", "cpu:X @node1", "cpu:X"]
    assert gfx.Cluster.from_dict(json.loads(json.dumps(cl.to_dict()))) == cl
    lines = _slow_node_lines([_node("cpu:X", 20e9), _node("cpu:X", 7e9)], ["a", "b"])
    assert len(lines) == 1 and "0.35×" in lines[0] and "'cpu:X @node1'" in lines[0]


def test_equal_nodes_within_the_ratio_stay_one_kind():
    cl = _cluster([_node("cpu:X", 20e9), _node("cpu:X", 20e9 * (hp.SLOW_NODE_RATIO + 0.01))])
    assert len(set(cl.node_kinds)) == 1 and len(cl.device_specs) == 1  # (this host's device, as without nodes)
    assert _slow_node_lines([_node("cpu:X", 20e9), _node("cpu:X", 15e9)], ["a", "b"]) == []


def test_nodes_of_another_device_take_their_own_spec():
    kinds, ref = hp.node_kinds([_node("A100", 3e14, mem=80), _node("H100", 9e14, mem=80), _node("A100", 2.9e14)])
    assert kinds == ["A100", "H100", "A100"] and ref["H100"].peak_flops["float32"] == 9e14


def test_node_devices_take_the_median_of_their_ranks():
    def rank(fp32, bw, name="cpu:X"):
        return ({}, [dict(op="matmul", size=256, dtype="float32", time_s=1.0, flops_s=fp32 / 2),
                     dict(op="matmul", size=512, dtype="float32", time_s=1.0, flops_s=fp32)], bw, {}, name, 0)

    nodes = _node_devices([rank(10, 1), rank(20, 3), rank(30, 5), rank(3, 1), rank(5, 2), rank(4, 9)],
                          [0, 0, 0, 1, 1, 1], 2)
    assert [n.peak_flops["float32"] for n in nodes] == [20, 4]
    assert [n.memory_bandwidth_bytes_s for n in nodes] == [3, 2]


def test_torchrun_agents_on_one_host_are_nodes(monkeypatch):
    monkeypatch.delenv("GROUP_RANK", raising=False)
    alone = node_name()
    monkeypatch.setenv("GROUP_RANK", "1")
    assert node_name() == f"{alone}#1"
    monkeypatch.setenv("GFX_NODE_BY_HOST", "1")
    assert node_name() == alone


def test_local_cpu_keeps_a_profiled_layouts_kinds(tmp_path):
    from galvatron_fx.cluster.host import local_fingerprint

    base = gfx.Cluster.local_cpu(4, cache_dir=tmp_path)
    fast = base.device(0)
    slow = dataclasses.replace(fast, kind=f"{fast.kind} @node1",
                               peak_flops={k: v / 3 for k, v in fast.peak_flops.items()})
    two = dataclasses.replace(base, num_nodes=2, devices_per_node=2, device_specs={fast.kind: fast, slow.kind: slow},
                              node_kinds=(fast.kind, slow.kind), fingerprint=local_fingerprint(4))
    write_cached_profile(tmp_path, two, 4)
    got = gfx.Cluster.local_cpu(nodes=2, devices_per_node=2, cache_dir=tmp_path)
    assert got.node_kinds == (fast.kind, slow.kind)
    one = gfx.Cluster.local_cpu(4, cache_dir=tmp_path)  # another layout: the first node's device everywhere
    assert one.num_nodes == 1 and one.node_kinds == (fast.kind,) and list(one.device_specs) == [fast.kind]
    four = gfx.Cluster.local_cpu(nodes=4, devices_per_node=1, cache_dir=tmp_path)
    assert four.node_kinds == (fast.kind,) * 4


@pytest.mark.parametrize("ratio", [0.5, 0.9])
def test_the_ratio_is_a_parameter(ratio):
    kinds, _ = hp.node_kinds([_node("c", 10.0), _node("c", 7.0)], slow_ratio=ratio)
    assert (kinds[1] == "c") == (ratio < 0.7)


def test_a_slow_node_pays_its_own_fixed_costs():
    from galvatron_fx.cost_models.compute import CPU_DEFAULT

    # a CPU node that launches 4x slower than its fastest peer: the CPU defaults x 4
    nodes = [dataclasses.replace(_node("cpu:X", 20e9), kernel_s=2e-6, layer_s=1e-6),
             dataclasses.replace(_node("cpu:X", 5e9), kernel_s=8e-6, layer_s=4e-6)]
    cl = _cluster(nodes)
    fast, slow = cl.device_specs["cpu:X"], cl.device_specs["cpu:X @node1"]
    assert fast.kernel_overhead_s is None  # the calibration's or the defaults, as on one node
    assert slow.kernel_overhead_s == pytest.approx(4 * CPU_DEFAULT.overhead_s)
    # nodes that measured no fixed costs keep the defaults
    assert _cluster([_node("cpu:X", 20e9), _node("cpu:X", 5e9)]).device_specs["cpu:X @node1"].kernel_overhead_s is None
    # GPUs: each kind its own measured costs
    gpu = [dataclasses.replace(_node("A100", 3e14), kernel_s=5e-6, layer_s=2e-5),
           dataclasses.replace(_node("A100", 1e14), kernel_s=9e-6, layer_s=3e-5)]
    specs = {k: hp._node_fixed_costs(hp.DeviceSpec(kind="A100", memory_bytes=1, peak_flops={}, memory_bandwidth_bytes_s=1),
                                     n, gpu[0]) for k, n in zip("ab", gpu)}
    assert specs == {"a": {"kernel_overhead_s": 5e-6, "layer_overhead_s": 2e-5},
                     "b": {"kernel_overhead_s": 9e-6, "layer_overhead_s": 3e-5}}


def test_node_devices_take_their_ranks_fixed_costs():
    def rank(k):
        return ({}, [dict(op="matmul", size=256, dtype="float32", time_s=1.0, flops_s=1e9),
                     dict(op="kernel_launch", size=100, dtype="float32", time_s=k),
                     dict(op="layer_call", size=3, dtype="float32", time_s=2 * k)], 1e9, {}, "cpu:X", 0)

    nodes = _node_devices([rank(1e-6), rank(3e-6), rank(9e-6), rank(5e-6)], [0, 0, 1, 1], 2)
    assert [n.kernel_s for n in nodes] == pytest.approx([2e-6, 7e-6]) and [n.layer_s for n in nodes] == pytest.approx([4e-6, 14e-6])
