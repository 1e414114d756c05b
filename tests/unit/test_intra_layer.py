"""The intra-layer placement ILP: exact against brute force, and Megatron rediscovered."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.cost_models import AnalyticCostModel
from galvatron_fx.ir.placements import NodePlacement
from galvatron_fx.passes.decompose_layer import decompose_layer
from galvatron_fx.search.intra_layer import PlacementProblem, _Value, evaluate, solve_intra_layer, solve_placement

R, P = Replicate(), Partial()


@pytest.fixture(scope="module")
def cost_model():
    return AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))


# ---- exactness on random instances ---------------------------------------------------------

def _random_problem(rng: random.Random, cost_model) -> PlacementProblem:
    """A random DAG of 3–6 nodes, each with 1–4 strategies over 2-D tensors."""
    pool = [R, P, Shard(0), Shard(1)]
    n_nodes = rng.randint(3, 6)
    nodes = [f"n{i}" for i in range(n_nodes)]
    inputs: dict[str, list[str]] = {nodes[0]: []}
    for i in range(1, n_nodes):
        inputs[nodes[i]] = rng.sample(nodes[:i], k=min(i, rng.randint(1, 2)))
    strategies, compute = {}, {}
    for n in nodes:
        k = rng.randint(1, 4)
        ss = {NodePlacement(tuple(rng.choice(pool) for _ in inputs[n]), (rng.choice(pool[:1] + pool[2:]),))
              for _ in range(k)}
        strategies[n] = sorted(ss, key=str)
        compute[n] = [rng.uniform(0, 1e-3) for _ in strategies[n]]
    consumers: dict[str, list[tuple[str, int]]] = {n: [] for n in nodes}
    for n in nodes:
        for k, u in enumerate(inputs[n]):
            consumers[u].append((n, k))
    values = [_Value(u, 0, rng.choice([2**16, 2**20, 2**24]), 2, rng.random() < 0.8, cons)
              for u, cons in consumers.items() if cons]
    view_like = {n for n in nodes if len(inputs[n]) == 1 and rng.random() < 0.4}

    def reshard(src, dst, nbytes, ndim):
        return cost_model.reshard_time_s(nbytes, *_layouts(src, dst), range(4), ndim)

    return PlacementProblem(nodes=nodes, strategies=strategies, compute_s=compute, values=values,
                            view_like=view_like, reshard_s=reshard)


def _layouts(src, dst):
    from galvatron_fx.cost_models.reshard import Layout

    return Layout((4,), (src,)), Layout((4,), (dst,))


@pytest.mark.parametrize("split", [False, True])
def test_ilp_equals_brute_force_on_random_graphs(cost_model, monkeypatch, split):
    from galvatron_fx.search import placement_ilp

    # views' pass-through strategies split in two (large problems) or one variable per view
    monkeypatch.setattr(placement_ilp, "SPLIT_ABOVE", -1 if split else 10**12)
    rng = random.Random(0)
    checked = 0
    for _ in range(150):
        pr = _random_problem(rng, cost_model)
        combos = list(itertools.product(*(range(len(pr.strategies[n])) for n in pr.nodes)))
        best = min(evaluate(pr, dict(zip(pr.nodes, c)))[0] for c in combos)
        choice, objective, _ = solve_placement(pr)
        assert objective == pytest.approx(best, rel=1e-7, abs=1e-12)
        assert evaluate(pr, choice)[0] == pytest.approx(best, rel=1e-7, abs=1e-12)
        checked += len(combos)
    assert checked > 1000  # the instances are not trivial


# ---- Megatron, rediscovered ----------------------------------------------------------------

def _collectives(option, direction):
    return Counter(e.collective for e in option.comm if e.direction == direction and e.nbytes >= 2**20)


def _volume(option, direction) -> float:
    """Activation traffic in units of one all-gather of the hidden state (all-reduce = 2)."""
    big = [e for e in option.comm if e.direction == direction and e.nbytes >= 2**20]
    hidden = max(e.nbytes for e in big)
    weight = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1}
    return sum(weight[e.collective] * e.nbytes / hidden for e in big)


@pytest.fixture(scope="module")
def blocks():
    out = {}
    for name in ("gpt2-small", "bert-large", "llama2-7b", "t5-base"):
        model, inputs = zoo.build(name, batch_size=8, seq_len=256, device="meta", overrides={"n_layers": 2})
        mg = gfx.capture(model, inputs)
        for layer in {l.kind: l for l in mg.blocks()}.values():
            out[(name, layer.name.split(".")[0])] = (mg, layer, decompose_layer(mg, layer))
    return out


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", ["gpt2-small", "bert-large"])
def test_tensor_parallel_block_is_megatron(blocks, cost_model, name, tp):
    mg, layer, dl = blocks[(name, "blocks")]
    opt = solve_intra_layer(mg, layer, tp, "none", cost_model, decomposed=dl)
    # column-parallel then row-parallel: Megatron's two all-reduces of the hidden state forward
    # and backward — or the same volume as reduce-scatter + all-gather around a sharded norm
    assert _volume(opt, "fwd") == pytest.approx(4)
    assert _volume(opt, "bwd") <= 7
    if (name, tp) == ("gpt2-small", 2):
        assert _collectives(opt, "fwd") == Counter(all_reduce=2)
    assert opt.param_fraction == pytest.approx(1 / tp, rel=0.02)
    ops = Counter(v for k, v in opt.placements.items() if k.startswith(("mm", "addmm")))
    assert sum(v.endswith("->P") for v in ops.elements()) == 2  # the two row-parallel matmuls


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("key,pairs", [(("gpt2-small", "blocks"), 2), (("llama2-7b", "blocks"), 2),
                                       (("t5-base", "encoder"), 2), (("t5-base", "decoder"), 3)])
def test_sequence_parallel_block_is_megatron_sp(blocks, cost_model, key, pairs, tp):
    mg, layer, dl = blocks[key]
    # the memory-lean variant (every weight sharded) is the textbook Megatron-SP block; the
    # fastest one may keep a small weight whole (T5's cross-attention) — the DP weighs both
    opt = solve_intra_layer(mg, layer, tp, "megatron", cost_model, decomposed=dl, shard_params=True)
    # all-gather before each column-parallel group, reduce-scatter after each row-parallel one
    # (T5's trained relative bias: its attention is one biased-attention op, heads split too)
    assert _collectives(opt, "fwd") == Counter(all_gather=pairs, reduce_scatter=pairs)
    assert opt.input_layout == ("S(1)",) and opt.output_layout[0] == "S(1)"
    assert opt.param_fraction == pytest.approx(1 / tp, rel=0.02)


def test_bert_sequence_parallel_moves_megatron_sp_volume(blocks, cost_model):
    # post-norm BERT: an all-reduce (= reduce-scatter + all-gather) may replace one pair
    mg, layer, dl = blocks[("bert-large", "blocks")]
    opt = solve_intra_layer(mg, layer, 2, "megatron", cost_model, decomposed=dl)
    c = _collectives(opt, "fwd")
    assert c["all_gather"] + c["all_reduce"] == 2 and c["reduce_scatter"] + c["all_reduce"] == 2
    assert _volume(opt, "fwd") == pytest.approx(4)


def test_memory_lean_variant_shards_every_matrix(blocks, cost_model):
    mg, layer, dl = blocks[("t5-base", "decoder")]
    lean = solve_intra_layer(mg, layer, 2, "none", cost_model, decomposed=dl, shard_params=True)
    fast = solve_intra_layer(mg, layer, 2, "none", cost_model, decomposed=dl)
    assert lean.param_fraction == pytest.approx(0.5, abs=0.01)
    assert fast.objective_s <= lean.objective_s + 1e-12


@pytest.mark.timing
def test_solves_are_fast(blocks, cost_model):
    mg, layer, dl = blocks[("llama2-7b", "blocks")]
    opt = solve_intra_layer(mg, layer, 4, "megatron", cost_model, decomposed=dl)
    assert opt.solve_s < 5.0


@pytest.mark.parametrize("name", ["gpt2-small", "llama2-7b"])
def test_ulysses_moves_the_sequence_split_to_heads_around_attention(cost_model, name):
    # one long sequence: the batch cannot be split, so only the sequence or the heads can (at
    # 1,024 tokens gpt2-small's block is cheap enough to gather the sequence and compute it whole)
    model, inputs = zoo.build(name, batch_size=1, seq_len=4096, device="meta",
                              overrides={"n_layers": 2, "max_seq_len": 4096})
    mg = gfx.capture(model, inputs)
    layer = mg.blocks()[1]
    opt = solve_intra_layer(mg, layer, 2, "ulysses", cost_model)
    assert opt.param_fraction == pytest.approx(1.0)  # weights stay whole
    assert opt.input_layout == ("S(1)",) and opt.output_layout[0] == "S(1)"
    fwd = _collectives(opt, "fwd")
    assert fwd["all_to_all"] >= 2 and fwd["all_reduce"] == 0 and fwd["all_gather"] == 0
    sdpa = next(v for k, v in opt.placements.items() if "attention" in k)
    assert sdpa.startswith("S(1),S(1),S(1)")  # (B, H, T, D): heads split inside attention


# ---- alike nodes tied (large layers) -------------------------------------------------------

@pytest.mark.parametrize("split", [False, True])
def test_tied_ilp_is_exact_for_what_it_returns(cost_model, monkeypatch, split):
    from galvatron_fx.search import placement_ilp

    monkeypatch.setattr(placement_ilp, "TIE_ABOVE", -1)  # tie every problem
    monkeypatch.setattr(placement_ilp, "SPLIT_ABOVE", -1 if split else 10**12)
    rng = random.Random(1)
    for _ in range(60):
        pr = _random_problem(rng, cost_model)
        choice, objective, _ = solve_placement(pr)
        tie = placement_ilp.alike_nodes(pr)
        assert all(choice[n] == choice[tie[n]] for n in pr.nodes)
        assert objective == pytest.approx(evaluate(pr, choice)[0], rel=1e-7, abs=1e-12)


def _unrolled(steps: int, cost_model) -> PlacementProblem:
    """A loop of ``steps`` alike steps: ``a_i`` makes a sharded value, ``b_i`` reads it and
    ``b_{i-1}``, replicated or sharded (each step pays its own redistribution)."""
    S0 = Shard(0)
    nodes, strategies, compute, values = [], {}, {}, []
    for i in range(steps):
        nodes += [f"a{i}", f"b{i}"]
        strategies[f"a{i}"], compute[f"a{i}"] = [NodePlacement((), (S0,))], [1e-6]
        ins = 1 if i == 0 else 2
        strategies[f"b{i}"] = [NodePlacement((R,) * ins, (R,)), NodePlacement((S0,) * ins, (S0,))]
        compute[f"b{i}"] = [2e-5, 5e-5]
        values.append(_Value(f"a{i}", 0, 2**22, 2, True, [(f"b{i}", 0)]))
        if i:
            values.append(_Value(f"b{i - 1}", 0, 2**22, 2, True, [(f"b{i}", 1)]))

    def reshard(src, dst, nbytes, ndim):
        return cost_model.reshard_time_s(nbytes, *_layouts(src, dst), range(4), ndim)

    return PlacementProblem(nodes=nodes, strategies=strategies, compute_s=compute, values=values,
                            view_like=set(), reshard_s=reshard)


def test_a_tied_loop_pays_every_step(cost_model, monkeypatch):
    from galvatron_fx.search import placement_ilp

    pr = _unrolled(40, cost_model)
    assert len(set(placement_ilp.alike_nodes(pr).values())) < len(pr.nodes) / 2
    monkeypatch.setattr(placement_ilp, "TIE_ABOVE", 10**12)
    _, objective, n_vars = solve_placement(pr)
    monkeypatch.setattr(placement_ilp, "TIE_ABOVE", -1)
    choice, tied, tied_vars = solve_placement(pr)
    assert tied_vars < n_vars
    assert tied == pytest.approx(objective, rel=1e-9) == evaluate(pr, choice)[0]


def test_an_unrolled_loop_is_solved_with_its_steps_tied(monkeypatch):
    """A layer that unrolls a scan (Mamba's selective scan: a few ops per time step) is solved
    with each step's ops tied across steps: far fewer variables, the same optimum."""
    import hf_tiny
    import torch

    from galvatron_fx.search import placement_ilp
    from galvatron_fx.search.intra_layer import build_problem

    torch.manual_seed(0)
    model, batch = hf_tiny.build("mamba")
    mg = gfx.capture(model, (), example_kwargs=batch)
    layer = next(l for l in mg.blocks())
    dl = decompose_layer(mg, layer)
    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))
    pr, _ = build_problem(dl, 2, "megatron", cm, [0, 1])
    tie = placement_ilp.alike_nodes(pr)
    assert len(set(tie.values())) < 0.6 * len(pr.nodes)  # each step's ops are alike to the next's
    monkeypatch.setattr(placement_ilp, "TIE_ABOVE", 10**12)
    choice, objective, n_vars = solve_placement(pr)
    monkeypatch.setattr(placement_ilp, "TIE_ABOVE", -1)
    tied_choice, tied_objective, tied_vars = solve_placement(pr)
    assert tied_vars < 0.6 * n_vars
    assert tied_objective == pytest.approx(objective, rel=1e-6)
    assert evaluate(pr, tied_choice)[0] == pytest.approx(tied_objective, rel=1e-7)


