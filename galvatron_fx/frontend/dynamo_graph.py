"""The Dynamo graph as the ``galvatron_fx`` backend (:mod:`galvatron_fx.frontend.backend`) reads it: what
each graph input is, the *shell* that :func:`~galvatron_fx.frontend.capture.capture` takes, and the checks
that refuse a graph the parallel runtime cannot run.

Contract: everything here works on Dynamo's ``fx.GraphModule`` and its example inputs alone (no
process group, no plan). :meth:`GraphSignature.of` reads the placeholders' Dynamo sources;
:func:`to_shell` builds the shell over the very tensors passed in; :func:`check_whole_graph`
raises ``CaptureError`` (what is wrong, what to do) for a graph that is not one whole graph with
fixed shapes returning a scalar loss.

Terms: a *state input* is a graph input that is a parameter or buffer of a module (its Dynamo
source goes through the module, e.g. ``L['self']._modules['blocks']._modules['0']._parameters
['weight']``); its *FQN* is the path below the module (``blocks.0.weight``); the *roots* are the
frame variables the modules hang from (``self``). The *shell* is an ``fx.GraphModule`` over
Dynamo's graph whose state inputs are attributes at their FQNs (the user's own tensors), so
that :func:`~galvatron_fx.frontend.capture.capture` names parameters and layers as the user does.

Algorithm: a source name (``L['self']._modules['blocks']._modules['0']._parameters['w']``) is
parsed into its root variable and path (:func:`source_path`, module containers dropped); roots
are the variables some input reaches through a module container or that hold an
``nn.Parameter``; inputs below a root are state, the others user inputs. The shell copies
Dynamo's graph node by node, reading state inputs (and Dynamo's own ``get_attr`` constants) as
attributes at their FQNs and rewriting ``nn_module_stack`` paths to FQNs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx as fx
from torch import nn

from galvatron_fx.errors import CaptureError

__all__ = ["BACKEND_NAME", "GraphSignature", "check_whole_graph", "source_path", "to_shell"]

BACKEND_NAME = "galvatron_fx"
_USE_COMPILE = ("use galvatron_fx.compile(model, cluster, example_inputs, global_batch_size=...), which also "
                "shards parameters and optimizer state")


# ---- graph inputs -----------------------------------------------------------------------------

_ROOT = re.compile(r"""^(?P<scope>[LG])\[(?P<q>['"])(?P<name>.*?)(?P=q)\]""")
_TOKEN = re.compile(r"""\.(?P<attr>\w+)|\[(?P<idx>-?\d+)\]|\[(?P<q>['"])(?P<key>.*?)(?P=q)\]""")
# (a module reached through its ``__dict__``, as Dynamo names some of Swin's, is the module itself)
_CONTAINERS = {"_modules", "_parameters", "_buffers", "__dict__"}


def source_path(name: str) -> tuple[str, list[str]] | None:
    """A Dynamo source name split into its root variable and the path below it, module
    containers dropped: ``"L['self']._modules['blocks']._modules['0']._parameters['w']"`` and
    ``"L['self'].blocks[0].w"`` both give ``("self", ["blocks", "0", "w"])``. None when the name
    has another form (a closure cell, a call)."""
    m = _ROOT.match(name)
    if m is None:
        return None
    path, pos = [], m.end()
    while pos < len(name):
        t = _TOKEN.match(name, pos)
        if t is None:
            return None
        path.append(t.group("attr") or t.group("idx") or t.group("key"))
        pos = t.end()
    return m.group("name"), [p for p in path if p not in _CONTAINERS]


def _source_name(node: fx.Node) -> str | None:
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None) or getattr(node, "_dynamo_source", None)
    if src is None:
        return None
    name = src.name
    return name() if callable(name) else str(name)


@dataclass(frozen=True)
class GraphSignature:
    """What each input of a Dynamo graph is (see module doc, *Terms*).

    ``inputs``: placeholder positions of the user's inputs, in order, with ``input_names``;
    ``state``: ``(position, FQN)`` of every parameter and buffer input; ``roots``: the frame
    variables the state hangs from (FQNs carry the root's name as a prefix when there are
    several); ``unmapped``: source names of inputs that could be neither.
    """

    inputs: tuple[int, ...]
    input_names: tuple[str, ...]
    state: tuple[tuple[int, str], ...]
    roots: tuple[str, ...]
    unmapped: tuple[str, ...] = ()

    @classmethod
    def of(cls, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> GraphSignature:
        """Read the signature from the placeholders' Dynamo sources: an input whose source goes
        through a module container or that is an ``nn.Parameter`` is state, one that is a root
        variable itself (or an item of one that is not a module) is a user input."""
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        names = [_source_name(n) for n in phs]
        parsed = [source_path(s) if s is not None else None for s in names]
        roots: list[str] = []
        for s, p, ex in zip(names, parsed, example_inputs):
            if p is not None and p[1] and p[0] not in roots and \
                    (isinstance(ex, nn.Parameter) or _CONTAINERS & set(_raw_tokens(cast(str, s)))):
                roots.append(p[0])
        inputs, input_names, state, unmapped = [], [], [], []
        taken: set[str] = set()
        for i, (s, p) in enumerate(zip(names, parsed)):
            if p is None:
                unmapped.append(s or phs[i].name)
            elif p[0] in roots and p[1]:
                state.append((i, ".".join(([p[0]] if len(roots) > 1 else []) + p[1])))
            else:  # a variable of the call (or an item of one): a user input
                name = re.sub(r"\W", "_", "_".join([p[0], *p[1]])) or "input"
                while name in taken or not name.isidentifier():
                    name = f"{name}_"
                taken.add(name)
                inputs.append(i)
                input_names.append(name)
        return cls(tuple(inputs), tuple(input_names), tuple(state), tuple(roots), tuple(unmapped))

    def module_path(self, path: str) -> str | None:
        """An ``nn_module_stack`` path of the Dynamo graph (``"L['self'].blocks.0"``) as an FQN
        like the state's (``"blocks.0"``); ``""`` for a root itself, None if unknown."""
        p = source_path(path)
        if p is None or p[0] not in self.roots:
            return None
        return ".".join(([p[0]] if len(self.roots) > 1 else []) + p[1])


def _raw_tokens(name: str) -> list[str]:
    return [t.group("attr") or t.group("idx") or t.group("key") for t in _TOKEN.finditer(name)]


def to_shell(gm: fx.GraphModule, sig: GraphSignature, args: Sequence[torch.Tensor]) -> fx.GraphModule:
    """The shell (see module doc): Dynamo's graph with state inputs read as attributes at their
    FQNs — the very tensors in ``args`` — and user inputs as placeholders named
    ``sig.input_names``. ``nn_module_stack`` paths are rewritten to FQNs; other meta is shared."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, name in zip(sig.inputs, sig.input_names):
        env[phs[i]] = g.placeholder(name)
        env[phs[i]].meta = dict(phs[i].meta)
    root = nn.Module()
    for i, fqn in sig.state:
        _set_nested(root, fqn, args[i])
        env[phs[i]] = g.get_attr(fqn)
    flat = gm.meta.get("dynamo_flat_name_to_original_fqn", {})
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            if n not in env:
                raise CaptureError(f"graph input {n.name} is neither a user input nor a module's parameter or buffer")
            continue
        if n.op == "get_attr" and isinstance(_get_nested(gm, n.target), fx.GraphModule):
            continue  # a custom autograd function's forward or backward body (inlined below)
        if n.op == "call_function" and n.target is _AUTOGRAD_FUNCTION:
            env[n] = _inline_forward(g, _get_nested(gm, n.args[0].target), [env[a] for a in n.args[2:]],
                                     _fqn_stack(n.meta.get("nn_module_stack") or {}, sig))
            continue
        if n.op == "get_attr":  # a constant or (older Dynamo) a parameter held by the graph module
            target = flat.get(n.target, n.target)
            _set_nested(root, target, _get_nested(gm, n.target))
            env[n] = g.get_attr(target)
            env[n].meta = dict(n.meta)
            continue
        new = g.node_copy(n, lambda a: env[a])
        stack = n.meta.get("nn_module_stack")
        if stack:
            new.meta = dict(new.meta, nn_module_stack=_fqn_stack(stack, sig))
        env[n] = new
    return fx.GraphModule(root, g, class_name="GalvatronShell")


_AUTOGRAD_FUNCTION = torch.ops.higher_order.autograd_function_apply


def _fqn_stack(stack: dict, sig: GraphSignature) -> dict:
    """An ``nn_module_stack`` with Dynamo's paths as FQNs (roots dropped)."""
    fixed = {}
    for key, (path, cls) in stack.items():
        p = sig.module_path(path)
        if p:  # a root itself is not part of a module stack
            fixed[key] = (p, cls)
    return fixed


def _inline_forward(g: fx.Graph, body: fx.GraphModule, args: list, stack: dict):
    """A custom ``torch.autograd.Function`` (Dynamo's ``autograd_function_apply``) as the ops of
    its forward, copied into ``g`` (with the call's module stack): autograd then differentiates
    them, where the function's own backward would (the same derivative for a function whose
    backward is its forward's, as BLOOM's GeLU; the runtime differentiates every layer so). Its
    grad-mode switches are dropped. Returns the forward's outputs, as the call returns them."""
    env: dict[fx.Node, Any] = {}
    phs = [n for n in body.graph.nodes if n.op == "placeholder"]
    env.update(zip(phs, args))
    for n in body.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            outs = n.args[0][0] if isinstance(n.args[0], (tuple, list)) else n.args[0]
            return fx.node.map_arg(outs, lambda a: env[a])
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            continue
        new = g.node_copy(n, lambda a: env[a])
        new.meta = dict(n.meta, nn_module_stack=stack)
        env[n] = new
    raise CaptureError("a custom autograd function's forward body has no output")


def _get_nested(mod: nn.Module, target: str):
    for part in target.split("."):
        mod = getattr(mod, part)
    return mod


def _set_nested(root: nn.Module, fqn: str, t: torch.Tensor) -> None:
    *parents, leaf = fqn.split(".")
    mod = root
    for p in parents:
        if not hasattr(mod, p):
            mod.add_module(p, nn.Module())
        mod = getattr(mod, p)
    if isinstance(t, nn.Parameter):
        mod.register_parameter(leaf, t)
    elif isinstance(t, torch.Tensor):
        mod.register_buffer(leaf, t)
    else:
        setattr(mod, leaf, t)


# ---- whole-graph checks -----------------------------------------------------------------------

def check_whole_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], sig: GraphSignature) -> None:
    """Refuse what the parallel runtime cannot run, with what to do instead: a graph that ends at
    a graph break or resumes after one, inputs that are neither user inputs nor module state,
    symbolic shapes, a graph without parameters, or one whose output is not one scalar loss."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    stack = list(getattr(reason, "user_stack", None) or [])
    where = f" at {stack[-1].filename}:{stack[-1].lineno}" if stack else ""
    fix = ("remove the graph break (torch.compile(..., fullgraph=True) stops at it and says why; "
           f"torch._dynamo.explain(model)(*inputs) lists them), or {_USE_COMPILE}")
    if any("transformers" in f.filename for f in stack):
        fix = ("for a Hugging Face model, import transformers before galvatron_fx (or call "
               "galvatron_fx.frontend.backend.ignore_hf_logging() after importing it), so that Dynamo traces through "
               "transformers' logger.warning_once; else " + fix)
    if reason is not None and getattr(reason, "graph_break", False):
        first = str(getattr(reason, "reason", "")).strip().splitlines()
        raise CaptureError(f"the model's graph is split by a graph break{where} ({first[0] if first else 'unknown'}): "
                           f"under torchrun the {BACKEND_NAME} backend plans one whole graph; {fix}")
    if stack and stack[-1].name.startswith("torch_dynamo_resume_in_"):
        raise CaptureError(f"this graph resumes after a graph break ({stack[-1].name}){where}: under torchrun the "
                           f"{BACKEND_NAME} backend plans one whole graph; {fix}")
    for ph, x in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs):
        val = ph.meta.get("example_value", x)
        if not isinstance(x, torch.Tensor) or any(not isinstance(d, int) for d in getattr(val, "shape", ())):
            raise CaptureError(f"the compiled graph has dynamic shapes (graph input {_source_name(ph) or ph.name}); "
                               f"the {BACKEND_NAME} backend plans for one shape: compile with "
                               "torch.compile(..., dynamic=False) and keep the global batch fixed (drop or pad the "
                               "last batch)")
    if sig.unmapped:
        raise CaptureError(f"graph inputs {list(sig.unmapped)} are neither inputs of the compiled call nor "
                           f"parameters or buffers of a module: compile the module itself "
                           f"(torch.compile(model, backend={BACKEND_NAME!r})), or {_USE_COMPILE}")
    if not sig.state:
        raise CaptureError(f"the compiled graph reads no parameters: compile the module that holds them "
                           f"(torch.compile(model, backend={BACKEND_NAME!r}))")
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    vals = [o.meta.get("example_value") if isinstance(o, fx.Node) else o for o in outs]
    if not vals or not isinstance(vals[0], torch.Tensor) or vals[0].ndim != 0 or \
            not vals[0].dtype.is_floating_point or not all(isinstance(v, torch.Tensor) for v in vals):
        got = ", ".join(f"a tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                        for v in vals)
        raise CaptureError(f"the compiled graph returns ({got}); under torchrun the {BACKEND_NAME} backend needs "
                           "a model whose forward returns its scalar loss first (a Hugging Face model given labels, "
                           "or a tuple (loss, ...)): wrap model and loss function in one nn.Module whose forward "
                           "returns the loss, and compile that")
