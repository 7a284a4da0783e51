"""Seeded faults of a member's dispatcher processes in the whole-group simulation: one
hangs (a SIGSTOP, until its member's supervision kills it) or dies outright (Ray restarts
it at once).  What a fault does is the dispatcher shell's (:mod:`.dispatcher_delivery`);
this only decides when and which, on its own random stream (a seed's other streams stay
as they were)."""

from __future__ import annotations

import random

from .sim_config import DISPATCHER_FAULT_MEAN_MS, DISPATCHER_KILL_SHARE


class HelperFaults:
    """The dispatcher fault step (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _init_helper_faults(self, seed: int, on: bool) -> None:
        self._dfault_rng = random.Random(seed * 7919 + 89)
        rng = self._dfault_rng
        self._next_dfault_ms: int | None = (
            int(rng.expovariate(1 / DISPATCHER_FAULT_MEAN_MS)) + 500 if on and self.n > 1 else None
        )

    def _dispatcher_fault_step(self, now: int) -> None:
        """A live member's dispatcher hangs or dies; half the time the member is a leader
        (a hung follower's dispatcher matters only once it leads)."""
        if self._next_dfault_ms is None or now < self._next_dfault_ms:
            return
        rng = self._dfault_rng
        self._next_dfault_ms = now + int(rng.expovariate(1 / DISPATCHER_FAULT_MEAN_MS)) + 1
        alive = [m for m in self.ids if self.members[m].alive]
        leaders = [m for m in alive if self.members[m].state.is_leader]
        if not alive:
            return
        mid = rng.choice(leaders if leaders and rng.random() < 0.5 else alive)
        peers = sorted(self.members[mid].node.dispatchers)
        if not peers:
            return
        peer = rng.choice(peers)
        if rng.random() < DISPATCHER_KILL_SHARE:
            self.kill_dispatcher(mid, peer)
        else:
            self.hang_dispatcher(mid, peer)

    def _stop_helper_faults(self) -> None:
        """Healing: no new faults (a hung dispatcher stays hung until its member kills it)."""
        self._next_dfault_ms = None
