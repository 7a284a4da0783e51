"""The :class:`~rayledger.actors.core.pump.Loop` of a threaded Ray actor: one thread that
runs callbacks in order and timers from a heap.

A threaded (sync) Ray actor receives a call for about 40 % less CPU than an asyncio one, and
a result taken through ``ObjectRef.future()`` costs about 35 % less than an ``await`` (one
actor calling another on this machine: 300-410 us against 490-690 us at the callee; see
docs/BENCHMARKS.md).  The helpers (checker, dispatchers) are such actors: Ray's threads
deliver their calls straight to the driver, under its lock, and this loop carries the rest
-- the pump's end-of-turn runs, its timers, and the answers of the calls the helper makes,
which Ray hands to a callback thread that must not block (:meth:`ThreadLoop.on_done` hops
them over here).  The thread lives as long as the actor's process.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("rayledger.actors")


class _Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ThreadLoop:
    """A :class:`Loop` on a thread of its own: ``call_soon`` from any thread, in order."""

    def __init__(self, name: str = "rayledger-loop"):
        self._ready: collections.deque = collections.deque()
        self._timers: list = []  # (when_s, seq, timer, fn, args)
        self._seq = itertools.count()
        self._cv = threading.Condition(threading.Lock())
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def now_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cv:
            self._ready.append((fn, args))
            if len(self._ready) == 1:
                self._cv.notify()

    call_threadsafe = call_soon

    def call_later_ms(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> _Timer:
        t = _Timer()
        when = time.monotonic() + delay_ms / 1000
        with self._cv:
            heapq.heappush(self._timers, (when, next(self._seq), t, fn, args))
            if self._timers[0][2] is t:
                self._cv.notify()
        return t

    def on_done(self, ref: Any, fn: Callable[[Any, BaseException | None], Any]) -> None:
        """``fn(value, error)`` on this loop once ``ref`` (an ObjectRef) is ready."""

        def done(fut: Any) -> None:
            exc = fut.exception()
            self.call_soon(fn, None if exc is not None else fut.result(), exc)

        ref.future().add_done_callback(done)

    def _next(self) -> list:
        """The callbacks due now, waiting for them."""
        with self._cv:
            while True:
                now = time.monotonic()
                due = []
                while self._timers and self._timers[0][0] <= now:
                    _, _, t, fn, args = heapq.heappop(self._timers)
                    if not t.cancelled:
                        due.append((fn, args))
                if self._ready:
                    due.extend(self._ready)
                    self._ready.clear()
                if due:
                    return due
                # a cancelled timer on top would wake the thread for nothing: a pump re-arms
                # its timer on every run, so each run would cost a wake-up later
                while self._timers and self._timers[0][2].cancelled:
                    heapq.heappop(self._timers)
                wait = self._timers[0][0] - now if self._timers else None
                self._cv.wait(wait)

    def _run(self) -> None:
        while True:
            for fn, args in self._next():
                try:
                    fn(*args)
                except Exception:  # one callback's failure must not stop the helper
                    log.exception("callback %r failed", fn)
