"""repeat_blocks — export a run of identical blocks once and stamp out the others.

A model's ``nn.ModuleList`` of N ≥ :data:`MIN_BLOCKS` blocks that are alike (the same module
classes, parameter and buffer names, shapes and dtypes, and the same plain attributes but the
block's own index, as ``layer_idx``) is exported with its first two blocks only
(:func:`export_folded`); the second block's graph is then copied N - 2 times
(:func:`stamp_blocks`), each copy on its own parameters and buffers and reading, where the second
block reads the first block's values, the values of the copy before it. The graph is then the
one the whole model exports to, at a fraction of the tracing time: a Mamba block unrolls its
scan into thousands of ops per block, and exporting 24 of them twice (the batch probe) took
minutes.

The stamp is exact where the model runs its blocks one after the other, each reading what the
one before made (``for block in self.layers: x = block(x)``). It is checked on the export, and
any doubt keeps the whole export (:class:`NoFold`, logged): the two blocks must be the same
program op for op, with the same constants (an index baked into an op, as an expert loop or a
layer whose behaviour depends on its position, is a difference), the second block must read
something the first made (blocks that run side by side are no chain), the blocks' ops must be
contiguous in the graph, nothing after them may read the first block or either's parameters,
and no block may be mutated through the graph's outputs. Blocks sharing a parameter are not
alike.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:  # the checker reads the torch it is run with, which has it
    from torch.fx._lazy_graph_module import _LazyGraphModule as _StampedModule
else:
    try:  # a module that writes its Python code when first called or read, not when built: a stamped
        # graph of tens of thousands of nodes is planned without ever running as one module (seconds)
        from torch.fx._lazy_graph_module import _LazyGraphModule as _StampedModule
    except ImportError:  # pragma: no cover (a torch without it)
        _StampedModule = fx.GraphModule

log = logging.getLogger(__name__)

MIN_BLOCKS = 4  # two are exported; folding pays from the third block on
# a stamped node's meta key: ``(name, j)``: the node of the block before that it copies (block 1's
# for a copy, block 0's for block 1's own: the stamp checked they are one program) and its block
# ``j``. Whatever is found of the origin holds of the copy (:func:`stamped_from`)
STAMPED_FROM = "stamped_from"
_PLAIN = (bool, int, float, str, type(None))


class NoFold(Exception):
    """The export cannot be stamped out safely (the reason); the caller exports the whole model."""


def repeated_lists(root: nn.Module) -> list[tuple[str, int]]:
    """``[(FQN, number of blocks)]`` of the module lists of ``root`` whose blocks are alike (see
    the module doc), outermost first; a list inside a chosen one is not chosen."""
    out: list[tuple[str, int]] = []
    for name, mod in root.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) < MIN_BLOCKS:
            continue
        if any(name.startswith(p + ".") for p, _ in out):
            continue
        if _alike(list(mod)):
            out.append((name, len(mod)))
    return out


def _signature(block: nn.Module, index_attrs: set[tuple[str, str]]) -> tuple:
    mods = [(n, type(m)) for n, m in block.named_modules()]
    params = [(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in block.named_parameters(remove_duplicate=False)]
    bufs = [(n, tuple(b.shape), b.dtype) for n, b in block.named_buffers(remove_duplicate=False)]
    attrs = []
    for n, m in block.named_modules():
        for k, v in sorted(vars(m).items()):
            if k.startswith("_") or (n, k) in index_attrs:
                continue
            if isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(e, _PLAIN) for e in v)):
                attrs.append((n, k, v))
    return mods, params, bufs, attrs


def _alike(blocks: list[nn.Module]) -> bool:
    """Whether ``blocks`` have one structure and no tensor in common (see the module doc)."""
    seen: set[int] = set()
    for b in blocks:
        for t in list(b.parameters()) + list(b.buffers()):
            if id(t) in seen:
                return False
            seen.add(id(t))
    # an int attribute equal to the block's position in every block is its index (layer_idx)
    ints: dict[tuple[str, str], list] = {}
    for b in blocks:
        for n, m in b.named_modules():
            for k, v in vars(m).items():
                if type(v) is int:
                    ints.setdefault((n, k), []).append(v)
    index_attrs = {key for key, vs in ints.items() if vs == list(range(len(blocks)))}
    first = _signature(blocks[0], index_attrs)
    return all(_signature(b, index_attrs) == first for b in blocks[1:])


@contextlib.contextmanager
def _undone(root: nn.Module) -> Iterator[None]:
    """Whatever a forward leaves on ``root``'s modules undone on exit: attributes set and hooks
    registered (Hugging Face installs its output-recording hooks on the blocks present at the
    first forward and marks the model done: on a cut list they would record two blocks for good)."""
    saved = []
    for m in root.modules():
        hooks = {k: dict(v) for k, v in vars(m).items() if "hook" in k and isinstance(v, dict)}
        saved.append((m, dict(vars(m)), hooks))
    try:
        yield
    finally:
        for m, attrs, hooks in saved:
            d = vars(m)
            for k in [k for k in d if k not in attrs]:
                del d[k]
            d.update(attrs)
            for k, h in hooks.items():
                d[k].clear()
                d[k].update(h)


@contextlib.contextmanager
def _truncated(root: nn.Module, lists: list[tuple[str, int]], blocks: int = 2) -> Iterator[None]:
    """``root`` with each of ``lists`` cut to its first ``blocks`` blocks (restored on exit)."""
    saved = []
    try:
        for path, _ in lists:
            parent_name, _, attr = path.rpartition(".")
            parent = root.get_submodule(parent_name) if parent_name else root
            full = cast(nn.ModuleList, parent._modules[attr])
            saved.append((parent, attr, full))
            parent._modules[attr] = nn.ModuleList(list(full)[:blocks])
        yield
    finally:
        for parent, attr, full in reversed(saved):
            parent._modules[attr] = full


def export_folded(root: nn.Module, export: Callable[[], Any], lists: list[tuple[str, int]]) -> SimpleNamespace:
    """``export()`` run on ``root`` with ``lists`` cut to two blocks, then stamped out to their
    full length: an object with the ``ExportedProgram`` attributes capture reads
    (``graph_module``, ``graph_signature``, ``call_spec``, ``constants``). Raises :class:`NoFold`."""
    with _undone(root), _truncated(root, lists):
        try:
            ep = export()
        except Exception as e:
            raise NoFold(f"the model does not export with two blocks per list ({type(e).__name__}: "
                         f"{str(e)[:200]})") from e
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    buffers = dict(sig.inputs_to_buffers)
    gm = ep.graph_module
    for path, n in lists:
        if any(fqn == path or fqn.startswith(path + ".") for fqn in sig.buffers_to_mutate.values()):
            raise NoFold(f"{path} mutates a buffer through the graph's outputs")
        gm = stamp_blocks(gm, path, n, params, buffers)
    out_node = next(iter(reversed(gm.graph.nodes)))
    flat = list(out_node.args[0])
    user = flat[len(flat) - len(sig.user_outputs):]
    new_sig = SimpleNamespace(
        inputs_to_parameters=params, inputs_to_buffers=buffers,
        inputs_to_lifted_tensor_constants=dict(sig.inputs_to_lifted_tensor_constants),
        buffers_to_mutate=dict(sig.buffers_to_mutate), input_specs=list(sig.input_specs),
        user_outputs=[u.name if isinstance(u, fx.Node) else u for u in user])
    return SimpleNamespace(graph_module=gm, graph_signature=new_sig, call_spec=ep.call_spec, constants=ep.constants)


def export_truncated(root: nn.Module, export: Callable[[], object], lists: list[tuple[str, int]],
                     blocks: int = 2):
    """``export()`` run on ``root`` with ``lists`` cut to ``blocks`` blocks, not stamped out: what
    a graph stamped from the same blocks needs of another trace of them (the batch probe pairs
    each stamped node through :func:`stamped_from`)."""
    with _undone(root), _truncated(root, lists, blocks):
        return export()


def stamped_from(gm: fx.GraphModule, traced: int = 2) -> dict[fx.Node, fx.Node]:
    """Node of block ``j >= traced`` of a stamped list of ``gm`` -> the node of block ``j - 1`` it
    is a copy of (see :func:`stamp_blocks`; ``traced=1`` includes block 1's nodes, whose origin is
    block 0's), for those whose origin is still in ``gm`` before them, with the same op and target
    (a placeholder: the same op)."""
    out: dict[fx.Node, fx.Node] = {}
    named: dict[str | None, fx.Node] = {}
    for n in gm.graph.nodes:
        o, j = n.meta.get(STAMPED_FROM) or (None, 0)
        if j >= traced:
            m = named.get(o)
            if m is not None and m.op == n.op and (n.op == "placeholder" or m.target == n.target):
                out[n] = m
        named[n.name] = n
    return out


def _block_of(n: fx.Node, path: str) -> int | None:
    """The index of the block of the list ``path`` that ``n`` was traced in, if any."""
    for p, _ in (n.meta.get("nn_module_stack") or {}).values():
        if isinstance(p, str) and p.startswith(path + "."):
            head = p[len(path) + 1:].split(".", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def _renamer(path: str, j: int) -> Callable[[str], str]:
    pat = re.compile(re.escape(f"{path}.1") + r"(?=\.|$)")
    return lambda s: pat.sub(f"{path}.{j}", s)


def stamp_blocks(gm: fx.GraphModule, path: str, n_blocks: int, params: dict[str, str],
                 buffers: dict[str, str]) -> fx.GraphModule:
    """``gm`` (exported with blocks 0 and 1 of the list ``path``) with blocks 2 … ``n_blocks`` - 1
    stamped out after block 1; ``params`` and ``buffers`` (placeholder name → FQN) gain the new
    placeholders. Raises :class:`NoFold` where the check of the module doc fails."""
    nodes = list(gm.graph.nodes)
    calls = [n for n in nodes if n.op in ("call_function", "call_method", "call_module")]
    b0 = [n for n in calls if _block_of(n, path) == 0]
    b1 = [n for n in calls if _block_of(n, path) == 1]
    if not b0 or len(b0) != len(b1):
        raise NoFold(f"{path}: blocks 0 and 1 trace to {len(b0)} and {len(b1)} ops")
    pos = {n: i for i, n in enumerate(nodes)}
    span = nodes[pos[b0[0]]:pos[b1[-1]] + 1]
    s0, s1 = set(b0), set(b1)
    if any(n not in s0 and n not in s1 for n in span) or pos[b0[-1]] > pos[b1[0]]:
        raise NoFold(f"{path}: the blocks' ops are not one contiguous run, block by block")

    def own(table: dict[str, str], j: int) -> dict[str, str]:  # FQN tail -> placeholder name
        head = f"{path}.{j}."
        return {fqn[len(head):]: name for name, fqn in table.items() if fqn.startswith(head)}

    by_name = {n.name: n for n in nodes}
    p_corr: dict[fx.Node, fx.Node] = {}
    for table in (params, buffers):
        t0, t1 = own(table, 0), own(table, 1)
        if set(t0) != set(t1):
            raise NoFold(f"{path}: blocks 0 and 1 have different parameters in the graph")
        p_corr.update({by_name[t0[k]]: by_name[t1[k]] for k in t0})
    corr = dict(zip(b0, b1)) | p_corr
    ph1 = set(p_corr.values())
    carried = False
    for a, b in zip(b0, b1):
        if a.op != b.op or a.target != b.target:
            raise NoFold(f"{path}: block 1 runs {b.target} where block 0 runs {a.target}")
        fa, sa = tree_flatten((a.args, a.kwargs))
        fb, sb = tree_flatten((b.args, b.kwargs))
        if sa != sb:
            raise NoFold(f"{path}: {a.name} and {b.name} take different arguments")
        for x, y in zip(fa, fb):
            if isinstance(x, fx.Node) != isinstance(y, fx.Node):
                raise NoFold(f"{path}: {a.name} and {b.name} take different arguments")
            if not isinstance(x, fx.Node):
                if type(x) is not type(y) or (x != y and not (x != x and y != y)):
                    raise NoFold(f"{path}: {b.name} takes {y!r} where {a.name} takes {x!r}")
            elif x in corr:
                if y is not corr[x]:
                    raise NoFold(f"{path}: {b.name} does not read block 1's own value where {a.name} reads block 0's")
            elif y is not x:
                if y not in s0:
                    raise NoFold(f"{path}: {b.name} reads {y.name} where {a.name} reads {x.name}")
                carried = True  # block 1 reads block 0's value where block 0 read one made before it
        if not _same_meta(a, b):
            raise NoFold(f"{path}: {a.name} and {b.name} make values of different shapes")
    if not carried:
        raise NoFold(f"{path}: block 1 reads nothing block 0 made (the blocks are no chain)")
    after = nodes[pos[b1[-1]] + 1:]
    for n in after:
        bad = [a for a in n.all_input_nodes if a in s0 or a in p_corr or a in ph1]
        if bad:
            raise NoFold(f"{path}: {n.name}, after the blocks, reads {bad[0].name} of a block")
    for x in p_corr:
        if any(u not in s0 for u in x.users) or any(u not in s1 for u in p_corr[x].users):
            raise NoFold(f"{path}: a block's parameter is read outside its block")

    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    copies: list[dict[fx.Node, fx.Node]] = []  # per stamped block: block-1 node -> its copy
    last_param = {kind: max((pos[p] for p in ph1 if p.name in table), default=-1)
                  for kind, table in (("p", params), ("b", buffers))}
    ph1_by_pos = sorted(ph1, key=pos.__getitem__)
    stamped_ph: dict[tuple[fx.Node, int], fx.Node] = {}  # (block-1 placeholder, j) -> block j's

    def look(a: fx.Node) -> fx.Node:
        return copies[-1][a] if copies and a in copies[-1] else env[a]

    for n in nodes:
        if n is b1[-1]:
            env[n] = g.node_copy(n, lambda a: env[a])
            for j in range(2, n_blocks):
                copies.append(_stamp(g, b1, j, path, env, stamped_ph, copies, corr, s0, s1))
            continue
        env[n] = g.node_copy(n, look)
        if n.op == "placeholder":
            for kind, table in (("p", params), ("b", buffers)):
                if pos[n] == last_param[kind]:
                    for j in range(2, n_blocks):
                        ren = _renamer(path, j)
                        for p1 in (p for p in ph1_by_pos if p.name in table):
                            fqn = ren(table[p1.name])
                            name = re.sub(r"[^0-9a-zA-Z_]", "_", f"{kind}_{fqn}")
                            new = g.placeholder(name)
                            new.meta = dict(p1.meta)
                            new.meta[STAMPED_FROM] = (env[p1].name, j)
                            table[new.name] = fqn
                            stamped_ph[(p1, j)] = new
    # the origins a list stamped before names, under this graph's names (a copy's fresh names can
    # rename the nodes after it)
    renamed = {old.name: new.name for old, new in env.items() if old.name != new.name}
    if renamed:
        for new in env.values():  # (the copies of this graph's nodes: this stamp's marks name new nodes)
            o = new.meta.get(STAMPED_FROM)
            if o is not None and o[0] in renamed:
                new.meta[STAMPED_FROM] = (renamed[o[0]], o[1])
    for a, b in corr.items():  # block 1's own nodes are copies of block 0's too
        env[b].meta[STAMPED_FROM] = (env[a].name, 1)
    new_gm = _StampedModule(gm, g)
    new_gm.meta.update(gm.meta)
    return new_gm


def _stamp(g: fx.Graph, b1: list[fx.Node], j: int, path: str, env: dict[fx.Node, fx.Node],
           stamped_ph: dict[tuple[fx.Node, int], fx.Node], copies: list[dict[fx.Node, fx.Node]],
           corr: dict[fx.Node, fx.Node], s0: set[fx.Node], s1: set[fx.Node]) -> dict[fx.Node, fx.Node]:
    """Block ``j``: a copy of block 1 on block ``j``'s placeholders, reading block ``j - 1``."""
    ren = _renamer(path, j)
    prev = copies[-1] if copies else None  # block j-1's copy (None: block 1 itself, in env)
    mine: dict[fx.Node, fx.Node] = {}

    def arg(a: fx.Node) -> fx.Node:
        if a in s1:
            return mine[a]
        if (a, j) in stamped_ph:
            return stamped_ph[(a, j)]
        if a in s0:  # block 1 reads block 0's value: block j reads block j-1's
            c = corr[a]
            return prev[c] if prev is not None else env[c]
        return env[a]

    for b in b1:
        new = g.node_copy(b, arg)
        meta = dict(b.meta)
        stack = meta.get("nn_module_stack")
        if stack:
            meta["nn_module_stack"] = {ren(k): (ren(p), cls) for k, (p, cls) in stack.items()}
        meta[STAMPED_FROM] = (env[b].name, j)
        new.meta = meta
        mine[b] = new
    return mine


def _same_meta(a: fx.Node, b: fx.Node) -> bool:
    va, _ = tree_flatten(a.meta.get("val"))
    vb, _ = tree_flatten(b.meta.get("val"))
    if len(va) != len(vb):
        return False
    for x, y in zip(va, vb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and (tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype
                                            or x.stride() != y.stride()):
            return False
    return True
