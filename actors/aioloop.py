"""The :class:`~rayledger.actors.core.pump.Loop` of a Ray actor: its running asyncio loop and a
monotonic clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from rayledger.actors.core.pump import Handle


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
