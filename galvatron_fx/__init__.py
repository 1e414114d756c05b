"""galvatron_fx — automatic hybrid-parallel training for PyTorch, as a compiler over FX graphs.

The names below are imported on first use, so ``import galvatron_fx`` (and the command line's
``--help``) does not import torch. ``torch.compile(model, backend="galvatron_fx")`` finds the
backend through the package's ``torch_dynamo_backends`` entry point.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from galvatron_fx.frontend.capture import capture as capture

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "AutoBatch": "galvatron_fx.search.auto_batch",
    "CaptureError": "galvatron_fx.errors",
    "ConfigError": "galvatron_fx.errors",
    "GalvatronError": "galvatron_fx.errors",
    "PlanError": "galvatron_fx.errors",
    "PrecisionError": "galvatron_fx.errors",
    "RankFailureError": "galvatron_fx.errors",
    "UnsupportedModelError": "galvatron_fx.errors",
    "Cluster": "galvatron_fx.cluster.spec",
    "GradComm": "galvatron_fx.ir.grad_comm",
    "LayerInfo": "galvatron_fx.ir",
    "LayerRole": "galvatron_fx.ir",
    "LayerStrategy": "galvatron_fx.ir",
    "ModelGraph": "galvatron_fx.ir",
    "ParallelPlan": "galvatron_fx.ir",
    "SearchSpace": "galvatron_fx.search.search_space",
    "capture": "galvatron_fx.frontend.capture",
    "compile": "galvatron_fx.api",
    "lower": "galvatron_fx.passes.lower_program",
    "plan": "galvatron_fx.search.planner",
    "price_plan": "galvatron_fx.search.price_plan",
    "refit": "galvatron_fx.search.refit",
    "Observations": "galvatron_fx.runtime.observe",
}

__all__ = sorted([*_EXPORTS, "zoo"])


def __getattr__(name: str):
    if name == "zoo":
        return importlib.import_module("galvatron_fx.zoo")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'galvatron_fx' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    setattr(sys.modules[__name__], name, value)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

