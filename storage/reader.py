"""A read-only reader of a member's store directory (``data/``, ``index/``, ``checkpoint``).

It never writes, truncates, renames or locks anything: files are opened
``O_RDONLY`` and read with ``pread``, so a reader can run in another process
while the member keeps appending (no mmap, so a concurrent truncation of the
uncommitted tail can never fault the reader).  Callers bound their reads by an
index they know is committed (on this member, or by the group's leader):
committed entries are never rewritten, so those bytes are stable.

Segment files are found by their 20-digit start-offset names; a position lies in
the segment with the greatest start not above it, so the reader does not need
the segment sizes the store was written with.

:meth:`StoreReader.read_table` turns a range straight into a pyarrow table
(``index``, ``term``, ``pos``, ``body``) with numpy, with no Python object per
entry; this is the block format of the Spark reader.  Its ``channel`` argument keeps
only the entries of one header channel: the Spark reader passes 0, the client entries,
so a group's configuration entries (on their own channel) are left out.
"""

from __future__ import annotations

import bisect
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .codec import (
    ENTRY_MAGIC,
    HEADER,
    HEADER_DTYPE,
    HEADER_SIZE,
    INDEX_DTYPE,
    INDEX_UNIT,
    SESSION_FLAG,
    SESSION_SIZE,
    Entry,
    EntryBatch,
    blank_size,
)
from .errors import LedgerError, ResponseCode
from .file_store import CHECKPOINT
from .metafile import read_json

#: Largest body payload put into one arrow table (binary offsets are int32).
MAX_TABLE_BYTES = 256 * 1024 * 1024


def _corrupt(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.CORRUPT_LOG, msg)


def _out_of_bounds(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.INDEX_OUT_OF_BOUNDS, msg)


