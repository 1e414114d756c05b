"""What a training run needs around its step: data from a token file, the learning-rate schedule,
parameter groups, the log line, TensorBoard, and weights from a ``save_pretrained`` directory.

Used by ``galvatron-fx train`` (:mod:`galvatron_fx.cli.train`); each piece is plain and usable on
its own.

- :class:`TokenFile`: a flat file of token ids (``uint16`` or ``uint32``, native byte order, as
  nanoGPT writes ``train.bin``), memory-mapped, never read whole; or a tokenized Hugging Face
  ``datasets`` dataset saved with ``save_to_disk`` (:meth:`TokenFile.from_datasets`). Its last ``val_fraction`` is the
  validation split. A step's batch is ``batch`` windows of ``seq + 1`` tokens at offsets drawn from
  a generator seeded by ``(seed, step)``, so every rank draws the same global batch and a resumed
  run the same batches as an uninterrupted one; validation batches are fixed windows of the split.
  :meth:`TokenFile.fill` lays a window batch out as the model's inputs: a Hugging Face causal LM's
  ``input_ids`` and ``labels`` (the model shifts its labels itself; an ``attention_mask`` all ones)
  or a ``(tokens, targets)`` pair whose targets are the next tokens (the zoo's GPTs).
- :func:`lr_at`: ``warmup`` steps rising linearly to ``lr``, then ``cosine``, ``linear`` or
  ``constant`` down to ``min_lr`` at the last step: a function of the step alone, so a resumed run
  continues its schedule from the checkpoint's step.
- :func:`param_groups`: weight decay on all but biases, norms and other vectors (by the user's
  FQNs and shapes, ``pm.named_parameters()``).
- :func:`init_from_hf`: weights from a ``save_pretrained`` directory's safetensors files (no
  pickle, no code) copied into the model before it is compiled.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from galvatron_fx.cluster.limits import load_json
from galvatron_fx.errors import ConfigError

MAX_INDEX_BYTES = 16 * 2**20  # a safetensors index lists names: a few MB for the largest models

__all__ = ["SCHEDULES", "TOKEN_DTYPES", "TokenFile", "format_line", "init_from_hf", "lr_at", "param_groups",
           "tensorboard_writer"]

SCHEDULES = ("cosine", "linear", "constant")
TOKEN_DTYPES = ("uint16", "uint32")


def lr_at(step: int, *, lr: float, steps: int, warmup: int = 0, schedule: str = "constant",
          min_lr: float = 0.0) -> float:
    """The learning rate of step ``step`` (0-based) of ``steps`` (see the module doc)."""
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    span = max(1, steps - 1 - warmup)
    t = min(1.0, max(0.0, (step - warmup) / span))
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - t)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def no_decay(name: str, param) -> bool:
    """Biases, norms' weights and other vectors and scalars: no weight decay (the usual recipe)."""
    return param.ndim < 2 or name.endswith("bias") or "norm" in name.lower()


