"""Capture traces a run of alike blocks once and stamps out the others
(:mod:`galvatron_fx.passes.repeat_blocks`): the graph is the whole export's, op for op, and any
block that is not a plain repeat of the one before keeps the whole export."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

import galvatron_fx as gfx
from galvatron_fx.passes import repeat_blocks

hf_tiny = pytest.importorskip("hf_tiny")


def _program(mg) -> list[tuple]:
    """The graph as (op, target, wiring, module path) per node, free of node names."""
    nodes = list(mg.gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out = []
    for n in nodes:
        args = tree_map(lambda a: ("node", index[a]) if isinstance(a, torch.fx.Node) else a, (n.args, n.kwargs))
        paths = [p for p, _ in (n.meta.get("nn_module_stack") or {}).values()]
        val = n.meta.get("val")
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        out.append((n.op, "" if n.op == "placeholder" else str(n.target), repr(args), paths[-1] if paths else None,
                    shape))
    return out


def _scaling(mg) -> tuple:
    """What the batch probe found, free of node names (in graph order)."""
    bs, order = mg.batch_scaling, [n.name for n in mg.gm.graph.nodes]
    return ([(i, bs.ints.get(x), bs.dims.get(x), x in bs.irregular, x in mg.batched) for i, x in enumerate(order)],
            bs.batch, bs.probe_batch)


def _both(model, args=(), kwargs=None, monkeypatch=None):
    """(capture folded, capture of the whole export) of ``model``."""
    folded = gfx.capture(model, args, example_kwargs=kwargs, annotate=False)
    monkeypatch.setattr(repeat_blocks, "MIN_BLOCKS", 10**9)
    whole = gfx.capture(model, args, example_kwargs=kwargs, annotate=False)
    monkeypatch.undo()
    return folded, whole


class Block(nn.Module):
    def __init__(self, d: int, index: int, scale_by_index: bool = False):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.layer_idx = index  # an index attribute: blocks stay alike
        self.scale_by_index = scale_by_index

    def forward(self, x, bias):
        y = torch.tanh(self.fc(self.norm(x))) + bias
        if self.scale_by_index:  # behaviour that depends on the position: no longer a repeat
            y = y * (self.layer_idx + 1)
        return x + y


class Stack(nn.Module):
    def __init__(self, n: int = 6, d: int = 8, *, side_by_side: bool = False, scale_by_index: bool = False):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d, i, scale_by_index) for i in range(n))
        self.out = nn.Linear(d, 1)
        self.side_by_side = side_by_side

    def forward(self, x):
        h = self.inp(x)
        bias = h.mean(-1, keepdim=True)  # made before the blocks, read by every one
        if self.side_by_side:
            h = torch.stack([b(h, bias) for b in self.blocks]).sum(0)
        else:
            for b in self.blocks:
                h = b(h, bias)
        return self.out(h).square().mean()


def test_alike_blocks_are_traced_once_and_stamped_to_the_whole_export(monkeypatch, caplog):
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(4, 8)
    assert repeat_blocks.repeated_lists(model) == [("blocks", 6)]
    with caplog.at_level(logging.INFO, logger="galvatron_fx"):
        folded, whole = _both(model, (x,), monkeypatch=monkeypatch)
    assert "stamped out" in caplog.text
    assert _program(folded) == _program(whole)
    assert list(folded.params) == list(whole.params)
    assert [p.node for p in folded.params.values()] == [p.node for p in whole.params.values()]
    assert [l.name for l in folded.layers] == [l.name for l in whole.layers]
    # the batch probe traced one block and marked every later one as the block it copies
    assert "two blocks per list" not in caplog.text
    assert folded.batched == whole.batched and _scaling(folded) == _scaling(whole)
    # the stamped graph computes the model's loss on its real weights
    weights = dict(model.named_parameters())
    feed = [weights[fqn] for fqn in (next(p.name for p in folded.params.values() if p.node == n.name)
                                     for n in folded.gm.graph.nodes if n.op == "placeholder" and n.name != "x")]
    loss = folded.gm(*feed, x)
    assert torch.allclose(loss[0] if isinstance(loss, (tuple, list)) else loss, model(x), rtol=1e-6)


class Latent(Stack):
    """Blocks run on a learned state of one row that the first block makes batched (its output
    adds a per-sample bias): at a batch of one, block 0's input and block 1's have one shape."""

    def __init__(self, d: int = 8):
        super().__init__(d=d)
        self.latent = nn.Parameter(torch.randn(1, d))

    def forward(self, x):
        h, bias = self.latent, self.inp(x).mean(-1, keepdim=True)
        for b in self.blocks:
            h = b(h, bias)
        return self.out(h).square().mean()


def test_a_probe_where_block_0_reads_otherwise_than_block_1_traces_two_blocks(monkeypatch, caplog):
    """At the probe's batch block 0 reads the state of one row where block 1 reads a batched one:
    marking block 1 as block 0 would be wrong, so the probe traces two blocks, and finds what the
    whole export's probe finds."""
    torch.manual_seed(0)
    model, x = Latent(), torch.randn(1, 8)
    with caplog.at_level(logging.INFO, logger="galvatron_fx"):
        folded, whole = _both(model, (x,), monkeypatch=monkeypatch)
    assert "stamped out" in caplog.text and "two blocks per list" in caplog.text, caplog.text
    assert _program(folded) == _program(whole)
    assert folded.batched == whole.batched and _scaling(folded) == _scaling(whole)
    # one block would have marked block 1's values as block 0's: not batched
    first = next(n for n in folded.gm.graph.nodes if (n.meta.get(repeat_blocks.STAMPED_FROM) or (0, 0))[1] == 1
                 and n.op == "call_function" and n.name in folded.batched)
    assert first.meta[repeat_blocks.STAMPED_FROM][0] not in folded.batched


