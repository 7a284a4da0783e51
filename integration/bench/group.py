"""`rayledger bench group`: a file-backed group on a local Ray, tried as its users would.

Figures (``--json`` prints them as one object):

- ``single_p50_ms`` / ``single_p99_ms``: one client, sequential ``client.append(body)``;
- ``concurrent_entries_per_s`` / ``concurrent_p99_ms`` / ``concurrent_errors``:
  ``threads`` threads sharing one ``LedgerClient``, each appending single entries in a
  loop (the client coalesces them into few calls);
- ``pipelined_entries_per_s`` / ``pipelined_p99_ms``: one thread keeping
  ``pipelined_depth`` single appends in flight through ``append_future`` (what an async
  driver gets from ``append_async``);
- ``batch_entries_per_s`` / ``batch_p50_ms`` / ``batch_p99_ms``: ``clients`` clients
  each appending batches of ``batch`` entries;
- exactly-once appends: the figures above are of plain clients
  (``idempotent=False``); ``idempotent_single_p50_ms`` / ``_p99_ms`` and
  ``idempotent_batch_entries_per_s`` are the same loads through idempotent clients (the
  default), call by call in turn with plain ones (``interleaved_plain_*``), with
  ``idempotent_batch_cost`` (the share of batch throughput lost) and
  ``idempotent_single_p50_extra_ms`` (the median of the paired differences); goal: at
  most 10 % and 1 ms.  ``session_table_mib_10k_clients``: the memory of the client-session
  table a member keeps for 10,000 clients with the most runs it keeps (8) each;
- ``failover_s`` (``LedgerConfig.fast()``) and ``failover_default_timers_s`` (DLedger's
  timers): SIGKILL the leader, time until the first acknowledged append;
- ``ray_rtt_p50_ms``: a plain round trip between two async actors on the same Ray,
  measured beside the single appends (before and after them), and
  ``single_p50_over_rtt``: how many such round trips a single append costs;
- the floor (:mod:`.floor`; ``floor=False`` skips it): the single, 64-thread and batch loads
  on a bare Ray chain of the card's shape, right after the group is shut down, through the
  same code: ``floor_single_p50_ms``, ``floor_concurrent_entries_per_s``,
  ``floor_cpu_ms_per_append``, ``floor_batch_entries_per_s`` (and their p50/p99/errors),
  ``floor_actors`` (its concurrency model, ``floor_actors``: see :mod:`.floor`), and each group
  figure over the floor's: ``single_p50_over_floor``, ``concurrent_over_floor``,
  ``cpu_over_floor``, ``batch_over_floor``, with ``floor_single_p50_over_rtt``.  Ray's cost
  on this machine drifts by up to 2x over minutes; the ratios, taken in one run, do not;
- ``concurrent_cpu_ms_per_append``: CPU time of the group's processes and of the
  driver (where the client's threads run) during the 64-thread phase, per acked append;
- ``idle_cpu_cores`` / ``group_processes`` / ``group_rss_mib`` / ``group_pss_mib``: CPU
  used by the group's processes (members, dispatchers, checkers) while nobody appends,
  how many there are and their memory (RSS counts pages shared between them once per
  process; PSS splits them); ``idle_cpu_cores_default_timers``: the same on a group with
  DLedger's timers (heartbeat 2 s; the figures above use ``LedgerConfig.fast()``'s 100 ms,
  whose heartbeats alone cost a few hundredths of a core);
- ``reads_per_s_<consistency>``: ``threads`` threads sharing one client reading single
  committed entries (``linearizable``, ``lease``, ``committed`` from the leader, and
  ``linearizable_any``: follower reads spread over every member);
- ``term_changes_under_load``: leader terms started while the load phases ran (with the
  fast timers; 0 means heartbeats never starved behind the data path).
  ``--load-seconds 60`` makes the saturating single-append phase a minute long.

Bodies are 128 random bytes.  With ``sync_flush`` an acknowledgement means the entry
was fdatasynced on a quorum.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import wait

import ray
from rayledger.actors import LedgerConfig, LedgerError, LedgerGroup
from rayledger.election import ElectionConfig
from rayledger.replication.sessions import KEEP_RUNS
from rayledger.storage import ResponseCode, StoreConfig

from .loads import (
    batch_phase,
    concurrent_phase,
    cpu_seconds,
    group_pids,
    in_threads,
    pct,
    timed,
)


@ray.remote(num_cpus=0)
class _Echo:
    """One side of the plain actor round trip ``ray_rtt_p50_ms`` measures (async, as
    members are)."""

    async def ping(self) -> None:
        return None

    async def pings(self, other, n: int) -> list[float]:
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            await other.ping.remote()
            lat.append((time.perf_counter() - t0) * 1000)
        return lat


def _rtts(pair, n: int) -> list[float]:
    a, b = pair
    return ray.get(a.pings.remote(b, n), timeout=120)


def _single(group: LedgerGroup, n: int, body: int, series: dict | None = None) -> dict:
    c = group.client(idempotent=False)
    c.append(b"warm")
    pair = (_Echo.remote(), _Echo.remote())
    rtt = _rtts(pair, 20 + n // 2)[20:]  # the first calls pay for connections
    lat = []
    payload = os.urandom(body)
    for _ in range(n):
        t0 = time.perf_counter()
        c.append(payload)
        lat.append((time.perf_counter() - t0) * 1000)
    rtt += _rtts(pair, n // 2)
    for a in pair:
        ray.kill(a)
    if series is not None:
        series["latency_ms"]["single append, 1 client"] = lat
    p50, rtt50 = pct(lat, 0.5), pct(rtt, 0.5)
    return {
        "single_p50_ms": p50,
        "single_p99_ms": pct(lat, 0.99),
        "ray_rtt_p50_ms": rtt50,
        "single_p50_over_rtt": round(p50 / rtt50, 2) if rtt50 else 0.0,
    }


def _pipelined(group: LedgerGroup, depth: int, seconds: float, body: int) -> dict:
    c = group.client(idempotent=False)
    c.append(b"warm")
    payload = os.urandom(body)
    inflight: dict = {}
    lat: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    t0 = time.perf_counter()
    while time.monotonic() < stop or inflight:
        while time.monotonic() < stop and len(inflight) < depth:
            inflight[c.append_future([payload])] = time.perf_counter()
        done, _ = wait(list(inflight), return_when="FIRST_COMPLETED")
        now = time.perf_counter()
        for f in done:
            started = inflight.pop(f)
            if f.exception() is None:
                lat.append((now - started) * 1000)
            else:
                errors += 1
    dt = time.perf_counter() - t0
    return {
        "pipelined_depth": depth,
        "pipelined_entries_per_s": round(len(lat) / dt),
        "pipelined_p99_ms": pct(lat, 0.99),
        "pipelined_errors": errors,
    }


def _idempotent(g: LedgerGroup, out: dict, n: int, clients: int, rounds: int, batch: int,
                body: int) -> None:  # fmt: skip
    """The single and batch loads through idempotent and plain clients, call by call in
    turn (this machine's speed drifts by up to 2x over minutes, which buries a
    difference of a few percent between runs taken one after the other)."""
    payload = os.urandom(body)
    plain, idem = g.client(idempotent=False), g.client(idempotent=True)
    plain.append(payload)
    idem.append(payload)
    lat: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n):
        for c, k in ((plain, False), (idem, True)) if i % 2 else ((idem, True), (plain, False)):
            t0 = time.perf_counter()
            c.append(payload)
            lat[k].append((time.perf_counter() - t0) * 1000)
    out["idempotent_single_p50_ms"] = pct(lat[True], 0.5)
    out["idempotent_single_p99_ms"] = pct(lat[True], 0.99)
    out["interleaved_plain_single_p50_ms"] = pct(lat[False], 0.5)
    out["idempotent_single_p50_extra_ms"] = round(
        statistics.median(y - x for x, y in zip(lat[False], lat[True], strict=True)), 2
    )
    bodies = [os.urandom(body) for _ in range(batch)]
    blat: dict[bool, list[float]] = {False: [], True: []}
    lock = threading.Lock()

    def worker(k: int) -> None:
        cs = {False: g.client(idempotent=False), True: g.client(idempotent=True)}
        for i in range(rounds):
            for idem_ in (i + k) % 2 == 0, (i + k) % 2 == 1:
                t0 = time.perf_counter()
                cs[idem_].append_batch(bodies)
                with lock:
                    blat[idem_].append(time.perf_counter() - t0)

    in_threads(worker, clients)
    rate = {k: round(clients * batch / statistics.mean(v)) for k, v in blat.items()}
    out["idempotent_batch_entries_per_s"] = rate[True]
    out["interleaved_plain_batch_entries_per_s"] = rate[False]
    out["idempotent_batch_cost"] = round(1 - rate[True] / rate[False], 3)
    out["session_table_mib_10k_clients"] = session_table_mib(10_000)


def session_table_mib(clients: int, runs: int = KEEP_RUNS) -> float:
    """MiB a member's client-session table takes for ``clients`` sessions of ``runs`` runs
    each (every entry its own run: the most a session keeps), measured with tracemalloc."""
    import tracemalloc

    import numpy as np
    from rayledger.replication.sessions import SessionTable
    from rayledger.storage.codec import SESSION_DTYPE

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = SessionTable(ttl_ms=3_600_000, keep_runs=runs)
    for r in range(runs):  # clients interleaved: one entry of each, so one run each time
        idx = np.arange(r * clients, (r + 1) * clients, dtype=np.int64)
        recs = np.zeros(clients, SESSION_DTYPE)
        recs["client"] = np.arange(1, clients + 1)
        recs["seq"] = r
        recs["stamp"] = 1_000 + r
        table.appended(idx, recs)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(table) == clients
    return round(used / (1 << 20), 2)


def _memory_mib(pids: list[int]) -> dict:
    """RSS and PSS of ``pids`` summed, in MiB (``/proc/<pid>/smaps_rollup``)."""
    kib = {"Rss:": 0, "Pss:": 0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, value, *_ = line.split()
                    if key in kib:
                        kib[key] += int(value)
        except OSError:
            continue
    return {
        "group_rss_mib": round(kib["Rss:"] / 1024, 1),
        "group_pss_mib": round(kib["Pss:"] / 1024, 1),
    }


def _idle(group: LedgerGroup, seconds: float) -> dict:
    # let the last appends settle, and a compiled graph park (its participants spin)
    settle = 1.0 + (group.config.fast_path_park_ms / 1000 if group.config.fast_path else 0)
    time.sleep(settle)
    pids = group_pids(group)
    before = cpu_seconds(pids)
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    used = cpu_seconds(pids) - before
    return {
        "idle_cpu_cores": round(used / dt, 3),
        "group_processes": len(pids),
        "idle_processes": len(pids),
        **_memory_mib(pids),
    }


def _read_load(c, last: int, threads: int, seconds: float, consistency: str, member) -> dict:
    """``threads`` threads reading single entries among the last 100 for ``seconds``."""
    lats: list[list[float]] = [[] for _ in range(threads)]
    errors: list[Exception] = []
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            index = last - (k * 7 + i) % 100
            i += 1
            timed(lambda: c.get(index, consistency, member), lats[k], errors)  # noqa: B023

    dt = in_threads(worker, threads)
    return {"per_s": round(sum(len(lat) for lat in lats) / dt), "errors": len(errors)}


def _reads(group: LedgerGroup, threads: int, seconds: float) -> dict:
    c = group.client()
    last = c.append_batch([b"r%d" % i for i in range(100)])[-1].index
    out = {}
    for name, consistency, member in (
        ("linearizable", "linearizable", None),
        ("lease", "lease", None),
        ("committed", "committed", None),
        ("linearizable_any", "linearizable", "any"),
    ):
        r = _read_load(c, last, threads, seconds, consistency, member)
        out[f"reads_per_s_{name}"], out[f"reads_errors_{name}"] = r["per_s"], r["errors"]
    return out


def _max_term(group: LedgerGroup) -> int:
    return max(s.term for s in group.status().values())


def _failover(group: LedgerGroup, deadline_s: float = 120.0) -> float:
    c = group.client(timeout_s=60)
    c.append(b"before")
    leader = group.wait_for_leader()
    t0 = time.perf_counter()
    group.kill(leader)
    while time.perf_counter() - t0 < deadline_s:
        try:
            c.append(b"after", timeout_s=60)
            return round(time.perf_counter() - t0, 3)
        except LedgerError:
            time.sleep(0.005)
    raise LedgerError.of(ResponseCode.TIMEOUT, f"no append succeeded {deadline_s}s after the kill")


def _phase_sizes(quick: bool) -> tuple[int, int]:
    """Sequential single appends, and batches per client: the group's and its floor's."""
    return (100, 5) if quick else (500, 40)


def _measure(
    g: LedgerGroup, quick, clients, batch, threads, body, plot: str | None, load_s: float | None,
    appends_only: bool = False,
) -> dict:  # fmt: skip
    """Every figure on one group; with ``plot`` also a sweep over client counts, drawn.
    ``appends_only``: single, concurrent and batch appends alone (``bench peer``'s figures)."""
    series: dict | None = {"latency_ms": {}, "throughput": [], "batch": batch} if plot else None
    n_single, rounds = _phase_sizes(quick)
    g.wait_for_leader(timeout_s=60)
    term = _max_term(g)
    out = _single(g, n_single, body, series)
    load_s = load_s or (3 if quick else 10)
    out.update(concurrent_phase(g, threads, load_s, body))
    out["load_seconds"] = load_s
    if appends_only:
        out.update(batch_phase(g, clients, rounds, batch, body))
        return out
    out.update(_pipelined(g, 256, 3 if quick else 10, body))
    out.update(batch_phase(g, clients, rounds, batch, body, series))
    _idempotent(g, out, n_single, clients, rounds, batch, body)
    out["term_changes_under_load"] = _max_term(g) - term
    out.update(_reads(g, min(threads, 16), 2 if quick else 5))
    if series is not None:
        for n in sorted({1, 2, clients, 2 * clients}):
            r = out if n == clients else batch_phase(g, n, rounds, batch, body)
            series["throughput"].append((n, r["batch_entries_per_s"]))
        from .plot import plot_group

        flush = "sync" if g.config.store.sync_flush else "async"
        title = f"rayledger bench group: {len(g.members)} members, {flush} flush" + (
            " (quick)" if quick else ""
        )
        out["plot"] = str(plot_group(series, plot, title))
    out.update(_idle(g, 3 if quick else 10))
    out["failover_s"] = _failover(g)
    return out


def run(
    quick: bool = False,
    clients: int = 4,
    batch: int = 1000,
    members: int = 3,
    threads: int = 64,
    sync_flush: bool = False,
    fast_path: bool | None = None,
    max_rounds: int | None = None,
    body: int = 128,
    plot: str | None = None,
    load_seconds: float | None = None,
    appends_only: bool = False,
    floor: bool = True,
    floor_actors: str = "threaded",
) -> dict:
    """Every figure on a group, then (``floor``) the same loads on the bare chain of
    :mod:`.floor` right after the group is gone, and each figure's ratio to the floor's."""
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
    out: dict = {
        "members": members,
        "store": "file",
        "flush": "sync" if sync_flush else "async",
        "body_bytes": body,
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    store = StoreConfig(sync_flush=sync_flush)
    paths = {} if fast_path is None else {"fast_path": fast_path}
    if max_rounds is not None:
        paths["max_rounds"] = max_rounds
    try:
        fast = LedgerConfig.fast(store=store, **paths)
        out["fast_path"] = fast.fast_path
        out["max_rounds"] = fast.max_rounds
        name = f"bench-{uuid.uuid4().hex[:6]}"
        g = LedgerGroup.create(name, members, store_dir=root, config=fast)
        try:
            out.update(
                _measure(g, quick, clients, batch, threads, body, plot, load_seconds, appends_only)
            )
        finally:
            g.shutdown(delete_data=True)
        if floor and members > 1:
            out.update(_floor(quick, out, clients, batch, members, threads, body, floor_actors))
        if not quick and not appends_only:
            dflt = LedgerConfig(election=ElectionConfig(), store=store, **paths)
            g2 = LedgerGroup.create(f"bench-{uuid.uuid4().hex[:6]}", members, root, dflt)
            try:
                g2.wait_for_leader(timeout_s=60)
                g2.client(idempotent=False).append(b"warm")  # the leader's helpers started
                idle = _idle(g2, 10)
                out["idle_cpu_cores_default_timers"] = idle["idle_cpu_cores"]
                out["failover_default_timers_s"] = _failover(g2)
            finally:
                g2.shutdown(delete_data=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if started:
            ray.shutdown()
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out


def _floor(quick: bool, out: dict, clients: int, batch: int, members: int, threads: int,
           body: int, actors: str) -> dict:  # fmt: skip
    """The floor's figures under the group's loads, and the ratios; a floor that fails is
    reported (``floor_error``), never at the cost of the group's figures."""
    from .floor import FloorSizes, over_floor, run_floor

    singles, rounds = _phase_sizes(quick)
    sizes = FloorSizes(singles, threads, out["load_seconds"], clients, rounds, batch, body,
                       followers=members - 1, actors=actors)  # fmt: skip
    try:
        figures = run_floor(sizes)
    except Exception as exc:  # a benchmark's failure is a result
        figures = {"floor_error": repr(exc)}
    return {**figures, **over_floor({**out, **figures})}
