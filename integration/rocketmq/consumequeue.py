"""Consume queues: per topic-queue arrays of RocketMQ's 20-byte units.

A unit is ``(commit-log offset i64, size i32, tag hash i64)``, big-endian, as RocketMQ writes
them; queue offset ``k`` is unit ``k``.  Beside the units each queue keeps the ledger index
of every message (8 bytes a unit), so a pull reads the entry without searching positions.
Files live under ``<dir>/<topic>/<queue id>/``; without a directory the queue is in memory.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from .unitfile import UnitFile

UNIT = struct.Struct(">qiq")
INDEX = struct.Struct(">q")
UNIT_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags_hash", ">i8")])


def tag_hash(tags: str | None) -> int:
    """RocketMQ hashes a message's tags for server-side filtering (String.hashCode here)."""
    if not tags:
        return 0
    h = 0
    for ch in tags:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class ConsumeQueue:
    """One topic-queue.  ``base`` is the queue offset of its first unit: 0, unless its
    member rebuilt its queues from a log reset past their start (then a queue starts at the
    offset stamped into the first message it saw, and offsets below it are gone)."""

    def __init__(self, directory: Path | None, base: int = 0):
        self.dir = directory
        self.base = base
        self._units = UnitFile(directory / "units" if directory else None, UNIT)
        self._index = UnitFile(directory / "index" if directory else None, INDEX)
        self.truncate(min(len(self._units), len(self._index)))  # torn by a crash between them

    def __len__(self) -> int:
        return len(self._units)

    @property
    def max_offset(self) -> int:
        """The queue offset the next message gets."""
        return self.base + len(self._units)

    def min_offset(self, begin: int = 0) -> int:
        """The lowest queue offset still readable: its first unit's, or past the units whose
        entries lie below ``begin`` (the log's begin index: compacted away)."""
        lo, hi = 0, len(self._index)
        while lo < hi:  # the ledger indexes grow with the queue offset
            mid = (lo + hi) // 2
            if self._index[mid][0] < begin:
                lo = mid + 1
            else:
                hi = mid
        return self.base + lo

    def append(self, phys: int, size: int, tags_hash: int, index: int) -> int:
        offset = self.max_offset
        self._units.append(phys, size, tags_hash)
        self._index.append(index)
        return offset

    def _span(self, offset: int, n: int) -> tuple[int, int]:
        """Unit numbers ``[lo, hi)`` of queue offsets ``[offset, offset + n)``."""
        return max(0, offset - self.base), max(0, min(len(self._units), offset - self.base + n))

    def get(self, offset: int, n: int) -> list[tuple[int, int, int, int]]:
        """Up to ``n`` units from ``offset``: ``(phys, size, tag hash, ledger index)``."""
        lo, hi = self._span(offset, n)
        return [(*self._units[k], self._index[k][0]) for k in range(lo, hi)]

    def units(self, offset: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` units from ``offset`` as arrays: the units (``phys``, ``size``,
        ``tags_hash``) and the ledger indexes (copies: the files may grow meanwhile)."""
        lo, hi = self._span(offset, n)
        if hi <= lo:
            return np.empty(0, UNIT_DTYPE), np.empty(0, np.int64)
        units = self._units.slice(lo, hi)
        return np.frombuffer(units, UNIT_DTYPE), np.frombuffer(self._index.slice(lo, hi), ">i8")

    def indexes(self, offset: int, n: int) -> list[int]:
        """The ledger indexes of up to ``n`` messages from ``offset``."""
        lo, hi = self._span(offset, n)
        return [self._index[k][0] for k in range(lo, hi)]

    def truncate(self, units: int) -> None:
        """Keep the first ``units`` (recovery cuts what came after the last checkpoint)."""
        self._units.truncate(units)
        self._index.truncate(units)

    def flush(self) -> None:
        self._units.flush()
        self._index.flush()

    def close(self) -> None:
        self._units.close()
        self._index.close()
