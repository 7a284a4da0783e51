"""Every `rayledger bench` in the README runs and prints its figures (quick sizes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def bench(which: str, timeout: float = 600) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "rayledger.integration.cli", "bench", which, "--json", "--quick"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_bench_store():
    r = bench("store")
    for key in (
        "append_entries_per_s",
        "append_mb_per_s",
        "get_entries_per_s",
        "recovery_s_per_gib",
    ):
        assert r[key] > 0, (key, r)


def test_bench_replication():
    assert bench("replication")["entries_per_s"] > 0


GROUP_FIGURES = (
    "single_p50_ms",
    "single_p99_ms",
    "concurrent_entries_per_s",
    "concurrent_p99_ms",
    "pipelined_entries_per_s",
    "batch_entries_per_s",
    "failover_s",
    "idle_cpu_cores",
    "reads_per_s_linearizable",
    "reads_per_s_lease",
    "reads_per_s_committed",
    "reads_per_s_linearizable_any",
)


@pytest.mark.ray
def test_bench_group():
    r = bench("group")
    for key in GROUP_FIGURES:
        assert r[key] > 0, (key, r)
    assert r["concurrent_errors"] == 0 and r["batch_errors"] == 0, r
    assert r["reads_errors_linearizable"] == 0 and r["term_changes_under_load"] >= 0, r


@pytest.mark.ray
def test_bench_peer():
    r = bench("peer")
    for side in ("pysyncobj", "rayledger"):
        for key in ("single_p50_ms", "concurrent_entries_per_s", "batch_entries_per_s"):
            assert r[side][key] > 0, (side, key, r[side])
    assert set(r["ratio"]) >= {"single_p50_ms", "batch_entries_per_s"}


@pytest.mark.spark
def test_bench_spark():
    assert bench("spark")["rows_per_s"] > 0
