"""Shared test fixtures. Keep imports light: torch is imported by the tests that need it."""

from __future__ import annotations

import os

# Tests are sized for 2 cores; one intra-op thread per process keeps spawned ranks from fighting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
