"""The pass runner: checks each pass's contract, lints and recompiles, dumps graphs.

A pass is a plain function ``(gm, ctx) -> gm`` declared with :func:`graph_pass`, which records
its contract as data: ``requires`` (facts that must already exist in ``ctx.produced``) and
``produces`` (facts it adds). The runner refuses to run a pass whose requirements are not met,
so passes cannot be run in an order that silently breaks, and with ``ctx.dump_dir`` set it
writes the graph before and after every pass. What a pass takes and returns is an
``fx.GraphModule`` or an object holding several (the lowering's
:class:`~galvatron_fx.ir.program.LayerGraphs`, whose ``graphs()`` names them): each is linted,
recompiled and dumped (``<nn>_<pass>_<before|after>.<graph>.txt``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch.fx as fx

from galvatron_fx.errors import GalvatronError

log = logging.getLogger(__name__)

# what a pass takes and returns: an ``fx.GraphModule``, or an object holding several (module doc)
_G = TypeVar("_G")
PassFn = Callable[[_G, "PassContext"], _G]


@dataclass(kw_only=True)
class PassContext:
    """What passes share besides the graph: the model graph record, config, cluster, plan.

    ``produced`` is the set of facts established so far (e.g. ``"layers"``, ``"costs"``);
    ``timings_s`` records how long each pass took.
    """

    graph: Any = None  # galvatron_fx.ir.ModelGraph
    mesh: Any = None  # the (dp, tp) DeviceMesh a lowering pass lays a layer out on
    config: Any = None
    cluster: Any = None
    plan: Any = None
    cost_model: Any = None
    example_inputs: tuple = ()
    dump_dir: Path | None = None
    produced: set[str] = field(default_factory=set)
    timings_s: dict[str, float] = field(default_factory=dict)


class PassOrderError(GalvatronError):
    """A pass was run before the passes it depends on."""


def graph_pass(*, requires: Iterable[str] = (), produces: Iterable[str] = ()):
    """Declare a function as a pass with its contract."""

    def wrap(fn: PassFn) -> PassFn:
        fn.requires = frozenset(requires)  # type: ignore[attr-defined]
        fn.produces = frozenset(produces)  # type: ignore[attr-defined]
        return fn

    return wrap


def run_pass(fn: PassFn[_G], gm: _G, ctx: PassContext) -> _G:
    """Run one pass: check its contract, run it, lint, recompile, record what it produced."""
    name = fn.__name__
    missing = set(getattr(fn, "requires", ())) - ctx.produced
    if missing:
        raise PassOrderError(
            f"pass {name} needs {sorted(missing)} but only {sorted(ctx.produced)} exist: "
            f"run the passes that produce them first"
        )
    step = len(ctx.timings_s)
    if ctx.dump_dir is not None:
        _dump_all(gm, ctx.dump_dir, f"{step:02d}_{name}_before")
    t0 = time.perf_counter()
    out = fn(gm, ctx)
    graphs = _graphs(out)
    assert graphs is not None, f"pass {name} returned {type(out).__name__}"
    for g in graphs.values():
        g.graph.lint()
        g.recompile()
    ctx.timings_s[name] = time.perf_counter() - t0
    ctx.produced |= set(getattr(fn, "produces", ()))
    log.info("pass %s: %.3f s", name, ctx.timings_s[name])
    if ctx.dump_dir is not None:
        _dump_all(out, ctx.dump_dir, f"{step:02d}_{name}_after")
    return out


def run_passes(passes: Iterable[PassFn[_G]], gm: _G, ctx: PassContext) -> _G:
    """Run ``passes`` in order through :func:`run_pass`."""
    for fn in passes:
        gm = run_pass(fn, gm, ctx)
    return gm


def _graphs(obj) -> dict[str, fx.GraphModule] | None:
    if isinstance(obj, fx.GraphModule):
        return {"": obj}
    fn = getattr(obj, "graphs", None)
    return fn() if callable(fn) else None


def _dump_all(obj, directory: Path, stem: str) -> None:
    for gname, g in (_graphs(obj) or {}).items():
        _dump(g, directory, f"{stem}.{gname}.txt" if gname else f"{stem}.txt")


def _dump(gm: fx.GraphModule, directory: Path, filename: str) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    from galvatron_fx.ir.meta import GFX_KEY

    lines = []
    for n in gm.graph.nodes:
        facts = n.meta.get(GFX_KEY)
        tag = f"  # layer={facts.layer}" if facts is not None and facts.layer else ""
        lines.append(f"{n.format_node()}{tag}")
    (directory / filename).write_text("\n".join(lines) + "\n")
