"""The batch probe at capture, the graph re-instantiated at a rank's share of the batch, and the
sharding rules of the ops mixture-of-experts and scans bring (no processes)."""

from __future__ import annotations

import hf_tiny
import torch

import galvatron_fx as gfx
from galvatron_fx.passes.decompose_layer import decompose_layer
from galvatron_fx.passes.localize_batch import local_problem, localized
from galvatron_fx.search.node_strategies import _mesh, node_strategies


def _captured(family: str, n: int = 4):
    model, batch = hf_tiny.build(family)
    return gfx.capture(model, (), example_kwargs=hf_tiny.head(batch, n))


def test_the_probe_records_how_sizes_follow_the_batch_and_the_graph_reinstantiates_at_half():
    mg = _captured("llama")
    s = mg.batch_scaling
    assert s is not None and (s.batch, s.probe_batch) == (4, 8) and not mg.coupled()
    assert s.ints and not s.irregular  # e.g. a view's B*T, the mask's batch
    half = localized(mg, 2)
    assert half is not None and half is localized(mg, 2) and half.example_shapes[0] == (2, hf_tiny.SEQ)
    by_name, half_by_name = mg.nodes_by_name(), half.nodes_by_name()
    for name, dims in s.dims.items():  # every size that follows the batch is halved, the others kept
        v, w = by_name[name].meta.get("val"), half_by_name[name].meta.get("val")
        if isinstance(v, torch.Tensor) and dims and dims[0]:
            assert all(w.shape[d] * 2 == v.shape[d] for d in dims[0]), (name, v.shape, w.shape)
            assert all(w.shape[d] == v.shape[d] for d in range(v.ndim) if d not in dims[0]), name
    # the blocks run locally on two ranks; the loss reduces over the samples
    assert local_problem(mg, mg.layers[1], 2) is None
    assert "reduces over samples" in local_problem(mg, mg.layers[-1], 2)
    assert local_problem(mg, mg.layers[1], 3) is not None  # 4 samples do not split over 3 ranks


def test_a_batch_of_one_is_probed_like_any_other():
    """At one sample HF's causal loss traces no copy of its shifted labels (the slice is already
    contiguous), at two it does, which shifts the names of later copies: the probe pairs the graphs
    op by op on paired inputs, seeing through the copy, so every size that follows the batch is
    still found (HF Mamba: before, one extra node made every node irregular)."""
    from galvatron_fx.passes.batch_probe import paired_nodes

    one, two = _captured("mamba", 1), _captured("mamba", 2)
    count = lambda mg: sum(n.target is torch.ops.aten.contiguous.default for n in mg.gm.graph.nodes)  # noqa: E731
    assert count(two) > count(one)
    s = one.batch_scaling
    assert s is not None and (s.batch, s.probe_batch) == (1, 2) and not s.irregular and s.dims
    # what follows the batch at one sample is what follows it at two (the same program's values)
    pairs = paired_nodes(one.gm, two.gm)
    assert len(pairs) == len(one.gm.graph.nodes)
    assert {pairs[n].name for n in one.gm.graph.nodes if n.name in one.batched} == \
        {m.name for m in pairs.values() if m.name in two.batched}


def test_pairing_sees_through_a_copy_only_one_graph_makes():
    from galvatron_fx.passes.batch_probe import paired_nodes

    def traced(copy: bool):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        y = g.call_function(torch.ops.aten.slice.Tensor, (x, 1, 1))
        if copy:
            y = g.call_function(torch.ops.aten.contiguous.default, (y,))
        z = g.call_function(torch.ops.aten.view.default, (y, [-1]))
        w = g.call_function(torch.ops.aten.view.default, (x, [-1]))  # a second view, of another value
        g.output((z, w))
        return torch.fx.GraphModule({}, g)

    a, b = traced(False), traced(True)
    pairs = {n.name: m.name for n, m in paired_nodes(a, b).items()}
    assert pairs == {"x": "x", "slice_tensor": "slice_tensor", "view_default": "view_default",
                     "view_default_1": "view_default_1", "output": "output"}
    back = {n.name: m.name for n, m in paired_nodes(b, a).items()}
    assert back["view_default"] == "view_default" and "contiguous_default" not in back  # the copy alone: no pair


