"""`rayledger bench peer`: PySyncObj 0.3.17, etcd and rayledger on the same workload, one run.

PySyncObj is the closest Python peer (Raft, pure-Python transport); etcd (:mod:`.etcd_peer`)
is the reference Raft store in Go, fsyncing its WAL.  Every side runs :func:`workload`
and reports ``bench group``'s figures: ``single_p50_ms``/``single_p99_ms`` (one caller,
sequential synchronous appends), ``concurrent_entries_per_s``/``concurrent_p99_ms``
(``threads`` callers doing sequential synchronous appends for a fixed time) and
``batch_entries_per_s`` (``clients`` callers submitting ``batch`` appends per round through
the side's batch call; PySyncObj has none, so: asynchronous appends with callbacks).
Beside them, ``floor``: the same loads on a bare Ray chain of rayledger's own shape
(:mod:`.floor`), taken in ``bench group``'s run, so the ratios say how much of rayledger's
cost is Ray's on this machine and how much its own.

Fairness notes.  Each PySyncObj node runs in a process of its own ('spawn'), as each
rayledger member runs in a Ray worker, and keeps its log in a journal file (``journalFile``,
mmap'ed and never fsynced, about rayledger's default asynchronous flush) with compaction
dumps written by a forked child (``fullDumpFile``).  The callers run inside the leader's
process: PySyncObj pays no client hop, rayledger's clients reach the leader through Ray.
PySyncObj keeps its default timers but ``appendEntriesUseBatch=False`` (by default entries
wait for the next 100 ms heartbeat: ~100 ms per single append and 2-9x less throughput on
this workload) and a 0.5 s connection retry.  Every wait is bounded: a stalled run yields
zeros and an ``error`` field, never a hang; PySyncObj's warnings are counted in
``pysyncobj_log``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from .peer_workload import (
    FIGURES,
    THROUGHPUTS,
    Side,
    Workload,
    _free_port,
    round_figures,
    workload,
)

log = logging.getLogger("rayledger.bench")

# PySyncObj's defaults (election 0.4-1.4 s, heartbeat 0.1 s, tick 0.05 s) but for these.
PEER_CONF: dict[str, Any] = {
    "dynamicMembershipChange": False,
    "appendEntriesUseBatch": False,
    "connectionRetryTime": 0.5,
}


def _require_pysyncobj() -> None:
    try:
        import pysyncobj  # noqa: F401
    except ImportError:
        from rayledger.storage import LedgerError, ResponseCode

        raise LedgerError.of(
            ResponseCode.UNSUPPORTED,
            "pip install '.[bench]' (or pysyncobj==0.3.17) to run the PySyncObj side",
        ) from None


def _make_node(addrs: list[str], index: int, workdir: str, conf: dict[str, Any]):
    from pysyncobj import SyncObj, SyncObjConf, replicated

    class PeerLedger(SyncObj):
        def __init__(self) -> None:
            base = os.path.join(workdir, f"node{index}")
            cfg = SyncObjConf(journalFile=base + ".journal", fullDumpFile=base + ".dump", **conf)
            super().__init__(addrs[index], [a for a in addrs if a != addrs[index]], cfg)
            self.bodies: list[bytes] = []

        @replicated
        def append(self, body: bytes) -> int:
            self.bodies.append(body)
            return len(self.bodies)

    return PeerLedger()


def _pysyncobj_side(node, body: bytes, tmo: float) -> Side:
    """PySyncObj has no batch call: a batch is ``n`` asynchronous appends with callbacks."""

    def append() -> None:
        node.append(body, sync=True, timeout=tmo)

    def batch(n: int) -> tuple[int, list[str]]:
        done, lock, left, acked, fails = threading.Event(), threading.Lock(), [n], [0], []

        def on_result(_res: Any, err: int) -> None:
            with lock:
                acked[0] += err == 0
                fails.extend([f"async:{err}"] if err else [])
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        for _ in range(n):
            node.append(body, callback=on_result)
        done.wait(tmo)
        with lock:
            return acked[0], list(fails)

    return Side(append, batch)


def _tally_pysyncobj_log() -> Counter:
    """Count PySyncObj's warnings instead of printing them; they go into the result."""
    tally: Counter = Counter()

    class Tally(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            exc = record.exc_info[1] if record.exc_info else None
            what = str(record.msg).split("%")[0].strip()  # the message without its numbers
            tally[f"{record.levelname}: {what}" + (f" [{exc!r}]" if exc else "")] += 1

    logger = logging.getLogger("pysyncobj")
    logger.addHandler(Tally(logging.WARNING))
    logger.propagate = False
    return tally


def _node_main(addrs: list[str], index: int, workdir: str, conf: dict, cmd_q, res_q, life: float):
    """A PySyncObj node in a process of its own; answers the parent's commands."""
    parent, end, tally, node = os.getppid(), time.monotonic() + life, _tally_pysyncobj_log(), None
    try:
        node = _make_node(addrs, index, workdir, conf)
        while time.monotonic() < end and os.getppid() == parent:
            try:
                cmd = cmd_q.get(timeout=0.2)
            except queue.Empty:  # tell the parent how this node sees the group
                leader = getattr(node._getLeader(), "id", None)
                res_q.put(("status", index, node.isReady(), node._isLeader(), leader))
                continue
            if cmd[0] == "run":
                term, w = node._getTerm(), cmd[1]
                side = _pysyncobj_side(node, os.urandom(w.body_bytes), w.append_timeout)
                for phase in workload(side, w):
                    res_q.put(("phase", phase))
                res_q.put(("done", {"leader_stable": node._isLeader() and node._getTerm() == term}))
            else:
                break
    except BaseException as exc:  # reported to the parent
        res_q.put(("error", f"node {index}: {exc!r}"))
    finally:
        if node is not None:
            node.destroy()
        res_q.put(("log", dict(tally)))


def _wait_for_leader(procs: list, res_q, timeout: float) -> int:
    """The leader's index, once every node is ready and names it as the leader."""
    deadline, seen = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            msg = res_q.get(timeout=0.2)
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            if msg[0] == "status":
                seen[msg[1]] = msg[2:]  # (ready, is leader, leader id), the latest per node
        if not all(proc.is_alive() for proc in procs):
            raise RuntimeError("a node exited before a leader was elected")
        leaders = [i for i, (_, lead, _) in seen.items() if lead]
        if len(seen) == len(procs) and len(leaders) == 1:
            lid = seen[leaders[0]][2]
            if all(ready and leader == lid for ready, _, leader in seen.values()):
                return leaders[0]
    raise TimeoutError(f"no leader with all {len(procs)} nodes ready within {timeout:g} s")


def _read_log(res_q, logged: Counter) -> bool:
    """Read one message, keeping a node's log tally; False once nothing comes."""
    try:
        msg = res_q.get(timeout=0.1)
    except (queue.Empty, OSError, EOFError, ValueError):
        return False
    logged.update(msg[1] if msg[0] == "log" else {})
    return True


def _stop(procs: list, cmd_qs: list, res_q) -> Counter:
    """Ask the nodes to stop, then SIGTERM and SIGKILL (by pid) any still running; returns
    what they logged (read while they exit: a child waits for its queue to be drained)."""
    for q in cmd_qs:
        q.put(("stop",))
    started, logged = [proc for proc in procs if proc.pid is not None], Counter()
    for stop, grace in ((None, 5.0), ("terminate", 3.0), ("kill", 3.0)):
        for proc in started:
            if stop is not None and proc.is_alive():
                getattr(proc, stop)()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(proc.is_alive() for proc in started):
            _read_log(res_q, logged)
    while _read_log(res_q, logged):
        pass
    for q in [res_q, *cmd_qs]:
        q.close()
        q.cancel_join_thread()
    return logged


def run_pysyncobj(
    quick: bool = False,
    threads: int = 64,
    clients: int = 4,
    batch: int = 1000,
    body_bytes: int = 128,
    nodes: int = 3,
) -> dict:
    """The PySyncObj side: ``nodes`` nodes on loopback, callers in the leader's process."""
    _require_pysyncobj()
    w = Workload.sized(quick, threads, clients, batch, body_bytes)
    budget = w.budget()
    out: dict[str, Any] = {"nodes": nodes, "body_bytes": body_bytes, **dict.fromkeys(FIGURES, 0.0)}
    ctx = mp.get_context("spawn")
    workdir = tempfile.mkdtemp(prefix="rayledger-peer-")
    addrs = [f"127.0.0.1:{_free_port()}" for _ in range(nodes)]
    res_q, cmd_qs = ctx.Queue(), [ctx.Queue() for _ in addrs]
    args = [(addrs, i, workdir, PEER_CONF, cmd_qs[i], res_q, budget + 90) for i in range(nodes)]
    procs = [ctx.Process(target=_node_main, args=a, daemon=True) for a in args]
    phase = "election"
    try:
        for proc in procs:
            proc.start()
        t0 = time.monotonic()
        leader = _wait_for_leader(procs, res_q, 30.0 if quick else 60.0)
        out["election_s"] = round(time.monotonic() - t0, 2)
        log.info("pysyncobj leader is node %d (%s)", leader, addrs[leader])
        cmd_qs[leader].put(("run", w))
        deadline = time.monotonic() + budget
        for phase in ("single", "concurrent", "batch", "done"):  # noqa: B007
            while (msg := res_q.get(timeout=max(0.1, deadline - time.monotonic())))[0] == "status":
                pass  # the followers keep reporting
            if msg[0] not in ("phase", "done"):
                raise RuntimeError(msg[1] if msg[0] == "error" else "a node exited mid-run")
            out.update(msg[1])
    except queue.Empty:
        out["error"] = f"pysyncobj stalled: no {phase} result within {budget:.0f} s"
    except Exception as exc:  # a failed peer run is a result
        out["error"] = f"pysyncobj failed during {phase}: {exc}"
    finally:
        out["pysyncobj_log"] = dict(_stop(procs, cmd_qs, res_q))
        shutil.rmtree(workdir, ignore_errors=True)
    if "error" in out:
        log.warning("%s", out["error"])
    return round_figures(out)


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float | None]:
    """rayledger over the peer for throughputs, the peer over rayledger for latencies (>1:
    rayledger better); None where either side has no positive figure (failed or skipped)."""
    ratio: dict[str, float | None] = {}
    for k in FIGURES:
        a, b = (ours.get(k), peer.get(k)) if k in THROUGHPUTS else (peer.get(k), ours.get(k))
        ok = isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0
        ratio[k] = round(a / b, 2) if ok else None
    return ratio


