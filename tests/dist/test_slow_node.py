"""A slowed "node" on real gloo ranks: the hardware profile sees it, the planner moves work off it.

World 4 as two nodes of two ranks (each rank's ``GROUP_RANK`` set as two torchrun agents set
it). On node 1's ranks every operator takes ``STRETCH``× its time (a dispatch mode sleeps
after each op for the op's own time × (STRETCH − 1); collectives excepted, their waits are not
compute), for the whole process: its profile and its training alike. ``profile_hardware``
measures every node's matmul rate and profiles node 1 as its own device kind; a Hugging Face
Llama planned with two pipeline stages on that profile gets fewer layers on node 1 than the
plan made as if both nodes were node 0's device, and the measured step time of the
heterogeneous plan beats the even one's. Both train with the losses of one process.
"""

from __future__ import annotations

import os
import time

import hf_tiny
import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn

# this module compares the measured step times of two plans:
# `make test` runs it alone, not beside the unit tests
pytestmark = pytest.mark.timing

STRETCH = 4.0
WORLD = 4
LAYERS = 6
LOSS_TOL = 2e-5
# two stages, data-parallel layers (the stretch mode leaves DTensor's own dispatch alone, but
# DTensor's autograd under a dispatch mode is not what this test is about)
SPACE = {"pp": (2,), "tp": (1,), "dp_types": ("ddp",), "recompute": ("none",), "sp": ("none",)}


def _stretch_mode(stretch: float):
    """A ``TorchDispatchMode``: every non-collective op on plain tensors followed by a sleep of its
    own time × (stretch − 1)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class Stretch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # a DTensor's op: its own dispatch runs the local ops (stretched)
            if any(t.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__ for t in types):
                return func(*args, **(kwargs or {}))  # fake tensors (capture): nothing is computed
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            if func.namespace not in ("c10d", "_c10d_functional", "c10d_functional", "_dtensor"):
                time.sleep((time.perf_counter() - t0) * (stretch - 1))
            return out

    return Stretch()


def _run(pm, model, batches, steps: int) -> tuple[list[float], float]:
    """Losses of ``steps`` steps (against one process's) and the median of the last steps' times."""
    import copy
    import statistics

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import _disable_current_modes

    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    errs, times = [], []
    for i in range(steps):
        b = batches[i % len(batches)]
        dist.barrier()
        t0 = time.perf_counter()
        got = pm.train_step(b, opt)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        with _disable_current_modes():
            loss = ref(**b).loss
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
        errs.append(abs(got - loss.item()))
    return errs, statistics.median(times[2:])


def _slow_node(tmp: str) -> dict:
    import copy
    import dataclasses

    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx.profiler.hardware import profile_hardware

    rank = dist.get_rank()
    prof = profile_hardware(sizes_bytes=(64 * 1024, 1024 * 1024), repeats=2, collectives=("all_reduce",),
                            group_sizes=(2, 4), p2p=False, matmul_sizes=(256, 512), dtypes=("float32",),
                            attention_seq_lens=(), overlap=False, cache_dir=f"{tmp}/cache", progress=False)
    cl = prof.cluster
    fast_kind = cl.node_kinds[0]
    even_cl = dataclasses.replace(cl, device_specs={fast_kind: cl.device_specs[fast_kind]},
                                  node_kinds=(fast_kind,) * cl.num_nodes)
    model, _ = hf_tiny.build("llama", num_hidden_layers=LAYERS)
    batches = [hf_tiny.batch("llama", 8, seed=10 + i) for i in range(2)]
    out = {"kinds": list(cl.node_kinds), "peaks": {k: s.flops("float32") for k, s in cl.device_specs.items()}}
    for name, c in (("hetero", cl), ("even", even_cl)):
        pm = gfx.compile(copy.deepcopy(model), c, batches[0], global_batch_size=8, search=SPACE)
        stage_of = [lp.stage for lp in pm.plan.layers]
        errs, step_s = _run(pm, model, batches, 6)
        out[name] = {"layers_per_stage": [stage_of.count(s) for s in range(pm.plan.pp)],
                     "stage_devices": list(pm.plan.stage_devices or ()), "stage_ranks": [list(r) for r in pm.plan.stage_ranks],
                     "loss_err": max(errs), "step_s": step_s, "predicted_s": pm.plan.predicted.step_time_s}
        del pm
    out["rank"] = rank
    return out


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    os.environ["GROUP_RANK"] = str(rank // 2)  # two "agents" of two ranks
    init_gloo(rank, world, port)
    if rank // 2 == 1:
        _stretch_mode(STRETCH).__enter__()  # the whole process: the profile and the training
    run_jobs(rank, tmp, [("slow", lambda: _slow_node(tmp))])


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, WORLD, tmp_path_factory.mktemp("slownode"))


@pytest.mark.slow
def test_a_slowed_node_is_profiled_as_its_own_kind_and_gets_less_work(world4):
    x = assert_ok(world4, "slow")
    fast, slow = x["kinds"]
    assert fast != slow and slow.endswith("@node1"), x["kinds"]
    assert x["peaks"][slow] < 0.67 * x["peaks"][fast], x["peaks"]
    het, even = x["hetero"], x["even"]
    print(f"slowed node: kinds {x['kinds']}, float32 peaks {x['peaks']}; layers per stage heterogeneous "
          f"{het['layers_per_stage']} ({het['step_s'] * 1e3:.0f} ms measured), even {even['layers_per_stage']} "
          f"({even['step_s'] * 1e3:.0f} ms): {even['step_s'] / het['step_s']:.2f}×")
    # the stage on node 1 (ranks 2, 3) holds fewer layers than the one on node 0, and fewer than
    # the plan that takes both nodes for node 0's device gives it
    stage1 = next(s for s, ranks in enumerate(het["stage_ranks"]) if 2 in ranks)
    stage0 = 1 - stage1
    assert het["layers_per_stage"][stage1] < het["layers_per_stage"][stage0], het
    even1 = next(s for s, ranks in enumerate(even["stage_ranks"]) if 2 in ranks)
    assert het["layers_per_stage"][stage1] < even["layers_per_stage"][even1], (het, even)
    assert het["stage_devices"][stage1] == slow
    # measured on the slowed ranks: the heterogeneous plan's step is faster
    assert het["step_s"] < even["step_s"], (het, even)
    for r in world4.values():
        assert r["slow"]["hetero"]["loss_err"] < LOSS_TOL and r["slow"]["even"]["loss_err"] < LOSS_TOL, r["slow"]
