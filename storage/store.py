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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .codec import HEADER, HEADER_SIZE, INDEX, INDEX_UNIT, Entry, EntryBatch, encode_entries, encode_index
from .config import StoreConfig
from .errors import LedgerError, ResponseCode
from .segments import SegmentList

log = logging.getLogger("rayledger.storage")

AppendHook = Callable[[int, int, bytearray], None]
"""``hook(index, pos, body)``: may rewrite bytes of ``body`` in place (not its length)."""

_BYTES_TYPES = (bytes, bytearray, memoryview)


@dataclass(slots=True, frozen=True)
class Appended:
    """Where a leader's batch landed: entry ``first_index + k`` is at ``positions[k]``."""

    first_index: int
    term: int
    positions: list[int]

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.positions) - 1


def _err(code: ResponseCode, msg: str) -> LedgerError:
    return LedgerError.of(code, msg)


class LogStore:
    """Shared logic of the file and memory stores (use one of the subclasses)."""

    def __init__(self, config: StoreConfig, data: SegmentList, index: SegmentList):
        self.config = config
        self._data = data
        self._index = index
        self._lock = threading.RLock()
        self._hooks: list[AppendHook] = []
        self.ledger_begin_index = 0
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.committed_pos = 0
        self._chain: int | None = 0  # chain CRC of the last entry; None when unknown (after reset)

    # -- metadata ---------------------------------------------------------------------
    @property
    def is_empty(self) -> bool:
        return self.ledger_end_index < self.ledger_begin_index

    @property
    def write_pos(self) -> int:
        return self._data.write_pos

    def add_append_hook(self, hook: AppendHook) -> None:
        self._hooks.append(hook)

    def _unit(self, index: int) -> tuple[int, int, int, int, int]:
        """(magic, pos, size, index, term) of a stored entry."""
        if not self.ledger_begin_index <= index <= self.ledger_end_index:
            raise _err(
                ResponseCode.INDEX_OUT_OF_BOUNDS,
                f"index {index} outside [{self.ledger_begin_index}, {self.ledger_end_index}]",
            )
        return INDEX.unpack(self._index.read(index * INDEX_UNIT, INDEX_UNIT))

    def get_term(self, index: int) -> int:
        return self._unit(index)[4]

    def get_pos(self, index: int) -> int:
        return self._unit(index)[1]

    # -- reads ------------------------------------------------------------------------
    def get(self, index: int) -> Entry:
        if type(index) is not int:
            raise _err(ResponseCode.UNEXPECTED_ARGUMENT, f"index must be an int, not {type(index).__name__}")
        with self._lock:
            _m, pos, size, _i, _t = self._unit(index)
            buf = self._data.read(pos, size)
        magic, esize, eindex, term, epos, channel, _c, _b, body_size = HEADER.unpack_from(buf)
        if eindex != index or epos != pos or esize != size:
            raise _err(ResponseCode.CORRUPT_LOG, f"index unit of {index} points at entry {eindex}@{epos}")
        return Entry(index, term, pos, buf[HEADER_SIZE:], channel)

    def get_range(self, start: int, stop: int) -> list[Entry]:
        """Entries with ``start <= index < stop`` (clipped to what is stored)."""
        with self._lock:
            stop = min(stop, self.ledger_end_index + 1)
            if start < self.ledger_begin_index:
                raise _err(ResponseCode.INDEX_OUT_OF_BOUNDS, f"index {start} is below the log's begin {self.ledger_begin_index}")
            if start >= stop:
                return []
            return self.read_batch(start, max_count=stop - start).entries()

    def read_batch(self, start: int, max_bytes: int = 1 << 62, max_count: int = 1 << 62) -> EntryBatch:
        """Encoded entries from ``start``: at least one, then up to ``max_bytes`` / ``max_count``."""
        with self._lock:
            end = self.ledger_end_index
            if not self.ledger_begin_index <= start <= end:
                raise _err(
                    ResponseCode.INDEX_OUT_OF_BOUNDS,
                    f"index {start} outside [{self.ledger_begin_index}, {end}]",
                )
            n = min(max_count, end - start + 1)
            units = self._read_units(start, n)
            pos = units["pos"]
            sizes = units["size"]
            total = 0
            count = 0
            for s in sizes.tolist():
                if count and total + s > max_bytes:
                    break
                total += s
                count += 1
            parts = []
            run_start = int(pos[0])
            run_end = run_start
            for p, s in zip(pos[:count].tolist(), sizes[:count].tolist()):
                if p != run_end:
                    parts.append(self._data.read(run_start, run_end - run_start))
                    run_start = p
                run_end = p + s
            parts.append(self._data.read(run_start, run_end - run_start))
        return EntryBatch(start, count, parts[0] if len(parts) == 1 else b"".join(parts))

    def _read_units(self, start: int, n: int):
        from .codec import decode_index

        chunks = []
        pos = start * INDEX_UNIT
        remaining = n * INDEX_UNIT
        seg_size = self._index.segment_size
        while remaining:
            take = min(remaining, seg_size - pos % seg_size)
            chunks.append(self._index.read(pos, take))
            pos += take
            remaining -= take
        return decode_index(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def first_index_of_term(self, term: int) -> int:
        """The first stored index whose entry has ``term``, or -1 (terms never decrease)."""
        with self._lock:
            lo, hi = self.ledger_begin_index, self.ledger_end_index
            if lo > hi:
                return -1
            while lo < hi:
                mid = (lo + hi) // 2
                if self.get_term(mid) < term:
                    lo = mid + 1
                else:
                    hi = mid
            return lo if self.get_term(lo) == term else -1

    # -- writes -----------------------------------------------------------------------
    def _check_bodies(self, bodies) -> None:
        if isinstance(bodies, _BYTES_TYPES) or not isinstance(bodies, (list, tuple)):
            raise _err(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"bodies must be a list of bytes, not {type(bodies).__name__}",
            )
        if not bodies:
            raise _err(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
        limit = self.config.max_entry_size
        for i, body in enumerate(bodies):
            if not isinstance(body, _BYTES_TYPES):
                raise _err(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"body {i} must be bytes, not {type(body).__name__}",
                )
            if len(body) > limit:
                raise _err(
                    ResponseCode.ENTRY_TOO_LARGE,
                    f"body {i} has {len(body)} bytes, more than max_entry_size {limit}",
                )

    def check_disk(self) -> None:
        """Raise DISK_FULL when appends must be refused (file store only)."""

    def append_as_leader(self, bodies: Sequence[bytes], term: int, channel: int = 0) -> Appended:
        """Append a batch at ``ledger_end_index + 1`` with ``term`` (DLedger appendAsLeader)."""
        self._check_bodies(bodies)
        if type(term) is not int or term < 0:
            raise _err(ResponseCode.UNEXPECTED_ARGUMENT, f"term must be a non-negative int, got {term!r}")
        with self._lock:
            if term < self.ledger_end_term:
                raise _err(
                    ResponseCode.EXPIRED_TERM,
                    f"term {term} is older than the last entry's term {self.ledger_end_term}",
                )
            self.check_disk()
            first = self.ledger_end_index + 1
            sizes = [HEADER_SIZE + len(b) for b in bodies]
            positions = self._data.positions_for(sizes)
            if self._hooks:
                bodies = [bytearray(b) for b in bodies]
                for k, body in enumerate(bodies):
                    for hook in self._hooks:
                        hook(first + k, positions[k], body)
                        if len(body) != sizes[k] - HEADER_SIZE:
                            raise _err(ResponseCode.UNEXPECTED_ARGUMENT, "an append hook changed a body's length")
            data, chain = encode_entries(bodies, first, term, positions, self._chain or 0, channel)
            self._write(first, data, positions, sizes, [term] * len(sizes))
            self._chain = chain
            self.ledger_end_term = term
        self.after_append()
        return Appended(first, term, positions)

    def append_as_follower(self, batch: EntryBatch) -> None:
        """Store the leader's entries exactly where the leader has them (DLedger appendAsFollower)."""
        from .codec import ENTRY_MAGIC, _signed, chain_crc, crc32

        with self._lock:
            if batch.first_index != self.ledger_end_index + 1:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"batch starts at {batch.first_index}, the log ends at {self.ledger_end_index}",
                )
            if batch.count <= 0:
                raise _err(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
            data = batch.data
            view = memoryview(data)
            n = len(data)
            off = 0
            index = batch.first_index
            term_floor = self.ledger_end_term
            chain = self._chain
            positions, sizes, terms = [], [], []
            limit = self.config.max_entry_size + HEADER_SIZE
            while off < n:
                if off + HEADER_SIZE > n:
                    raise _err(ResponseCode.UNEXPECTED_ARGUMENT, f"entry {index} is cut short")
                magic, size, eidx, term, pos, _ch, echain, bcrc, body_size = HEADER.unpack_from(data, off)
                if magic != ENTRY_MAGIC or size != HEADER_SIZE + body_size or size > limit or off + size > n:
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
                term_floor = term
                off += size
                index += 1
            if index - batch.first_index != batch.count:
                raise _err(ResponseCode.UNEXPECTED_ARGUMENT, "batch count does not match its data")
            expected = self._data.positions_for(sizes)
            if expected != positions:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"entry {batch.first_index} is at {positions[0]} on the leader, "
                    f"would be at {expected[0]} here (segment sizes differ?)",
                )
            self.check_disk()
            self._write(batch.first_index, data, positions, sizes, terms)
            self._chain = chain
            self.ledger_end_term = term_floor
        self.after_append()

    def _write(self, first: int, data, positions: list[int], sizes: list[int], terms: list[int]) -> None:
        """Write encoded entries and their index units; on failure undo both."""
        old_pos = self._data.write_pos
        n = len(sizes)
        try:
            run_start = 0
            view = memoryview(data)
            off = 0
            run_off = 0
            expect = positions[0]
            for k in range(n):
                if positions[k] != expect:
                    self._data.write_at(positions[run_start], view[run_off:off])
                    run_start, run_off = k, off
                expect = positions[k] + sizes[k]
                off += sizes[k]
            self._data.write_at(positions[run_start], view[run_off:off])
            units = encode_index(positions, sizes, first, terms)
            ipos = first * INDEX_UNIT
            iseg = self._index.segment_size
            uoff = 0
            while uoff < len(units):
                take = min(len(units) - uoff, iseg - (ipos + uoff) % iseg)
                self._index.write_at(ipos + uoff, units[uoff : uoff + take])
                uoff += take
        except BaseException:
            self._data.truncate(old_pos)
            self._index.truncate(first * INDEX_UNIT)
            raise
        self.ledger_end_index = first + n - 1

    def after_append(self) -> None:
        """Durability hook: the file store waits for its flush here in sync mode."""

    def truncate(self, end_index: int) -> int:
        """Keep entries up to ``end_index``; never below the committed index. Returns entries dropped."""
        with self._lock:
            if end_index < self.committed_index:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"refusing to truncate to {end_index}: entries up to {self.committed_index} are committed",
                )
            if end_index >= self.ledger_end_index:
                return 0
            if end_index < self.ledger_begin_index - 1:
                raise _err(ResponseCode.INDEX_OUT_OF_BOUNDS, f"index {end_index} is below the log's begin")
            dropped = self.ledger_end_index - end_index
            cut = self.get_pos(end_index + 1)
            if end_index >= self.ledger_begin_index:
                _m, pos, size, _i, term = self._unit(end_index)
                chain = HEADER.unpack_from(self._data.read(pos, HEADER_SIZE))[6]
            else:
                term, chain = -1, None
            self._data.truncate(cut)
            self._index.truncate((end_index + 1) * INDEX_UNIT)
            self.ledger_end_index = end_index
            self.ledger_end_term = term
            self._chain = chain
            self.after_truncate()
            log.info("store truncated to %d (%d entries dropped)", end_index, dropped)
            return dropped

    def reset(self, begin_index: int, begin_pos: int) -> None:
        """Drop the whole log; it restarts empty at ``begin_index`` / ``begin_pos``.

        Used when a follower's log does not overlap the leader's at all; refused
        when it would drop entries that are committed and not below ``begin_index``.
        """
        with self._lock:
            if begin_index <= self.committed_index:
                raise _err(
                    ResponseCode.INCONSISTENT_STATE,
                    f"refusing to reset to {begin_index}: entries up to {self.committed_index} are committed",
                )
            self._data.reset(begin_pos)
            self._index.reset(begin_index * INDEX_UNIT)
            self.ledger_begin_index = begin_index
            self.ledger_end_index = begin_index - 1
            self.ledger_end_term = -1
            self._chain = None
            self.after_truncate(base=(begin_index, begin_pos))
            log.info("store reset to begin at %d (pos %d)", begin_index, begin_pos)

    def after_truncate(self, base: tuple[int, int] | None = None) -> None:
        """Durability hook: the file store checkpoints the new end here."""

    def update_committed_index(self, index: int) -> int:
        """Advance the committed index (never backwards, never past the end); returns it."""
        with self._lock:
            index = min(index, self.ledger_end_index)
            if index > self.committed_index:
                if index >= self.ledger_begin_index:
                    _m, pos, size, _i, _t = self._unit(index)
                    self.committed_pos = pos + size
                self.committed_index = index
            return self.committed_index

    def flush(self) -> None:
        """Make everything written so far durable (a no-op in memory)."""

    def close(self) -> None:
        with self._lock:
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
