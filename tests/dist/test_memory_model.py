"""The per-rank memory model against memory measured on 2 real gloo ranks.

The ranks are spawned once for the module. Each rank runs, for every zoo model × data-parallel
flavour × recompute option, one AdamW training step of the model as the runtime would build it —
each block's forward wrapped with ``galvatron_fx.ir.recompute.checkpoint_fn``, then DDP
(``gradient_as_bucket_view=True``) or FSDP2 ``fully_shard`` on every block and the root — under
``torch.distributed._tools.MemTracker`` (``FSDPMemTracker`` for FSDP2), and writes what it saw:

- parameters, gradients and optimizer states held after the step (whole model, per rank);
- the gathered (unsharded) parameters held at the end of forward (ZeRO-2 keeps them);
- per block, the activation bytes its forward leaves behind (tracker snapshots before the block's
  forward and after it; what a block creates and keeps differs from what the model charges to it
  by its output minus its input, which have equal size for a block).

The test functions predict the same with ``layer_memory`` on the captured graph (captured at the
global batch, scaled to the local micro-batch) and compare within 5%.
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from harness import free_port

WORLD = 2
GLOBAL_BATCH = 4
LOCAL_BATCH = GLOBAL_BATCH // WORLD
SEQ = 64
MODELS = ("gpt-tiny", "llama-tiny")
DP_TYPES = ("ddp", "zero2", "zero3")
RECOMPUTES = ("none", "selective", "full")
REL = 0.05



def _bytes(snapshot: dict, *kinds: str) -> int:
    """Sum of the tracker's ``kinds`` (reference-type values) on cpu in one snapshot."""
    import torch

    dev = snapshot.get(torch.device("cpu"), {})
    return sum(v for k, v in dev.items() if getattr(k, "value", k) in kinds)


def _settled(tracker) -> dict:
    """The tracker's snapshot once the all-gathers' buffers are gone (at most 2 s): gloo's worker
    thread drops its reference to a finished collective's output a moment after ``wait()``
    returns, so that one block's gathered buffer was now and then still counted beside the
    unsharded parameters it was copied into (one block's bytes over, now and then, under load)."""
    snap = tracker.get_tracker_snapshot()
    deadline = time.monotonic() + 2.0
    while _bytes(snap, "All Gather") and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
        snap = tracker.get_tracker_snapshot()
    return snap


def _measure(name: str, dp_type: str, recompute: str, rank: int) -> dict:
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from galvatron_fx import zoo
    from galvatron_fx.ir.recompute import checkpoint_fn

    model, inputs = zoo.build(name, batch_size=GLOBAL_BATCH, seq_len=SEQ, seed=0)
    local = tuple(x[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH].contiguous() for x in inputs)
    wrap = checkpoint_fn(recompute)
    blocks = list(model.blocks)
    if wrap is not None:
        for b in blocks:
            b.forward = wrap(b.forward)
    if dp_type == "ddp":
        # broadcast_buffers=False: Llama's rotary tables are derived from the config (equal on
        # every rank); broadcasting them flattens them into a forward-time temporary that the
        # tracker would count as a block's activation on the receiving rank
        root = DistributedDataParallel(model, gradient_as_bucket_view=True, broadcast_buffers=False)
        opt = torch.optim.AdamW(root.parameters(), lr=1e-3)
        tracker = MemTracker()
        tracker.track_external(root, opt, *local)
        act, param, unsharded, grad, optim = ("Activation",), ("Parameter",), (), ("Gradient",), ("Optstate",)
        before_fw, after_fw = _ModState.PRE_FW, _ModState.POST_FW
    else:
        for b in blocks:
            fully_shard(b, reshard_after_forward=dp_type == "zero3")
        fully_shard(model, reshard_after_forward=dp_type == "zero3")
        root = model
        opt = torch.optim.AdamW(root.parameters(), lr=1e-3)
        tracker = FSDPMemTracker(root, opt)
        tracker.track_inputs(local)
        act, param, grad, optim = ("Activation",), ("Sharded Param",), ("Sharded Grad",), ("OptState",)
        unsharded = ("Unsharded Param", "All Gather")
        before_fw, after_fw = _FSDPModState.BEF_PRE_FW, _FSDPModState.AFT_POST_FW
    with tracker:
        loss = root(*local)
        end_fw = _settled(tracker)
        loss.backward()
        opt.step()
        if dp_type == "ddp":
            # DDP's reducer allocates its gradient buckets during the first backward and points
            # ``.grad`` into them from C++, so the tracker files the buckets as backward
            # temporaries; re-reading the parameters files the same storages as gradients
            tracker.track_external(root)
        end_step = tracker.get_tracker_snapshot()
    block_act = []
    for b in blocks:
        snaps = tracker.memory_tracking[b].snapshots
        block_act.append(_bytes(snaps[after_fw][0], *act) - _bytes(snaps[before_fw][0], *act))
    return {
        "param_bytes": _bytes(end_step, *param),
        "grad_bytes": _bytes(end_step, *grad),
        "optimizer_bytes": _bytes(end_step, *optim),
        "unsharded_at_end_of_forward": _bytes(end_fw, *unsharded),
        "activation_at_end_of_forward": _bytes(end_fw, *act),
        "block_activation_bytes": block_act,
        "loss": loss.detach().item(),
    }


