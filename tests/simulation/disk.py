"""The members' disks in the whole-group simulation with sync_flush: slow and failing.

The stores defer their sync to the member (``defer_sync``, as on Ray), so every flush is
one the shipped cores asked for: a round's (``RoundPath``), the term's first entry's
(``Supervisor``), or push answers that wait for the disk (``MemberLogic.must_flush``).
A flush makes durable what was written before it (the store's real fdatasync, on the RAM
disk) and its answer comes back after the disk's seeded time, so entries written meanwhile
stay unflushed and a power loss in between cuts them.  Seeded faults make a member's disk
slow for a while, or fail: fsync errors from then on (the store's failed state, as
FileStore enters it on an EIO), until the member's process exits on it and restarts.
"""

from __future__ import annotations

import random

from rayledger.actors.core import supervision as sv
from rayledger.storage import LedgerError, ResponseCode

from .node_state import Node
from .sim_config import (
    DISK_FAIL_SHARE,
    DISK_FAULT_MEAN_MS,
    DISK_FLUSH_MS,
    DISK_SLOW_MS,
    KILL_IN_FLUSH_SHARE,
)


class SimDisk:
    """Flush times and disk faults (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _init_disks(self, seed: int, faults: bool) -> None:
        self._disk_rng = random.Random(seed * 7919 + 71)  # its own stream
        self._slow_disk_until: dict[str, int] = {}
        self._failed_disks: dict[str, Node] = {}  # members whose process exits on it soon
        self._next_disk_ms: int | None = (
            int(self._disk_rng.expovariate(1 / DISK_FAULT_MEAN_MS)) + 500
            if faults and self.sync_flush and self._tmp is not None
            else None
        )

    def _disk_flush_now(self, node: Node) -> sv.Failed | None:
        """The store's flush, now (None, or why it failed)."""
        try:
            node.logic.store.flush()
        except (LedgerError, OSError) as exc:
            return sv.Failed(str(exc))
        return None

    def _disk_flush(self, node: Node):
        """An actor coroutine: the disk's time, then the flush (what was written until then
        is durable); returns None or ``Failed``.  A leader's flush is where a checker that
        counts an unflushed copy loses appends: now and then the nemesis kills the
        leader's checker in the middle of one (Ray restarts it, the member sets it up
        again), and sometimes the leader then loses power before the flush ends."""
        lo, hi = DISK_FLUSH_MS
        if self._slow_disk_until.get(node.id, -1) > self.clock.now_ms:
            lo, hi = DISK_SLOW_MS
        rng = self._disk_rng
        ms = rng.randint(lo, hi)
        if self._next_disk_ms is not None and node.logic.leading_term != -1 and ms >= 4:
            if rng.random() < KILL_IN_FLUSH_SHARE:
                now = self.clock.now_ms
                self._at(node, now + rng.randint(0, ms // 2), self._kill_in_flush, node)
                if rng.random() < 0.5:
                    due = now + rng.randint(ms // 2 + 1, ms - 1)
                    self._at(node, due, self._disk_exit, node.id, node, True)
        yield ms
        failed = self._disk_flush_now(node)
        if failed is not None:
            self.stats["flush_failures"] += 1
        return failed

    def _kill_in_flush(self, node: Node) -> None:
        self.stats["checker_kills_in_flush"] += 1
        self.net.note(f"FAULT kill {node.id}'s checker during a flush")
        self._c_kill(node)

    def _disk_step(self, now: int) -> None:
        """Seeded disk faults on live FileStore members."""
        if self._next_disk_ms is None or now < self._next_disk_ms:
            return
        rng = self._disk_rng
        self._next_disk_ms = now + int(rng.expovariate(1 / DISK_FAULT_MEAN_MS)) + 1
        alive = [m for m in self.ids if self.members[m].alive]
        if not alive:
            return
        mid = rng.choice(alive)
        if rng.random() >= DISK_FAIL_SHARE:
            self._slow_disk_until[mid] = now + rng.randint(300, 3000)
            self.stats["slow_disks"] += 1
            self.net.note(f"FAULT slow disk on {mid}")
            return
        store = self.members[mid].store
        store._failed = LedgerError.of(ResponseCode.DISK_ERROR, f"{mid}: fsync failed: EIO")
        self.stats["failed_disks"] += 1
        self.net.note(f"FAULT failing disk on {mid}")
        node = self._failed_disks[mid] = self.members[mid].node
        self._at(node, now + rng.randint(500, 3000), self._disk_exit, mid, node)

    def _disk_exit(self, mid: str, node: Node, power_cut: bool = False) -> None:
        """The member's process exits on its failed disk, or (``power_cut``) its node loses
        power; it restarts later (the fault injector restarts crashed members), and what
        it never flushed is gone."""
        if power_cut and self._next_disk_ms is None:
            return  # healed meanwhile: no crash after the heal (nothing would restart it)
        if not power_cut:
            if self._failed_disks.get(mid) is not node:
                return
            del self._failed_disks[mid]
        if self.members[mid].node is node:
            self.crash(mid, power=True)

    def _heal_disks(self) -> None:
        """No new disk faults; a member on a failed disk exits now (healing restarts it)."""
        self._next_disk_ms = None
        self._slow_disk_until.clear()
        for mid, node in list(self._failed_disks.items()):
            self._disk_exit(mid, node)
