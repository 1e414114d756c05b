"""This host: the facts a hardware profile or a calibration is keyed by, and where they are cached.

Contract: plain functions of the running machine (no process group, no torch import except
``fingerprint_fields``'s default torch version). A *fingerprint* is the first 16 hex digits of the
SHA-256 of the JSON of its fields (sorted keys): ``make_fingerprint(fingerprint_fields(...))``
for a hardware profile, the same hash of other fields for a calibration. The *cache directory*
is ``cache_dir``, else ``$GFX_CACHE_DIR``, else ``~/.cache/galvatron_fx``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def default_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$GFX_CACHE_DIR``, else ``~/.cache/galvatron_fx``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("GFX_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "galvatron_fx"


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo where available)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint_fields(
    *,
    num_hosts: int,
    device_model: str,
    devices_per_host: int,
    backend: str,
    world_size: int,
    torch_version: str | None = None,
) -> dict[str, Any]:
    """The facts a hardware profile depends on (hashed by ``make_fingerprint``)."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    return {
        "num_hosts": num_hosts,
        "device_model": device_model,
        "devices_per_host": devices_per_host,
        "backend": backend,
        "torch_version": torch_version,
        "world_size": world_size,
    }


def make_fingerprint(fields: Mapping[str, Any]) -> str:
    """A short stable hash of ``fingerprint_fields``."""
    blob = json.dumps(dict(fields), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def local_fingerprint(world_size: int) -> str:
    """The fingerprint of this machine running ``world_size`` gloo CPU processes."""
    return make_fingerprint(
        fingerprint_fields(
            num_hosts=1,
            device_model=cpu_model(),
            devices_per_host=os.cpu_count() or 1,
            backend="gloo",
            world_size=world_size,
        )
    )


def host_memory_bytes() -> int:
    """Physical memory of this host in bytes (8 GiB when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def hostname() -> str:
    """This host's name (used in slow-link reports and the fingerprint's host count)."""
    return socket.gethostname()
