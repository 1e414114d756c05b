"""capture(): layer segmentation, kind hashes, errors, meta/fake/dynamic models, HF models."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.errors import UnsupportedModelError
from galvatron_fx.ir import LayerRole
from galvatron_fx.passes.annotate_costs import annotate_costs_pass
from galvatron_fx.passes.runner import PassContext, PassOrderError, run_pass

TINY = ["gpt-tiny", "llama-tiny", "bert-tiny", "vit-tiny"]


def roles(mg) -> list[str]:
    return [str(l.role) for l in mg.layers]


@pytest.mark.parametrize("name", TINY)
def test_zoo_segmentation_finds_identical_blocks(name):
    model, inputs = zoo.build(name, batch_size=2, seq_len=16)
    n_layers = zoo.config(name).n_layers
    mg = gfx.capture(model, inputs, annotate=False)
    blocks = mg.blocks()
    assert len(blocks) == n_layers
    assert len({b.kind for b in blocks}) == 1, "identical blocks must share one kind"
    assert roles(mg) == ["embedding"] + ["block"] * n_layers + ["head", "loss"]
    assert mg.layers[0].kind != blocks[0].kind != mg.layers[-2].kind
    # every call node belongs to exactly one layer
    assigned = [n for l in mg.layers for n in l.node_names]
    calls = [n.name for n in mg.gm.graph.nodes if n.op not in ("placeholder", "output")]
    assert sorted(assigned) == sorted(calls)


def test_t5_encoder_and_decoder_blocks_are_two_kinds():
    model, inputs = zoo.build("t5-tiny", batch_size=2, seq_len=16)
    mg = gfx.capture(model, inputs, annotate=False)
    enc = [l for l in mg.blocks() if l.name.startswith("encoder.")]
    dec = [l for l in mg.blocks() if l.name.startswith("decoder.")]
    cfg = zoo.config("t5-tiny")
    assert len(enc) == cfg.n_layers and len(dec) == (cfg.n_decoder_layers or cfg.n_layers)
    assert len({l.kind for l in enc}) == 1 and len({l.kind for l in dec}) == 1
    assert enc[0].kind != dec[0].kind
    assert mg.layers[0].role == LayerRole.EMBEDDING
    assert [str(l.role) for l in mg.layers[-2:]] == ["head", "loss"]


@pytest.mark.parametrize("name,n", [("gpt2-small", 12), ("llama2-7b", 32), ("t5-base", 24)])
def test_real_size_models_segment_on_meta(name, n):
    model, inputs = zoo.build(name, batch_size=1, seq_len=128, device="meta")
    mg = gfx.capture(model, inputs, annotate=False)
    assert len(mg.blocks()) == n
    assert mg.num_params == sum(p.numel() for p in model.parameters())


# ---- kind hashes: structure and shapes, never names ------------------------------------------

class _Block(nn.Module):
    def __init__(self, d: int, hidden: int, names: tuple[str, str, str]):
        super().__init__()
        self._names = names
        setattr(self, names[0], nn.LayerNorm(d))
        setattr(self, names[1], nn.Linear(d, hidden))
        setattr(self, names[2], nn.Linear(hidden, d))

    def forward(self, x):
        norm, up, down = (getattr(self, n) for n in self._names)
        return x + down(F.gelu(up(norm(x))))


class _Net(nn.Module):
    def __init__(self, names=("ln", "fc1", "fc2"), stack="blocks", hidden=(64, 64, 64), d=16):
        super().__init__()
        self.emb = nn.Embedding(50, d)
        self._stack = stack
        setattr(self, stack, nn.ModuleList(_Block(d, h, names) for h in hidden))
        self.out = nn.Linear(d, 50)

    def forward(self, idx, tgt):
        x = self.emb(idx)
        for b in getattr(self, self._stack):
            x = b(x)
        return F.cross_entropy(self.out(x).flatten(0, 1), tgt.flatten())


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 50, (2, 8), generator=g)


def test_kind_hash_ignores_names_and_sees_shapes():
    a = gfx.capture(_Net(), _inputs(), annotate=False)
    b = gfx.capture(_Net(names=("norm", "up", "down"), stack="layers"), _inputs(), annotate=False)
    assert [l.kind for l in a.layers] == [l.kind for l in b.layers]
    assert [l.name for l in b.blocks()] == ["layers.0", "layers.1", "layers.2"]
    c = gfx.capture(_Net(hidden=(64, 96, 64)), _inputs(), annotate=False)
    kinds = [l.kind for l in c.blocks()]
    assert kinds[0] == kinds[2] != kinds[1], "a block with a different MLP width is another kind"


def test_loss_fn_wrapper_keeps_parameter_names():
    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _Net()

        def forward(self, idx):
            x = self.net.emb(idx)
            for b in self.net.blocks:
                x = b(x)
            return self.net.out(x)

    idx, tgt = _inputs()
    mg = gfx.capture(Logits(), (idx, tgt), loss_fn=lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten()))
    assert "net.emb.weight" in mg.params
    assert [l.name for l in mg.blocks()] == ["net.blocks.0", "net.blocks.1", "net.blocks.2"]
    assert roles(mg)[-2:] == ["head", "loss"]


def test_tied_embedding_is_shared_by_embedding_and_head():
    model, inputs = zoo.build("gpt-tiny", batch_size=2, seq_len=16)
    mg = gfx.capture(model, inputs, annotate=False)
    tied = [p for p in mg.params.values() if len(p.layers) > 1]
    assert len(tied) == 1 and set(tied[0].layers) == {"embedding", "head"}
    assert mg.num_params == sum(p.numel() for p in model.parameters())
    # per-layer counts charge the tied weight once (to the embedding), never buffers
    assert sum(l.costs.num_params for l in gfx.capture(model, inputs).layers) == mg.num_params
    llama = gfx.capture(*zoo.build("llama-tiny", batch_size=2, seq_len=16))
    assert sum(l.costs.num_params for l in llama.layers) == llama.num_params
    assert any(p.is_buffer for p in llama.params.values())


# ---- meta, fake and dynamic models -----------------------------------------------------------

def test_meta_fake_and_real_models_give_equal_costs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = gfx.capture(*zoo.build("llama-tiny", batch_size=2, seq_len=32))
    meta = gfx.capture(*zoo.build("llama-tiny", batch_size=2, seq_len=32, device="meta"))
    with FakeTensorMode():
        fake = gfx.capture(*zoo.build("llama-tiny", batch_size=2, seq_len=32))
    for a, b, c in zip(real.layers, meta.layers, fake.layers):
        assert a.kind == b.kind == c.kind
        assert a.costs == b.costs == c.costs


def test_dynamic_batch_and_sequence():
    model, inputs = zoo.build("gpt-tiny", batch_size=2, seq_len=32)
    dyn = gfx.capture(model, inputs, dynamic=True)
    idx = next(n for n in dyn.gm.graph.nodes if n.op == "placeholder" and n.name in dyn.input_names)
    assert all(isinstance(s, torch.SymInt) for s in idx.meta["val"].shape)
    static = gfx.capture(model, inputs)
    assert [l.kind for l in dyn.layers] != [l.kind for l in static.layers]  # symbols, not sizes
    assert [l.costs for l in dyn.blocks()] == [l.costs for l in static.blocks()]
    assert dyn.total_costs().fwd_flops == static.total_costs().fwd_flops


@pytest.mark.parametrize("name", [n if n.endswith("tiny") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in zoo.names()])
def test_dynamic_capture_of_every_zoo_model(name, caplog):
    """Symbolic batch for every zoo model (published widths on the meta device, two blocks: the
    shapes a dim is bound by do not depend on depth); a sequence the model bounds (a rotary
    table) takes torch's suggested bound, and the capture says so."""
    tiny = name.endswith("tiny")
    published = {"device": "meta", "overrides": {"n_layers": 2}}
    model, inputs = zoo.build(name, batch_size=2, seq_len=16, **({} if tiny else published))
    mg = gfx.capture(model, inputs, dynamic=True, annotate=tiny)
    first = next(n for n in mg.gm.graph.nodes if n.op == "placeholder" and n.name == mg.input_names[0])
    assert isinstance(first.meta["val"].shape[0], torch.SymInt)
    if name == "llama-tiny":
        assert "constrains its dims" in caplog.text and "max=256" in caplog.text


