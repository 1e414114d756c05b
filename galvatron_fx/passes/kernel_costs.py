"""What one dispatched kernel costs: its FLOPs and the bytes it reads and writes.

Contract: :class:`CostCounter` is a ``TorchDispatchMode`` that sums :func:`kernel_flops` and
:func:`kernel_bytes` of every ATen op dispatched while it is active (on fake or real tensors;
nothing is allocated for the count). :func:`kernel_bytes` is the traffic of the kernel a GPU (or
a CPU) runs for the op, in the op's own dtypes:

- *metadata and views move nothing*: an op that returns no tensor (``prim.device``, size and
  stride queries, ``_local_scalar_dense``), a view or alias (``view``, ``t``, ``expand``,
  ``_unsafe_view``, ``detach``) and an allocation (``empty``, ``empty_like``) cost 0;
- otherwise an op *reads* each distinct input once, a broadcast input (stride 0) only over its
  distinct elements, and *writes* each output (an in-place op's ``self`` is read and written);
- *write-only* ops (``copy_``'s destination, ``fill_``, ``zero_``, ``zeros``, ``ones``, ``full``
  and their ``_like`` forms) do not read what they overwrite;
- *gathers* read the rows they gather, not the table: ``embedding``, ``index_select``,
  ``gather`` and ``index`` read their indices and as many elements as they write; the loss's
  ``nll_loss_forward`` reads the targets and one log-probability per target;
- *scatters* of a backward write their whole output once (the zero fill) and the gathered rows
  again: ``embedding_dense_backward`` reads the gradient and indices and writes the table plus
  the gradient's rows; ``nll_loss_backward`` reads the targets and writes its gradient.

FLOPs are PyTorch's own formulas (``torch.utils.flop_counter``: matmuls, convolutions,
attention) plus the CPU flash-attention kernels the registry lacks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["CostCounter", "is_free", "kernel_bytes", "kernel_flops"]

aten = torch.ops.aten


def _cpu_flash_fwd(q, k, v, *args, **kwargs) -> int:
    return sdpa_flop_count(q.shape, k.shape, v.shape)


def _cpu_flash_bwd(grad_out, q, k, v, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)


# Kernels PyTorch's flop registry does not know (the CPU attention kernels).
_EXTRA_FLOPS: dict[object, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_fwd,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_bwd,
}

_ALIASING = {aten._unsafe_view, aten.alias, aten.detach, aten.lift_fresh}
_ALLOCATING = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}
_WRITE_ONLY = {aten.zeros, aten.ones, aten.full, aten.zeros_like, aten.ones_like, aten.full_like,
               aten.new_zeros, aten.new_ones, aten.new_full, aten.scalar_tensor, aten.arange,
               aten.fill_, aten.zero_, aten.fill}
_GATHERS = {aten.embedding: (1,), aten.index_select: (2,), aten.gather: (2,)}


def is_free(func) -> bool:
    """Ops that move no data: views, aliases, metadata (``_unsafe_view`` aliases its input
    although its schema does not say so) and allocations."""
    packet = func._overloadpacket
    return func.is_view or packet in _ALIASING or packet in _ALLOCATING or func.namespace == "prim"


def _tensors(x) -> list[torch.Tensor]:
    """The tensors in ``x`` (nested tuples, lists and dicts of a kernel's arguments or outputs),
    without the pytree registry's generality: it runs for every kernel counted."""
    out: list[torch.Tensor] = []
    stack = [x]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
    return out


def _written(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _distinct(t: torch.Tensor) -> int:
    """Bytes of the distinct elements of ``t`` (a broadcast dimension holds one)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return 0
        if stride != 0:
            n *= int(size)
    return n * t.element_size()


def _reads(tensors: list[torch.Tensor]) -> int:
    """Bytes read from ``tensors``, each distinct view once."""
    seen, total = set(), 0
    for t in tensors:
        key: tuple[object, ...]
        try:
            key = (StorageWeakRef(t.untyped_storage()).cdata, t.storage_offset(), tuple(t.shape), t.stride())
        except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass)
            key = (id(t),)
        if key not in seen:
            seen.add(key)
            total += _distinct(t)
    return total


def kernel_bytes(func, args, kwargs, out) -> int:
    """Bytes the kernel of ``func(*args, **kwargs) -> out`` reads plus writes (module doc)."""
    outs = _tensors(out)
    if not outs or is_free(func):
        return 0
    packet = func._overloadpacket
    writes = sum(_written(t) for t in outs)
    if packet in _WRITE_ONLY:
        extra = [t for t in _tensors((args[1:], kwargs))]  # a fill value given as a tensor
        return writes + _reads(extra)
    if packet is aten.copy_:
        return writes + _reads(_tensors(args[1]))
    if packet in _GATHERS:
        index = args[_GATHERS[packet][0]]
        return 2 * writes + _reads([index])
    if packet is aten.index:
        return 2 * writes + _reads(_tensors(args[1]))
    if packet in (aten.nll_loss_forward, aten.nll_loss2d_forward):
        logp, target, weight = args[0], args[1], args[2] if len(args) > 2 else None
        gathered = target.numel() * logp.element_size() * (2 if isinstance(weight, torch.Tensor) else 1)
        return writes + _reads([target]) + gathered
    if packet in (aten.nll_loss_backward, aten.nll_loss2d_backward):
        return writes + _reads(_tensors((args[0], args[2], args[-1])))
    if packet is aten.embedding_dense_backward:
        grad, indices = args[0], args[1]
        return writes + 2 * _distinct(grad) + _reads([indices])
    outputs = _tensors(kwargs.get("out")) if "out" in kwargs else []
    ids = {id(t) for t in outputs}
    inputs = [t for t in _tensors((args, kwargs)) if id(t) not in ids]
    return writes + _reads(inputs)


def kernel_flops(func, args, kwargs, out) -> int:
    """FLOPs of ``func(*args, **kwargs) -> out`` by PyTorch's formulas (0 for unknown ops)."""
    packet = func._overloadpacket
    if packet in _EXTRA_FLOPS:
        return int(_EXTRA_FLOPS[packet](*args, **kwargs))
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **kwargs, out_val=out))
    return 0


class CostCounter(TorchDispatchMode):
    """Counts FLOPs and bytes (:func:`kernel_bytes`) of every kernel dispatched while active."""

    def __init__(self):
        super().__init__()
        self.flops = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += kernel_flops(func, args, kwargs, out)
        self.bytes += kernel_bytes(func, args, kwargs, out)
        return out

