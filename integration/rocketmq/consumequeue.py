"""Consume queues: per topic-queue arrays of RocketMQ's 20-byte units.

A unit is ``(commit-log offset i64, size i32, tag hash i64)``, big-endian, as RocketMQ writes
them; queue offset ``k`` is unit ``k``.  Beside the units each queue keeps the ledger index
of every message (8 bytes a unit), so a pull reads the entry without searching positions.
Files live under ``<dir>/<topic>/<queue id>/``; without a directory the queue is in memory.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

UNIT = struct.Struct(">qiq")
INDEX = struct.Struct(">q")


def tag_hash(tags: str | None) -> int:
    """RocketMQ hashes a message's tags for server-side filtering (String.hashCode here)."""
    if not tags:
        return 0
    h = 0
    for ch in tags:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class ConsumeQueue:
    def __init__(self, directory: Path | None):
        self.dir = directory
        self._units = bytearray()
        self._index = bytearray()
        self._files = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            for name, buf in (("units", self._units), ("index", self._index)):
                path = directory / name
                if path.exists():
                    buf += path.read_bytes()
            n = min(len(self._units) // UNIT.size, len(self._index) // INDEX.size)
            self.truncate(n)  # a torn last unit is cut
            self._files = [open(directory / "units", "ab"), open(directory / "index", "ab")]

    @property
    def max_offset(self) -> int:
        """The queue offset the next message gets (the number of units)."""
        return len(self._units) // UNIT.size

    def append(self, phys: int, size: int, tags_hash: int, index: int) -> int:
        offset = self.max_offset
        unit, idx = UNIT.pack(phys, size, tags_hash), INDEX.pack(index)
        self._units += unit
        self._index += idx
        if self._files is not None:
            self._files[0].write(unit)
            self._files[1].write(idx)
        return offset

    def get(self, offset: int, n: int) -> list[tuple[int, int, int, int]]:
        """Up to ``n`` units from ``offset``: ``(phys, size, tag hash, ledger index)``."""
        stop = min(self.max_offset, offset + n)
        out = []
        for k in range(max(0, offset), stop):
            phys, size, th = UNIT.unpack_from(self._units, k * UNIT.size)
            (index,) = INDEX.unpack_from(self._index, k * INDEX.size)
            out.append((phys, size, th, index))
        return out

    def truncate(self, units: int) -> None:
        """Keep the first ``units`` (recovery cuts what came after the last checkpoint)."""
        del self._units[units * UNIT.size :]
        del self._index[units * INDEX.size :]
        if self.dir is not None:
            for name, size in (("units", UNIT.size), ("index", INDEX.size)):
                with open(self.dir / name, "ab") as f:
                    f.truncate(units * size)

    def flush(self) -> None:
        if self._files is not None:
            for f in self._files:
                f.flush()
                os.fsync(f.fileno())

    def close(self) -> None:
        if self._files is not None:
            for f in self._files:
                f.close()
            self._files = None