def _worker(rank: int, port: int, tmp: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    out: dict[str, dict] = {}
    try:
        for name in MODELS:
            for dp_type in DP_TYPES:
                for recompute in RECOMPUTES:
                    out[f"{name}/{dp_type}/{recompute}"] = _measure(name, dp_type, recompute, rank)
    finally:
        Path(f"{tmp}/rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("mem")
    mp.spawn(_worker, args=(free_port(), str(tmp)), nprocs=WORLD)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def graphs() -> dict:
    import galvatron_fx
    from galvatron_fx import zoo

    out = {}
    for name in MODELS:
        model, inputs = zoo.build(name, batch_size=GLOBAL_BATCH, seq_len=SEQ, device="meta")
        out[name] = galvatron_fx.capture(model, inputs)
    return out


def predict(mg, dp_type: str, recompute: str) -> dict:
    """Per-rank memory of the model under one flavour, from ``layer_memory`` on every layer.

    Each trainable parameter is charged to the first layer that reads it (a tied embedding/head
    weight is stored once); recompute applies to the blocks only, as the runtime wraps blocks.
    """
    from galvatron_fx.cost_models.memory import layer_memory
    from galvatron_fx.ir.graph import LayerRole
    from galvatron_fx.ir.strategy import LayerStrategy

    owned: dict[str, list] = {}
    for p in mg.params.values():
        if p.requires_grad and not p.is_buffer:
            owned.setdefault(p.layers[0], []).append(p)
    total, blocks = None, []
    for layer in mg.layers:
        is_block = layer.role == LayerRole.BLOCK
        strategy = LayerStrategy(dp_type=dp_type, recompute=recompute if is_block else "none")
        m = layer_memory(layer.costs, strategy, dp=WORLD, micro_batch=LOCAL_BATCH,
                         captured_batch=GLOBAL_BATCH, params=owned.get(layer.name, []))
        total = m if total is None else total + m
        if is_block:
            blocks.append(m.activation_bytes)
    return {"param_bytes": total.param_bytes, "grad_bytes": total.grad_bytes,
            "optimizer_bytes": total.optimizer_bytes, "unsharded_param_bytes": total.unsharded_param_bytes,
            "block_activation_bytes": blocks}


CASES = [(n, d, r) for n in MODELS for d in DP_TYPES for r in RECOMPUTES]


@pytest.mark.parametrize("name,dp_type,recompute", CASES, ids=["/".join(c) for c in CASES])
def test_predicted_equals_measured(measured, graphs, name, dp_type, recompute) -> None:
    pred = predict(graphs[name], dp_type, recompute)
    for rank, res in enumerate(measured):
        got = res[f"{name}/{dp_type}/{recompute}"]
        where = f"{name}/{dp_type}/{recompute} rank {rank}"
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert got[key] == pytest.approx(pred[key], rel=REL), f"{where}: {key}"
        assert len(got["block_activation_bytes"]) == len(pred["block_activation_bytes"])
        for i, (g, p) in enumerate(zip(got["block_activation_bytes"], pred["block_activation_bytes"])):
            assert g == pytest.approx(p, rel=REL), f"{where}: activations of blocks.{i}"
        # ZeRO-2 keeps every layer's gathered parameters from its forward to its backward
        if dp_type == "zero2":
            assert got["unsharded_at_end_of_forward"] == pytest.approx(pred["unsharded_param_bytes"], rel=REL), where


def test_every_rank_ran_the_same_steps(measured) -> None:
    assert all(set(r) == {"/".join(c) for c in CASES} for r in measured)
    # the same model and data on every flavour: the loss does not depend on the strategy
    for name in MODELS:
        for rank in range(WORLD):
            losses = [measured[rank][f"{name}/{d}/{r}"]["loss"] for d in DP_TYPES for r in RECOMPUTES]
            assert max(losses) - min(losses) < 1e-4, (name, rank, losses)