class _Files:
    """The segment files of one directory, opened lazily and read-only."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.starts: list[int] = []
        self._fds: dict[int, int] = {}
        self.refresh()

    def refresh(self) -> None:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            names = []
        self.starts = sorted(int(n) for n in names if len(n) == 20 and n.isdigit())
        for start in list(self._fds):
            if start not in self.starts or not self._same_file(start):
                # deleted (compacted): never pin its disk space; or deleted and made again
                # under its name (the log reset since): never read the old one's bytes
                os.close(self._fds.pop(start))

    def _same_file(self, start: int) -> bool:
        try:
            now = os.stat(self.directory / f"{start:020d}")
        except FileNotFoundError:
            return False
        opened = os.fstat(self._fds[start])
        return (now.st_ino, now.st_dev) == (opened.st_ino, opened.st_dev)

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            path = self.directory / f"{start:020d}"
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError as exc:
                raise _out_of_bounds(
                    f"segment {path} is gone (deleted by cleanup?); the range starts below the log's begin"
                ) from exc
            self._fds[start] = fd
        return fd

    def pread(self, pos: int, n: int) -> bytes:
        """``n`` bytes at absolute position ``pos``, all inside one segment."""
        for attempt in (0, 1):
            i = bisect.bisect_right(self.starts, pos) - 1
            if i >= 0:
                start = self.starts[i]
                nxt = self.starts[i + 1] if i + 1 < len(self.starts) else None
                if nxt is None or pos + n <= nxt:
                    buf = os.pread(self._fd(start), n, pos - start)
                    if len(buf) == n:
                        return buf
            if attempt == 0:
                self.refresh()  # a segment may have been created since we listed them
        raise _out_of_bounds(f"{self.directory}: no data at position {pos}+{n}")

    def read_span(self, pos: int, n: int) -> bytes:
        """``n`` bytes at ``pos``, which may run on into the following segments."""
        parts = []
        refreshed = False
        while n > 0:
            i = bisect.bisect_right(self.starts, pos) - 1
            nxt = self.starts[i + 1] if 0 <= i < len(self.starts) - 1 else None
            if nxt is None and not refreshed and i >= 0:
                # the read runs past what the last known segment holds: a new one may exist
                if pos + n > self.starts[i] + os.fstat(self._fd(self.starts[i])).st_size:
                    self.refresh()
                    refreshed = True
                    continue
            take = n if nxt is None else min(n, nxt - pos)
            if take <= 0:
                raise _out_of_bounds(f"{self.directory}: no data at position {pos}")
            parts.append(self.pread(pos, take))
            pos += take
            n -= take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def first(self) -> int | None:
        return self.starts[0] if self.starts else None

    def end_pos(self) -> int:
        """Absolute position after the last byte on disk."""
        if not self.starts:
            return 0
        last = self.starts[-1]
        try:
            return last + os.fstat(self._fd(last)).st_size
        except LedgerError:
            return last

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


class StoreReader:
    """Read entries from a :class:`~rayledger.storage.FileStore` directory without touching it.

    Use as a context manager or call :meth:`close`.  ``verify_crc`` also checks
    every body CRC (headers are always checked against the index).
    """

    def __init__(self, data_dir: str | os.PathLike, verify_crc: bool = False):
        self.dir = Path(data_dir)
        if not (self.dir / "data").is_dir() or not (self.dir / "index").is_dir():
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"{self.dir} is not a rayledger store directory (no data/ and index/)",
            )
        self.verify_crc = verify_crc
        self._data = _Files(self.dir / "data")
        self._index = _Files(self.dir / "index")

    def refresh(self) -> None:
        """Look at the directory again: segments created since, and none of those deleted
        since (their files are closed, so a long-lived reader never pins a compacted
        segment's disk space)."""
        self._data.refresh()
        self._index.refresh()

    # -- metadata ----------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """The store's last checkpoint (``committed_index``, ``end_index``, ...), or {}."""
        return read_json(self.dir / CHECKPOINT) or {}

    def committed_index_on_disk(self) -> int:
        """The committed index the checkpoint records (lags the live member's by up to a second)."""
        cp = self.checkpoint()
        return min(int(cp.get("committed_index", -1)), self.end_index())

    def begin_index(self) -> int:
        """Index of the first entry on disk (after cleanup deleted older segments)."""
        first = self._data.first()
        if first is None:
            return int(self.checkpoint().get("base", (0, 0))[0])
        head = self._data.pread(first, 8)
        off = blank_size(head, 0) or 0
        try:
            h = HEADER.unpack(self._data.pread(first + off, HEADER_SIZE))
        except LedgerError:
            return int(self.checkpoint().get("base", (0, 0))[0])
        if h[0] != ENTRY_MAGIC:
            raise _corrupt(f"{self.dir}: no entry at the start of data segment {first}")
        return h[2]

    def end_index(self) -> int:
        """Index of the last complete index unit on disk (may not be committed)."""
        return self._index.end_pos() // INDEX_UNIT - 1

    # -- reads -------------------------------------------------------------------------
    def read_units(self, start: int, stop: int) -> np.ndarray:
        """Index units of entries ``start <= i < stop`` (an ``INDEX_DTYPE`` array)."""
        if start < 0 or stop < start:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"bad range [{start}, {stop})")
        raw = (
            self._index.read_span(start * INDEX_UNIT, (stop - start) * INDEX_UNIT)
            if stop > start
            else b""
        )
        units = np.frombuffer(raw, dtype=INDEX_DTYPE)
        bad_units = (units["magic"] != ENTRY_MAGIC) | (units["index"] != np.arange(start, stop))
        if bad_units.any():
            bad = int(np.flatnonzero(bad_units)[0])
            raise _corrupt(f"{self.dir}: index unit of entry {start + bad} is damaged or missing")
        return units

    def read_batch(self, start: int, max_bytes: int, max_count: int) -> EntryBatch:
        """Entries from ``start`` exactly as the member's store would push them (its
        :meth:`~rayledger.storage.LogStore.read_batch`): at least one, then up to
        ``max_bytes`` / ``max_count``.  The caller bounds ``max_count`` by an index it
        knows is committed (a leader's dispatcher catching a follower up): the
        headers are checked against the index units, the bodies are the follower's to
        verify."""
        if max_count <= 0 or max_bytes <= 0:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"max_bytes and max_count must be positive: {max_bytes}, {max_count}")  # fmt: skip
        want = min(max_count, 1024)  # index units read ahead, doubled while the bytes allow
        while True:
            units = self.read_units(start, start + want)
            cum = np.cumsum(units["size"].astype(np.int64))
            if cum[-1] > max_bytes or want == max_count:
                break
            want = min(max_count, want * 2)
        count = max(1, int(np.searchsorted(cum, max_bytes, side="right")))
        units = units[:count]
        raw = self._read_raw(units)
        buf = np.frombuffer(raw, dtype=np.uint8)
        offsets = np.concatenate(([0], cum[: count - 1]))
        self._check(buf, offsets, units)
        return EntryBatch(start, count, raw)

    def _read_raw(self, units: np.ndarray) -> bytes:
        """The entries' bytes back to back (segment padding dropped)."""
        pos = units["pos"].astype(np.int64)
        size = units["size"].astype(np.int64)
        end = pos + size
        # Runs of entries that follow each other on disk (a run breaks at a segment end).
        breaks = np.flatnonzero(pos[1:] != end[:-1]) + 1
        run_first = np.concatenate(([0], breaks))
        run_last = np.concatenate((breaks, [len(pos)])) - 1
        parts = []
        for a, b in zip(run_first.tolist(), run_last.tolist(), strict=True):
            p0, p1 = int(pos[a]), int(end[b])
            parts.append(self._data.read_span(p0, p1 - p0))  # may end exactly on a segment end
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_data(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The entries' bytes back to back (segment padding dropped) and each one's offset in them."""
        size = units["size"].astype(np.int64)
        buf = np.frombuffer(self._read_raw(units), dtype=np.uint8)
        offsets = (
            np.concatenate(([0], np.cumsum(size)[:-1])) if len(size) else np.zeros(0, np.int64)
        )
        return buf, offsets

    def _check(self, buf: np.ndarray, offsets: np.ndarray, units: np.ndarray) -> np.ndarray:
        heads = _headers(buf, offsets, units["size"])
        ok = (
            (heads["magic"] == ENTRY_MAGIC)
            & (heads["size"] == units["size"])
            & (heads["index"] == units["index"])
            & (heads["term"] == units["term"])
            & (heads["pos"] == units["pos"])
            & (heads["body_size"] == units["size"] - HEADER_SIZE)
        )
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise _corrupt(
                f"{self.dir}: entry {int(units['index'][bad])} does not match its index unit"
            )
        return heads

    def read_table(self, start: int, stop: int, channel: int | None = None):
        """Entries ``start <= i < stop`` as a pyarrow table (index, term, pos, body);
        ``channel``: only the entries of that header channel (None: every entry)."""
        return _concat([t for t in self.iter_tables(start, stop, channel=channel)])

    def iter_tables(
        self,
        start: int,
        stop: int,
        max_bytes: int = MAX_TABLE_BYTES,
        channel: int | None = None,
    ):
        """Entries ``start <= i < stop`` as pyarrow tables of at most ``max_bytes`` of bodies;
        ``channel``: only the entries of that header channel (a table may then hold fewer
        rows than its index range, or none)."""
        for table, _heads in self._tables(start, stop, max_bytes, channel):
            yield table

    def _tables(self, start: int, stop: int, max_bytes: int, channel: int | None):
        """(table, headers of its rows) per part of ``[start, stop)``."""
        units = self.read_units(start, stop)
        if not len(units):
            yield empty_table(), np.zeros(0, HEADER_DTYPE)
            return
        sizes = units["size"].astype(np.int64)
        cum = np.cumsum(sizes)
        a = 0
        n = len(units)
        while a < n:
            base = cum[a - 1] if a else 0
            b = int(np.searchsorted(cum, base + max_bytes, side="right"))
            b = min(max(b, a + 1), n)
            part = units[a:b]
            buf, offsets = self._read_data(part)
            heads = self._check(buf, offsets, part)
            table = _to_table(
                buf, offsets, part["size"].astype(np.int64), part, heads, self.verify_crc
            )
            yield _only(table, heads, channel)
            a = b

    def read_entries(self, start: int, stop: int, channel: int | None = None) -> list[Entry]:
        """Entries ``start <= i < stop`` (each with its channel), as :meth:`read_table`."""
        out = []
        for t, heads in self._tables(start, stop, MAX_TABLE_BYTES, channel):
            cols = [t.column(c).to_pylist() for c in ("index", "term", "pos", "body")]
            cols.append((heads["channel"] & ~SESSION_FLAG).tolist())
            out += [Entry(*row) for row in zip(*cols, strict=True)]
        return out

    def close(self) -> None:
        self._data.close()
        self._index.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- arrow ------------------------------------------------------------------------------
def arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [("index", pa.int64()), ("term", pa.int64()), ("pos", pa.int64()), ("body", pa.binary())]
    )


def empty_table():
    import pyarrow as pa

    return pa.Table.from_batches([], schema=arrow_schema())


def _concat(tables):
    import pyarrow as pa

    return tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()


def _only(table, heads: np.ndarray, channel: int | None):
    """``(table, heads)`` cut to the rows on ``channel`` (as they are when all are, or None)."""
    if channel is None:
        return table, heads
    keep = (heads["channel"] & ~SESSION_FLAG) == channel
    if keep.all():
        return table, heads
    import pyarrow as pa

    return table.filter(pa.array(keep)), heads[keep]


def _headers(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The 48-byte header of each entry (entries back to back in ``buf``)."""
    n = len(sizes)
    if n and (sizes == sizes[0]).all() and len(buf) == n * int(sizes[0]):
        rows = buf.reshape(n, int(sizes[0]))[:, :HEADER_SIZE]
    else:
        rows = buf[offsets[:, None] + np.arange(HEADER_SIZE)]
    return np.ascontiguousarray(rows).view(HEADER_DTYPE).reshape(-1)


def _bodies(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, skips: np.ndarray):
    """Entry bytes back to back -> body bytes back to back: each entry's first ``skips``
    bytes (its header, and an idempotent client's session prefix) cut out."""
    n = len(sizes)
    if n and (sizes == sizes[0]).all() and (skips == skips[0]).all():
        return buf.reshape(n, int(sizes[0]))[:, int(skips[0]) :].reshape(-1)
    delta = np.zeros(len(buf) + 1, dtype=np.int8)
    delta[offsets] = 1
    delta[offsets + skips] -= 1
    in_header = np.cumsum(delta[:-1], dtype=np.int8)
    return buf[in_header == 0]


def _skips(heads: np.ndarray) -> np.ndarray:
    """Per entry, the bytes before the client's body: header and session prefix."""
    flagged = (heads["channel"] & SESSION_FLAG) != 0
    return HEADER_SIZE + SESSION_SIZE * flagged.astype(np.int64)


def _to_table(buf, offsets, sizes, units, heads, verify_crc: bool):
    import pyarrow as pa

    if verify_crc:  # over the stored body: the session prefix is part of it
        crcs = heads["bcrc"].astype(np.int64)
        mv = memoryview(buf)
        for k, (a, z) in enumerate(zip(offsets.tolist(), sizes.tolist(), strict=True)):
            if zlib.crc32(mv[a + HEADER_SIZE : a + z]) != crcs[k]:
                raise _corrupt(f"entry {int(units['index'][k])} fails its body CRC")
    skips = _skips(heads)
    bodies = _bodies(buf, offsets, sizes, skips)
    lens = sizes - skips
    body_offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=body_offsets[1:])
    body = pa.Array.from_buffers(
        pa.binary(),
        len(lens),
        [None, pa.py_buffer(body_offsets), pa.py_buffer(np.ascontiguousarray(bodies))],
    )
    return pa.Table.from_arrays(
        [
            pa.array(units["index"].astype(np.int64)),
            pa.array(units["term"].astype(np.int64)),
            pa.array(units["pos"].astype(np.int64)),
            body,
        ],
        schema=arrow_schema(),
    )


