"""asyncio loops of Ray actors: the :class:`~rayledger.actors.core.pump.Loop` over a running one,
and loops a threaded actor owns on threads of their own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from rayledger.actors.core.pump import Handle

T = TypeVar("T")


class AsyncioLoop:
    """A :class:`Loop` over the running asyncio loop of a Ray actor."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def now_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.loop.call_soon(fn, *args)

    def call_later_ms(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> Handle:
        return self.loop.call_later(delay_ms / 1000, fn, *args)

    def call_threadsafe(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.loop.call_soon_threadsafe(fn, *args)


def start_loop(name: str) -> asyncio.AbstractEventLoop:
    """A new asyncio loop running on a daemon thread of its own (``name``), for the parts of
    a threaded actor that wait on timers and on other actors; it lives as long as the
    process."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name=name, daemon=True).start()
    return loop


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` from another thread (one of Ray's) and block that thread
    for its result or its exception."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` as a coroutine, for :func:`run_on` (a step that must run on a loop)."""
    return fn(*args)
