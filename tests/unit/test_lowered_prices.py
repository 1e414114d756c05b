"""``search.lowered_prices``: one layer's lowered program on fake tensors — the collectives
it really issues, the activations it keeps, the transient of its backward."""

from __future__ import annotations

from collections import Counter

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.ir.strategy import SPMode
from galvatron_fx.search.candidates import OptionCache
from galvatron_fx.search.lowered_prices import lowered_price as trace_layer


@pytest.fixture(scope="module")
def tiny():
    model, inputs = zoo.build("gpt-tiny", batch_size=4, seq_len=64, device="cpu", seed=0)
    return gfx.capture(model, inputs)


@pytest.mark.parametrize("sp", [SPMode.NONE, SPMode.MEGATRON])
def test_a_tensor_parallel_block_issues_what_the_ilp_prices(tiny, sp):
    block = tiny.blocks()[0]
    # the memory-lean option: every matrix sharded (Megatron's column -> row pattern)
    opt = OptionCache(tiny, AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g", nodes=1))).option_list(
        block, 2, sp)[-1]
    tr = trace_layer(tiny, block, opt)
    got = Counter((e.direction, e.collective) for e in tr.comm)
    # the runtime sums a value's partial gradient once, where the value is made (Megatron's rule,
    # the ILP's): its collectives are the plan's, forward and backward
    assert got == Counter((e.direction, e.collective) for e in opt.comm), (got, opt.comm)
    if sp == SPMode.NONE:
        assert got == Counter({("fwd", "all_reduce"): 2, ("bwd", "all_reduce"): 2})
    else:  # gathers before the column-parallel matmuls, reduce-scatters after the row-parallel ones
        assert got[("fwd", "all_gather")] >= 1 and got[("bwd", "all_gather")] >= 1
    # what it keeps: about half the unsharded block's activations, and a backward transient
    assert 0.4 * block.costs.activation_bytes < tr.saved_bytes < 0.8 * block.costs.activation_bytes
    assert tr.bwd_transient_bytes > 0
    assert trace_layer(tiny, block, opt) is tr  # cached


def test_an_unsharded_layer_keeps_what_annotate_costs_measured(tiny):
    for layer in tiny.layers:
        tr = trace_layer(tiny, layer, None)
        assert tr.comm == ()
        assert tr.saved_bytes == pytest.approx(layer.costs.activation_bytes, rel=0.01)
    logits = 4 * 64 * tiny.params["tok_emb.weight"].shape[0] * 4  # (B, T, vocab) fp32
    tr = trace_layer(tiny, tiny.layers[-1], None)
    assert tr.bwd_transient_bytes >= 2 * logits  # a cross-entropy's backward holds logits-sized tensors