def batch_to_table(
    data: bytes,
    first_index: int,
    count: int,
    verify_crc: bool = False,
    channel: int | None = None,
):
    """An :class:`~rayledger.storage.EntryBatch`'s bytes as a pyarrow table (same columns);
    ``channel``: only the entries of that header channel (None: every entry)."""
    if count <= 0:
        return empty_table()
    offsets = np.empty(count, dtype=np.int64)
    sizes = np.empty(count, dtype=np.int64)
    off = 0
    unpack = HEADER.unpack_from
    n = len(data)
    for k in range(count):
        if off + HEADER_SIZE > n:
            raise _corrupt(f"batch from {first_index} is cut short at entry {first_index + k}")
        s = unpack(data, off)[1]
        offsets[k] = off
        sizes[k] = s
        off += s
    if off != n:
        raise _corrupt(f"batch from {first_index} has {n - off} bytes after its {count} entries")
    buf = np.frombuffer(data, dtype=np.uint8)
    heads = _headers(buf, offsets, sizes)
    units = np.empty(count, dtype=INDEX_DTYPE)
    units["magic"] = ENTRY_MAGIC
    units["pos"] = heads["pos"]
    units["size"] = sizes
    units["index"] = np.arange(first_index, first_index + count)
    units["term"] = heads["term"]
    ok = (
        (heads["magic"] == ENTRY_MAGIC)
        & (heads["index"] == units["index"])
        & (heads["size"] == sizes)
    )
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise _corrupt(f"batch entry {first_index + bad} has a bad header")
    return _only(_to_table(buf, offsets, sizes, units, heads, verify_crc), heads, channel)[0]