def test_a_contrastive_loss_is_marked_as_coupling_samples():
    mg = _captured("clip")
    coupled = mg.coupled()
    assert "head" in coupled and "loss" in coupled, coupled  # the (B, B) similarities
    assert "couples samples" in local_problem(mg, mg.layer("head"), 2)


def test_scans_keep_no_shard_on_their_dim():
    class Scan(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 16)

        def forward(self, x):
            return torch.cumsum(self.a(x), dim=-1).pow(2).mean()

    mg = gfx.capture(Scan(), (torch.randn(4, 6, 8),))
    seen = 0
    for layer in mg.layers:
        for n in decompose_layer(mg, layer).gm.graph.nodes:
            if n.op == "call_function" and n.target is torch.ops.aten.cumsum.default:
                seen += 1
                shards = {p.dim for st in node_strategies(n, _mesh(2), 2) for p in st.inputs + st.outputs
                          if isinstance(p, torch.distributed.tensor.Shard)}
                assert 2 not in shards and shards, shards  # (torch's own rule kept a shard on dim -1)
    assert seen == 1


def test_grouped_matmul_has_column_and_row_parallel_rules():
    from torch.distributed.tensor import Partial, Replicate, Shard

    mg = _captured("mixtral")
    block = mg.blocks()[0]
    dl = decompose_layer(mg, block)
    grouped = [n for n in dl.gm.graph.nodes if n.op == "call_function" and "grouped_mm" in str(n.target)]
    assert grouped, "the experts run as a grouped matmul"
    st = {(s.inputs, s.outputs) for s in node_strategies(grouped[0], _mesh(2), 2)}
    r = Replicate()
    assert ((r, Shard(2), r), (Shard(1),)) in st  # weights split on their output columns
    assert ((Shard(1), Shard(1), r), (Partial(),)) in st  # on their input rows: a partial sum
    assert not any(isinstance(i, Shard) and i.dim == 0 for ins, _ in st for i in ins[:1])  # never the tokens


def test_a_mixture_of_experts_model_captured_for_another_device_is_costed():
    """On the meta device the router counts integer expert ids (the CPU histogram cannot): the
    layers are annotated and decomposed all the same."""
    cfg = hf_tiny.config("mixtral")
    with torch.device("meta"):
        model = hf_tiny.model_class("mixtral")(cfg)
    ids = torch.zeros(2, hf_tiny.SEQ, dtype=torch.long, device="meta")
    mg = gfx.capture(model, (), example_kwargs={"input_ids": ids, "labels": ids})
    block = mg.blocks()[0]
    assert block.costs.fwd_flops > 0 and block.costs.activation_bytes_full > 0
    assert any("histc" in str(n.target) for n in decompose_layer(mg, block).gm.graph.nodes)


def test_a_coupled_layer_runs_on_the_whole_batch_and_its_gathers_are_priced():
    """CLIP: the encoders run locally at dp 2, the similarities' layer gathers what it needs over
    dp, and the plan prices those gathers on the layer."""
    mg = _captured("clip")
    half = localized(mg, 2)
    assert half is not None
    assert local_problem(mg, mg.layer("text_model.encoder.layers.0"), 2) is None  # the blocks stay local
    plan = gfx.plan(mg, gfx.Cluster.local_cpu(2), global_batch_size=8, search={"tp": (1,), "pp": (1,)})
    head = next(lp for lp in plan.layers if lp.name == "head")
    gathers = [c for c in head.collectives if c["axis"] == "dp" and c["op"] == "all_gather"]
    assert head.dp == 2 and gathers, head.collectives
    assert plan.num_microbatches == 1
