"""The ``galvatron-fx`` sub-commands' arguments, kept free of heavy imports.

``galvatron-fx --help`` (and any sub-command's ``--help``) parses with this module only: no
torch, no model code, so it answers at once. Each command names the function that runs it as
``"module:function"``, imported only when that command runs. Flags mean the same thing in every
command that takes them: a model is a zoo name, ``--hf-config PATH`` or ``--model
module:factory`` (:mod:`galvatron_fx.frontend.model_source`); ``--batch`` is the global batch,
``--seq`` the sequence length, ``--cluster``/``--nodes`` the cluster, ``--precision`` the
training precision (default fp32, as in the Python API), ``-v`` works before or after the
command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_PRECISION = "fp32"  # the Python API's default too (galvatron_fx.plan / compile)


def default_precision(cluster) -> tuple[str, str]:
    """The commands' precision when none is asked: bf16 on accelerators that compute bf16 faster
    than fp32 (GPUs' tensor cores: what every recipe trains in), else fp32 (CPUs, and devices
    without a faster bf16); and the line that says which."""
    specs = list(cluster.device_specs.values())
    fast = all(not d.kind.lower().startswith("cpu") and
               d.peak_flops.get("bfloat16", 0.0) > d.peak_flops.get("float32", float("inf")) for d in specs)
    kinds = ", ".join(sorted({d.kind for d in specs}))
    if fast:
        return "bf16", (f"precision bf16 (mixed: fp32 masters), the default on {kinds}, whose bf16 peak is above "
                        "its fp32 one; --precision fp32 to change")
    return "fp32", f"precision fp32, the default on {kinds}; --precision bf16 to change"


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 2,4, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 such as 2,4, got {text!r}")
    return vals


def _checked(cast, ok, what: str):
    """An argparse type: ``cast(text)`` when ``ok`` holds for it, else an error saying ``what``."""
    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {repr(text) if v is None else v}")
        return v
    return parse


# a count that must be at least 1 (a batch, a sequence length, nodes, a degree)
positive_int = _checked(int, lambda v: 1 <= v <= 2**40, "a whole number >= 1")
# an amount that must be finite and above 0 (GiB of memory)
positive_float = _checked(float, lambda v: 0 < v < float("inf"), "a finite number > 0")


def batch_spec(text: str) -> int | str:
    """``--batch``: samples per step (``64``), ``auto`` (the largest batch that fits) or a range
    ``LO:HI`` (the fastest batch in it); the range stays text until the planner's AutoBatch
    reads it (:func:`galvatron_fx.search.auto_batch.AutoBatch.parse`)."""
    t = text.strip().lower()
    if t == "auto":
        return t
    lo, sep, hi = t.partition(":")
    try:
        vals = [int(t)] if not sep else [int(lo), int(hi)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a batch (64), auto, or a range such as 16:256, got {text!r}") from None
    if not all(1 <= v <= 2**30 for v in vals) or (sep and vals[0] > vals[1]):
        raise argparse.ArgumentTypeError(f"expected a batch of 1 to 2**30 samples (or a range LO:HI, LO <= HI), "
                                         f"got {text!r}")
    return vals[0] if not sep else f"{vals[0]}:{vals[1]}"


def _str_tuple(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _size(text: str) -> int:
    """A byte size: 4096, 4K, 1M, 64MiB."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = {"k": 2**10, "m": 2**20, "g": 2**30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if t[-1:] in "kmg" else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 4K, 1M or 64M, got {text!r}") from None


