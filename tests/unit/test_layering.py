"""The package's import structure, read statically (every ``import`` of every module, at module
level or inside a function): ``search/`` and ``runtime/`` meet only in ``ir/`` and ``passes/``
(neither imports the other); ``cost_models/`` imports neither of them, nor the package top;
``passes/`` imports neither ``search/`` nor ``runtime/``; ``ir/`` imports nothing of the package
but ``ir/`` and the leaf modules beside it (errors, limits, cluster records, placements' helpers).

Imports that break a rule would be listed in ``KNOWN``; the test fails on any other, and on a
listed one that is gone (remove it here)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "galvatron_fx"

# (importing file, imported module) pairs that break a rule today
KNOWN: set[tuple[str, str]] = set()
_ABOVE_IR = ("passes", "search", "runtime", "cost_models", "profiler", "backend", "api", "cli", "capture")


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
                (top == "cost_models" and (sub in ("search", "runtime", "profiler", "backend", "api", "cli", ""))) or \
                (top == "passes" and sub in ("search", "runtime", "backend", "api", "cli")) or \
                (top == "ir" and sub in _ABOVE_IR)
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
