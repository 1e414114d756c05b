"""The solved placement of one layer kind: the record the solver makes and the runtime executes.

Contract: :class:`LayerOption` is what :func:`galvatron_fx.search.intra_layer.solve_intra_layer`
returns for one layer kind at one tensor-parallel degree and sequence-parallel mode, and what
:class:`~galvatron_fx.runtime.layer_exec.LayerExecutor` runs: one placement string per node of
the decomposed layer (:mod:`galvatron_fx.passes.decompose_layer`; the format:
:mod:`galvatron_fx.ir.placements`), the predicted times, and the redistributions it performs
(:class:`CommEvent`). Both are frozen records; they depend on nothing but ``ir``.

Terms: times are per micro-batch at the captured batch, on one rank, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from galvatron_fx.ir.strategy import SPMode

__all__ = ["CommEvent", "LayerOption"]


@dataclass(frozen=True)
class CommEvent:
    """One redistribution the plan performs: forward or backward, of which value."""

    direction: str  # "fwd" | "bwd"
    value: str
    collective: str  # all_reduce, all_gather, reduce_scatter, all_to_all
    nbytes: int  # at the captured batch (CommModel's convention: the full tensor)
    time_s: float
    per_sample: bool = True  # bytes scale with the micro-batch (False: a parameter or its gradient)


@dataclass(frozen=True)
class LayerOption:
    """The solved placement of one layer kind at one tensor-parallel degree and SP mode.

    Times are per micro-batch at the captured batch, one rank; ``param_fraction`` and
    ``activation_fraction`` say how much of the layer's parameters and saved activations one
    rank keeps (1/tp for a fully sharded layer).
    """

    kind: str
    tp: int
    sp: SPMode
    placements: dict[str, str]  # decomposed node name -> "in1,in2->out1,out2"
    compute_s: float
    compute_ratio: float  # compute_s / the same layer unpartitioned: the share one rank does
    comm_fwd_s: float
    comm_bwd_s: float
    param_fraction: float
    activation_fraction: float
    comm: tuple[CommEvent, ...]
    input_layout: tuple[str, ...]  # placement of each external activation input
    output_layout: tuple[str, ...]
    objective_s: float
    solve_s: float
    num_variables: int
    labels: dict[str, str] = field(default_factory=dict)  # node -> readable name (decompose_layer.node_labels)

    def collectives(self, direction: str = "fwd") -> list[str]:
        return sorted(e.collective for e in self.comm if e.direction == direction)
