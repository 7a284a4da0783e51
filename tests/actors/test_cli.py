"""The `rayledger` command line against a group on a running Ray cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import ray
from rayledger.actors import LedgerGroup

pytestmark = pytest.mark.ray


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayledger.integration.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_start_status_append_get_transfer(ray_session, group_name, tmp_path):
    address = ray.get_runtime_context().gcs_address
    g = ["--group", group_name, "--address", address]
    try:
        out = cli("start", *g, "--members", "3", "--store-dir", str(tmp_path), "--fast")
        assert out.returncode == 0, out.stderr[-2000:]
        started = json.loads(out.stdout.strip().splitlines()[-1])
        assert started["members"] == ["n0", "n1", "n2"] and started["leader"] in started["members"]

        out = cli("append", *g, "hello", "world")
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [json.loads(x) for x in out.stdout.strip().splitlines()]
        assert [r["index"] for r in rows] == [rows[0]["index"], rows[0]["index"] + 1]

        out = cli("get", *g, str(rows[0]["index"]), "--count", "2")
        assert out.returncode == 0, out.stderr[-2000:]
        got = [json.loads(x)["body"] for x in out.stdout.strip().splitlines()]
        assert got == ["hello", "world"]

        out = cli("status", *g, "--json")
        assert out.returncode == 0, out.stderr[-2000:]
        status = json.loads(out.stdout)
        assert sorted(r["member"] for r in status) == ["n0", "n1", "n2"]
        leader = next(r["member"] for r in status if r["role"] == "LEADER")

        target = next(m for m in ["n0", "n1", "n2"] if m != leader)
        out = cli("transfer", *g, target)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout)["leader"] == target

        # errors: one clear line, non-zero exit
        out = cli("get", "--group", "no-such-group", "--address", address, "0")
        assert out.returncode != 0 and "UNKNOWN_GROUP" in out.stderr
        out = cli("start", *g, "--members", "3")
        assert out.returncode != 0 and "already exists" in out.stderr
    finally:
        try:
            LedgerGroup.get(group_name).shutdown(delete_data=True)
        except Exception:
            pass


def test_help_for_every_subcommand():
    for sub in ["demo", "start", "status", "append", "get", "transfer", "export", "bench"]:
        out = cli(sub, "--help", timeout=60)
        assert out.returncode == 0 and "usage" in out.stdout, sub
