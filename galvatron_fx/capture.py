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

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from galvatron_fx.errors import CaptureError, UnsupportedModelError
from galvatron_fx.ir.graph import BatchScaling, InputInfo, ModelGraph, ParamInfo, dtype_name
from galvatron_fx.passes.localize_batch import quiet_fake_tensor_log
from galvatron_fx.passes.repeat_blocks import (
    STAMPED_FROM,
    NoFold,
    export_folded,
    export_truncated,
    repeated_lists,
    stamped_from,
)
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
    batch (:func:`mark_batched`: ``mg.batched``, ``mg.batch_scaling``) and which of its layers
    couple samples (``mg.coupled``: a value holding the batch in two dims, as CLIP's image × text
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
        with _without_stack_traces():
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
        _probe(mg, root, args, kwargs, lists if folded else [])
    log.info("captured %s: %d nodes, %d layers, %d kinds in %.2f s", mg.name, len(gm.graph.nodes),
             len(mg.layers), len(mg.kinds()), time.perf_counter() - t0)
    return mg


@contextlib.contextmanager
def _without_stack_traces():
    """Export records no Python stack trace per node: nothing here reads them, and collecting
    them is a tenth of a large export's time (torches without the switch record them)."""
    config = getattr(torch.fx, "config", None)
    old = getattr(config, "do_not_emit_stack_traces", None) if config is not None else None
    if old is None:
        yield
        return
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = old


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


def _probe(mg: ModelGraph, root: nn.Module, args: tuple, kwargs: dict, lists: list[tuple[str, int]]) -> None:
    """:func:`mark_batched` from ``root`` exported at twice the batch (see :func:`capture`), with
    each folded list of the capture (``lists``) cut to its first block: every later block's node
    is marked as the node of block 0 it copies (the stamp checked block 1 is block 0's program
    op for op, on values of the same shapes). Where the probe shows that block 0 reads a value of
    another shape than block 1 reads in its place at the probe's batch (a value broadcast over a
    batch of one that block 1 reads batched), two blocks are traced, as the capture traced them."""
    if not mg.example_shapes or not mg.example_shapes[0] or mg.example_shapes[0][0] < 1:
        return
    batch = mg.example_shapes[0][0]

    def twice(x):
        if isinstance(x, torch.Tensor) and x.ndim >= 1 and x.shape[0] == batch:
            return torch.cat([x, x]) if x.device.type != "meta" else x.new_empty((2 * batch, *x.shape[1:]))
        return x

    was_training = root.training
    try:
        with quiet_fake_tensor_log(), _without_stack_traces():  # (a graph with the batch baked in fails here)
            a2, k2 = tuple(twice(a) for a in args), {k: twice(v) for k, v in kwargs.items()} or None
            export = lambda: torch.export.export(root, a2, k2, strict=False)  # noqa: E731
            if not lists:
                probe, origin = export().graph_module, {}
                pairs = paired_nodes(mg.gm, probe)
            else:
                probe, origin, pairs = _probe_blocks(mg, root, export, lists)
    except Exception as e:  # an optimisation and a check: the graph stands without
        log.info("no batch probe of %s (%s: %s): layers run with the whole batch's semantics where dp > 1",
                 mg.name, type(e).__name__, str(e)[:200])
        return
    finally:
        root.train(was_training)
    _mark(mg, probe, 2 * batch, origin, pairs)


def _probe_blocks(mg: ModelGraph, root: nn.Module, export, lists: list[tuple[str, int]]):
    """``(probe graph, origin, pairs)`` of :func:`_probe` for a folded capture: one block per list
    where that tells every block apart, else two."""
    try:
        probe = export_truncated(root, export, lists, 1).graph_module
    except Exception as e:  # (two blocks export where one may not: a model that indexes its second block)
        log.info("%s: the batch probe traces two blocks per list (one: %s: %s)", mg.name, type(e).__name__,
                 str(e)[:200])
    else:
        origin = stamped_from(mg.gm, 1)
        pairs = paired_nodes(mg.gm, probe, origin)
        if _blocks_read_alike(origin, pairs):
            return probe, origin, pairs
        log.info("%s: block 0 reads a value of another shape than block 1 does at the probe's batch: the batch "
                 "probe traces two blocks per list", mg.name)
    probe = export_truncated(root, export, lists, 2).graph_module
    origin = stamped_from(mg.gm, 2)
    return probe, origin, paired_nodes(mg.gm, probe, origin)


def _blocks_read_alike(origin: dict, pairs: dict) -> bool:
    """Whether every block-1 node (of ``origin``, :func:`stamped_from` with one block traced) reads,
    argument by argument, values whose pairs in the probe have the shapes of those its block-0
    origin reads there: then block 1 runs block 0's program at the probe's batch too."""
    def shapes(x):
        return [tuple(v.shape) if isinstance(v, torch.Tensor) else v for v in tree_flatten(x.meta.get("val"))[0]]

    for n, o in origin.items():
        if n.meta[STAMPED_FROM][1] != 1 or n.op == "placeholder":
            continue
        mine = [a for a in tree_flatten((n.args, n.kwargs))[0] if isinstance(a, torch.fx.Node)]
        theirs = [a for a in tree_flatten((o.args, o.kwargs))[0] if isinstance(a, torch.fx.Node)]
        if len(mine) != len(theirs):
            return False
        for a, c in zip(mine, theirs):
            if a is c:
                continue
            pa, pc = pairs.get(a), pairs.get(c)
            if (pa is None) != (pc is None) or (pa is not None and shapes(pa) != shapes(pc)):
                return False
    return True


def mark_batched(mg: ModelGraph, probe: ModelGraph) -> set[str]:
    """Record in ``mg.batched`` the values whose dim 0 is the batch, from ``probe``: the same
    model captured at twice the batch. A value (a node of both graphs, paired by
    :func:`paired_nodes`) is batched when only its dim 0 differs, by the batch's factor. Values
    derived from the inputs without reading them (an attention mask or positions built from
    ``arange`` and the batch size) are found as well as those computed from the inputs. Also
    records ``mg.batch_scaling``: every integer argument and output size that follows the batch
    (what re-instantiating the graph at a data-parallel rank's share of the batch needs,
    :mod:`galvatron_fx.passes.localize_batch`). Returns the set."""
    origin = stamped_from(mg.gm)
    return _mark(mg, probe.gm, probe.example_shapes[0][0], origin, paired_nodes(mg.gm, probe.gm, origin))


def _mark(mg: ModelGraph, probe_gm: torch.fx.GraphModule, b2: int, origin: dict, pairs: dict) -> set[str]:
    """:func:`mark_batched` against ``probe_gm`` with the nodes paired (:func:`paired_nodes`: op by
    op on paired inputs, not by name: a batch of one can trace otherwise, a copy its contiguous
    slice skips shifting every later name); a stamped node of ``origin`` is marked as its origin."""
    b = mg.example_shapes[0][0]
    unpaired = [n.name for n in mg.gm.graph.nodes if n not in pairs]
    out: set[str] = set()
    ints: dict[str, tuple[tuple[int, int], ...]] = {}
    dims: dict[str, tuple[tuple[int, ...], ...]] = {}
    irregular: set[str] = set()

    def scaled(v: int, w: int) -> bool:
        return v != w and v * b2 == w * b

    for n in mg.gm.graph.nodes:
        o = origin.get(n)
        if o is not None and n in pairs:  # a stamped copy: found as its origin was (the same op and constants)
            for found in cast(tuple[dict[str, Any], ...], (ints, dims)):
                if o.name in found:
                    found[n.name] = found[o.name]
            if o.name in irregular:
                irregular.add(n.name)
            if o.name in out:
                out.add(n.name)
            continue
        m = pairs.get(n)  # (a pair is the same op)
        if m is None:
            irregular.add(n.name)
            continue
        if n.op == "call_function":
            mine, theirs = tree_flatten((n.args, n.kwargs))[0], tree_flatten((m.args, m.kwargs))[0]
            if len(mine) != len(theirs):
                irregular.add(n.name)
                continue
            found_ints: list[tuple[int, int]] = []
            for i, (x, y) in enumerate(zip(mine, theirs)):
                if type(x) is int and type(y) is int and x != y:
                    if not scaled(x, y):
                        irregular.add(n.name)
                    found_ints.append((i, x))
            if found_ints:
                ints[n.name] = tuple(found_ints)
        vals = [v for v in tree_flatten(n.meta.get("val"))[0]]
        wals = [w for w in tree_flatten(m.meta.get("val"))[0]]
        if len(vals) != len(wals):
            irregular.add(n.name)
            continue
        per_out = []
        for v, w in zip(vals, wals):
            if not isinstance(v, torch.Tensor):
                continue
            if not isinstance(w, torch.Tensor) or v.ndim != w.ndim:
                irregular.add(n.name)
                break
            diff = [d for d in range(v.ndim) if int(v.shape[d]) != int(w.shape[d])]
            if any(not scaled(int(v.shape[d]), int(w.shape[d])) for d in diff):
                irregular.add(n.name)
            per_out.append(tuple(diff))
        if any(per_out):
            dims[n.name] = tuple(per_out)
        v, w = n.meta.get("val"), m.meta.get("val")
        if isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) and v.ndim >= 1 and v.ndim == w.ndim \
                and tuple(v.shape[1:]) == tuple(w.shape[1:]) and int(w.shape[0]) * b == int(v.shape[0]) * b2 \
                and v.shape[0] != w.shape[0]:
            out.add(n.name)
    mg.batched = out
    if unpaired:
        log.info("the batch probe of %s traced %d op(s) otherwise at %d samples than at %d (first: %s): their sizes "
                 "are not followed (a layer holding one keeps the whole batch's semantics)", mg.name, len(unpaired),
                 b2, b, unpaired[0])
    mg.batch_scaling = BatchScaling(batch=b, probe_batch=b2, ints=ints, dims=dims, irregular=frozenset(irregular))
    return out


