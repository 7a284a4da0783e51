"""The package's shape: imports between product modules form no cycle (lazy imports inside
functions and ``TYPE_CHECKING`` imports count too: a cycle hidden that way is still two
modules that cannot be read one after the other), and no class name is defined twice (a
reader meets one ``StepDown``, not three behind aliases)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("storage", "election", "replication", "actors", "integration")


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name (without the ``rayledger.`` prefix) -> file."""
    out = {}
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _targets(mod: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, mods) -> list[str]:
    """The product modules an import statement of ``mod`` reaches."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name.removeprefix("rayledger.") for a in node.names
                 if a.name.startswith("rayledger.")]  # fmt: skip
    else:
        if node.level:
            here = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]).strip(".")
        elif (node.module or "").startswith("rayledger"):
            base = node.module.removeprefix("rayledger").lstrip(".")
        else:
            return []
        for a in node.names:
            sub = f"{base}.{a.name}" if base else a.name
            names.append(sub if sub in mods else base)
    out = []
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != mod:
            out.append(name)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[mod].update(_targets(mod, f.name == "__init__.py", node, mods))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_product_modules() -> None:
    assert cycles(import_graph()) == []


def test_no_class_name_is_defined_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for mod, f in _modules(ROOT).items():
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].append(mod)
    assert {k: v for k, v in where.items() if len(v) > 1} == {}


def test_the_cycle_check_sees_a_lazy_and_a_type_checking_import(tmp_path: Path) -> None:
    pkg = tmp_path / "storage"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rayledger.storage.a import f\n"
    )
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
    assert cycles(import_graph(tmp_path)) == [["storage.a", "storage.b"]]
