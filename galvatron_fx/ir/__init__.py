"""The intermediate representation: the captured graph, its layers and per-node facts."""

from galvatron_fx.ir.graph import LayerCosts, LayerInfo, LayerRole, ModelGraph, ParamInfo
from galvatron_fx.ir.meta import NodeFacts, facts

__all__ = ["LayerCosts", "LayerInfo", "LayerRole", "ModelGraph", "NodeFacts", "ParamInfo", "facts"]
