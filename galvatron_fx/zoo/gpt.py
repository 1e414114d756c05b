"""GPT-2 / GPT-3 style decoder-only language model (nanoGPT layout).

Token + learned position embeddings, pre-LayerNorm blocks (causal self-attention, 4x GELU MLP),
a final LayerNorm and an LM head tied to the token embedding. ``forward(idx, targets)`` returns
the mean next-token cross-entropy.

The fused qkv projection lays its output out heads-major, ``(H, 3, hd)``, as Megatron does: a
contiguous shard of its output features then holds whole heads with their q, k and v, so
column-wise tensor parallelism of the fused weight is correct.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from galvatron_fx.zoo.common import (
    check,
    init_weights,
    input_generator,
    merge_heads,
    random_tokens,
    resolve_seq_len,
    split_heads,
)


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Size and options of a GPT model."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    max_seq_len: int
    ffn_mult: int = 4
    bias: bool = True
    fused_qkv: bool = True
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        check(
            self.d_model % self.n_heads == 0,
            f"GPT d_model={self.d_model} is not divisible by n_heads={self.n_heads}",
        )
        check(min(self.n_layers, self.vocab_size, self.max_seq_len) >= 1, f"bad GPT size: {self}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.ffn_mult * self.d_model


CONFIGS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(n_layers=4, d_model=128, n_heads=4, vocab_size=512, max_seq_len=256),
    "gpt2-small": GPTConfig(
        n_layers=12, d_model=768, n_heads=12, vocab_size=50257, max_seq_len=1024
    ),
    "gpt2-xl": GPTConfig(
        n_layers=48, d_model=1600, n_heads=25, vocab_size=50257, max_seq_len=1024
    ),
    "gpt3-6.7b": GPTConfig(
        n_layers=32, d_model=4096, n_heads=32, vocab_size=50257, max_seq_len=2048
    ),
    "gpt3-175b": GPTConfig(
        n_layers=96, d_model=12288, n_heads=96, vocab_size=50257, max_seq_len=2048
    ),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.head_dim = cfg.head_dim
        self.fused_qkv = cfg.fused_qkv
        if cfg.fused_qkv:
            self.qkv = nn.Linear(d, 3 * d, bias=cfg.bias)
        else:
            self.q_proj = nn.Linear(d, d, bias=cfg.bias)
            self.k_proj = nn.Linear(d, d, bias=cfg.bias)
            self.v_proj = nn.Linear(d, d, bias=cfg.bias)
        self.proj = nn.Linear(d, d, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        if self.fused_qkv:
            qkv = self.qkv(x).view(B, T, -1, 3, self.head_dim)  # (B, T, H, 3, hd)
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))  # 3 x (B, H, T, hd)
        else:
            q = split_heads(self.q_proj(x), self.head_dim)  # (B, H, T, hd)
            k = split_heads(self.k_proj(x), self.head_dim)
            v = split_heads(self.v_proj(x), self.head_dim)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.proj(merge_heads(y))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT language model; ``forward(idx, targets)`` -> scalar next-token loss."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def init_weights(self, seed: int) -> None:
        """normal(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layers) as in GPT-2."""
        init_weights(
            self,
            seed=seed,
            scaled_suffixes=("attn.proj.weight", "mlp.proj.weight"),
            scaled_std=0.02 / math.sqrt(2 * self.config.n_layers),
        )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T) -> (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def num_params(cfg: GPTConfig) -> int:
    """Number of distinct parameters of ``GPT(cfg)`` (a tied head counts once)."""
    d, f, b = cfg.d_model, cfg.ffn_dim, int(cfg.bias)
    norm = d + b * d
    attn = 4 * d * d + b * 4 * d
    mlp = 2 * d * f + b * (f + d)
    block = 2 * norm + attn + mlp
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return (cfg.vocab_size + cfg.max_seq_len) * d + cfg.n_layers * block + norm + head


def seq_len_for(cfg: GPTConfig, seq_len: int | None) -> int:
    """Checked sequence length; ``None`` means ``max_seq_len``."""
    return resolve_seq_len(
        seq_len, default=cfg.max_seq_len, limit=cfg.max_seq_len, what="max_seq_len"
    )


def example_inputs(
    cfg: GPTConfig,
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


Model = GPT
