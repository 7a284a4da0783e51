"""Push messages between a leader's dispatcher and a follower's entry handler, and what a
leader tells its helpers (:class:`LeaderInfo` when they start, an :class:`Announcement`
per round).

Plain dataclasses (DLedger's ``PushEntryRequest`` / ``PushEntryResponse``); the Ray
shells carry the ones of every round as msgpack tuples (``actors/wire.py``).  An APPEND
carries its entries as an :class:`~rayledger.storage.EntryBatch` (the encoded data-file
bytes, with the leader's CRC of them), never as Python objects per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from rayledger.storage.codec import EntryBatch, crc32
from rayledger.storage.errors import ResponseCode


class PushType(str, Enum):
    APPEND = "APPEND"
    COMMIT = "COMMIT"
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"
    INSTALL = "INSTALL"


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Bytes ``[offset, offset + length)`` of the leader's snapshot at ``index`` (of
    ``term``): its ``files`` (name, size, sha256) as one stream of ``total`` bytes."""

    index: int
    term: int
    files: tuple
    offset: int
    length: int

    @property
    def total(self) -> int:
        return sum(f[1] for f in self.files)

    @property
    def last(self) -> bool:
        return self.offset + self.length >= self.total


@dataclass(frozen=True)
class PushEntryRequest:
    """One push from ``leader_id`` (leading ``term``) to ``remote_id``.

    Frozen: a push is shared by the dispatcher (which matches answers to what it sent)
    and the shell; a changed copy is made with :func:`dataclasses.replace`.

    * APPEND: ``batch`` holds entries ``first_index .. first_index + count - 1``.
      The Ray shell may send a copy with ``batch`` swapped for a stand-in with the same
      ``first_index``/``count``/``last_index`` whose bytes live in the object store.
    * COMPARE: does the follower hold the leader's entry (``entry_term``,
      ``entry_pos``) at ``first_index``?
    * TRUNCATE: make the follower's log end at ``first_index`` (where it holds the
      leader's entry); with ``reset`` the follower's log does not overlap the
      leader's, and restarts empty at the leader's begin ``first_index`` /
      ``entry_pos``.
    * COMMIT: ``commit_index``; when ``first_index`` >= 0 also an entry (``entry_term``,
      ``entry_pos``) the follower is known to hold, which it checks before following.
    * INSTALL: one chunk of the leader's snapshot (``snapshot``; ``first_index`` is its
      index); ``batch`` holds the chunk's bytes, which the transport reads from the
      leader's snapshot (the core never holds them).  The follower answers with the
      stream offset it has received up to in ``index`` (all of it once sealed).

    Every type carries the leader's ``commit_index``.
    """

    group: str
    leader_id: str
    remote_id: str
    term: int
    type: PushType
    first_index: int = -1
    count: int = 0
    batch: Any = None
    entry_term: int = -1
    entry_pos: int = -1
    commit_index: int = -1
    batch_bytes: int = 0
    reset: bool = False
    snapshot: SnapshotChunk | None = None
    # a reset's: the leader's configuration in effect just below its begin
    config: bytes | None = None

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


@dataclass
class PushEntryResponse:
    """The follower's answer; ``term`` is the follower's current term.

    ``index`` is the last index an APPEND covered, the index a COMPARE/TRUNCATE
    was about, or the follower's committed index after a COMMIT; ``begin_index``
    and ``end_index`` describe the follower's log after handling the push.

    A COMPARE answered INCONSISTENT_STATE carries a conflict hint (etcd's rejectHint,
    DLedger's HEAD): ``conflict_term`` is the term the follower holds at the probed
    index (at its log end when shorter) and ``conflict_index`` the first index of that
    term in its log, so the leader skips a whole term per round trip instead of one
    index; both -1 when there is no hint (an empty log, an older follower).

    ``snapshot_wanted`` >= 0: the follower needs a snapshot at or past that index, which the
    leader then sends though the logs match -- its state machine stands below its log's
    begin (the snapshot that bridged the gap was lost), or its client-session table lacks
    the sessions below that begin (that snapshot's table was damaged); -1: none needed.
    """

    group: str
    remote_id: str
    term: int
    code: ResponseCode
    index: int = -1
    begin_index: int = -1
    end_index: int = -1
    count: int = 0
    conflict_term: int = -1
    conflict_index: int = -1
    snapshot_wanted: int = -1


