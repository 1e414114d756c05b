"""Progress lines: a redrawn bar on a terminal, plain throttled lines in a log (no carriage returns)."""

from __future__ import annotations

import io

from galvatron_fx.report.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_at_most_one_per_tenth_and_the_last():
    out = io.StringIO()
    bar = Progress(100, True, title="profile", stream=out, every_s=1e9)
    for i in range(100):
        bar.step(f"job {i}")
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text
    assert lines[0].startswith("profile: 1/100") and lines[-1].startswith("profile: 100/100")
    assert 2 <= len(lines) <= 12, lines  # the first, one per tenth, the last


def test_a_terminal_gets_one_redrawn_line():
    out = _Tty()
    bar = Progress(3, True, title="search", stream=out)
    for i in range(3):
        bar.step(f"point {i}")
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1


def test_disabled_writes_nothing():
    out = io.StringIO()
    bar = Progress(5, False, stream=out)
    for _i in range(5):
        bar.step("x")
    assert out.getvalue() == "" and bar.done == 5
