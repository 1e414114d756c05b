"""Capture and plan every Hugging Face family the test suite trains, at a published size.

Each model is built from its published configuration on the ``meta`` device (no weights, no
download), captured (with the batch probe) and planned for one 8×A100-80GB node at a global
batch of 64 in bf16. Prints a table and writes ``benchmarks/results/hf_families.json`` with the
capture and search seconds, the plan's shape and its predicted step time per family.

    python benchmarks/hf_families.py [--families mixtral swin ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_results  # noqa: E402

SEQ = 2048


def published(family: str):
    """``(model class, config, example kwargs)`` of the family's published model (meta tensors)."""
    import torch
    import transformers as T

    def ids(n: int = SEQ):
        x = torch.zeros(1, n, dtype=torch.long, device="meta")
        return {"input_ids": x, "labels": x}

    def image(side: int = 224):
        return {"pixel_values": torch.zeros(1, 3, side, side, device="meta"),
                "labels": torch.zeros(1, dtype=torch.long, device="meta")}

    nc = dict(use_cache=False)
    table = {
        # GPT-2 (124M), Llama-2 7B, BERT base, T5 base, ViT-B/16, Qwen2 7B, Pythia 1.4B, Phi-2, OPT 1.3B
        "gpt2": (T.GPT2LMHeadModel, T.GPT2Config(**nc), ids(1024)),
        "llama": (T.LlamaForCausalLM, T.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                                    num_attention_heads=32, vocab_size=32000, **nc), ids()),
        "bert": (T.BertForMaskedLM, T.BertConfig(), ids(512)),
        "t5": (T.T5ForConditionalGeneration, T.T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12,
                                                         decoder_start_token_id=0, pad_token_id=0, **nc),
               ids(512)),
        "vit": (T.ViTForImageClassification, T.ViTConfig(num_labels=1000), image()),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                                    num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                                    **nc), ids()),
        "gptneox": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                                                          num_attention_heads=16, vocab_size=50304, **nc), ids()),
        "phi": (T.PhiForCausalLM, T.PhiConfig(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                                              num_attention_heads=32, partial_rotary_factor=0.4, vocab_size=51200,
                                              **nc), ids()),
        "opt": (T.OPTForCausalLM, T.OPTConfig(hidden_size=2048, ffn_dim=8192, num_hidden_layers=24,
                                              num_attention_heads=32, word_embed_proj_dim=2048, **nc), ids()),
        # mixture of experts: Mixtral 8x7B, Qwen1.5-MoE-A2.7B, Moonlight-16B-A3B (DeepSeek-V3's), OLMoE-1B-7B
        "mixtral": (T.MixtralForCausalLM, T.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                                          num_attention_heads=32, num_key_value_heads=8,
                                                          num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                                                          output_router_logits=True, **nc), ids()),
        "qwen2moe": (T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig(hidden_size=2048, intermediate_size=5632,
                                                             moe_intermediate_size=1408,
                                                             shared_expert_intermediate_size=5632,
                                                             num_hidden_layers=24, num_attention_heads=16,
                                                             num_key_value_heads=16, num_experts=60,
                                                             num_experts_per_tok=4, vocab_size=151936,
                                                             output_router_logits=True, **nc), ids()),
        "deepseekv3": (T.DeepseekV3ForCausalLM, T.DeepseekV3Config(hidden_size=2048, intermediate_size=11264,
                                                                   moe_intermediate_size=1408, num_hidden_layers=27,
                                                                   num_attention_heads=16, num_key_value_heads=16,
                                                                   n_routed_experts=64, num_experts_per_tok=6,
                                                                   n_shared_experts=2, first_k_dense_replace=1,
                                                                   kv_lora_rank=512, q_lora_rank=None,
                                                                   qk_rope_head_dim=64, qk_nope_head_dim=128,
                                                                   v_head_dim=128, n_group=1, topk_group=1,
                                                                   vocab_size=163840, **nc), ids()),
        "olmoe": (T.OlmoeForCausalLM, T.OlmoeConfig(hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                                                    num_attention_heads=16, num_key_value_heads=16, num_experts=64,
                                                    num_experts_per_tok=8, vocab_size=50304,
                                                    output_router_logits=True, **nc), ids()),
        # vision: Swin-B (window 7), ConvNeXt-B, ResNet-50, CLIP ViT-B/32
        "swin": (T.SwinForImageClassification, T.SwinConfig(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                                                            window_size=7, num_labels=1000), image()),
        "convnext": (T.ConvNextForImageClassification, T.ConvNextConfig(hidden_sizes=[128, 256, 512, 1024],
                                                                        depths=[3, 3, 27, 3], num_labels=1000),
                     image()),
        "resnet": (T.ResNetForImageClassification, T.ResNetConfig(layer_type="bottleneck", depths=[3, 4, 6, 3],
                                                                  hidden_sizes=[256, 512, 1024, 2048],
                                                                  embedding_size=64, num_labels=1000), image()),
        "clip": (T.CLIPModel, T.CLIPConfig(text_config=dict(max_position_embeddings=77),
                                           vision_config=dict(patch_size=32)), None),
        # BLOOM-560m, Mamba-130m (at sequence 256)
        "bloom": (T.BloomForCausalLM, T.BloomConfig(hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880, **nc),
                  ids()),
        "mamba": (T.MambaForCausalLM, T.MambaConfig(hidden_size=768, num_hidden_layers=24, state_size=16,
                                                    vocab_size=50280, **nc), ids(256)),
    }
    cls, cfg, batch = table[family]
    if family == "clip":
        batch = {"input_ids": torch.zeros(1, 77, dtype=torch.long, device="meta"),
                 "pixel_values": torch.zeros(1, 3, 224, 224, device="meta"), "return_loss": True}
    return cls, cfg, batch


