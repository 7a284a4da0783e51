"""Append-only files of fixed-size units, mirrored in memory (or in memory only).

Consume queues and the key index are such files: a unit is written once, read by its number,
and recovery cuts the units past the last checkpoint (a torn last unit is cut on open).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path


class UnitFile:
    def __init__(self, path: Path | None, unit: struct.Struct):
        self.path, self.unit = path, unit
        self.buf = bytearray()
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                self.buf += path.read_bytes()
            self._file = open(path, "ab")
            self.truncate(len(self.buf) // unit.size)  # a torn last unit is cut

    def __len__(self) -> int:
        return len(self.buf) // self.unit.size

    def append(self, *fields) -> None:
        data = self.unit.pack(*fields)
        self.buf += data
        if self._file is not None:
            self._file.write(data)

    def __getitem__(self, k: int) -> tuple:
        return self.unit.unpack_from(self.buf, k * self.unit.size)

    def slice(self, lo: int, hi: int) -> bytearray:
        """Units ``lo..hi-1`` as one copy, made in one step (a view of the buffer would stop
        another thread's append from growing it)."""
        size = self.unit.size
        return self.buf[lo * size : hi * size]

    def truncate(self, units: int) -> None:
        """Keep the first ``units``."""
        del self.buf[units * self.unit.size :]
        if self._file is not None:
            self._file.flush()
            self._file.truncate(units * self.unit.size)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