@pytest.mark.parametrize("family", ["mamba", "llama", "t5"])
def test_nodes_with_one_strategy_key_have_one_strategy_list(family):
    """The ILP enumerates a node's strategies once per op on alike values (an unrolled loop's
    steps, a block's alike projections): every node of a key has exactly the strategies its own
    enumeration gives, at every tp."""
    import hf_tiny
    import torch

    from galvatron_fx.search.node_strategies import _mesh, node_strategies, strategy_key

    torch.manual_seed(0)
    model, batch = hf_tiny.build(family)
    mg = gfx.capture(model, (), example_kwargs=batch, probe=False)
    dl = decompose_layer(mg, mg.blocks()[-1])
    calls = [n for n in dl.gm.graph.nodes if n.op == "call_function"]
    keys = {n.name: strategy_key(n) for n in calls}
    groups: dict = {}
    for n in calls:
        if keys[n.name] is not None:
            groups.setdefault(keys[n.name], []).append(n)
    assert sum(len(g) for g in groups.values()) >= 0.9 * len(calls)  # nearly every node has a key
    if family == "mamba":
        assert len(groups) < 0.5 * len(calls)  # the steps share theirs
    for tp in (2, 4):
        mesh = _mesh(tp)
        for group in groups.values():
            first = node_strategies(group[0], mesh, tp)
            for n in group[1:]:
                assert node_strategies(n, mesh, tp) == first, (n.format_node(), group[0].format_node())


