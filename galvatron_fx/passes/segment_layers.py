"""segment_layers_pass — split the captured graph into layers and give each a structural kind.

Contract: requires the exported graph with ``nn_module_stack`` on call nodes and
``ctx.graph`` (a ModelGraph with ``params`` filled); produces ``"layers"``: ``ctx.graph.layers``
and ``facts(node).layer`` on every node. The graph itself is not changed.

Terms: a *block group* is a set of at least two sibling modules of one class whose names are
consecutive integers under one parent (an ``nn.ModuleList``/``nn.Sequential`` of blocks:
``blocks.0..N``, ``transformer.h.0..N``, ``encoder.block.0..N``). The *owner* of a node is
the outermost block-group member in its module stack.

Algorithm:
1. Find block groups from the module stacks of all call nodes; keep only the outermost
   (a group nested inside a member of another group, e.g. experts inside a block, is not one),
   except that a member holding a group whose members form a chain (each reads what the one
   before made: the blocks of a vision model's stage) is that group's members instead (one
   level down; the stage's other nodes, a downsampling, form their own layer).
2. Give each call node its owner; nodes without provenance (``getitem``, constants) take the
   owner of the node they read from, or of the previous node.
3. Cut the node sequence into runs of equal owner. Runs owned by a block are ``block`` layers
   named by the module; runs before the first block are the embedding; the run after the last
   block is cut into ``head`` (up to the last node that reads a parameter) and ``loss`` (the
   parameter-free tail that feeds the scalar output, with the nodes reading it); runs between
   blocks are ``embedding`` when they contain an embedding lookup, else ``other``. A graph
   without any block group falls back to one layer per top-level child module.
4. No layer may read a value a later layer makes (``_forward_only``): the reader moves to the
   later layer when nothing earlier reads it, else the value's producers move back to the
   reader's layer when they read nothing newer; otherwise ``UnsupportedModelError``. The
   ``getitem``s of an op with several outputs join its layer (layers hand on tensors only).
5. ``kind`` = a hash of the layer's canonical form: each node's op, output shapes/dtypes,
   constant arguments and wiring (argument → position of its producer inside the layer, or
   of its external input), with external inputs described by shape, dtype and whether they
   are parameters. Names never enter, so renamed models hash equally and a block with a
   different MLP width hashes differently.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import re
from dataclasses import replace
from typing import cast

import torch
import torch.fx as fx

from galvatron_fx.ir.graph import LayerInfo, LayerRole
from galvatron_fx.ir.meta import facts
from galvatron_fx.passes.runner import PassContext, graph_pass

log = logging.getLogger(__name__)

_INT = re.compile(r"^\d+$")


def module_stack(node: fx.Node, prefix: str = "") -> list[tuple[str, str]]:
    """``[(module FQN, class name), ...]`` from outermost to innermost, root excluded.

    ``prefix`` (e.g. ``"inner."`` for a loss wrapper) is stripped from every FQN.
    """
    stack = node.meta.get("nn_module_stack") or {}
    out = []
    for path, cls in stack.values():
        if prefix and path.startswith(prefix):
            path = path[len(prefix):]
        elif prefix and path + "." == prefix:
            continue
        if path:
            out.append((path, cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))))
    return out


def _block_members(call_nodes: list[fx.Node], prefix: str) -> set[str]:
    """Module FQNs that are members of an outermost block group, refined to a group nested in a
    member where that group's members form a chain (each reads what the one before made: the
    blocks of a vision model's stage); a nested group that is no chain (experts, each run on its
    own tokens) stays inside its block."""
    cls_of: dict[str, str] = {}
    nodes_of: dict[str, list[fx.Node]] = {}
    for n in call_nodes:
        for path, cls in module_stack(n, prefix):
            cls_of.setdefault(path, cls)
            nodes_of.setdefault(path, []).append(n)
    groups: dict[tuple[str, str], set[str]] = {}
    for path, cls in cls_of.items():
        parent, _, last = path.rpartition(".")
        if _INT.match(last):
            groups.setdefault((parent, cls), set()).add(path)
    groups = {k: g for k, g in groups.items() if len(g) >= 2}
    members = set().union(*groups.values()) if groups else set()

    def nested(path: str, within: str = "") -> bool:
        parts = path.split(".")
        return any(".".join(parts[:i]) in members and ".".join(parts[:i]).startswith(within)
                   for i in range(1, len(parts)) if ".".join(parts[:i]) != within)

    out: set[str] = set()
    for m in (m for m in members if not nested(m)):  # (one level down: a stage's blocks, not their parts)
        inner = [sorted(g, key=lambda p: int(p.rpartition(".")[2])) for (parent, _), g in groups.items()
                 if parent.startswith(m + ".") or parent == m]
        inner = [g for g in inner if not nested(g[0], m) and _chained(g, nodes_of, call_nodes)]
        out |= {p for g in inner for p in g} if inner else {m}
    return out


def _chained(paths: list[str], nodes_of: dict[str, list[fx.Node]], calls: list[fx.Node]) -> bool:
    """Whether each of the modules ``paths`` (in order) reads, through nodes of none of them,
    a value the module before it made (``calls``: every call node, in graph order)."""
    member = {n: i for i, p in enumerate(paths) for n in nodes_of.get(p, ())}
    last: dict[fx.Node, int] = {}  # a node outside the members -> the latest member its inputs come from
    chained = set()
    for n in calls:
        srcs = [member[a] if a in member else last.get(a, -1) for a in n.all_input_nodes]
        if n in member:
            if member[n] - 1 in srcs:
                chained.add(member[n])
        else:
            last[n] = max(srcs, default=-1)
    return all(i in chained for i in range(1, len(paths)))


def _owners(gm: fx.GraphModule, prefix: str) -> dict[fx.Node, str | None]:
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    members = _block_members(calls, prefix)
    owner: dict[fx.Node, str | None] = {}
    prev: str | None = None
    for n in calls:
        stack = module_stack(n, prefix)
        own = next((p for p, _ in stack if p in members), None)
        if not stack and (n.meta.get("nn_module_stack") is None or not n.all_input_nodes and not n.users):
            # no provenance (or a call for its effect alone, as the end of a vmap level, which
            # must stay with its start): follow the first node argument, else the previous node
            src = next((a for a in n.all_input_nodes if a in owner), None)
            own = owner[src] if src is not None else prev
        owner[n] = own
        prev = own
    return owner


def _reads_param(n: fx.Node, param_nodes: set[str]) -> bool:
    return any(a.name in param_nodes for a in n.all_input_nodes)


def _is_embedding(n: fx.Node) -> bool:
    return n.op == "call_function" and getattr(n.target, "__name__", "").startswith("embedding")


def _scalar_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    """Graph outputs that are 0-dim floating tensors: the losses."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [a for a in out.all_input_nodes
            if isinstance(v := a.meta.get("val"), torch.Tensor) and v.ndim == 0 and v.is_floating_point()]


