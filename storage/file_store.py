"""DLedgerMmapFileStore: the log on disk, with flush service, checkpoint and recovery.

Layout under ``data_dir``: ``data/`` and ``index/`` segment files named by their
start offset, and ``checkpoint`` (JSON, written atomically).  The checkpoint
records how far data and index were flushed and consistent, so reopening only
re-verifies what was written after it (the index of the trusted prefix is still
checked, vectorised); anything after the last good entry (a torn write, flipped
bytes) is cut off and reported, unless it is committed, in which case opening
fails loudly, leaving the files untouched, rather than lose an acknowledged entry.

Durability: a flush thread fsyncs written segments every ``flush_interval_ms``
(and on demand), so with ``sync_flush`` an append returns once it is on disk,
and appends from several threads share one fsync (group commit).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .codec import (
    ENTRY_MAGIC,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    Header,
    blank_size,
    check_entry,
    encode_index,
)
from .config import StoreConfig
from .errors import LedgerError, ResponseCode
from .metafile import atomic_write_json, ensure_writable_dir, read_json
from .segments import SegmentList
from .store import LogStore, MemoryStore

log = logging.getLogger("rayledger.storage")

CHECKPOINT = "checkpoint"
_VERIFY_CHUNK = 1 << 20  # index units checked per numpy pass when trusting a prefix


@dataclass
class RecoveryReport:
    """What opening the store found; ``dropped_bytes`` > 0 means a damaged tail was cut."""

    scanned_from_pos: int = 0
    scanned_entries: int = 0
    full_scan: bool = False
    dropped_bytes: int = 0
    dropped_at_pos: int | None = None
    trimmed_bytes: int = 0  # roll padding / empty segments after the last entry, removed
    index_rebuilt_from: int | None = None
    padded: int = 0  # segments padded after a torn roll
    seconds: float = 0.0


@dataclass(frozen=True)
class _Checkpoint:
    """What the last checkpoint promises: the log's base (index, position), the committed
    index, the end, and how far data and index were flushed and consistent."""

    base: tuple[int, int]
    committed: int
    end: int
    flushed_pos: int
    flushed_index: int
    base_term: int = -1  # the term floor of an empty log at the base (LogStore.reset)


@dataclass
class _Scan:
    """The entries a recovery scan found good, in order, and where the damage starts."""

    begin_index: int
    expect_index: int  # the index the next good entry must have
    positions: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    terms: list[int] = field(default_factory=list)
    chains: list[int] = field(default_factory=list)
    chain: int | None = None  # the chain CRC after the last good entry
    chain0: int | None = None  # the chain CRC before the first scanned entry
    term_floor: int = -1
    bad_pos: int | None = None
    to_pad: list = field(default_factory=list)

    @property
    def end_index(self) -> int:
        return self.expect_index - 1

    def add(self, h: Header) -> None:
        self.positions.append(h.pos)
        self.sizes.append(h.size)
        self.terms.append(h.term)
        self.chains.append(h.chain_crc)
        self.chain, self.term_floor = h.chain_crc, h.term
        self.expect_index += 1

    def drop_from(self, k: int) -> None:
        """Entries ``k..`` are bad after all (a term that disagrees with its index unit)."""
        self.bad_pos = self.positions[k]
        self.expect_index -= len(self.positions) - k
        del self.positions[k:], self.sizes[k:], self.terms[k:], self.chains[k:]
        self.chain = self.chains[-1] if self.chains else self.chain0
        self.to_pad = [sg for sg in self.to_pad if sg.start < self.bad_pos]


def _corrupt(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.CORRUPT_LOG, msg)


class FileStore(LogStore):
    """The file store; see the module docstring."""

    def __init__(self, config: StoreConfig):
        if not config.data_dir:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, "FileStore needs config.data_dir"
            )
        self.dir = Path(config.data_dir)
        ensure_writable_dir(self.dir)
        data = SegmentList(config.data_segment_size, self.dir / "data")
        try:
            index = SegmentList(config.index_segment_size, self.dir / "index")
        except BaseException:
            data.close()
            raise
        super().__init__(config, data, index)
        self.flushed_pos = 0
        self.flushed_index = -1
        self._flush_cv = threading.Condition(self._lock)
        self._flush_requested = False
        self._synced_seq = 0  # every change up to this _seq is on disk
        self._cut_seq = 0  # _seq of the last truncate/reset
        self._inflight: list = []  # segments the flush thread is syncing right now
        self._last_checkpoint: dict | None = None
        self._cp_lock = (
            threading.Lock()
        )  # one checkpoint write at a time (see _checkpoint_unlocked)
        self._cp_seq = 0  # checkpoints written so far
        self._disk_ratio_fn = self._fs_disk_ratio
        self._disk_ratio_cache = (0.0, -1e9)
        try:
            self.recovery = self._recover()
            self._checkpoint(force=True)
        except BaseException:
            self._data.close()
            self._index.close()
            raise
        self._flusher = threading.Thread(
            target=self._flush_loop, name=f"rayledger-flush-{self.dir.name}", daemon=True
        )
        self._flusher.start()

    # -- recovery ---------------------------------------------------------------------
    # Four steps, each ending with what the next relies on: read the checkpoint (it names
    # what is committed and how far the files were consistent), scan the data from the
    # trusted prefix (every entry after it checked: CRCs, chain, index, position, term),
    # cut the tail after the last good entry (refusing to cut a committed one), and make
    # the index agree with the data.  Nothing is written before the refusals have passed.

    def _recover(self) -> RecoveryReport:
        """Find the valid prefix of the log, fix the index and the tail; see the module doc."""
        t0 = time.perf_counter()
        cp = self._read_checkpoint()
        self._base, self._base_term = cp.base, cp.base_term
        report = RecoveryReport()
        if not self._data.segments:
            self._open_without_data(cp)
        else:
            scan = self._scan(cp, report)
            self._refuse_losing_committed(scan, cp)
            self._cut_tail(scan, cp, report)
            self._reconcile_index(scan, report)
            self.committed_index = cp.committed
            if self.committed_index >= self.ledger_begin_index:
                u = self._unit_raw(self.committed_index)
                self.committed_pos = u.pos + u.size
        self._sync_all()
        self.flushed_pos, self.flushed_index = self._data.write_pos, self.ledger_end_index
        report.seconds = time.perf_counter() - t0
        if report.dropped_bytes or report.index_rebuilt_from is not None or report.padded:
            log.warning("%s: recovered %s", self.dir, report)
        else:
            log.info("%s: opened %s", self.dir, report)
        return report

    def _read_checkpoint(self) -> _Checkpoint:
        """The checkpoint's promises; a malformed one refuses the open (CORRUPT_LOG)."""
        cp = read_json(self.dir / CHECKPOINT) or {}
        try:
            base = tuple(int(v) for v in cp.get("base", (0, 0)))
            if len(base) != 2:
                raise ValueError(base)
            return _Checkpoint(
                base=base,  # type: ignore[arg-type]
                committed=int(cp.get("committed_index", -1)),
                end=int(cp.get("end_index", -1)),
                flushed_pos=int(cp.get("flushed_pos", -1)),
                flushed_index=int(cp.get("flushed_index", -2)),
                base_term=int(cp.get("base_term", -1)),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise _corrupt(f"{self.dir / CHECKPOINT}: malformed checkpoint {cp!r}") from exc

    def _open_without_data(self, cp: _Checkpoint) -> None:
        """No data files: an empty log at the checkpoint's base, unless it promised entries."""
        base = cp.base
        if cp.end >= base[0] or cp.committed >= base[0]:
            raise _corrupt(
                f"{self.dir}: the checkpoint says entries up to {cp.end} exist "
                f"(committed {cp.committed}), but there are no data files"
            )
        self._data.reset(base[1])
        self._index.reset(base[0] * INDEX_UNIT)
        self.ledger_begin_index = base[0]
        self.ledger_end_index = base[0] - 1
        self.ledger_end_term = cp.base_term
        self.committed_index = cp.committed
        self._chain = 0 if base[0] == 0 else None

    def _scan(self, cp: _Checkpoint, report: RecoveryReport) -> _Scan:
        """Every entry after the trusted prefix, checked; the scan stops at the first bad
        one.  Ensures: ``scan.positions`` are consecutive good entries ending at
        ``scan.end_index``; ``scan.bad_pos`` is where damage starts (None: none)."""
        data = self._data
        begin_index = self._first_index_in(data.segments[0])
        if begin_index is None:
            begin_index = cp.base[0]
        start_pos, start_index = cp.flushed_pos, cp.flushed_index + 1
        trust_prefix = (
            not self.config.verify_all_on_open
            and data.begin_pos <= start_pos <= data.write_pos
            and start_index > begin_index
            and self._index_trusted(begin_index, start_index - 1, start_pos)
        )
        scan = _Scan(begin_index=begin_index, expect_index=start_index)
        if trust_prefix:
            prev = self._unit_raw(start_index - 1)
            scan.term_floor = prev.term
            scan.chain = HEADER.unpack_from(data.read(prev.pos, HEADER_SIZE))[6]
        else:
            start_pos, scan.expect_index = data.begin_pos, begin_index
            scan.chain = 0 if begin_index == 0 else None
            report.full_scan = True
        report.scanned_from_pos = start_pos
        scan.chain0 = scan.chain
        self._walk(scan, start_pos)
        # The header's term is outside the CRCs; the index unit, when there, is a second copy.
        first = scan.expect_index - len(scan.positions)
        k = self._first_term_mismatch(first, scan.positions, scan.terms)
        if k is not None:
            scan.drop_from(k)
        report.scanned_entries = len(scan.positions)
        return scan

    def _walk(self, scan: _Scan, start_pos: int) -> None:
        """Check entries from ``start_pos`` segment by segment into ``scan`` (blank records
        and roll padding skipped), until the data ends or an entry is bad."""
        seg_size, segs = self._data.segment_size, self._data.segments
        seg_i = next((i for i, s in enumerate(segs) if s.start + seg_size > start_pos), len(segs))
        while seg_i < len(segs) and scan.bad_pos is None:
            seg = segs[seg_i]
            buf = seg.view()
            off = max(start_pos - seg.start, 0)
            while off < len(buf):
                if seg_size - off < HEADER_SIZE:
                    break  # too little room for any entry: the rest is padding
                blank = blank_size(buf, off)
                if blank is not None and off + blank <= seg_size:
                    off += blank
                    continue
                h = check_entry(buf, off, scan.chain)
                if (
                    h is None
                    or h.index != scan.expect_index
                    or h.pos != seg.start + off
                    or h.term < scan.term_floor
                ):
                    scan.bad_pos = seg.start + off
                    break
                scan.add(h)
                off += h.size
            if scan.bad_pos is None and len(buf) < seg_size and seg_i + 1 < len(segs):
                scan.to_pad.append(seg)  # a non-last segment that ends without its padding
            del buf
            seg_i += 1

    def _refuse_losing_committed(self, scan: _Scan, cp: _Checkpoint) -> None:
        """CORRUPT_LOG, files untouched, when cutting the damage would lose a committed entry."""
        if scan.bad_pos is not None and scan.expect_index <= cp.committed:
            raise _corrupt(
                f"{self.dir}: entry {scan.expect_index} at data position {scan.bad_pos} is "
                f"damaged, and entries up to {cp.committed} are committed; refusing to drop "
                "committed entries (the files are left as they are: restore this member from "
                "a healthy one)"
            )
        if scan.end_index < cp.committed:
            raise _corrupt(
                f"{self.dir}: the log ends at entry {scan.end_index} but entries up to "
                f"{cp.committed} are committed (data files lost?); refusing to open"
            )

    def _cut_tail(self, scan: _Scan, cp: _Checkpoint, report: RecoveryReport) -> None:
        """The data ends after the last good entry (torn or corrupt bytes and empty roll
        space dropped, torn rolls padded); the log's bounds and chain follow from the scan."""
        data, end_index = self._data, scan.end_index
        if scan.positions:
            end_term, end_pos = scan.terms[-1], scan.positions[-1] + scan.sizes[-1]
        elif end_index >= scan.begin_index:
            u = self._unit_raw(end_index)
            end_term, end_pos = u.term, u.pos + u.size
        else:
            end_term = cp.base_term if cp.base[0] == scan.begin_index else -1
            end_pos = cp.base[1] if cp.base[0] == scan.begin_index else data.begin_pos
            end_pos = min(max(end_pos, data.begin_pos), data.write_pos)
            self._base = (scan.begin_index, end_pos)
        if scan.bad_pos is not None:
            report.dropped_at_pos = scan.bad_pos
            report.dropped_bytes = data.write_pos - scan.bad_pos
            log.warning(
                "%s: cutting a torn or corrupt tail at position %d (entry %d on): %d bytes dropped",
                self.dir, scan.bad_pos, scan.expect_index, report.dropped_bytes,
            )  # fmt: skip
        if end_pos < data.write_pos:
            report.trimmed_bytes = data.write_pos - end_pos - report.dropped_bytes
            data.truncate(end_pos)
        for seg in scan.to_pad:
            if seg in data.segments[:-1]:
                data.pad_to_end(seg)
                report.padded += 1
                log.warning("%s: padded data segment %d (torn segment roll)", self.dir, seg.start)
        self.ledger_begin_index, self.ledger_end_index = scan.begin_index, end_index
        self.ledger_end_term = end_term
        if end_index >= scan.begin_index:
            self._chain = scan.chain
        else:
            self._chain = 0 if scan.begin_index == 0 else None

    def _reconcile_index(self, scan: _Scan, report: RecoveryReport) -> None:
        """The index describes exactly the entries the data holds: the scanned ones are
        rewritten when their units differ, and units past the end are cut."""
        index, end_index = self._index, scan.end_index
        first = end_index - len(scan.positions) + 1
        if scan.positions and not self._units_equal(first, scan.positions, scan.sizes, scan.terms):
            report.index_rebuilt_from = first
            if report.full_scan:
                index.reset(first * INDEX_UNIT)
            else:
                index.truncate(first * INDEX_UNIT)
            index.write_span(
                first * INDEX_UNIT, encode_index(scan.positions, scan.sizes, first, scan.terms)
            )
            log.warning("%s: index rebuilt from entry %d", self.dir, first)
        elif (
            not scan.positions
            and report.full_scan
            and not self._index_has(scan.begin_index * INDEX_UNIT)
        ):
            index.reset(scan.begin_index * INDEX_UNIT)
        index.truncate((end_index + 1) * INDEX_UNIT)

    def _first_term_mismatch(self, first: int, positions, terms) -> int | None:
        """First k whose index unit points at ``positions[k]`` but records another term."""
        ipos = first * INDEX_UNIT
        if not positions or ipos < self._index.begin_pos:
            return None
        n = min(len(positions), (self._index.write_pos - ipos) // INDEX_UNIT)
        if n <= 0:
            return None
        try:
            u = self._read_units(first, n)
        except LedgerError:
            return None
        bad = (
            (u["magic"] == ENTRY_MAGIC)
            & (u["index"] == np.arange(first, first + n, dtype=np.int64))
            & (u["pos"] == np.asarray(positions[:n], dtype=np.int64))
            & (u["term"] != np.asarray(terms[:n], dtype=np.int64))
        )
        return int(bad.argmax()) if bad.any() else None

    def _sync_all(self) -> None:
        try:
            for seg in self._data.take_dirty() + self._index.take_dirty():
                seg.sync()
            self._data.sync_dir()
            self._index.sync_dir()
        except OSError as exc:
            raise LedgerError.of(
                ResponseCode.DISK_ERROR, f"{self.dir}: fsync failed: {exc}"
            ) from exc

    def _index_has(self, ipos: int) -> bool:
        return self._index.begin_pos <= ipos <= self._index.write_pos

    def _first_index_in(self, seg) -> int | None:
        """Index of the first intact entry in a segment (after a leading blank hole), or None."""
        off = blank_size(seg.pread(0, 8), 0) or 0
        head = seg.pread(off, HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            return None
        size = HEADER.unpack_from(head)[1]
        if not HEADER_SIZE <= size <= self.config.max_entry_size + HEADER_SIZE:
            return None
        h = check_entry(seg.pread(off, size), 0, None)
        return None if h is None or h[4] != seg.start + off else h[2]

    def _index_trusted(self, first: int, last: int, next_pos: int) -> bool:
        """Do index units ``first..last`` describe a well-formed log ending before ``next_pos``?

        Checked vectorised, in chunks: magic, consecutive indexes, sizes,
        non-decreasing terms, and every position exactly where the previous
        entry's end puts it (DLedger's roll rule); the last unit must match the
        header of its data entry.  Any doubt means a full scan instead.
        """
        seg = self._data.segment_size
        max_size = self.config.max_entry_size + HEADER_SIZE
        prev_end = prev_term = None
        try:
            for lo in range(first, last + 1, _VERIFY_CHUNK):
                hi = min(last + 1, lo + _VERIFY_CHUNK)
                u = self._read_units(lo, hi - lo)
                pos = u["pos"].astype(np.int64)
                size = u["size"].astype(np.int64)
                term = u["term"].astype(np.int64)
                if not (
                    (u["magic"] == ENTRY_MAGIC).all()
                    and (u["index"] == np.arange(lo, hi, dtype=np.int64)).all()
                    and ((size >= HEADER_SIZE) & (size <= max_size)).all()
                    and (term >= 0).all()
                ):
                    return False
                if prev_end is not None:
                    pos_prev = np.concatenate(([prev_end], pos + size))[:-1]
                    term_prev = np.concatenate(([prev_term], term))[:-1]
                    want, nxt_pos, nxt_size = pos_prev, pos, size
                else:
                    pos_prev = (pos + size)[:-1]
                    term_prev = term[:-1]
                    want, nxt_pos, nxt_size = pos_prev, pos[1:], size[1:]
                    if pos[0] < self._data.begin_pos:
                        return False
                rolled = want // seg != (want + nxt_size - 1) // seg
                want = np.where(rolled, (want // seg + 1) * seg, want)
                if not (nxt_pos == want).all() or (term_prev > term[-len(term_prev) :]).any():
                    return False
                prev_end, prev_term = int(pos[-1] + size[-1]), int(term[-1])
            magic, pos, size, uidx, _term = self._unit_raw(last)
            h = HEADER.unpack_from(self._data.read(pos, HEADER_SIZE))
        except LedgerError:
            return False
        return (
            h[0] == ENTRY_MAGIC
            and h[2] == last
            and h[4] == pos
            and h[1] == size
            and pos + size <= next_pos
        )

    def _units_equal(self, first: int, positions, sizes, terms) -> bool:
        try:
            units = self._read_units(first, len(positions))
        except LedgerError:
            return False
        return (
            len(units) == len(positions)
            and (units["magic"] == ENTRY_MAGIC).all()
            and (units["index"] == np.arange(first, first + len(positions))).all()
            and units["pos"].tolist() == positions
            and units["size"].tolist() == sizes
            and units["term"].tolist() == terms
        )

    # -- durability -------------------------------------------------------------------
    def _checkpoint_doc(self) -> dict:
        return {
            "base": list(self._base),
            "base_term": self._base_term,
            "end_index": self.ledger_end_index,
            "committed_index": min(self.committed_index, self.flushed_index),
            "flushed_pos": self.flushed_pos,
            "flushed_index": self.flushed_index,
        }

    def _checkpoint(self, force: bool = False) -> None:
        """Write the checkpoint (atomically) if it changed; call with the lock held (a
        truncate, reset or compaction: what it changed must be on disk before it goes on)."""
        cp = self._checkpoint_doc()
        if force or cp != self._last_checkpoint:
            with self._cp_lock:
                self._cp_seq += 1
                atomic_write_json(self.dir / CHECKPOINT, cp)
                self._last_checkpoint = cp

    def _checkpoint_unlocked(self) -> None:
        """The flush thread's periodic checkpoint, written *without* the store lock.

        Its fsyncs can take hundreds of milliseconds while another process on the host
        writes a lot (a learner catching up at 100 MB/s: ext4 commits its journal with that
        data first) -- under the lock every append of this member waited for them.  The
        document is taken under the lock and written under ``_cp_lock`` only; a checkpoint
        written meanwhile under the lock (:meth:`_checkpoint`) is newer, and this one is
        then dropped instead of overwriting it."""
        with self._lock:
            if self._closed:
                return
            cp, seq = self._checkpoint_doc(), self._cp_seq
            if cp == self._last_checkpoint:
                return
        with self._cp_lock:
            if self._cp_seq != seq:
                return
            self._cp_seq += 1
            atomic_write_json(self.dir / CHECKPOINT, cp)
            self._last_checkpoint = cp

    def _flush_once(self) -> None:
        """fsync what was written; advance ``flushed_*`` unless a truncate overtook it."""
        with self._lock:
            dirty = self._data.take_dirty() + self._index.take_dirty()
            dirs = [sl for sl in (self._data, self._index) if sl.dir_dirty]
            seq = self._seq
            target = (self._data.write_pos, self.ledger_end_index)
            self._inflight = dirty
        try:
            for seg in dirty:
                try:
                    seg.sync()
                except OSError as exc:
                    if exc.errno != 9:  # EBADF: the segment was removed meanwhile
                        raise
            for sl in dirs:
                sl.sync_dir()
        except OSError as exc:
            with self._lock:
                self._failed = LedgerError.of(
                    ResponseCode.DISK_ERROR, f"{self.dir}: fsync failed: {exc}"
                )
                self._inflight = []
                self._flush_cv.notify_all()
            log.error("%s: flush failed, the store stops taking appends: %s", self.dir, exc)
            raise self._failed from exc
        with self._lock:
            self._inflight = []
            if self._cut_seq <= seq and seq > self._synced_seq:
                self._synced_seq = seq
                self.flushed_pos, self.flushed_index = target
            self._flush_cv.notify_all()

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000
        last_cp = time.monotonic()
        last_clean = last_cp
        while True:
            with self._lock:
                if not self._flush_requested and not self._closed:
                    self._flush_cv.wait(interval)
                self._flush_requested = False
                closed = self._closed
                idle = self._synced_seq == self._seq and not (
                    self._data.dir_dirty or self._index.dir_dirty
                )
            if closed:
                return
            try:
                if not idle and self._failed is None:
                    self._flush_once()
                now = time.monotonic()
                if now - last_cp >= self.config.checkpoint_interval_ms / 1000:
                    self._checkpoint_unlocked()
                    last_cp = now
                if now - last_clean >= 10:
                    self.clean()
                    last_clean = now
            except Exception:  # keep going; appends see a disk failure through _failed
                log.exception("%s: flush service error", self.dir)
                time.sleep(interval)

    def flush(self) -> None:
        """Block until everything written before the call is on disk (group commit)."""
        with self._lock:
            want = self._seq
            while self._synced_seq < want:
                if self._failed is not None:
                    raise LedgerError.of(self._failed.code, self._failed.message)
                if self._closed:
                    return
                self._flush_requested = True
                self._flush_cv.notify_all()
                self._flush_cv.wait(1.0)

    @property
    def durable_end_index(self) -> int:
        if self.config.sync_flush:
            return min(self.flushed_index, self.ledger_end_index)
        return self.ledger_end_index

    def after_append(self) -> None:
        if self.config.sync_flush and not self.defer_sync:
            self.flush()

    def after_truncate(self) -> None:
        dirty = self._data.take_dirty() + self._index.take_dirty() + self._inflight
        try:
            for seg in dirty:
                try:
                    seg.sync()
                except OSError as exc:
                    if exc.errno != 9:
                        raise
            self._data.sync_dir()
            self._index.sync_dir()
        except OSError as exc:
            self._failed = LedgerError.of(
                ResponseCode.DISK_ERROR, f"{self.dir}: fsync failed: {exc}"
            )
            raise self._failed from exc
        self._cut_seq = self._synced_seq = self._seq
        self.flushed_pos, self.flushed_index = self._data.write_pos, self.ledger_end_index
        self._checkpoint(force=True)
        self._flush_cv.notify_all()

    # -- space ------------------------------------------------------------------------
    @property
    def disk_ratio(self):
        """``() -> float``: how full the store's disk is (settable, e.g. by tests)."""
        return self._disk_ratio_fn

    @disk_ratio.setter
    def disk_ratio(self, fn) -> None:
        self._disk_ratio_fn = fn
        self._disk_ratio_cache = (0.0, -1e9)

    def _fs_disk_ratio(self) -> float:
        usage = shutil.disk_usage(self.dir)
        return (usage.total - usage.free) / usage.total if usage.total else 1.0

    def _cached_disk_ratio(self) -> float:
        ratio, at = self._disk_ratio_cache
        now = time.monotonic()
        if now - at > 0.1:
            ratio = self._disk_ratio_fn()
            self._disk_ratio_cache = (ratio, now)
        return ratio

    def check_disk(self) -> None:
        """Refuse appends (DISK_FULL) past ``disk_full_ratio``, after trying to clean."""
        if self._cached_disk_ratio() > self.config.disk_full_ratio:
            self.clean()
            ratio = self._cached_disk_ratio()
            if ratio > self.config.disk_full_ratio:
                raise LedgerError.of(
                    ResponseCode.DISK_FULL,
                    f"disk of {self.dir} is {ratio:.0%} used, over disk_full_ratio "
                    f"{self.config.disk_full_ratio:.0%}; appends are refused until space is freed",
                )

    def clean(self, now: float | None = None, compact: bool = False) -> int:
        """Delete old data segments (DLedger's CleanSpaceService); returns how many.

        A segment goes when every entry in it is committed and either it is older
        than ``file_reserved_hours`` (at the ``delete_when`` hour or when the disk
        is past ``disk_space_ratio_to_check_expired``) or the disk is past
        ``disk_space_ratio_to_force_clean`` -- or at once, whatever its age, with
        ``compact`` (an operator's compaction after a snapshot).  The last segment
        always stays, no segment holding an entry at or after ``keep_from`` (what this
        member's state machine still needs) goes, and index segments wholly below the
        new begin go along.  A segment whose successor was written since the last flush
        stays until the next clean: deleted, a power loss could leave no data file beside
        a checkpoint that promises committed entries.
        """
        now = time.time() if now is None else now
        cfg = self.config
        deleted = 0
        with self._lock:
            if self._closed:
                return 0
            self._disk_ratio_cache = (0.0, -1e9)
            ratio = self._cached_disk_ratio()
            time_ok = (
                time.localtime(now).tm_hour == cfg.delete_when
                or ratio > cfg.disk_space_ratio_to_check_expired
            )
            while len(self._data.segments) > 1:
                first, nxt = self._data.segments[0], self._data.segments[1]
                next_begin = self._first_index_in(nxt)
                if next_begin is None or next_begin - 1 > self.committed_index:
                    break
                if nxt.start >= self.flushed_pos:
                    break  # the next one is not on disk yet: a power loss would leave no log
                if self.keep_from is not None and next_begin > self.keep_from:
                    break  # its entries are still needed by this member's state machine
                expired = now - first.mtime > cfg.file_reserved_hours * 3600
                force = ratio > cfg.disk_space_ratio_to_force_clean
                if not ((expired and time_ok) or force or compact):
                    break
                self._data.delete_segment_front()
                self.ledger_begin_index = next_begin
                deleted += 1
                log.info(
                    "%s: deleted data segment %d (expired=%s force=%s, disk %.0f%%)",
                    self.dir,
                    first.start,
                    expired,
                    force,
                    ratio * 100,
                )
                if force:
                    self._disk_ratio_cache = (0.0, -1e9)
                    ratio = self._cached_disk_ratio()
            iseg = self._index.segment_size
            while (
                len(self._index.segments) > 1
                and self._index.segments[0].start + iseg <= self.ledger_begin_index * INDEX_UNIT
            ):
                self._index.delete_segment_front()
            if deleted:
                self._checkpoint(force=True)
                for watcher in self._watchers.values():
                    watcher.compacted(self.ledger_begin_index)
        return deleted

    def disk_bytes(self) -> int:
        return self._data.disk_bytes() + self._index.disk_bytes()

    def close(self) -> None:
        """Stop the flush service, flush, checkpoint and close the files (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._flush_cv.notify_all()
        self._flusher.join(timeout=10)
        with self._lock:
            try:
                if self._failed is None:
                    self._flush_once()
                    self._checkpoint()
            finally:
                self._data.close()
                self._index.close()

    def abandon(self) -> AbandonedAt:
        """Drop the store as a process crash would: stop the flush thread with no final
        flush or checkpoint and close the files.  Bytes already written stay (they are in
        the page cache, as after a kill); what fdatasync made durable is reported, so a
        power-loss simulation can cut the files back to it."""
        with self._lock:
            self._closed = True  # parks the flush thread for good, without its final flush
            self._flush_cv.notify_all()
            at = AbandonedAt(
                durable=(self.flushed_pos, (self.flushed_index + 1) * INDEX_UNIT),
                written=(self._data.write_pos, self._index.write_pos),
            )
        self._flusher.join(timeout=10)
        self._data.close()
        self._index.close()
        return at


@dataclass(frozen=True)
class AbandonedAt:
    """Where an abandoned store's (data, index) files end: fdatasync'ed, and written."""

    durable: tuple[int, int]
    written: tuple[int, int]


def open_store(config: StoreConfig) -> LogStore:
    """A FileStore when ``config.data_dir`` is set, else a MemoryStore."""
    return FileStore(config) if config.data_dir else MemoryStore(config)
