"""Runtime: execute a :class:`~galvatron_fx.ir.plan.ParallelPlan` with PyTorch's own engines.

``layer_exec`` runs one planned layer on a ``(dp, tp)`` device mesh with DTensor, redistributing
exactly where the intra-layer plan says (see DESIGN §5).
"""
