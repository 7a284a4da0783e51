"""Prometheus metrics of a group's actors, through ``ray.util.metrics``.

Ray's metrics agent on each node exports them (``ray start --metrics-export-port``)
and the Ray dashboard shows them; Prometheus sees each name with the ``ray_``
prefix Ray adds.  Every metric carries ``group`` and ``member`` tags (``peer`` for
per-follower figures, ``consistency`` for reads).

Cost on the append path: the actors call these recorders once per round (a
group-commit batch) or per push, never per entry; gauges are sampled by the
member's maintain loop at most once per :data:`SAMPLE_S`.  A recorder is a few
dict look-ups and one call into Ray's metric (a few microseconds).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Hashable
from typing import Any

log = logging.getLogger("rayledger.actors")

#: Seconds between two samples of the gauges (role, term, indexes, pending appends).
SAMPLE_S = 1.0
#: Seconds between two walks of the data directory (disk bytes used).
DISK_SAMPLE_S = 10.0
#: Histogram buckets in milliseconds, from a fast local round to a slow disk.
LATENCY_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
ROLE_VALUE = {"FOLLOWER": 0, "CANDIDATE": 1, "LEADER": 2}

_METRICS: dict[str, Any] = {}

#: name -> (kind, description, extra tag keys); every metric also has group and member.
SPEC: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rayledger_role": ("gauge", "0 follower, 1 candidate, 2 leader", ()),
    "rayledger_term": ("gauge", "current term", ()),
    "rayledger_ledger_end_index": ("gauge", "index of the last entry in the log", ()),
    "rayledger_committed_index": ("gauge", "highest index known committed", ()),
    "rayledger_pending_appends": ("gauge", "append calls waiting for their quorum", ()),
    "rayledger_disk_bytes": ("gauge", "bytes of the member's data directory", ()),
    "rayledger_append_latency_ms": ("histogram", "leader: round written to quorum ack", ()),
    "rayledger_appended_entries": ("counter", "entries committed through this leader", ()),
    "rayledger_appended_bytes": (
        "counter",
        "entry bytes (headers included) committed through this leader",
        (),
    ),
    "rayledger_flush_latency_ms": ("histogram", "one fsync pass of the file store", ()),
    "rayledger_elections_started": ("counter", "times this member became a candidate", ()),
    "rayledger_elections_won": ("counter", "times this member became leader", ()),
    "rayledger_leader_changes": ("counter", "times the leader this member follows changed", ()),
    "rayledger_reads": ("counter", "read calls served", ("consistency",)),
    "rayledger_members_lost": (
        "gauge",
        "leader: members whose node Ray reports dead, not yet replaced",
        (),
    ),
    "rayledger_peer_push_latency_ms": ("histogram", "leader: push sent to answer", ("peer",)),
    "rayledger_peer_water_mark": ("gauge", "leader: highest index the peer matches", ("peer",)),
    "rayledger_peer_lag": ("gauge", "leader: its end index minus the peer's water mark", ("peer",)),
}


def metric(name: str):
    """The process's one metric object for ``name`` (created on first use)."""
    m = _METRICS.get(name)
    if m is None:
        from ray.util import metrics as rm

        kind, desc, extra = SPEC[name]
        keys = ("group", "member", *extra)
        if kind == "gauge":
            m = rm.Gauge(name, desc, tag_keys=keys)
        elif kind == "counter":
            m = rm.Counter(name, desc, tag_keys=keys)
        else:
            m = rm.Histogram(name, desc, boundaries=LATENCY_MS, tag_keys=keys)
        _METRICS[name] = m
    return m


def _dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass  # removed by cleanup meanwhile
    return total


