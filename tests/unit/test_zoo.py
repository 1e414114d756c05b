"""Model zoo: published sizes on meta, tiny models train and export, numerics match Hugging Face."""

from __future__ import annotations

import math
import re
import time

import pytest
import torch
import torch.nn.functional as F

from galvatron_fx import zoo
from galvatron_fx.errors import ConfigError

TINY = ["bert-tiny", "gpt-tiny", "llama-tiny", "t5-tiny", "vit-tiny"]
TINY_SEQ = {"vit-tiny": 16}  # ViT: patches (a perfect square); others: tokens

# Published sizes: (params, relative tolerance). Sources: GPT-2 / GPT-3 papers, Llama 2 / 3
# model cards (HF exact counts), BERT paper (340M incl. NSP+pooler; the MLM model is 335M),
# T5 paper (220M), ViT paper (632M).
PUBLISHED = {
    "gpt2-small": (124e6, 0.01),
    "gpt2-xl": (1.558e9, 0.01),
    "gpt3-6.7b": (6.7e9, 0.02),
    "gpt3-175b": (175e9, 0.02),
    "llama2-7b": (6.74e9, 0.01),
    "llama2-70b": (68.98e9, 0.01),
    "llama3-8b": (8.03e9, 0.01),
    "bert-large": (340e6, 0.02),
    "t5-base": (220e6, 0.02),
    "vit-huge": (632e6, 0.01),
}


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _tiny(name: str, device: str = "cpu", **kw):
    return zoo.build(name, batch_size=2, seq_len=TINY_SEQ.get(name, 32), device=device, **kw)


# ------------------------------------------------------------------------------------------
# Registry and sizes
# ------------------------------------------------------------------------------------------


def test_names_are_sorted_and_complete():
    assert zoo.names() == sorted(zoo.names())
    assert set(PUBLISHED) | set(TINY) == set(zoo.names())


@pytest.mark.timing
@pytest.mark.parametrize("name", sorted(PUBLISHED) + TINY)
def test_meta_build_matches_analytic_count(name):
    t0 = time.perf_counter()
    model, inputs = zoo.build(name, batch_size=2, seq_len=None, device="meta")
    build_s = time.perf_counter() - t0
    assert all(p.is_meta for p in model.parameters())
    assert all(t.is_meta for t in inputs)
    assert _count(model) == zoo.num_params(name)
    assert build_s < 5.0, f"{name} took {build_s:.2f}s to build on meta"
    if name in PUBLISHED:
        published, rtol = PUBLISHED[name]
        assert zoo.num_params(name) == pytest.approx(published, rel=rtol)


def test_exact_reference_counts():
    # Hugging Face's exact counts for the same architectures.
    assert zoo.num_params("llama2-7b") == 6_738_415_616
    assert zoo.num_params("llama2-70b") == 68_976_648_192
    assert zoo.num_params("llama3-8b") == 8_030_261_248
    assert zoo.num_params("gpt2-small") == 124_439_808  # GPT2LMHeadModel, tied head
    assert zoo.num_params("t5-base") == 222_903_552
    assert zoo.num_params("bert-large") == 335_174_458  # BertForMaskedLM


def test_gqa_shapes_llama2_70b():
    model, _ = zoo.build("llama2-70b", batch_size=1, seq_len=16, device="meta")
    attn = model.blocks[0].attn
    assert attn.head_dim == 128
    assert attn.q_proj.out_features == 64 * 128
    assert attn.k_proj.out_features == 8 * 128
    assert attn.v_proj.out_features == 8 * 128
    assert len(model.blocks) == 80
    assert model.rope_cos.shape == (4096, 128)


def test_tied_and_untied_heads():
    gpt, _ = _tiny("gpt-tiny", device="meta")
    assert gpt.lm_head.weight is gpt.tok_emb.weight
    untied, _ = _tiny("gpt-tiny", device="meta", overrides={"tie_embeddings": False})
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert _count(untied) - _count(gpt) == 512 * 128
    llama, _ = _tiny("llama-tiny", device="meta")
    assert llama.lm_head.weight is not llama.embed.weight


def test_blocks_are_structurally_identical():
    def sig(block):
        return [(n, tuple(p.shape)) for n, p in block.named_parameters()]

    for name in TINY:
        model, _ = _tiny(name, device="meta")
        stacks = [model.encoder, model.decoder] if name == "t5-tiny" else [model]
        for stack in stacks:
            sigs = [sig(b) for b in stack.blocks]
            assert len(sigs) == 4 and all(s == sigs[0] for s in sigs), name


