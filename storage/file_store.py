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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .codec import (
    ENTRY_MAGIC,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    blank_size,
    check_entry,
    encode_index,
)
from .config import StoreConfig
from .errors import LedgerError, ResponseCode
from .metafile import atomic_write_json, ensure_writable_dir, read_json
from .segments import SegmentList
from .store import LogStore

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
    seconds: float = 0.0


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
    def _recover(self) -> RecoveryReport:
        """Find the valid prefix of the log, fix the index and the tail; see the module doc.

        Nothing is written before every check that can refuse the files has passed.
        """
        t0 = time.perf_counter()
        cp = read_json(self.dir / CHECKPOINT) or {}
        try:
            base = tuple(int(v) for v in cp.get("base", (0, 0)))
            cp_committed = int(cp.get("committed_index", -1))
            cp_end = int(cp.get("end_index", -1))
            cp_flushed_pos = int(cp.get("flushed_pos", -1))
            cp_flushed_index = int(cp.get("flushed_index", -2))
            if len(base) != 2:
                raise ValueError(base)
        except (TypeError, ValueError, AttributeError) as exc:
            raise _corrupt(f"{self.dir / CHECKPOINT}: malformed checkpoint {cp!r}") from exc
        self._base = base
        report = RecoveryReport()
        data, index = self._data, self._index
        if not data.segments:
            if cp_end >= base[0] or cp_committed >= base[0]:
                raise _corrupt(
                    f"{self.dir}: the checkpoint says entries up to {cp_end} exist "
                    f"(committed {cp_committed}), but there are no data files"
                )
            data.reset(base[1])
            index.reset(base[0] * INDEX_UNIT)
            self.ledger_begin_index = base[0]
            self.ledger_end_index = base[0] - 1
            self.committed_index = cp_committed
            self._chain = 0 if base[0] == 0 else None
            self._sync_all()
            self.flushed_pos, self.flushed_index = data.write_pos, self.ledger_end_index
            report.seconds = time.perf_counter() - t0
            return report

        begin_index = self._first_index_in(data.segments[0])
        if begin_index is None:
            begin_index = base[0]
        start_pos = cp_flushed_pos
        start_index = cp_flushed_index + 1
        trust_prefix = (
            not self.config.verify_all_on_open
            and data.begin_pos <= start_pos <= data.write_pos
            and start_index > begin_index
            and self._index_trusted(begin_index, start_index - 1, start_pos)
        )
        if not trust_prefix:
            start_pos = data.begin_pos
            start_index = begin_index
            report.full_scan = True
        report.scanned_from_pos = start_pos

        # Walk the data from start_pos, checking every entry.
        positions: list[int] = []
        sizes: list[int] = []
        terms: list[int] = []
        chains: list[int] = []
        chain = None
        term_floor = -1
        if trust_prefix:
            _m, ppos, _s, _i, term_floor = self._unit_raw(start_index - 1)
            chain = HEADER.unpack_from(data.read(ppos, HEADER_SIZE))[6]
        elif begin_index == 0:
            chain = 0
        chain0 = chain
        bad_pos = None
        expect_index = start_index
        seg_size = data.segment_size
        segs = data.segments
        to_pad = []  # non-last segments that end early without their roll padding
        seg_i = next((i for i, s in enumerate(segs) if s.start + seg_size > start_pos), len(segs))
        while seg_i < len(segs) and bad_pos is None:
            seg = segs[seg_i]
            buf = seg.view()
            off = max(start_pos - seg.start, 0)
            while off < len(buf):
                if seg_size - off < HEADER_SIZE:
                    off = len(buf)
                    break  # too little room for any entry: the rest is padding
                blank = blank_size(buf, off)
                if blank is not None and off + blank <= seg_size:
                    off += blank
                    continue
                h = check_entry(buf, off, chain)
                if (
                    h is None
                    or h[2] != expect_index
                    or h[4] != seg.start + off
                    or h[3] < term_floor
                ):
                    bad_pos = seg.start + off
                    break
                positions.append(h[4])
                sizes.append(h[1])
                terms.append(h[3])
                chain = h[6]
                chains.append(chain)
                term_floor = h[3]
                expect_index += 1
                off += h[1]
            if bad_pos is None and len(buf) < seg_size and seg_i + 1 < len(segs):
                to_pad.append(seg)
            del buf
            seg_i += 1
        # The header's term is outside the CRCs; the index unit, when there, is a second copy.
        k = self._first_term_mismatch(expect_index - len(positions), positions, terms)
        if k is not None:
            bad_pos = positions[k]
            expect_index -= len(positions) - k
            del positions[k:], sizes[k:], terms[k:], chains[k:]
            chain = chains[-1] if chains else chain0
            to_pad = [sg for sg in to_pad if sg.start < bad_pos]
        report.scanned_entries = len(positions)
        end_index = expect_index - 1

        # Refuse, before touching anything, to lose a committed entry.
        if bad_pos is not None and expect_index <= cp_committed:
            raise _corrupt(
                f"{self.dir}: entry {expect_index} at data position {bad_pos} is damaged, and "
                f"entries up to {cp_committed} are committed; refusing to drop committed entries "
                f"(the files are left as they are: restore this member from a healthy one)"
            )
        if end_index < cp_committed:
            raise _corrupt(
                f"{self.dir}: the log ends at entry {end_index} but entries up to {cp_committed} "
                f"are committed (data files lost?); refusing to open"
            )

        if positions:
            end_term = terms[-1]
            end_pos = positions[-1] + sizes[-1]
        elif end_index >= begin_index:
            _m, p, s, _i, end_term = self._unit_raw(end_index)
            end_pos = p + s
        else:
            end_term = -1
            end_pos = base[1] if base[0] == begin_index else data.begin_pos
            end_pos = min(max(end_pos, data.begin_pos), data.write_pos)
            self._base = (begin_index, end_pos)

        if bad_pos is not None:
            report.dropped_at_pos = bad_pos
            report.dropped_bytes = data.write_pos - bad_pos
            log.warning(
                "%s: cutting a torn or corrupt tail at position %d (entry %d on): %d bytes dropped",
                self.dir,
                bad_pos,
                expect_index,
                report.dropped_bytes,
            )
        if end_pos < data.write_pos:
            report.trimmed_bytes = data.write_pos - end_pos - report.dropped_bytes
            data.truncate(end_pos)
        for seg in to_pad:
            if seg in data.segments[:-1]:
                data.pad_to_end(seg)
                log.warning("%s: padded data segment %d (torn segment roll)", self.dir, seg.start)

        self.ledger_begin_index = begin_index
        self.ledger_end_index = end_index
        self.ledger_end_term = end_term
        if end_index >= begin_index:
            self._chain = chain
        else:
            self._chain = 0 if begin_index == 0 else None

        # Make the index agree with what the data holds.
        first_scanned = end_index - len(positions) + 1
        if positions and not self._units_equal(first_scanned, positions, sizes, terms):
            report.index_rebuilt_from = first_scanned
            if report.full_scan:
                index.reset(first_scanned * INDEX_UNIT)
            else:
                index.truncate(first_scanned * INDEX_UNIT)
            self._index.write_span(
                first_scanned * INDEX_UNIT, encode_index(positions, sizes, first_scanned, terms)
            )
            log.warning("%s: index rebuilt from entry %d", self.dir, first_scanned)
        elif not positions and report.full_scan and not self._index_has(begin_index * INDEX_UNIT):
            index.reset(begin_index * INDEX_UNIT)
        index.truncate((end_index + 1) * INDEX_UNIT)
        self.committed_index = cp_committed
        if self.committed_index >= self.ledger_begin_index:
            _m, p, s, _i, _t = self._unit_raw(self.committed_index)
            self.committed_pos = p + s
        self._sync_all()
        self.flushed_pos, self.flushed_index = data.write_pos, self.ledger_end_index
        report.seconds = time.perf_counter() - t0
        if report.dropped_bytes or report.index_rebuilt_from is not None or to_pad:
            log.warning("%s: recovered %s", self.dir, report)
        else:
            log.info("%s: opened %s", self.dir, report)
        return report

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
    def _checkpoint(self, force: bool = False) -> None:
        """Write the checkpoint (atomically) if it changed; call with the lock held."""
        cp = {
            "base": list(self._base),
            "end_index": self.ledger_end_index,
            "committed_index": min(self.committed_index, self.flushed_index),
            "flushed_pos": self.flushed_pos,
            "flushed_index": self.flushed_index,
        }
        if force or cp != self._last_checkpoint:
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
                    with self._lock:
                        if not self._closed:
                            self._checkpoint()
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

    def clean(self, now: float | None = None) -> int:
        """Delete old data segments (DLedger's CleanSpaceService); returns how many.

        A segment goes when every entry in it is committed and either it is older
        than ``file_reserved_hours`` (at the ``delete_when`` hour or when the disk
        is past ``disk_space_ratio_to_check_expired``) or the disk is past
        ``disk_space_ratio_to_force_clean``.  The last segment always stays, and
        index segments wholly below the new begin go along.
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
                expired = now - first.mtime > cfg.file_reserved_hours * 3600
                force = ratio > cfg.disk_space_ratio_to_force_clean
                if not ((expired and time_ok) or force):
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


def open_store(config: StoreConfig) -> LogStore:
    """A FileStore when ``config.data_dir`` is set, else a MemoryStore."""
    from .store import MemoryStore

    return FileStore(config) if config.data_dir else MemoryStore(config)
