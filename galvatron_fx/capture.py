"""capture — trace a model (with its loss) to an ATen training graph and segment it.

``capture(model, example_inputs)`` runs ``torch.export`` (non-strict) on the model, which may
live on a real device, on ``meta`` or in a ``FakeTensorMode``: planning never needs real
weights. The result is a :class:`~galvatron_fx.ir.ModelGraph` with parameters, layers and (by
default) costs from ``annotate_costs_pass``.

Loss: ``model(*example_inputs)`` should return the scalar loss. If it returns something else
(logits, a ``ModelOutput``), pass ``loss_fn(output, target)``: the last example input is then
the target and the model is called with the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn

from galvatron_fx.errors import CaptureError, UnsupportedModelError
from galvatron_fx.ir.graph import ModelGraph, ParamInfo, dtype_name
from galvatron_fx.passes.runner import PassContext, run_passes

log = logging.getLogger(__name__)

_WRAP_PREFIX = "inner."


class _WithLoss(nn.Module):
    """``loss_fn(model(*inputs[:-1]), inputs[-1])`` as one module, so that export sees the loss."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.inner = model
        self.loss_fn = loss_fn

    def forward(self, *args, **kwargs):
        *inputs, target = args
        out = self.inner(*inputs, **kwargs)
        return self.loss_fn(out, target)