# ------------------------------------------------------------------------------------------
# Errors, overrides, inputs
# ------------------------------------------------------------------------------------------


def test_unknown_name_lists_known_ones():
    with pytest.raises(ConfigError, match="gpt-tiny.*llama2-7b"):
        zoo.build("gpt-5", batch_size=1, seq_len=8)


def test_seq_len_above_positions_is_config_error():
    with pytest.raises(ConfigError, match="max_seq_len"):
        zoo.build("gpt2-small", batch_size=1, seq_len=1025, device="meta")
    with pytest.raises(ConfigError, match="max_seq_len"):
        zoo.build("bert-large", batch_size=1, seq_len=513, device="meta")
    with pytest.raises(ConfigError, match="patches"):
        zoo.build("vit-huge", batch_size=1, seq_len=257, device="meta")
    with pytest.raises(ConfigError, match="perfect square"):
        zoo.build("vit-huge", batch_size=1, seq_len=200, device="meta")


def test_bad_override_and_bad_config_are_config_errors():
    with pytest.raises(ConfigError, match="n_layer.*fields are"):
        zoo.config("gpt-tiny", overrides={"n_layer": 2})
    with pytest.raises(ConfigError, match="divisible"):
        zoo.build("gpt-tiny", batch_size=1, seq_len=8, overrides={"n_heads": 3})
    with pytest.raises(ConfigError, match="n_kv_heads"):
        zoo.config("llama-tiny", overrides={"n_kv_heads": 3})


def test_overrides_change_the_model():
    model, _ = zoo.build("gpt-tiny", batch_size=1, seq_len=8, overrides={"n_layers": 2})
    assert len(model.blocks) == 2
    assert _count(model) == zoo.num_params("gpt-tiny", overrides={"n_layers": 2})
    assert zoo.config("gpt-tiny").n_layers == 4  # the registry is not mutated


def test_example_inputs_shapes():
    _, (idx, tgt) = zoo.build("gpt-tiny", batch_size=3, seq_len=10)
    assert idx.shape == tgt.shape == (3, 10) and idx.dtype == torch.long
    assert torch.equal(idx[:, 1:], tgt[:, :-1])  # next-token targets
    _, (ids, dec, labels) = zoo.build("t5-tiny", batch_size=2, seq_len=12)
    assert ids.shape == dec.shape == labels.shape == (2, 12)
    assert torch.equal(dec[:, 1:], labels[:, :-1]) and (dec[:, 0] == 0).all()
    _, (ids, types, labels) = zoo.build("bert-tiny", batch_size=2, seq_len=20)
    assert ((labels != -100).sum(1) == 3).all()  # round(0.15 * 20)
    assert types[0].tolist() == [0] * 10 + [1] * 10
    _, (pixels, y) = zoo.build("vit-huge", batch_size=1, seq_len=64, device="meta")
    assert pixels.shape == (1, 3, 8 * 14, 8 * 14) and y.shape == (1,)
    _, (pixels, _) = zoo.build("vit-tiny", batch_size=1, seq_len=None, device="meta")
    assert pixels.shape == (1, 3, 32, 32)


