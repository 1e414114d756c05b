"""How a plan's data-parallel gradients travel: the dtype they are summed in and, for plain
(DDP-flavour) layers, PowerSGD low-rank compression.

Contract: :class:`GradComm` is one plan-wide choice, recorded in
:attr:`~galvatron_fx.ir.plan.ParallelPlan.grad_comm`, priced by the search
(:mod:`~galvatron_fx.search.candidates`, :mod:`~galvatron_fx.cost_models.grad_sync`) and carried
out by the runtime (:class:`~galvatron_fx.runtime.buckets.GradBucketer` for DDP buckets, FSDP2's
``MixedPrecisionPolicy(reduce_dtype=...)`` for ZeRO-2/3 units). The default — fp32 sums, no
compression — is lossless; every other choice is lossy and only taken where the caller allows it
(``search={"reduce_dtypes": ("float32", "bfloat16"), "powersgd_ranks": (0, 4)}``,
:func:`grad_comm_options`).

Terms
    *reduce dtype*: the dtype a gradient is cast to for its sum over the data-parallel group; it
    is cast back to the parameter's dtype (fp32) afterwards, so only the sum loses precision,
    never the stored gradient or the optimizer. A 16-bit sum moves half the bytes of an fp32 one;
    an fp16 sum beyond 65504 overflows (under fp16 training the loss scaler then skips the step,
    as for any overflow), bf16 keeps fp32's range with 8 bits of mantissa.
    *PowerSGD rank* ``r`` (0: off): each DDP gradient matrix ``M`` (``n × m``, a parameter of two
    or more dims viewed as ``(shape[0], rest)``) is summed as its rank-``r`` approximation
    ``P Qᵀ`` — two all-reduces of ``n·r`` and ``m·r`` values instead of ``n·m`` — with error
    feedback (what the approximation missed is added to the next step's gradient), from step
    ``powersgd_start_step`` on (plain sums before it, as ``torch.distributed``'s PowerSGD hook's
    ``start_powerSGD_iter``: early training is the most sensitive to inexact gradients). Matrices
    that would not shrink by half (``(n + m)·r > n·m / 2``) and vectors are summed whole, in the reduce
    dtype; the factors ``P`` and ``Q`` are always summed in fp32 (their orthogonalisation needs it).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from galvatron_fx.errors import ConfigError

__all__ = ["DEFAULT_POWERSGD_START", "REDUCE_DTYPES", "GradComm", "compressible", "grad_comm_options"]

REDUCE_DTYPES = ("float32", "bfloat16", "float16")
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_POWERSGD_RANK = 1024  # beyond this a low-rank sum saves nothing on any real layer
DEFAULT_POWERSGD_START = 1000  # steps of plain sums first (torch's PowerSGD hook's default)
MAX_POWERSGD_START = 10**9


@dataclass(frozen=True, kw_only=True, slots=True)
class GradComm:
    """One plan's gradient communication (see module doc); the default is lossless."""

    reduce_dtype: str = "float32"
    powersgd_rank: int = 0
    powersgd_start_step: int = DEFAULT_POWERSGD_START  # (meaningless, and kept at its default, at rank 0)

    def __post_init__(self) -> None:
        dtype = str(self.reduce_dtype).removeprefix("torch.")
        if dtype not in REDUCE_DTYPES:
            raise ConfigError(f"gradient reduce dtype {self.reduce_dtype!r} is not one of {', '.join(REDUCE_DTYPES)}")
        object.__setattr__(self, "reduce_dtype", dtype)
        r = self.powersgd_rank
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= MAX_POWERSGD_RANK:
            raise ConfigError(f"PowerSGD rank {r!r} must be an integer in 0..{MAX_POWERSGD_RANK} (0: no compression)")
        start = self.powersgd_start_step
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= MAX_POWERSGD_START:
            raise ConfigError(f"PowerSGD start step {start!r} must be an integer in 0..{MAX_POWERSGD_START} (the steps "
                              "summed plainly before compression starts)")
        if r == 0:
            object.__setattr__(self, "powersgd_start_step", DEFAULT_POWERSGD_START)

    @property
    def lossless(self) -> bool:
        return self.reduce_dtype == "float32" and self.powersgd_rank == 0

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element on the wire when summed whole."""
        return _BYTES[self.reduce_dtype]

    def short(self) -> str:
        """``fp32`` / ``bf16`` / ``bf16+powersgd4`` for tables and explain()."""
        return _SHORT[self.reduce_dtype] + (f"+powersgd{self.powersgd_rank}" if self.powersgd_rank else "")

    def describe(self) -> str:
        """One sentence for explain()."""
        out = f"data-parallel gradients summed in {_SHORT[self.reduce_dtype]}"
        if self.powersgd_rank:
            out += (f"; DDP gradient matrices as rank-{self.powersgd_rank} PowerSGD factors with error feedback "
                    f"from step {self.powersgd_start_step} (lossy)")
        elif not self.lossless:
            out += " (lossy: half the bytes of an fp32 sum)"
        return out

    def wire_bytes(self, shape: Sequence[int], stored_bytes: int = 4) -> tuple[int, int, int]:
        """``(whole, p, q)``: the bytes one DDP gradient of local ``shape`` (stored at
        ``stored_bytes`` per element) puts on the wire — summed whole in the reduce dtype, or, a
        matrix PowerSGD compresses, as fp32 factors ``P`` (``n·r``) and ``Q`` (``m·r``)."""
        numel = 1
        for s in shape:
            numel *= int(s)
        nm = compressible(shape, self.powersgd_rank)
        if nm is None:
            return numel * (stored_bytes if self.reduce_dtype == "float32" else self.reduce_bytes), 0, 0
        n, m = nm
        r = min(self.powersgd_rank, n, m)
        return 0, 4 * n * r, 4 * m * r

    def to_dict(self) -> dict:
        out = {"reduce_dtype": self.reduce_dtype, "powersgd_rank": self.powersgd_rank}
        return out | ({"powersgd_start_step": self.powersgd_start_step} if self.powersgd_rank else {})

    @classmethod
    def from_dict(cls, d: dict) -> GradComm:
        return cls(reduce_dtype=d.get("reduce_dtype", "float32"), powersgd_rank=d.get("powersgd_rank", 0),
                   powersgd_start_step=d.get("powersgd_start_step", DEFAULT_POWERSGD_START))


def compressible(shape: Sequence[int], rank: int) -> tuple[int, int] | None:
    """``(n, m)`` of a gradient of ``shape`` viewed as a matrix when rank-``rank`` PowerSGD sums
    it in at most half its values; None when it is summed whole (a vector, or too small)."""
    if rank <= 0 or len(shape) < 2:
        return None
    n = int(shape[0])
    m = 1
    for s in shape[1:]:
        m *= int(s)
    r = min(rank, n, m)
    return (n, m) if 2 * (n + m) * r <= n * m else None


def grad_comm_options(reduce_dtypes: Sequence[str], powersgd_ranks: Sequence[int],
                      powersgd_start_step: int = DEFAULT_POWERSGD_START) -> list[GradComm]:
    """Every gradient communication a search may use, least lossy first: each reduce dtype
    allowed with each PowerSGD rank allowed (0: no compression), compressing from
    ``powersgd_start_step``."""
    if not reduce_dtypes:
        raise ConfigError("search.reduce_dtypes is empty: allow at least 'float32' (or 'bfloat16' / 'float16')")
    if not powersgd_ranks:
        raise ConfigError("search.powersgd_ranks is empty: allow at least 0 (no compression), or a rank such as 4")
    dtypes = sorted(dict.fromkeys(str(d).removeprefix("torch.") for d in reduce_dtypes),
                    key=lambda d: (REDUCE_DTYPES.index(d) if d in REDUCE_DTYPES else -1))
    ranks = sorted({int(r) for r in powersgd_ranks})
    out = []
    for r, d in itertools.product(ranks, dtypes):
        out.append(GradComm(reduce_dtype=d, powersgd_rank=r, powersgd_start_step=powersgd_start_step))
    return out
