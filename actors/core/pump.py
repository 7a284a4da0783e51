"""The loop a helper's core runs on, and the pump that turns its ``ready`` into actions.

Sans-I/O: a :class:`Loop` is whatever delivers -- asyncio on a Ray actor
(:class:`~rayledger.actors.aioloop.AsyncioLoop`), the simulation's node-local queue in
``tests/simulation``.  The helper drivers (:mod:`.checker`, :mod:`.dispatcher`) only talk to a Loop,
so the Ray actors and the simulation run the same drivers over the same cores; what differs is how a
call, a timer or a hop between threads is carried.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, Protocol, TypeVar


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
    (:meth:`kick`), and again at the wake time it returns (one timer, re-armed each run)."""

    __slots__ = ("loop", "step", "scheduled", "timer")

    def __init__(self, loop: Loop | None, step: Callable[[int], int | None]):
        self.loop = loop
        self.step = step
        self.scheduled = False
        self.timer: Handle | None = None

    def kick(self) -> None:
        if not self.scheduled and self.loop is not None:
            self.scheduled = True
            self.loop.call_soon(self.run)

    def run(self) -> None:
        self.scheduled = False
        self.cancel()
        if self.loop is None:
            return
        now = self.loop.now_ms()
        wake = self.step(now)
        if wake is not None:
            self.timer = self.loop.call_later_ms(max(1, wake - now), self.run)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


L = TypeVar("L")
P = TypeVar("P")


class Driver(Generic[L, P]):
    """What every helper driver holds: its core (``logic``), where its messages go
    (``ports``), the lock a compiled graph's thread takes too (``lock``), and the :class:`Pump` that
    runs :meth:`_run` -- the core's ``ready`` carried out -- on the loop it is attached to."""

    def __init__(self, logic: L, ports: P, lock: AbstractContextManager | None = None):
        self.logic = logic
        self.ports = ports
        # a shell whose events also come from another thread (a compiled graph's) passes a
        # threading.Lock; one thread needs none
        self.lock = lock if lock is not None else nullcontext()
        self.pump = Pump(None, self._run)

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