def param_groups(named, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer parameter groups: ``weight_decay`` on matrices, none on :func:`no_decay`."""
    named = list(named)
    decay = [p for n, p in named if not no_decay(n, p)]
    rest = [p for n, p in named if no_decay(n, p)]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0})
            if g["params"]]


class TokenFile:
    """Batches of token windows from a flat token-id file (see the module doc)."""

    def __init__(self, path: str | os.PathLike, *, dtype: str = "uint16", val_fraction: float = 0.1, seed: int = 0):
        import numpy as np

        if dtype not in TOKEN_DTYPES:
            raise ConfigError(f"data_dtype {dtype!r}: choose one of {', '.join(TOKEN_DTYPES)}")
        if not 0.0 <= val_fraction < 1.0:
            raise ConfigError(f"val_fraction = {val_fraction}: give a fraction in [0, 1) of the token file to "
                              "hold out for validation")
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"data {str(self.path)!r}: no such file; give a flat file of token ids (uint16 or "
                              "uint32, e.g. nanoGPT's train.bin) or an importable module:function")
        size = self.path.stat().st_size
        width = np.dtype(dtype).itemsize
        if size % width:
            raise ConfigError(f"data {self.path}: {size} bytes is not a whole number of {dtype} token ids; is "
                              "data_dtype right?")
        self.tokens = np.memmap(self.path, dtype=np.dtype(dtype), mode="r")
        n = len(self.tokens)
        self.split = n - int(n * val_fraction)
        self.seed = seed

    @classmethod
    def from_datasets(cls, directory: str | os.PathLike, *, val_fraction: float = 0.1, seed: int = 0) -> TokenFile:
        """The same windows from a Hugging Face ``datasets`` dataset saved with ``save_to_disk``
        (Arrow files and JSON: nothing in it runs), tokenized: its ``input_ids`` rows joined into
        one stream. A ``DatasetDict``'s ``train`` split, validated on its ``validation`` (else
        ``test``) split; one ``Dataset`` (or a dict without either) holds out its last
        ``val_fraction``."""
        import numpy as np

        try:
            import datasets
        except ImportError:
            raise ConfigError(f"data datasets:{directory} needs the datasets package (pip install datasets), or give "
                              "a token file") from None
        path = Path(directory)
        if not path.is_dir():
            raise ConfigError(f"data datasets:{directory}: no such directory; give a dataset saved with "
                              "save_to_disk(DIR)")
        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError, OSError, KeyError) as e:
            raise ConfigError(f"data datasets:{directory}: not a dataset saved with save_to_disk ({e})") from None

        def stream(ds, name: str):
            if "input_ids" not in ds.column_names:
                raise ConfigError(f"data datasets:{directory}: the {name} split has columns {ds.column_names}, no "
                                  "input_ids; tokenize it first (ds.map(lambda b: tokenizer(b['text']), batched=True))")
            column = ds.data.column("input_ids")
            values = column.combine_chunks().flatten() if hasattr(column, "combine_chunks") else column.flatten()
            return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)

        val = None
        if isinstance(loaded, datasets.DatasetDict):
            train_name = "train" if "train" in loaded else next(iter(loaded))
            val_name = next((n for n in ("validation", "test") if n in loaded), None)
            train = stream(loaded[train_name], train_name)
            val = stream(loaded[val_name], val_name) if val_name else None
        else:
            train = stream(loaded, "one")
        if val is None:
            if not 0.0 <= val_fraction < 1.0:
                raise ConfigError(f"val_fraction = {val_fraction}: give a fraction in [0, 1) of the dataset to hold "
                                  "out for validation")
            tokens, split = train, len(train) - int(len(train) * val_fraction)
        else:
            tokens, split = np.concatenate([train, val]), len(train)
        self = cls.__new__(cls)
        self.path, self.tokens, self.split, self.seed = path, tokens, split, seed
        return self

    def _windows(self, lo: int, hi: int, batch: int, seq: int, key: tuple[int, ...]):
        import numpy as np
        import torch

        if hi - lo < seq + 1:
            what = "validation split" if lo else "training part"
            raise ConfigError(f"data {self.path}: its {what} holds {hi - lo} tokens, fewer than one window of "
                              f"seq + 1 = {seq + 1}; use a longer file, a shorter seq or another val_fraction")
        rng = np.random.default_rng([self.seed, *key])
        starts = rng.integers(lo, hi - seq, size=batch)
        rows = np.stack([np.asarray(self.tokens[s:s + seq + 1], dtype=np.int64) for s in starts])
        return torch.from_numpy(rows)

    def train_batch(self, step: int, batch: int, seq: int):
        """``batch`` windows of ``seq + 1`` tokens from the training part for ``step``."""
        return self._windows(0, self.split, batch, seq, (0, step))

    def val_batch(self, index: int, batch: int, seq: int):
        """The ``index``-th fixed validation batch."""
        return self._windows(self.split, len(self.tokens), batch, seq, (1, index))

    @property
    def has_val(self) -> bool:
        return self.split < len(self.tokens)

    @staticmethod
    def layout(example) -> str:
        """How token windows feed the model whose example inputs are ``example``: ``"hf"`` or
        ``"pair"``; a :class:`ConfigError` for any other signature."""
        import torch

        if isinstance(example, dict):
            extra = set(example) - {"input_ids", "labels", "attention_mask"}
            if "input_ids" in example and "labels" in example and not extra:
                return "hf"
        elif len(example) == 2 and all(isinstance(x, torch.Tensor) and x.ndim == 2 and not x.is_floating_point()
                                       for x in example):
            return "pair"
        names = sorted(example) if isinstance(example, dict) else f"{len(example)} positional inputs"
        raise ConfigError(f"a token file feeds causal language models (input_ids and labels, or a (tokens, "
                          f"targets) pair), but this model takes {names}; give data = 'module:function' "
                          "returning its inputs instead")

    @staticmethod
    def fill(windows, layout: str, example, vocab: int | None, where: str):
        """The model's inputs from ``windows`` (``batch × (seq + 1)`` token ids)."""
        import torch

        if vocab is not None and windows.numel() and int(windows.max()) >= vocab:
            raise ConfigError(f"{where}: token id {int(windows.max())} is beyond the model's vocabulary of {vocab}; "
                              "was the file written with this model's tokenizer (and data_dtype right)?")
        x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        if layout == "pair":
            return (x.to(example[0].device), y.to(example[1].device))
        out = {"input_ids": x.to(example["input_ids"].device), "labels": x.to(example["labels"].device)}
        if "attention_mask" in example:
            out["attention_mask"] = torch.ones_like(x, dtype=example["attention_mask"].dtype,
                                                    device=example["attention_mask"].device)
        return out


