"""Pieces shared by the zoo's model families: head reshapes, RMSNorm, RoPE, init, example inputs.

Conventions every family follows (the capture and the tensor-parallel rewrite rely on them):

- Attention goes through ``F.scaled_dot_product_attention``.
- Head counts are read from shapes, never stored: ``split_heads`` views with ``-1`` for the head
  dimension, so a tensor-parallel shard with fewer heads per rank runs the same code.
- Weights are initialised here, deterministically from a seed, and only on real devices: a model
  built on ``meta`` is never touched.
"""

from __future__ import annotations

import torch
from torch import nn

from galvatron_fx.errors import ConfigError


def check(cond: bool, msg: str) -> None:
    """Raise a ``ConfigError`` with ``msg`` unless ``cond`` holds (config validation)."""
    if not cond:
        raise ConfigError(msg)


# --------------------------------------------------------------------------------------------
# Attention reshapes
# --------------------------------------------------------------------------------------------


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``(B, T, H*hd) -> (B, H, T, hd)``; ``H`` is whatever the shard holds."""
    B, T, _ = x.shape
    return x.view(B, T, -1, head_dim).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, hd) -> (B, T, H*hd)``."""
    B, _, T, _ = x.shape
    return x.transpose(1, 2).reshape(B, T, -1)


# --------------------------------------------------------------------------------------------
# Norms and rotary embeddings
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale and no bias (Llama's RMSNorm, T5's LayerNorm).

    Written out in plain ops (not ``F.rms_norm``) so that the captured graph holds ops every
    sharding rule knows; the statistics are taken in float32 as in the reference implementations.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


def rope_cache(max_seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Precompute rotary ``cos`` and ``sin`` tables, each ``(max_seq_len, head_dim)``.

    Built on the current default device (``meta`` included); uses the "rotate half" layout of
    Hugging Face Llama, where frequency ``i`` pairs dims ``i`` and ``i + head_dim/2``.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    t = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # (S, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (S, hd)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, T, hd)`` by position; ``cos``/``sin`` are ``(T, hd)``."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


# --------------------------------------------------------------------------------------------
# Initialisation and example inputs
# --------------------------------------------------------------------------------------------


def init_weights(
    model: nn.Module,
    *,
    seed: int,
    std: float = 0.02,
    scaled_suffixes: tuple[str, ...] = (),
    scaled_std: float | None = None,
) -> None:
    """Initialise every parameter of ``model`` deterministically from ``seed``.

    Matrices and other tensors of rank >= 2 (linear, embedding, conv weights, position tables,
    class tokens) get ``normal(0, std)``; parameters named ``*bias`` get zeros; the remaining
    vectors (norm scales) get ones. Parameters whose name ends in one of ``scaled_suffixes`` get
    ``normal(0, scaled_std)`` instead (GPT-2's residual-projection scaling). Draws come from a CPU
    generator in ``named_parameters`` order, so the result is the same on any device. Models on
    ``meta`` are left as they are.
    """
    params = list(model.named_parameters())  # tied parameters appear once
    if any(p.is_meta for _, p in params):
        return
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in params:
            if p.ndim >= 2:
                s = scaled_std if scaled_std is not None and name.endswith(scaled_suffixes) else std
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, s, generator=gen))
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def input_generator(seed: int) -> torch.Generator:
    """CPU generator for example inputs, on a stream distinct from the weights' one."""
    return torch.Generator(device="cpu").manual_seed(seed + 1_000_003)


def random_tokens(
    high: int, shape: tuple[int, ...], *, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Token ids in ``[0, high)`` of ``shape`` (int64) on ``device``; zeros on ``meta``."""
    if device.type == "meta":
        return torch.zeros(shape, dtype=torch.long, device=device)
    return torch.randint(high, shape, generator=gen, dtype=torch.long).to(device)


def resolve_seq_len(seq_len: int | None, *, default: int, limit: int | None, what: str) -> int:
    """Return ``seq_len`` (``default`` when ``None``), checked against ``limit`` if there is one."""
    if seq_len is None:
        return default
    check(
        isinstance(seq_len, int) and seq_len >= 1,
        f"seq_len must be a positive int, got {seq_len!r}",
    )
    if limit is not None:
        check(
            seq_len <= limit,
            f"seq_len={seq_len} exceeds the {what} ({limit}); lower seq_len or pass "
            f"overrides to raise the model's limit",
        )
    return seq_len
