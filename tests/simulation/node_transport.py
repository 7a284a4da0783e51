"""The node-local transport of the whole-group simulation: actor calls between a member and
its helpers on one node, as a seeded queue of 0-2 ms hops with no order between calls, and
actor coroutines written as generators."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from .node_state import Node
from .sim_config import LOCAL_HOP_MS, SLOW_HOP


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


class _Park(_Marker):
    __slots__ = ("actor",)

    def __init__(self, actor: str):
        super().__init__(f"PARK({actor})")
        self.actor = actor


_parks: dict[str, _Park] = {}


def park(actor: str) -> _Park:
    """What a call to the hung helper ``actor`` returns: it waits in the hung process until
    the process is killed (then its caller gets :data:`DIED`)."""
    p = _parks.get(actor)
    if p is None:
        p = _parks[actor] = _Park(actor)
    return p


PARK = park("checker")  # a call waiting in a hung checker
TIMEOUT = _Marker("TIMEOUT")  # a timed call's answer when its time ran out first
DIED = _Marker("DIED")  # the helper's process was killed while the call waited in it


class Timed:
    """``yield Timed(ms, calls)`` in an actor coroutine: the calls' results, each one not
    back within ``ms`` as :data:`TIMEOUT` (``asyncio.wait`` with a timeout)."""

    __slots__ = ("ms", "calls")

    def __init__(self, ms: int | None, calls: list):
        self.ms, self.calls = ms, list(calls)


class SimTimer:
    """A timer of the node-local queue (``asyncio.TimerHandle``)."""

    __slots__ = ("entry",)

    def __init__(self, entry: list):
        self.entry = entry

    def cancel(self) -> None:
        self.entry[5] = False


class SimLoop:
    """One actor's :class:`~rayledger.actors.core.pump.Loop` on a simulated node: the clock, a
    call later in this turn, timers, and a hop from a graph's thread."""

    __slots__ = ("sim", "node", "lane", "actor", "gen")

    def __init__(
        self, sim: LocalTransport, node: Node, lane: str | None = None, actor: str | None = None
    ):
        self.sim, self.node, self.lane = sim, node, lane  # lane: hops onto it keep order
        # actor: a helper process that can hang or be replaced; its loop then runs nothing
        self.actor, self.gen = actor, node.helper_gen.get(actor, 0) if actor else 0

    def _guard(self, fn: Callable) -> Callable:
        if self.actor is None:
            return fn
        node, actor, gen = self.node, self.actor, self.gen

        def run(*args):
            if actor not in node.hung and node.helper_gen.get(actor, 0) == gen:
                fn(*args)

        return run

    def now_ms(self) -> int:
        return self.sim.clock.now_ms

    def call_soon(self, fn: Callable, *args) -> list:
        return self.sim._soon(self.node, self._guard(fn), *args)

    def call_later_ms(self, delay_ms: int, fn: Callable, *args) -> SimTimer:
        due = self.sim.clock.now_ms + delay_ms
        return SimTimer(self.sim._at(self.node, due, self._guard(fn), *args))

    def call_threadsafe(self, fn: Callable, *args) -> list:
        if self.lane is not None:
            return self.sim._lane(self.node, self.lane, self._guard(fn), *args)
        return self.sim._hop(self.node, self._guard(fn), *args)


class LocalTransport:
    """Timers, hops and coroutines on one node (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _at(self, node: Node, due: int, fn: Callable, *args) -> list:
        """Run ``fn(*args)`` on ``node`` at ``due`` unless the node died; returns a handle
        whose cancellation (``handle[5] = False``) is a timer's cancel."""
        entry = [due, next(self._local_seq), node, fn, args, True]
        heapq.heappush(self._local, entry)
        return entry

    def _hop_ms(self) -> int:
        """One node-local call's time: 0-2 ms, and with ``slow_hops`` now and then longer
        (its own stream, so runs without it stay as they were)."""
        lo, hi = LOCAL_HOP_MS
        ms = self._local_rng.randint(lo, hi)
        rng = self._slow_hop_rng
        if rng is not None and rng.random() < SLOW_HOP[0]:
            ms += rng.randint(*SLOW_HOP[1])
        return ms

    def _hop(self, node: Node, fn: Callable, *args) -> list:
        """An actor call on the same node."""
        return self._at(node, self.clock.now_ms + self._hop_ms(), fn, *args)

    def _lane(self, node: Node, lane: str, fn: Callable, *args) -> list:
        """``call_soon_threadsafe`` onto another loop of the node: a hop, in order."""
        due = max(self.clock.now_ms + self._hop_ms(), node.lanes.get(lane, 0))
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
        node (each a hop there and a hop back) and resumes with their results,
        ``yield Timed(ms, [calls])`` the same with a time-out."""
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
            timed = want if isinstance(want, Timed) else Timed(None, want)
            calls = timed.calls
            results: list = [TIMEOUT] * len(calls)
            state = [len(calls), False]  # calls still out; resumed already
            if not calls:
                self._hop(node, self._resume, node, task, results)
            for i, fn in enumerate(calls):
                self._hop(node, self._call_there, node, task, fn, i, results, state)
            if timed.ms is not None and calls:
                self._at(node, self.clock.now_ms + timed.ms, self._time_out, node, task,
                         results, state)  # fmt: skip

    def _call_there(self, node: Node, task, fn, i: int, results: list, state: list) -> None:
        r = fn()
        if isinstance(r, _Park):  # waits in a hung process until it is killed
            node.parked.append((r.actor, task, i, results, state))
            return
        self._hop(node, self._call_back, node, task, i, r, results, state)

    def _call_back(self, node: Node, task, i: int, r: Any, results: list, state: list) -> None:
        results[i] = r
        state[0] -= 1
        if state[0] == 0 and not state[1]:
            state[1] = True
            self._resume(node, task, results)

    def _time_out(self, node: Node, task, results: list, state: list) -> None:
        if not state[1]:
            state[1] = True
            self._resume(node, task, list(results))  # what is still out stays TIMEOUT

    def _release_parked(self, node: Node, actor: str = "checker") -> None:
        """A hung helper's process was killed: the calls waiting in it fail (those waiting
        in another hung helper of the node wait on)."""
        parked = [p for p in node.parked if p[0] == actor]
        if not parked:
            return
        node.parked = [p for p in node.parked if p[0] != actor]
        for _, task, i, results, state in parked:
            self._hop(node, self._call_back, node, task, i, DIED, results, state)

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
