"""Range and shape checks of a cluster description (constructed, or read from its JSON form).

Contract: :func:`validate_cluster` raises ``ConfigError`` naming the field
(``cluster.device_specs['A100-80GB'].memory_bytes``) for an impossible cluster or a number outside
the sane ranges of :mod:`galvatron_fx.cluster.limits`; ``Cluster.__post_init__`` calls it, so every
``Cluster``, however built, passes it. :func:`check_keys` and :func:`read_number` check one JSON
object's keys and one numeric field for the strict JSON reader in :mod:`galvatron_fx.cluster.spec`.

Terms: the sane ranges — at most 2**20 devices, device memory in [2**20, 2**60] bytes, peak compute
in [1e6, 1e21] FLOP/s, memory and link bandwidths in [1e6, 1e16] bytes/s, latencies and alphas
in [0, 10] s, betas in [0, 1e-3] s/byte, overlap slowdown in [1, 100]. A *real* is a finite int
or float, not a bool: only reals are compared with a bound here, anything else is left to the
range check, which names its type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import galvatron_fx.cluster.limits as limits
from galvatron_fx.errors import ConfigError

if TYPE_CHECKING:
    from galvatron_fx.cluster.spec import Cluster

__all__ = ["check_keys", "is_real", "read_number", "validate_cluster"]


def check_keys(obj: Any, where: str, required: set[str], optional: AbstractSet[str] = frozenset()) -> None:
    """``obj`` is a JSON object with every ``required`` key and no key outside ``required | optional``."""
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - required - optional
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(required | optional)} "
            "(check spelling or the schema_version)"
        )
    missing = required - set(obj)
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {sorted(missing)}")


def read_number(obj: Mapping[str, Any], key: str, where: str, *, positive: bool = True, integer: bool = False,
                rng: limits.Range | None = None) -> Any:
    """``obj[key]`` as a finite number (an int with ``integer``), > 0 (>= 0 unless ``positive``), in
    ``rng`` when given."""
    v = obj[key]
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type or (isinstance(v, float) and not math.isfinite(v)):
        kind = "an integer" if integer else "a finite number"
        sane = f" in {rng}" if rng is not None else ""
        raise ConfigError(f"{where}.{key}: expected {kind}{sane}, got {limits.short_repr(v)}")
    if not integer:
        try:
            v = float(v)
        except OverflowError:
            raise ConfigError(f"{where}.{key}: {limits.short_repr(v)} is too large for a float"
                              + (f"; its sane range is {rng}" if rng is not None else "")) from None
    if positive and v <= 0:
        raise ConfigError(f"{where}.{key}: must be > 0, got {limits.short_repr(v)}")
    if not positive and v < 0:
        raise ConfigError(f"{where}.{key}: must be >= 0, got {limits.short_repr(v)}")
    if rng is not None:
        rng.check(v, f"{where}.{key}")
    return v


_FIT_GROUP = limits.Range(2, limits.DEGREE.hi, "ranks", integer=True)
_POINT_BYTES = limits.Range(1, limits.BYTES.hi, "bytes", integer=True)
_POINT_S = limits.Range(0, 1e4, "s")


def validate_cluster(c: Cluster) -> None:
    """Checks on a constructed cluster (impossible clusters, and numbers outside the sane ranges
    of :mod:`galvatron_fx.cluster.limits`, raise ``ConfigError``)."""
    if isinstance(c.num_nodes, int) and c.num_nodes < 1:
        raise ConfigError(f"cluster.num_nodes must be >= 1, got {c.num_nodes}")
    if isinstance(c.devices_per_node, int) and c.devices_per_node < 1:
        raise ConfigError(f"cluster.devices_per_node must be >= 1, got {c.devices_per_node} (zero devices)")
    limits.DEGREE.check(c.num_nodes, "cluster.num_nodes")
    limits.DEGREE.check(c.devices_per_node, "cluster.devices_per_node")
    limits.DEGREE.check(c.num_nodes * c.devices_per_node, "cluster.num_nodes × devices_per_node (the world size)",
                        "galvatron_fx plans for at most 2**20 devices")
    if len(c.node_kinds) != c.num_nodes:
        raise ConfigError(
            f"cluster.node_kinds has {len(c.node_kinds)} entries but num_nodes is {c.num_nodes}; "
            "give one device kind per node"
        )
    for i, k in enumerate(c.node_kinds):
        if k not in c.device_specs:
            raise ConfigError(f"cluster.node_kinds[{i}] = {k!r} is not in device_specs {sorted(c.device_specs)}")
    for k, s in c.device_specs.items():
        w = f"cluster.device_specs[{k!r}]"
        if is_real(s.memory_bytes) and s.memory_bytes <= 0:
            raise ConfigError(f"{w}.memory_bytes must be > 0, got {s.memory_bytes}")
        if is_real(s.memory_bandwidth_bytes_s) and s.memory_bandwidth_bytes_s <= 0:
            raise ConfigError(f"{w}.memory_bandwidth_bytes_s must be > 0, got {s.memory_bandwidth_bytes_s}")
        limits.DEVICE_MEMORY.check(s.memory_bytes, f"{w}.memory_bytes", "give the device's memory in bytes")
        limits.BYTES_S.check(s.memory_bandwidth_bytes_s, f"{w}.memory_bandwidth_bytes_s",
                             "give the device's memory bandwidth in bytes per second")
        if not s.peak_flops:
            raise ConfigError(f"{w}.peak_flops is empty; give at least 'float32'")
        for d, f in s.peak_flops.items():
            if is_real(f) and not f > 0:
                raise ConfigError(f"{w}.peak_flops[{d!r}] must be > 0, got {f}")
            limits.FLOPS.check(f, f"{w}.peak_flops[{d!r}]", "give the device's dense peak in FLOP per second "
                                                            "(e.g. 312e12 for an A100 in bfloat16)")
    for t in (c.intra_node, c.inter_node):
        w = f"cluster.{t.name}"
        if is_real(t.latency_s) and t.latency_s < 0:
            raise ConfigError(f"{w}.latency_s must be >= 0, got {t.latency_s}")
        if is_real(t.bandwidth_bytes_s) and t.bandwidth_bytes_s <= 0:
            raise ConfigError(f"{w}.bandwidth_bytes_s must be > 0, got {t.bandwidth_bytes_s}")
        limits.LATENCY_S.check(t.latency_s, f"{w}.latency_s", "give the link's latency in seconds")
        limits.BYTES_S.check(t.bandwidth_bytes_s, f"{w}.bandwidth_bytes_s",
                             "give the per-device bus bandwidth in bytes per second")
        for coll, per in t.fits.items():
            for n, fit in per.items():
                fw = f"{w}.fits[{str(coll)!r}][{n!r}]"
                if not is_real(n) or n < 2 or not is_real(fit.alpha_s) or fit.alpha_s < 0 \
                        or not is_real(fit.beta_s_per_byte) or fit.beta_s_per_byte < 0:
                    raise ConfigError(f"{fw} is invalid: {fit} (group size >= 2, alpha/beta >= 0)")
                _FIT_GROUP.check(n, f"{fw}: group size")
                limits.LATENCY_S.check(fit.alpha_s, f"{fw}.alpha_s")
                limits.SECONDS_PER_BYTE.check(fit.beta_s_per_byte, f"{fw}.beta_s_per_byte")
                for i, (nbytes, time_s) in enumerate(fit.points):
                    _POINT_BYTES.check(nbytes, f"{fw}.points[{i}][0] (bytes)")
                    _POINT_S.check(time_s, f"{fw}.points[{i}][1] (seconds)")
    if is_real(c.overlap_slowdown) and c.overlap_slowdown < 1.0:
        raise ConfigError(f"cluster.overlap_slowdown must be >= 1, got {c.overlap_slowdown}")
    limits.OVERLAP.check(c.overlap_slowdown, "cluster.overlap_slowdown")


def is_real(v: Any) -> bool:
    """A finite int or float (not a bool): one the ordering checks of :func:`validate_cluster` can compare."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
