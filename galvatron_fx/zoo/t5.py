"""T5 (v1.0) encoder-decoder language model.

A shared token embedding feeds two stacks. Each stack computes its relative position bias once,
before its blocks (Hugging Face computes it in the first block; moving it keeps every block of a
stack structurally identical), and passes it to every self-attention. Encoder blocks are
self-attention + ReLU feed-forward; decoder blocks are causal self-attention + cross-attention to
the encoder output + feed-forward. Norms are T5's RMS-style LayerNorm (scale only), pre-norm.
Attention is unscaled (``scale=1``): T5 folds ``1/sqrt(d_kv)`` into its initialisation. The LM head
is tied to the shared embedding and the decoder output is scaled by ``d_model**-0.5`` first, as in
t5-base. ``forward(input_ids, decoder_input_ids, labels)`` returns the decoder cross-entropy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from galvatron_fx.zoo.common import (
    RMSNorm,
    check,
    init_weights,
    input_generator,
    merge_heads,
    random_tokens,
    resolve_seq_len,
    split_heads,
)


@dataclass(frozen=True, kw_only=True)
class T5Config:
    """Size and options of a T5 model. ``n_decoder_layers=None`` means ``n_layers``."""

    n_layers: int  # encoder blocks
    d_model: int
    n_heads: int
    d_kv: int  # head_dim; n_heads * d_kv need not equal d_model
    ffn_dim: int
    vocab_size: int
    n_decoder_layers: int | None = None
    rel_buckets: int = 32
    rel_max_distance: int = 128
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    max_seq_len: int = 512  # default length only: relative positions impose no limit

    def __post_init__(self) -> None:
        check(min(self.n_layers, self.num_decoder_layers) >= 1, f"bad T5 size: {self}")
        check(self.rel_buckets >= 4, "T5 rel_buckets must be >= 4")

    @property
    def head_dim(self) -> int:
        return self.d_kv

    @property
    def num_decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers


CONFIGS: dict[str, T5Config] = {
    "t5-tiny": T5Config(n_layers=4, d_model=128, n_heads=4, d_kv=32, ffn_dim=512, vocab_size=512),
    "t5-base": T5Config(
        n_layers=12, d_model=768, n_heads=12, d_kv=64, ffn_dim=3072, vocab_size=32128
    ),
}


def relative_position_bucket(
    relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Map ``memory_pos - query_pos`` to a bucket: exact for small distances, log-spaced beyond."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # clamp(min=1) only keeps log() finite where is_small discards the value anyway
    large = max_exact + (
        torch.log(distance.clamp(min=1).float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class Attention(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        inner = cfg.n_heads * cfg.d_kv
        self.head_dim = cfg.d_kv
        self.q = nn.Linear(cfg.d_model, inner, bias=False)
        self.k = nn.Linear(cfg.d_model, inner, bias=False)
        self.v = nn.Linear(cfg.d_model, inner, bias=False)
        self.o = nn.Linear(inner, cfg.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        q = split_heads(self.q(x), self.head_dim)  # (B, H, T, hd)
        k = split_heads(self.k(memory), self.head_dim)  # (B, H, S, hd)
        v = split_heads(self.v(memory), self.head_dim)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)  # bias (1, H, T, S)
        return self.o(merge_heads(y))  # (B, T, C)


class FeedForward(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.wi = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.wo = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(F.relu(self.wi(x)))  # (B, T, F) -> (B, T, C)


class EncoderBlock(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ff = FeedForward(cfg)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        x = x + self.attn(h, h, bias)
        return x + self.ff(self.ff_norm(x))


class DecoderBlock(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.cross_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.cross_attn = Attention(cfg)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ff = FeedForward(cfg)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        x = x + self.attn(h, h, bias)  # bias carries the causal mask
        x = x + self.cross_attn(self.cross_norm(x), enc, None)  # no position bias across stacks
        return x + self.ff(self.ff_norm(x))


class Stack(nn.Module):
    """One T5 stack: relative position bias, identical blocks, final norm."""

    def __init__(self, cfg: T5Config, *, decoder: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = decoder
        self.rel_bias = nn.Embedding(cfg.rel_buckets, cfg.n_heads)  # bucket -> one bias per head
        n = cfg.num_decoder_layers if decoder else cfg.n_layers
        block = DecoderBlock if decoder else EncoderBlock
        self.blocks = nn.ModuleList(block(cfg) for _ in range(n))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)

    def position_bias(self, T: int, device: torch.device) -> torch.Tensor:
        """``(1, H, T, T)`` additive attention bias; the decoder's also masks future positions."""
        pos = torch.arange(T, device=device)
        relative = pos[None, :] - pos[:, None]  # (T, T): memory - query
        buckets = relative_position_bucket(
            relative,
            bidirectional=not self.decoder,
            num_buckets=self.cfg.rel_buckets,
            max_distance=self.cfg.rel_max_distance,
        )
        bias = self.rel_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (T, T, H) -> (1, H, T, T)
        if self.decoder:
            future = relative > 0  # (T, T)
            bias = bias.masked_fill(future, torch.finfo(bias.dtype).min)
        return bias

    def forward(self, x: torch.Tensor, enc: torch.Tensor | None = None) -> torch.Tensor:
        bias = self.position_bias(x.shape[1], x.device)
        for block in self.blocks:
            x = block(x, bias, enc) if self.decoder else block(x, bias)
        return self.final_norm(x)


