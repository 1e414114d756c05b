"""The run config of ``galvatron-fx train``: typed sections, as torchtitan's and ``Trainer``'s users
keep them.

    [model]        name, hf_config, factory, init, seed
    [parallelism]  cluster, nodes, precision, memory, max_tp, tp, max_pp, pp, reduce_dtypes,
                   powersgd_ranks, offload, host_memory, plan
    [training]     steps, batch, tokens_per_step, seq, max_norm, eval_every, eval_batches, nan_tolerance
    [optimizer]    name, lr, warmup, schedule, min_lr, weight_decay
    [data]         source, dtype, val_fraction
    [checkpoint]   dir, every, keep
    [metrics]      out, log_every, efficiency_every

Contract: :func:`load` reads a TOML file into a :class:`RunConfig` (one dataclass per section,
each field typed and defaulted); ``--section.key value`` (or ``--section.key=value``) overrides a
field, its value read as a TOML literal (``50``, ``3e-4``, ``[1, 2]``, ``"cosine"``; a bare word is a
string); the ``train`` command's own flags override last. Every field also has a flat name (the
flag's: ``--checkpoint-dir`` is ``checkpoint.dir``, ``--optimizer`` is ``optimizer.name``,
``--data`` is ``data.source``), and a file may give those at its top level instead of in sections.
A key nobody knows, a value of the wrong type and a value out of range are refused before torch is
imported, naming the key and what to give. Relative paths in a file are relative to the file.
Nothing read is executed (``model.factory`` and ``data.source`` name importable functions,
imported when the run starts).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from galvatron_fx.errors import ConfigError

__all__ = ["RunConfig", "load", "parse_overrides"]

IMPORTABLE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # "module:function" (else a token file)
OPTIMIZERS = ("adamw", "sgd")
_NUMBER = (int, float)


def _f(default: Any, types: tuple[type, ...], *, flat: str | None = None, path: bool = False, items: type | None = None,
       doc: str = ""):
    return field(default=default, metadata={"types": types, "flat": flat, "path": path, "items": items, "doc": doc})


@dataclass
class ModelConfig:
    name: str | None = _f(None, (str,), flat="model", doc="a zoo model (gpt-tiny, llama2-7b, ...)")
    hf_config: str | None = _f(None, (str,), path=True, doc="a Hugging Face config.json or its directory")
    factory: str | None = _f(None, (str,), doc="module:function building the model")
    init: str | None = _f(None, (str,), doc="hf:DIR, a save_pretrained directory's weights")
    seed: int = _f(0, (int,), doc="the seed of the model's initialisation")


@dataclass
class ParallelismConfig:
    cluster: str = _f("local-cpu", (str,), doc="local-cpu, a preset or a cluster JSON")
    nodes: int | None = _f(None, (int,))
    precision: str | None = _f(None, (str,), doc="fp32, bf16 or fp16 (default: bf16 on GPUs, fp32 on CPUs)")
    memory: float | None = _f(None, _NUMBER, doc="GiB per device")
    max_tp: int | None = _f(None, (int,))
    tp: list | None = _f(None, (list,), items=int)
    max_pp: int | None = _f(None, (int,))
    pp: list | None = _f(None, (list,), items=int)
    reduce_dtypes: list | None = _f(None, (list,), items=str)
    powersgd_ranks: list | None = _f(None, (list,), items=int)
    offload: str | None = _f(None, (str,))
    host_memory: float | None = _f(None, _NUMBER, doc="GiB of host memory per device for offload")
    plan: str | None = _f(None, (str,), path=True, doc="run this saved plan instead of searching")


@dataclass
class TrainingConfig:
    steps: int = _f(20, (int,))
    batch: int | str | None = _f(None, (int, str), doc='the global batch, "auto" or "LO:HI"')
    tokens_per_step: int | None = _f(None, (int,))
    seq: int | None = _f(None, (int,))
    max_norm: float | None = _f(None, _NUMBER, doc="clip gradients to this global norm")
    eval_every: int = _f(0, (int,))
    eval_batches: int = _f(2, (int,))
    nan_tolerance: int = _f(0, (int,), doc="steps with a non-finite loss or gradient norm skipped before stopping")


@dataclass
class OptimizerConfig:
    name: str = _f("adamw", (str,), flat="optimizer")
    lr: float = _f(1e-3, _NUMBER)
    warmup: int = _f(0, (int,))
    schedule: str = _f("constant", (str,), doc="cosine, linear or constant after warmup")
    min_lr: float = _f(0.0, _NUMBER)
    weight_decay: float = _f(0.0, _NUMBER)


@dataclass
class DataConfig:
    source: str | None = _f(None, (str,), flat="data", doc="a token file, datasets:DIR (save_to_disk), or module:function")
    dtype: str = _f("uint16", (str,), flat="data_dtype")
    val_fraction: float = _f(0.1, _NUMBER)


@dataclass
class CheckpointConfig:
    dir: str | None = _f(None, (str,), flat="checkpoint_dir", path=True)
    every: int = _f(0, (int,), flat="checkpoint_every")
    keep: int = _f(3, (int,), doc="the newest step checkpoints kept in dir (step-<N>)")


@dataclass
class MetricsConfig:
    out: str = _f("runs/train", (str,), path=True)
    log_every: int = _f(10, (int,))
    efficiency_every: int = _f(10, (int,))


@dataclass
class RunConfig:
    """A training run's configuration, by section (module doc)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    # ---- names -----------------------------------------------------------------------------------
    @staticmethod
    def sections() -> dict[str, type]:
        return {f.name: f.default_factory for f in fields(RunConfig)}  # type: ignore[misc]

    @staticmethod
    def flat_names() -> dict[str, tuple[str, str]]:
        """Each field's flat name (its flag's) -> ``(section, key)``."""
        return {f.metadata["flat"] or f.name: (s, f.name) for s, cls in RunConfig.sections().items() for f in fields(cls)}

    def get(self, section: str, key: str) -> Any:
        return getattr(getattr(self, section), key)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Section -> key -> value (as a TOML file would hold it; ``None``: not set)."""
        return {s: dataclasses.asdict(getattr(self, s)) for s in self.sections()}

    # ---- setting ---------------------------------------------------------------------------------
    def set(self, section: str, key: str, value: Any, *, where: str = "", base: Path | None = None) -> None:
        """Set ``section.key`` to ``value``, type-checked; ``base``: a file's directory, which
        relative paths in it are relative to."""
        cls = self.sections().get(section)
        if cls is None:
            raise ConfigError(f"{where}unknown section [{section}]; sections: {', '.join(self.sections())}")
        spec = {f.name: f for f in fields(cls)}.get(key)
        if spec is None:
            raise ConfigError(f"{where}[{section}] has no key {key!r}; its keys: {', '.join(f.name for f in fields(cls))}")
        types, items = spec.metadata["types"], spec.metadata["items"]
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            names = "/".join(t.__name__ for t in types)
            raise ConfigError(f"{where}{section}.{key} = {value!r} should be a {names}")
        if items is not None and value is not None and not all(isinstance(v, items) and not isinstance(v, bool)
                                                               for v in value):
            raise ConfigError(f"{where}{section}.{key} should be a list of {items.__name__}s, e.g. "
                              f"{[1, 2] if items is int else ['float32']}")
        if base is not None and isinstance(value, str):
            value = _relative(section, key, value, base, spec.metadata["path"])
        setattr(getattr(self, section), key, value)

    def update(self, table: dict[str, Any], *, where: str = "", base: Path | None = None) -> None:
        """Set from a TOML table: ``[section]`` tables, or flat names at the top level."""
        flat = self.flat_names()
        for name, value in table.items():
            if isinstance(value, dict) and name in self.sections():
                for key, v in value.items():
                    self.set(name, key, v, where=where, base=base)
            elif name in flat:
                self.set(*flat[name], value, where=where, base=base)
            else:
                raise ConfigError(f"{where}unknown key {name!r}: give sections [{'], ['.join(self.sections())}] "
                                  f"(or the flat names {', '.join(flat)})")

    def override(self, pairs: list[tuple[str, str]]) -> None:
        """``--section.key value`` overrides (:func:`parse_overrides`)."""
        for dotted, raw in pairs:
            section, _, key = dotted.partition(".")
            self.set(section, key, _literal(raw), where=f"--{dotted}: ")

    # ---- checking --------------------------------------------------------------------------------
    def check(self) -> None:
        """Values out of range, refused with what to give instead (before torch is imported)."""
        from galvatron_fx.cli.commands import OFFLOAD_CHOICES, PRECISIONS
        from galvatron_fx.cli.train_recipe import SCHEDULES, TOKEN_DTYPES

        def need(ok: bool, section: str, key: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"{section}.{key} = {self.get(section, key)!r}: give {what}")

        finite = lambda v: v is not None and math.isfinite(v)  # noqa: E731
        p, t, o, d, c, m = self.parallelism, self.training, self.optimizer, self.data, self.checkpoint, self.metrics
        need(p.precision is None or p.precision in PRECISIONS, "parallelism", "precision", f"one of {', '.join(PRECISIONS)}")
        need(p.offload is None or p.offload in OFFLOAD_CHOICES, "parallelism", "offload",
             f"one of {', '.join(OFFLOAD_CHOICES)}")
        need(o.name in OPTIMIZERS, "optimizer", "name", f"one of {', '.join(OPTIMIZERS)}")
        count = lambda v: v is None or 1 <= v <= 2**30  # noqa: E731
        need(count(p.nodes), "parallelism", "nodes", "a number of nodes >= 1 (leave it out: as torchrun started)")
        need(count(p.max_tp) and count(p.max_pp), "parallelism", "max_tp" if not count(p.max_tp) else "max_pp",
             "a degree >= 1")
        for key in ("tp", "pp"):
            need(all(1 <= v <= 2**20 for v in getattr(p, key) or ()), "parallelism", key, "degrees >= 1, e.g. [1, 2]")
        for key in ("memory", "host_memory"):
            need(getattr(p, key) is None or finite(getattr(p, key)) and getattr(p, key) > 0, "parallelism", key,
                 "GiB > 0 (leave it out: all of it)")
        need(_batch_ok(t.batch), "training", "batch", 'a global batch of 1 to 2**30 samples, "auto" or "LO:HI"')
        need(count(t.tokens_per_step), "training", "tokens_per_step", "a number of tokens >= 1")
        need(t.seq is None or 1 <= t.seq <= 2**24, "training", "seq", "a sequence length >= 1")
        need(t.steps >= 1, "training", "steps", "a number of steps >= 1")
        need(finite(o.lr) and o.lr > 0, "optimizer", "lr", "a positive learning rate, e.g. 3e-4")
        need(finite(o.min_lr) and 0 <= o.min_lr <= o.lr, "optimizer", "min_lr", "a learning rate in [0, lr]")
        need(finite(o.weight_decay) and o.weight_decay >= 0, "optimizer", "weight_decay", "a decay >= 0, e.g. 0.1")
        need(t.max_norm is None or finite(t.max_norm) and t.max_norm > 0, "training", "max_norm",
             "a positive gradient norm, e.g. 1.0 (leave it out to not clip)")
        need(o.schedule in SCHEDULES, "optimizer", "schedule", f"one of {', '.join(SCHEDULES)}")
        need(0 <= o.warmup < t.steps, "optimizer", "warmup", f"fewer steps than training.steps = {t.steps}")
        need(m.log_every >= 1, "metrics", "log_every", "a number of steps >= 1")
        need(not Path(m.out).is_file(), "metrics", "out", "a directory for the run's metrics, plan and report (this "
             "is a file)")
        need(t.eval_every >= 0, "training", "eval_every", "a number of steps >= 0 (0: no evaluation)")
        need(t.eval_batches >= 1, "training", "eval_batches", "a number of batches >= 1")
        need(t.nan_tolerance >= 0, "training", "nan_tolerance", "a number of steps >= 0 (0: stop at the first)")
        need(c.every >= 0, "checkpoint", "every", "a number of steps >= 0 (0: only at the end)")
        need(c.keep >= 1, "checkpoint", "keep", "a number of checkpoints >= 1")
        need(m.efficiency_every >= 0, "metrics", "efficiency_every", "a number of steps >= 0 (0: never)")
        need(d.dtype in TOKEN_DTYPES, "data", "dtype", f"one of {', '.join(TOKEN_DTYPES)}")
        need(finite(d.val_fraction) and 0 <= d.val_fraction < 1, "data", "val_fraction", "a fraction in [0, 1)")
        init = self.model.init
        need(init is None or init.startswith("hf:") and len(init) > 3, "model", "init",
             "hf:DIR, a save_pretrained directory")
        if t.eval_every and not d.source:
            raise ConfigError("training.eval_every needs data to hold a validation split out of: give data.source = a "
                              "token file, or a data function that takes split='val'")


def _batch_ok(batch: int | str | None) -> bool:
    """A global batch, ``"auto"`` or ``"LO:HI"`` with 1 <= LO <= HI <= 2**30 (as ``--batch`` takes it)."""
    if batch is None or batch == "auto":
        return True
    lo, sep, hi = str(batch).partition(":")
    if isinstance(batch, str) and not sep:
        return False
    try:
        vals = [int(lo)] + ([int(hi)] if sep else [])
    except ValueError:
        return False
    return all(1 <= v <= 2**30 for v in vals) and vals == sorted(vals)


def _relative(section: str, key: str, value: str, base: Path, is_path: bool) -> str:
    """A file's relative path made relative to the file's directory."""
    if is_path and not Path(value).is_absolute():
        return str(base / value)
    if (section, key) == ("data", "source") and value.startswith("datasets:"):  # a saved dataset, beside the config
        return value if Path(value[9:]).is_absolute() else "datasets:" + str(base / value[9:])
    if (section, key) == ("data", "source") and not IMPORTABLE.fullmatch(value) and not Path(value).is_absolute():
        return str(base / value)  # a token file, beside the config
    if (section, key) == ("model", "init") and value.startswith("hf:") and not Path(value[3:]).is_absolute():
        return "hf:" + str(base / value[3:])
    return value


def _literal(raw: str) -> Any:
    """A command-line value as a TOML literal (``50``, ``3e-4``, ``[1, 2]``, ``true``), else the
    string itself."""
    import tomllib

    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def load(path: str | os.PathLike, config: RunConfig | None = None) -> RunConfig:
    """The run config at ``path`` (TOML) over ``config`` (or the defaults), checked for keys and
    types (not ranges: :meth:`RunConfig.check`, after the overrides)."""
    import tomllib

    from galvatron_fx.cluster.limits import read_text

    path = Path(path)
    try:
        data = tomllib.loads(read_text(path, what="run config"))
    except OSError as e:
        raise ConfigError(f"run config {path}: cannot be read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"run config {path}: not valid TOML ({e})") from None
    config = config or RunConfig()
    config.update(data, where=f"run config {path}: ", base=path.parent)
    return config


def parse_overrides(extra: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """``--section.key value`` and ``--section.key=value`` among the arguments ``extra``: the
    pairs, and the other arguments."""
    pairs, rest, i = [], [], 0
    while i < len(extra):
        a = extra[i]
        m = re.fullmatch(r"--([a-z_]+\.[a-z_]+)(?:=(.*))?", a, flags=re.S)
        if m and m.group(2) is not None:
            pairs.append((m.group(1), m.group(2)))
        elif m and i + 1 < len(extra):
            pairs.append((m.group(1), extra[i + 1]))
            i += 1
        else:
            rest.append(a)
        i += 1
    return pairs, rest
