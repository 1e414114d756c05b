"""Tiny Hugging Face models built from configs (no downloads) for the tests, and their batches.

``build(family)`` returns ``(model, batch)``: ``batch`` maps the model's argument names to tensors
(labels included, so that the model computes its own loss), as a Hugging Face training loop
passes them. Families cover the attention, MLP and norm code the runtime must handle: GPT-2
(Conv1D, learned positions), Llama and Qwen2 (RMSNorm, rotary, GQA; Qwen2 with q/k/v biases),
BERT (masked LM, token types), T5 (encoder-decoder, learned relative bias, labels shifted
inside), ViT (patches, image classification), GPT-NeoX (fused QKV, parallel residual), Phi
(partial rotary, parallel attention/MLP) and OPT (learned offset positions, pre-LN); and the
families of :data:`MOE_FAMILIES`, :data:`VISION_FAMILIES` and :data:`OTHER_FAMILIES`.
"""

from __future__ import annotations

import torch
import transformers  # noqa: F401 (before galvatron_fx: its backend then ignores HF's warning_once)

FAMILIES = ("gpt2", "llama", "bert", "t5", "vit", "qwen2", "gptneox", "phi", "opt")
# mixture-of-experts decoders: routed experts as 3-D weights run by a grouped matmul, a router
# with an auxiliary load-balancing loss (Mixtral, Qwen2-MoE with a gated shared expert, OLMoE),
# DeepSeek-V3 as Moonlight configures it (multi-head latent attention, sigmoid routing with a
# correction bias, a shared expert, a dense first block)
MOE_FAMILIES = ("mixtral", "qwen2moe", "deepseekv3", "olmoe")
# vision: shifted-window attention (Swin), depthwise convolutions with channels-last norms
# (ConvNeXt), BatchNorm (ResNet); CLIP's contrastive loss couples every sample of the batch
VISION_FAMILIES = ("swin", "convnext", "resnet", "clip")
# BLOOM (ALiBi, fused QKV), Mamba (a selective scan over time steps)
OTHER_FAMILIES = ("bloom", "mamba")
ALL_FAMILIES = FAMILIES + MOE_FAMILIES + VISION_FAMILIES + OTHER_FAMILIES
IMAGE_FAMILIES = ("vit", "swin", "convnext", "resnet")
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
    moe = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
               num_experts_per_tok=2, **common)
    if family == "mixtral":
        return T.MixtralConfig(**{**moe, "intermediate_size": 64, "num_local_experts": 4, "output_router_logits": True,
                                  "router_aux_loss_coef": 0.02, **overrides})
    if family == "qwen2moe":
        return T.Qwen2MoeConfig(**{**moe, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
                                   "shared_expert_intermediate_size": 64, "output_router_logits": True,
                                   "router_aux_loss_coef": 0.02, **overrides})
    if family == "olmoe":
        return T.OlmoeConfig(**{**moe, "intermediate_size": 32, "num_experts": 4, "output_router_logits": True,
                                "router_aux_loss_coef": 0.02, **overrides})
    if family == "deepseekv3":  # Moonlight's shape: no query compression, one expert group, sigmoid routing
        return T.DeepseekV3Config(**{**moe, "num_key_value_heads": 4, "intermediate_size": 128,
                                     "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1,
                                     "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": None,
                                     "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
                                     "topk_group": 1, **overrides})
    if family == "swin":  # 16x16 images, 2x2 patches, windows of 4x4 patches (shifted in the second block)
        return T.SwinConfig(image_size=16, patch_size=2, num_channels=3, embed_dim=16, depths=[2, 2],
                            num_heads=[2, 4], window_size=4, mlp_ratio=2.0, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, drop_path_rate=0.0, num_labels=10, **overrides)
    if family == "convnext":
        return T.ConvNextConfig(num_channels=3, patch_size=2, hidden_sizes=[16, 32], depths=[2, 2], num_stages=2,
                                image_size=16, drop_path_rate=0.0, num_labels=10, **overrides)
    if family == "resnet":
        return T.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2],
                              layer_type="basic", num_labels=10, **overrides)
    if family == "clip":
        text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=SEQ, projection_dim=16, bos_token_id=0, eos_token_id=1, pad_token_id=0)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      image_size=12, patch_size=4, projection_dim=16)
        return T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16, **overrides)
    if family == "bloom":
        return T.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=VOCAB, hidden_dropout=0.0,
                             attention_dropout=0.0, **common, **overrides)
    if family == "mamba":
        return T.MambaConfig(num_hidden_layers=2, hidden_size=32, state_size=4, expand=2, conv_kernel=4,
                             vocab_size=VOCAB, **common, **overrides)
    raise KeyError(f"unknown family {family!r}; known: {', '.join(ALL_FAMILIES)}")


def model_class(family: str):
    import transformers as T

    return {"gpt2": T.GPT2LMHeadModel, "llama": T.LlamaForCausalLM, "bert": T.BertForMaskedLM,
            "t5": T.T5ForConditionalGeneration, "vit": T.ViTForImageClassification, "qwen2": T.Qwen2ForCausalLM,
            "gptneox": T.GPTNeoXForCausalLM, "phi": T.PhiForCausalLM, "opt": T.OPTForCausalLM,
            "mixtral": T.MixtralForCausalLM, "qwen2moe": T.Qwen2MoeForCausalLM, "olmoe": T.OlmoeForCausalLM,
            "deepseekv3": T.DeepseekV3ForCausalLM, "swin": T.SwinForImageClassification,
            "convnext": T.ConvNextForImageClassification, "resnet": T.ResNetForImageClassification,
            "clip": T.CLIPModel, "bloom": T.BloomForCausalLM, "mamba": T.MambaForCausalLM}[family]


def build(family: str, seed: int = 0, **overrides):
    """The model (fp32, train mode, seeded init) and one batch of 4 samples."""
    torch.manual_seed(seed)
    model = model_class(family)(config(family, **overrides))
    model.train()
    return model, batch(family, 4, seed=1)


def batch(family: str, n: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """``n`` samples as the model's keyword arguments, labels included."""
    g = torch.Generator().manual_seed(seed)
    if family in IMAGE_FAMILIES:
        side = 12 if family == "vit" else 16
        return {"pixel_values": torch.randn(n, 3, side, side, generator=g),
                "labels": torch.randint(0, 10, (n,), generator=g)}
    if family == "clip":  # captions and images; the model's own contrastive loss (return_loss)
        return {"input_ids": torch.randint(2, VOCAB, (n, SEQ), generator=g),
                "pixel_values": torch.randn(n, 3, 12, 12, generator=g), "return_loss": True}
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    if family == "t5":
        return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (n, SEQ), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}


def head(batch: dict, n: int) -> dict:
    """The first ``n`` samples of ``batch`` (non-tensor arguments as they are)."""
    return {k: v[:n] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def micro(batch: dict, m: int, i: int) -> dict:
    """Micro-batch ``i`` of ``m`` of ``batch`` (non-tensor arguments as they are)."""
    return {k: v.chunk(m)[i] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