def _ancestors(roots: list[fx.Node], within: set[fx.Node]) -> set[fx.Node]:
    """``roots`` and their producers, walking only through nodes in ``within``."""
    seen: set[fx.Node] = set()
    todo = [r for r in roots if r in within]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(a for a in n.all_input_nodes if a in within)
    return seen


def _split_runs(calls: list[fx.Node], owner: dict[fx.Node, str | None]) -> list[tuple[str | None, list[fx.Node]]]:
    runs: list[tuple[str | None, list[fx.Node]]] = []
    for n in calls:
        if runs and runs[-1][0] == owner[n]:
            runs[-1][1].append(n)
        else:
            runs.append((owner[n], [n]))
    return runs


def _top_level_runs(calls: list[fx.Node], prefix: str) -> list[tuple[str | None, list[fx.Node]]]:
    """Fallback without block groups: one run per top-level child module."""
    owner = {}
    prev = None
    for n in calls:
        stack = module_stack(n, prefix)
        own = stack[0][0].split(".")[0] if stack else None
        if own is None and n.meta.get("nn_module_stack") is None:
            own = prev
        owner[n] = own
        prev = own
    return _split_runs(calls, owner)


def segment(gm: fx.GraphModule, param_nodes: dict[str, str], prefix: str = "") -> list[tuple[str, LayerRole, list[fx.Node]]]:
    """Cut the graph into ``(name, role, nodes)`` segments (placeholders/output excluded).

    ``param_nodes`` maps placeholder name → parameter FQN.
    """
    calls = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    if not calls:
        raise ValueError("the captured graph has no operations")
    owner = _owners(gm, prefix)
    # get_attr nodes (constants, submodules of higher-order ops) go with their first user
    for n in calls:
        if n.op == "get_attr":
            user = next(iter(n.users), None)
            owner[n] = owner.get(user) if user is not None else None
    runs = _split_runs(calls, owner)
    has_blocks = any(o is not None for o, _ in runs)
    if not has_blocks:
        runs = _top_level_runs(calls, prefix)
        block_names: set[str] = set()
    else:
        block_names = {o for o, _ in runs if o is not None}

    pset = set(param_nodes)
    out: list[tuple[str, LayerRole, list[fx.Node]]] = []
    block_idx = [i for i, (o, _) in enumerate(runs) if o in block_names]
    first_block = block_idx[0] if block_idx else len(runs)
    last_block = block_idx[-1] if block_idx else -1
    seen: dict[str, int] = {}

    def add(name: str, role: LayerRole, nodes: list[fx.Node]) -> None:
        if not nodes:
            return
        if name in seen:
            seen[name] += 1
            name = f"{name}.{seen[name]}"
        else:
            seen[name] = 0
        out.append((name, role, nodes))

    tail: list[fx.Node] = []
    for i, (own, nodes) in enumerate(runs):
        if own in block_names:
            add(own, LayerRole.BLOCK, nodes)
        elif has_blocks and i < first_block:
            role = LayerRole.EMBEDDING if any(_is_embedding(n) for n in nodes) or i == 0 else LayerRole.OTHER
            add(str(role), role, nodes)
        elif has_blocks and i > last_block:
            tail.extend(nodes)
        elif has_blocks:
            role = LayerRole.EMBEDDING if any(_is_embedding(n) for n in nodes) else LayerRole.OTHER
            add(str(role), role, nodes)
        else:
            # fallback: top-level modules; parameter-free runs at the end become the loss
            tail_start = i == len(runs) - 1 and own is None
            if tail_start:
                tail.extend(nodes)
            else:
                role = LayerRole.EMBEDDING if any(_is_embedding(n) for n in nodes) else LayerRole.OTHER
                add(own or "other", role, nodes)
    if tail:
        last_param = max((k for k, n in enumerate(tail) if _reads_param(n, pset)), default=-1)
        rest = tail[last_param + 1 :]
        # the loss: what feeds the scalar output, and what reads it (checks of the loss's values)
        in_loss = _ancestors(_scalar_outputs(gm), set(rest))
        for n in rest:
            if any(a in in_loss for a in n.all_input_nodes):
                in_loss.add(n)
        add(str(LayerRole.HEAD), LayerRole.HEAD, [n for n in tail if n not in in_loss])
        add(str(LayerRole.LOSS), LayerRole.LOSS, [n for n in rest if n in in_loss])
    return _forward_only(out, gm)


