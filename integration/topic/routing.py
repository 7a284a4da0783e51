"""Which partition an append goes to: a key's stable hash, or round robin without one.

The hash is written down so any client -- another driver, another language -- routes a key
the same way: the key's bytes (a ``str`` key as UTF-8) through CRC-32 (``zlib.crc32``, the
IEEE polynomial), modulo the number of partitions.  It never depends on the process (Python's
``hash`` of a str is salted per process).
"""

from __future__ import annotations

import itertools
import random
import threading
import zlib
from collections.abc import Sequence

from rayledger.storage import LedgerError, ResponseCode

Key = str | bytes | None


def key_bytes(key: str | bytes) -> bytes:
    """A key as the bytes the hash reads; UNEXPECTED_ARGUMENT for anything but str/bytes."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise LedgerError.of(
        ResponseCode.UNEXPECTED_ARGUMENT, f"a key must be str or bytes, not {type(key).__name__}"
    )


def partition_of(key: str | bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``: ``crc32(key bytes) % partitions``."""
    if type(partitions) is not int or partitions < 1:
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, f"partitions must be an int >= 1, got {partitions!r}"
        )
    return zlib.crc32(key_bytes(key)) % partitions


class Router:
    """Routes appends over ``partitions``: keyed ones by :func:`partition_of`, unkeyed ones
    round robin from a random partition (clients that start together do not all begin on
    the same one), thread-safe: many threads share one client."""

    def __init__(self, partitions: int):
        if type(partitions) is not int or partitions < 1:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"partitions must be an int >= 1, got {partitions!r}",
            )
        self.partitions = partitions
        self._next = itertools.count(random.randrange(partitions))
        self._lock = threading.Lock()

    def one(self, key: Key) -> int:
        if key is not None:
            return partition_of(key, self.partitions)
        with self._lock:
            return next(self._next) % self.partitions

    def split(self, n: int, keys: Key | Sequence[Key] = None) -> list[list[int]]:
        """The positions of ``n`` entries of a batch, per partition.  ``keys``: None (the
        whole batch to the next partition in turn), one key for the whole batch, or one key
        (or None: round robin, entry by entry) per entry.

        An unkeyed batch stays whole, as Kafka's sticky partitioner keeps one: split over
        every partition, each part would pay a whole round's fixed cost (calls, wake-ups)
        for a fraction of its entries, and on a machine whose cores are busy already the
        parts add no parallelism to pay for it."""
        parts: list[list[int]] = [[] for _ in range(self.partitions)]
        if keys is None or isinstance(keys, str | bytes | bytearray | memoryview):
            parts[self.one(keys)] = list(range(n))
            return parts
        if not isinstance(keys, Sequence) or len(keys) != n:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"keys must be None, one key, or one key per entry ({n}), got "
                f"{type(keys).__name__}"
                + (f" of {len(keys)}" if isinstance(keys, Sequence) else ""),
            )
        for k, key in enumerate(keys):
            parts[self.one(key)].append(k)
        return parts
