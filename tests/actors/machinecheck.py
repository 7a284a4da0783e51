"""The state-machine runner's two threads as one, for tests without a member: the machine
applies a batch, then its core hears of it."""

from __future__ import annotations

from rayledger.actors.core import machine as mcore
from rayledger.actors.machine import Applier
from rayledger.storage import Entry


def apply(applier: Applier, entries: list[Entry], now_ms: int = 0) -> None:
    """Apply ``entries`` (which continue where the machine stands) and record it."""
    if entries:
        applier.run(entries)
        applier.core.step(mcore.BatchApplied(entries[-1].index), now_ms)