def _forward_only(segments: list[tuple[str, LayerRole, list[fx.Node]]],
                  gm: fx.GraphModule) -> list[tuple[str, LayerRole, list[fx.Node]]]:
    """The segments with no layer reading a value made by a later layer (the runtime runs layers
    in order). A node reading a later layer's value moves to that layer when nothing before it
    reads the node (a metadata check, a value only later layers use); else the later layer's
    producers of the value move back to the reader's layer when they read nothing newer (labels
    shifted inside a model's loss, read by its head). Otherwise :class:`UnsupportedModelError`."""
    from galvatron_fx.errors import UnsupportedModelError

    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    layer_of = {n: i for i, (_, _, nodes) in enumerate(segments) for n in nodes}
    members = [list(nodes) for _, _, nodes in segments]

    def move(n: fx.Node, dst: int) -> None:
        members[layer_of[n]].remove(n)
        members[dst].append(n)
        members[dst].sort(key=pos.__getitem__)
        layer_of[n] = dst

    def late_input(n: fx.Node) -> fx.Node | None:
        return next((a for a in n.all_input_nodes if layer_of.get(a, -1) > layer_of[n]), None)

    for _ in range(len(pos)):  # each round fixes one backward read
        bad = next((n for n in gm.graph.nodes if n in layer_of and late_input(n) is not None), None)
        if bad is None:
            break
        src = cast(fx.Node, late_input(bad))  # not None: how ``bad`` was chosen
        here, there = layer_of[bad], layer_of[src]
        if all(layer_of.get(u, len(members)) >= there for u in bad.users):
            move(bad, there)
            continue
        chain = sorted(_ancestors([src], {n for n, l in layer_of.items() if l > here}), key=pos.__getitem__)
        newest = max((layer_of.get(a, -1) for c in chain for a in c.all_input_nodes if a not in chain), default=-1)
        if newest <= here:
            for n in chain:
                move(n, here)
            continue
        raise UnsupportedModelError(
            f"layer {segments[here][0]!r} reads {src.name} ({cast(str, src.format_node())[:80]}), which the "
            f"later layer {segments[there][0]!r} makes from values of its own: galvatron_fx runs layers in order. "
            "Compute the value in the module that first needs it, or keep the modules of one step in one block")
    # an op with several outputs (a split, a max with its indices) keeps its ``getitem``s: layers
    # hand each other tensors, never a tuple
    for n in gm.graph.nodes:
        if n in layer_of and isinstance(n.meta.get("val"), (tuple, list)):
            for u in list(n.users):
                if u.target is operator.getitem and layer_of.get(u, layer_of[n]) != layer_of[n]:
                    move(u, layer_of[n])
    return [(name, role, nodes) for (name, role, _), nodes in zip(segments, members) if nodes]



