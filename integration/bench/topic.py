"""`rayledger bench topic`: what spreading a log over partitions gives and costs here.

The same batch load (``clients`` clients appending batches of ``batch`` for a few seconds,
each unkeyed batch whole to the next partition in turn) on topics of 1, 2 and 4
partitions of 3 file-backed members each (DLedger's timers: on 2 cores, 4 partitions' 24
processes under load miss 100 ms heartbeats), each partition led by its preferred member
before the load starts, one topic at a time, alternating ``repeats`` times so the machine's
drift falls on every size alike: ``batch_entries_per_s_N`` (the best of the repeats),
``spread_4_over_1``; and what each partition costs when nothing happens:
``idle_cpu_cores_per_partition`` (measured on the 4-partition topic over ``idle_s``, its
keeper's share included), ``processes_per_partition``.

Beside each topic, in the same window and through the same load, N bare card-shaped chains
(:mod:`.floor`, nothing of rayledger in them): ``floor_batch_entries_per_s_N`` and
``floor_spread_4_over_1`` say how much of the spread's cost the machine charges any
program shaped like N groups, and ``spread_4_over_floor`` what is left that is ours.

Each load also reports the whole machine's busy CPU (every process, Ray's daemons
included): ``cores_busy_N`` (out of the machine's cores: 1 partition leaves some idle, 4
saturate them) and ``cpu_us_per_entry_N``, the CPU an entry costs, replicated three times,
which is what a node's cores divide by in the model of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
import time
import uuid
from typing import Any

import ray
from rayledger.actors import LedgerConfig
from rayledger.actors.naming import NAMESPACE
from rayledger.integration.topic import LedgerTopic
from rayledger.integration.topic.topic import keeper

from .floor import FloorChain, FloorError
from .loads import cpu_seconds, group_pids, in_threads, machine_busy_seconds, pct, timed

SIZES = (1, 2, 4)


def _topic_pids(topic: LedgerTopic) -> list[int]:
    pids = [pid for i in range(topic.partitions) for pid in group_pids(topic.group(i))]
    k = keeper(topic.name)
    return pids + ([ray.get(k.pid.remote(), timeout=30)] if k is not None else [])


def _idle(topic: LedgerTopic, seconds: float) -> dict:
    time.sleep(1.0)  # the last appends settle
    pids = _topic_pids(topic)
    before, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    used = cpu_seconds(pids) - before
    return {
        "idle_cpu_cores_per_partition": round(used / (time.monotonic() - t0) / topic.partitions, 3),
        "processes_per_partition": round(len(pids) / topic.partitions, 2),
    }


class _FloorTopic:
    """N bare chains routed as a topic client routes an unkeyed batch: whole, to the next
    chain in turn from a random one."""

    def __init__(self, chains: list[FloorChain]):
        self.clients = [ch.client() for ch in chains]
        self._next = itertools.count(random.randrange(len(chains)))

    def append_batch(self, bodies: list[bytes]) -> int:
        return self.clients[next(self._next) % len(self.clients)].append_batch(bodies)

    def warm(self, body: bytes) -> None:
        for c in self.clients:
            c.append_batch([body])


def _load(clients: list[Any], seconds: float, payload: list[bytes], catch) -> dict:
    lat: list[float] = []
    errors: list[Exception] = []
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        while time.monotonic() < stop:
            timed(lambda: clients[k].append_batch(payload), lat, errors, catch)

    busy = machine_busy_seconds()
    dt = in_threads(worker, len(clients))
    busy = machine_busy_seconds() - busy
    entries = len(lat) * len(payload)
    return {"entries_per_s": round(entries / dt), "p50_ms": pct(lat, 0.5), "errors": len(errors),
            "cores_busy": round(busy / dt, 2),
            "cpu_us_per_entry": round(busy / entries * 1e6, 1) if entries else None}  # fmt: skip


def _batches(topic: LedgerTopic, clients: int, seconds: float, batch: int, body: int) -> dict:
    """``clients`` clients appending batches of ``batch`` for ``seconds``, each client
    connected to every partition before the clock starts (a client's first call to a group
    looks its members up)."""
    payload = [os.urandom(body) for _ in range(batch)]
    cs = [topic.client(idempotent=False) for _ in range(clients)]
    try:
        for c in cs:
            for p in range(topic.partitions):
                c.client(p).append_batch(payload[:1])
        return _load(cs, seconds, payload, Exception)
    finally:
        for c in cs:
            c.close()


def _floor_batches(n: int, clients: int, seconds: float, batch: int, body: int) -> dict:
    """The same load on ``n`` bare chains side by side."""
    payload = [os.urandom(body) for _ in range(batch)]
    chains: list[FloorChain] = []
    try:
        chains = [FloorChain() for _ in range(n)]
        cs = [_FloorTopic(chains) for _ in range(clients)]
        for c in cs:
            c.warm(payload[0])
        return _load(cs, seconds, payload, FloorError)
    finally:
        for ch in chains:
            ch.shutdown()


def run(quick: bool = False, clients: int = 8, batch: int = 1000, repeats: int | None = None,
        idle_s: float | None = None, body: int = 128, floor: bool = True) -> dict:  # fmt: skip
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, namespace=NAMESPACE, include_dashboard=False,
                 log_to_driver=False)  # fmt: skip
    repeats = repeats or (1 if quick else 2)
    seconds = 3.0 if quick else 8.0
    idle_s = idle_s if idle_s is not None else (3.0 if quick else 10.0)
    root = tempfile.mkdtemp(prefix="rayledger-bench-topic-")
    out: dict = {"clients": clients, "batch_size": batch, "members": 3, "repeats": repeats,
                 "load_avg_1m_before": round(os.getloadavg()[0], 2)}  # fmt: skip
    best = {n: 0 for n in SIZES}
    floor_best = {n: 0 for n in SIZES}
    try:
        for rep in range(repeats):
            for n in SIZES:
                name = f"bench-topic-{uuid.uuid4().hex[:6]}"
                topic = LedgerTopic.create(name, n, 3, os.path.join(root, name), LedgerConfig())
                try:
                    topic.wait_for_leaders(60, preferred=True)
                    got = _batches(topic, clients, seconds, batch, body)
                    best[n] = max(best[n], got["entries_per_s"])
                    out.setdefault(f"batch_errors_{n}", 0)
                    out[f"batch_errors_{n}"] += got["errors"]
                    out[f"batch_p50_ms_{n}"] = got["p50_ms"]
                    out[f"cores_busy_{n}"] = got["cores_busy"]
                    out[f"cpu_us_per_entry_{n}"] = got["cpu_us_per_entry"]
                    if n == SIZES[-1] and rep == repeats - 1:
                        out.update(_idle(topic, idle_s))
                finally:
                    topic.delete(delete_data=True)
                if floor:
                    got = _floor_batches(n, clients, seconds, batch, body)
                    floor_best[n] = max(floor_best[n], got["entries_per_s"])
                    out[f"floor_batch_p50_ms_{n}"] = got["p50_ms"]
                    out[f"floor_cores_busy_{n}"] = got["cores_busy"]
                    out[f"floor_cpu_us_per_entry_{n}"] = got["cpu_us_per_entry"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if started:
            ray.shutdown()
    for n in SIZES:
        out[f"batch_entries_per_s_{n}"] = best[n]
    out["spread_4_over_1"] = round(best[4] / best[1], 3) if best[1] else None
    if floor:
        for n in SIZES:
            out[f"floor_batch_entries_per_s_{n}"] = floor_best[n]
        f1, f4 = floor_best[1], floor_best[4]
        out["floor_spread_4_over_1"] = round(f4 / f1, 3) if f1 else None
        if out["spread_4_over_1"] and out["floor_spread_4_over_1"]:
            out["spread_4_over_floor"] = round(
                out["spread_4_over_1"] / out["floor_spread_4_over_1"], 3
            )
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out
