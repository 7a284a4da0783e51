"""Fault injection on the links between members: cuts, drop probability, added delay.

Off by default and free when off: ``LinkFaults.active`` is False until a fault is
set, and the senders skip every check then.  A cut link makes calls on it fail
as a lost message would (after a short wait, so loops do not spin).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field


class LinkDown(Exception):
    """A call was dropped by injected faults (the sender sees a lost message)."""


@dataclass
class LinkFaults:
    cut: set[str] = field(default_factory=set)  # peers this member cannot send to
    drop: dict[str, float] = field(default_factory=dict)  # peer -> drop probability
    delay_ms: dict[str, float] = field(default_factory=dict)  # peer -> added delay

    @property
    def active(self) -> bool:
        return bool(self.cut or self.drop or self.delay_ms)

    async def before_send(self, peer: str) -> None:
        """Raise LinkDown for a dropped message; sleep for an added delay."""
        if peer in self.cut or random.random() < self.drop.get(peer, 0.0):
            await asyncio.sleep(0.02)
            raise LinkDown(peer)
        delay = self.delay_ms.get(peer)
        if delay:
            await asyncio.sleep(delay / 1000)
