"""Why the search found no plan: the message :class:`~galvatron_fx.errors.PlanError` carries when
no (pp, m, schedule) point gave a plan.

Contract
    ``_why_none(search, points)`` reads a finished search (its space, global batch, world, the
    points it tried, the points rejected because no layer split fits, and the smallest memory any
    solved point needed) and returns one message that names the real constraint and what to try.

Terms
    *point*: one (pipeline degree, micro-batch count, schedule) of the outer search; *rejected*:
    a point where some layer had no strategy (its data-parallel degrees do not divide the samples
    of a micro-batch, or leave a tp it cannot use).

Algorithm
    No point at all: no pipeline degree, or no micro-batch count for any (reasons grouped by
    cause). Points, but every one rejected and none solved: the batch does not split over the
    data-parallel ranks (the smallest batch multiple that would). Otherwise: memory, with the
    smallest need found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from galvatron_fx.report.fmt import fmt_bytes
from galvatron_fx.search.candidates import allowed_tp

if TYPE_CHECKING:
    from galvatron_fx.search.outer_search import _Search


def _why_none(search: _Search, points: list) -> str:
    """The message when no point gave a plan, naming the real constraint: no micro-batch
    count for any pipeline degree, a batch that no data-parallel degree divides, or (only
    when some point was solved and was over budget) memory."""
    if not points:
        return _no_points(search)
    if search.rejected and not math.isfinite(search.smallest_need):
        return _indivisible(search)
    need = search.smallest_need
    if getattr(search, "hetero", False):  # each stage within its own devices' memory
        kinds = sorted(set(search.cluster.node_kinds))
        where = (f"{fmt_bytes(search.budget)} of tensors per device on the smallest device (each stage is held to "
                 "its own devices' memory" + (f" under the {fmt_bytes(search.device_budget)} budget" if
                                              search.device_budget < max(search.cluster.device_specs[k].memory_bytes
                                                                         for k in kinds) else "")
                 + ": " + ", ".join(f"{k} {fmt_bytes(search.cluster.device_specs[k].memory_bytes)}" for k in kinds)
                 + ", less the runtime's fixed reserve)")
    elif search.budget < search.device_budget:  # the device budget less the runtime's fixed reserve
        where = (f"{fmt_bytes(search.budget)} of tensors per device (the {fmt_bytes(search.device_budget)} budget "
                 "less the runtime's CUDA context, communicator buffers and allocator reserve"
                 + ("; these alone take all of it: raise the budget" if search.budget <= 1 else "") + ")")
    else:
        where = f"{fmt_bytes(search.budget)} per device"
    if search.host_bound:
        host = (f"; offloading to host memory would fit the devices but not the {fmt_bytes(search.host_budget)} "
                "host budget per rank: raise search.host_memory_budget")
    elif not search.offloads and True not in search.space.offload and search.can_offload:
        host = "; allow CPU offload (search offload=(False, True))"
    else:
        host = ""
    return (f"no plan fits in {where}"
            + (f": the smallest needs {fmt_bytes(need)}" if math.isfinite(need) else "")
            + "; allow recompute and sharded data parallelism (ZeRO-3), add devices or pipeline "
              "stages, or lower the global batch" + host)


def _no_points(search: _Search) -> str:
    gb, n = search.global_batch, len(search.layers)
    pps = search.pp_values()
    if not pps:
        asked = f"search.pp={search.space.pp}" if search.space.pp is not None else f"search.max_pp={search.space.max_pp}"
        fits = [p for p in range(1, min(search.world, n) + 1) if search.world % p == 0]
        return (f"no pipeline degree to search: {asked} leaves none that divides the world size {search.world} "
                f"and is at most the {n} layers; choose from {', '.join(map(str, fits))}")
    why: dict[str, list[str]] = {}
    for pp in pps:
        for sch in (search.space.schedules[:1] if pp == 1 else search.space.schedules):
            why.setdefault(_no_microbatches(search, pp, sch), []).append(f"pp={pp} {sch}")
    reasons = "; ".join(f"{', '.join(where)}: {reason}" for reason, where in why.items())
    if search.space.num_microbatches is not None:
        fix = ("give search.num_microbatches counts that divide the global batch (and are at least pp under "
               "1F1B), or drop it to let the search choose")
    else:
        fix = (f"raise the global batch to {min(pps)} or more (a multiple of pp × the data-parallel degree), "
               "lower the pipeline degree (search pp= or max_pp=), or add 'gpipe' to search.schedules (it runs "
               "fewer micro-batches than stages)")
    return f"no micro-batch count splits the global batch of {gb} at any pipeline degree searched ({reasons}); {fix}"


def _no_microbatches(search: _Search, pp: int, schedule: str) -> str:
    """Why ``m_values(pp, schedule)`` is empty."""
    gb, at_least_pp = search.global_batch, schedule != "gpipe"
    if search.space.num_microbatches is not None:
        return f"search.num_microbatches={tuple(search.space.num_microbatches)}: " + ", ".join(
            f"{m} does not divide {gb}" if gb % m else f"{m} < pp = {pp}" for m in search.space.num_microbatches)
    if at_least_pp and gb < pp:
        return f"the global batch {gb} is smaller than pp = {pp}, and 1F1B runs at least pp micro-batches"
    if at_least_pp and search.space.max_microbatches < pp:
        return f"search.max_microbatches = {search.space.max_microbatches} is below pp = {pp}"
    return f"no divisor of {gb} lies between {pp} and search.max_microbatches = {search.space.max_microbatches}"


def _indivisible(search: _Search) -> str:
    """Every point searched had a layer with no strategy: its data-parallel degrees do not
    divide the samples of a micro-batch, or those that do leave a tp the layer cannot use."""
    gb = search.global_batch
    seen: set[tuple[int, int]] = set()
    parts: list[str] = []
    multiple: int | None = None
    too_small = False
    for pp, m, e in search.rejected:
        if (pp, m) in seen or len(seen) == 3:
            continue
        seen.add((pp, m))
        tps = allowed_tp(search.space, e.devices, search.dpn)
        dps = sorted({e.devices // t for t in tps})
        fits = [d for d in dps if e.samples % d == 0]
        head = f"pp={pp}, {_n(m, 'micro-batch', 'micro-batches')} of {_n(e.samples, 'sample')}"
        if not fits:
            parts.append(f"{head}: the {e.devices} devices of a stage at tp {_few(tps)} leave data-parallel "
                         f"{_n(len(dps), 'degree', 'degrees', count=False)} {_few(dps)}, "
                         f"{'which does not divide' if len(dps) == 1 else 'none of which divides'} {e.samples}")
            multiple = multiple or m * dps[0]
        else:
            tp_left = [e.devices // d for d in fits]
            parts.append(f"{head}: only data-parallel {_n(len(fits), 'degree', 'degrees', count=False)} "
                         f"{_few(fits)} divide{'s' * (len(fits) == 1)} {e.samples}, which leaves layer {e.layer} "
                         f"tp {_few(tp_left)}, more ways than it can be split")
            too_small = True
            multiple = multiple or m * e.devices
    if too_small:
        head = f"the global batch of {gb} is too small for {search.world} devices"
        fix = (f"raise the global batch so that every data-parallel rank gets whole samples at a tensor-parallel "
               f"degree the layers can use (at tp = 1: a multiple of {multiple}), or plan for fewer devices")
    else:
        head = f"the global batch of {gb} does not split evenly over the data-parallel ranks"
        assert multiple is not None  # every rejected point sets it, and the caller has some
        fix = (f"use a global batch that is a multiple of {multiple} (e.g. {-(-gb // multiple) * multiple}), or "
               "let tensor parallelism or pipeline stages take more of the devices (search tp= / pp=)")
    return f"no plan: {head} ({'; '.join(parts)}); {fix}"


def _n(k: int, one: str, many: str | None = None, *, count: bool = True) -> str:
    """``1 sample``, ``3 samples`` (or only the word, without ``count``)."""
    word = one if k == 1 else (many or one + "s")
    return f"{k} {word}" if count else word


def _few(xs: Sequence[int], k: int = 6) -> str:
    """``2``, ``1, 2, 4`` or ``1, 2, 4, 5, 8, 10, … 1000000`` (the first ``k`` and the last)."""
    xs = list(xs)
    return ", ".join(map(str, xs)) if len(xs) <= k + 1 else ", ".join(map(str, xs[:k])) + f", … {xs[-1]}"
