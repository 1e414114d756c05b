"""capture — trace a model (with its loss) to an ATen training graph and segment it.

``capture(model, example_inputs)`` runs ``torch.export`` (non-strict) on the model, which may
live on a real device, on ``meta`` or in a ``FakeTensorMode``: planning never needs real
weights. The result is a :class:`~galvatron_fx.ir.ModelGraph` with parameters, layers and (by
default) costs from ``annotate_costs_pass``.

Loss: ``model(*example_inputs, **example_kwargs)`` should return the scalar loss, or a structure
that holds it: a Hugging Face ``ModelOutput`` or dict with a ``loss`` entry (labels passed in), or
a tuple or list whose first element is the loss (``ModelGraph.output_names``; the other outputs
are ``extra_output_names``). If the
model returns no loss (logits only), pass ``loss_fn(output, target)``: the last example input is
then the target and the model is called with the others.

Inputs: the graph's user inputs are the tensors among the positional and keyword arguments
(``ModelGraph.input_names``, bound by :meth:`ModelGraph.bind_inputs`); other arguments
(``use_cache=False``) are specialised into the graph, and a later call must pass the same
values. Example inputs that are the same tensor (``labels=input_ids``) are captured as two
inputs. Lifted tensor constants (``torch.tensor(...)`` in a forward) are kept in
``ModelGraph.constants``; the buffers a model updates in training (BatchNorm's running
statistics) are listed in ``ModelGraph.mutated_buffers``: the runtime updates them as
``DistributedDataParallel`` does (each rank from its share of the batch, rank 0's kept).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
import torch.nn as nn

from galvatron_fx.errors import CaptureError, UnsupportedModelError
from galvatron_fx.ir.graph import InputInfo, ModelGraph, ParamInfo, dtype_name
from galvatron_fx.passes.batch_probe import probe_batch, without_stack_traces
from galvatron_fx.passes.repeat_blocks import NoFold, export_folded, repeated_lists
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
    probe: bool = True,
    name: str | None = None,
    dump_dir: str | Path | None = None,
) -> ModelGraph:
    """Trace ``model`` to a :class:`ModelGraph` with layers (and costs when ``annotate``).

    ``dynamic=True`` makes dim 0 of every input a symbolic ``batch`` and dim 1 of inputs with
    two or more dims a symbolic ``seq``; costs are then annotated at the example sizes.
    ``probe``: trace the model once more at twice the batch to learn how its sizes follow the
    batch (:mod:`~galvatron_fx.passes.batch_probe`: ``mg.batched``, ``mg.batch_scaling``) and
    which of its layers couple samples (``mg.coupled``: a value holding the batch in two dims, as CLIP's image × text
    similarities); a model that cannot be traced at that batch is captured without (logged).
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
    args, kwargs = _unalias(args, kwargs)
    root = _WithLoss(model, loss_fn) if loss_fn is not None else model
    prefix = _WRAP_PREFIX if loss_fn is not None else ""

    dynamic_shapes = _dynamic_shapes(args, kwargs) if dynamic else None
    was_training = model.training
    lists = [] if dynamic else repeated_lists(root)
    try:
        with without_stack_traces():
            ep = _export_folded(root, args, kwargs, lists, type(model).__name__) if lists else None
            folded = ep is not None
            if ep is None:
                ep = _export(root, args, kwargs, dynamic_shapes)
    finally:
        model.train(was_training)
    gm = ep.graph_module
    sig = ep.graph_signature
    mutated = _mutated_buffers(gm, sig)
    outputs, extra_outputs = _select_loss(gm, ep, type(model).__name__, loss_fn is not None)
    inputs = _user_inputs(sig, args, kwargs)
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
    tensor_inputs = [i for i in inputs if i.is_tensor]
    by_node = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    mg = ModelGraph(
        gm=gm,
        params=params,
        input_names=[i.name for i in tensor_inputs],
        output_names=outputs,
        extra_output_names=extra_outputs,
        output_keys=_output_keys(ep, gm),
        name=name or type(model).__name__,
        example_shapes=[tuple(int(d) for d in by_node[i.name].meta["val"].shape) for i in tensor_inputs],
        example_dtypes=[dtype_name(by_node[i.name].meta["val"].dtype) for i in tensor_inputs],
        exported=None if folded else ep,
        inputs=inputs,
        constants={strip(fqn): t for fqn, t in ep.constants.items() if isinstance(t, torch.Tensor)},
        mutated_buffers=[strip(fqn) for fqn in mutated],
    )
    ctx = PassContext(
        graph=mg,
        config=SimpleNamespace(module_prefix=prefix),
        example_inputs=args,
        dump_dir=Path(dump_dir) if dump_dir is not None else None,
    )
    passes = [segment_layers_pass] + ([annotate_costs_pass] if annotate else [])
    mg.gm = run_passes(passes, gm, ctx)
    if probe and not dynamic:
        probe_batch(mg, root, args, kwargs, lists if folded else [])
    log.info("captured %s: %d nodes, %d layers, %d kinds in %.2f s", mg.name, len(gm.graph.nodes),
             len(mg.layers), len(mg.kinds()), time.perf_counter() - t0)
    return mg


