"""Model zoo: realistic Transformer families at published sizes, buildable on any device.

Families (one file each): ``gpt`` (GPT-2/3), ``llama`` (Llama 2/3, GQA + RoPE), ``bert``
(masked LM or classification), ``t5`` (encoder-decoder), ``vit`` (image classifier). Every model
returns its scalar training loss from ``model(*example_inputs)``, keeps its blocks in an
``nn.ModuleList`` named ``blocks`` (T5: ``encoder.blocks`` and ``decoder.blocks``) whose members are
structurally identical, and traces with ``torch.export.export(model, inputs, strict=False)``.

Building on ``device="meta"`` allocates nothing and skips initialisation, so a 175B model builds in
well under a second; on a real device weights are initialised deterministically from ``seed``.

``seq_len`` is the token count for the language models (encoder and decoder length for T5), and
the number of image patches for ViT (a perfect square; the image side is
``sqrt(seq_len) * patch_size``). ``seq_len=None`` means the config's default length.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import torch
from torch import nn

from galvatron_fx.errors import ConfigError
from galvatron_fx.zoo import bert, gpt, llama, t5, vit
from galvatron_fx.zoo.bert import Bert, BertConfig
from galvatron_fx.zoo.gpt import GPT, GPTConfig
from galvatron_fx.zoo.llama import Llama, LlamaConfig
from galvatron_fx.zoo.t5 import T5, T5Config
from galvatron_fx.zoo.vit import ViT, ViTConfig

__all__ = [
    "GPT", "GPTConfig", "Llama", "LlamaConfig", "Bert", "BertConfig", "T5", "T5Config", "ViT",
    "ViTConfig", "ModelConfig", "names", "config", "build", "num_params",
]

ModelConfig = GPTConfig | LlamaConfig | BertConfig | T5Config | ViTConfig

_FAMILIES: tuple[ModuleType, ...] = (gpt, llama, bert, t5, vit)
_CONFIGS: dict[str, Any] = {name: cfg for fam in _FAMILIES for name, cfg in fam.CONFIGS.items()}
_FAMILY_OF: dict[type, ModuleType] = {type(next(iter(f.CONFIGS.values()))): f for f in _FAMILIES}


def names() -> list[str]:
    """Sorted names of the published configurations."""
    return sorted(_CONFIGS)


def config(name: str, *, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """The frozen config dataclass of ``name``, with ``overrides`` applied to its fields."""
    if name not in _CONFIGS:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(names())}")
    cfg = _CONFIGS[name]
    if not overrides:
        return cfg
    fields = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(
            f"{type(cfg).__name__} of {name!r} has no field(s) {', '.join(unknown)}; "
            f"its fields are: {', '.join(sorted(fields))}"
        )
    return dataclasses.replace(cfg, **overrides)


def num_params(name: str, *, overrides: dict[str, Any] | None = None) -> int:
    """Parameter count of ``name`` computed analytically from its config (tied weights once)."""
    cfg = config(name, overrides=overrides)
    return _FAMILY_OF[type(cfg)].num_params(cfg)


def build(
    name: str,
    *,
    batch_size: int,
    seq_len: int | None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build model ``name`` on ``device`` and example inputs for it.

    Returns ``(model, example_inputs)``; ``model(*example_inputs)`` is the scalar training loss
    (the inputs include the targets). Parameters are created directly on ``device``; on ``meta``
    nothing is allocated or initialised and the inputs are ``meta`` tensors. Otherwise weights are
    initialised from ``seed`` (the same on every device) and token ids / labels are drawn from a
    seeded CPU generator and moved to ``device``. Floating parameters, buffers and image inputs
    are cast to ``dtype``; token ids stay int64.

    Raises ``ConfigError`` for an unknown name or override, a ``seq_len`` above the model's
    positions (or, for ViT, not a perfect square), or a non-positive ``batch_size``.
    """
    cfg = config(name, overrides=overrides)
    family = _FAMILY_OF[type(cfg)]
    seq_len = family.seq_len_for(cfg, seq_len)
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    device = torch.device(device)
    with torch.device(device):
        model = family.Model(cfg)
    model.init_weights(seed)  # no-op on meta
    if dtype != torch.float32:
        model.to(dtype)
    inputs = family.example_inputs(
        cfg, batch_size=batch_size, seq_len=seq_len, device=device, dtype=dtype, seed=seed
    )
    return model, inputs
