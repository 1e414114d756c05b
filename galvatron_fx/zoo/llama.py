"""Llama 2 / Llama 3 style decoder-only language model.

RMSNorm pre-norm blocks, rotary position embeddings (cos/sin tables precomputed up to
``max_seq_len`` and sliced to the sequence length), grouped-query attention (``n_kv_heads`` key and
value heads, each shared by ``n_heads / n_kv_heads`` query heads), a SwiGLU MLP, no biases anywhere
and an untied LM head. ``forward(idx, targets)`` returns the mean next-token cross-entropy.

The KV repeat factor is read from shapes (query heads // kv heads of the tensors at hand), so a
tensor-parallel shard holding ``H/tp`` query and ``Hkv/tp`` kv heads runs the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from galvatron_fx.zoo.common import (
    RMSNorm,
    apply_rope,
    check,
    init_weights,
    input_generator,
    merge_heads,
    random_tokens,
    resolve_seq_len,
    rope_cache,
    split_heads,
)


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Size and options of a Llama model."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        check(
            self.d_model % self.n_heads == 0,
            f"Llama d_model={self.d_model} is not divisible by n_heads={self.n_heads}",
        )
        check(
            self.n_heads % self.n_kv_heads == 0,
            f"Llama n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}",
        )
        check(self.head_dim % 2 == 0, f"Llama head_dim={self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


CONFIGS: dict[str, LlamaConfig] = {
    "llama-tiny": LlamaConfig(
        n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, ffn_dim=352, vocab_size=512,
        max_seq_len=256,
    ),
    "llama2-7b": LlamaConfig(
        n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, ffn_dim=11008, vocab_size=32000,
        max_seq_len=4096,
    ),
    "llama2-70b": LlamaConfig(
        n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=32000,
        max_seq_len=4096,
    ),
    "llama3-8b": LlamaConfig(
        n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
        max_seq_len=8192, rope_theta=500000.0,
    ),
}


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        hd = self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = apply_rope(split_heads(self.q_proj(x), self.head_dim), cos, sin)  # (B, H, T, hd)
        k = apply_rope(split_heads(self.k_proj(x), self.head_dim), cos, sin)  # (B, Hkv, T, hd)
        v = split_heads(self.v_proj(x), self.head_dim)  # (B, Hkv, T, hd)
        B, n_kv, T, hd = k.shape
        n_rep = q.shape[1] // n_kv
        # (B, Hkv, T, hd) -> (B, Hkv, rep, T, hd) -> (B, H, T, hd); head h reads kv head h // rep
        k = k[:, :, None].expand(B, n_kv, n_rep, T, hd).reshape(B, -1, T, hd)
        v = v[:, :, None].expand(B, n_kv, n_rep, T, hd).reshape(B, -1, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.o_proj(merge_heads(y))  # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, F) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Llama language model; ``forward(idx, targets)`` -> scalar next-token loss."""

    rope_cos: torch.Tensor  # buffers, registered in __init__
    rope_sin: torch.Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_cache(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        # Derived from the config, so not part of the state dict.
        self.register_buffer("rope_cos", cos, persistent=False)  # (S_max, hd)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed: int) -> None:
        """normal(0, 0.02) for every matrix, ones for the norms."""
        init_weights(self, seed=seed)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, hd)
        x = self.embed(idx)  # (B, T) -> (B, T, C)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def num_params(cfg: LlamaConfig) -> int:
    """Number of distinct parameters of ``Llama(cfg)``."""
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * hd * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    block = 2 * d + attn + 3 * d * cfg.ffn_dim
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return cfg.vocab_size * d + cfg.n_layers * block + d + head


def seq_len_for(cfg: LlamaConfig, seq_len: int | None) -> int:
    """Checked sequence length; ``None`` means ``max_seq_len`` (the RoPE table's length)."""
    return resolve_seq_len(
        seq_len, default=cfg.max_seq_len, limit=cfg.max_seq_len, what="max_seq_len"
    )


def example_inputs(
    cfg: LlamaConfig,
    *,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, targets)``, both ``(B, T)`` int64; targets are idx shifted left by one token."""
    tokens = random_tokens(
        cfg.vocab_size, (batch_size, seq_len + 1), gen=input_generator(seed), device=device
    )
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


Model = Llama
