"""How a helper's core runs on a loop: the :class:`Pump` that steps it with
:class:`~rayledger.replication.messages.TurnEnd` once per loop turn and carries its Ready
out, and the drivers of the checker's and the dispatchers' cores.

Sans-I/O: a :class:`Loop` is whatever delivers -- a threaded helper actor's own loop thread
(:class:`~rayledger.actors.threadloop.ThreadLoop`), the fast path's asyncio loop
(:class:`~rayledger.actors.aioloop.AsyncioLoop`), the simulation's node-local queue in
``tests/simulation``.  A driver (:class:`CheckerDriver`, :class:`DispatcherDriver`, the fast
path's) only talks to a Loop and to its ports, so the Ray actors and the simulation run the
same drivers over the same cores (:mod:`rayledger.replication.checker`,
:mod:`rayledger.replication.dispatcher`); what differs is how a call, a timer or a hop
between threads is carried.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

from rayledger.replication.checker import (
    AddRound,
    BecomeLeader,
    CheckerEvent,
    CheckerLogic,
    Configure,
    GraphReport,
    Report,
    ReportAnswer,
    Resolution,
)
from rayledger.replication.dispatcher import (
    Committed,
    Deactivate,
    DispatcherEvent,
    DispatcherLogic,
    Fetch,
    GraphAck,
    GraphPush,
    RoundAnnounced,
)
from rayledger.replication.messages import TURN_END, GraphBegin, GraphEnd, PushEntryRequest


class Handle(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """Where a driver runs: its clock, later-in-this-turn, timers, and a hop from another
    thread (a compiled graph's) onto it."""

    def now_ms(self) -> int: ...

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def call_later_ms(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> Handle: ...

    def call_threadsafe(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class Pump:
    """Run ``step(now_ms)`` once per loop turn however many events asked for it
    (:meth:`kick`), and again at the wake time it returns (one timer, re-armed each run).

    A threaded actor runs it from Ray's threads as well as from its loop's: its ``guard``
    (a re-entrant lock there) keeps one run at a time, so a Ready's calls leave in the order
    the core made them."""

    __slots__ = ("loop", "step", "scheduled", "timer", "guard")

    def __init__(
        self,
        loop: Loop | None,
        step: Callable[[int], int | None],
        guard: AbstractContextManager | None = None,
    ):
        self.loop = loop
        self.step = step
        self.scheduled = False
        self.timer: Handle | None = None
        self.guard = guard if guard is not None else nullcontext()

    def kick(self) -> None:
        if not self.scheduled and self.loop is not None:
            self.scheduled = True
            self.loop.call_soon(self.run)

    def run(self) -> None:
        with self.guard:
            self.scheduled = False
            self.cancel()
            if self.loop is None:
                return
            now = self.loop.now_ms()
            wake = self.step(now)
            if wake is not None:
                self.timer = self.loop.call_later_ms(max(1, wake - now), self.run)

    def cancel(self) -> None:
        with self.guard:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None


L = TypeVar("L")
P = TypeVar("P")


class Driver(Generic[L, P]):
    """What every helper driver holds: its core (``logic``), where its messages go
    (``ports``), the lock a compiled graph's thread takes too (``lock``), and the :class:`Pump` that
    runs :meth:`_run` -- the core's Ready carried out -- on the loop it is attached to."""

    def __init__(
        self,
        logic: L,
        ports: P,
        lock: AbstractContextManager | None = None,
        guard: AbstractContextManager | None = None,
    ):
        self.logic = logic
        self.ports = ports
        # a shell whose events come from more than one thread (Ray's, its loop's, a compiled
        # graph's) passes a threading.Lock; one thread needs none
        self.lock = lock if lock is not None else nullcontext()
        self.pump = Pump(None, self._run, guard)  # guard: see Pump

    def attach(self, loop: Loop) -> None:
        self.pump.loop = loop

    def deliver(self, ev: Any) -> Any:
        """The one way in: step the core with ``ev`` under the lock, then let the pump
        carry out what it made due (:meth:`_after`); returns the call's answer."""
        with self.lock:
            reply = self.logic.step(ev, self._now())  # type: ignore[attr-defined]
        return self._after(ev, reply)

    def _after(self, ev: Any, reply: Any) -> Any:
        """When the core's Ready is carried out after ``ev``: now (``pump.run``), at the end
        of this loop turn (``pump.kick``, so a burst of events makes one Ready) or at its
        next deadline; returns the answer the caller gets."""
        return reply

    def _now(self) -> int:
        loop = self.pump.loop
        return loop.now_ms() if loop is not None else 0

    def _run(self, now_ms: int) -> int | None:
        raise NotImplementedError


class CheckerPorts(Protocol):
    """Where the checker's messages go: its leader and the leader's dispatchers."""

    def resolved(self, r: Resolution) -> None: ...

    def notice(self, term: int, committed: int) -> None: ...


class CheckerDriver(Driver[CheckerLogic, CheckerPorts]):
    """Delivers events to a :class:`CheckerLogic` and carries its Ready out: one message to
    the leader per loop turn with what changed, a timer for the oldest round's deadline or
    the commit notice, nothing polled.  Graph events come from another thread (the lock)."""

    def _after(self, ev: CheckerEvent, reply: Any) -> Any:
        match ev:
            case AddRound():
                self.pump.kick()  # every round of this loop turn, then one check
            case BecomeLeader() | Configure():
                self.pump.run()
            case Report():
                if not reply:
                    return None  # not this checker's term: no committed index
                self.pump.run()
                with self.lock:  # after the report's check
                    return self.logic.step(ReportAnswer(ev.peer), self._now())
            case GraphReport():
                # on the graph's thread: the answer goes back through the graph, the loop
                # re-arms its timer
                if reply is not None and self.pump.loop is not None:
                    self.pump.loop.call_threadsafe(self.pump.run)
        return reply

    def _run(self, now_ms: int) -> int | None:
        with self.lock:
            r = self.logic.step(TURN_END, now_ms)
        if r.resolution is not None:
            self.ports.resolved(r.resolution)
        if r.notice is not None:
            self.ports.notice(*r.notice)
        return r.wake_at_ms


class DispatcherPorts(Protocol):
    """Where a dispatcher's calls go; each answer comes back through the driver."""

    def push(self, req: PushEntryRequest) -> None: ...  # -> FollowerAnswer

    def fetch(self, f: Fetch) -> None: ...  # -> Fetched

    def report(self, term: int, wm: int) -> None: ...  # -> Reported

    def progress(self, term: int, wm: int) -> None: ...  # to the member; no answer

    def priority(self, background: bool) -> None: ...  # this dispatcher's CPU share


class DispatcherDriver(Driver[DispatcherLogic, DispatcherPorts]):
    """Delivers events to a :class:`DispatcherLogic` and carries its Ready out: every push
    at once (pipelined), one fetch and one report in flight, nothing polled -- it runs
    when an announcement, an answer or a fetched batch arrives, and otherwise at the
    logic's next deadline.  Graph events come from another thread (the lock)."""

    def _after(self, ev: DispatcherEvent, reply: Any) -> Any:  # noqa: C901 -- one case each
        pump = self.pump
        match ev:
            case RoundAnnounced():
                if reply:  # next in line: push it in this turn
                    pump.run()
                else:
                    pump.kick()
            case Deactivate():
                pump.cancel()
            case Committed() | GraphEnd():
                if reply:
                    pump.kick()
            case GraphBegin():
                pass  # nothing to send yet: the graph's pushes come through GraphPush
            case GraphPush():
                # on the graph's thread: the wire pushes go back through the graph, the rest
                # (or a fetch) from the loop
                carry, wire, run = reply
                if run and pump.loop is not None:
                    pump.loop.call_threadsafe(pump.run)
                return carry, wire
            case GraphAck():  # the loop reports progress and pushes
                if pump.loop is not None:
                    pump.loop.call_threadsafe(pump.run)
            case _:
                pump.kick()
        return reply

    def _run(self, now_ms: int) -> int | None:
        with self.lock:
            r = self.logic.step(TURN_END, now_ms)
        ports = self.ports
        for req in r.pushes:
            ports.push(req)
        if r.fetch is not None:
            ports.fetch(r.fetch)
        if r.report is not None:
            ports.report(*r.report)
        if r.progress is not None:
            ports.progress(*r.progress)
        if r.background is not None:
            ports.priority(r.background)
        return r.wake_at_ms
