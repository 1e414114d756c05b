"""Vision Transformer (ViT) image classifier.

A strided convolution cuts the image into ``patch_size``-square patches and projects each to
``d_model``; a learned class token is prepended and learned position embeddings added; pre-norm
blocks (self-attention + exact-GELU MLP) follow; a final LayerNorm and a linear head read the
class token. ``forward(pixel_values, labels)`` returns the classification cross-entropy.

Sequence length: ``build(..., seq_len=N)`` means ``N`` patches, so the image side is
``sqrt(N) * patch_size`` and ``N`` must be a perfect square no larger than the configured
``num_patches``; the model then sees ``N + 1`` tokens (with the class token) and uses the first
``N + 1`` rows of its position table (a shape-level stand-in for the interpolation one would do
when fine-tuning at another resolution). ``seq_len=None`` means the configured ``image_size``.
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
class ViTConfig:
    """Size and options of a ViT model."""

    n_layers: int
    d_model: int
    n_heads: int
    mlp_dim: int
    patch_size: int
    image_size: int
    num_classes: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        check(
            self.d_model % self.n_heads == 0,
            f"ViT d_model={self.d_model} is not divisible by n_heads={self.n_heads}",
        )
        check(
            self.image_size % self.patch_size == 0,
            f"ViT image_size={self.image_size} is not a multiple of patch_size={self.patch_size}",
        )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def max_seq_len(self) -> int:
        """Largest ``seq_len`` (in patches) that ``build`` accepts."""
        return self.num_patches


CONFIGS: dict[str, ViTConfig] = {
    "vit-tiny": ViTConfig(
        n_layers=4, d_model=128, n_heads=4, mlp_dim=512, patch_size=4, image_size=32, num_classes=10
    ),
    "vit-huge": ViTConfig(
        n_layers=32, d_model=1280, n_heads=16, mlp_dim=5120, patch_size=14, image_size=224,
        num_classes=1000,
    ),
}


class SelfAttention(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.q_proj(x), self.head_dim)  # (B, H, N+1, hd)
        k = split_heads(self.k_proj(x), self.head_dim)
        v = split_heads(self.v_proj(x), self.head_dim)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(merge_heads(y))  # (B, N+1, C)


class MLP(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_dim)
        self.proj = nn.Linear(cfg.mlp_dim, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    """ViT; ``forward(pixel_values, labels)`` -> scalar classification loss."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.config = cfg
        d = cfg.d_model
        self.patch_embed = nn.Conv2d(cfg.num_channels, d, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_emb = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, d))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(d, cfg.num_classes)

    def init_weights(self, seed: int) -> None:
        """normal(0, 0.02) for matrices, conv kernels, class token and positions."""
        init_weights(self, seed=seed)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B = pixel_values.shape[0]
        x = self.patch_embed(pixel_values)  # (B, 3, H, W) -> (B, C, H/p, W/p)
        x = x.flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)  # (B, N+1, C)
        x = x + self.pos_emb[:, : x.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])  # (B, num_classes)
        return F.cross_entropy(logits, labels)


def num_params(cfg: ViTConfig) -> int:
    """Number of parameters of ``ViT(cfg)``."""
    d, f = cfg.d_model, cfg.mlp_dim
    embed = cfg.num_channels * cfg.patch_size**2 * d + d + d + (cfg.num_patches + 1) * d
    block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    return embed + cfg.n_layers * block + 2 * d + d * cfg.num_classes + cfg.num_classes


def seq_len_for(cfg: ViTConfig, seq_len: int | None) -> int:
    """Checked number of patches; ``None`` means the configured image size's ``num_patches``."""
    n = resolve_seq_len(
        seq_len, default=cfg.num_patches, limit=cfg.num_patches, what="number of patches"
    )
    side = math.isqrt(n)
    check(
        side * side == n,
        f"ViT seq_len is the number of patches and must be a perfect square (got {n}); "
        f"try {side * side} or {(side + 1) ** 2}",
    )
    return n


def example_inputs(
    cfg: ViTConfig,
    *,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixel_values, labels)``: ``(B, channels, side, side)`` in ``dtype`` and ``(B,)`` int64,
    with ``side = sqrt(seq_len) * patch_size``."""
    side = math.isqrt(seq_len) * cfg.patch_size
    shape = (batch_size, cfg.num_channels, side, side)
    gen = input_generator(seed)
    if device.type == "meta":
        pixels = torch.empty(shape, dtype=dtype, device=device)
    else:
        pixels = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    labels = random_tokens(cfg.num_classes, (batch_size,), gen=gen, device=device)
    return pixels, labels


Model = ViT
