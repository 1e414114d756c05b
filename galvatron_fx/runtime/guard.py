"""What the ranks must agree on, and what happens when one stops answering.

- :func:`agree`: a check whose verdict may differ between ranks (a file read on one rank, a plan
  given per rank) is gathered first, so that every rank raises the same error and none is left
  waiting in a later collective for a peer that raised.
- :func:`set_timeout`: one limit for every collective of every process group this rank is in
  (the default group and the meshes' subgroups), instead of gloo's 30 minutes.
- :class:`StepGuard` around ``compile`` and each ``train_step``: a collective that fails (a peer
  timed out, or its connection closed) becomes a :class:`RankFailureError` on every surviving
  rank that names the ranks that stopped answering; and the batch every rank was given is
  compared on the first step and every ``check_every`` steps (one all-gather of a checksum),
  since galvatron_fx splits the global batch itself and different batches would train silently.

How a silent rank is named: each guarded section records its sequence number in the process
group's store (one ``set`` per step). A rank whose collective fails reads every rank's number
(a rank behind it never reached this section: stopped, or stuck before it, e.g. in its data
loader), posts its own failure, and waits a short grace (half the timeout, at most 5 s; 0.5 s
when the peer's connection closed) for the others' posts: ranks that neither reached the
section nor posted are the ones named. When the store itself does not answer, its host (rank 0,
unless torchrun's agent holds it) is named.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from galvatron_fx.errors import ConfigError, PlanError, RankFailureError

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT", "PLANNING_TIMEOUT", "StepGuard", "agree", "batch_signature", "guarded", "patience", "set_timeout", "timeout_of"]

DEFAULT_TIMEOUT = timedelta(minutes=5)
PLANNING_TIMEOUT = timedelta(minutes=30)  # how long the ranks wait for rank 0's plan search
_MAX_TIMEOUT = timedelta(days=7)
_PREFIX = "galvatron_fx"
# what a collective raises when a peer stopped (gloo, NCCL) or died (its socket closed)
_PEER_FAILURE = re.compile(r"timed out|timeout|(closed|reset) by peer|connection (closed|reset)|broken pipe|"
                           r"communicator was aborted", re.IGNORECASE)
_CLOSED = re.compile(r"(closed|reset) by peer|connection (closed|reset)|broken pipe", re.IGNORECASE)

_state: dict[str, Any] = {"timeout": None, "groups": 0, "seq": 0}


# ---- agreement -----------------------------------------------------------------------------

def agree(problem: str | None, error: type[Exception] = PlanError) -> None:
    """Gather every rank's ``problem`` (None: fine); if any rank has one, raise ``error`` on every
    rank naming which ranks found what. Collective over the default group."""
    if not (dist.is_available() and dist.is_initialized()):
        if problem:
            raise error(problem)
        return
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    found: dict[str, list[int]] = {}
    for r, p in enumerate(problems):
        if p:
            found.setdefault(p, []).append(r)
    if not found:
        return
    if len(found) == 1 and len(next(iter(found.values()))) == len(problems):
        raise error(next(iter(found)))
    raise error("; ".join(f"{_ranks(rs)}: {p}" for p, rs in found.items()))


def _ranks(rs: Sequence[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


# ---- timeouts ------------------------------------------------------------------------------

def timeout_of(value: Any) -> timedelta:
    """``value`` (seconds, a ``timedelta``, or None for :data:`DEFAULT_TIMEOUT`) as a timedelta
    within 1 s .. 7 days; else ``ConfigError``."""
    if value is None:
        return DEFAULT_TIMEOUT
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 1 <= seconds <= _MAX_TIMEOUT.total_seconds():
        raise ConfigError(f"timeout must be a number of seconds (or a datetime.timedelta) between 1 s and 7 days, "
                          f"got {value!r}; the default is {DEFAULT_TIMEOUT.total_seconds():.0f} s")
    return timedelta(seconds=float(seconds))


def _groups() -> list[dist.ProcessGroup]:
    from torch.distributed import distributed_c10d as c10d

    return [pg for pg in list(c10d._world.pg_map) if not c10d._rank_not_in_group(pg)]


def set_timeout(timeout: Any = None) -> timedelta:
    """Limit every collective of every process group this rank is in (and groups created later,
    as :class:`StepGuard` sections start) to ``timeout`` (see :func:`timeout_of`). Local."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    t = timeout_of(timeout)
    _state["timeout"] = t
    groups = _groups()
    for pg in groups:
        try:
            _set_pg_timeout(t, pg)
        except (ValueError, AssertionError, RuntimeError) as e:  # a backend without timeouts (fake)
            log.debug("no timeout for group %s: %s", pg, e)
    _state["groups"] = len(groups)
    store = _store()
    if store is not None:  # a store whose host stopped must not block a step longer either
        store.set_timeout(t)
    return t


