"""Tiny Hugging Face models built from configs (no downloads) for the tests, and their batches.

``build(family)`` returns ``(model, batch)``: ``batch`` maps the model's argument names to tensors
(labels included, so that the model computes its own loss), as a Hugging Face training loop
passes them. Families cover the attention, MLP and norm code the runtime must handle: GPT-2
(Conv1D, learned positions), Llama and Qwen2 (RMSNorm, rotary, GQA; Qwen2 with q/k/v biases),
BERT (masked LM, token types), T5 (encoder-decoder, learned relative bias, labels shifted
inside), ViT (patches, image classification), GPT-NeoX (fused QKV, parallel residual), Phi
(partial rotary, parallel attention/MLP) and OPT (learned offset positions, pre-LN).
"""

from __future__ import annotations

import torch
import transformers  # noqa: F401 (before galvatron_fx: its backend then ignores HF's warning_once)

FAMILIES = ("gpt2", "llama", "bert", "t5", "vit", "qwen2", "gptneox", "phi", "opt")
VOCAB = 128
SEQ = 16


def config(family: str, **overrides):
    import transformers as T

    common = dict(use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "gpt2":
        return T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, **common, **overrides)
    if family in ("llama", "qwen2"):
        cls = T.LlamaConfig if family == "llama" else T.Qwen2Config
        return cls(**{**dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=VOCAB, **common), **overrides})
    if family == "bert":
        return T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                            vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            max_position_embeddings=64, pad_token_id=0, **overrides)
    if family == "t5":
        return T.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                          num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, use_cache=False, pad_token_id=0,
                          eos_token_id=1, **overrides)
    if family == "vit":  # 12x12 images of 4x4 patches: 9 patches + [CLS] = 10 tokens (even: sequence-parallel)
        return T.ViTConfig(image_size=12, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128, num_labels=10, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, **overrides)
    if family == "gptneox":
        return T.GPTNeoXConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                               vocab_size=VOCAB, attention_dropout=0.0, hidden_dropout=0.0, **common, **overrides)
    if family == "phi":
        return T.PhiConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                           vocab_size=VOCAB, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, **common,
                           **overrides)
    if family == "opt":
        return T.OPTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=128, vocab_size=VOCAB,
                           max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, word_embed_proj_dim=64,
                           **common, **overrides)
    raise KeyError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")


def model_class(family: str):
    import transformers as T

    return {"gpt2": T.GPT2LMHeadModel, "llama": T.LlamaForCausalLM, "bert": T.BertForMaskedLM,
            "t5": T.T5ForConditionalGeneration, "vit": T.ViTForImageClassification, "qwen2": T.Qwen2ForCausalLM,
            "gptneox": T.GPTNeoXForCausalLM, "phi": T.PhiForCausalLM, "opt": T.OPTForCausalLM}[family]


def build(family: str, seed: int = 0, **overrides):
    """The model (fp32, train mode, seeded init) and one batch of 4 samples."""
    torch.manual_seed(seed)
    model = model_class(family)(config(family, **overrides))
    model.train()
    return model, batch(family, 4, seed=1)


def batch(family: str, n: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """``n`` samples as the model's keyword arguments, labels included."""
    g = torch.Generator().manual_seed(seed)
    if family == "vit":
        return {"pixel_values": torch.randn(n, 3, 12, 12, generator=g), "labels": torch.randint(0, 10, (n,), generator=g)}
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    if family == "t5":
        return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (n, SEQ), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}
