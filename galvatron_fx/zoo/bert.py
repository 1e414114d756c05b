"""BERT bidirectional encoder with a masked-LM or a sequence-classification head.

Embeddings = token + position + token-type, then LayerNorm. Blocks are post-norm
(``x = LN(x + attn(x)); x = LN(x + mlp(x))``) with exact GELU. Heads:

- ``num_labels=None`` (default): masked LM — dense + GELU + LayerNorm transform, then a decoder
  tied to the token embedding plus its own bias. ``forward(input_ids, token_type_ids, labels)``
  returns the cross-entropy over positions whose label is not -100 (label every position to train
  on all of them; the example inputs label ``mlm_probability`` of them).
- ``num_labels=k``: pooler (dense + tanh on the first token) and a ``k``-way classifier;
  ``labels`` is ``(B,)``.
"""

from __future__ import annotations

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
class BertConfig:
    """Size and options of a BERT model."""

    n_layers: int
    d_model: int
    n_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int  # number of learned positions
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    num_labels: int | None = None  # None: masked-LM head; k: k-way classification head
    mlm_probability: float = 0.15  # share of positions labelled in the example inputs

    def __post_init__(self) -> None:
        check(
            self.d_model % self.n_heads == 0,
            f"BERT d_model={self.d_model} is not divisible by n_heads={self.n_heads}",
        )
        check(
            self.num_labels is None or self.num_labels >= 1,
            f"BERT num_labels must be None (masked LM) or >= 1, got {self.num_labels}",
        )
        check(0.0 < self.mlm_probability <= 1.0, "BERT mlm_probability must be in (0, 1]")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


CONFIGS: dict[str, BertConfig] = {
    "bert-tiny": BertConfig(
        n_layers=4, d_model=128, n_heads=4, ffn_dim=512, vocab_size=512, max_seq_len=256
    ),
    "bert-large": BertConfig(
        n_layers=24, d_model=1024, n_heads=16, ffn_dim=4096, vocab_size=30522, max_seq_len=512
    ),
}


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.head_dim = cfg.head_dim
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.query(x), self.head_dim)  # (B, H, T, hd)
        k = split_heads(self.key(x), self.head_dim)
        v = split_heads(self.value(x), self.head_dim)
        y = F.scaled_dot_product_attention(q, k, v)  # bidirectional: no mask
        return self.out(merge_heads(y))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, F) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x))  # post-norm
        return self.mlp_norm(x + self.mlp(x))


class MLMHead(nn.Module):
    def __init__(self, cfg: BertConfig, word_emb: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.decoder.weight = word_emb.weight  # tied; the bias is the head's own

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.decoder(self.norm(F.gelu(self.dense(x))))  # (B, T, C) -> (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


class ClassificationHead(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        assert cfg.num_labels is not None
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model)
        self.classifier = nn.Linear(cfg.d_model, cfg.num_labels)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(x[:, 0]))  # (B, T, C) -> (B, C)
        return F.cross_entropy(self.classifier(pooled), labels)  # logits (B, num_labels)


class Bert(nn.Module):
    """BERT; ``forward(input_ids, token_type_ids, labels)`` -> scalar loss of its head."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.word_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.type_emb = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.emb_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.head: nn.Module
        if cfg.num_labels is None:
            self.head = MLMHead(cfg, self.word_emb)
        else:
            self.head = ClassificationHead(cfg)

    def init_weights(self, seed: int) -> None:
        """normal(0, 0.02) for matrices, zeros for biases, ones for LayerNorm scales."""
        init_weights(self, seed=seed)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        T = input_ids.shape[1]
        pos = torch.arange(T, device=input_ids.device)
        x = self.word_emb(input_ids) + self.pos_emb(pos) + self.type_emb(token_type_ids)
        x = self.emb_norm(x)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(x, labels)


def num_params(cfg: BertConfig) -> int:
    """Number of distinct parameters of ``Bert(cfg)`` (the tied MLM decoder counts once)."""
    d, f = cfg.d_model, cfg.ffn_dim
    emb = (cfg.vocab_size + cfg.max_seq_len + cfg.type_vocab_size) * d + 2 * d
    block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    if cfg.num_labels is None:
        head = (d * d + d) + 2 * d + cfg.vocab_size
    else:
        head = (d * d + d) + (d * cfg.num_labels + cfg.num_labels)
    return emb + cfg.n_layers * block + head


def seq_len_for(cfg: BertConfig, seq_len: int | None) -> int:
    """Checked sequence length; ``None`` means ``max_seq_len`` (the number of positions)."""
    return resolve_seq_len(
        seq_len, default=cfg.max_seq_len, limit=cfg.max_seq_len, what="max_seq_len (positions)"
    )


def example_inputs(
    cfg: BertConfig,
    *,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, token_type_ids, labels)``.

    ``token_type_ids`` marks the second half of each sequence as segment B. For the MLM head,
    ``labels`` is ``(B, T)`` with ``max(1, round(mlm_probability * T))`` random positions per row
    labelled and the rest -100 (zeros, i.e. every position, on ``meta``); for the classification
    head it is ``(B,)``.
    """
    B, T = batch_size, seq_len
    gen = input_generator(seed)
    input_ids = random_tokens(cfg.vocab_size, (B, T), gen=gen, device=device)
    token_type_ids = (torch.arange(T, device=device) >= T // 2).long().expand(B, T).contiguous()
    if cfg.type_vocab_size < 2:
        token_type_ids = torch.zeros_like(token_type_ids)
    if cfg.num_labels is not None:
        labels = random_tokens(cfg.num_labels, (B,), gen=gen, device=device)
        return input_ids, token_type_ids, labels
    if device.type == "meta":
        return input_ids, token_type_ids, torch.zeros((B, T), dtype=torch.long, device=device)
    targets = torch.randint(cfg.vocab_size, (B, T), generator=gen)
    n_masked = max(1, round(cfg.mlm_probability * T))
    masked = torch.rand(B, T, generator=gen).argsort(dim=1)[:, :n_masked]  # (B, n_masked)
    labels = torch.full((B, T), -100, dtype=torch.long)
    labels.scatter_(1, masked, targets.gather(1, masked))
    return input_ids, token_type_ids, labels.to(device)


Model = Bert
