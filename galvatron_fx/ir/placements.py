"""The placement strings of a plan: their grammar, their parsing, and their check against a layer's graph.

A plan keeps, per layer, one string per node of the layer's decomposed forward graph (the ATen
ops DTensor dispatches, :func:`galvatron_fx.passes.decompose_layer.decompose_layer`): the placement
on the tp mesh axis of each tensor input, then ``->``, then that of each output::

    "S(1),R->S(2)"    two inputs (sharded on dim 1, replicated), one output sharded on dim 2
    "->R"             a placeholder (a parameter or an input of the layer): one output
    "R,R,R->R,R,-"    "-": an output that is not a tensor

Grammar: ``[p(,p)*]->o(,o)*`` with ``p = R | P | S(d)`` (``Replicate``, ``Partial``,
``Shard(d)``; ``d`` a dim below :data:`MAX_DIM`, no leading zeros) and ``o = p | -``.
:func:`pstr` writes one ``p`` (or ``-``) from a DTensor placement, :func:`parse_placement` reads
one back.

Two checks, each a ``ConfigError`` naming the layer, the node, the placement and what a valid
one looks like:

- syntax, whenever a plan is built or loaded (``ParallelPlan`` calls :func:`placement_problem`);
- against the graph, once a layer is decomposed: :func:`check_layer_placements` (the number of
  inputs and outputs of the node, every shard dim below the rank of its tensor);
  :func:`galvatron_fx.passes.decompose_layer.check_placements` decomposes and checks a whole
  plan. Node names the graph does not
  have are left alone: the lowering completes a layer whose graph adds casts the plan's does not
  name, and ``compile()`` re-solves one whose plan misses other nodes (another torch version names
  them differently).

:class:`NodePlacement` is the typed record of one string (its inputs' and outputs' DTensor
placements); :meth:`NodePlacement.parse` reads each distinct string once, and a plan's layers
hold their records parsed when the plan is built or loaded (``LayerPlan.node_placements``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_flatten

from galvatron_fx.errors import ConfigError

__all__ = ["MAX_DIM", "NodePlacement", "P", "PLACEMENT_HELP", "R", "check_layer_placements", "parse_placement", "placement_problem",
           "pstr", "split_placement"]

MAX_DIM = 64  # a tensor has fewer dims than this (torch's own limit on CUDA)
PLACEMENT_HELP = ("a placement is the tp placement of each tensor input, '->', then of each output, each R, P "
                  "or S(d) (an output may be '-'): e.g. 'S(1),R->S(2)', or '->R' for a placeholder")
_ONE = re.compile(r"R|P|S\((0|[1-9][0-9]{0,8})\)")

R = Replicate()
P = Partial()


def pstr(p: Placement | None) -> str:
    """``Replicate()`` → ``R``, ``Shard(1)`` → ``S(1)``, ``Partial()`` → ``P``."""
    if p is None:
        return "-"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    return "P" if isinstance(p, Partial) else "R"


def parse_placement(s: str) -> Placement:
    """``R`` → ``Replicate()``, ``S(1)`` → ``Shard(1)``, ``P`` → ``Partial()``; anything else is a
    ``ConfigError`` (the grammar: the module doc)."""
    if s == "R":
        return R
    if s == "P":
        return P
    if placement_problem(f"->{s}") is None and s.startswith("S("):
        return Shard(int(s[2:-1]))
    raise ConfigError(f"not a placement: {s!r} (use R, P or S(d), d a tensor dim)")


@dataclass(frozen=True)
class NodePlacement:
    """One node's placements on the tp mesh axis: each tensor input's, then each output's (None:
    an output that is not a tensor). ``str()`` writes the plan's string back. The one placement
    record: a plan's layers hold it parsed, the search enumerates a node's strategies as it
    (:func:`galvatron_fx.search.node_strategies.node_strategies`), the lowering applies it."""

    inputs: tuple[Placement | None, ...]
    outputs: tuple[Placement | None, ...]

    @functools.cached_property  # (read for every edge of every ILP: once per record)
    def partitioned(self) -> bool:
        """Whether the work is split over the group (else every rank computes it all).

        Only sharded tensors split work: an op on partial inputs (a replicated weight fed as
        Partial, say) still does the whole computation on every rank.
        """
        return any(isinstance(p, Shard) for p in self.inputs + self.outputs if p is not None)

    def grad_of_input(self, k: int) -> Placement | None:
        """The placement of the gradient this node hands back for tensor input ``k``."""
        p = self.inputs[k]
        if p is None:
            return None
        if isinstance(p, Partial):
            return R
        if isinstance(p, Replicate) and self.partitioned:
            return P
        return p

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def parse(s: str) -> NodePlacement:
        """The record of placement string ``s`` (checked: a ``ConfigError`` names what is wrong)."""
        problem = placement_problem(s)
        if problem is not None:
            raise ConfigError(f"placement {s!r}: {problem}; {PLACEMENT_HELP}")
        ins, outs = split_placement(s)
        return NodePlacement(tuple(parse_placement(p) for p in ins),
                             tuple(None if p == "-" else parse_placement(p) for p in outs))

    def __str__(self) -> str:
        return ",".join(pstr(p) for p in self.inputs) + "->" + ",".join(pstr(p) for p in self.outputs)


def split_placement(s: str) -> tuple[list[str], list[str]]:
    """``"S(0),R->S(1),-"`` → (["S(0)", "R"], ["S(1)", "-"]); ``ValueError`` when malformed."""
    problem = placement_problem(s)
    if problem is not None:
        raise ValueError(problem)
    ins, outs = s.split("->")
    return (ins.split(",") if ins else []), outs.split(",")


def placement_problem(s: object) -> str | None:
    """What is wrong with the syntax of placement string ``s``, or None when it is well formed."""
    if not isinstance(s, str):
        return f"must be a string, got {type(s).__name__}"
    if s.count("->") != 1:
        return "has no '->' between the inputs' and the outputs' placements" if "->" not in s else \
            "has more than one '->'"
    ins, outs = s.split("->")
    for side, items, may_skip in (("input", ins.split(",") if ins else [], False), ("output", outs.split(","), True)):
        for k, p in enumerate(items):
            if (may_skip and p == "-") or ((match := _ONE.fullmatch(p)) and not match.group(1)):
                continue
            if match:
                if int(match.group(1)) < MAX_DIM:
                    continue
                return f"shards {side} {k} on dim {match.group(1)}, beyond any tensor's {MAX_DIM} dims"
            return f"has {p!r} for {side} {k}, which is not R, P or S(d)" + (" or -" if may_skip else "")
    return None


def check_layer_placements(layer: str, placements: Mapping[str, str], gm: fx.GraphModule) -> None:
    """Check a layer's placements against its decomposed graph ``gm``: each named node's number
    of tensor inputs and outputs, and every ``S(d)`` below the rank of its tensor. Raises
    ``ConfigError`` naming the layer, the node and the placement."""
    problems = []
    for n in gm.graph.nodes:
        s = placements.get(n.name)
        if s is not None and n.op in ("placeholder", "call_function") and (problem := _node_problem(n, s)) is not None:
            problems.append(f"node {n.name!r} has placement {s!r}{problem}")
    if problems:
        more = f"; … {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ConfigError(f"plan layer {layer!r}: " + "; ".join(problems[:3]) + more
                          + f". {PLACEMENT_HELP[0].upper()}{PLACEMENT_HELP[1:]}; re-run `galvatron-fx plan` "
                            "to make a new plan")


def _node_problem(n: fx.Node, s: str) -> str | None:
    """What does not fit between node ``n`` and its placement ``s`` (a clause to follow the
    placement in a message), or None."""
    if (syntax := placement_problem(s)) is not None:
        return f", which {syntax}"
    ins, outs = split_placement(s)
    args = [] if n.op == "placeholder" else [a for a in tree_flatten((n.args, n.kwargs))[0] if isinstance(a, fx.Node)]
    vals = n.meta.get("val")
    vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
    if len(ins) != len(args):
        return f" for {_count(len(ins), 'input')}, but it takes {_count(len(args), 'tensor')} ({n.format_node()})"
    if len(outs) != len(vals):
        return f" for {_count(len(outs), 'output')}, but it makes {len(vals)}"
    sides = [("input", k, p, a.meta.get("val")) for k, (p, a) in enumerate(zip(ins, args))]
    sides += [("output", k, p, v) for k, (p, v) in enumerate(zip(outs, vals))]
    for side, k, p, v in sides:
        if not p.startswith("S("):
            continue
        if not isinstance(v, torch.Tensor):
            return f", which shards {side} {k}, not a tensor"
        if (dim := int(p[2:-1])) >= v.ndim:
            return (f", which shards {side} {k} on dim {dim}, but that tensor has {_count(v.ndim, 'dim')} "
                    f"(shape {tuple(v.shape)})")
    return None


def _count(k: int, word: str) -> str:
    return f"{k} {word}{'s' if k != 1 else ''}"