def kind_hash(nodes: list[fx.Node], param_nodes: set[str], *, floats: bool = True) -> str:
    """Structural hash of a layer: ops, shapes, dtypes, constants and wiring; never names.
    ``floats=False``: float constants left out (blocks that differ only in a scale or a drop
    probability, as a vision model's stochastic depth rates, hash alike: their placements do)."""
    local = {n: i for i, n in enumerate(nodes)}
    ext: dict[fx.Node, int] = {}
    parts: list[str] = []

    def val_sig(v) -> str:
        if isinstance(v, torch.Tensor):
            return f"T{tuple(v.shape)}{str(v.dtype)[6:]}"
        if isinstance(v, (list, tuple)):
            return "(" + ",".join(val_sig(x) for x in v) + ")"
        return type(v).__name__

    def arg_sig(a) -> str:
        if isinstance(a, fx.Node):
            if a in local:
                return f"%{local[a]}"
            if a not in ext:
                ext[a] = len(ext)
                kind = "P" if a.name in param_nodes else "X"
                parts.append(f"in{ext[a]}:{kind}{val_sig(a.meta.get('val'))}")
            return f"${ext[a]}"
        if isinstance(a, (list, tuple)):
            return "[" + ",".join(arg_sig(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ",".join(f"{k}={arg_sig(v)}" for k, v in sorted(a.items())) + "}"
        if isinstance(a, torch.device):
            return "device"  # the same layer on meta, fake or real devices is one kind
        if isinstance(a, torch.dtype | torch.memory_format | torch.layout):
            return str(a)
        if not floats and type(a) is float:
            return "f"
        return repr(a)

    for n in nodes:
        target = n.target if n.op != "get_attr" else "get_attr"
        tname = getattr(target, "__name__", None) if target is operator.getitem else str(target)
        if n.op == "get_attr":
            tname = f"get_attr:{val_sig(n.meta.get('val'))}"
        args = arg_sig(n.args) + arg_sig(n.kwargs)
        parts.append(f"{n.op}:{tname}{args}->{val_sig(n.meta.get('val'))}")
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]


def _layer_info(index: int, name: str, role: LayerRole, nodes: list[fx.Node], param_nodes: dict[str, str], prefix: str) -> LayerInfo:
    inside = set(nodes)
    params: list[str] = []
    inputs: list[str] = []
    outputs: list[str] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a in inside:
                continue
            if a.name in param_nodes:
                if param_nodes[a.name] not in params:
                    params.append(param_nodes[a.name])
            elif a.name not in inputs:
                inputs.append(a.name)
        if any(u not in inside for u in n.users):
            outputs.append(n.name)
    modules: list[str] = []
    for n in nodes:
        stack = module_stack(n, prefix)
        if stack and stack[-1][0] not in modules:
            modules.append(stack[-1][0])
    return LayerInfo(
        name=name,
        index=index,
        role=role,
        kind=kind_hash(nodes, set(param_nodes)),
        node_names=[n.name for n in nodes],
        param_names=params,
        input_names=inputs,
        output_names=outputs,
        modules=modules,
    )


@graph_pass(requires=(), produces=("layers",))
def segment_layers_pass(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    """Find the layers of ``gm`` and record them on ``ctx.graph.layers`` and on each node."""
    mg = ctx.graph
    param_nodes = {node: p.name for p in mg.params.values() for node in p.nodes}
    prefix = getattr(ctx.config, "module_prefix", "") if ctx.config is not None else ""
    segments = segment(gm, param_nodes, prefix)
    layers = [_layer_info(i, name, role, nodes, param_nodes, prefix) for i, (name, role, nodes) in enumerate(segments)]
    for layer, (_, _, nodes) in zip(layers, segments):
        for n in nodes:
            facts(n).layer = layer.name
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            facts(n).param = param_nodes.get(n.name)
    mg.layers = layers
    users: dict[str, list[str]] = {}
    for l in layers:
        for fqn in l.param_names:
            users.setdefault(fqn, []).append(l.name)
    mg.params = {fqn: replace(p, layers=tuple(users.get(fqn, ()))) for fqn, p in mg.params.items()}
    counts: dict[LayerRole, int] = {}
    for l in layers:
        counts[l.role] = counts.get(l.role, 0) + 1
    log.info("segmented %s into %d layers (%s), %d kinds", mg.name, len(layers),
             ", ".join(f"{v} {k}" for k, v in counts.items()), len(mg.kinds()))
    return gm
