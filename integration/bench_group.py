"""`rayledger bench group`: a 3-member file-backed group on a local Ray.

Measures committed-append throughput (batches of 1000 128-byte entries from
several concurrent clients), single-entry latency at low load, and failover
time (leader killed -> first successful append) with fast and default timers.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid

import ray
from rayledger.actors import LedgerConfig, LedgerError, LedgerGroup
from rayledger.election import ElectionConfig


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _throughput(group: LedgerGroup, clients: int, batches: int, batch: int, body: int) -> float:
    payload = [os.urandom(body) for _ in range(batch)]
    errors: list[Exception] = []

    def worker() -> None:
        c = group.client()
        for _ in range(batches):
            try:
                c.append_batch(payload)
            except LedgerError as exc:
                errors.append(exc)

    group.client().append_batch(payload)  # warm up every hop
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return clients * batches * batch / dt


def _latency(group: LedgerGroup, n: int) -> list[float]:
    c = group.client()
    c.append(b"warm")
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.append(b"x" * 128)
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.002)
    return out


def _failover(group: LedgerGroup) -> float:
    c = group.client(timeout_s=60)
    c.append(b"before")
    leader = group.wait_for_leader()
    t0 = time.perf_counter()
    group.kill(leader)
    while True:
        try:
            c.append(b"after", timeout_s=60)
            return time.perf_counter() - t0
        except LedgerError:
            time.sleep(0.01)


def run(quick: bool = False) -> dict:
    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",
            num_cpus=2,
            namespace="rayledger",
            include_dashboard=False,
            log_to_driver=False,
        )
    root = tempfile.mkdtemp(prefix="rayledger-bench-")
    out: dict = {"members": 3, "store": "file", "flush": "async", "body_bytes": 128}
    try:
        fast = LedgerConfig.fast()
        g = LedgerGroup.create(f"bench-{uuid.uuid4().hex[:6]}", 3, store_dir=root, config=fast)
        g.wait_for_leader()
        clients, batches = (4, 10) if quick else (4, 60)
        out["append_entries_per_s"] = round(_throughput(g, clients, batches, 1000, 128))
        out["clients"] = clients
        lat = _latency(g, 100 if quick else 500)
        out["append_p50_ms"] = round(statistics.median(lat), 2)
        out["append_p99_ms"] = round(_percentile(lat, 0.99), 2)
        out["failover_s"] = round(_failover(g), 3)
        g.shutdown(delete_data=True)
        if not quick:
            dflt = LedgerConfig(election=ElectionConfig())
            g2 = LedgerGroup.create(f"bench-{uuid.uuid4().hex[:6]}", 3, store_dir=root, config=dflt)
            g2.wait_for_leader(timeout_s=60)
            out["failover_default_timers_s"] = round(_failover(g2), 3)
            g2.shutdown(delete_data=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if started:
            ray.shutdown()
    return out