class MemberMetrics:
    """Recorders of one member (leader and follower figures)."""

    def __init__(self, group: str, member: str, store: Any = None, data_dir: str | None = None):
        self.tags = {"group": group, "member": member}
        self.data_dir = data_dir
        self._rounds: dict[int, tuple[float, int, int]] = {}
        self._next_sample = 0.0
        self._next_disk = 0.0
        self._disk_bytes = 0
        self._role: str | None = None
        self._term = -1
        self._leader: str | None = None
        self._read_tags: dict[str, dict[str, str]] = {}
        if store is not None and hasattr(store, "_flush_once"):
            self._time_flushes(store)

    def _time_flushes(self, store: Any) -> None:
        """Wrap the store's fsync pass (it runs on the store's flush thread)."""
        flush_once = store._flush_once
        hist = metric("rayledger_flush_latency_ms")
        tags = self.tags

        def timed() -> None:
            t0 = time.perf_counter()
            try:
                flush_once()
            finally:
                hist.observe((time.perf_counter() - t0) * 1000, tags)

        store._flush_once = timed

    # -- sampled from the maintain loop -------------------------------------------------------
    def tick(self, state: Any, store: Any, pending: int) -> None:
        """Count role and leader changes every tick; set the gauges once per SAMPLE_S."""
        role = state.role.value if state.role is not None else None
        term = state.current_term
        if role != self._role or term != self._term:
            if role == "CANDIDATE" and (self._role != "CANDIDATE" or term != self._term):
                metric("rayledger_elections_started").inc(1, self.tags)
            if role == "LEADER" and (self._role != "LEADER" or term != self._term):
                metric("rayledger_elections_won").inc(1, self.tags)
            self._role, self._term = role, term
        if state.leader_id is not None and state.leader_id != self._leader:
            if self._leader is not None:
                metric("rayledger_leader_changes").inc(1, self.tags)
            self._leader = state.leader_id
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_S
        metric("rayledger_role").set(ROLE_VALUE.get(role or "", -1), self.tags)
        metric("rayledger_term").set(int(term), self.tags)
        metric("rayledger_ledger_end_index").set(int(store.ledger_end_index), self.tags)
        metric("rayledger_committed_index").set(int(store.committed_index), self.tags)
        metric("rayledger_pending_appends").set(int(pending), self.tags)
        if self.data_dir:
            if now >= self._next_disk:  # walking the directory is the costly part
                self._next_disk = now + DISK_SAMPLE_S
                self._disk_bytes = _dir_bytes(self.data_dir)
            metric("rayledger_disk_bytes").set(self._disk_bytes, self.tags)

    # -- the leader's append path (once per round) ----------------------------------------------
    def round_started(self, rid: int, entries: int, nbytes: int) -> None:
        self._rounds[rid] = (time.perf_counter(), entries, nbytes)

    def round_done(self, rid: int, ok: bool) -> None:
        started = self._rounds.pop(rid, None)
        if started is None or not ok:
            return
        t0, entries, nbytes = started
        metric("rayledger_append_latency_ms").observe((time.perf_counter() - t0) * 1000, self.tags)
        metric("rayledger_appended_entries").inc(int(entries), self.tags)
        metric("rayledger_appended_bytes").inc(int(nbytes), self.tags)

    def members_lost(self, n: int) -> None:
        metric("rayledger_members_lost").set(int(n), self.tags)

    def read(self, consistency: str) -> None:
        tags = self._read_tags.get(consistency)
        if tags is None:
            tags = self._read_tags[consistency] = {**self.tags, "consistency": consistency}
        metric("rayledger_reads").inc(1, tags)


class PeerMetrics:
    """Recorders of one leader-to-follower dispatcher: push latency, water mark and lag."""

    def __init__(self, group: str, member: str, peer: str):
        self.tags = {"group": group, "member": member, "peer": peer}
        self._sent: dict[Hashable, float] = {}
        self._next_sample = 0.0

    def answered(self, t0: float, resp: Any, logic: Any) -> None:
        """A push sent at ``t0`` (``time.perf_counter()``) came back (``None``: lost)."""
        now = time.perf_counter()
        if resp is not None:
            metric("rayledger_peer_push_latency_ms").observe((now - t0) * 1000, self.tags)
        if now >= self._next_sample:  # the gauges at most every SAMPLE_S / 2
            self._next_sample = now + SAMPLE_S / 2
            wm, end = int(logic.water_mark), int(logic.view.ledger_end_index)
            metric("rayledger_peer_water_mark").set(wm, self.tags)
            metric("rayledger_peer_lag").set(max(0, end - wm), self.tags)

    def sent_first(self, wire: list) -> None:
        """A compiled-graph round went out; its first push's key times it (see :meth:`acked`)."""
        if wire:
            if len(self._sent) > 1024:  # answers lost with an old graph
                self._sent.clear()
            self._sent[wire[0][0]] = time.perf_counter()

    def acked(self, key: Hashable, logic: Any) -> None:
        if self._sent:
            t0 = self._sent.pop(key, None)
            if t0 is not None:
                self.answered(t0, True, logic)
