"""Sane ranges for every number galvatron_fx takes from a user — in a plan file, a cluster file or
an argument of the planner — and the one JSON reader for such files.

Why: a number far outside what any machine has is never a measurement but a typo or an attack,
and the planner turns it into work or arithmetic that blows up far from the input (a
``world_size`` of 10^10 allocates a set of 10^10 ranks, a device memory of 10^40 bytes overflows
int64 in the search, a peak of 10^-300 FLOP/s predicts a step of 10^307 s). Each is refused where
it is read, with the field and its range named, before any work is done.

Ranges (both ends included)

=============================  ==========================  =============================================
what                           range                       why this bound
=============================  ==========================  =============================================
ranks, devices, degrees        1 .. 2**20 (1,048,576)      10x the largest clusters built; keeps
(world size, tp, dp, pp, ...)                              per-rank tables small
samples in a batch             1 .. 2**30                  a global batch beyond 10^9 samples is a typo
micro-batches                  1 .. 2**20                  the search loops over divisors up to it
device memory                  1 MiB .. 2**60 B (1 EiB)    int64 headroom for sums over stages
memory budget (planner)        1 B .. 2**60 B              (too small for any plan: the search says so)
bytes of a value (predictions) 0 .. 2**60
peak compute                   1e6 .. 1e21 FLOP/s          10^3 below a CPU core to 10^6 x an H100
memory bandwidth, link         1e6 .. 1e16 B/s             1 MB/s to 10^3 x HBM3e
bandwidth
latency, a collective's alpha  0 .. 10 s
a collective's beta            0 .. 1e-3 s/B               slower than 1 KB/s is not a link
overlap slowdown               1 .. 100
predicted times                0 .. 1e12 s                 (about 31,000 years)
JSON nesting                   64 levels                   plans and cluster files nest about 6 deep
=============================  ==========================  =============================================
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from galvatron_fx.errors import ConfigError

__all__ = [
    "BATCH", "BYTES", "BYTES_S", "DEGREE", "DEVICE_MEMORY", "FLOPS", "LATENCY_S", "MAX_JSON_DEPTH",
    "MICROBATCHES", "OVERLAP", "SECONDS", "SECONDS_PER_BYTE", "Range", "fmt_number", "load_json", "read_json", "read_text",
    "short_repr",
]

MAX_JSON_DEPTH = 64
MAX_TEXT_BYTES = 16 * 2**20  # a config file: a few KiB; a run config or report beyond 16 MiB is not one
MAX_MANIFEST_BYTES = 256 * 2**20  # a checkpoint manifest lists every tensor: a few MiB for the largest models


@dataclass(frozen=True)
class Range:
    """A closed interval ``[lo, hi]`` of sane values, in ``unit``; ``integer`` ones take ints only."""

    lo: float
    hi: float
    unit: str = ""
    integer: bool = False

    def __str__(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"[{_bound(self.lo)}, {_bound(self.hi)}]{unit}"

    def problem(self, v: Any) -> str | None:
        """What is wrong with ``v`` (``"must be ..., got ..."``), or None when it is sane."""
        if isinstance(v, bool) or not isinstance(v, int if self.integer else (int, float)):
            kind = "an integer" if self.integer else "a finite number"
            return f"must be {kind} in {self}, got {type(v).__name__} {short_repr(v)}"
        if isinstance(v, float) and not math.isfinite(v):
            return f"must be a finite number in {self}, got {v!r}"
        if not self.lo <= v <= self.hi:
            return f"= {fmt_number(v)} is outside its sane range {self}"
        return None

    def check(self, v: Any, field: str, hint: str = "") -> Any:
        """``v`` when sane, else a ``ConfigError`` naming ``field``, the range and ``hint``."""
        problem = self.problem(v)
        if problem is not None:
            raise ConfigError(f"{field} {problem}" + (f"; {hint}" if hint else ""))
        return v


DEGREE = Range(1, 2**20, "", integer=True)
BATCH = Range(1, 2**30, "samples", integer=True)
MICROBATCHES = Range(1, 2**20, "micro-batches", integer=True)
DEVICE_MEMORY = Range(2**20, 2**60, "bytes", integer=True)
BYTES = Range(0, 2**60, "bytes", integer=True)
FLOPS = Range(1e6, 1e21, "FLOP/s")
BYTES_S = Range(1e6, 1e16, "bytes/s")
LATENCY_S = Range(0, 10, "s")
SECONDS_PER_BYTE = Range(0, 1e-3, "s/byte")
OVERLAP = Range(1, 100)
FACTOR = Range(1, 10)
SECONDS = Range(0, 1e12, "s")


def _bound(x: float) -> str:
    """A range's end: ``2**20`` for a power of two."""
    if isinstance(x, int) and x >= 2**10 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return fmt_number(x)


def fmt_number(x: float) -> str:
    """A number short enough for a message: ``1e+21``, ``1.00e+40`` for a huge int."""
    if isinstance(x, int) and len(s := str(abs(x))) > 16:  # (too large for a float, perhaps)
        return f"{'-' if x < 0 else ''}{s[0]}.{s[1:3]}e+{len(s) - 1}"
    if isinstance(x, float) and x and not 1e-3 <= abs(x) < 1e6:
        return f"{x:.3g}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def short_repr(v: Any) -> str:
    """``repr(v)`` cut to 80 characters: a field may hold a whole (hostile) document."""
    r = fmt_number(v) if isinstance(v, int) and not isinstance(v, bool) else repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def read_text(path, *, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """The text of the file at ``path``, read without ever holding more than ``limit`` bytes (a
    path to ``/dev/zero`` or to a huge file is refused, naming it, instead of filling memory)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise
    except OSError as e:  # a directory, no permission, an I/O error: said as such
        raise ConfigError(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path}: larger than {limit // 2**20} MiB; this is not a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_json(path, *, what: str, limit: int = MAX_TEXT_BYTES, hint: str = "") -> Any:
    """The JSON file at ``path``, read bounded (:func:`read_text`) and parsed depth-capped
    (:func:`load_json`): every failure but a missing file a ``ConfigError`` naming it."""
    return load_json(read_text(path, what=what, limit=limit), f"{what} {str(path)!r}", hint=hint)


def load_json(text: str, source: str, *, hint: str = "") -> Any:
    """``json.loads(text)``, every failure a ``ConfigError`` naming ``source``: malformed text
    (with line and column), nesting deeper than :data:`MAX_JSON_DEPTH`, and what Python's parser
    itself refuses (integers of more than 4,300 digits, recursion)."""
    tail = f"; {hint}" if hint else ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source} is malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}{tail}") from None
    except RecursionError:
        raise ConfigError(f"{source} nests deeper than {MAX_JSON_DEPTH} levels (a plan or cluster file nests "
                          f"about 6){tail}") from None
    except ValueError as e:  # e.g. an integer literal too long to convert
        raise ConfigError(f"{source} holds a value Python cannot read: {e}{tail}") from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise ConfigError(f"{source} nests deeper than {MAX_JSON_DEPTH} levels (a plan or cluster file nests "
                          f"about 6){tail}")
    return data


def _depth(data: Any) -> int:
    """Nesting depth of parsed JSON (at most ``MAX_JSON_DEPTH + 1``), without recursion: a deep
    value must not exhaust the stack."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            if d <= MAX_JSON_DEPTH:  # deeper is refused anyway
                stack.extend((x, d + 1) for x in v)
    return deepest