def test_build_is_deterministic_in_seed():
    m0, in0 = _tiny("llama-tiny", seed=0)
    m0b, in0b = _tiny("llama-tiny", seed=0)
    m1, in1 = _tiny("llama-tiny", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(m0.parameters(), m0b.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(in0, in0b))
    assert not torch.equal(m0.embed.weight, m1.embed.weight)
    assert m0.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(m0.norm.weight, torch.ones(128))


def test_dtype_casts_params_not_token_ids():
    model, (idx, tgt) = _tiny("gpt-tiny", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert idx.dtype == torch.long
    loss = model(idx, tgt)
    assert loss.dtype == torch.bfloat16 and math.isfinite(loss.item())


# ------------------------------------------------------------------------------------------
# Training step and export
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_tiny_forward_backward(name):
    model, inputs = _tiny(name)
    loss = model(*inputs)
    assert loss.ndim == 0 and math.isfinite(loss.item())
    # Random init: the loss is close to uniform guessing over the vocab / classes.
    n_out = zoo.config(name).num_classes if name == "vit-tiny" else zoo.config(name).vocab_size
    assert loss.item() == pytest.approx(math.log(n_out), rel=0.15)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name", TINY)
def test_tiny_exports(name, device):
    model, inputs = _tiny(name, device=device)
    ep = torch.export.export(model, inputs, strict=False)
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    sdpa = [n for n in calls if n.target == torch.ops.aten.scaled_dot_product_attention.default]
    assert len(sdpa) == (12 if name == "t5-tiny" else 4)
    (out,) = ep.graph.find_nodes(op="output")[0].args[0]
    assert out.meta["val"].shape == ()
    if device == "cpu":
        torch.testing.assert_close(ep.module()(*inputs), model(*inputs))


# ------------------------------------------------------------------------------------------
# Numerics against Hugging Face (weights copied over)
# ------------------------------------------------------------------------------------------


def _load_renamed(model, hf_state, rules, transform=None):
    """Copy ``hf_state`` into ``model`` renaming keys with ``rules``; every param must be hit."""
    ours = dict(model.named_parameters())
    hit = set()
    with torch.no_grad():
        for key, value in hf_state.items():
            new = key
            for pat, rep in rules:
                new = re.sub(pat, rep, new)
            if new not in ours:
                continue
            if transform is not None:
                value = transform(new, value)
            ours[new].copy_(value)
            hit.add(new)
    assert hit == set(ours), sorted(set(ours) - hit)


def test_llama_matches_hugging_face():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        )
    ).eval()
    model, (idx, tgt) = zoo.build("llama-tiny", batch_size=2, seq_len=48)
    rules = [
        (r"^model\.embed_tokens", "embed"), (r"^model\.layers", "blocks"),
        (r"\.self_attn\.", ".attn."), (r"input_layernorm", "attn_norm"),
        (r"post_attention_layernorm", "mlp_norm"), (r"^model\.norm", "norm"),
    ]
    _load_renamed(model, hf.state_dict(), rules)
    with torch.no_grad():
        logits = hf(input_ids=idx, use_cache=False).logits
        expected = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        torch.testing.assert_close(model(idx, tgt), expected, rtol=1e-5, atol=1e-5)


def test_gpt_matches_hugging_face_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=512, n_positions=256, n_embd=128, n_layer=4, n_head=4,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
    ).eval()
    model, (idx, tgt) = zoo.build("gpt-tiny", batch_size=2, seq_len=48)
    rules = [
        (r"^transformer\.wte", "tok_emb"), (r"^transformer\.wpe", "pos_emb"),
        (r"^transformer\.h", "blocks"), (r"^transformer\.ln_f", "ln_f"),
        (r"attn\.c_attn", "attn.qkv"), (r"attn\.c_proj", "attn.proj"),
        (r"mlp\.c_fc", "mlp.fc"), (r"mlp\.c_proj", "mlp.proj"),
    ]

    def transform(name, value):
        if name.startswith("blocks.") and value.ndim == 2:
            value = value.t()  # HF Conv1D stores (in, out)
        if ".qkv." in name:  # output features: HF (3, H, hd) -> ours heads-major (H, 3, hd)
            value = value.reshape(3, 4, 32, -1).transpose(0, 1).reshape(value.shape)
        return value

    _load_renamed(model, hf.state_dict(), rules, transform)
    with torch.no_grad():
        logits = hf(input_ids=idx, use_cache=False).logits
        expected = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        torch.testing.assert_close(model(idx, tgt), expected, rtol=1e-5, atol=1e-5)


def test_t5_matches_hugging_face():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=512, d_model=128, d_kv=32, d_ff=512, num_layers=4, num_decoder_layers=4,
            num_heads=4, dropout_rate=0.0, feed_forward_proj="relu", tie_word_embeddings=True,
            decoder_start_token_id=0,
        )
    ).eval()
    model, (ids, dec, labels) = zoo.build("t5-tiny", batch_size=2, seq_len=40)
    rules = [
        (r"\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias", ".rel_bias"),
        (r"\.block\.", ".blocks."),
        (r"layer\.0\.SelfAttention", "attn"), (r"layer\.0\.layer_norm", "attn_norm"),
        (r"encoder\.blocks\.(\d+)\.layer\.1\.DenseReluDense", r"encoder.blocks.\1.ff"),
        (r"encoder\.blocks\.(\d+)\.layer\.1\.layer_norm", r"encoder.blocks.\1.ff_norm"),
        (r"layer\.1\.EncDecAttention", "cross_attn"), (r"layer\.1\.layer_norm", "cross_norm"),
        (r"layer\.2\.DenseReluDense", "ff"), (r"layer\.2\.layer_norm", "ff_norm"),
        (r"final_layer_norm", "final_norm"),
    ]
    _load_renamed(model, hf.state_dict(), rules)
    with torch.no_grad():
        expected = hf(input_ids=ids, decoder_input_ids=dec, labels=labels, use_cache=False).loss
        torch.testing.assert_close(model(ids, dec, labels), expected, rtol=1e-5, atol=1e-5)