# ops that copy a value as it is: a graph may have one where the other has none (``contiguous`` of
# a slice that is contiguous at a batch of one only)
_COPIES = (torch.ops.aten.contiguous.default, torch.ops.aten.clone.default, torch.ops.aten.alias.default)


def paired_nodes(gm: torch.fx.GraphModule, other: torch.fx.GraphModule, origin: dict | None = None) -> dict:
    """Node of ``gm`` -> the node of ``other`` (the same program traced at another batch) that
    computes the same: placeholders by name, every other node by its op and its inputs' pairs, in
    order, a node of the same name first among equals. A copy that only one graph makes is seen
    through (its readers pair with the other graph's readers of the value copied). Nodes without a
    pair are left out. ``origin`` (a stamped node of ``gm`` -> the node it copies,
    :func:`~galvatron_fx.passes.repeat_blocks.stamped_from`) pairs a copy with its origin's pair:
    ``other`` may then hold the two traced blocks only, and what follows the blocks pairs through
    the last copy as through block 1."""
    origin = origin or {}
    def source(n, paired: bool):  # a value through the copies of it
        while n.op == "call_function" and n.target in _COPIES and n.args and isinstance(n.args[0], torch.fx.Node) \
                and not (paired and n in pairs):
            n = n.args[0]
        return n

    index: dict[tuple, list] = {}
    key_of: dict = {}
    named = {n.name: n for n in other.graph.nodes}
    for m in other.graph.nodes:
        if m.op in ("call_function", "call_method", "output"):
            key_of[m] = key = (m.op, m.target, tuple(source(a, False) for a in m.all_input_nodes))
            index.setdefault(key, []).append(m)
    first: dict[tuple, int] = {}  # per key, where its unpaired nodes start (in order)
    pairs: dict = {}
    used: set = set()
    for n in gm.graph.nodes:
        o = origin.get(n)
        if o is not None:
            if o in pairs:
                pairs[n] = pairs[o]
            continue
        if n.op in ("placeholder", "get_attr"):
            m = named.get(n.name)
            if m is not None and m.op == n.op:
                pairs[n] = m
                used.add(m)
            continue
        ins = []
        for a in n.all_input_nodes:
            a = source(a, True)
            if a not in pairs:
                break
            ins.append(pairs[a])
        else:
            key = (n.op, n.target, tuple(source(m, False) for m in ins))
            m = named.get(n.name)
            if m is None or m in used or key_of.get(m) != key:
                same, i = index.get(key, ()), first.get(key, 0)
                while i < len(same) and same[i] in used:
                    i += 1
                first[key] = i
                m = same[i] if i < len(same) else None
            if m is not None:
                pairs[n] = m
                used.add(m)
    return pairs


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
