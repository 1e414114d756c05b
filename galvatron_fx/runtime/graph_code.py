"""A traced graph as a plain Python function that calls ATen's C++ entry points directly
(:func:`graph_callable`): the same ops as ``gm.forward``, without fx's per-op lookups.

Contract: the function takes the graph's placeholders positionally and returns its output; it
frees each value after its last use, as fx's generated code does. Its source is generated from
the graph's own nodes (nothing read from a file).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["graph_callable"]


def graph_callable(gm: fx.GraphModule):
    """``gm``'s forward as a plain Python function that calls each ATen overload's C++ entry
    point (``OpOverload._op``) directly, bound as a global; ``gm.forward`` as it is when the
    graph holds anything but placeholders, ``call_function`` nodes and the output.

    fx's generated code looks up ``torch.ops.<ns>.<op>.<overload>`` and goes through
    ``OpOverload.__call__`` per op, Python time that adds up over the 100-odd small ops a
    layer's graphs dispatch per step. Values are dropped after their last use, as fx's code does, so
    that the backward frees activations as it goes."""
    nodes = list(gm.graph.nodes)
    if any(n.op not in ("placeholder", "call_function", "output") for n in nodes):
        return gm.forward
    last_use: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            last_use[a] = n
    dead_after: dict[fx.Node, list[fx.Node]] = {}
    for a, n in last_use.items():
        dead_after.setdefault(n, []).append(a)
    glob: dict[str, object] = {}

    def bind(v, hint: str = "const") -> str:
        name = f"_{hint}_{len(glob)}"
        glob[name] = v
        return name

    def arg(a) -> str:
        if isinstance(a, fx.Node):
            return a.name  # fx keeps node names unique identifiers
        if isinstance(a, (list, tuple)):
            items = "".join(f"{arg(x)}, " for x in a)
            return f"[{items}]" if isinstance(a, list) else f"({items})"
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        return bind(a)  # floats (inf, nan), dtypes, devices, layouts, memory formats

    params, body = [], []
    for n in nodes:
        if n.op == "placeholder":
            params.append(n.name)
            continue
        if n.op == "output":
            body.append(f"return {arg(n.args[0])}")
            break
        call_args = [arg(a) for a in n.args] + [f"{k}={arg(v)}" for k, v in n.kwargs.items()]
        if n.target is operator.getitem and not n.kwargs:
            body.append(f"{n.name} = {call_args[0]}[{call_args[1]}]")
        else:
            if isinstance(n.target, torch._ops.OpOverload):
                fn, hint = n.target._op, n.target._opname
            else:
                fn, hint = n.target, "fn"
            body.append(f"{n.name} = {bind(fn, hint)}({', '.join(call_args)})")
        dead = [a.name for a in dead_after.get(n, ())] + ([n.name] if not n.users else [])
        if dead:
            body.append(f"del {', '.join(dead)}")
    src = f"def graph_fn({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    code = compile(src, f"<galvatron_fx graph {id(gm):x}>", "exec")
    exec(code, glob)  # noqa: S102 - source generated above from the graph's own nodes
    graph_fn: Any = glob["graph_fn"]
    graph_fn.source = src  # for inspection
    return graph_fn
