"""DLedgerMmapFileStore: the log on disk, with flush service, checkpoint and recovery.

Layout under ``data_dir``: ``data/`` and ``index/`` segment files named by their
start offset, and ``checkpoint`` (JSON, written atomically).  The checkpoint
records how far data and index were flushed and consistent, so reopening only
re-verifies what was written after it; anything after the last good entry (a
torn write, flipped bytes) is cut off and reported, unless it is committed, in
which case opening fails loudly rather than lose an acknowledged entry.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .codec import HEADER, HEADER_SIZE, INDEX_UNIT, blank_size, check_entry, decode_index, encode_index
from .config import StoreConfig
from .errors import LedgerError, ResponseCode
from .metafile import atomic_write_json, read_json
from .segments import SegmentList
from .store import LogStore

log = logging.getLogger("rayledger.storage")

CHECKPOINT = "checkpoint"


@dataclass
class RecoveryReport:
    """What opening the store found; ``dropped_bytes`` > 0 means a tail was cut."""

    scanned_from_pos: int = 0
    scanned_entries: int = 0
    full_scan: bool = False
    dropped_bytes: int = 0
    dropped_at_pos: int | None = None
    index_rebuilt_from: int | None = None
    seconds: float = 0.0


class FileStore(LogStore):
    def __init__(self, config: StoreConfig):
        if not config.data_dir:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "FileStore needs config.data_dir")
        self.dir = Path(config.data_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".writable"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise LedgerError.of(ResponseCode.DISK_ERROR, f"store dir {self.dir} is not writable: {exc}") from exc
        super().__init__(
            config,
            SegmentList(config.data_segment_size, self.dir / "data"),
            SegmentList(config.index_segment_size, self.dir / "index"),
        )
        self.flushed_pos = 0
        self.flushed_index = -1
        self._base = (0, 0)  # (index, pos) where the log began after its last reset
        self._flush_cv = threading.Condition(self._lock)
        self._flush_requested = False
        self._closed = False
        self._last_checkpoint: dict | None = None
        self._disk_ratio_cache = (0.0, -1e9)
        self.disk_ratio = self._fs_disk_ratio  # overridable (tests)
        self.recovery = self._recover()
        self._checkpoint(force=True)
        self._flusher = threading.Thread(target=self._flush_loop, name=f"rayledger-flush-{self.dir.name}", daemon=True)
        self._flusher.start()

    # -- recovery ---------------------------------------------------------------------
    def _recover(self) -> RecoveryReport:
        t0 = time.perf_counter()
        cp = read_json(self.dir / CHECKPOINT) or {}
        self._base = tuple(cp.get("base", (0, 0)))
        cp_committed = int(cp.get("committed_index", -1))
        report = RecoveryReport()
        data, index = self._data, self._index
        if not data.segments:
            if cp.get("end_index", -1) >= self._base[0]:
                raise LedgerError.of(
                    ResponseCode.CORRUPT_LOG,
                    f"{self.dir}: the checkpoint says entries up to {cp['end_index']} exist, but there are no data files",
                )
            data.reset(self._base[1])
            index.reset(self._base[0] * INDEX_UNIT)
            self.ledger_begin_index = self._base[0]
            self.ledger_end_index = self._base[0] - 1
            self.flushed_pos, self.flushed_index = data.write_pos, self.ledger_end_index
            self._chain = 0 if self._base == (0, 0) else None
            report.seconds = time.perf_counter() - t0
            return report

        begin_index = self._first_index_in(data.segments[0])
        if begin_index is None:
            begin_index = self._base[0]
        start_pos = int(cp.get("flushed_pos", -1))
        start_index = int(cp.get("flushed_index", -2)) + 1
        trust_prefix = (
            not self.config.verify_all_on_open
            and start_pos >= data.begin_pos
            and start_index > begin_index
            and self._index_covers(begin_index, start_index - 1)
            and self._unit_matches(start_index - 1, start_pos)
        )
        if not trust_prefix:
            start_pos = data.begin_pos
            start_index = begin_index
            report.full_scan = True
        report.scanned_from_pos = start_pos

        # Walk the data from start_pos, checking every entry.
        positions, sizes, terms = [], [], []
        chain = None
        if trust_prefix:
            _m, ppos, _s, _i, _t = self._unit_raw(start_index - 1)
            chain = HEADER.unpack_from(data.read(ppos, HEADER_SIZE))[6]
        bad_pos = None
        expect_index = start_index
        last_header = None
        seg_i = next(i for i, s in enumerate(data.segments) if s.start + data.segment_size > start_pos)
        pos = max(start_pos, data.segments[seg_i].start)
        seg_size = data.segment_size
        while seg_i < len(data.segments) and bad_pos is None:
            seg = data.segments[seg_i]
            buf = seg.view()
            off = max(pos - seg.start, 0)
            while off < len(buf):
                if seg_size - off < HEADER_SIZE:
                    break  # too little room for any entry: the rest is padding
                blank = blank_size(buf, off)
                if blank is not None and off + blank <= seg_size:
                    off += blank
                    continue
                h = check_entry(buf, off, chain)
                if h is None or h[2] != expect_index or h[4] != seg.start + off:
                    bad_pos = seg.start + off
                    break
                positions.append(h[4])
                sizes.append(h[1])
                terms.append(h[3])
                chain = h[6]
                last_header = h
                expect_index += 1
                off += h[1]
            seg_i += 1
        report.scanned_entries = len(positions)

        if bad_pos is not None:
            if expect_index <= cp_committed:
                raise LedgerError.of(
                    ResponseCode.CORRUPT_LOG,
                    f"{self.dir}: entry {expect_index} at position {bad_pos} is damaged, and entries up to "
                    f"{cp_committed} are committed; refusing to drop committed entries (restore this member "
                    f"from a healthy one)",
                )
            report.dropped_at_pos = bad_pos
            report.dropped_bytes = data.write_pos - bad_pos
            data.truncate(bad_pos)
            log.warning(
                "%s: cut a torn or corrupt tail at position %d (entry %d on): %d bytes dropped",
                self.dir, bad_pos, expect_index, report.dropped_bytes,
            )

        end_index = expect_index - 1
        if last_header is not None:
            end_term = last_header[3]
        elif end_index >= begin_index:
            end_term = self._unit_raw(end_index)[4]
        else:
            end_term = -1
        self.ledger_begin_index = begin_index
        self.ledger_end_index = end_index
        self.ledger_end_term = end_term
        if end_index >= begin_index:
            self._chain = chain
        else:
            self._chain = 0 if begin_index == 0 else None

        # Make the index agree with what the data holds.
        if positions and not self._units_equal(start_index, positions, sizes, terms):
            report.index_rebuilt_from = start_index
            if report.full_scan:
                index.reset(start_index * INDEX_UNIT)
            else:
                index.truncate(start_index * INDEX_UNIT)
            units = encode_index(positions, sizes, start_index, terms)
            self._write_units(start_index, units)
            log.warning("%s: index rebuilt from entry %d", self.dir, start_index)
        if not positions and report.full_scan:
            index.reset(begin_index * INDEX_UNIT)
        index.truncate((end_index + 1) * INDEX_UNIT)
        self.committed_index = min(cp_committed, end_index)
        if self.committed_index >= self.ledger_begin_index:
            _m, p, s, _i, _t = self._unit_raw(self.committed_index)
            self.committed_pos = p + s
        data.take_dirty()
        index.take_dirty()
        for seg in data.segments[-1:] + index.segments[-1:]:
            seg.sync()
        self.flushed_pos, self.flushed_index = data.write_pos, self.ledger_end_index
        report.seconds = time.perf_counter() - t0
        if report.dropped_bytes or report.index_rebuilt_from is not None:
            log.warning("%s: recovered %s", self.dir, report)
        return report

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

    def _unit_raw(self, index: int):
        from .codec import INDEX

        return INDEX.unpack(self._index.read(index * INDEX_UNIT, INDEX_UNIT))

    def _index_covers(self, first: int, last: int) -> bool:
        if last < first:
            return True
        try:
            self._unit_raw(first)
            self._unit_raw(last)
            return True
        except LedgerError:
            return False

    def _unit_matches(self, index: int, next_pos: int) -> bool:
        """Does the index unit of ``index`` point at a real entry that ends where ``next_pos`` says?"""
        try:
            magic, pos, size, uidx, _term = self._unit_raw(index)
            h = HEADER.unpack_from(self._data.read(pos, HEADER_SIZE))
        except (LedgerError, Exception):
            return False
        if h[2] != index or h[4] != pos or h[1] != size or uidx != index:
            return False
        return self._data.position_for(pos + size, 1) <= next_pos or pos + size == next_pos

    def _units_equal(self, first: int, positions, sizes, terms) -> bool:
        try:
            units = self._read_units_raw(first, len(positions))
        except LedgerError:
            return False
        return (
            len(units) == len(positions)
            and (units["index"] == range(first, first + len(positions))).all()
            and units["pos"].tolist() == positions
            and units["size"].tolist() == sizes
            and units["term"].tolist() == terms
        )

    def _read_units_raw(self, first: int, n: int):
        chunks, pos, remaining, seg_size = [], first * INDEX_UNIT, n * INDEX_UNIT, self._index.segment_size
        while remaining:
            take = min(remaining, seg_size - pos % seg_size)
            chunks.append(self._index.read(pos, take))
            pos += take
            remaining -= take
        return decode_index(b"".join(chunks))

    def _write_units(self, first: int, units: bytes) -> None:
        ipos, iseg, uoff = first * INDEX_UNIT, self._index.segment_size, 0
        while uoff < len(units):
            take = min(len(units) - uoff, iseg - (ipos + uoff) % iseg)
            self._index.write_at(ipos + uoff, units[uoff : uoff + take])
            uoff += take

    # -- durability -------------------------------------------------------------------
    def _checkpoint(self, force: bool = False) -> None:
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
        with self._lock:
            dirty = self._data.take_dirty() + self._index.take_dirty()
            target = (self._data.write_pos, self.ledger_end_index)
        for seg in dirty:
            try:
                seg.sync()
            except OSError as exc:
                if exc.errno != 9:  # EBADF: the segment was removed meanwhile
                    log.error("%s: flush failed: %s", self.dir, exc)
                    raise
        with self._lock:
            if target[1] <= self.ledger_end_index:
                self.flushed_pos, self.flushed_index = target
            else:  # truncated meanwhile
                self.flushed_pos, self.flushed_index = self._data.write_pos, self.ledger_end_index
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
            try:
                self._flush_once()
                now = time.monotonic()
                if now - last_cp >= self.config.checkpoint_interval_ms / 1000 or closed:
                    with self._lock:
                        self._checkpoint()
                    last_cp = now
                if now - last_clean >= 10 and not closed:
                    self.clean()
                    last_clean = now
            except Exception:  # keep flushing; the next append sees the error through check_disk
                log.exception("%s: flush service error", self.dir)
            if closed:
                return

    def flush(self) -> None:
        with self._lock:
            want = self.ledger_end_index
            if self.flushed_index >= want and not self._data._dirty and not self._index._dirty:
                return
            self._flush_requested = True
            self._flush_cv.notify_all()
            while self.flushed_index < want and not self._closed:
                self._flush_cv.wait(1.0)
                if self.flushed_index < want:
                    self._flush_requested = True
                    self._flush_cv.notify_all()
        if self._data._dirty or self._index._dirty:
            self._flush_once()

    def after_append(self) -> None:
        if self.config.sync_flush:
            self.flush()

    def after_truncate(self, base: tuple[int, int] | None = None) -> None:
        if base is not None:
            self._base = base
        for seg in self._data.take_dirty() + self._index.take_dirty():
            seg.sync()
        self.flushed_pos, self.flushed_index = self._data.write_pos, self.ledger_end_index
        self._checkpoint(force=True)

    # -- space ------------------------------------------------------------------------
    def _fs_disk_ratio(self) -> float:
        usage = shutil.disk_usage(self.dir)
        return (usage.total - usage.free) / usage.total if usage.total else 1.0

    def _cached_disk_ratio(self) -> float:
        ratio, at = self._disk_ratio_cache
        now = time.monotonic()
        if now - at > 0.1:
            ratio = self.disk_ratio()
            self._disk_ratio_cache = (ratio, now)
        return ratio

    def check_disk(self) -> None:
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
        ``disk_space_ratio_to_force_clean``.  The last segment always stays.
        """
        now = time.time() if now is None else now
        cfg = self.config
        deleted = 0
        with self._lock:
            self._disk_ratio_cache = (0.0, -1e9)
            ratio = self._cached_disk_ratio()
            time_ok = time.localtime(now).tm_hour == cfg.delete_when or ratio > cfg.disk_space_ratio_to_check_expired
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
                log.info("%s: deleted data segment %d (expired=%s force=%s)", self.dir, first.start, expired, force)
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
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._flush_cv.notify_all()
        self._flusher.join(timeout=10)
        with self._lock:
            self._flush_once()
            self._checkpoint()
        super().close()


def open_store(config: StoreConfig) -> LogStore:
    """A FileStore when ``config.data_dir`` is set, else a MemoryStore."""
    from .store import MemoryStore

    return FileStore(config) if config.data_dir else MemoryStore(config)


def data_dir_size(path: str | os.PathLike) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
