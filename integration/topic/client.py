"""TopicClient: appends routed over a topic's partitions, reads per partition and merged.

Per-key order is the guarantee (as Kafka's): a key's appends go to one partition, whose log
orders them; appends of different partitions have no order between them.  A batch is split
by partition and its parts are sent in parallel, each part one append of its partition
(atomic there, exactly-once through that group's idempotent session); the batch as a whole
is not atomic: when a part fails, the others may have committed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import ray
from rayledger.actors import Entry, LedgerClient, LedgerError, ResponseCode
from rayledger.actors.naming import NAMESPACE

from . import layout as lay
from .layout import TopicLayout
from .routing import Key, Router, partition_of

_BYTES = (bytes, bytearray, memoryview)


class TopicAppendResult(NamedTuple):
    """Where an append landed: its partition, and its index, term and position there."""

    partition: int
    index: int
    term: int
    pos: int


class TopicEntry(NamedTuple):
    """A committed entry of a partition."""

    partition: int
    entry: Entry


class TopicClient:
    """A client of every partition of a topic (thread-safe: one per process is enough).
    ``idempotent``: each partition's client is idempotent (exactly-once per partition)."""

    def __init__(self, layout: TopicLayout, timeout_s: float = 30.0, idempotent: bool = True):
        self.layout = layout
        self.timeout_s = timeout_s
        self.idempotent = idempotent
        self.router = Router(layout.partitions)
        self._clients: dict[int, LedgerClient] = {}
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, name: str, timeout_s: float = 30.0, idempotent: bool = True) -> TopicClient:
        """A client of topic ``name`` from any driver or Ray job (UNKNOWN_GROUP when none)."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        return cls(lay.require(name), timeout_s=timeout_s, idempotent=idempotent)

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def partitions(self) -> int:
        return self.layout.partitions

    def partition_for(self, key: str | bytes) -> int:
        """The partition a keyed append goes to (see :func:`~.routing.partition_of`)."""
        return partition_of(key, self.partitions)

    def client(self, partition: int) -> LedgerClient:
        """The client of partition ``partition``'s group (UNEXPECTED_ARGUMENT out of range)."""
        group = self.layout.group(partition)
        with self._lock:
            c = self._clients.get(partition)
            if c is None:
                c = LedgerClient.connect(group, self.timeout_s, self.idempotent)
                self._clients[partition] = c
            return c

    # -- appends -------------------------------------------------------------------------------
    def append(self, body: bytes, key: Key = None) -> TopicAppendResult:
        """Append one entry: to ``key``'s partition, or round robin without a key."""
        if not isinstance(body, _BYTES):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"body must be bytes, not {type(body).__name__}"
            )
        p = self.router.one(key)
        r = self.client(p).append(body)
        return TopicAppendResult(p, r.index, r.term, r.pos)

    def append_batch(
        self, bodies: Sequence[bytes], keys: Key | Sequence[Key] = None
    ) -> list[TopicAppendResult]:
        """Append a batch split by partition, its parts in parallel; the results in the
        batch's order.  ``keys``: None (the whole batch to the next partition in turn), one
        key for every entry, or one key (or None: round robin) per entry.  The first part that fails raises (the others may have
        committed: a batch is atomic per partition)."""
        if isinstance(bodies, _BYTES) or not isinstance(bodies, Sequence):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"bodies must be a sequence of bytes, not {type(bodies).__name__}",
            )
        if not bodies:
            raise LedgerError.of(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
        parts = self.router.split(len(bodies), keys)
        futures = [
            (p, at, self.client(p).append_future([bodies[k] for k in at]))
            for p, at in enumerate(parts)
            if at
        ]
        out: list[TopicAppendResult | None] = [None] * len(bodies)
        first_error: BaseException | None = None
        for p, at, fut in futures:  # every part is waited for, so none is left unseen
            try:
                results = fut.result()
            except BaseException as exc:  # noqa: BLE001 -- re-raised below
                first_error = first_error or exc
                continue
            for k, r in zip(at, results, strict=True):
                out[k] = TopicAppendResult(p, r.index, r.term, r.pos)
        if first_error is not None:
            raise first_error
        return out  # type: ignore[return-value]

    # -- reads ---------------------------------------------------------------------------------
    def get(self, partition: int, index: int, consistency: str = "linearizable") -> Entry:
        return self.client(partition).get(index, consistency=consistency)

    def read(
        self, partition: int, start: int, stop: int, consistency: str = "linearizable"
    ) -> list[Entry]:
        return self.client(partition).read(start, stop, consistency=consistency)

    def committed_index(self, partition: int, consistency: str = "linearizable") -> int:
        return self.client(partition).committed_index(consistency=consistency)

    def tail(
        self,
        partitions: Sequence[int] | None = None,
        start: int | dict[int, int] = 0,
        follow: bool = False,
        poll_s: float = 0.2,
        max_entries: int | None = None,
        chunk: int = 1000,
    ) -> Iterator[TopicEntry]:
        """Committed entries of ``partitions`` (every one by default) merged as they come:
        each partition's in its log order, partitions taken in turn.  ``start``: the first
        index of every partition, or one per partition; ``follow``: wait for new ones (until
        the caller stops iterating)."""
        ps = list(range(self.partitions)) if partitions is None else list(partitions)
        for p in ps:
            self.layout.group(p)  # out of range: UNEXPECTED_ARGUMENT now
        nxt = {p: (start.get(p, 0) if isinstance(start, dict) else start) for p in ps}
        if any(type(i) is not int or i < 0 for i in nxt.values()):
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"start must be >= 0: {start!r}")
        sent = 0
        while max_entries is None or sent < max_entries:
            got = 0
            for p in ps:
                committed = self.committed_index(p)
                if nxt[p] > committed:
                    continue
                stop = min(committed + 1, nxt[p] + chunk)
                if max_entries is not None:
                    stop = min(stop, nxt[p] + max_entries - sent)
                for e in self.read(p, nxt[p], stop):
                    yield TopicEntry(p, e)
                    nxt[p] = e.index + 1
                    got += 1
                    sent += 1
                if max_entries is not None and sent >= max_entries:
                    return
            if not got:
                if not follow:
                    return
                time.sleep(poll_s)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
