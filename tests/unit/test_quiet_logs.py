"""DTensor's warnings from inside ops: shown once (per message, on the first rank), not every step."""

from __future__ import annotations

import logging

from galvatron_fx.runtime import quiet_logs


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record):
        self.said.append(record.getMessage())


def test_a_repeated_library_warning_is_shown_once():
    once = quiet_logs.install()
    assert quiet_logs.install() is once and once in logging.getLogger("torch.distributed.tensor._redistribute").filters
    keep = _Keep()
    names = ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._random", "galvatron_fx.test")
    for name in names:
        logging.getLogger(name).addHandler(keep)
    try:
        redistribute = logging.getLogger(names[0])
        for placements in ("(Shard(0),)", "(Shard(1),)", "(Replicate(),)"):  # every step, other placements
            redistribute.warning("redistribute from %s: %d ops cannot be merged (test-once)", placements, 2)
        for _ in range(3):
            logging.getLogger(names[1]).warning("DTensor is synchronizing RNG states (test)")
            logging.getLogger(names[2]).warning("mine")  # other loggers are left alone
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(keep)
    assert keep.said == ["redistribute from (Shard(0),): 2 ops cannot be merged (test-once)",
                         "DTensor is synchronizing RNG states (test)", "mine", "mine", "mine"], keep.said