@pytest.mark.timing
def test_partial_gradients_through_views_keep_the_ilp_fast(cost_model):
    """T5's decoder block at tp 8 (12 heads: no head split, so many near-equal placements): a
    view handing a partial gradient on was a product of three variables whose weak relaxation
    left the solver 8–12 s of branching per problem; with each pass-through strategy split in
    two (:func:`placement_ilp._split_pass_through`) the same optimum takes well under a second."""
    import torch
    import transformers as T

    cfg = T.T5Config(d_model=768, d_ff=3072, num_layers=2, num_heads=12, decoder_start_token_id=0,
                     pad_token_id=0, use_cache=False)
    with torch.device("meta"):
        model = T.T5ForConditionalGeneration(cfg)
    model.train()
    ids = torch.zeros(1, 512, dtype=torch.long, device="meta")
    mg = gfx.capture(model, (), example_kwargs={"input_ids": ids, "labels": ids})
    layer = next(l for l in mg.blocks() if l.name == "decoder.block.0")
    opt = solve_intra_layer(mg, layer, 8, "none", cost_model, shard_params=True)  # the objective is checked
    assert opt.num_variables > 4000
    assert opt.solve_s < 3.0


@pytest.mark.parametrize("sp", ["none", "megatron"])
def test_every_kind_solved_at_once_gives_the_options_of_one_by_one(cost_model, monkeypatch, sp):
    """The option cache solves a (tp, sp) for every layer kind at once on several threads (the
    solver runs concurrently, the Python work in turn): the same options as solving each kind
    alone, for every layer, twins included."""
    import os

    from galvatron_fx.ir.strategy import SPMode
    from galvatron_fx.search.candidates import OptionCache

    model, inputs = zoo.build("t5-base", batch_size=2, seq_len=64, device="meta", overrides={"n_layers": 2})
    mg = gfx.capture(model, inputs)
    sp = SPMode(sp)

    def options(cores: int):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        cache = OptionCache(mg, cost_model)
        got = {layer.name: [(o.placements, o.objective_s) for o in cache.option_list(layer, 2, sp)]
               for layer in mg.layers}
        return got, cache.solves

    (alone, n_alone), (together, n_together) = options(1), options(2)
    assert together == alone
    assert n_together == n_alone and sum(1 for v in alone.values() if v) >= 3
