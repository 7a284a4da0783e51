"""Checks shared by the Ray end-to-end tests: committed logs agree and hold every ack."""

from __future__ import annotations

import time

import ray
from rayledger.actors import LedgerConfig, LedgerGroup

# Short timers, with room for a loaded 2-core machine (a follower waits 4 x 150 ms).
TEST_CONFIG = LedgerConfig.fast(heartbeat_interval_ms=150, max_heartbeat_leak=4)


def committed_log(group: LedgerGroup, member: str) -> list[tuple[int, int, bytes]]:
    """A member's committed log, waiting while Ray restarts it (a kill is still settling)."""
    h = group.handle(member)
    deadline = time.monotonic() + 60
    while True:
        try:
            batch = ray.get(h.read_batch.remote(0, 1 << 40, True), timeout=30)
            break
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return [] if batch is None else [(e.index, e.term, e.body) for e in batch.entries()]


def assert_consistent(
    group: LedgerGroup, acked: dict[int, bytes], members=None, wait_s: float = 20.0
) -> None:
    """Every member's committed log agrees on its common prefix and holds every acked append."""
    members = members or group.members
    deadline = time.monotonic() + wait_s
    while True:
        logs = {m: committed_log(group, m) for m in members}
        ok = all(len(lg) > max(acked, default=-1) for lg in logs.values())
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ref = max(logs.values(), key=len)
    for m, lg in logs.items():
        assert lg == ref[: len(lg)], f"{m} disagrees with the longest committed log"
        by_index = {i: body for i, _t, body in lg}
        for index, body in acked.items():
            assert by_index.get(index) == body, (
                f"acknowledged entry {index} missing or changed on {m}"
            )
