"""The log store (DLedgerStore): one implementation over file or memory segments.

``FileStore`` (DLedgerMmapFileStore) keeps segments on disk with a checkpoint,
a flush service and crash recovery; ``MemoryStore`` (DLedgerMemoryStore) keeps
the same bytes in memory.  Both lay entries out identically, so positions agree
across members whatever store they use, and every behaviour not about
durability is the same code.

Indexes start at 0.  An empty log has ``ledger_end_index == ledger_begin_index - 1``
(a fresh one: begin 0, end -1), and ``committed_index`` is -1 until something
commits.  The store is driven by one thread at a time (the member's actor);
the flush service is the only other thread and takes the same lock.

Every refused call raises :class:`LedgerError` with a DLedger response code and
leaves the store exactly as it was.
"""

from __future__ import annotations

import logging
import operator
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .codec import (
    ENTRY_MAGIC,
    HEADER,
    HEADER_DTYPE,
    HEADER_SIZE,
    INDEX,
    INDEX_UNIT,
    Entry,
    EntryBatch,
    IndexUnit,
    _signed,
    body_skip,
    chain_crc,
    chain_crcs,
    crc32,
    decode_index,
    encode_entries,
    encode_index,
    logical_channel,
    session_ids,
    session_rows,
)
from .config import StoreConfig
from .errors import LedgerError, ResponseCode
from .segments import SegmentList

log = logging.getLogger("rayledger.storage")

AppendHook = Callable[[int, int, bytearray], None]
"""``hook(index, pos, body)``: may rewrite bytes of ``body`` in place (not its length)."""

_BYTES_TYPES = frozenset({bytes, bytearray, memoryview})
_I32 = struct.Struct(">i")
_VECTOR_MIN = 32  # follower batches this long are checked vectorised, shorter ones entry by entry


@dataclass(slots=True, frozen=True)
class Appended:
    """Where a leader's batch landed: entry ``first_index + k`` is at ``positions[k]``."""

    first_index: int
    term: int
    positions: list[int]
    data: bytes = b""  # the batch as encoded on disk, ready to push to followers
    crc: int | None = None  # of ``data`` (see EntryBatch.crc)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.positions) - 1

    def batch(self) -> EntryBatch:
        return EntryBatch(self.first_index, len(self.positions), self.data, self.crc)


def _err(code: ResponseCode, msg: str) -> LedgerError:
    return LedgerError.of(code, msg)


