"""`rayledger bench mq`: RocketMQ on the ledger against raw appends of the same size.

Figures (``--json`` prints them as one object):

- ``produce_batch_msgs_per_s`` / ``raw_batch_entries_per_s`` / ``produce_vs_raw``:
  ``clients`` threads each putting batches of ``batch`` messages (``put_messages``) on a
  commit-log group, against the same threads appending batches of bodies of the encoded
  record's size (``append_batch``) on a plain group (goal: produce >= 70 % of raw); the
  two alternate in ``phases`` phases, so a drifting machine load weighs on both alike
  (``produce_vs_raw_by_phase`` shows each phase's ratio);
- ``produce_single_p50_ms`` / ``raw_single_p50_ms``: one client, one message at a time;
- ``pull_msgs_per_s``: one consumer pulling a queue from a follower, ``pull_chunk``
  messages a pull, reading every body (goal >= 200,000);
- ``e2e_p50_ms`` / ``e2e_p99_ms``: a message put until a tailing consumer (``follow``) has it.

Both groups have 3 file-backed members with the fast timers; bodies are 128 random bytes.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import time
import uuid

import ray
from rayledger.actors import LedgerConfig, LedgerGroup
from rayledger.integration.rocketmq import CommitLog, Message, encode
from rayledger.storage import LedgerError

from .loads import in_threads, pct

TOPIC = "BenchTopic"


def _single(put, n: int) -> float:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        put()
        lat.append((time.perf_counter() - t0) * 1000)
    return pct(lat, 0.5)


def _until_ok(call, timeout_s: float = 60.0) -> None:
    """``call`` until it succeeds: a group just created on a loaded machine may still change
    its leader once (the first append then ends in an unknown outcome), which is no figure
    of the steady state this benchmark measures."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except LedgerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _produce_vs_raw(raw: LedgerGroup, log: CommitLog, record: int, body: bytes, clients: int,
                    batch: int, rounds: int, phases: int, n1: int) -> dict:  # fmt: skip
    """Raw batches and produced batches in alternating phases (raw, produce, raw, ...), so a
    machine whose load drifts weighs on both alike; rates over all phases."""
    c = raw.client()
    bodies = [os.urandom(record)] * batch
    msgs = [{"topic": TOPIC, "queue_id": 0, "body": body} for _ in range(batch)]
    _until_ok(lambda: c.append_batch(bodies))  # warm both, once each group's leader holds
    _until_ok(lambda: log.put_messages(msgs))
    per_phase = max(1, rounds // phases)
    took = {"raw": 0.0, "produce": 0.0}
    ratios = []
    for _ in range(phases):
        dt = {
            "raw": in_threads(lambda _k: [c.append_batch(bodies) for _ in range(per_phase)], clients),
            "produce": in_threads(lambda _k: [log.put_messages(msgs) for _ in range(per_phase)], clients),
        }  # fmt: skip
        ratios.append(round(dt["raw"] / dt["produce"], 2))
        for k in took:
            took[k] += dt[k]
    n = clients * per_phase * phases * batch
    return {
        "raw_batch_entries_per_s": round(n / took["raw"]),
        "produce_batch_msgs_per_s": round(n / took["produce"]),
        "produce_vs_raw": round(took["raw"] / took["produce"], 2),
        "produce_vs_raw_by_phase": ratios,
        "phases": phases,
        "raw_single_p50_ms": _single(lambda: c.append(bodies[0]), n1),
        "produce_single_p50_ms": _single(lambda: log.put_message(TOPIC, 1, body), n1),
    }


def _pull(log: CommitLog, member: str, chunk: int = 8000) -> dict:
    """One consumer reads the queue from the start (``CommitLog.consume``: ``chunk``
    messages a pull, the next one in flight) and touches every body, as a consumer does."""
    log.pull(TOPIC, 0, 0, chunk, member=member)  # warm
    t0, got, nbytes = time.perf_counter(), 0, 0
    for m in log.consume(TOPIC, 0, 0, chunk, member):
        got += 1
        nbytes += len(m.body)
    dt = time.perf_counter() - t0
    return {"pull_msgs": got, "pull_msgs_per_s": round(got / dt), "pull_chunk": chunk,
            "pull_member": member, "pull_body_bytes": nbytes}  # fmt: skip


def _e2e(log: CommitLog, n: int) -> dict:
    """Messages carry their send time; a tailing consumer on another CommitLog notes arrival."""
    reader = CommitLog(log.group)
    lat: list[float] = []
    done = threading.Event()

    def consume() -> None:
        for m in reader.follow("E2E", poll_s=0.001):
            lat.append((time.perf_counter() - struct.unpack(">d", m.body)[0]) * 1000)
            if len(lat) >= n:
                done.set()
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for _ in range(n):
        log.put_message("E2E", 0, struct.pack(">d", time.perf_counter()))
        time.sleep(0.005)
    done.wait(60)
    return {"e2e_msgs": len(lat), "e2e_p50_ms": pct(lat, 0.5), "e2e_p99_ms": pct(lat, 0.99)}


def run(
    quick: bool = False, clients: int = 4, batch: int = 100, phases: int = 4, **_ignored
) -> dict:
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, namespace="rayledger",
                 include_dashboard=False, log_to_driver=False)  # fmt: skip
    root = tempfile.mkdtemp(prefix="rayledger-bench-mq-")
    rounds, n1, ne2e = (10, 50, 50) if quick else (100, 300, 300)
    phases = 2 if quick else phases
    body = os.urandom(128)
    record = len(encode(Message(TOPIC, body, born_host=("127.0.0.1", 0),
                                store_host=("127.0.0.1", 0))))  # fmt: skip
    out: dict = {"members": 3, "store": "file", "body_bytes": 128, "record_bytes": record,
                 "clients": clients, "batch": batch,
                 "load_avg_1m_before": round(os.getloadavg()[0], 2)}  # fmt: skip
    groups: list[LedgerGroup] = []
    try:
        raw = LedgerGroup.create(f"bench-raw-{uuid.uuid4().hex[:6]}", 3, root, LedgerConfig.fast())
        groups.append(raw)
        log = CommitLog.create(f"bench-mq-{uuid.uuid4().hex[:6]}", 3, root, LedgerConfig.fast())
        groups.append(log.group)
        raw.wait_for_leader(timeout_s=60)
        out.update(_produce_vs_raw(raw, log, record, body, clients, batch, rounds, phases, n1))
        raw.shutdown(delete_data=True)  # the rest reads the commit log alone
        groups.remove(raw)
        follower = next(m for m in log.group.members if m != log.group.leader_id())
        out.update(_pull(log, follower))
        out.update(_e2e(log, ne2e))
    finally:
        for g in groups:
            g.shutdown(delete_data=True)
        shutil.rmtree(root, ignore_errors=True)
        if started:
            ray.shutdown()
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out
