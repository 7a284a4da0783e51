"""What every side of ``bench peer`` runs (PySyncObj in :mod:`.peer`, etcd in
:mod:`.etcd_peer`): the figures, the workload (sequential single appends, threads
appending, batches) over a side's append calls, and a free port for a side's members."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

THROUGHPUTS = ("concurrent_entries_per_s", "batch_entries_per_s")
LATENCIES = ("single_p50_ms", "single_p99_ms", "concurrent_p99_ms")
FIGURES = LATENCIES[:2] + THROUGHPUTS[:1] + LATENCIES[2:] + THROUGHPUTS[1:]


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Workload:
    """The sizes of one run, the same for every side (pickled to PySyncObj's leader)."""

    body_bytes: int = 128
    threads: int = 64
    clients: int = 4
    batch: int = 1000
    singles: int = 300
    duration: float = 8.0
    rounds: int = 10
    append_timeout: float = 10.0

    @classmethod
    def sized(
        cls, quick: bool, threads: int, clients: int, batch: int, body_bytes: int = 128
    ) -> Workload:
        """``--quick`` or full sizes: the phases' lengths are fixed here, the callers given."""
        return cls(body_bytes, threads, clients, batch, singles=100 if quick else 300,
                   duration=3.0 if quick else 8.0, rounds=3 if quick else 10,
                   append_timeout=5.0 if quick else 10.0)  # fmt: skip

    def budget(self) -> float:
        """The bound of :func:`workload` as a whole: warm-up, singles, concurrent, batches."""
        tmo = self.append_timeout
        return 2 * tmo + 60 + self.duration + 10 + self.rounds * (tmo + 5)


@dataclass(frozen=True)
class Side:
    """One system under :func:`workload`, so that every side runs the very same phases.

    ``append()`` makes one synchronous append, raising on failure and bounded by its own
    timeout (an exception's first argument names the reason); ``batch(n)`` makes ``n``
    appends through the system's batch call and returns how many were acked and why the
    others failed."""

    append: Callable[[], object]
    batch: Callable[[int], tuple[int, list[str]]]


def _sync_appends(append: Callable[[], object], until: float, count: int) -> tuple:
    """Sequential synchronous appends until ``count`` are tried or ``until`` passes;
    returns the latencies (ms) of the acked ones and the failure reasons of the others."""
    lat: list[float] = []
    fails: list[str] = []
    while len(lat) + len(fails) < count and time.monotonic() < until:
        t0 = time.perf_counter()
        try:
            append()
            lat.append((time.perf_counter() - t0) * 1000)
        except Exception as exc:  # PySyncObj: 'Timeout' or a FAIL_REASON code; etcd: a gRPC code
            fails.append(f"sync:{exc.args[0] if exc.args else exc!r}")
    return lat, fails


def workload(side: Side, w: Workload) -> Iterator[dict[str, Any]]:
    """The three phases on ``side``, yielding each one's figures as it ends (the last one
    also ``failures``); every phase is bounded (see :meth:`Workload.budget`)."""
    tmo, fails = w.append_timeout, Counter()
    _sync_appends(side.append, time.monotonic() + tmo, 20)  # warm up
    lat, failed = _sync_appends(side.append, time.monotonic() + 60, w.singles)
    fails.update(failed)
    p50 = statistics.median(lat) if lat else 0.0
    yield {"single_p50_ms": p50, "single_p99_ms": _percentile(lat, 0.99)}

    runs: list[tuple] = []
    until = time.monotonic() + w.duration

    def caller() -> None:
        runs.append(_sync_appends(side.append, until, 1 << 40))

    t0 = time.perf_counter()
    _in_threads(w.threads, caller, until + tmo + 5)
    dt, lat = time.perf_counter() - t0, [x for r in runs for x in r[0]]
    for r in runs:
        fails.update(r[1])
    phase = {"concurrent_entries_per_s": len(lat) / dt, "concurrent_p99_ms": _percentile(lat, 0.99)}
    phase["concurrent_errors"] = sum(len(r[1]) for r in runs) + w.threads - len(runs)
    yield phase

    lock, acked = threading.Lock(), [0]

    def submitter() -> None:
        n, failed = side.batch(w.batch)
        with lock:
            acked[0] += n
            fails.update(failed)

    t0 = time.perf_counter()
    for _ in range(w.rounds):
        _in_threads(w.clients, submitter, time.monotonic() + tmo + 5)
    phase = {"batch_entries_per_s": acked[0] / (time.perf_counter() - t0)}
    phase["batch_errors"] = w.rounds * w.clients * w.batch - acked[0]
    yield {**phase, "failures": dict(fails)}


def _in_threads(n: int, target: Callable[[], None], until: float) -> None:
    """Run ``target`` in ``n`` daemon threads, waiting for them until ``until`` at most."""
    threads = [threading.Thread(target=target, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, until - time.monotonic()))


def round_figures(out: dict[str, Any]) -> dict[str, Any]:
    """Every side's figures rounded alike: throughputs to whole entries, latencies to 0.01 ms."""
    for k in FIGURES:
        out[k] = round(float(out[k]), 0 if k in THROUGHPUTS else 2)
    return out
