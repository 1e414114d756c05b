"""Automatic global batch — the outer search's outermost loop: which global batch (and so which
micro-batch count) a plan trains with, when the user leaves it to the search.

Contract
    :class:`AutoBatch` says what the user allows (``global_batch_size="auto"`` is
    ``AutoBatch()``); :func:`search_batches` runs the plan search (``outer_search._Search``) over the
    candidate batches — a user's list of batches, or the ones an :class:`AutoBatch` allows — and
    returns the best point, its search (caches, statistics) and a record of every batch tried
    (``solver_stats["batch_search"]`` of the plan) with a sentence saying why the batch won (a
    plan note). Needs no processes; raises ``PlanError`` when no batch fits.

Terms
    *grid*: the batches considered, the multiples of ``multiple_of`` within ``[min_batch,
    max_batch]`` (with ``tokens_per_step``, also within the target's ``± tolerance`` in samples of
    the captured sequence length). Default step: the largest power of two dividing the world size
    (power-of-two data-parallel degrees then split every candidate evenly), in a bounded range at
    most an eighth of its width (rounded down to a power of two), so the grid keeps ~8 batches.
    *fits*: some point of the plan search (pipeline degree, micro-batches, per-layer strategies)
    holds every rank within the memory budget.
    *accumulation*: several micro-batches without a pipeline, their gradients summed before one
    optimizer step.

Algorithm
    ``objective="largest"`` (the default without a range or a target): the largest batch that
    fits at once — one micro-batch without a pipeline, the fewest the schedule allows with one
    (no gradient accumulation) — then the plan for it searched in full (there the pipeline may
    take more micro-batches, which only lowers memory). Memory grows with the batch, so whether
    a batch fits is monotone on the grid (divisibility aside): gallop ``q, 2q, 4q, …`` with a
    feasibility probe each (``_Search.fits``: the least memory of every stage, no DP), then bisect between
    the last batch that fits and the first that does not: ``O(log(max / q))`` probes.
    ``objective="throughput"`` (the default with ``max_batch``): the batch and micro-batch count
    with the highest predicted samples per second in the range, gradient accumulation allowed (a
    batch larger than memory holds at once still trains). Candidates: the top of the range and
    halvings down to its bottom, searched from the largest; each search only counts a plan
    faster than ``batch / best throughput so far`` (its lower bounds skip the points that cannot
    be), so a batch that cannot win costs little.
    ``objective="tokens"`` (the default with ``tokens_per_step``): the grid batch closest to the
    target (the faster of two equally close) that trains, accumulation allowed; farther batches
    within the tolerance only when a closer one fits no plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

from galvatron_fx.cluster import limits
from galvatron_fx.errors import ConfigError, PlanError

if TYPE_CHECKING:
    from galvatron_fx.ir.graph import ModelGraph

OBJECTIVES = ("largest", "throughput", "tokens")
_HINT = ('global_batch_size="auto" (the largest that fits), or AutoBatch(max_batch=...) (the fastest up to it), '
         'or AutoBatch(tokens_per_step=...) (the batch nearest a token target)')


@dataclass(frozen=True, kw_only=True)
class AutoBatch:
    """A global batch for the search to choose (module doc).

    ``objective``: ``"largest"`` — the largest batch that fits at once (no gradient
    accumulation); ``"throughput"`` — the highest predicted samples per second within the range,
    accumulation allowed; ``"tokens"`` — the batch closest to ``tokens_per_step``. Default:
    ``"tokens"`` with ``tokens_per_step``, ``"throughput"`` with ``max_batch``, else ``"largest"``.
    ``min_batch`` / ``max_batch``: the range in samples; ``tokens_per_step``: a target of tokens
    per optimizer step, the range then also within ``tokens_per_step × (1 ± tolerance)`` over the
    model's sequence length (the captured inputs' dim 1); ``multiple_of``: the batch grid
    (module doc for the default).
    """

    objective: str | None = None
    min_batch: int = 1
    max_batch: int | None = None
    tokens_per_step: int | None = None
    tolerance: float = 0.25
    multiple_of: int | None = None

    def __post_init__(self) -> None:
        for key in ("min_batch", "max_batch", "multiple_of"):
            if (v := getattr(self, key)) is not None:
                limits.BATCH.check(v, f"AutoBatch.{key}", "pass samples per optimizer step")
        if self.tokens_per_step is not None:
            limits.Range(1, 2**50, "tokens", integer=True).check(self.tokens_per_step, "AutoBatch.tokens_per_step")
        limits.Range(0, 0.99, "").check(self.tolerance, "AutoBatch.tolerance", "a fraction of the target, e.g. 0.25")
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise ConfigError(f"AutoBatch range [{self.min_batch}, {self.max_batch}] is empty: max_batch must be at "
                              "least min_batch")
        if self.objective is None:
            default = ("tokens" if self.tokens_per_step is not None else
                       "throughput" if self.max_batch is not None else "largest")
            object.__setattr__(self, "objective", default)
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"AutoBatch.objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.objective == "throughput" and not self.bounded:
            raise ConfigError("AutoBatch(objective='throughput') needs a bound: with gradient accumulation any batch "
                              "fits and a larger one is rarely slower per sample; pass max_batch= or "
                              "tokens_per_step=, or objective='largest' for the largest batch that fits at once")
        if self.objective == "tokens" and self.tokens_per_step is None:
            raise ConfigError("AutoBatch(objective='tokens') needs tokens_per_step=, the target per optimizer step")

    @property
    def bounded(self) -> bool:
        """Whether ``max_batch`` or a token target bounds the range."""
        return self.max_batch is not None or self.tokens_per_step is not None

    @classmethod
    def parse(cls, batch: int | str | None, tokens_per_step: int | None = None) -> int | AutoBatch | None:
        """The command line's and run config's batch: an int, ``"auto"``, ``"LO:HI"`` (the fastest
        batch in the range) and/or a tokens-per-step target; None when neither is given."""
        if tokens_per_step is not None:
            if batch is not None and batch != "auto":
                raise ConfigError(f"batch {batch!r} next to tokens_per_step {tokens_per_step}: give one of them "
                                  "(or batch = 'auto' with the target)")
            return cls(tokens_per_step=tokens_per_step)
        if isinstance(batch, str) and ":" in batch:
            lo, _, hi = batch.partition(":")
            try:
                return cls(min_batch=int(lo), max_batch=int(hi))
            except ValueError:
                raise ConfigError(f"batch {batch!r}: a range is LO:HI in samples, e.g. 16:256") from None
        if isinstance(batch, str):
            return cls.coerce(batch)
        return batch

    @classmethod
    def coerce(cls, value: Any) -> AutoBatch | None:
        """``"auto"``, an ``AutoBatch`` or a dict of its fields → an ``AutoBatch``; an int or a list
        of ints → None (the caller's batches); anything else a ``ConfigError``."""
        if isinstance(value, AutoBatch):
            return value
        if isinstance(value, str):
            if value != "auto":
                raise ConfigError(f"global_batch_size={value!r}: give an int, a list of ints, or {_HINT}")
            return cls()
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown:
                raise ConfigError(f"global_batch_size has unknown key(s) {', '.join(sorted(unknown))}: the keys are "
                                  f"{', '.join(f.name for f in fields(cls))}")
            return cls(**value)
        return None

    def range(self, world: int, tokens_per_sample: int | None) -> tuple[int, int, int]:
        """``(lo, hi, q)``: the grid's first and last batch and its step, for ``world`` devices
        (``ConfigError`` when the range holds no multiple of ``q``)."""
        lo, hi = self.min_batch, self.max_batch or cast(int, limits.BATCH.hi)  # (an integer range's bound)
        if self.tokens_per_step is not None:
            if not tokens_per_sample:
                raise ConfigError("AutoBatch.tokens_per_step needs token inputs of shape (batch, sequence) to count "
                                  "tokens per sample; give min_batch= and max_batch= in samples instead")
            target = self.tokens_per_step / tokens_per_sample
            lo = max(lo, math.ceil(target * (1 - self.tolerance)))
            hi = min(hi, math.floor(target * (1 + self.tolerance)))
        q = self.multiple_of or (world & -world)
        if not self.multiple_of and self.bounded and hi > lo:  # a bounded range keeps ~8 grid batches
            q = min(q, 1 << (max(1, (hi - lo) // 8).bit_length() - 1))
        first, last = -(-lo // q) * q, hi // q * q
        if first > last:
            what = f"{self.tokens_per_step} tokens per step ± {self.tolerance:.0%}" if self.tokens_per_step else "it"
            raise ConfigError(f"the automatic batch range [{lo}, {hi}] samples ({what}) holds no multiple of "
                              f"{q}: widen the range or the tolerance, or pass multiple_of=")
        return first, last, q


def tokens_per_sample(mg: ModelGraph) -> int | None:
    """The sequence length of the captured model: dim 1 of its first input when that input is
    (batch, sequence) token ids; None for other inputs (images, features)."""
    shapes = mg.example_shapes
    if not shapes or len(shapes[0]) != 2:
        return None
    return int(shapes[0][1])


@dataclass
class BatchResult:
    """What :func:`search_batches` found: the best point, the search that found it, the record
    of the batches tried (None for a single given batch) and the sentence saying why."""

    best: Any  # assemble_plan._Candidate
    search: Any  # outer_search._Search
    record: dict | None = None
    note: str | None = None


def search_batches(new_search, batches: list[int] | AutoBatch, world: int, mg: ModelGraph) -> BatchResult:
    """The best point over the given batches (the highest predicted throughput that fits), or the
    batch an :class:`AutoBatch` picks (module doc). ``new_search(batch, microbatches)`` makes a
    ``outer_search._Search`` for one global batch (``microbatches``: ``"pipeline"``, ``"accumulate"``
    or ``"fewest"``); all share the caller's option cache."""
    if not isinstance(batches, AutoBatch):
        return _throughput(new_search, batches, None, world, mg)
    if batches.objective == "largest":
        return _largest(new_search, batches, world, mg)
    if batches.objective == "tokens":
        return _tokens(new_search, batches, world, mg)
    lo, hi, q = batches.range(world, tokens_per_sample(mg))
    ladder, b = [], hi
    while b >= lo:  # the top and halvings down to the bottom, on the grid
        ladder.append(b)
        b = min(b - q, b // 2 // q * q)
    if ladder[-1] != lo:
        ladder.append(lo)
    return _throughput(new_search, ladder, batches, world, mg)


def _record(spec: AutoBatch, lo: int, hi: int, q: int, tried: list[dict]) -> dict:
    return {"objective": spec.objective, "range": [lo, hi], "multiple_of": q, "tokens_per_step": spec.tokens_per_step,
            "tried": tried}


def _fitted(gb: int, cand) -> dict:
    return {"batch": gb, "fits": True, "num_microbatches": cand.m, "step_time_s": cand.step_time_s,
            "throughput_samples_s": gb / cand.step_time_s}


def _throughput(new_search, batches: list[int], spec: AutoBatch | None, world: int, mg: ModelGraph) -> BatchResult:
    """The batch with the highest predicted samples per second; the largest is searched first and
    each later search only counts a plan that beats the best throughput so far."""
    best = best_search = None
    tried: list[dict] = []
    errors: list[PlanError] = []
    for gb in sorted(batches, reverse=True):
        s = new_search(gb, "accumulate")
        bound = gb / (best.samples * best.m / best.step_time_s) if best is not None else math.inf
        try:
            cand = s.run(bound)
        except PlanError as e:  # (only without a bound: nothing fits this batch)
            errors.append(e)
            tried.append({"batch": gb, "fits": False})
            continue
        if cand is None:
            tried.append({"batch": gb, "fits": None})  # fits or not, it cannot beat the best
            continue
        tried.append(_fitted(gb, cand))
        best, best_search = cand, s
    if best is None:
        raise errors[-1]  # the smallest batch's: the one closest to fitting
    if spec is None:
        return BatchResult(best, best_search)
    gb = best.samples * best.m
    lo, hi, q = spec.range(world, tokens_per_sample(mg))
    others = [t for t in tried if t["batch"] != gb]
    why = ", ".join(f"{t['batch']}: {t['throughput_samples_s']:.4g}/s" if t["fits"] else
                    f"{t['batch']}: {'no plan fits' if t['fits'] is False else 'cannot be faster'}" for t in others)
    note = (f"global batch {gb} in {best.m} micro-batch(es) chosen automatically: the highest predicted throughput "
            f"({gb / best.step_time_s:.4g} samples/s) of the batches tried in [{lo}, {hi}], multiples of {q}"
            + (f" ({why})" if why else ""))
    return BatchResult(best, best_search, _record(spec, lo, hi, q, tried), note)


def _tokens(new_search, spec: AutoBatch, world: int, mg: ModelGraph) -> BatchResult:
    """The grid batch closest to the token target that trains (the faster of two equally close)."""
    seq = tokens_per_sample(mg)
    lo, hi, q = spec.range(world, seq)
    seq = cast(int, seq)  # objective "tokens" has a target, and range() has then checked the sequence length
    target = cast(int, spec.tokens_per_step) / seq
    near = int(target) // q * q  # the 64 grid batches nearest the target, by distance
    by_distance: dict[float, list[int]] = {}
    for b in range(max(lo, near - 32 * q), min(hi, near + 32 * q) + 1, q):
        by_distance.setdefault(abs(b - target), []).append(b)
    tried: list[dict] = []
    error: PlanError | None = None
    for dist in sorted(by_distance):
        found = []
        for gb in by_distance[dist]:
            s = new_search(gb, "accumulate")
            try:
                cand = s.run()
            except PlanError as e:
                error = error or e
                tried.append({"batch": gb, "fits": False})
                continue
            tried.append(_fitted(gb, cand))
            found.append((gb / cand.step_time_s, gb, cand, s))
        if found:
            _, gb, best, s = max(found, key=lambda f: f[0])
            note = (f"global batch {gb} in {best.m} micro-batch(es) chosen automatically: {gb * seq} tokens per "
                    f"step, the multiple of {q} closest to the target of {spec.tokens_per_step}"
                    + (f" that fits (closer ones do not: {', '.join(str(t['batch']) for t in tried if not t['fits'])})"
                       if any(not t["fits"] for t in tried) else ""))
            return BatchResult(best, s, _record(spec, lo, hi, q, tried), note)
    raise cast(PlanError, error)  # every batch within the tolerance failed: the closest's reason


def _largest(new_search, spec: AutoBatch, world: int, mg: ModelGraph) -> BatchResult:
    """Gallop, bisect, then search the largest batch that fits in full (module doc)."""
    lo, hi, q = spec.range(world, tokens_per_sample(mg))
    tried: list[dict] = []

    def fits(gb: int) -> bool:
        ok = new_search(gb, "fewest").fits()
        tried.append({"batch": gb, "fits": ok})
        return ok

    good, bad = None, None
    b = lo
    while True:
        if fits(b):
            good = b
            if b == hi:
                break
            b = min(hi, 2 * b)
        else:
            bad = b
            break
    if good is None:  # not even the smallest at once: in more micro-batches, or the PlanError saying what fits
        s = new_search(lo, "accumulate")
        best = s.run()
        note = (f"global batch {lo} in {best.m} micro-batch(es) chosen automatically: the smallest of the range, "
                f"which fits only in more micro-batches than its pipeline needs (multiples of {q} from {lo})")
        return BatchResult(best, s, _record(spec, lo, hi, q, tried), note)
    while bad is not None and bad - good > q:  # largest good, smallest bad on the grid
        mid = (good + bad) // 2 // q * q
        if fits(mid):
            good = mid
        else:
            bad = mid
    s = new_search(good, "pipeline")  # (at once: no accumulation beyond the pipeline's micro-batches)
    best = s.run()
    limit = f"{bad} does not fit" if bad is not None else f"the range ends at {hi}"
    note = (f"global batch {good} in {best.m} micro-batch(es) chosen automatically: the largest that fits at once, "
            f"without gradient accumulation (multiples of {q} from {lo}; {limit})")
    return BatchResult(best, s, _record(spec, lo, hi, q, tried), note)