def vocab_size(model) -> int | None:
    """The model's vocabulary: its first embedding's rows (None without one)."""
    from torch import nn

    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return None if emb is None else int(emb.num_embeddings)


def init_from_hf(model, directory: str | os.PathLike) -> int:
    """Copy a ``save_pretrained`` directory's weights (``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` names) into ``model`` by name; a weight tied to one present
    (``lm_head`` to the embedding) keeps its tie. Returns the number of tensors copied."""
    import torch

    d = Path(directory)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        with open(index, "rb") as fh:  # bounded: a file that never ends (/dev/zero) is refused
            text = fh.read(MAX_INDEX_BYTES + 1)
        if len(text) > MAX_INDEX_BYTES:
            raise ConfigError(f"init hf:{d}: {index.name} is over {MAX_INDEX_BYTES >> 20} MiB; not a safetensors index")
        try:
            names = load_json(text.decode("utf-8", "replace"), str(index))["weight_map"]
            files = sorted({d / str(f) for f in names.values()})
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"init hf:{d}: {index.name} is not a safetensors index ({e})") from None
        if any(f.resolve().parent != d.resolve() for f in files):
            raise ConfigError(f"init hf:{d}: {index.name} names files outside the directory")
    elif (d / "model.safetensors").is_file():
        files = [d / "model.safetensors"]
    else:
        raise ConfigError(f"init hf:{d}: no model.safetensors (or its index) there; write the directory with "
                          "save_pretrained(..., safe_serialization=True) or galvatron-fx export --hf-dir")
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f), device="cpu"))
        except Exception as e:  # a damaged file says so, whatever safetensors raised
            raise ConfigError(f"init hf:{d}: cannot read {f.name} ({type(e).__name__}: {e})") from None
    own = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    unexpected = sorted(set(state) - set(own))
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
           if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if unexpected or bad:
        raise ConfigError(f"init hf:{d}: the weights do not fit this model (unexpected {unexpected[:4]}, shapes "
                          f"{bad[:4]}); give the config the directory was saved from")
    missing = [k for k, p in model.named_parameters() if k not in state]
    ties = {id(p) for k, p in model.named_parameters(remove_duplicate=False) if k in state}
    untied = [k for k in missing if id(own[k]) not in ties]
    if untied:
        raise ConfigError(f"init hf:{d}: no weights for {untied[:4]}{' ...' if len(untied) > 4 else ''}; give "
                          "the directory of this very model")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v.to(own[k].dtype))
    return len(state)


def tensorboard_writer(directory: Path):
    """A TensorBoard ``SummaryWriter`` on ``directory`` when ``torch.utils.tensorboard`` imports
    (the ``tensorboard`` package is installed), else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(directory))


# a log line's fields after the step, in order: (metrics key, how it reads)
_LINE = (("loss", lambda v: f"loss {v:.4f}"), ("val_loss", lambda v: f"val loss {v:.4f}"),
         ("lr", lambda v: f"lr {v:.2e}"), ("grad_norm", lambda v: f"grad norm {v:.3f}"),
         ("tokens_per_s", lambda v: f"{v:,.0f} tok/s"), ("mfu", lambda v: f"MFU {100 * v:.2f}%"),
         ("memory_bytes", lambda v: f"mem {v / 2**30:.2f} GiB"))


def format_line(rec: dict[str, Any], steps: int) -> str:
    """One log line of a metrics record (what is None is left out)."""
    return " | ".join([f"step {rec['step']}/{steps}"] + [say(rec[k]) for k, say in _LINE if rec.get(k) is not None])
