"""galvatron_fx — automatic hybrid-parallel training for PyTorch, as a compiler over FX graphs."""

from galvatron_fx import zoo
from galvatron_fx.capture import capture
from galvatron_fx.cluster import Cluster
from galvatron_fx.errors import (CaptureError, ConfigError, GalvatronError, PlanError, PrecisionError,
                                 RankFailureError, UnsupportedModelError)
from galvatron_fx.ir import LayerInfo, LayerRole, LayerStrategy, ModelGraph, ParallelPlan
from galvatron_fx.api import compile
from galvatron_fx.passes.lower_program import lower
from galvatron_fx.search.candidates import SearchSpace
from galvatron_fx.search.planner import plan
from galvatron_fx import backend  # registers torch.compile(..., backend="galvatron_fx")

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "Cluster",
    "ConfigError",
    "GalvatronError",
    "LayerInfo",
    "LayerRole",
    "LayerStrategy",
    "ModelGraph",
    "ParallelPlan",
    "PlanError",
    "PrecisionError",
    "RankFailureError",
    "SearchSpace",
    "UnsupportedModelError",
    "capture",
    "compile",
    "lower",
    "plan",
    "zoo",
]
