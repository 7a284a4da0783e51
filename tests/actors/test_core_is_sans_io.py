"""Every module under ``actors/core/``, ``election/`` and ``replication/`` is a sans-I/O core:
no Ray, no asyncio, no threads and no clock -- also not through a lazy import inside a
function.  The shells, the simulation and
the script tests deliver events to these cores; a core that reached for I/O itself could do
what the simulation never sees."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(
    p for d in ("actors/core", "election", "replication") for p in (ROOT / d).glob("*.py")
)
FORBIDDEN = ("ray", "asyncio", "threading", "concurrent", "time", "socket", "subprocess")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


@pytest.mark.parametrize("path", CORES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_core_imports_no_io(path: Path) -> None:
    bad = [m for m in _imports(path) if m.split(".")[0] in FORBIDDEN]
    assert not bad, f"{path.name} imports {bad}: the core must stay sans-I/O"


def test_the_check_sees_a_lazy_import(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    import ray.util\n    from asyncio import sleep\n")
    assert _imports(sneaky) == ["ray.util", "asyncio"]