def capture(
    model: nn.Module,
    example_inputs: Sequence[Any],
    loss_fn: Callable[..., torch.Tensor] | None = None,
    *,
    example_kwargs: dict[str, Any] | None = None,
    dynamic: bool = False,
    annotate: bool = True,
    name: str | None = None,
    dump_dir: str | Path | None = None,
) -> ModelGraph:
    """Trace ``model`` to a :class:`ModelGraph` with layers (and costs when ``annotate``).

    ``dynamic=True`` makes dim 0 of every input a symbolic ``batch`` and dim 1 of inputs with
    two or more dims a symbolic ``seq``; costs are then annotated at the example sizes.
    Raises :class:`CaptureError` naming the failing module and what to try.
    """
    from galvatron_fx.passes.annotate_costs import annotate_costs_pass
    from galvatron_fx.passes.segment_layers import segment_layers_pass

    t0 = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise CaptureError(f"capture needs an nn.Module, got {type(model).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    kwargs = dict(example_kwargs or {})
    args, kwargs = _match_device(model, args, kwargs)
    root = _WithLoss(model, loss_fn) if loss_fn is not None else model
    prefix = _WRAP_PREFIX if loss_fn is not None else ""

    dynamic_shapes = _dynamic_shapes(args, kwargs) if dynamic else None
    was_training = model.training
    try:
        ep = _export(root, args, kwargs, dynamic_shapes)
    finally:
        model.train(was_training)
    gm = ep.graph_module
    sig = ep.graph_signature
    strip = (lambda s: s[len(prefix):] if prefix and s.startswith(prefix) else s)
    params: dict[str, ParamInfo] = {}
    trainable = {n for n, p in root.named_parameters(remove_duplicate=False) if p.requires_grad}
    canonical = _canonical_names(root)
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        fqn = sig.inputs_to_parameters.get(node.name)
        is_buffer = False
        if fqn is None:
            fqn = sig.inputs_to_buffers.get(node.name) or sig.inputs_to_lifted_tensor_constants.get(node.name)
            is_buffer = fqn is not None
        if fqn is None:
            continue
        first = canonical.get(fqn, fqn)
        if first != fqn and strip(first) in params:  # a tied parameter seen under another name
            p = params[strip(first)]
            params[p.name] = replace(p, aliases=p.aliases + (strip(fqn),), alias_nodes=p.alias_nodes + (node.name,))
            continue
        val = node.meta["val"]
        numel = int(val.numel())
        params[strip(fqn)] = ParamInfo(
            name=strip(fqn),
            node=node.name,
            shape=tuple(int(s) for s in val.shape),
            dtype=dtype_name(val.dtype),
            numel=numel,
            nbytes=numel * val.element_size(),
            is_buffer=is_buffer,
            requires_grad=(not is_buffer) and fqn in trainable,
        )
    mg = ModelGraph(
        gm=gm,
        params=params,
        input_names=list(sig.user_inputs),
        output_names=[str(o) for o in sig.user_outputs],
        name=name or type(model).__name__,
        example_shapes=[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
        example_dtypes=[dtype_name(a.dtype) for a in args if isinstance(a, torch.Tensor)],
        exported=ep,
    )
    ctx = PassContext(
        graph=mg,
        config=SimpleNamespace(module_prefix=prefix),
        example_inputs=args,
        dump_dir=Path(dump_dir) if dump_dir is not None else None,
    )
    passes = [segment_layers_pass] + ([annotate_costs_pass] if annotate else [])
    mg.gm = run_passes(passes, gm, ctx)
    log.info("captured %s: %d nodes, %d layers, %d kinds in %.2f s", mg.name, len(gm.graph.nodes),
             len(mg.layers), len(mg.kinds()), time.perf_counter() - t0)
    return mg


def _canonical_names(root: nn.Module) -> dict[str, str]:
    """FQN -> the first FQN of the same tensor (tied weights share one)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for named in (root.named_parameters(remove_duplicate=False), root.named_buffers(remove_duplicate=False)):
        for n, t in named:
            out[n] = first.setdefault(id(t), n)
    return out


def _match_device(model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Move example inputs to the ``meta`` device when the model lives there."""
    p = next(iter(model.parameters()), None)
    if p is None or p.device.type != "meta":
        return args, kwargs
    conv = lambda x: x.to("meta") if isinstance(x, torch.Tensor) and x.device.type != "meta" else x
    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


def _dynamic_shapes(args: tuple, kwargs: dict):
    from torch.export import Dim

    batch, seq = Dim("batch", min=1), Dim("seq", min=2)

    def spec(x):
        if not isinstance(x, torch.Tensor) or x.ndim == 0:
            return None
        d = {0: batch}
        if x.ndim >= 2:
            d[1] = seq
        return d

    return tuple(spec(a) for a in args) if not kwargs else {
        **{f"arg{i}": spec(a) for i, a in enumerate(args)}, **{k: spec(v) for k, v in kwargs.items()}}


def _export(root: nn.Module, args: tuple, kwargs: dict, dynamic_shapes):
    try:
        return torch.export.export(root, args, kwargs or None, strict=False, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # turn tracer failures into advice naming the module
        module = _failing_module(root, e)
        where = f" in module {module[0]!r} ({module[1]})" if module else ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = _hint(e)
        raise UnsupportedModelError(
            f"could not capture {type(root).__name__}{where}: {type(e).__name__}: {first}. {hint}"
        ) from e


def _failing_module(root: nn.Module, exc: BaseException) -> tuple[str, str] | None:
    """The innermost module of ``root`` whose ``forward`` is on the exception's traceback."""
    names = {id(m): n for n, m in root.named_modules()}
    found = None
    tb = exc.__traceback__
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if isinstance(obj, nn.Module) and id(obj) in names:
            found = (names[id(obj)].removeprefix(_WRAP_PREFIX) or "<root>", type(obj).__name__)
        tb = tb.tb_next
    return found


def _hint(exc: BaseException) -> str:
    text = f"{type(exc).__name__} {exc}".lower()
    if "data-dependent" in text or "guardon" in text.replace("_", "") or "could not guard" in text:
        return ("The model branches on tensor values; replace Python control flow on tensors with "
                "torch.where/torch.cond, or make the branch depend on shapes only.")
    if "dynamic" in text or "constraint" in text:
        return "Try capture(..., dynamic=False) or inputs whose sizes are not specialised."
    if "meta" in text:
        return ("The model or an op does not support the meta device; build the model under "
                "FakeTensorMode or on cpu instead.")
    return ("Check that model(*example_inputs) runs eagerly, that it returns a tensor (pass loss_fn "
            "otherwise), and that custom ops have fake/meta kernels.")
