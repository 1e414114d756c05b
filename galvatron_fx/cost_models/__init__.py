"""Cost models: compute, communication, resharding, memory and pipeline schedules, behind one
``CostModel`` protocol (``galvatron_fx.cost_models.base``)."""

from galvatron_fx.cost_models.base import AnalyticCostModel, CostModel

__all__ = ["AnalyticCostModel", "CostModel"]
