"""InstallReceiver: a follower's side of snapshot install.

When a follower needs entries below the leader's begin index (it was away while the
group compacted its logs, or it joins with an empty disk), or its state machine stands
below its own log's begin (the snapshot that bridged the gap was found damaged), the
leader's dispatcher sends its newest snapshot in INSTALL chunks (see
:class:`~.dispatcher.EntryDispatcher`).  This object decides what the follower does with each chunk; the handler has already fenced it
by term and leader like every push:

* a chunk of another transfer (another leader term, snapshot index or snapshot term)
  starts over only at offset 0; otherwise the answer is "I hold 0 bytes of that", and the
  leader restarts from the beginning -- an interrupted transfer never resumes into a
  directory filled by another one;
* a chunk at the offset received so far is written; any other offset (a duplicate, one
  overtaken by a resend) is answered with the offset held, where the leader resumes;
* the last byte seals it: the files must match the leader's sizes and checksums
  (CORRUPT_SNAPSHOT otherwise, and the transfer starts over), then it is renamed into
  place atomically and listed in :attr:`sealed` for the member to load into its machine.

The bytes go to a sink (:class:`~rayledger.storage.snapshots.SnapshotStore`), the
member's snapshot directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from rayledger.storage.errors import LedgerError, ResponseCode

from .messages import PushEntryRequest

log = logging.getLogger("rayledger.replication")


class SnapshotSink(Protocol):
    def begin_install(self, index: int, term: int, files) -> str: ...

    def write_at(self, tmp: str, files, offset: int, data: bytes) -> None: ...

    def commit(self, tmp: str, index: int, term: int, expect: tuple | None = None) -> Any: ...

    def abort(self, tmp: str) -> None: ...


@dataclass(frozen=True, slots=True)
class InstallDone:
    """A snapshot installed: its index and term, its bytes, and the milliseconds from its
    first chunk to its seal."""

    index: int
    term: int
    nbytes: int
    ms: int


class InstallReceiver:
    """One follower's snapshot transfer in progress (at most one at a time)."""

    def __init__(self, member: str, sink: SnapshotSink):
        self.member = member
        self.sink = sink
        self._key: tuple[int, int, int] | None = None  # (leader term, index, snapshot term)
        self._tmp: str | None = None
        self.received = 0
        self._done: tuple[int, int, int] | None = None  # the last transfer sealed
        self.sealed: list[Any] = []  # SnapshotMeta sealed and not yet taken by the member
        self._started_ms = 0
        self.last: InstallDone | None = None  # the last transfer sealed, for operators

    def take(self, req: PushEntryRequest, now_ms: int = 0) -> tuple[ResponseCode, int]:
        """One INSTALL chunk (fenced already) at ``now_ms``; returns the answer's code and
        the stream offset held now."""
        c = req.snapshot
        key = (req.term, c.index, c.term)
        if key == self._done:
            return ResponseCode.SUCCESS, c.total  # a late copy of a chunk of a sealed one
        if key != self._key:
            if c.offset != 0:
                return ResponseCode.SUCCESS, 0  # another transfer's chunk: start over
            self._drop()
            try:
                self._tmp = self.sink.begin_install(c.index, c.term, c.files)
            except LedgerError as exc:
                return exc.code, 0
            self._key, self.received, self._started_ms = key, 0, now_ms
            log.info("[%s] term=%d index=%d installing snapshot (term %d, %d bytes) from %s",
                     self.member, req.term, c.index, c.term, c.total, req.leader_id)  # fmt: skip
        if c.offset != self.received or c.offset + c.length > c.total:
            return ResponseCode.SUCCESS, self.received
        data = req.batch
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) != c.length:
            return ResponseCode.UNEXPECTED_ARGUMENT, self.received
        try:
            if c.length:
                self.sink.write_at(self._tmp, c.files, c.offset, data)
            self.received += c.length
            if self.received < c.total:
                return ResponseCode.SUCCESS, self.received
            meta = self.sink.commit(self._tmp, c.index, c.term, expect=c.files)
        except LedgerError as exc:
            log.error("[%s] term=%d index=%d snapshot install failed: %s",
                      self.member, req.term, c.index, exc)  # fmt: skip
            self._drop()
            return exc.code, 0
        self._tmp, self._key, self._done = None, None, key
        self.sealed.append(meta)
        self.last = InstallDone(c.index, c.term, c.total, now_ms - self._started_ms)
        log.info("[%s] term=%d index=%d snapshot installed (%d bytes)",
                 self.member, req.term, c.index, c.total)  # fmt: skip
        return ResponseCode.SUCCESS, c.total

    def _drop(self) -> None:
        if self._tmp is not None:
            self.sink.abort(self._tmp)
        self._tmp, self._key, self.received = None, None, 0

    def take_sealed(self) -> list[Any]:
        out, self.sealed = self.sealed, []
        return out
