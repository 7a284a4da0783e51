"""DLedger's MmapFileList: a log addressed by absolute byte position, cut into segments.

Segment ``k`` covers ``[k * size, (k + 1) * size)`` and its file is named by its
start offset (20 digits), as DLedger names them.  A write that does not fit the
rest of the current segment is moved to the next one and the gap is padded with
a blank record, so positions are the same on every member that uses the same
segment size.  Segments are files on disk or bytearrays in memory behind the
same small interface, so the file and memory stores share every line of logic.

File segments are written with ``pwrite`` and read through a read-only mmap of
the part written so far (remapped lazily as the file grows, dropped before any
truncation so a reader never touches pages past the end of the file).
"""

from __future__ import annotations

import bisect
import errno
import mmap
import os
from itertools import accumulate
from pathlib import Path

from .codec import blank_record
from .errors import LedgerError, ResponseCode

_REMAP_MIN_GROWTH = 1 << 20  # remap an active segment once it grew this much past its map


def _disk_error(exc: OSError, what: str) -> LedgerError:
    code = (
        ResponseCode.DISK_FULL
        if exc.errno in (errno.ENOSPC, errno.EDQUOT)
        else ResponseCode.DISK_ERROR
    )
    return LedgerError.of(code, f"{what}: {exc}")


class MemorySegment:
    """A segment kept in a bytearray."""

    __slots__ = ("start", "buf")

    def __init__(self, start: int):
        self.start = start
        self.buf = bytearray()

    @property
    def length(self) -> int:
        return len(self.buf)

    def write(self, data) -> None:
        self.buf += data

    def pread(self, offset: int, n: int) -> bytes:
        return bytes(memoryview(self.buf)[offset : offset + n])

    def view(self):
        return memoryview(self.buf)

    def truncate(self, length: int) -> None:
        del self.buf[length:]

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def remove(self) -> None:
        self.buf = bytearray()

    @property
    def mtime(self) -> float:
        return 0.0


