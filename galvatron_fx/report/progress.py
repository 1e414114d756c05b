"""Progress of a long job (profiling, the search) on a stream, fit for a terminal and for a log.

Contract: :class:`Progress` counts ``total`` steps. On a terminal (the stream's ``isatty()``) it
redraws one line with a carriage return; anywhere else (a log file, a pipe, CI) it writes plain
lines — the first step, then at most one line per ``every_s`` seconds or per tenth of the job,
and the last — so that a log holds no ``\\r`` and does not grow by a line per step. Disabled, it
writes nothing. A leaf module: it imports nothing of the package.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """A progress line for ``total`` steps named ``title`` on ``stream`` (default stderr)."""

    def __init__(self, total: int, enabled: bool, title: str = "profile", *, stream: TextIO | None = None,
                 every_s: float = 5.0) -> None:
        self.total, self.done, self.enabled, self.t0 = max(total, 1), 0, enabled, time.perf_counter()
        self.title = title
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self._last_s = -float("inf")  # when a plain line was last written
        self._last_tenth = -1

    def step(self, label: str) -> None:
        """One more step done; ``label`` says what it was."""
        self.done += 1
        if not self.enabled:
            return
        el = time.perf_counter() - self.t0
        last = self.done >= self.total
        if self.tty:
            bar = "#" * int(30 * min(self.done, self.total) / self.total)
            self.stream.write(f"\r{self.title} [{bar:<30}] {self.done}/{self.total} {el:5.1f}s {label:<40.40}")
            if last:
                self.stream.write("\n")
        else:
            tenth = 10 * min(self.done, self.total) // self.total
            if not (self.done == 1 or last or el - self._last_s >= self.every_s or tenth > self._last_tenth):
                return
            self.stream.write(f"{self.title}: {self.done}/{self.total} ({el:.1f} s) {label}\n")
            self._last_s, self._last_tenth = el, tenth
        self.stream.flush()