def _export_folded(root: nn.Module, args: tuple, kwargs: dict, lists: list[tuple[str, int]], name: str):
    """``root`` exported with its runs of alike blocks traced once (:mod:`~galvatron_fx.passes.repeat_blocks`),
    or None where that is not safe (logged)."""
    t0 = time.perf_counter()
    try:
        ep = export_folded(root, lambda: torch.export.export(root, args, kwargs or None, strict=False), lists)
    except NoFold as e:
        log.info("%s: exporting every block (%s)", name, e)
        return None
    log.info("%s: exported two blocks of %s and stamped out the rest in %.2f s", name,
             ", ".join(f"{p} ({n})" for p, n in lists), time.perf_counter() - t0)
    return ep


def _unalias(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The example inputs with every repeat of one tensor (``labels=input_ids``) cloned, so that
    export gives each its own input: at run time they are different tensors."""
    seen: set[int] = set()

    def own(x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in seen:
            return x.clone()
        seen.add(id(x))
        return x

    return tuple(own(a) for a in args), {k: own(v) for k, v in kwargs.items()}


def _user_inputs(sig, args: tuple, kwargs: dict) -> list[InputInfo]:
    """One :class:`InputInfo` per user input of the exported graph, in its order: where the
    caller passes it (a position or a keyword) and, for non-tensors, the value specialised."""
    from torch.utils._pytree import MappingKey, SequenceKey, tree_flatten_with_path

    leaves, _ = tree_flatten_with_path((args, kwargs))
    specs = [s for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    if len(leaves) != len(specs):
        raise UnsupportedModelError(
            f"could not match the {len(leaves)} example input leaves to the graph's {len(specs)} user inputs; "
            "pass tensors as plain positional or keyword arguments")
    out = []
    for (path, value), spec in zip(leaves, specs):
        if len(path) != 2 or not isinstance(path[1], (SequenceKey, MappingKey)):
            where = "".join(str(k) for k in path)
            raise UnsupportedModelError(
                f"example input {where} is nested inside another argument; pass each tensor as its own "
                "positional or keyword argument")
        key = path[1].idx if isinstance(path[1], SequenceKey) else str(path[1].key)
        is_tensor = isinstance(value, torch.Tensor)
        out.append(InputInfo(name=spec.arg.name, key=key, is_tensor=is_tensor,
                             value=None if is_tensor else value))
    return out


def _mutated_buffers(gm, sig) -> list[str]:
    """The buffers the model writes in training (BatchNorm's running statistics, its count of
    batches), as FQNs. Writes show as the signature's mutated buffers, as ops whose schema writes
    a buffer input, or as the composite ``batch_norm``/``instance_norm`` in training mode with
    running statistics (their schema hides the write)."""
    buffers = sig.inputs_to_buffers
    mutated = list(sig.buffers_to_mutate.values())
    for n in gm.graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
            continue
        written = [a for a, arg in zip(n.args, t._schema.arguments)
                   if arg.alias_info is not None and arg.alias_info.is_write]
        if t.overloadpacket in (torch.ops.aten.batch_norm, torch.ops.aten.instance_norm) and len(n.args) > 5 \
                and n.args[5] is True:
            written += [a for a in n.args[3:5] if a is not None]
        mutated += [buffers[a.name] for a in written if isinstance(a, torch.fx.Node) and a.name in buffers
                    and buffers[a.name] not in mutated]
    return mutated


def _select_loss(gm, ep, model_name: str, has_loss_fn: bool) -> tuple[list[str], list[str]]:
    """The loss among the graph's outputs: ``([loss node], [the other tensor outputs' nodes])``.

    The loss is the output itself when it is a tensor, its ``loss`` entry for a ``ModelOutput``
    or dict, or its first element for a tuple or list; it must be a 0-dim floating tensor. The
    graph keeps returning every output (the ``torch.compile`` backend hands the others back)."""
    from torch.utils._pytree import tree_unflatten

    sig = ep.graph_signature
    user = list(sig.user_outputs)
    where = tree_unflatten(list(range(len(user))), ep.call_spec.out_spec)
    kind = type(where).__name__
    if isinstance(where, int):
        index = where
    elif getattr(where, "loss", None) is not None or (isinstance(where, dict) and where.get("loss") is not None):
        index = where["loss"] if isinstance(where, dict) else where.loss
    elif isinstance(where, (tuple, list)) and where and isinstance(where[0], int):
        index = where[0]
    else:
        index = None
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = list(out_node.args[0])
    first_user = len(flat) - len(user)
    loss = flat[first_user + index] if index is not None else None
    val = loss.meta.get("val") if isinstance(loss, torch.fx.Node) else None
    if not (isinstance(val, torch.Tensor) and val.ndim == 0 and val.is_floating_point()):
        what = f"{kind} whose loss entry is {'missing' if index is None else 'not a scalar'}"
        hint = ("the loss_fn must return a scalar tensor" if has_loss_fn else
                "pass labels so that the model computes its loss, or pass loss_fn(output, target) with the "
                "target as the last example input")
        raise UnsupportedModelError(f"{model_name} returns a {what}: galvatron_fx trains on a scalar loss; {hint}")
    others = [o.name for o in flat[first_user:] if isinstance(o, torch.fx.Node) and o is not loss]
    return [cast(torch.fx.Node, loss).name], list(dict.fromkeys(others))


def _output_keys(ep, gm) -> dict[str, str]:
    """Each user output node's place in the model's output, as a name: a ``ModelOutput``'s or
    dict's key (``logits``), a tuple's index, dotted where they nest (``past_key_values.0``)."""
    from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

    user = list(ep.graph_signature.user_outputs)
    where = tree_unflatten(list(range(len(user))), ep.call_spec.out_spec)
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = list(out_node.args[0])
    first_user = len(flat) - len(user)
    keys: dict[str, str] = {}
    for path, index in tree_flatten_with_path(where)[0]:
        node = flat[first_user + index]
        if isinstance(node, torch.fx.Node):
            name = ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
            keys.setdefault(node.name, name or "output")
    return keys


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
        if x.ndim in (2, 3):  # (B, T) ids, (B, T, C) embeddings; not (B, C, H, W) images
            d[1] = seq
        return d

    return tuple(spec(a) for a in args) if not kwargs else {
        **{f"arg{i}": spec(a) for i, a in enumerate(args)}, **{k: spec(v) for k, v in kwargs.items()}}


def _export(root: nn.Module, args: tuple, kwargs: dict, dynamic_shapes):
    try:
        try:
            return torch.export.export(root, args, kwargs or None, strict=False, dynamic_shapes=dynamic_shapes)
        except Exception as e:
            if dynamic_shapes is None or "Suggested fixes" not in str(e):
                raise
            # the model bounds or fixes a dim (a rotary table of 256 positions bounds the sequence):
            # take torch's suggested bounds once and say so
            from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

            fixes = [f.strip() for f in str(e)[str(e).index("Suggested fixes"):].splitlines()[1:] if " = " in f]
            log.warning("capture(dynamic=True): %s constrains its dims; capturing with %s", type(root).__name__,
                        "; ".join(fixes)[:300])
            refined = refine_dynamic_shapes_from_suggested_fixes("Suggested fixes:\n" + "\n".join(fixes),
                                                                 dynamic_shapes)
            return torch.export.export(root, args, kwargs or None, strict=False, dynamic_shapes=refined)
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
