"""The intermediate representation: the captured graph, its layers, per-node facts, strategies
and the plan."""

from galvatron_fx.ir.graph import LayerCosts, LayerInfo, LayerRole, ModelGraph, ParamInfo
from galvatron_fx.ir.meta import NodeFacts, facts
from galvatron_fx.ir.plan import (
    SCHEMA_VERSION,
    Alternative,
    LayerPlan,
    LayerPrediction,
    ParallelPlan,
    PlanPrediction,
    cluster_hash,
    graph_hash,
)
from galvatron_fx.ir.strategy import DPType, LayerStrategy, Precision, SPMode

__all__ = [
    "SCHEMA_VERSION", "Alternative", "DPType", "LayerCosts", "LayerInfo", "LayerPlan", "LayerPrediction",
    "LayerRole", "LayerStrategy", "ModelGraph", "NodeFacts", "ParallelPlan", "ParamInfo", "PlanPrediction",
    "Precision", "SPMode", "cluster_hash", "facts", "graph_hash",
]