FAMILIES = ("gpt2", "llama", "bert", "t5", "vit", "qwen2", "gptneox", "phi", "opt", "mixtral", "qwen2moe",
            "deepseekv3", "olmoe", "swin", "convnext", "resnet", "clip", "bloom", "mamba")


def run(family: str) -> dict:
    import torch

    import galvatron_fx as gfx

    cls, cfg, batch = published(family)
    with torch.device("meta"):
        model = cls(cfg)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    mg = gfx.capture(model, (), example_kwargs=batch, name=family)
    t1 = time.perf_counter()
    plan = gfx.plan(mg, gfx.Cluster.preset("dgx-a100-80g"), global_batch_size=64, precision="bf16")
    t2 = time.perf_counter()
    strategies = sorted({f"tp{lp.strategy.tp} {lp.strategy.dp_type}" for lp in plan.layers})
    return {"params": params, "capture_s": t1 - t0, "search_s": t2 - t1, "layers": len(mg.layers),
            "kinds": len(mg.kinds()), "pp": plan.pp, "num_microbatches": plan.num_microbatches,
            "strategies": strategies, "step_time_s": plan.predicted.step_time_s,
            "peak_bytes": max(plan.predicted.device_peak_bytes), "coupled": sorted(mg.coupled()),
            "notes": list(plan.notes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="*", default=list(FAMILIES))
    args = ap.parse_args()
    import transformers  # noqa: F401 (first: see tests/hf_tiny.py)

    rows = {}
    print(f"{'family':12s} {'params':>9s} {'capture s':>9s} {'search s':>9s} {'pp':>3s} {'m':>3s} {'step ms':>9s}  "
          "strategies")
    for f in args.families:
        try:
            r = run(f)
        except Exception as e:  # reported, the others go on
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{f:12s} ERROR {r['error']}")
        else:
            print(f"{f:12s} {r['params'] / 1e9:8.2f}B {r['capture_s']:9.1f} {r['search_s']:9.1f} {r['pp']:3d} "
                  f"{r['num_microbatches']:3d} {r['step_time_s'] * 1e3:9.1f}  {', '.join(r['strategies'])}")
        rows[f] = r
    write_results("hf_families", {"families": rows, "cluster": "dgx-a100-80g (8 GPUs)", "global_batch": 64,
                                  "precision": "bf16", "machine": machine()})


if __name__ == "__main__":
    main()
