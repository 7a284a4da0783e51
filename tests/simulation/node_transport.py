"""The node-local transport of the whole-group simulation: actor calls between a member and
its helpers on one node, as a seeded queue of 0-2 ms hops with no order between calls, and
actor coroutines written as generators."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from .node_state import Node
from .sim_config import LOCAL_HOP_MS


class SimTimer:
    """A timer of the node-local queue (``asyncio.TimerHandle``)."""

    __slots__ = ("entry",)

    def __init__(self, entry: list):
        self.entry = entry

    def cancel(self) -> None:
        self.entry[5] = False


class SimLoop:
    """One actor's :class:`~rayledger.actors.pump.Loop` on a simulated node: the clock, a
    call later in this turn, timers, and a hop from a graph's thread."""

    __slots__ = ("sim", "node", "lane")

    def __init__(self, sim: LocalTransport, node: Node, lane: str | None = None):
        self.sim, self.node, self.lane = sim, node, lane  # lane: hops onto it keep order

    def now_ms(self) -> int:
        return self.sim.clock.now_ms

    def call_soon(self, fn: Callable, *args) -> list:
        return self.sim._soon(self.node, fn, *args)

    def call_later_ms(self, delay_ms: int, fn: Callable, *args) -> SimTimer:
        return SimTimer(self.sim._at(self.node, self.sim.clock.now_ms + delay_ms, fn, *args))

    def call_threadsafe(self, fn: Callable, *args) -> list:
        if self.lane is not None:
            return self.sim._lane(self.node, self.lane, fn, *args)
        return self.sim._hop(self.node, fn, *args)


class LocalTransport:
    """Timers, hops and coroutines on one node (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _at(self, node: Node, due: int, fn: Callable, *args) -> list:
        """Run ``fn(*args)`` on ``node`` at ``due`` unless the node died; returns a handle
        whose cancellation (``handle[5] = False``) is a timer's cancel."""
        entry = [due, next(self._local_seq), node, fn, args, True]
        heapq.heappush(self._local, entry)
        return entry

    def _hop(self, node: Node, fn: Callable, *args) -> list:
        """An actor call on the same node."""
        lo, hi = LOCAL_HOP_MS
        return self._at(node, self.clock.now_ms + self._local_rng.randint(lo, hi), fn, *args)

    def _lane(self, node: Node, lane: str, fn: Callable, *args) -> list:
        """``call_soon_threadsafe`` onto another loop of the node: a hop, in order."""
        lo, hi = LOCAL_HOP_MS
        due = max(self.clock.now_ms + self._local_rng.randint(lo, hi), node.lanes.get(lane, 0))
        node.lanes[lane] = due
        return self._at(node, due, fn, *args)

    def _soon(self, node: Node, fn: Callable, *args) -> list:
        """``loop.call_soon``: later in this loop turn."""
        return self._at(node, self.clock.now_ms, fn, *args)

    @staticmethod
    def _cancel(entry: list | None) -> None:
        if entry is not None:
            entry[5] = False

    def _spawn(self, node: Node, task: Iterator) -> None:
        """Run an actor coroutine, written as a generator: ``yield None`` is one hop,
        ``yield ms`` a sleep, ``yield [calls]`` awaits calls to other actors of the
        node (each a hop there and a hop back) and resumes with their results."""
        self._resume(node, task, None)

    def _resume(self, node: Node, task: Iterator, value: Any) -> None:
        if node.dead:
            return
        try:
            want = task.send(value)
        except StopIteration:
            return
        if want is None:
            self._hop(node, self._resume, node, task, None)
        elif isinstance(want, int):
            self._at(node, self.clock.now_ms + want, self._resume, node, task, None)
        else:
            calls = list(want)
            results: list = [None] * len(calls)
            left = [len(calls)]
            if not calls:
                self._hop(node, self._resume, node, task, results)
            for i, fn in enumerate(calls):
                self._hop(node, self._call_there, node, task, fn, i, results, left)

    def _call_there(self, node: Node, task, fn, i: int, results: list, left: list) -> None:
        results[i] = fn()
        self._hop(node, self._call_back, node, task, results, left)

    def _call_back(self, node: Node, task, results: list, left: list) -> None:
        left[0] -= 1
        if left[0] == 0:
            self._resume(node, task, results)

    def _run_local(self, now: int) -> bool:
        q = self._local
        ran = False
        while q and q[0][0] <= now:
            entry = heapq.heappop(q)
            if entry[5] and not entry[2].dead:
                ran = True
                entry[3](*entry[4])
        return ran

    def _next_local_ms(self) -> int | None:
        q = self._local
        while q and (not q[0][5] or q[0][2].dead):
            heapq.heappop(q)
        return q[0][0] if q else None