def _as_int(value, what: str) -> int:
    """``value`` as a plain int (numpy integers accepted; bools, floats, None refused)."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _err(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"{what} must be an int, not {type(value).__name__} ({value!r})",
        )
    return operator.index(value)


def _runs(
    positions: Sequence[int], sizes: Sequence[int], seg_size: int
) -> list[tuple[int, int, int]]:
    """Split consecutive items into contiguous runs inside one segment.

    Returns ``(first item, end item (exclusive), byte length)`` per run: a run
    breaks where the next item is not right after the previous one (a segment
    roll with padding) or starts a new segment (the previous one filled it).
    """
    n = len(positions)
    first, last_end = positions[0], positions[-1] + sizes[-1]
    if first // seg_size == (last_end - 1) // seg_size and last_end - first == sum(sizes):
        return [(0, n, last_end - first)]
    runs = []
    run_start = 0
    expect = first
    run_bytes = 0
    for k in range(n):
        p = positions[k]
        if k and (p != expect or p % seg_size == 0):
            runs.append((run_start, k, run_bytes))
            run_start, run_bytes = k, 0
        expect = p + sizes[k]
        run_bytes += sizes[k]
    runs.append((run_start, n, run_bytes))
    return runs


class ChannelWatcher(Protocol):
    """Follows the entries of one channel in a log (see :meth:`LogStore.watch_channel`)."""

    def appended(self, index: int, body: bytes) -> None: ...

    def truncated(self, end_index: int) -> None: ...

    def reset(self, begin_index: int) -> None: ...

    def compacted(self, begin_index: int) -> None: ...


class SessionWatcher(Protocol):
    """Follows the session prefixes of idempotent clients' entries (see
    :meth:`LogStore.watch_sessions`)."""

    def appended(self, indexes, records) -> None:
        """numpy ``indexes`` and ``SESSION_DTYPE`` records, or for a few entries lists of
        indexes and ``(client, seq, stamp, crc)`` tuples (``codec.session_rows``)."""

    def truncated(self, end_index: int) -> None: ...

    def reset(self, begin_index: int) -> None: ...

    def committed(self, index: int) -> None:
        """Entries up to ``index`` are committed: never truncated again."""


class LogStore:
    """Shared logic of the file and memory stores (use one of the subclasses)."""

    def __init__(self, config: StoreConfig, data: SegmentList, index: SegmentList):
        self.config = config
        self._data = data
        self._index = index
        self._lock = threading.RLock()
        self._hooks: list[AppendHook] = []
        self._watchers: dict[int, ChannelWatcher] = {}  # channel -> who follows its entries
        self._sessions: SessionWatcher | None = None  # who follows the client sessions
        # With sync_flush, an append normally waits for its fdatasync.  A caller that holds a
        # lock others need (the member actor) sets this and calls flush() itself, unlocked.
        self.defer_sync = False
        # the first index the cleaner must keep (None: no floor): what this member's state
        # machine needs to come back after a restart (see actors/core/snapshot_policy.py)
        self.keep_from: int | None = None
        self.ledger_begin_index = 0
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.committed_pos = 0
        self._chain: int | None = 0  # chain CRC of the last entry; None when unknown (after reset)
        self._base: tuple[int, int] = (
            0,
            0,
        )  # (index, pos) where the log began after its last reset
        # a floor for the term of the entry before the base (a reset's: the term of the
        # leader's entry there): an empty log's last term for votes.  -1 would let this
        # member vote for a candidate missing the committed entries it was reset past
        self._base_term = -1
        self._seq = 0  # bumps on every change of the log's bytes
        self._closed = False
        self._failed: LedgerError | None = None  # set when the disk failed under us (fsync)

    # -- metadata ---------------------------------------------------------------------
    @property
    def is_empty(self) -> bool:
        return self.ledger_end_index < self.ledger_begin_index

    @property
    def write_pos(self) -> int:
        return self._data.write_pos

    @property
    def durable_end_index(self) -> int:
        """The last entry this store may count as stored toward a quorum: with
        ``sync_flush`` only what is flushed (an unflushed copy may vanish in a power loss),
        otherwise what is written (asynchronous mode accepts that loss)."""
        return self.ledger_end_index

    def add_append_hook(self, hook: AppendHook) -> None:
        """Run ``hook(index, pos, body)`` on every entry a leader appends on channel 0 (the
        client entries, a term's empty first entry among them), before the CRCs are
        computed.  Entries on another channel -- a group's configuration entries
        -- are the group's own: no hook sees or rewrites them."""
        if not callable(hook):
            raise _err(ResponseCode.UNEXPECTED_ARGUMENT, "an append hook must be callable")
        self._hooks.append(hook)

    def watch_channel(self, channel: int, watcher: ChannelWatcher) -> None:
        """Tell ``watcher`` of every entry written on ``channel`` (leader or follower append,
        under the store's lock) and of every truncation and reset: how a member follows the
        configuration entries in its log."""
        self._watchers[channel] = watcher

    def watch_sessions(self, watcher: SessionWatcher) -> None:
        """Tell ``watcher`` of the session prefix of every idempotent client's entry written
        (leader or follower append, under the store's lock) and of every truncation and
        reset: how a member keeps its client sessions in step with its log."""
        self._sessions = watcher

    def session_records(self, start: int = 0):
        """``(indexes, records)`` per stretch of the log from ``start`` to the end: the
        session prefixes it holds (how a member finds its client sessions at a restart)."""
        start = max(start, self.ledger_begin_index)
        while start <= self.ledger_end_index:
            batch = self.read_batch(start, 16 << 20)
            heads = np.array(batch.headers(), dtype=np.int64).reshape(-1, 9)
            yield session_ids(batch.data, batch.first_index, heads[:, 5], heads[:, 1])
            start += batch.count

    def _tell_sessions(self, data, first: int, channels, sizes) -> None:
        few = len(channels) <= 16  # a single append's round: plain Python is quicker
        indexes, records = (session_rows if few else session_ids)(data, first, channels, sizes)
        if len(indexes):
            self._sessions.appended(indexes, records)

    def channel_entries(self, channel: int, start: int = 0):
        """``(index, body)`` of every entry on ``channel`` from ``start`` to the end (how a
        member finds the configuration entries its log holds at a restart)."""
        start = max(start, self.ledger_begin_index)
        while start <= self.ledger_end_index:
            batch = self.read_batch(start, 16 << 20)
            off, data = 0, batch.data
            for h in batch.headers():
                if h[5] == channel:
                    yield h[2], bytes(data[off + HEADER_SIZE : off + h[1]])
                off += h[1]
            start += batch.count

    def _tell_watchers(self, first: int, channels) -> None:
        """The entries on a watched channel, to their watchers (a batch's channels as a
        numpy array: only the entries on one are visited; a few entries' as a list, looked
        up one by one -- numpy's per-call cost outweighs its loop there)."""
        if type(channels) is list:
            hits = [k for k, c in enumerate(channels) if c in self._watchers]
        else:
            hits = np.flatnonzero(np.isin(channels, list(self._watchers))).tolist()
        for k in hits:
            watcher = self._watchers[int(channels[k])]
            watcher.appended(first + k, bytes(self.get(first + k).body))

    def _out_of_bounds(self, index: int) -> LedgerError:
        if self._closed:
            return _err(ResponseCode.DISK_ERROR, "the store is closed")
        return _err(
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            f"index {index} outside [{self.ledger_begin_index}, {self.ledger_end_index}]",
        )

    def _unit(self, index: int) -> IndexUnit:
        """The index unit of a stored entry."""
        if type(index) is not int:
            index = _as_int(index, "index")
        if not self.ledger_begin_index <= index <= self.ledger_end_index:
            raise self._out_of_bounds(index)
        return self._unit_raw(index)

    def _unit_raw(self, index: int) -> IndexUnit:
        """The index unit of ``index`` as stored, without bounds checks (recovery reads these)."""
        return IndexUnit._make(INDEX.unpack(self._index.read(index * INDEX_UNIT, INDEX_UNIT)))

    def get_term(self, index: int) -> int:
        """Term of the stored entry ``index``."""
        with self._lock:
            return self._unit(index).term

    def get_pos(self, index: int) -> int:
        """Data-file position of the stored entry ``index``."""
        with self._lock:
            return self._unit(index).pos

    # -- reads ------------------------------------------------------------------------
    def get(self, index: int) -> Entry:
        """The entry at ``index`` (INDEX_OUT_OF_BOUNDS outside [begin, end])."""
        if type(index) is not int:
            index = _as_int(index, "index")
        with self._lock:
            if not self.ledger_begin_index <= index <= self.ledger_end_index or self._closed:
                raise self._out_of_bounds(index)
            _m, pos, size, _i, _t = INDEX.unpack(self._index.read(index * INDEX_UNIT, INDEX_UNIT))
            buf = self._data.read(pos, size)
        _mg, esize, eindex, term, epos, channel, _c, _b, _bs = HEADER.unpack_from(buf)
        if eindex != index or epos != pos or esize != size:
            raise _err(
                ResponseCode.CORRUPT_LOG,
                f"index unit of {index} points at entry {eindex}@{epos} (size {esize} != {size})",
            )
        return Entry(index, term, pos, buf[HEADER_SIZE + body_skip(channel) :],
                     logical_channel(channel))  # fmt: skip

    def get_range(self, start: int, stop: int) -> list[Entry]:
        """Entries with ``start <= index < stop`` (clipped to what is stored)."""
        start, stop = _as_int(start, "start"), _as_int(stop, "stop")
        with self._lock:
            if start < self.ledger_begin_index:
                raise _err(
                    ResponseCode.INDEX_OUT_OF_BOUNDS,
                    f"index {start} is below the log's begin {self.ledger_begin_index}",
                )
            stop = min(stop, self.ledger_end_index + 1)
            if start >= stop:
                return []
            return self.read_batch(start, max_count=stop - start).entries()

    def read_batch(
        self, start: int, max_bytes: int = 1 << 62, max_count: int = 1 << 62
    ) -> EntryBatch:
        """Encoded entries from ``start``: at least one, then up to ``max_bytes`` / ``max_count``."""
        start = _as_int(start, "start")
        max_bytes, max_count = _as_int(max_bytes, "max_bytes"), _as_int(max_count, "max_count")
        if max_count <= 0:
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT, f"max_count must be positive, got {max_count}"
            )
        with self._lock:
            end = self.ledger_end_index
            if not self.ledger_begin_index <= start <= end:
                raise self._out_of_bounds(start)
            n = min(max_count, end - start + 1)
            units = self._read_units(start, n)
            sizes_arr = units["size"].astype(np.int64)
            count = int(np.searchsorted(np.cumsum(sizes_arr), max_bytes, side="right"))
            count = max(1, min(count, n))
            positions = units["pos"][:count].tolist()
            sizes = sizes_arr[:count].tolist()
            read = self._data.read
            parts = [
                read(positions[a], nbytes)
                for a, _b, nbytes in _runs(positions, sizes, self._data.segment_size)
            ]
        return EntryBatch(start, count, parts[0] if len(parts) == 1 else b"".join(parts))

    def _read_units(self, start: int, n: int) -> np.ndarray:
        return decode_index(self._index.read_span(start * INDEX_UNIT, n * INDEX_UNIT))

    def first_index_of_term(self, term: int) -> int:
        """The first stored index whose entry has ``term``, or -1 (terms never decrease)."""
        term = _as_int(term, "term")
        with self._lock:
            lo, hi = self.ledger_begin_index, self.ledger_end_index
            if lo > hi:
                return -1
            while lo < hi:
                mid = (lo + hi) // 2
                if self._unit(mid).term < term:
                    lo = mid + 1
                else:
                    hi = mid
            return lo if self._unit(lo).term == term else -1

    # -- writes -----------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self._closed:
            raise _err(ResponseCode.DISK_ERROR, "the store is closed")
        if self._failed is not None:
            raise _err(
                self._failed.code, f"the store stopped after a disk failure: {self._failed.message}"
            )

    def _check_bodies(self, bodies) -> tuple[list, list[int]]:
        """The bodies as a list and their entry sizes; raises on anything not a list of bytes."""
        if type(bodies) is not list and type(bodies) is not tuple:
            if type(bodies) in _BYTES_TYPES or not isinstance(bodies, (list, tuple)):
                raise _err(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"bodies must be a list of bytes, not {type(bodies).__name__}",
                )
        if not bodies:
            raise _err(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
        types = set(map(type, bodies))
        if not types <= _BYTES_TYPES:
            for i, body in enumerate(bodies):
                if type(body) not in _BYTES_TYPES:
                    raise _err(
                        ResponseCode.UNEXPECTED_ARGUMENT,
                        f"body {i} must be bytes, not {type(body).__name__}",
                    )
        bodies = list(bodies)
        if memoryview in types:  # count bytes, not items, of any memoryview
            bodies = [bytes(b) if type(b) is memoryview else b for b in bodies]
        lens = list(map(len, bodies))
        limit = self.config.max_entry_size
        if max(lens) > limit:
            i = next(k for k, n in enumerate(lens) if n > limit)
            raise _err(
                ResponseCode.ENTRY_TOO_LARGE,
                f"body {i} has {lens[i]} bytes, more than max_entry_size {limit}",
            )
        return bodies, [HEADER_SIZE + n for n in lens]

    def check_bodies(self, bodies) -> list:
        """The bodies as a list of bytes, or the LedgerError ``append_as_leader`` would raise
        for them (type, empty batch, size); nothing is written."""
        return self._check_bodies(bodies)[0]

    def check_disk(self) -> None:
        """Raise DISK_FULL when appends must be refused (file store only)."""

    def append_as_leader(
        self, bodies: Sequence[bytes], term: int, channel: int | Sequence[int] = 0
    ) -> Appended:
        """Append a batch at ``ledger_end_index + 1`` with ``term`` (DLedger appendAsLeader).
        ``channel``: every entry's, or one per entry (an idempotent client's
        entries carry :data:`~.codec.SESSION_FLAG` and their body starts with the session
        prefix).

        Append hooks run on each body (with its index and position) before the
        CRCs are computed, so what they stamp is what is stored and replicated; only on
        channel 0 (see :meth:`add_append_hook`), and on the client's part of the body.
        """
        bodies, sizes = self._check_bodies(bodies)
        if type(term) is not int or term < 0:
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT, f"term must be a non-negative int, got {term!r}"
            )
        channels = [channel] * len(bodies) if type(channel) is int else list(channel)
        if len(channels) != len(bodies) or any(
            type(c) is not int or not -(2**31) <= c < 2**31 for c in set(channels)
        ):
            raise _err(ResponseCode.UNEXPECTED_ARGUMENT,
                       f"channel must be an int32 or one per body, got {channel!r}")  # fmt: skip
        with self._lock:
            self._check_writable()
            if term < self.ledger_end_term:
                raise _err(
                    ResponseCode.EXPIRED_TERM,
                    f"term {term} is older than the last entry's term {self.ledger_end_term}",
                )
            self.check_disk()
            first = self.ledger_end_index + 1
            positions = self._data.positions_for(sizes)
            if self._hooks and any(logical_channel(c) == 0 for c in channels):
                bodies = [bytearray(b) for b in bodies]
                for k, body in enumerate(bodies):
                    if logical_channel(channels[k]):
                        continue
                    skip = body_skip(channels[k])
                    own = bytearray(body[skip:]) if skip else body  # a hook sees a bytearray
                    for hook in self._hooks:
                        hook(first + k, positions[k], own)
                        if len(own) != sizes[k] - HEADER_SIZE - skip:
                            raise _err(
                                ResponseCode.UNEXPECTED_ARGUMENT,
                                "an append hook changed a body's length",
                            )
                    if skip:
                        body[skip:] = own
            prev = 0 if self._chain is None else self._chain
            data, chain = encode_entries(bodies, first, term, positions, prev, channels)
            self._write(first, data, positions, sizes, [term] * len(sizes))
            self._chain = chain
            self.ledger_end_term = term
            if self._watchers:
                for k, body in enumerate(bodies):
                    watcher = self._watchers.get(channels[k])
                    if watcher is not None:
                        watcher.appended(first + k, bytes(body))
            if self._sessions is not None:
                self._tell_sessions(data, first, channels, sizes)
        self.after_append()
        return Appended(first, term, positions, data, crc32(data))

    def append_as_follower(self, batch: EntryBatch) -> None:
        """Store the leader's entries exactly where the leader has them (DLedger appendAsFollower).

        Every entry is checked (header, index, term order, body CRC, chain CRC
        against this log, position) before anything is written.  A batch carrying the
        leader's CRC of its bytes (``batch.crc``) that still matches them has its body
        CRCs checked by that one CRC: its headers' body CRCs are the leader's own.
        """
        if not isinstance(batch, EntryBatch):
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"append_as_follower takes an EntryBatch, not {type(batch).__name__}",
            )
        first_index = _as_int(batch.first_index, "batch.first_index")
        count = _as_int(batch.count, "batch.count")
        data = batch.data
        if type(data) not in _BYTES_TYPES:
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"batch data must be bytes, not {type(data).__name__}",
            )
        with self._lock:
            self._check_writable()
            if first_index != self.ledger_end_index + 1:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"batch starts at {first_index}, the log ends at {self.ledger_end_index}",
                )
            if count <= 0 or not len(data):
                raise _err(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
            view = memoryview(data).cast("B")
            # a few entries are checked one by one (numpy's per-call cost outweighs its
            # loops there); more at once, vectorised
            if count < _VECTOR_MIN:
                checked = None
            else:  # the leader's batch CRC, when it holds, vouches for every body's
                intact = batch.crc is not None and crc32(view) == batch.crc & 0xFFFF_FFFF
                checked = self._verify_fast(view, first_index, count, intact)
            if checked is None:  # or something is off: the entry-by-entry check says what
                checked = self._verify_slow(view, first_index, count)
            positions, sizes, terms, chain, term_floor, runs, channels = checked
            self.check_disk()
            self._write(first_index, view, positions, sizes, terms, runs)
            self._chain = chain
            self.ledger_end_term = term_floor
            if self._watchers:
                self._tell_watchers(first_index, channels)
            if self._sessions is not None:
                self._tell_sessions(view, first_index, channels, sizes)
        self.after_append()

    def _verify_fast(self, view, first_index: int, count: int, intact: bool = False):
        """The checks of :meth:`_verify_slow`, vectorised; None when any fails.

        One pass finds the entries (none when all have the first one's size),
        numpy reads every header at once and checks magic, sizes, indexes,
        terms, positions and the chain CRCs; only the body CRCs take a call
        per entry -- none when the batch is ``intact`` (its bytes are the leader's, CRC and
        all: the headers' body CRCs are the leader's own).  Returns what ``_write`` needs,
        or None (nothing is raised here: the slow check then finds and names the first bad
        entry).
        """
        found = self._find_entries(view, count, intact)
        if found is None:
            return None
        h, crcs, offsets, size0 = found
        if not self._headers_hold(h, crcs, first_index, count):
            return None
        placed = self._placed(h, offsets, size0, len(view), count)
        if placed is None:
            return None
        positions, sizes, runs = placed
        terms = h["term"]
        chain = _signed(int(h["chain"][-1]))
        return positions, sizes, terms, chain, int(terms[-1]), runs, h["channel"]

    def _find_entries(self, view, count: int, intact: bool = False):
        """``(headers, body CRCs, offsets, size0)`` of the ``count`` entries in ``view``
        (offsets None when every entry has the first one's size, ``size0``), or None when
        the sizes do not add up; an ``intact`` batch's body CRCs are its headers'."""
        n = len(view)
        if n < HEADER_SIZE:
            return None
        limit = self.config.max_entry_size + HEADER_SIZE
        size0 = _I32.unpack_from(view, 4)[0]
        if not HEADER_SIZE <= size0 <= limit:
            return None
        if count * size0 == n:
            h = np.ndarray((count,), HEADER_DTYPE, buffer=view, strides=(size0,))
            if bool((h["size"] == size0).all()):  # the bodies sit at fixed strides
                if intact:
                    return h, h["bcrc"], None, size0
                body = size0 - HEADER_SIZE
                stops = range(HEADER_SIZE, n + HEADER_SIZE, size0)
                return h, [crc32(view[at : at + body]) for at in stops], None, size0
        unpack_size = _I32.unpack_from
        offs = []
        off = 0
        while off < n:
            if off + HEADER_SIZE > n:
                return None
            size = unpack_size(view, off + 4)[0]
            if not HEADER_SIZE <= size <= limit:
                return None
            offs.append(off)
            off += size
        if off != n or len(offs) != count:
            return None
        offsets = np.array(offs, dtype=np.int64)
        raw = np.frombuffer(view, dtype=np.uint8)[offsets[:, None] + np.arange(HEADER_SIZE)]
        h = raw.view(HEADER_DTYPE).reshape(count)
        if intact:
            return h, h["bcrc"], offsets, size0
        ends = offs[1:] + [n]
        crcs = [crc32(view[a + HEADER_SIZE : b]) for a, b in zip(offs, ends, strict=True)]
        return h, crcs, offsets, size0

    def _headers_hold(self, h, crcs: list[int], first_index: int, count: int) -> bool:
        """Magic, sizes, consecutive indexes, non-decreasing terms, body and chain CRCs."""
        sizes = h["size"]
        if (
            (h["magic"] != ENTRY_MAGIC).any()
            or (sizes != h["body_size"] + HEADER_SIZE).any()
            or (h["index"] != np.arange(first_index, first_index + count)).any()
        ):
            return False
        terms = h["term"]
        if terms[0] < self.ledger_end_term or (count > 1 and (terms[1:] < terms[:-1]).any()):
            return False
        got = np.array(crcs, dtype=np.uint32)
        if (got != h["bcrc"]).any():
            return False
        echain = np.asarray(h["chain"], dtype=np.uint32)
        prev = np.empty(count, dtype=np.uint32)
        prev[1:] = echain[:-1]
        prev[0] = 0 if self._chain is None else self._chain & 0xFFFF_FFFF
        bad = chain_crcs(prev, got) != echain
        if self._chain is None:
            bad[0] = False  # nothing to chain the first entry to (after a reset)
        return not bad.any()

    def _placed(self, h, offsets, size0: int, n: int, count: int):
        """``(positions, sizes, runs)`` when every entry sits where this log's write position
        (and segment rolls) put it, else None."""
        positions, sizes = h["pos"], h["size"]
        wp = self._data.write_pos
        seg = self._data.segment_size
        if wp // seg == (wp + n - 1) // seg:  # the batch fits the current segment as it is
            if offsets is None:
                expected = np.arange(wp, wp + n, size0, dtype=np.int64)
            else:
                expected = offsets + wp
            if (positions != expected).any():
                return None
            return positions, sizes, [(0, count, n)]
        positions, sizes = positions.tolist(), sizes.tolist()
        if self._data.positions_for(sizes) != positions:
            return None
        return positions, sizes, None

    def _verify_slow(self, view, first_index: int, count: int):
        """Check a follower batch entry by entry; raises on the first bad entry.

        The reference check (and the one that names what is wrong): the fast
        path falls back to it whenever anything does not hold.
        """
        n = len(view)
        off = 0
        index = first_index
        term_floor = self.ledger_end_term
        chain = self._chain
        positions, sizes, terms, channels = [], [], [], []
        limit = self.config.max_entry_size + HEADER_SIZE
        unpack = HEADER.unpack_from
        while off < n:
            if off + HEADER_SIZE > n:
                raise _err(ResponseCode.UNEXPECTED_ARGUMENT, f"entry {index} is cut short")
            magic, size, eidx, term, pos, channel, echain, bcrc, body_size = unpack(view, off)
            if (
                magic != ENTRY_MAGIC
                or body_size < 0
                or size != HEADER_SIZE + body_size
                or size > limit
                or off + size > n
            ):
                raise _err(ResponseCode.UNEXPECTED_ARGUMENT, f"entry {index} has a bad header")
            if eidx != index or term < term_floor:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"entry {eidx} (term {term}) cannot follow {index - 1} (term {term_floor})",
                )
            got = crc32(view[off + HEADER_SIZE : off + size])
            if _signed(got) != bcrc:
                raise _err(ResponseCode.UNEXPECTED_ARGUMENT, f"entry {index} fails its body CRC")
            if chain is not None and _signed(chain_crc(chain, got)) != echain:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"entry {index}'s chain CRC does not follow this log (logs diverged before it)",
                )
            chain = echain
            positions.append(pos)
            sizes.append(size)
            terms.append(term)
            channels.append(channel)
            term_floor = term
            off += size
            index += 1
        if index - first_index != count:
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"batch count {count} does not match its data ({index - first_index} entries)",
            )
        expected = self._data.positions_for(sizes)
        if expected != positions:
            k = next(i for i, (a, b) in enumerate(zip(expected, positions, strict=True)) if a != b)
            raise _err(
                ResponseCode.INCONSISTENT_STATE,
                f"entry {first_index + k} is at {positions[k]} on the leader, "
                f"would be at {expected[k]} here (segment sizes differ?)",
            )
        return positions, sizes, terms, chain, term_floor, None, channels

    def _write(self, first: int, data, positions, sizes, terms, runs=None) -> None:
        """Write encoded entries and their index units; on failure undo both.

        ``positions``, ``sizes``, ``terms``: lists or numpy arrays; ``runs`` as
        :func:`_runs` returns them, when the caller already knows.
        """
        old_pos = self._data.write_pos
        try:
            view = memoryview(data)
            off = 0
            if runs is None:
                runs = _runs(positions, sizes, self._data.segment_size)
            for a, _b, nbytes in runs:
                self._data.write_at(int(positions[a]), view[off : off + nbytes])
                off += nbytes
            self._index.write_span(first * INDEX_UNIT, encode_index(positions, sizes, first, terms))
        except BaseException:
            try:
                self._data.truncate(old_pos)
                self._index.truncate(first * INDEX_UNIT)
            except LedgerError as undo:
                log.error(
                    "could not undo a failed write (%s); the store stops taking appends", undo
                )
                self._failed = undo
            raise
        self.ledger_end_index = first + len(sizes) - 1
        self._seq += 1

    def after_append(self) -> None:
        """Durability hook: the file store waits for its flush here in sync mode."""

    def _start_pos(self) -> int:
        """Data position where the first entry of the log went (the end of an empty log)."""
        if self._base[0] == self.ledger_begin_index:
            return self._base[1]
        return self._unit(self.ledger_begin_index).pos

    def truncate(self, end_index: int) -> int:
        """Keep entries up to ``end_index``; never below the committed index. Returns entries dropped.

        The data is cut right after entry ``end_index`` (dropping any roll padding
        after it), so what is appended next lands where the leader has it.
        """
        end_index = _as_int(end_index, "end_index")
        with self._lock:
            self._check_writable()
            if end_index < self.committed_index:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"refusing to truncate to {end_index}: entries up to {self.committed_index} "
                    f"are committed",
                )
            if end_index >= self.ledger_end_index:
                return 0
            if end_index < self.ledger_begin_index - 1:
                raise _err(
                    ResponseCode.INDEX_OUT_OF_BOUNDS,
                    f"index {end_index} is below the log's begin {self.ledger_begin_index}",
                )
            dropped = self.ledger_end_index - end_index
            if end_index >= self.ledger_begin_index:
                _m, pos, size, _i, term = self._unit(end_index)
                cut = pos + size
                chain = HEADER.unpack_from(self._data.read(pos, HEADER_SIZE))[6]
            else:
                cut = self._start_pos()
                term = self._base_term
                chain = 0 if self.ledger_begin_index == 0 else None
                self._base = (self.ledger_begin_index, cut)
            self._data.truncate(cut)
            self._index.truncate((end_index + 1) * INDEX_UNIT)
            self.ledger_end_index = end_index
            self.ledger_end_term = term
            self._chain = chain
            self._seq += 1
            for watcher in self._watchers.values():
                watcher.truncated(end_index)
            if self._sessions is not None:
                self._sessions.truncated(end_index)
            self.after_truncate()
            log.info("store truncated to %d (%d entries dropped)", end_index, dropped)
            return dropped

    def reset(self, begin_index: int, begin_pos: int, term_floor: int = -1) -> None:
        """Drop the whole log; it restarts empty at ``begin_index`` / ``begin_pos``.

        Used when a follower's log does not overlap the leader's at all; refused
        when it would drop entries that are committed and not below ``begin_index``.
        ``term_floor``: the term of the leader's entry at ``begin_index``, at least that
        of the entry before it (committed): the empty log's last term, kept durably, so
        that this member never votes for a candidate missing those entries (Raft's
        snapshot's last included term; a term at or above the true one is stricter).
        """
        begin_index, begin_pos = (
            _as_int(begin_index, "begin_index"),
            _as_int(begin_pos, "begin_pos"),
        )
        if begin_index < 0 or begin_pos < 0:
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"cannot reset to a negative index/position ({begin_index}, {begin_pos})",
            )
        hole = begin_pos % self.config.data_segment_size
        if 0 < hole < HEADER_SIZE:
            # entries start at a segment's start or after at least one whole entry
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"no entry can start at position {begin_pos} ({hole} bytes into its segment)",
            )
        with self._lock:
            self._check_writable()
            if begin_index <= self.committed_index:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"refusing to reset to {begin_index}: entries up to {self.committed_index} "
                    f"are committed",
                )
            self._data.reset(begin_pos)
            self._index.reset(begin_index * INDEX_UNIT)
            self.ledger_begin_index = begin_index
            self.ledger_end_index = begin_index - 1
            self.ledger_end_term = self._base_term = int(term_floor)
            self._chain = 0 if begin_index == 0 else None
            self._base = (begin_index, begin_pos)
            self._seq += 1
            for watcher in self._watchers.values():
                watcher.reset(begin_index)
            if self._sessions is not None:
                self._sessions.reset(begin_index)
            self.after_truncate()
            log.info("store reset to begin at %d (pos %d)", begin_index, begin_pos)

    def after_truncate(self) -> None:
        """Durability hook: the file store syncs and checkpoints the new end here."""

    def update_committed_index(self, index: int) -> int:
        """Advance the committed index (never backwards, never past the end); returns it."""
        index = _as_int(index, "committed index")
        with self._lock:
            index = min(index, self.ledger_end_index)
            if index > self.committed_index:
                if index >= self.ledger_begin_index:
                    _m, pos, size, _i, _t = self._unit(index)
                    self.committed_pos = pos + size
                self.committed_index = index
                if self._sessions is not None:
                    self._sessions.committed(index)
            return self.committed_index

    def flush(self) -> None:
        """Make everything written so far durable (a no-op in memory)."""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._data.close()
            self._index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(begin={self.ledger_begin_index}, end={self.ledger_end_index}, "
            f"end_term={self.ledger_end_term}, committed={self.committed_index})"
        )


class MemoryStore(LogStore):
    """DLedgerMemoryStore: the same layout in memory; nothing survives the process."""

    def __init__(self, config: StoreConfig | None = None):
        config = config or StoreConfig()
        super().__init__(
            config,
            SegmentList(config.data_segment_size, None),
            SegmentList(config.index_segment_size, None),
        )
