"""Numbers and tables as the reports print them (imports nothing of galvatron_fx)."""

from __future__ import annotations


def fmt_count(x: float) -> str:
    """1234567 -> '1.23M'."""
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def fmt_bytes(x: float) -> str:
    """Bytes in binary units: 1536 -> '1.50 KiB'."""
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{int(x)} B"


def format_table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A plain-text table; ``align`` is one char per column, 'l' or 'r'."""
    align = align or "l" + "r" * (len(headers) - 1)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if a == "l" else str(c).rjust(w) for c, w, a in zip(cells, widths, align))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def fmt_seconds(s: float) -> str:
    """``12.34 ms`` below 10 s, ``12.34 s`` above."""
    return f"{s * 1e3:.2f} ms" if s < 10 else f"{s:.2f} s"