def add_model(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The model: a zoo name (positional), ``--hf-config`` or ``--model``; exactly one."""
    p.add_argument("zoo_name", nargs="?", metavar="MODEL",
                   help="a zoo model name (galvatron_fx.zoo.names(): gpt2-small, llama2-7b, ...)"
                        + (" (default: the run config's)" if optional else ""))
    p.add_argument("--hf-config", type=Path, default=None, metavar="PATH",
                   help="a Hugging Face config.json (or a directory holding one): the model is built from it "
                        "on the meta device, no weights, no download")
    p.add_argument("--model", dest="factory", default=None, metavar="MODULE:FUNCTION",
                   help="your own model: FUNCTION(batch_size=, seq_len=, device=) in an importable MODULE "
                        "returning (model, example_inputs)")


def add_shape(p: argparse.ArgumentParser, *, batch_help: str, auto: bool = False) -> None:
    if auto:
        batch_help += ("; auto: the largest that fits at once; LO:HI: the fastest in that range (gradient "
                       "accumulation allowed)")
    p.add_argument("--batch", type=batch_spec if auto else positive_int, default=None, help=batch_help)
    if auto:
        p.add_argument("--tokens-per-step", type=positive_int, default=None,
                       help="choose the global batch nearest this many tokens per optimizer step")
    p.add_argument("--seq", type=positive_int, default=None, help="sequence length (default: the model's)")


def add_cluster(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None,
                   help="cluster preset (dgx-a100-80g, dgx-h100, h200, rtx4090-pcie) or a cluster JSON file "
                        "(default dgx-a100-80g)")
    p.add_argument("--nodes", type=positive_int, default=None,
                   help="number of nodes of a preset (default 1; a cluster JSON describes its own)")


def add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", type=positive_float, default=None, help="memory budget per device in GiB (default: all)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="training precision (default: bf16 on devices whose bf16 peak is above their fp32 one, "
                        "GPUs; fp32 on CPUs)")
    p.add_argument("--max-tp", type=positive_int, default=None, help="cap the tensor-parallel degree")
    p.add_argument("--tp", type=_int_tuple, default=None, help="only these tensor-parallel degrees, e.g. 2 or 2,4")
    p.add_argument("--max-pp", type=positive_int, default=None, help="cap the pipeline degree")
    p.add_argument("--pp", type=_int_tuple, default=None, help="only these pipeline degrees, e.g. 1 or 1,2")
    p.add_argument("--reduce-dtypes", type=_str_tuple, default=None,
                   help="dtypes data-parallel gradients may be summed in, e.g. float32,bfloat16 (lossy below fp32; "
                        "default float32)")
    p.add_argument("--powersgd-ranks", type=_int_tuple, default=None,
                   help="PowerSGD ranks DDP gradient matrices may be compressed to, 0 for none, e.g. 0,4 (lossy; "
                        "default 0)")
    p.add_argument("--offload", choices=OFFLOAD_CHOICES, default=None,
                   help="CPU offload of optimizer steps (and ZeRO shards) to host memory: 'auto' where a stage fits "
                        "its devices no other way (default), 'never', or 'all' layers")
    p.add_argument("--host-memory", type=positive_float, default=None,
                   help="host memory offloaded layers may keep per node, in GiB (default: the nodes' host memory)")


OFFLOAD_CHOICES = ("auto", "never", "all")


def offload_space(choice: str | None) -> tuple[bool, ...]:
    """``SearchSpace.offload`` for an ``--offload`` choice (None: auto)."""
    return {"auto": (False, True), "never": (False,), "all": (True,)}[choice or "auto"]


def _inspect(p: argparse.ArgumentParser) -> None:
    add_model(p)
    add_shape(p, batch_help="batch size to capture at (default 1)")
    p.add_argument("--device", default="meta", help="device to build on (default meta: no memory)")
    p.add_argument("--json", type=Path, help="write layers (and nodes with --node-table) as JSON here")
    p.add_argument("--dot", type=Path, help="write a Graphviz graph with one cluster per layer here")
    p.add_argument("--node-table", action="store_true", help="also show the per-node table")


def _plan(p: argparse.ArgumentParser) -> None:
    add_model(p)
    add_cluster(p)
    add_shape(p, batch_help="global batch size (default: 8 per device)", auto=True)
    add_search(p)
    p.add_argument("--no-baselines", action="store_true", help="skip scoring the hand-written baselines")
    p.add_argument("--ilp-prices", action="store_true",
                   help="price tensor-parallel layers by the intra-layer ILP's estimate, not by their lowered "
                        "programs (faster; `galvatron-fx lower` then reports where the program differs)")
    p.add_argument("--out", type=Path, default=None, help="write the plan JSON here")
    p.add_argument("--layer", default=None, help="also explain this layer's choice against its alternatives")


def _lower(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--plan", type=Path, required=True, help="a plan JSON written by `galvatron-fx plan --out`")
    p.add_argument("--out", type=Path, required=True, help="the directory to write the program to")
    p.add_argument("--seq", type=positive_int, default=None, help="sequence length (default: the plan's)")


def _profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="also write the profile JSON here")
    p.add_argument("--sizes", nargs="+", type=_size, help="message sizes, e.g. 4K 1M 64M (default 4K..64M ×4)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed calls per size (median kept)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per size")
    p.add_argument("--group-sizes", nargs="+", type=int, help="group sizes (default: every divisor >= 2 of the world)")
    p.add_argument("--no-compute", action="store_true", help="skip matmul/attention/memory bandwidth")
    p.add_argument("--no-p2p", action="store_true", help="skip point-to-point and slow-link detection")
    p.add_argument("--cache-dir", help="cache directory (default $GFX_CACHE_DIR or ~/.cache/galvatron_fx)")
    p.add_argument("--reuse-cache", action="store_true", help="return the cached profile if the fingerprint matches")


def _export(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, metavar="CKPT", help="a checkpoint directory written by training "
                   "(galvatron_fx.runtime.checkpoint.save)")
    p.add_argument("--out", type=Path, default=None, help="write the model's weights as one .safetensors file")
    p.add_argument("--hf-dir", type=Path, default=None,
                   help="write a Hugging Face save_pretrained directory (needs --hf-config)")
    p.add_argument("--hf-config", type=Path, default=None, metavar="PATH",
                   help="the Hugging Face config.json the model was built from")
    p.add_argument("--overwrite", action="store_true", help="replace --out / --hf-dir if they exist")


def _train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, metavar="RUN.toml",
                   help="a TOML run config in sections ([model], [parallelism], [training], [optimizer], [data], "
                        "[checkpoint], [metrics]); --section.key VALUE overrides a key, and flags given here "
                        "override last")
    add_model(p, optional=True)
    p.add_argument("--data", default=None, metavar="TOKENS.bin|MODULE:FUNCTION",
                   help="a flat file of token ids (uint16/uint32, nanoGPT's train.bin; its last --val-fraction is "
                   "the validation split), or FUNCTION(step=, batch_size=, seq_len=) returning a batch (default: "
                   "the example batch)")
    p.add_argument("--data-dtype", choices=("uint16", "uint32"), default=None, help="the token file's ids (default uint16)")
    p.add_argument("--val-fraction", type=float, default=None, help="the token file's share held out (default 0.1)")
    p.add_argument("--init", default=None, metavar="hf:DIR",
                   help="start from a save_pretrained directory's weights (safetensors; its config.json is the "
                   "model unless --hf-config is given)")
    p.add_argument("--cluster", default=None, help="local-cpu (default), a preset or a cluster JSON")
    p.add_argument("--nodes", type=positive_int, default=None,
                   help="number of nodes of a preset, or of local-cpu (default: the agents torchrun started)")
    add_shape(p, batch_help="global batch size (default 2 per process)", auto=True)
    add_search(p)
    p.add_argument("--plan", type=Path, default=None, help="run this saved plan instead of searching")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 20)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-3)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default=None, help="optimizer (default adamw)")
    p.add_argument("--warmup", type=int, default=None, help="steps of linear learning-rate warmup (default 0)")
    p.add_argument("--schedule", choices=("cosine", "linear", "constant"), default=None,
                   help="learning rate after warmup, down to --min-lr at the last step (default constant)")
    p.add_argument("--min-lr", type=float, default=None, help="the schedule's last learning rate (default 0)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="decoupled weight decay on matrices, none on biases and norms (default 0)")
    p.add_argument("--max-norm", type=float, default=None, help="clip gradients to this global norm (default: no clip)")
    p.add_argument("--log-every", type=int, default=None, help="print a line every N steps on rank 0 (default 10)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="validation loss every N steps and at the end (default 0: never)")
    p.add_argument("--eval-batches", type=int, default=None, help="validation batches per evaluation (default 2)")
    p.add_argument("--seed", type=int, default=None, help="seed of the model's initialisation (default 0)")
    p.add_argument("--out", type=Path, default=None, help="where metrics.jsonl, plan.json, report.json go "
                   "(default runs/train)")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save (and resume from) a checkpoint here")
    p.add_argument("--checkpoint-every", type=int, default=None, help="also save every N steps")
    p.add_argument("--efficiency-every", type=int, default=None,
                   help="profile the third step and every N after it for compute density (default 10; 0: never)")


def _explain(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", type=Path, metavar="PLAN.json", help="a saved plan (galvatron-fx plan --out, plan.save)")
    p.add_argument("--layer", default=None, help="also explain this layer's choice against its alternatives")
    p.add_argument("--alternative", default=None, metavar="LABEL",
                   help="with --layer: compare against this alternative (a label such as tp4.zero3)")


def _report(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", type=Path, metavar="PLAN.json", help="a saved plan (galvatron-fx plan --out, plan.save)")
    p.add_argument("--run", type=Path, default=None, metavar="DIR",
                   help="a training run's --out directory (report.json, metrics.jsonl): predicted vs measured")
    p.add_argument("--out", type=Path, required=True, metavar="R.html", help="the HTML file to write")


# name -> (help, add_arguments, "module:function" that runs it)
COMMANDS = {
    "inspect": ("capture a model and show its layers, kinds and costs (tables, JSON, DOT)", _inspect,
                "galvatron_fx.cli.inspect:run_cli"),
    "profile": ("measure collectives, p2p links, matmul/attention throughput and overlap; fit the cluster model "
                "(under torchrun)", _profile, "galvatron_fx.cli.profile:run_cli"),
    "plan": ("search a hybrid-parallel plan for a model on a cluster and explain it", _plan,
             "galvatron_fx.cli.plan:run_cli"),
    "lower": ("lower a saved plan and dump the graphs it runs, and whether they match the plan", _lower,
              "galvatron_fx.cli.lower:run_cli"),
    "train": ("plan and train a model under torchrun, from flags or a TOML run config; writes metrics.jsonl",
              _train, "galvatron_fx.cli.train:run_cli"),
    "export": ("write a checkpoint's trained weights as safetensors or a Hugging Face directory", _export,
               "galvatron_fx.cli.export:run_cli"),
    "explain": ("explain a saved plan: its layers, stages and predictions; --layer: one layer's choice against "
                "its alternatives", _explain, "galvatron_fx.cli.plan:explain_cli"),
    "report": ("write a plan (and a training run's measurements) as one self-contained HTML page", _report,
               "galvatron_fx.cli.report:run_cli"),
}
