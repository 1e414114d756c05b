"""The vocabulary of per-layer strategies: tensor/sequence parallel, data-parallel flavour,
recomputation, and the precision policy. Shared by cost models, the search and the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from galvatron_fx.ir.recompute import Recompute

__all__ = ["Axis", "DPType", "LayerStrategy", "Precision", "Recompute", "SPMode"]


class Axis(StrEnum):
    """The names of the device meshes' dimensions: pipeline stages, data parallel, tensor
    parallel. A layer runs on a ``(DP, TP)`` mesh of its stage's ranks; a pipeline's meshes are
    ``(PP, DP, TP)``."""

    PP = "pp"
    DP = "dp"
    TP = "tp"


LAYER_MESH_DIMS = (Axis.DP, Axis.TP)  # a layer's mesh, in this order


class SPMode(StrEnum):
    """Sequence parallelism: none, Megatron-style inside TP (norms/dropout sharded on the
    sequence dim, all-gather/reduce-scatter instead of all-reduce), or Ulysses (all-to-all
    between sequence and head sharding around attention)."""

    NONE = "none"
    MEGATRON = "megatron"
    ULYSSES = "ulysses"


class DPType(StrEnum):
    """Data-parallel flavour: replicated (DDP), ZeRO-2 (gradients and optimizer states
    sharded; FSDP2 with ``reshard_after_forward=False``) or ZeRO-3/FSDP (parameters too)."""

    DDP = "ddp"
    ZERO2 = "zero2"
    ZERO3 = "zero3"


@dataclass(frozen=True, slots=True)
class LayerStrategy:
    """One choice for one layer.

    ``offload``: the layer's optimizer step runs on the host (CPU offload). Under DDP (and at
    dp = 1) the device keeps its working parameters and gradients; an fp32 master copy of the
    parameters, their gradients and the optimizer states live in host memory: after the gradient
    sync the gradients go to the host, the optimizer steps the master copy there, and the updated
    parameters come back before the next forward. Under ZeRO-2/3 (dp > 1) the sharded parameters,
    gradients and optimizer states all live in host memory (FSDP2's ``CPUOffloadPolicy``): each
    gather copies the shards to the device first, each reduce-scatter's shard goes back.
    """

    tp: int = 1
    sp: SPMode = SPMode.NONE
    dp_type: DPType = DPType.DDP
    recompute: Recompute = Recompute.NONE
    offload: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sp", SPMode(self.sp))
        object.__setattr__(self, "dp_type", DPType(self.dp_type))
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.sp != SPMode.NONE and self.tp == 1:
            raise ValueError(f"{self.sp} sequence parallelism needs a group of tp > 1 ranks")
        if not isinstance(self.offload, bool):
            raise ValueError(f"offload must be True or False, got {self.offload!r}")

    def to_dict(self) -> dict:
        d = {"tp": self.tp, "sp": str(self.sp), "dp_type": str(self.dp_type), "recompute": str(self.recompute)}
        return d | {"offload": True} if self.offload else d  # absent when off: older plans read alike

    @classmethod
    def from_dict(cls, d: dict) -> LayerStrategy:
        return cls(tp=int(d["tp"]), sp=d["sp"], dp_type=d["dp_type"], recompute=d["recompute"],
                   offload=bool(d.get("offload", False)))

    def short(self) -> str:
        """``tp2+sp·zero3·full`` style label for tables."""
        s = f"tp{self.tp}" + (f"+{self.sp}" if self.sp != SPMode.NONE else "")
        s += f"·{self.dp_type}"
        if self.recompute != Recompute.NONE:
            s += f"·{self.recompute}"
        if self.offload:
            s += "·offload"
        return s


_DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True, kw_only=True, slots=True)
class Precision:
    """What precision each kind of tensor is kept in.

    ``param_dtype`` is how parameters are stored (and sharded); ``compute_dtype`` the dtype
    of the copies used in forward/backward and of activations; ``grad_dtype`` the dtype
    gradients are reduced and kept in; AdamW keeps two ``optim_dtype`` states per parameter.
    ``fp32``: everything fp32. ``bf16``: FSDP2-style mixed precision — fp32 parameters,
    bf16 compute copies and activations, fp32 gradient reduction and optimizer states.
    ``fp16``: the same with fp16 compute (the runtime scales the loss dynamically).
    """

    name: str = "fp32"
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    grad_dtype: str = "float32"
    optim_dtype: str = "float32"
    optim_states_per_param: int = 2  # AdamW: exp_avg, exp_avg_sq

    @classmethod
    def fp32(cls) -> Precision:
        return cls()

    @classmethod
    def bf16(cls) -> Precision:
        return cls(name="bf16", compute_dtype="bfloat16")

    @classmethod
    def fp16(cls) -> Precision:
        return cls(name="fp16", compute_dtype="float16")

    @classmethod
    def named(cls, name: str) -> Precision:
        if name not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"unknown precision {name!r}: use 'fp32', 'bf16' or 'fp16'")
        return getattr(cls, name)()

    @staticmethod
    def dtype_bytes(dtype: str) -> int:
        return _DTYPE_BYTES[str(dtype).removeprefix("torch.")]

    @property
    def param_bytes(self) -> int:
        return self.dtype_bytes(self.param_dtype)

    @property
    def compute_bytes(self) -> int:
        return self.dtype_bytes(self.compute_dtype)

    @property
    def grad_bytes(self) -> int:
        return self.dtype_bytes(self.grad_dtype)

    @property
    def optim_bytes_per_param(self) -> int:
        return self.optim_states_per_param * self.dtype_bytes(self.optim_dtype)
