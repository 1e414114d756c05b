"""The search space: which strategies the search may use — every dimension can be capped or
switched off by the caller (``search=`` of ``plan`` and ``compile``), the lossy gradient
communications included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from galvatron_fx.cluster import limits
from galvatron_fx.errors import ConfigError
from galvatron_fx.ir.grad_comm import DEFAULT_POWERSGD_START, MAX_POWERSGD_RANK, GradComm, grad_comm_options
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import DPType, SPMode

__all__ = ["SearchSpace"]


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Which strategies the search may use; every dimension can be capped or switched off.

    ``None`` means "all that fit": tp = divisors of the stage's devices up to one node, pp =
    divisors of the world up to the number of blocks, micro-batch counts searched. A layer at
    tp > 1 always splits something over its tp group when it can (weights, activations, or the
    sequence under Ulysses); naming the degrees, ``tp=(2,)``, asks for real tensor parallelism:
    a layer with weights then shards some of them, never repeats them all whole on both ranks
    (Ulysses aside). ``vocab_parallel=False`` keeps the logits whole from
    head to loss (no vocab-parallel cross-entropy; a tp head then gathers them).
    ``lowered_prices=True`` prices every tensor-parallel option by the collectives its lowered
    program issues (:mod:`~galvatron_fx.search.lowered_prices`, about half a second per layer kind
    and option) instead of the intra-layer ILP's estimate, as cost models with ``traces_runtime``
    always do: the plan then prices exactly what it runs (``galvatron-fx plan`` does).
    ``reduce_dtypes`` (default fp32 only) and ``powersgd_ranks`` (default ``(0,)``: no
    compression) are the gradient communications the search may use (:mod:`~galvatron_fx.ir.grad_comm`;
    anything but fp32 and rank 0 is lossy): ``reduce_dtypes=("float32", "bfloat16")`` lets it sum
    data-parallel gradients in bf16 where that is faster, ``powersgd_ranks=(0, 4)`` lets it
    compress DDP gradient matrices to rank 4 where that is faster; ``reduce_dtypes=("bfloat16",)``
    or ``powersgd_ranks=(4,)`` asks for it outright; ``powersgd_start_step`` (default 1000, as
    ``torch.distributed``'s PowerSGD hook) is how many steps sum plainly before compression starts
    (the price is the steady state's). One search prices one option
    (:attr:`grad_comm`); the planner runs one per option and keeps the fastest
    (:mod:`~galvatron_fx.search.grad_comm_choice`).
    ``offload`` (default ``(False, True)``): whether layers may keep their optimizer step, and
    under ZeRO their shards, in host memory (``LayerStrategy.offload``). The search offers it on
    devices with host memory beside their own (``DeviceSpec.host_memory_bytes``), per stage, only
    where no assignment without it fits the device budget; ``(False,)`` never offloads,
    ``(True,)`` offloads every layer with parameters. ``host_memory_budget`` (bytes per node;
    default the nodes' host memory, ``DeviceSpec.host_memory_bytes`` × devices per node) caps
    what offloaded layers keep in a node's host memory.
    """

    tp: tuple[int, ...] | None = None
    max_tp: int | None = None
    sp: tuple[SPMode, ...] = (SPMode.NONE, SPMode.MEGATRON, SPMode.ULYSSES)
    dp_types: tuple[DPType, ...] = (DPType.DDP, DPType.ZERO2, DPType.ZERO3)
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    pp: tuple[int, ...] | None = None
    max_pp: int | None = None
    schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b")
    num_microbatches: tuple[int, ...] | None = None
    max_microbatches: int = 64
    uniform: bool = False  # one strategy for all blocks (the hand-written baselines)
    vocab_parallel: bool = True
    lowered_prices: bool = False
    reduce_dtypes: tuple[str, ...] = ("float32",)
    powersgd_ranks: tuple[int, ...] = (0,)
    powersgd_start_step: int = DEFAULT_POWERSGD_START
    offload: tuple[bool, ...] = (False, True)
    host_memory_budget: int | None = None

    def __post_init__(self) -> None:
        for key in ("reduce_dtypes", "powersgd_ranks"):
            values = getattr(self, key)
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ConfigError(f"search.{key} must be a tuple, got {values!r}")
        if isinstance(self.offload, (str, bytes)) or not isinstance(self.offload, Sequence) or not self.offload \
                or not all(isinstance(o, bool) for o in self.offload):
            raise ConfigError(f"search.offload must be a non-empty tuple of booleans, got {self.offload!r} "
                              "(e.g. (False,) never offloads, (False, True) offloads where memory forces it)")
        if self.host_memory_budget is not None:
            limits.BYTES.check(self.host_memory_budget, "search.host_memory_budget",
                               "give the bytes of host memory offloaded layers may keep per node")
        for i, r in enumerate(self.powersgd_ranks):
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= MAX_POWERSGD_RANK:
                raise ConfigError(f"search.powersgd_ranks[{i}] = {r!r} must be an integer in 0..{MAX_POWERSGD_RANK} "
                                  "(0: no compression; e.g. (0, 4) lets the search compress to rank 4 where it pays)")
        self.grad_comm_options()  # every reduce dtype known
        # degrees within limits.DEGREE, micro-batch counts within limits.MICROBATCHES: the
        # search loops over them
        for key, rng in (("tp", limits.DEGREE), ("pp", limits.DEGREE), ("num_microbatches", limits.MICROBATCHES)):
            values = getattr(self, key)
            if values is None:
                continue
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ConfigError(f"search.{key} must be a tuple of integers or None, got {values!r}")
            for i, v in enumerate(values):
                rng.check(v, f"search.{key}[{i}]")
        for key, rng in (("max_tp", limits.DEGREE), ("max_pp", limits.DEGREE), ("max_microbatches", limits.MICROBATCHES)):
            if (v := getattr(self, key)) is not None:
                rng.check(v, f"search.{key}")

    def grad_comm_options(self) -> list[GradComm]:
        """The gradient communications this space allows, least lossy first."""
        return grad_comm_options(self.reduce_dtypes, self.powersgd_ranks, self.powersgd_start_step)

    @property
    def grad_comm(self) -> GradComm:
        """The one gradient communication a search of this space prices (the planner splits a
        space allowing several into one search each)."""
        options = self.grad_comm_options()
        assert len(options) == 1, f"one search prices one gradient communication, this space allows {options}"
        return options[0]

    @classmethod
    def coerce(cls, value: SearchSpace | dict | None) -> SearchSpace:
        if value is None:
            return cls()
        if isinstance(value, SearchSpace):
            return value
        kw = dict(value)
        for key, enum in (("sp", SPMode), ("dp_types", DPType), ("recompute", Recompute)):
            if key in kw:
                kw[key] = tuple(enum(v) for v in kw[key])
        for key in ("reduce_dtypes", "powersgd_ranks", "offload"):  # one value alone is a tuple of it
            if key in kw and isinstance(kw[key], (str, int)):
                kw[key] = (kw[key],)
        for key in ("tp", "pp", "num_microbatches", "schedules", "reduce_dtypes", "powersgd_ranks", "offload"):
            if key in kw and kw[key] is not None:
                kw[key] = tuple(kw[key])
        return cls(**kw)