@pytest.mark.parametrize("case", ["side_by_side", "scale_by_index"])
def test_blocks_that_are_no_plain_repeat_keep_the_whole_export(case, monkeypatch, caplog):
    model, x = Stack(**{case: True}), torch.randn(4, 8)
    with caplog.at_level(logging.INFO, logger="galvatron_fx"):
        folded, whole = _both(model, (x,), monkeypatch=monkeypatch)
    reason = {"side_by_side": "no chain", "scale_by_index": "takes 2 where"}[case]
    assert "exporting every block" in caplog.text and reason in caplog.text, caplog.text
    assert _program(folded) == _program(whole)


def test_blocks_differing_in_a_plain_attribute_are_not_alike():
    model = Stack()
    model.blocks[3].scale_by_index = True  # one block configured otherwise (a sliding-window layer)
    assert repeat_blocks.repeated_lists(model) == []
    shared = Stack()
    shared.blocks[2].fc = shared.blocks[1].fc  # blocks sharing weights
    assert repeat_blocks.repeated_lists(shared) == []


@pytest.mark.parametrize("family", ["mamba", "llama", "clip"])
def test_hf_blocks_are_stamped_to_the_whole_export(family, monkeypatch, caplog):
    """(CLIP: two lists, the text model's stamped first though the vision model runs first: the
    second stamp renames the text nodes after its copies, and the marks follow the names.)"""
    cfg = hf_tiny.config(family)
    for c in (cfg.text_config, cfg.vision_config) if family == "clip" else (cfg,):
        c.num_hidden_layers = 4
    torch.manual_seed(0)
    model, batch = hf_tiny.model_class(family)(cfg).train(), hf_tiny.batch(family, 4, seed=1)
    with caplog.at_level(logging.INFO, logger="galvatron_fx"):
        folded, whole = _both(model, (), batch, monkeypatch=monkeypatch)
    assert "stamped out" in caplog.text
    assert _program(folded) == _program(whole)
    assert list(folded.params) == list(whole.params) and folded.batched == whole.batched
    assert _scaling(folded) == _scaling(whole) and "two blocks per list" not in caplog.text


def test_a_refused_fold_leaves_the_model_as_it_was(monkeypatch, caplog):
    """Qwen2-MoE collects every block's router logits for its auxiliary loss (through hooks
    Hugging Face installs at the first forward): the fold is refused, and the two-block export
    tried first leaves no hook or mark behind, so the whole export and later eager calls see all
    four blocks."""
    cfg = hf_tiny.config("qwen2moe", num_hidden_layers=4)
    torch.manual_seed(0)
    model, batch = hf_tiny.model_class("qwen2moe")(cfg).train(), hf_tiny.batch("qwen2moe", 4, seed=1)
    fresh = hf_tiny.model_class("qwen2moe")(cfg).train()
    fresh.load_state_dict(model.state_dict())
    with caplog.at_level(logging.INFO, logger="galvatron_fx"):
        folded, whole = _both(model, (), batch, monkeypatch=monkeypatch)
    assert "exporting every block" in caplog.text
    assert _program(folded) == _program(whole)
    with torch.no_grad():
        assert torch.equal(model(**batch).loss, fresh(**batch).loss)
