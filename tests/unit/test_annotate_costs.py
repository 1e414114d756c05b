"""annotate_costs_pass: FLOPs against the analytic count, activation bytes against a real run."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.ir.meta import facts


def analytic_train_flops(model: nn.Module, cfg, batch: int, seq: int, n_layers: int) -> int:
    """6 × (parameters that multiply activations) × tokens + the attention term.

    Matmul parameters are the weights of every ``nn.Linear`` plus a tied LM head (embedding
    lookups and norms do no matmuls). Attention per layer: QKᵀ and AV are 2·B·T²·d FLOPs
    each forward; the fused (flash) attention backward recomputes QKᵀ, so it costs 2.5× the
    forward rather than 2×: ×3.5 in all.
    """
    weights = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)}
    matmul_params = sum(weights.values())
    if getattr(cfg, "tie_embeddings", False) and not any(
            w.shape == (cfg.vocab_size, cfg.d_model) and id(w) in weights for w in model.parameters()):
        matmul_params += cfg.vocab_size * cfg.d_model  # the head multiplies by the embedding table
    tokens = batch * seq
    attention = 7 * 2 * batch * seq * seq * cfg.d_model * n_layers  # 3.5 × 4·B·T²·d
    return 6 * matmul_params * tokens + attention


@pytest.mark.parametrize("name,overrides,batch,seq", [
    ("gpt-tiny", None, 2, 64),
    ("llama-tiny", None, 2, 64),
    ("gpt2-small", None, 1, 1024),
    ("llama2-7b", {"n_layers": 2}, 1, 2048),  # full width, two blocks: fast on meta
    ("llama3-8b", {"n_layers": 2}, 1, 2048),  # grouped-query attention, 128k vocab
])
def test_training_flops_match_analytic_count(name, overrides, batch, seq):
    device = "cpu" if name.endswith("tiny") else "meta"
    model, inputs = zoo.build(name, batch_size=batch, seq_len=seq, device=device, overrides=overrides)
    cfg = zoo.config(name, overrides=overrides)
    mg = gfx.capture(model, inputs)
    tot = mg.total_costs()
    measured = tot.fwd_flops + tot.bwd_flops
    expected = analytic_train_flops(model, cfg, batch, seq, cfg.n_layers)
    print(f"{name}: measured {measured:.4e} analytic {expected:.4e} ratio {measured / expected:.4f}")
    assert measured == pytest.approx(expected, rel=0.02)
    # backward of a matmul is two matmuls: bwd ≈ 2 × fwd (attention backward is 2.5×)
    assert 1.9 < tot.bwd_flops / tot.fwd_flops < 2.2


def _real_saved_bytes(model: nn.Module, inputs, layer_modules: dict[str, nn.Module]) -> dict[str, int]:
    """Bytes autograd really saves for backward while each module runs (a real CPU forward).

    Unique storages, parameters excluded; a storage is charged to the block that saved it first,
    except a tensor handed to two or more blocks from outside them (T5's position bias): that is
    its producer's, as the prediction charges it.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    current: list[str | None] = [None]
    first_saver: dict[int, tuple[str, int]] = {}
    readers: dict[int, set[str]] = {}
    made_inside: set[int] = set()
    hooks = []

    def enter(name, args):
        current[0] = name
        for a in args:
            if isinstance(a, torch.Tensor):
                readers.setdefault(a.untyped_storage().data_ptr(), set()).add(name)

    def leave(outputs):
        for o in (outputs if isinstance(outputs, tuple) else (outputs,)):
            if isinstance(o, torch.Tensor):
                made_inside.add(o.untyped_storage().data_ptr())
        current[0] = None

    for name, mod in layer_modules.items():
        hooks.append(mod.register_forward_pre_hook(lambda m, a, n=name: enter(n, a)))
        hooks.append(mod.register_forward_hook(lambda m, a, o: leave(o)))

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if current[0] is not None and key not in first_saver and key not in params:
            first_saver[key] = (current[0], t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    for h in hooks:
        h.remove()
    per: dict[str, int] = {}
    for key, (block, nbytes) in first_saver.items():
        if len(readers.get(key, ())) >= 2 and key not in made_inside:
            continue
        per[block] = per.get(block, 0) + nbytes
    return per


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny",
                                  "vit-tiny"])
def test_block_activation_bytes_match_a_real_run(name, monkeypatch):
    from galvatron_fx.ops.attention import sdpa_or_biased

    model, inputs = zoo.build(name, batch_size=2, seq_len=64)
    mg = gfx.capture(model, inputs)
    modules = dict(model.named_modules())
    # the runtime runs attention with a trained bias (T5's) as one op: so does the real run
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_or_biased)
    real = _real_saved_bytes(model, inputs, {b.name: modules[b.name] for b in mg.blocks()})
    for block in mg.blocks():
        predicted = block.costs.activation_bytes
        print(f"{name} {block.name}: predicted {predicted} real {real[block.name]}")
        assert predicted == pytest.approx(real[block.name], rel=0.05)


