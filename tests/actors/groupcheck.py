"""Checks shared by the Ray end-to-end tests: committed logs agree and hold every ack,
every append's outcome is recorded, and nothing is stored twice or out of nowhere."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import ray
from rayledger.actors import LedgerClient, LedgerConfig, LedgerGroup
from rayledger.storage import LedgerError, OutcomeUnknownError

# Short timers, with room for a loaded 2-core machine (a follower waits 4 x 150 ms).
TEST_CONFIG = LedgerConfig.fast(heartbeat_interval_ms=150, max_heartbeat_leak=4)

T = TypeVar("T")


def wait_until(
    cond: Callable[[], T], timeout_s: float, what: str | Callable[[], str], every_s: float = 0.05
) -> T:
    """Poll ``cond`` until it returns something true (returned) or fail naming ``what``
    (a callable is asked at the time of failure, to show the state then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)


def committed_log(group: LedgerGroup, member: str) -> list[tuple[int, int, bytes]]:
    """A member's committed log, waiting while Ray restarts it (a kill is still settling)."""
    h = group.handle(member)

    def read() -> tuple | None:
        try:
            return (ray.get(h.read_batch.remote(0, 1 << 40, True), timeout=30),)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            return None

    (batch,) = wait_until(read, 60, f"{member} to answer a read", every_s=0.2)
    return [] if batch is None else [(e.index, e.term, e.body) for e in batch.entries()]


def append_acked(client: LedgerClient, body: bytes, timeout_s: float = 60.0, tries: int = 5):
    """Append after a fault, where an outcome may be unknown (a leader change mid-call):
    retry with a new body each time (``body`` + ``#k``), so a retry is never mistaken for a
    duplicate.  Returns (result, body) of the first acked one."""
    for k in range(tries):
        attempt = body if k == 0 else b"%s#%d" % (body, k)
        try:
            return client.append(attempt, timeout_s=timeout_s), attempt
        except OutcomeUnknownError:
            continue
    raise AssertionError(f"{tries} appends of {body!r} all ended with unknown outcomes")


def helper_pids(group: LedgerGroup, member: str, timeout_s: float = 60.0) -> dict[str, int]:
    """Process ids of a member's checker and dispatchers, once every one answers (a helper
    that is starting or restarting reports None)."""

    def ask() -> dict[str, int] | None:
        try:
            pids = ray.get(group.handle(member).helper_pids.remote(), timeout=10)
        except ray.exceptions.RayError:
            return None
        return pids if pids and None not in pids.values() else None

    return wait_until(ask, timeout_s, f"the helpers of {member} to answer", every_s=0.2)


def assert_consistent(
    group: LedgerGroup, acked: dict[int, bytes], members=None, wait_s: float = 20.0
) -> dict[str, list[tuple[int, int, bytes]]]:
    """Every member's committed log agrees on its common prefix and holds every acked
    append at its index.  Returns the logs."""
    members = members or group.members
    logs: dict[str, list[tuple[int, int, bytes]]] = {}

    def all_hold_every_ack() -> bool:
        logs.update({m: committed_log(group, m) for m in members})
        return all(len(lg) > max(acked, default=-1) for lg in logs.values())

    t0 = time.monotonic()
    try:
        wait_until(all_hold_every_ack, wait_s, "every member to commit every ack", every_s=0.2)
    except AssertionError:
        pass  # the checks below name what is missing where
    print(f"every member held every ack after {time.monotonic() - t0:.1f}s")
    ref = max(logs.values(), key=len)
    for m, lg in logs.items():
        assert lg == ref[: len(lg)], f"{m} disagrees with the longest committed log"
        by_index = {i: body for i, _t, body in lg}
        for index, body in acked.items():
            assert index in by_index, (
                f"acknowledged entry {index} missing on {m}: it committed "
                f"{len(lg)} entries (the longest log has {len(ref)}); status {group.status(5)}"
                + (f", helpers {_helper_state(group)}")
            )
            assert by_index[index] == body, (
                f"acknowledged entry {index} changed on {m}: {by_index[index]!r} != {body!r}"
            )
    return logs


def _helper_state(group: LedgerGroup) -> dict[str, object]:
    """What each member says of its helpers and followers (for failure messages)."""
    out: dict[str, object] = {}
    for m in group.members:
        try:
            h = group.handle(m)
            out[m] = ray.get([h.helper_pids.remote(), h.peer_progress.remote()], timeout=5)
        except Exception as exc:  # a failure message must not fail
            out[m] = repr(exc)
    return out