def test_dynamic_capture_of_hugging_face_models():
    hf_tiny = pytest.importorskip("hf_tiny")
    pytest.importorskip("transformers")
    for family in ("gpt2", "llama", "vit"):
        model, batch = hf_tiny.build(family)
        mg = gfx.capture(model, (), example_kwargs=batch, dynamic=True)
        first = next(n for n in mg.gm.graph.nodes if n.op == "placeholder" and n.name == mg.input_names[0])
        assert isinstance(first.meta["val"].shape[0], torch.SymInt), family
        assert len(mg.blocks()) == 2


# ---- errors and contracts --------------------------------------------------------------------

class _Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: cannot be captured
            return x * 2
        return x


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gate = _Gate()

    def forward(self, x):
        return self.gate(self.lin(x)).sum()


def test_untraceable_model_error_names_module_and_advice():
    with pytest.raises(UnsupportedModelError) as ei:
        gfx.capture(_Branchy(), (torch.randn(2, 4),))
    msg = str(ei.value)
    assert "'gate'" in msg and "_Gate" in msg
    assert "torch.where" in msg or "torch.cond" in msg


def test_capture_rejects_non_module():
    with pytest.raises(gfx.CaptureError, match="nn.Module"):
        gfx.capture(lambda x: x, (torch.ones(1),))


def test_pass_contract_is_checked():
    mg = gfx.capture(_Net(), _inputs(), annotate=False)
    with pytest.raises(PassOrderError, match="layers"):
        run_pass(annotate_costs_pass, mg.gm, PassContext(graph=mg))


def test_dump_dir_writes_graph_before_and_after(tmp_path):
    gfx.capture(_Net(), _inputs(), dump_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00_segment_layers_pass_before.txt", "00_segment_layers_pass_after.txt",
                     "01_annotate_costs_pass_before.txt", "01_annotate_costs_pass_after.txt"] or len(names) == 4
    assert "layer=blocks.0" in (tmp_path / "00_segment_layers_pass_after.txt").read_text()


# ---- Hugging Face models ---------------------------------------------------------------------

def test_hf_gpt2_and_llama_segment_into_blocks():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    idx = torch.randint(0, 128, (2, 16))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False,
        bos_token_id=0, eos_token_id=0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=128, use_cache=False, bos_token_id=0, eos_token_id=0))
    for model, prefix in ((gpt2, "transformer.h."), (llama, "model.layers.")):
        mg = gfx.capture(model, (idx,), example_kwargs={"labels": idx, "use_cache": False})
        assert [l.name for l in mg.blocks()] == [f"{prefix}{i}" for i in range(3)]
        assert len({l.kind for l in mg.blocks()}) == 1
        assert roles(mg) == ["embedding", "block", "block", "block", "head", "loss"]
        assert mg.num_params == sum(p.numel() for p in model.parameters())
        assert all(l.costs.fwd_flops > 0 for l in mg.blocks())