def test_node_facts_are_per_node_and_sum_to_layers():
    model, inputs = zoo.build("gpt-tiny", batch_size=2, seq_len=32)
    mg = gfx.capture(model, inputs)
    nodes = mg.nodes_by_name()
    block = mg.blocks()[1]
    assert sum(facts(nodes[n]).fwd_flops for n in block.node_names) == block.costs.fwd_flops
    linears = [n for n in block.node_names if "linear" in str(nodes[n].target)]
    assert linears and all(facts(nodes[n]).fwd_flops > 0 for n in linears)
    # the loss layer needs no parameter gradient but its input carries one
    assert all(facts(nodes[n]).requires_grad for n in block.node_names
               if isinstance(nodes[n].meta.get("val"), torch.Tensor) and nodes[n].meta["val"].is_floating_point())
    # identical blocks get identical node facts
    b2 = mg.blocks()[2]
    assert [facts(nodes[n]).to_dict() | {"layer": None} for n in block.node_names] == \
           [facts(nodes[n]).to_dict() | {"layer": None} for n in b2.node_names]


def test_costs_scale_with_batch_and_sequence():
    small = gfx.capture(*zoo.build("gpt-tiny", batch_size=1, seq_len=32)).blocks()[0].costs
    big = gfx.capture(*zoo.build("gpt-tiny", batch_size=2, seq_len=32)).blocks()[0].costs
    assert big.fwd_flops == 2 * small.fwd_flops
    assert big.activation_bytes == 2 * small.activation_bytes
    assert big.num_params == small.num_params


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_recompute_activation_bytes_match_memtracker(name):
    """Activations kept by one block under none/selective/full recomputation, predicted from
    the fake-tensor measurement, against PyTorch's MemTracker on a real CPU run of the block
    wrapped exactly as the runtime wraps it (``galvatron_fx.ir.recompute.checkpoint_fn``)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from galvatron_fx.ir.recompute import checkpoint_fn

    batch, seq = 2, 64
    model, inputs = zoo.build(name, batch_size=batch, seq_len=seq)
    mg = gfx.capture(model, inputs)
    layer = mg.blocks()[1]
    block = dict(model.named_modules())[layer.name]
    extra = (model.rope_cos[:seq], model.rope_sin[:seq]) if hasattr(model, "rope_cos") else ()
    full_none = layer.costs.activation_bytes
    seen = {}
    for mode in ("none", "selective", "full"):
        wrap = checkpoint_fn(mode)
        fn = wrap(block) if wrap else block
        tracker = MemTracker()
        tracker.track_external(block)
        with tracker:
            x = torch.randn(batch, seq, zoo.config(name).d_model, requires_grad=True)
            out = fn(x, *extra)
            snap = tracker.get_tracker_snapshot("current")
        measured = next(iter(snap.values()))["Activation"] - out.numel() * out.element_size()
        predicted = layer.costs.activation_bytes_for(mode)
        seen[mode] = predicted
        print(f"{name} {mode}: predicted {predicted} measured {measured}")
        assert predicted == pytest.approx(measured, rel=0.05)
    assert seen["full"] < seen["selective"] < seen["none"] == full_none
    # full recomputation keeps only the block input and redoes the forward in backward
    assert seen["full"] == batch * seq * zoo.config(name).d_model * 4
    assert layer.costs.recompute_flops_full > 0.5 * layer.costs.fwd_flops


def test_alike_nodes_share_one_backward_measure_and_get_the_same_costs(monkeypatch):
    """An unrolled loop (HF Mamba's selective scan: a few ops per time step) measures each op's
    backward once per op and inputs alike: every node's costs equal those measured node by node."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import hf_tiny

    from galvatron_fx.passes import annotate_costs as ac

    model, _ = hf_tiny.build("mamba")
    batch = hf_tiny.batch("mamba", 2, seed=0)
    calls = []
    measure = ac._node_backward
    monkeypatch.setattr(ac, "_node_backward", lambda *a: calls.append(1) or measure(*a))

    def costs():
        mg = gfx.capture(model, (), example_kwargs=batch, probe=False)
        return {n.name: (facts(n).bwd_flops, facts(n).bwd_bytes) for n in mg.gm.graph.nodes}, \
            [layer.costs for layer in mg.layers]

    shared, shared_calls = costs(), len(calls)
    calls.clear()
    monkeypatch.setattr(ac, "_backward_key", lambda *a: None)
    one_by_one = costs()
    assert shared == one_by_one
    assert shared_calls < 0.5 * len(calls), (shared_calls, len(calls))  # the steps share their measures