@contextmanager
def patience(at_least: timedelta) -> Iterator[None]:
    """Collectives wait at least ``at_least`` inside (for one rank's long local work, such as
    the plan search while the others wait for its broadcast), the set timeout again after."""
    before = _state["timeout"]
    if before is None or before >= at_least:
        yield
        return
    set_timeout(at_least)
    try:
        yield
    finally:
        set_timeout(before)


def _current_timeout() -> timedelta:
    return _state["timeout"] or DEFAULT_TIMEOUT


def _refresh_timeouts() -> None:
    """Groups made since the last :func:`set_timeout` (a mesh built lazily) get the same limit."""
    if _state["timeout"] is not None and len(_groups()) != _state["groups"]:
        set_timeout(_state["timeout"])


# ---- batches -------------------------------------------------------------------------------

def _checksum(t: torch.Tensor) -> int:
    """An exact integer checksum of ``t``'s bytes (position-weighted, so that a permutation of
    the samples changes it), computed where ``t`` lives."""
    t = t.detach().contiguous().reshape(-1)
    if t.numel() == 0:
        return 0
    raw = t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)
    if raw.numel() % 4 == 0:
        raw = raw.view(torch.int32)
    v = raw.to(torch.int64)
    w = torch.arange(v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
    return int((v * w).sum().item())


def batch_signature(tensors: Sequence[Any], names: Sequence[str], *, values: bool = True) -> list[tuple]:
    """``(name, shape, dtype, checksum)`` of each tensor input of a batch (``values=False``: no
    checksum, the signature of a rank's share in ``inputs="local"`` mode)."""
    return [(n, tuple(t.shape), str(t.dtype).removeprefix("torch."), _checksum(t) if values else None)
            for n, t in zip(names, tensors) if isinstance(t, torch.Tensor)]


def _batch_problem(sigs: list[list[tuple] | None], step: int, *, values: bool = True, mode: str = "local") -> str | None:
    given = [(r, s) for r, s in enumerate(sigs) if s is not None]
    if len(given) < 2:
        return None
    r0, ref = given[0]
    differ = [(r, s) for r, s in given[1:] if s != ref]
    if not differ:
        return None
    r, s = differ[0]
    what = "a different set of inputs"
    for a, b in zip(ref, s):
        if a[0] != b[0]:
            break
        if a[1:3] != b[1:3]:
            what = f"input {a[0]!r} of shape {list(b[1])} {b[2]} (rank {r0}: {list(a[1])} {a[2]})"
            break
        if a[3] != b[3]:
            what = f"other values of input {a[0]!r} (shape {list(a[1])}, checksum {b[3]} vs {a[3]})"
            break
    if not values:
        return (f"the ranks were given batches of different shapes at step {step}: {_ranks([x for x, _ in differ])} "
                f"got {what} than rank {r0}. " + (
                    "With inputs='rank' every rank passes its own samples (global_batch_size / world size of them, "
                    "as under DistributedDataParallel), all of one shape" if mode == "rank" else
                    "With inputs='local' every rank passes its share of the global batch (global_batch_size / "
                    "pm.data_parallel_size samples, pm.sampler(dataset) picks them), all of one shape"))
    return (f"the ranks were given different batches at step {step}: {_ranks([x for x, _ in differ])} got {what} "
            f"than rank {r0}. galvatron_fx splits each global batch itself: give every rank the same global "
            "batch, in the same order (the same data seed; no DistributedSampler), or compile with "
            "inputs='local' and give each rank its share")


# ---- the guard -----------------------------------------------------------------------------

class StepGuard:
    """Guards the collective sections of one module (``compile``, each ``train_step``); see the
    module docstring. ``check_every``: steps between batch comparisons (0: never)."""

    def __init__(self, *, check_every: int = 100) -> None:
        self.check_every = check_every
        self.steps = 0
        self.values = True  # compare the batches' values (False: shapes and dtypes, every step)
        self.mode = "global"  # the module's inputs mode (what a mismatch message tells to pass)

    @contextmanager
    def section(self, where: str, batch: tuple[Sequence[Any], Sequence[str]] | None = None, *,
                check: bool = False) -> Iterator[None]:
        """A collective section named ``where``. ``batch``: ``(tensors, names)`` this rank was
        given (None: it reads none); ``check``: compare it across ranks now."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "fake":
            yield
            return
        _refresh_timeouts()
        _state["seq"] += 1
        seq = _state["seq"]
        store = _store()
        if store is not None:
            try:
                store.set(f"{_PREFIX}/seq/{dist.get_rank()}", f"{seq}:{where}")
            except Exception as e:  # the store's host is gone: the collectives will say so
                log.debug("could not record section %d: %s", seq, e)
        try:
            if check:
                sig = None if batch is None else batch_signature(*batch, values=self.values)
                sigs: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(sigs, sig)
                agree_problem = _batch_problem(sigs, self.steps, values=self.values, mode=self.mode)
                if agree_problem:
                    raise ConfigError(agree_problem)
            yield
        except RankFailureError:
            raise
        except (RuntimeError, dist.DistError) as e:
            if not _PEER_FAILURE.search(str(e)):
                raise
            raise _diagnose(e, seq, where) from e

    def step(self, batch: tuple[Sequence[Any], Sequence[str]] | None) -> Any:
        """The section of the next training step (its batch compared on the first step and every
        ``check_every``-th)."""
        self.steps += 1
        check = not self.values or self.check_every > 0 and (self.steps == 1 or self.steps % self.check_every == 0)
        return self.section(f"train_step {self.steps}", batch, check=check)


def guarded(where: str):
    """Decorate a collective function: run it as a :class:`StepGuard` section named ``where``."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with StepGuard().section(where):
                return fn(*args, **kwargs)
        return run
    return wrap


def _store():
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # no store to write to (a fake or custom group)
        return None


def _diagnose(e: BaseException, seq: int, where: str) -> RankFailureError:
    """The error naming the ranks that stopped answering when this rank's collective of section
    ``seq`` failed with ``e`` (see the module docstring)."""
    me, world = dist.get_rank(), dist.get_world_size()
    timeout = _current_timeout()
    closed = bool(_CLOSED.search(str(e))) and "timed out" not in str(e).lower()
    grace = 0.5 if closed else min(5.0, timeout.total_seconds() / 2)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    head = f"rank {me}, in {where}: a collective failed ({first[:200]})"
    tail = (f" Every surviving rank stops with this error: resume from the last checkpoint. Collectives wait "
            f"{timeout.total_seconds():g} s (galvatron_fx.compile(..., timeout=seconds)); raise it if a step "
            "or a data loader can legitimately take longer.")
    store = _store()
    if store is None:
        return RankFailureError(head + "." + tail)
    try:
        store.set_timeout(timedelta(seconds=max(1.0, grace)))
        store.set(f"{_PREFIX}/failed/{seq}/{me}", where)
        reached: dict[int, tuple[int, str]] = {}
        for r in range(world):
            key = f"{_PREFIX}/seq/{r}"
            n, _, name = (store.get(key).decode() if store.check([key]) else "0:nothing").partition(":")
            reached[r] = (int(n), name)
        behind = sorted(r for r in range(world) if r != me and reached[r][0] < seq)
        posted = {me}
        deadline = time.monotonic() + (0.0 if behind else grace)
        while True:
            posted |= {r for r in range(world) if r not in posted and store.check([f"{_PREFIX}/failed/{seq}/{r}"])}
            if len(posted) == world or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    except Exception as se:  # the store does not answer either
        return RankFailureError(
            f"{head}; the rendezvous store does not answer either ({type(se).__name__}): its host (rank 0, unless "
            "torchrun's agent holds it) has probably stopped or died." + tail)
    finally:
        with contextlib.suppress(Exception):  # already reported above
            store.set_timeout(timeout)
    silent = behind or sorted(set(range(world)) - posted)
    if not silent:
        return RankFailureError(f"{head}; every rank reports a failed collective in this section (a network "
                                "fault, or a peer that restarted)." + tail)
    if behind:
        detail = "; ".join(f"rank {r} never started it (the last it started: {reached[r][1]})" for r in behind[:8])
        why = "its connection closed: it died" if closed else \
            "it stopped, or is stuck before this step (e.g. in its data loader)"
    else:
        detail = f"{_ranks(silent[:8])} started it too but did not answer within {grace:g} s"
        why = "its connection closed: it died" if closed else "it is stopped, hung, or dead"
    return RankFailureError(f"{head}: {_ranks(silent[:8])} stopped answering — {detail}; {why}." + tail)