def floor_side(ours: dict[str, Any]) -> dict[str, Any]:
    """The floor's figures out of ``bench group``'s, named as every side's are."""
    side = {k: ours[f"floor_{k}"] for k in FIGURES if f"floor_{k}" in ours}
    side["cpu_ms_per_append"] = ours.get("floor_cpu_ms_per_append")
    side["actors"] = ours.get("floor_actors")
    if "floor_error" in ours:
        side["error"] = ours["floor_error"]
    return side


def run(
    quick: bool = False,
    clients: int = 4,
    batch: int = 1000,
    members: int = 3,
    threads: int = 64,
    sync_flush: bool = False,
    fast_path: bool | None = None,
    max_rounds: int | None = None,
    floor: bool = True,
    floor_actors: str = "threaded",
) -> dict:
    """PySyncObj, then etcd (skipped, with a line on stderr, where its binary is absent),
    then rayledger (``bench group``) and its floor, with ratios per peer (>1: rayledger
    better). One side at a time, each stopped before the next starts, so they never share
    the CPUs."""
    _require_pysyncobj()
    from .etcd_peer import run_etcd

    peer = run_pysyncobj(quick=quick, threads=threads, clients=clients, batch=batch, nodes=members)
    etcd = run_etcd(quick=quick, threads=threads, clients=clients, batch=batch, nodes=members)
    from .floor import RATIOS
    from .group import run as run_group

    kw = dict(clients=clients, batch=batch, members=members, threads=threads)
    ours = run_group(
        quick=quick,
        sync_flush=sync_flush,
        fast_path=fast_path,
        max_rounds=max_rounds,
        appends_only=True,
        floor=floor,
        floor_actors=floor_actors,
        **kw,
    )
    bare = floor_side(ours) if floor else {"skipped": "--no-floor"}
    ratio, ratio_etcd, ratio_floor = ratios(ours, peer), ratios(ours, etcd), ratios(ours, bare)
    w = Workload.sized(quick, threads, clients, batch)
    workload = dict(members=members, body_bytes=w.body_bytes, threads=threads, clients=clients)
    workload.update(batch=batch, quick=quick, rayledger_sync_flush=sync_flush)
    workload.update(single_appends=w.singles, concurrent_s=w.duration)
    workload["pysyncobj"] = (
        "0.3.17, a process per node, journalFile (mmap, never fsynced) + fullDumpFile, "
        "appendEntriesUseBatch=False, callers in the leader's process, batch = async appends"
    )
    workload["etcd"] = etcd.get("setup", etcd.get("skipped", ""))
    workload["ratio"] = "rayledger/pysyncobj (throughputs), pysyncobj/rayledger (latencies)"
    workload["ratio_etcd"] = "rayledger/etcd (throughputs), etcd/rayledger (latencies)"
    workload["floor"] = bare.get("skipped") or (
        "the card's chain on bare Ray (leader, a dispatcher per follower, followers writing to "
        f"memory, checker), {bare.get('actors')} actors, the same client coalescing and loads"
    )
    workload["ratio_floor"] = "rayledger/floor (throughputs), floor/rayledger (latencies)"
    ran_etcd = "skipped" not in etcd
    return {
        "workload": workload,
        "pysyncobj": peer,
        "etcd": etcd,
        "rayledger": ours,
        "ratio": ratio,
        "ratio_etcd": ratio_etcd,
        "floor": bare,
        "ratio_floor": ratio_floor,
        "over_floor": {k: ours.get(k) for k in RATIOS} if floor else {},
        "rayledger_ahead_on_every_figure": all(r is not None and r > 1 for r in ratio.values()),
        "rayledger_ahead_of_etcd_on_every_figure": (
            all(r is not None and r > 1 for r in ratio_etcd.values()) if ran_etcd else None
        ),
    }
