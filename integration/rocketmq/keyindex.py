"""The key index (RocketMQ's IndexFile, in this project's shape): messages by topic and key.

Every dispatched message is indexed under each of its keys (the ``KEYS`` property, keys
separated by spaces, as RocketMQ's producers write them).  A unit is ``(key hash i64, ledger
index i64)``; the hash map from key hash to ledger indexes is rebuilt from the units on open.
Hashes may collide, so a lookup's caller checks each message's topic and keys.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from .unitfile import UnitFile

UNIT = struct.Struct(">qq")


def key_hash(topic: str, key: str) -> int:
    digest = hashlib.blake2b(f"{topic}\x01{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def split_keys(keys: str | None) -> list[str]:
    return [k for k in (keys or "").split(" ") if k]


class KeyIndex:
    def __init__(self, path: Path | None):
        self._units = UnitFile(path, UNIT)
        self._by_hash: dict[int, list[int]] = {}
        for k in range(len(self._units)):
            h, index = self._units[k]
            self._by_hash.setdefault(h, []).append(index)

    def __len__(self) -> int:
        return len(self._units)

    def add(self, topic: str, keys: str | None, index: int) -> None:
        for key in dict.fromkeys(split_keys(keys)):
            h = key_hash(topic, key)
            self._units.append(h, index)
            self._by_hash.setdefault(h, []).append(index)

    def lookup(self, topic: str, key: str, max_n: int) -> list[int]:
        """Ledger indexes of the (at most ``max_n``) latest messages under the key, oldest
        first; some may be collisions."""
        return self._by_hash.get(key_hash(topic, key), [])[-max_n:] if max_n > 0 else []

    def truncate(self, units: int) -> None:
        """Keep the first ``units`` (recovery cuts what came after the last checkpoint)."""
        for k in range(units, len(self._units)):
            h, index = self._units[k]
            self._by_hash[h].remove(index)
            if not self._by_hash[h]:
                del self._by_hash[h]
        self._units.truncate(units)

    def flush(self) -> None:
        self._units.flush()

    def close(self) -> None:
        self._units.close()
