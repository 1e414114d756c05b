"""The package's import structure, read statically (every ``import`` of every module, at module
level or inside a function): ``search/`` and ``runtime/`` meet only in ``ir/`` and ``passes/``
(neither imports the other); ``cost_models/`` imports neither of them, nor the package top;
``passes/`` imports neither ``search/`` nor ``runtime/``; ``runtime/`` imports nothing above it (``api``,
``adapt``, ``build``, ``cli/``, ``hf``, the package top); ``ir/`` imports nothing of the package
but ``ir/``, ``errors``, ``cluster/`` and ``report/``'s formatting; ``cluster/`` imports only
``errors``, and ``ops/`` nothing of the package.

Imports that break a rule would be listed in ``KNOWN``; the test fails on any other, and on a
listed one that is gone (remove it here)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "galvatron_fx"

# (importing file, imported module) pairs that break a rule today
KNOWN: set[tuple[str, str]] = set()
_ABOVE_IR = ("passes", "search", "runtime", "cost_models", "profiler", "frontend", "api", "cli", "hf")
# what the runtime never imports: the orchestration above it (compile, the closed loop, the CLI)
_ABOVE_RUNTIME = ("api", "adapt", "build", "cli", "hf", "search", "")
# leaf folders: cluster/ imports only errors and itself; ops/ nothing of the package
_LEAVES = {"cluster": {"errors", "cluster"}, "ops": {"ops"}}


def _imports(path: Path, pkg: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(("galvatron_fx",) + path.relative_to(pkg).parent.parts)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def _violations(pkg: Path = PKG) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        top = rel.split("/")[0]
        for mod in _imports(path, pkg):
            if not (mod == "galvatron_fx" or mod.startswith("galvatron_fx.")):
                continue
            sub = mod.split(".")[1] if "." in mod else ""
            bad = (top == "search" and sub == "runtime") or (top == "runtime" and sub == "search") or \
                (top == "cost_models" and (sub in ("search", "runtime", "profiler", "frontend", "api", "cli", ""))) or \
                (top == "passes" and sub in ("search", "runtime", "frontend", "api", "cli")) or \
                (top == "ir" and sub in _ABOVE_IR) or (top == "runtime" and sub in _ABOVE_RUNTIME) or (top in _LEAVES and sub not in _LEAVES[top])
            if bad:
                found.add((rel, ".".join(mod.split(".")[:3])))
    return found


def test_search_runtime_and_cost_models_import_only_downwards():
    found = _violations()
    new = sorted(found - KNOWN)
    assert not new, f"imports that break the layering (search/ and runtime/ meet in ir/ and passes/; cost_models/ " \
                    f"imports neither, nor the package top): {new}"
    gone = sorted(KNOWN - found)
    assert not gone, f"these listed imports are gone: remove them from KNOWN: {gone}"


def test_the_reader_sees_function_level_and_relative_imports(tmp_path):
    (tmp_path / "cost_models").mkdir()
    (tmp_path / "search").mkdir()
    (tmp_path / "cost_models" / "a.py").write_text("def f():\n    from galvatron_fx.runtime import api\n"
                                                    "    import galvatron_fx\n")
    (tmp_path / "search" / "b.py").write_text("from ..runtime.layer_exec import X\nfrom . import c\n")
    assert _violations(tmp_path) == {("cost_models/a.py", "galvatron_fx.runtime"), ("cost_models/a.py", "galvatron_fx"),
                                     ("cost_models/a.py", "galvatron_fx.runtime.api"),
                                     ("search/b.py", "galvatron_fx.runtime.layer_exec")}


# ---- cycles -----------------------------------------------------------------------------------


def _modules(pkg: Path) -> dict[str, Path]:
    out = {}
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(pkg).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _import_graph(pkg: Path = PKG):
    """module -> the package's modules it imports when it runs (any import but those under
    ``if TYPE_CHECKING:``); ``from a import b`` counts as ``a.b`` alone when ``b`` is a module
    (``a``'s ``__init__`` runs first, but that is the package's own order, not a cycle)."""
    import networkx as nx

    mods = _modules(pkg)
    g = nx.DiGraph()
    for mod, path in mods.items():
        g.add_node(mod)
        tree = ast.parse(path.read_text(), filename=str(path))
        typing_only = {id(x) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                       for s in n.body for x in ast.walk(s)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                known = [s for s in subs if s.removeprefix("galvatron_fx").lstrip(".") in mods]
                targets = known if len(known) == len(subs) else [node.module, *known]
            for t in targets:
                if not (t == "galvatron_fx" or t.startswith("galvatron_fx.")):
                    continue
                t = t.removeprefix("galvatron_fx").lstrip(".")
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t != mod:
                    g.add_edge(mod, t)
    return g


def _cycles(pkg: Path = PKG) -> list[set[str]]:
    import networkx as nx

    return [set(c) for c in nx.strongly_connected_components(_import_graph(pkg)) if len(c) > 1]


def test_the_import_graph_has_no_cycles():
    found = [sorted(c) for c in _cycles()]
    assert not found, f"modules that import each other (directly or around a loop, counting imports inside " \
                      f"functions): {found}; move what both need into a module below them"


def test_the_cycle_reader_sees_function_level_imports_and_skips_typing_only_ones(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from galvatron_fx.b import g\n")
    (tmp_path / "b.py").write_text("import galvatron_fx.a\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from galvatron_fx.a import f\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from galvatron_fx.pkg.x import y\n")
    (tmp_path / "pkg" / "x.py").write_text("from galvatron_fx.pkg import z\ny = 1\n")
    (tmp_path / "pkg" / "z.py").write_text("")
    assert _cycles(tmp_path) == [{"a", "b"}]
