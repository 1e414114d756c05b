"""Shared test set-up. Keep imports light: torch is imported by the tests that need it."""

from __future__ import annotations

import os
import tempfile

# Tests are sized for 2 cores; one intra-op thread per process keeps spawned ranks from fighting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Profiles cached by a user's `galvatron-fx profile` must not change what the tests see.
os.environ["GFX_CACHE_DIR"] = tempfile.mkdtemp(prefix="gfx-test-cache-")

import sys
from pathlib import Path

# shared helpers (hf_tiny) import as top-level modules from unit and spawned distributed tests
sys.path.insert(0, str(Path(__file__).parent))
