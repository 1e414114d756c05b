"""batch_probe — which values of a captured graph hold the batch.

The model is exported again at twice the batch and the two graphs are paired node by node
(:func:`paired_nodes`); a value whose dim 0 follows the batch is batched (``mg.batched``), and
every integer argument and size that follows it is recorded (``mg.batch_scaling``), which
:mod:`galvatron_fx.passes.localize_batch` needs to re-instantiate a graph at a rank's share of the
batch. A capture whose repeated blocks were stamped out (:mod:`galvatron_fx.passes.repeat_blocks`)
is probed with one block per list: every later block's node is marked as the node it copies.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, cast

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from galvatron_fx.ir.graph import BatchScaling, ModelGraph
from galvatron_fx.passes.localize_batch import quiet_fake_tensor_log
from galvatron_fx.passes.repeat_blocks import STAMPED_FROM, export_truncated, stamped_from

log = logging.getLogger(__name__)

__all__ = ["mark_batched", "paired_nodes", "probe_batch", "without_stack_traces"]


@contextlib.contextmanager
def without_stack_traces():
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


def probe_batch(mg: ModelGraph, root: nn.Module, args: tuple, kwargs: dict, lists: list[tuple[str, int]]) -> None:
    """:func:`mark_batched` from ``root`` exported at twice the batch (see :func:`galvatron_fx.frontend.capture.capture`), with
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
        with quiet_fake_tensor_log(), without_stack_traces():  # (a graph with the batch baked in fails here)
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