# -- what a leader tells its helpers -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inline:
    """A round's bytes carried inside the call."""

    batch: EntryBatch


@dataclass(frozen=True, slots=True)
class Ref:
    """A round's bytes in the object store (too large to ride inside a call): ``ref`` is
    the transport's handle, resolved once, as the receiving actor's argument."""

    ref: Any


Payload = Inline | Ref
"""How a round's bytes travel: the one type from the leader's announcement through the
dispatcher's cache to the push (the cores never look inside a :class:`Ref`)."""


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The leader's log as its helpers start from it (all of one term)."""

    term: int
    begin: int
    end: int
    end_term: int
    end_pos: int
    committed: int
    # how far the leader counts its own copy toward a quorum: ``end``, or with sync_flush
    # its flushed end (a restarted checker must not count an unflushed copy)
    water_mark: int
    # the configurations in its log (``ConfigLog.frozen``): the checker counts the latest's
    # voters, a dispatcher resetting a follower sends the one in effect below the begin
    configs: tuple = ()


@dataclass(frozen=True, slots=True)
class Announcement:
    """What a leader tells its dispatchers about a round; ``payload`` carries its bytes."""

    term: int
    first: int
    count: int
    payload: Payload
    nbytes: int
    edges: tuple[int, int]  # positions of the first and the last entry
    committed: int
    # the leader's configurations (ConfigLog.frozen) when the round holds a configuration
    # entry: its dispatchers learn of a learner promoted (or added) with the round itself
    configs: tuple = ()

    def followed_by(self, b: Announcement) -> Announcement:
        """This round and the next one as one (their entries are contiguous); both carry
        their bytes :class:`Inline`."""
        pa, pb = self.payload.batch, b.payload.batch
        return Announcement(
            term=self.term,
            first=self.first,
            count=self.count + b.count,
            payload=Inline(
                EntryBatch(
                    pa.first_index, pa.count + pb.count, pa.data + pb.data, _joined_crc(pa, pb)
                )
            ),
            nbytes=self.nbytes + b.nbytes,
            edges=(self.edges[0], b.edges[1]),
            committed=max(self.committed, b.committed),
            configs=b.configs or self.configs,
        )


def _joined_crc(a: EntryBatch, b: EntryBatch) -> int | None:
    """The CRC of ``a.data + b.data`` (CRC-32 continues over the second part), when both
    are known."""
    if a.crc is None or b.crc is None:
        return None
    return crc32(b.data, a.crc & 0xFFFF_FFFF)


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """The transport's loop turn ended: a helper's core answers with what it has to do
    since the last one, its Ready.  Asked for with ``step`` like every event, once per
    loop turn however many events came in it, so a burst of calls makes one Ready."""


TURN_END = TurnEnd()


@dataclass(frozen=True, slots=True)
class GraphBegin:
    """What the leader's compiled path tells each helper core: graph ``gen`` of ``term``
    starts; answers whether the helper serves that term."""

    term: int
    gen: int


@dataclass(frozen=True, slots=True)
class GraphEnd:
    """The leader left graph ``gen``: what went into it may be lost."""

    gen: int


@dataclass(frozen=True, slots=True)
class Push:
    """A push from a leader's dispatcher, for the follower's :class:`~.handler.EntryHandler`
    (and its member's core); ``token`` names the call its answer goes to."""

    req: PushEntryRequest
    token: Any
    graph: bool = False  # it came through the leader's compiled graph