class FileSegment:
    """A segment file: ``length`` is the number of bytes written (the file size)."""

    __slots__ = ("start", "path", "fd", "length", "_mm", "_mm_len")

    def __init__(self, start: int, path: Path):
        self.start = start
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.length = os.fstat(self.fd).st_size
        self._mm: mmap.mmap | None = None
        self._mm_len = 0

    def write(self, data) -> None:
        """Append ``data``; on failure the file is cut back to its old length."""
        view = memoryview(data)
        off = self.length
        try:
            while view:
                n = os.pwrite(self.fd, view, off)
                off += n
                view = view[n:]
        except OSError:
            try:  # a failed pwrite may still have put bytes in the file
                os.ftruncate(self.fd, self.length)
            except OSError:
                pass
            raise
        self.length = off

    def _remap(self) -> None:
        self._unmap()
        if self.length:
            self._mm = mmap.mmap(self.fd, self.length, access=mmap.ACCESS_READ)
            self._mm_len = self.length

    def _unmap(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
            self._mm_len = 0

    def pread(self, offset: int, n: int) -> bytes:
        end = offset + n
        if end <= self._mm_len:
            return self._mm[offset:end]
        if end <= self.length and (
            not self._mm_len or self.length - self._mm_len >= _REMAP_MIN_GROWTH
        ):
            self._remap()
            if end <= self._mm_len:
                return self._mm[offset:end]
        return os.pread(self.fd, n, offset)

    def view(self):
        """The whole segment, zero-copy (a read-only mmap of its own)."""
        if not self.length:
            return b""
        return mmap.mmap(self.fd, self.length, access=mmap.ACCESS_READ)

    def truncate(self, length: int) -> None:
        if length < self._mm_len:
            self._unmap()
        os.ftruncate(self.fd, length)
        self.length = length

    def sync(self) -> None:
        fd = self.fd
        if fd >= 0:  # a closed (removed) segment has nothing left to sync
            os.fdatasync(fd)

    def close(self) -> None:
        self._unmap()
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.fd = -1

    def remove(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def mtime(self) -> float:
        return os.stat(self.path).st_mtime


class SegmentList:
    """Segments of one log (data or index); ``write_pos`` is where the next byte goes."""

    def __init__(self, segment_size: int, directory: str | os.PathLike | None):
        self.segment_size = segment_size
        self.directory = Path(directory) if directory is not None else None
        self.segments: list = []
        self._starts: list[int] = []
        self._dirty: dict[int, object] = {}
        self.dir_dirty = False  # a segment file was created or removed since the last sync
        self._empty_pos = 0  # where the log ends while it has no segment
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                for name in sorted(os.listdir(self.directory)):
                    if name.isdigit() and len(name) == 20:
                        start = int(name)
                        if start % segment_size:
                            raise LedgerError.of(
                                ResponseCode.CORRUPT_LOG,
                                f"segment {self.directory / name} is not aligned to the segment "
                                f"size {segment_size}; was the store written with another size?",
                            )
                        self._add(start)
            except BaseException:
                self.close()
                raise
            self.dir_dirty = False

    # -- layout -------------------------------------------------------------------
    def _add(self, start: int):
        seg = (
            MemorySegment(start)
            if self.directory is None
            else FileSegment(start, self.directory / f"{start:020d}")
        )
        self.segments.append(seg)
        self._starts.append(start)
        self.dir_dirty = True
        return seg

    @property
    def begin_pos(self) -> int:
        return self._starts[0] if self.segments else self._empty_pos

    @property
    def write_pos(self) -> int:
        if not self.segments:
            return self._empty_pos
        last = self.segments[-1]
        return last.start + last.length

    def positions_for(self, sizes) -> list[int]:
        """Where each of consecutive items of ``sizes`` lands after the current end."""
        pos = self.write_pos
        seg = self.segment_size
        total = sum(sizes)
        if total and pos // seg == (pos + total - 1) // seg:  # all in the current segment
            out = list(accumulate(sizes, initial=pos))
            out.pop()
            return out
        out = []
        append = out.append
        for size in sizes:
            if pos // seg != (pos + size - 1) // seg:
                pos = (pos // seg + 1) * seg
            append(pos)
            pos += size
        return out

    # -- writes ---------------------------------------------------------------------
    def write_at(self, pos: int, data) -> None:
        """Append ``data`` at ``pos`` (>= write_pos): pads and rolls segments as needed."""
        seg_size = self.segment_size
        end = self.write_pos
        if pos < end:
            raise LedgerError.of(
                ResponseCode.INTERNAL_ERROR, f"write at {pos} below write position {end}"
            )
        start = pos - pos % seg_size
        if pos // seg_size != (pos + len(data) - 1) // seg_size:
            raise LedgerError.of(
                ResponseCode.INTERNAL_ERROR, f"write at {pos} of {len(data)} crosses a segment"
            )
        try:
            if not self.segments or self.segments[-1].start != start:
                if self.segments:
                    last = self.segments[-1]
                    if start < last.start + seg_size:
                        raise LedgerError.of(
                            ResponseCode.INTERNAL_ERROR, f"segment for {pos} overlaps"
                        )
                    if last.length < seg_size:
                        last.write(blank_record(seg_size - last.length))
                        self._dirty[id(last)] = last
                seg = self._add(start)
            else:
                seg = self.segments[-1]
            if pos > seg.start + seg.length:
                seg.write(blank_record(pos - seg.start - seg.length))
            seg.write(data)
            self._dirty[id(seg)] = seg
        except OSError as exc:
            raise _disk_error(exc, f"cannot write at position {pos}") from exc

    def read(self, pos: int, size: int) -> bytes:
        """``size`` bytes at ``pos``, which must lie within one segment."""
        i = bisect.bisect_right(self._starts, pos) - 1
        if i >= 0:
            seg = self.segments[i]
            if pos + size <= seg.start + seg.length:
                return seg.pread(pos - seg.start, size)
        raise LedgerError.of(ResponseCode.INDEX_OUT_OF_BOUNDS, f"no data at position {pos}+{size}")

    def read_span(self, pos: int, size: int) -> bytes:
        """``size`` bytes at ``pos``, across segment boundaries (fixed-size units, no padding)."""
        seg = self.segment_size
        chunks = []
        while size:
            take = min(size, seg - pos % seg)
            chunks.append(self.read(pos, take))
            pos += take
            size -= take
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def write_span(self, pos: int, data) -> None:
        """Append ``data`` at ``pos``, split at segment boundaries (fixed-size units, no padding)."""
        seg = self.segment_size
        view = memoryview(data)
        off = 0
        while off < len(view):
            take = min(len(view) - off, seg - (pos + off) % seg)
            self.write_at(pos + off, view[off : off + take])
            off += take

    def truncate(self, pos: int) -> None:
        """Drop every byte at and after ``pos``."""
        try:
            while self.segments and self.segments[-1].start >= pos:
                seg = self.segments.pop()
                self._starts.pop()
                self._dirty.pop(id(seg), None)
                seg.remove()
                self.dir_dirty = True
            if self.segments:
                last = self.segments[-1]
                if pos < last.start + last.length:
                    last.truncate(pos - last.start)
                    self._dirty[id(last)] = last
            else:
                self._empty_pos = pos
        except OSError as exc:
            raise _disk_error(exc, f"cannot truncate at {pos}") from exc

    def reset(self, pos: int) -> None:
        """Remove everything; the log then starts (and ends) at ``pos``."""
        self.truncate(0)
        self._empty_pos = pos
        start = pos - pos % self.segment_size
        if pos > start:
            try:
                seg = self._add(start)
                seg.write(blank_record(pos - start))
            except OSError as exc:
                raise _disk_error(exc, f"cannot reset to {pos}") from exc
            self._dirty[id(seg)] = seg

    def pad_to_end(self, seg) -> None:
        """Fill the rest of a non-last segment with a blank record (repairs a torn roll)."""
        if seg.length < self.segment_size:
            try:
                seg.write(blank_record(self.segment_size - seg.length))
            except OSError as exc:
                raise _disk_error(exc, f"cannot pad segment {seg.start}") from exc
            self._dirty[id(seg)] = seg

    def delete_segment_front(self) -> None:
        if len(self.segments) == 1:
            self._empty_pos = self.write_pos
        seg = self.segments.pop(0)
        self._starts.pop(0)
        self._dirty.pop(id(seg), None)
        seg.remove()
        self.dir_dirty = True

    def take_dirty(self) -> list:
        """Segments written since the last call; the caller syncs them."""
        dirty = list(self._dirty.values())
        self._dirty.clear()
        return dirty

    def sync_dir(self) -> None:
        """fsync the directory so created and removed segment files are durable."""
        if self.directory is not None and self.dir_dirty:
            self.dir_dirty = False
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()

    def disk_bytes(self) -> int:
        return sum(seg.length for seg in self.segments)
