"""Vocab-parallel cross-entropy in the search: class-sharded strategies, their priced in-op
all-reduces, and the choice between gathering the logits and reducing per-row scalars."""

from __future__ import annotations

import dataclasses
from collections import Counter

import hf_tiny
import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard
from torch.fx.experimental.proxy_tensor import make_fx

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.search.intra_layer import option_from_placements, solve_intra_layer
from galvatron_fx.search.node_strategies import _mesh, node_strategies

CLASS_SHARDED = {"_log_softmax": "S(1)->S(1)", "nll_loss_forward": "S(1),R->R,R"}


def _no_latency(cluster: gfx.Cluster) -> gfx.Cluster:
    """``cluster`` with latency-free links: collectives cost their bytes only."""
    return dataclasses.replace(cluster, intra_node=dataclasses.replace(cluster.intra_node, latency_s=0.0))


@pytest.fixture(scope="module")
def gpt2():
    model, batch = hf_tiny.build("gpt2")
    return gfx.capture(model, (), example_kwargs={k: v[:4] for k, v in batch.items()})


def _strategies(fn, *args) -> dict[str, list[str]]:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return {n.name: [str(s) for s in node_strategies(n, _mesh(2), 2)] for n in gm.graph.nodes
            if n.op == "call_function" and n.name in CLASS_SHARDED}


def test_class_sharded_strategies_exist_only_where_the_runtime_runs_them():
    x, t = torch.randn(8, 16), torch.randint(0, 16, (8,))
    got = _strategies(lambda x, t: F.cross_entropy(x, t), x, t)
    assert CLASS_SHARDED["_log_softmax"] in got["_log_softmax"]
    assert CLASS_SHARDED["nll_loss_forward"] in got["nll_loss_forward"]
    # class weights: the NLL loss keeps its classes whole (log-softmax may still shard them)
    got = _strategies(lambda x, t, w: F.cross_entropy(x, t, weight=w), x, t, torch.rand(16))
    assert not any(s.startswith("S(1),") for s in got["nll_loss_forward"]), got
    # a class dim tp does not divide: nothing class-sharded
    got = _strategies(lambda x, t: F.cross_entropy(x, t), torch.randn(8, 15), torch.randint(0, 15, (8,)))
    assert "S(1)->S(1)" not in got["_log_softmax"]
    assert not any(s.startswith("S(1),") for s in got["nll_loss_forward"])


def test_loss_at_vocab_sharded_input_reduces_row_scalars(gpt2):
    """Given vocab-sharded logits, the loss ILP keeps them sharded: three all-reduces of one value
    per row forward (max, sum of exp, picked logit), one backward; no all-gather of the logits."""
    cm = AnalyticCostModel(_no_latency(gfx.Cluster.preset("dgx-a100-80g")))
    loss = gpt2.layers[-1]
    logits = gpt2.nodes_by_name()[loss.input_names[0]].meta["val"]  # (4, 16, 128)
    opt = solve_intra_layer(gpt2, loss, 2, "none", cm, in_layout=Shard(2))
    assert opt.input_layout[0] == "S(2)"
    for node, want in CLASS_SHARDED.items():
        assert opt.placements[node] == want, opt.placements
    inner = [e for e in opt.comm if e.value.endswith("[inner]")]
    assert Counter((e.direction, e.collective) for e in inner) == {("fwd", "all_reduce"): 3, ("bwd", "all_reduce"): 1}
    rows = logits.numel() // logits.shape[-1]
    assert all(e.nbytes == rows * 4 and e.per_sample for e in inner)
    # nothing of the logits' size moves (the labels, 1/128 of it, may be gathered)
    assert all(e.nbytes <= rows * 8 for e in opt.comm), opt.comm
    assert opt.activation_fraction < 0.75  # the log-probabilities are held 1/tp per rank
    # the layout a saved plan records re-prices to the same option
    again = option_from_placements(gpt2, loss, 2, "none", cm, opt.placements)
    assert again.objective_s == pytest.approx(opt.objective_s)
    assert again.input_layout == opt.input_layout
    # replicated logits, links with latency: the whole (tiny) loss on every rank, nothing reduced
    whole = solve_intra_layer(gpt2, loss, 2, "none", AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g")))
    assert whole.input_layout[0] == "R" and not whole.collectives("fwd")


def _tail(plan) -> tuple[str, dict[str, str]]:
    head, loss = plan.layers[-2], plan.layers[-1]
    assert (head.role, loss.role) == ("head", "loss")
    inputs = [v for k, v in loss.placements.items() if k.startswith("arg")]
    return inputs[0], {k: loss.placements.get(k) for k in CLASS_SHARDED}


def test_search_picks_vocab_parallel_when_it_pays(gpt2):
    """Large logits (Llama-2 7B, 32k vocabulary, tp 4): the head hands its loss vocab-sharded
    logits and the loss reduces row scalars. Tiny logits (128 classes) on links with tens of µs of
    latency: gathering them once is cheaper than three latency-bound all-reduces, so the search
    gathers; with latency-free links the same tiny model goes vocab-parallel again."""
    a100 = gfx.Cluster.preset("dgx-a100-80g")
    # Llama-2 7B's widths and vocabulary; two blocks are enough for the head and loss's choice
    model, inputs = zoo.build("llama2-7b", batch_size=1, seq_len=1024, device="meta", overrides={"n_layers": 2})
    big = gfx.plan(gfx.capture(model, inputs), a100, global_batch_size=8, search={"tp": (4,), "pp": (1,)},
                   baselines=False)
    layout, nodes = _tail(big)
    assert layout == "->S(2)" and nodes == CLASS_SHARDED
    assert big.layers[-2].placements["_unsafe_view"].endswith("->S(2)")  # the head's logits leave sharded
    # switched off: nothing class-sharded in the loss, and a slower predicted step
    off = gfx.plan(gfx.capture(model, inputs), a100, global_batch_size=8, baselines=False,
                   search={"tp": (4,), "pp": (1,), "vocab_parallel": False})
    layout, nodes = _tail(off)
    assert layout == "->R" and not any(v and v.startswith("S(1)") for v in nodes.values()), nodes
    assert off.predicted.step_time_s > big.predicted.step_time_s

    space = {"tp": (2,), "pp": (1,)}
    layout, nodes = _tail(gfx.plan(gpt2, a100, global_batch_size=8, search=space, baselines=False))
    assert layout == "->R", (layout, nodes)
    layout, nodes = _tail(gfx.plan(gpt2, _no_latency(a100), global_batch_size=8, search=space, baselines=False))
    assert layout == "->S(2)" and nodes == CLASS_SHARDED
