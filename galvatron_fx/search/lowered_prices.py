"""What a layer's lowered program issues and keeps, for the search to price: its collectives, its
saved activations, the transient of its backward; and the data-parallel collectives inside a
loss's graphs.

Contract: :func:`lowered_price` lowers one layer under a solved option (None: unsharded) on a
``(1, tp)`` mesh of the stand-in process group (:func:`galvatron_fx.passes.lower_program.lower_layer`,
the passes the runtime's program is made by) at the captured batch, and returns a
:class:`LoweredPrice`; :func:`dp_collectives` lowers a layer unsharded on a ``(2, 1)`` mesh and
returns the collectives its graphs issue over dp. Both are cached per (layer kind, shapes,
option) and return None when this process already has a real process group (no stand-in can be
made then: the ILP's estimate stays), the layer cannot be lowered, or (the dp probe) the captured
batch is odd (it cannot be split over two ranks). Nothing is sent anywhere.

Why: the intra-layer ILP fixes the forward placements and prices the backward with one rule;
DTensor's backward and its losses do more (a replicated weight's partial gradient all-reduced
per use, a loss's normaliser summed over dp). The lowered graphs say exactly what runs.

Terms: a collective is *per sample* when its bytes scale with the micro-batch (not a parameter,
its gradient or a scalar); bytes at the captured batch, on one rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.layer_option import CommEvent, LayerOption
from galvatron_fx.ir.plan_records import CollectiveRecord
from galvatron_fx.ir.strategy import DPType, LayerStrategy
from galvatron_fx.passes.apply_placements import option_from_plan
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer
from galvatron_fx.passes.measure_lowered import backward_transient_bytes, comm_events, saved_bytes

log = logging.getLogger(__name__)

__all__ = ["LoweredPrice", "dp_collective_records", "dp_collectives", "lowered_price", "tp_collectives"]


@dataclass(frozen=True)
class LoweredPrice:
    """One layer's lowered program on one rank at the captured batch (see module doc)."""

    comm: tuple[CommEvent, ...]  # forward ("fwd") and backward ("bwd") collectives, in order
    saved_bytes: int
    bwd_transient_bytes: int


_CACHE: dict[tuple, Any] = {}  # a LoweredPrice, a dp probe's collectives, or None


def _stand_in_available() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_backend() == "fake"


def _lowered(mg: ModelGraph, layer: LayerInfo, option: LayerOption | None, dl: DecomposedLayer, dp: int,
             compute_dtype):
    from galvatron_fx.passes.lower_program import fake_mesh, lower_layer

    if option is None:
        # (tp = 1 and no placements: every node is named, so an option comes back)
        option = cast(LayerOption, option_from_plan(dl, layer.kind, LayerStrategy(), {}))
    return lower_layer(mg, layer, option, LayerStrategy(tp=option.tp, sp=option.sp), fake_mesh(dp, option.tp),
                       decomposed=dl, compute_dtype=compute_dtype)


def lowered_price(mg: ModelGraph, layer: LayerInfo, option: LayerOption | None, *,
                  decomposed: DecomposedLayer | None = None, compute_dtype=None) -> LoweredPrice | None:
    """``layer``'s lowered collectives, saved bytes and backward transient under ``option``
    (None: unsharded, tp = 1) (see module doc); ``compute_dtype``: mixed precision's."""
    key = ("price", layer.kind, tuple(tuple(s) for s in mg.example_shapes), str(compute_dtype),
           None if option is None else (option.tp, str(option.sp), tuple(sorted(option.placements.items()))))
    if key in _CACHE:
        return _CACHE[key]
    if not _stand_in_available():
        return None
    try:
        lg = _lowered(mg, layer, option, decomposed or decompose_layer(mg, layer), 1, compute_dtype)
        res = LoweredPrice(comm=comm_events(lg), saved_bytes=saved_bytes(lg), bwd_transient_bytes=backward_transient_bytes(lg))
    except Exception as e:  # a layer the lowering cannot trace on fake tensors: the ILP's pricing stays
        log.warning("lowering %s (%s) failed (%s: %s); keeping the ILP's estimate", layer.name,
                    "tp=1" if option is None else f"tp={option.tp} sp={option.sp}", type(e).__name__, e)
        res = None
    _CACHE[key] = res
    return res


def dp_collectives(mg: ModelGraph, layer: LayerInfo, *, decomposed: DecomposedLayer | None = None,
                   compute_dtype=None) -> tuple[CommEvent, ...] | None:
    """The collectives ``layer``'s own graphs issue over dp (unsharded on tp), as at dp = 2: a
    loss's normaliser, say (see module doc)."""
    key = ("dp", layer.kind, tuple(tuple(s) for s in mg.example_shapes), str(compute_dtype))
    if key in _CACHE:
        return _CACHE[key]
    if not _stand_in_available() or not mg.example_shapes or not mg.example_shapes[0] \
            or mg.example_shapes[0][0] % 2:
        return None  # (a batch of one cannot be split over two ranks: the loss's own collectives are unpriced)
    try:
        lg = _lowered(mg, layer, None, decomposed or decompose_layer(mg, layer), 2, compute_dtype)
        res = comm_events(lg)
    except Exception as e:
        log.warning("lowering %s on a data-parallel mesh failed (%s: %s)", layer.name, type(e).__name__, e)
        res = None
    _CACHE[key] = res
    return res


# ---- the records a priced choice keeps (LayerPlan.collectives) ----------------------------------

def _record(phase: str, op: str, group_size: int, nbytes: int, axis: str) -> CollectiveRecord:
    return CollectiveRecord(phase=phase, op=str(op), group_size=int(group_size), bytes=int(nbytes), axis=axis)


def tp_collectives(events, frac: float, tp: int, *, again_fwd: bool, axis: str = "tp") -> tuple[CollectiveRecord, ...]:
    """The tensor-parallel collectives priced per micro-batch (see :func:`galvatron_fx.search.choice_costs.comm_s`); a
    recomputed forward's again, in backward; ``axis``: the mesh axis they run on (a loss's own
    data-parallel reductions: ``"dp"``)."""
    out = []
    for e in events:
        nbytes = int(e.nbytes * frac) if e.per_sample else e.nbytes
        out.append(_record(e.direction, e.collective, tp, nbytes, axis))
        if again_fwd and e.direction == "fwd":
            out.append(_record("bwd", e.collective, tp, nbytes, axis))
    return tuple(out)


def dp_collective_records(dpt: DPType, dp: int, gather_bytes: int, reduce_bytes: int, grad_bytes: int) -> tuple[CollectiveRecord, ...]:
    """The data-parallel collectives priced: FSDP's per micro-batch (:func:`galvatron_fx.search.choice_costs.fsdp_comm_s`), or
    a DDP layer's gradients in the stage's buckets once per step."""
    if dp <= 1:
        return ()
    if dpt == DPType.DDP:
        return (_record("step", "all_reduce", dp, grad_bytes, "dp"),) if grad_bytes else ()
    if not gather_bytes:
        return ()
    out = [_record("fwd", "all_gather", dp, gather_bytes, "dp")]
    if dpt == DPType.ZERO3:
        out.append(_record("bwd", "all_gather", dp, gather_bytes, "dp"))
    out.append(_record("bwd", "reduce_scatter", dp, reduce_bytes, "dp"))
    return tuple(out)
