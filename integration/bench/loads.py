"""The load phases ``bench group`` and the floor (:mod:`.floor`) share, so both measure
through the same code: latency percentiles, timed calls, threads, the CPU of a set of
processes, the 64-thread phase (one shared client) and the batch phase."""

from __future__ import annotations

import os
import threading
import time

import ray
from rayledger.actors import LedgerError, LedgerGroup


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def timed(call, lat: list[float], errors: list[Exception], catch=LedgerError) -> None:
    """Run ``call``; its latency in ms goes to ``lat``, or its ``catch`` error to ``errors``."""
    t0 = time.perf_counter()
    try:
        call()
    except catch as exc:
        errors.append(exc)
        return
    lat.append((time.perf_counter() - t0) * 1000)


def in_threads(target, n: int) -> float:
    """Run ``target(k)`` in ``n`` threads; the wall time in seconds."""
    ts = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def group_pids(group: LedgerGroup) -> list[int]:
    pids = []
    for m in group.members:
        h = group.handle(m)
        pids.append(ray.get(h.info.remote(), timeout=10)["pid"])
        pids += list(ray.get(h.helper_pids.remote(), timeout=10).values())
    return pids


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_ticks(p) for p in pids) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine spent busy since boot (all processes: the
    actors, Ray's own daemons, the driver), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def concurrent_phase(group, threads: int, seconds: float, body: int, pids: list[int] | None = None,
                catch=LedgerError) -> dict:  # fmt: skip
    """``threads`` threads sharing one client of ``group`` (a LedgerGroup, or the floor's
    chain with its ``pids``), and the CPU of its processes and of this one per append."""
    c = group.client(idempotent=False)
    c.append(b"warm")
    payload = os.urandom(body)
    lats: list[list[float]] = [[] for _ in range(threads)]
    errors: list[Exception] = []
    pids = [*(group_pids(group) if pids is None else pids), os.getpid()]
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        while time.monotonic() < stop:
            timed(lambda: c.append(payload), lats[k], errors, catch)

    before = cpu_seconds(pids)
    dt = in_threads(worker, threads)
    cpu = cpu_seconds(pids) - before
    all_lat = [x for lat in lats for x in lat]
    return {
        "concurrent_cpu_ms_per_append": round(cpu * 1000 / max(1, len(all_lat)), 3),
        "concurrent_threads": threads,
        "concurrent_entries_per_s": round(len(all_lat) / dt),
        "concurrent_p50_ms": pct(all_lat, 0.5),
        "concurrent_p99_ms": pct(all_lat, 0.99),
        "concurrent_errors": len(errors),
    }


def batch_phase(
    group,
    clients: int,
    rounds: int,
    batch: int,
    body: int,
    series: dict | None = None,
    catch=LedgerError,
) -> dict:
    """``clients`` clients of ``group`` (a LedgerGroup or the floor's chain) appending
    ``rounds`` batches each."""
    payload = [os.urandom(body) for _ in range(batch)]
    errors: list[Exception] = []
    lat: list[float] = []

    def worker(_k: int) -> None:
        c = group.client(idempotent=False)
        for _ in range(rounds):
            timed(lambda: c.append_batch(payload), lat, errors, catch)

    group.client(idempotent=False).append_batch(payload)  # warm up every hop
    dt = in_threads(worker, clients)
    if series is not None:
        series["latency_ms"][f"batch of {batch}, {clients} clients"] = lat
    return {
        "batch_clients": clients,
        "batch_size": batch,
        "batch_entries_per_s": round(len(lat) * batch / dt),
        "batch_p50_ms": pct(lat, 0.5),
        "batch_p99_ms": pct(lat, 0.99),
        "batch_errors": len(errors),
    }