class T5(nn.Module):
    """T5; ``forward(input_ids, decoder_input_ids, labels)`` -> scalar decoder cross-entropy."""

    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.config = cfg
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, decoder=False)
        self.decoder = Stack(cfg, decoder=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.shared.weight

    def init_weights(self, seed: int) -> None:
        """normal(0, 0.02) for every matrix, ones for the norms."""
        init_weights(self, seed=seed)

    def forward(
        self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        enc = self.encoder(self.shared(input_ids))  # (B, S) -> (B, S, C)
        dec = self.decoder(self.shared(decoder_input_ids), enc)  # (B, T) -> (B, T, C)
        if self.config.tie_embeddings:
            dec = dec * self.config.d_model**-0.5
        logits = self.lm_head(dec)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def num_params(cfg: T5Config) -> int:
    """Number of distinct parameters of ``T5(cfg)`` (a tied head counts once)."""
    d, inner = cfg.d_model, cfg.n_heads * cfg.d_kv
    attn = 4 * d * inner
    ff = 2 * d * cfg.ffn_dim
    enc_block = attn + ff + 2 * d
    dec_block = 2 * attn + ff + 3 * d
    stack_extra = cfg.rel_buckets * cfg.n_heads + d
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return (
        cfg.vocab_size * d
        + cfg.n_layers * enc_block
        + cfg.num_decoder_layers * dec_block
        + 2 * stack_extra
        + head
    )


def seq_len_for(cfg: T5Config, seq_len: int | None) -> int:
    """Checked length of both encoder and decoder; ``None`` means ``max_seq_len`` (512).

    Relative positions have no upper limit, so only positivity is checked.
    """
    return resolve_seq_len(seq_len, default=cfg.max_seq_len, limit=None, what="")


def example_inputs(
    cfg: T5Config,
    *,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, decoder_input_ids, labels)``, each ``(B, T)`` int64.

    ``decoder_input_ids`` is ``labels`` shifted right with token 0 (T5's pad/start token) first.
    """
    gen = input_generator(seed)
    input_ids = random_tokens(cfg.vocab_size, (batch_size, seq_len), gen=gen, device=device)
    labels = random_tokens(cfg.vocab_size, (batch_size, seq_len), gen=gen, device=device)
    start = torch.zeros((batch_size, 1), dtype=torch.long, device=device)
    decoder_input_ids = torch.cat((start, labels[:, :-1]), dim=1)
    return input_ids, decoder_input_ids, labels


Model = T5
