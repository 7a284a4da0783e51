"""The tree stays clean under ruff (lint and format), as the style guide asks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed (it is in the [test] extra)")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_passes():
    out = _ruff("check", ".")
    assert out.returncode == 0, out.stdout[-3000:]


def test_ruff_format_is_applied():
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, out.stdout[-3000:]