def member_warnings(since: float, limit: int = 120) -> list[str]:
    """The rayledger warnings Ray's workers logged since ``since`` (time.time()), oldest
    first: printed when a chaos check fails, since CI keeps no Ray logs."""
    import datetime
    import glob

    try:
        logs_dir = ray._private.worker._global_node.get_logs_dir_path()
    except AttributeError:
        return []
    start = datetime.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
    lines = []
    for path in glob.glob(f"{logs_dir}/worker-*.err"):
        with open(path, errors="replace") as f:
            lines += [ln.rstrip() for ln in f if "rayledger" in ln and ln[:19] >= start]
    return sorted(lines)[-limit:]


@dataclass
class Outcomes:
    """Every append's outcome: acked (index -> body), unknown (OutcomeUnknownError: it may
    or may not have committed) or failed (any other LedgerError: nothing was stored).
    Thread-safe; one instance can be shared by many writers."""

    acked: dict[int, bytes] = field(default_factory=dict)
    ack_times: list[float] = field(default_factory=list)
    unknown: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    conflicts: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # index acked twice
    last_unknown: str = ""  # why the last unknown outcome was unknown
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def append(self, client: LedgerClient, body: bytes, timeout_s: float = 20.0) -> int | None:
        """Append ``body`` and record its outcome; the index when acked, else None."""
        try:
            r = client.append(body, timeout_s=timeout_s)
        except OutcomeUnknownError as exc:
            with self._lock:
                self.unknown.append(body)
                self.last_unknown = f"{exc}"[:200]
            return None
        except LedgerError as exc:
            with self._lock:
                self.failed.append((body, f"{exc.code.name}: {exc}"[:200]))
            return None
        with self._lock:
            old = self.acked.setdefault(r.index, body)
            if old != body:
                self.conflicts.append((r.index, old, body))
            self.ack_times.append(time.monotonic())
        return r.index

    def acks_since(self, t: float) -> int:
        with self._lock:
            return sum(x > t for x in self.ack_times)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "acked": len(self.acked),
                "unknown": len(self.unknown),
                "failed": len(self.failed),
            }

    def __str__(self) -> str:
        return (
            f"{self.counts()} last failures {self.failed[-3:]} last unknown {self.last_unknown!r}"
        )


class Writer(threading.Thread):
    """Appends ``<prefix>-<n>`` bodies until stopped, recording every outcome in ``out``."""

    def __init__(self, client: LedgerClient, prefix: str, out: Outcomes, timeout_s: float = 10.0):
        super().__init__(daemon=True, name=f"writer-{prefix}")
        self.client, self.prefix, self.out, self.timeout_s = client, prefix, out, timeout_s
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"{self.prefix}-{i}".encode()
            i += 1
            if self.out.append(self.client, body, self.timeout_s) is None:
                time.sleep(0.01)  # no busy loop while there is no leader


def stop_writers(writers: list[Writer], timeout_s: float = 60.0) -> None:
    for w in writers:
        w.stop.set()
    for w in writers:
        w.join(timeout_s)
        assert not w.is_alive(), f"{w.name} did not stop within {timeout_s}s"


def check_history(
    group: LedgerGroup,
    out: Outcomes,
    client: LedgerClient | None = None,
    members=None,
    wait_s: float = 60.0,
) -> list[bytes]:
    """The checks of a run with failures, after the group healed:

    - every acked append is on every member at its index, and the logs agree;
    - no index was acked for two bodies, and no body is committed twice (a retried append);
    - every non-empty committed body was acked or unknown (no phantoms); a body whose
      append definitely failed is never committed;
    - linearizable reads (``client.get`` / ``client.read``) return every acked body.

    Returns the committed bodies (empty ones, a term's first entry, left out)."""
    assert not out.conflicts, f"one index acked for two bodies: {out.conflicts[:5]}"
    logs = assert_consistent(group, out.acked, members, wait_s=wait_s)
    log = max(logs.values(), key=len)
    bodies = [b for _i, _t, b in log if b]
    twice = [b for b, n in Counter(bodies).items() if n > 1]
    assert not twice, f"{len(twice)} bodies committed more than once, e.g. {twice[:5]}"
    failed = {b for b, _code in out.failed}
    committed_failed = failed.intersection(bodies)
    assert not committed_failed, (
        f"appends that failed definitely were committed: {sorted(committed_failed)[:5]}"
    )
    known = set(out.acked.values()) | set(out.unknown)
    phantoms = [b for b in bodies if b not in known]
    assert not phantoms, f"committed bodies nobody appended: {phantoms[:5]}"
    if client is not None and out.acked:
        lo, hi = min(out.acked), max(out.acked)
        got: dict[int, bytes] = {}
        for start in range(lo, hi + 1, 2000):
            got.update({e.index: e.body for e in client.read(start, min(start + 2000, hi + 1))})
        for index, body in out.acked.items():
            assert got.get(index) == body, f"a linearizable read of {index} missed its ack"
        for index in sorted(out.acked)[:: max(1, len(out.acked) // 20)] + [hi]:
            assert client.get(index).body == out.acked[index], (
                f"a linearizable get({index}) missed its ack"
            )
    return bodies
