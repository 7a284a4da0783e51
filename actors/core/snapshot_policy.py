"""When a member snapshots its state machine, which snapshots it keeps, which one it
starts from and how far its log may be compacted (sans-I/O: no Ray, no clock, no files).

Its decisions, once, for the Ray member and the simulation alike:

* **due**: a snapshot is taken every ``every_entries`` applied entries or
  ``every_bytes`` applied bytes since the last one (0 turns a trigger off), one at a time;
  and as soon as the machine stands at an index a follower's machine asked for (``ask``):
  a follower stranded below its log's begin waits for a leader's snapshot that far, and
  an idle group applies no more batches to reach the next periodic one;
* **keep**: the newest ``keep`` snapshots stay, older ones go;
* **start from**: the newest snapshot that verifies (a damaged one is logged and skipped in
  favour of an older one, or of the log alone);
* **compaction floor**: the log must keep every entry after what the member's machine can
  come back from on its own -- the oldest snapshot it keeps, so that a damaged newest one
  still leaves an older one and the log after it, or without one the index the machine
  says it saved (``open``) -- so the cleaner never strands its own machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("rayledger.actors")


class Snapshot(Protocol):
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class SnapshotConfig:
    every_entries: int = 100_000
    every_bytes: int = 0  # 0: no byte trigger
    keep: int = 2

    def __post_init__(self) -> None:
        if self.every_entries < 0 or self.every_bytes < 0 or self.keep < 1:
            from rayledger.storage import LedgerError, ResponseCode

            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                "snapshot_every_entries and snapshot_every_bytes must be >= 0 and "
                f"snapshot_keep >= 1, got {self}",
            )


class SnapshotPolicy:
    """One member's snapshot decisions; ``last`` is the index of its newest snapshot."""

    def __init__(self, config: SnapshotConfig, last: int = -1, kept: Sequence[int] = ()):
        self.config = config
        self.last = last
        self.kept = sorted(kept) or ([last] if last >= 0 else [])  # indexes on disk
        self._bytes_since = 0
        self.taking: int | None = None  # the index of the snapshot being written
        self.asked = -1  # a follower's machine waits for a snapshot at or past this index

    def applied(self, nbytes: int) -> None:
        """A batch of ``nbytes`` body bytes was applied."""
        self._bytes_since += nbytes

    def ask(self, index: int, have: int | None = None) -> None:
        """A follower's machine needs a snapshot at or past ``index`` (the newest one we
        have stands below it).  The nearest ask counts: the snapshot that answers it
        answers every ask at or below where it is cut, and a follower still short asks
        again when its dispatcher looks again.  ``have``: the newest snapshot that can be
        sent (-1: none): ours past it are damaged, so the next one is cut anew (else a
        leader whose newest was found damaged never answered a stranded follower)."""
        if have is not None and have < index <= self.last:
            self.last = have
        if index > self.last:
            self.asked = index if self.asked <= self.last else min(self.asked, index)

    def due(self, applied: int) -> bool:
        """Whether to snapshot the machine now, standing at ``applied`` (none while one is
        being written, none of what the newest snapshot already holds)."""
        cfg = self.config
        if self.taking is not None or applied <= self.last:
            return False
        if self.last < self.asked <= applied:
            return True
        if cfg.every_entries and applied - self.last >= cfg.every_entries:
            return True
        return bool(cfg.every_bytes) and self._bytes_since >= cfg.every_bytes

    def begin(self, index: int) -> None:
        self.taking = index

    def taken(self, index: int, have: Sequence[Snapshot]) -> list[Snapshot]:
        """Snapshot ``index`` is on disk (``have``: every snapshot now, this one among
        them); returns those to delete, the oldest beyond ``keep``."""
        self.taking = None
        self.last = max(self.last, index)
        self._bytes_since = 0
        ordered = sorted(have, key=lambda s: s.index)
        cut = max(0, len(ordered) - self.config.keep)
        self.kept = [s.index for s in ordered[cut:]]
        return ordered[:cut]

    def installed(self, index: int, have: Sequence[Snapshot]) -> list[Snapshot]:
        """A snapshot from the leader at ``index`` is on disk and loaded (one of our own
        may still be being written): returns those to delete, as :meth:`taken`."""
        taking = self.taking
        gone = self.taken(index, have)
        self.taking = taking if taking is not None and taking > index else None
        return gone

    def failed(self) -> None:
        """Writing the snapshot failed (logged by the caller): try again when next due."""
        self.taking = None

    @staticmethod
    def start_from(have: Sequence[Snapshot], damaged: Callable[[Snapshot], str | None]):
        """The newest snapshot that verifies (``damaged`` says why one does not), or None:
        start from the log alone."""
        for snap in sorted(have, key=lambda s: s.index, reverse=True):
            why = damaged(snap)
            if why is None:
                return snap
            log.error("snapshot %d (term %d) is damaged and skipped: %s", snap.index,
                      snap.term, why)  # fmt: skip
        return None

    def compaction_floor(self) -> int:
        """The first index the log must keep: the one after the oldest snapshot kept (a
        damaged newest one leaves the older one and the log after it), the whole log
        before the first.  Never past it, even where the machine saved more itself: a
        member reset to this log's begin continues from a snapshot at or after the entry
        before it, so one must exist."""
        return (self.kept[0] if self.kept else -1) + 1
