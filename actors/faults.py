"""Fault injection on the links between members: cuts, drop probability, added delay.

Off by default and free when off: ``LinkFaults.active`` is False until a fault is
set, and the senders skip every check then.  A cut link makes calls on it fail
as a lost message would (after a short wait, so loops do not spin).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field

from rayledger.actors.ray_compat import check_ray_version, kv_del, kv_get, kv_put

#: How long a dropped message takes to fail.
DROP_WAIT_MS = 20.0


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

    def verdict(self, peer: str) -> tuple[bool, float]:
        """Whether a message to ``peer`` is dropped, and how long it waits first (ms): a
        dropped one fails after a short wait, so loops do not spin."""
        if peer in self.cut or random.random() < self.drop.get(peer, 0.0):
            return True, DROP_WAIT_MS
        return False, self.delay_ms.get(peer, 0.0)

    async def before_send(self, peer: str) -> None:
        """Raise LinkDown for a dropped message; sleep for an added delay."""
        dropped, wait_ms = self.verdict(peer)
        if wait_ms:
            await asyncio.sleep(wait_ms / 1000)
        if dropped:
            raise LinkDown(peer)


# Faults follow a member across restarts until heal(): the group records them in Ray's
# cluster key-value store (GCS), and a member reads its own when its process starts.
_KV_NAMESPACE = "rayledger-faults"


def _key(group: str, member: str) -> str:
    return f"{group}/{member}"


def save_faults(group: str, member: str, faults: LinkFaults) -> None:
    key = _key(group, member)
    if not faults.active:
        kv_del(key, _KV_NAMESPACE)
        return
    value = {"cut": sorted(faults.cut), "drop": faults.drop, "delay_ms": faults.delay_ms}
    kv_put(key, json.dumps(value), _KV_NAMESPACE)


def load_faults(group: str, member: str) -> LinkFaults:
    """The faults recorded for ``member`` (none when the store is unreachable)."""
    check_ray_version()  # an untested Ray is an error, not "no faults"
    try:
        raw = kv_get(_key(group, member), _KV_NAMESPACE)
    except Exception:  # no Ray here (a unit test): a member starts without faults
        return LinkFaults()
    if not raw:
        return LinkFaults()
    v = json.loads(raw)
    return LinkFaults(set(v["cut"]), dict(v["drop"]), dict(v["delay_ms"]))
