"""Library warnings that repeat every step, shown once.

Contract: :func:`install` (idempotent; the runtime calls it on import) attaches :class:`Once` to
the loggers of DTensor's modules that warn from inside ops (a redistribution it cannot merge, the
RNG sync, a strategy search that falls back): each message is shown the first time it is logged
on the first rank (every rank runs the same ops, so every rank would print it, and again at every
step), and dropped after that. Messages are told apart by their format string, so the same
warning about other placements is one message.
"""

from __future__ import annotations

import logging

__all__ = ["Once", "install", "LOGGERS"]

# DTensor's modules whose warnings come from inside ops (torch 2.9–2.13)
LOGGERS = ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._random",
           "torch.distributed.tensor._utils", "torch.distributed.tensor._ops.single_dim_strategy",
           "torch.distributed.tensor._dispatch", "torch.distributed.tensor._sharding_prop")


class Once(logging.Filter):
    """Passes a message the first time, on the first rank only (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        if key in self.seen:
            return False
        self.seen.add(key)
        return _first_rank()


def _first_rank() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


_INSTALLED = Once()


def install() -> Once:
    """Attach the one :class:`Once` filter to :data:`LOGGERS` (once)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _INSTALLED not in logger.filters:
            logger.addFilter(_INSTALLED)
    return _INSTALLED
