"""The floor beside `rayledger bench group`: a bare Ray chain of the card's shape, measured
through the group's own load code, and the ratios the group run reports against it."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time

import pytest
from rayledger.integration.bench import floor as bench_floor
from rayledger.integration.bench import group as bench_group
from rayledger.integration.bench.floor import (
    RATIOS,
    FloorError,
    FloorSizes,
    _actor_classes,
    over_floor,
    run_floor,
)

FIGURES = (
    "floor_single_p50_ms",
    "floor_single_p99_ms",
    "floor_concurrent_entries_per_s",
    "floor_cpu_ms_per_append",
    "floor_batch_entries_per_s",
)
TINY = FloorSizes(singles=20, threads=3, seconds=0.5, clients=2, rounds=2, batch=50)


@pytest.mark.ray
@pytest.mark.parametrize(
    "actors",
    [
        "mixed",
        pytest.param("asyncio", marks=pytest.mark.chaos),  # CI's budget: one model
        pytest.param("threaded", marks=pytest.mark.chaos),
    ],
)
def test_tiny_floor_gives_positive_figures(ray_session, actors):
    r = run_floor(FloorSizes(**{**TINY.__dict__, "actors": actors}))
    for key in FIGURES:
        assert r[key] > 0, (key, r)
    assert r["floor_concurrent_errors"] == 0 and r["floor_batch_errors"] == 0, r
    assert r["floor_actors"] == actors


def test_an_unknown_actor_model_is_refused():
    with pytest.raises(ValueError, match="one of mixed, asyncio, threaded"):
        _actor_classes("fibers")


@pytest.mark.parametrize("actors", ["mixed", "asyncio", "threaded"])
def test_floor_actors_never_import_rayledger(actors):
    """Ray ships the chain's classes by value: a process that loads them has no rayledger
    module (so the floor measures Ray, not our imports or code)."""
    from ray import cloudpickle

    blobs = [cloudpickle.dumps(c.__ray_metadata__.modified_class) for c in _actor_classes(actors)]
    code = (
        "import pickle, sys\n"
        "for b in pickle.loads(sys.stdin.buffer.read()): pickle.loads(b)\n"
        "print(sorted(m for m in sys.modules if m.startswith('rayledger')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(blobs), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == b"[]", out.stdout


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.ray
def test_floor_is_torn_down_on_error(ray_session, monkeypatch):
    seen: list[int] = []

    def broken(chain, *args, **kw):
        seen.extend(chain.pids())
        raise RuntimeError("a phase failed")

    monkeypatch.setattr(bench_floor, "concurrent_phase", broken)
    with pytest.raises(RuntimeError, match="a phase failed"):
        run_floor(FloorSizes(**{**TINY.__dict__, "singles": 2}))
    assert len(seen) == 6  # leader, checker, 2 followers, 2 dispatchers
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(p) for p in seen), [p for p in seen if not _gone(p)]


def test_ratios_to_the_floor():
    out = {
        "single_p50_ms": 12.0,
        "floor_single_p50_ms": 8.0,
        "concurrent_entries_per_s": 1500,
        "floor_concurrent_entries_per_s": 3000,
        "concurrent_cpu_ms_per_append": 1.0,
        "floor_cpu_ms_per_append": 0.5,
        "batch_entries_per_s": 100_000,
        "ray_rtt_p50_ms": 1.25,
    }
    r = over_floor(out)
    assert r == {
        "single_p50_over_floor": 1.5,
        "concurrent_over_floor": 0.5,
        "cpu_over_floor": 2.0,
        "batch_over_floor": None,  # the floor's batch figure is missing
        "floor_single_p50_over_rtt": 6.4,
    }


def test_floor_flags_reach_the_group_bench():
    from rayledger.integration.bench.run import group_options
    from rayledger.integration.cli.main import parse_args

    opts = group_options(parse_args(["bench", "group"]))
    assert opts["floor"] is True and opts["floor_actors"] == "threaded"
    opts = group_options(parse_args(["bench", "peer", "--no-floor", "--floor-actors", "asyncio"]))
    assert opts["floor"] is False and opts["floor_actors"] == "asyncio"


def test_a_closed_client_refuses():
    from rayledger.integration.bench.floor import FloorClient

    c = FloorClient(leader=None)
    c.close()
    with pytest.raises(FloorError):
        c.append(b"x")


@pytest.mark.ray
@pytest.mark.chaos  # a smoke run of the group benchmark (~20 s): outside CI's budget
def test_bench_group_reports_the_floor_and_the_ratios(ray_session, monkeypatch):
    monkeypatch.setattr(bench_group, "_phase_sizes", lambda quick: (20, 2))  # tiny
    r = bench_group.run(
        quick=True, appends_only=True, threads=4, clients=2, batch=50, load_seconds=1
    )
    r = json.loads(json.dumps(r))  # what `--json` prints
    assert "floor_error" not in r, r
    for key in (*FIGURES, *RATIOS, "floor_single_p50_over_rtt", "ray_rtt_p50_ms"):
        assert isinstance(r[key], int | float) and r[key] > 0, (key, r)
    assert r["floor_actors"] == "threaded"


def test_bench_peer_sets_the_floor_beside_the_peers(monkeypatch):
    pytest.importorskip("pysyncobj")
    from rayledger.integration.bench import etcd_peer, peer

    side = {"single_p50_ms": 1.0, "single_p99_ms": 2.0, "concurrent_entries_per_s": 5000.0,
            "concurrent_p99_ms": 20.0, "batch_entries_per_s": 90_000.0}  # fmt: skip
    ours = {k: v * 2 for k, v in side.items()}
    ours.update({f"floor_{k}": v for k, v in side.items()}, floor_actors="asyncio")
    ours.update(floor_cpu_ms_per_append=0.5, single_p50_over_floor=2.0)
    asked = {}

    def group_run(**kw):
        asked.update(kw)
        return ours

    monkeypatch.setattr(peer, "run_pysyncobj", lambda **kw: dict(side))
    monkeypatch.setattr(etcd_peer, "run_etcd", lambda **kw: {"skipped": "no etcd"})
    monkeypatch.setattr(bench_group, "run", group_run)
    r = peer.run(quick=True, floor_actors="threaded")
    assert asked["floor"] is True and asked["floor_actors"] == "threaded"
    assert r["floor"]["single_p50_ms"] == 1.0 and r["floor"]["cpu_ms_per_append"] == 0.5
    assert r["ratio_floor"]["single_p50_ms"] == 0.5  # floor/rayledger for latencies
    assert r["ratio_floor"]["batch_entries_per_s"] == 2.0  # rayledger/floor for throughputs
    assert r["over_floor"]["single_p50_over_floor"] == 2.0
    assert "ratio_floor" in r["workload"]
