"""The APPEND pushes a leader has in flight to one follower (etcd's tracker/inflights.go).

A dispatcher pipelines many pushes; each is remembered until the follower acknowledges it
or the follower's water mark passes it, so the oldest can be resent after a timeout and the
count bounds the pipeline (``max_pending_pushes``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class Inflight:
    """One push of entries ``first..last`` (``nbytes`` bytes), last sent at ``sent_ms``."""

    first: int
    last: int
    nbytes: int
    sent_ms: int


class Inflights:
    """Pushes in flight keyed by first index, kept in index order (they are added as the
    write index moves up, and a resend keeps its place), so the oldest is the first."""

    __slots__ = ("_by_first",)

    def __init__(self) -> None:
        self._by_first: dict[int, Inflight] = {}

    def __len__(self) -> int:
        return len(self._by_first)

    def __contains__(self, first: int) -> bool:
        return first in self._by_first

    def __iter__(self) -> Iterator[Inflight]:
        return iter(self._by_first.values())

    def add(self, first: int, last: int, nbytes: int, sent_ms: int) -> Inflight:
        """A push sent now (from a first index above every one in flight)."""
        item = Inflight(first, last, nbytes, sent_ms)
        self._by_first[first] = item
        return item

    def oldest(self) -> Inflight | None:
        return next(iter(self._by_first.values()), None)

    def ack(self, first: int, last: int) -> bool:
        """The follower stored the push ``first..last``: forget it (only that exact push:
        an answer to an older, differently cut push from ``first`` leaves the new one)."""
        item = self._by_first.get(first)
        if item is None or item.last != last:
            return False
        del self._by_first[first]
        return True

    def drop(self, first: int) -> None:
        self._by_first.pop(first, None)

    def prune(self, water_mark: int) -> int:
        """Forget every push the follower's water mark covers; returns how many."""
        done = [k for k, v in self._by_first.items() if v.last <= water_mark]
        for k in done:
            del self._by_first[k]
        return len(done)

    def clear(self) -> None:
        self._by_first.clear()

    def __repr__(self) -> str:
        spans = ", ".join(f"{v.first}..{v.last}" for v in self._by_first.values())
        return f"Inflights([{spans}])"
