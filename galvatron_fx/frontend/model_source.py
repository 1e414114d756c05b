"""Where a command-line model comes from: a zoo name, a Hugging Face config, or a user's factory.

``resolve(zoo_name=, hf_config=, factory=)`` names the source (exactly one is given) and
``build(source, batch_size=, seq_len=, device=)`` returns ``(model, args, kwargs)`` to capture:

- a zoo name: :func:`galvatron_fx.zoo.build` (the model returns its loss);
- ``--hf-config PATH``: a Hugging Face ``config.json`` (or a directory holding one). The model
  class is the config's ``architectures[0]`` when ``transformers`` has it, else the first of
  ``AutoModelForCausalLM``, ``AutoModelForSeq2SeqLM``, ``AutoModelForMaskedLM`` that takes the
  config. It is built from the config on ``device`` (the meta device for planning: no weights,
  no download) and called with ``input_ids`` and ``labels`` so that it computes its own loss.
  No code is loaded from the config (``trust_remote_code`` stays off);
- ``--model module:function``: ``function(batch_size=, seq_len=, device=)`` from an importable
  module, returning ``(model, example_inputs)`` where ``example_inputs`` is a tuple of positional
  arguments or a mapping of argument names (a Hugging Face batch).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from galvatron_fx.cluster.limits import read_json
from galvatron_fx.errors import ConfigError

_HF_AUTO = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM")
DEFAULT_HF_SEQ = 2048  # an HF config's sequence when none is given: min(this, max_position_embeddings)


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "zoo", "hf", "factory"
    value: str  # the zoo name, the config file's path, or "module:function"

    @property
    def name(self) -> str:
        """The name the plan records."""
        if self.kind == "hf":
            return _hf_name(Path(self.value))
        return self.value

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "value": self.value}


def resolve(*, zoo_name: str | None = None, hf_config: str | Path | None = None,
            factory: str | None = None) -> ModelSource:
    """The one model source given; a :class:`ConfigError` saying what to pass otherwise."""
    given: list[tuple[str, Any]] = [(k, v) for k, v in (("zoo", zoo_name), ("hf", hf_config), ("factory", factory)) if v]
    if len(given) != 1:
        what = "none" if not given else " and ".join({"zoo": "a zoo name", "hf": "--hf-config",
                                                     "factory": "--model"}[k] for k, _ in given)
        raise ConfigError(f"give one model: a zoo name (e.g. gpt2-small), --hf-config PATH (a Hugging Face "
                          f"config.json) or --model module:function; got {what}")
    kind, value = given[0]
    if kind == "hf":
        path = Path(value)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"--hf-config {value}: no such file (give a config.json or a directory holding one)")
        return ModelSource("hf", str(path))
    if kind == "factory" and (value.count(":") != 1 or not all(value.split(":"))):
        raise ConfigError(f"--model {value!r}: expected module:function, e.g. mypkg.models:build")
    if kind == "zoo":
        from galvatron_fx import zoo

        if value not in zoo.names():
            raise ConfigError(f"unknown zoo model {value!r}; known: {', '.join(zoo.names())} (or use --hf-config "
                              "PATH / --model module:function for your own)")
    return ModelSource(kind, str(value))


def _hf_name(path: Path) -> str:
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def hf_config(path: str | Path):
    """The ``transformers`` config in ``path`` (a ``config.json``); a :class:`ConfigError` if unreadable."""
    import transformers

    try:
        data = read_json(path, what="Hugging Face config")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config JSON; give a config.json or its directory") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not model_type:
        raise ConfigError(f"{path}: a Hugging Face config.json names its model_type (e.g. \"llama\"); this one "
                          "does not")
    try:
        return transformers.AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{path}: transformers {transformers.__version__} does not know model_type "
                          f"{model_type!r} ({e})") from None


MAX_LAYERS = 4096  # the deepest published models have a few hundred; building 10**7 takes hours
_LAYER_FIELDS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers", "encoder_layers",
                 "decoder_layers", "depths")


def _check_size(config, path) -> None:
    """A config whose layer counts no model has is refused before anything is built."""
    for name in _LAYER_FIELDS:
        v = getattr(config, name, None)
        n = sum(x for x in v if isinstance(x, int)) if isinstance(v, (list, tuple)) else v
        if isinstance(n, int) and not isinstance(n, bool) and not 0 <= n <= MAX_LAYERS:
            raise ConfigError(f"{path}: {name} = {v!r}: a model of more than {MAX_LAYERS} layers (or fewer than 0) is "
                              "not one to build; check the config")


def hf_model_class(config):
    """The class to build ``config`` with (see module doc)."""
    import transformers

    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):  # (not an Auto* factory)
            return cls
    for auto in _HF_AUTO:
        try:
            return getattr(transformers, auto)._model_mapping[type(config)]
        except KeyError:
            continue
    raise ConfigError(f"no causal-LM, seq2seq or masked-LM model class in transformers takes a {type(config).__name__}"
                      ": build the model yourself and pass it with --model module:function")


def build_hf(path: str | Path, *, batch_size: int, seq_len: int | None, device: Any = "meta"):
    """``(model, args, kwargs)`` for a Hugging Face config (see module doc)."""
    import torch

    config = hf_config(path)
    _check_size(config, path)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    cls = hf_model_class(config)
    if seq_len is None:
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        seq_len = min(DEFAULT_HF_SEQ, limit) if limit else DEFAULT_HF_SEQ
    with torch.device(device):
        model = cls(config)
    vocab = int(getattr(config, "vocab_size", 2))
    ids = (torch.zeros(batch_size, seq_len, dtype=torch.long, device=device) if str(device) == "meta" else
           torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(0)).to(device))
    return model, (), {"input_ids": ids, "labels": ids}


def build_factory(spec: str, *, batch_size: int, seq_len: int | None, device: Any = "meta"):
    module_name, func_name = spec.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--model {spec}: cannot import {func_name} from {module_name} ({e}); the module must be "
                          "importable (on PYTHONPATH or in the current directory)") from None
    out = func(batch_size=batch_size, seq_len=seq_len, device=device)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ConfigError(f"--model {spec}: {func_name}(...) must return (model, example_inputs), got "
                          f"{type(out).__name__}")
    model, inputs = out
    if isinstance(inputs, Mapping):
        return model, (), dict(inputs)
    return model, tuple(inputs), {}


def build(source: ModelSource, *, batch_size: int, seq_len: int | None, device: Any = "meta"):
    """``(model, args, kwargs)`` of ``source`` at this batch and sequence (see module doc)."""
    if source.kind == "zoo":
        from galvatron_fx import zoo

        model, inputs = zoo.build(source.value, batch_size=batch_size, seq_len=seq_len, device=device)
        return model, tuple(inputs), {}
    if source.kind == "hf":
        return build_hf(source.value, batch_size=batch_size, seq_len=seq_len, device=device)
    return build_factory(source.value, batch_size=batch_size, seq_len=seq_len, device=device)


def capture(source: ModelSource, *, batch_size: int, seq_len: int | None, device: Any = "meta",
            dtype=None, annotate: bool = True):
    """The captured :class:`~galvatron_fx.ir.graph.ModelGraph` of ``source`` (optionally in ``dtype``)."""
    from galvatron_fx.frontend.capture import capture as capture_model

    model, args, kwargs = build(source, batch_size=batch_size, seq_len=seq_len, device=device)
    if dtype is not None:
        model = model.to(dtype)
    return capture_model(model, args, example_kwargs=kwargs, name=source.name, annotate=annotate)
