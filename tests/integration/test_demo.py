"""`rayledger demo` end to end, small, in its own process (it starts its own local Ray)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray


def test_demo_small_run_passes_every_check(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_ADDRESS"] = "local"  # a fresh local Ray, never another cluster on the machine
    cmd = [
        sys.executable, "-m", "rayledger.integration.cli", "demo", "--entries", "4000", "--clients", "2",
        "--batch", "100", "--no-spark", "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    assert "demo: all checks passed" in out
    assert "failover" in out
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
