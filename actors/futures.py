"""Settling futures that may already be done (a waiter that timed out, an answer that came
twice): the member and its parts never settle one twice.

A member's calls wait on two kinds: ``concurrent.futures.Future`` for the calls Ray's threads
block on (appends, pushes, membership changes: settled from any thread), and asyncio futures of
the member's loops (reads, transfers: settled on their loop, see :func:`settle_threadsafe`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import InvalidStateError
from typing import Any


def set_result(fut: Any, value: Any) -> None:
    try:
        if not fut.done():
            fut.set_result(value)
    except (InvalidStateError, asyncio.InvalidStateError):  # settled by another thread
        pass


def set_exception(fut: Any, exc: BaseException) -> None:
    try:
        if not fut.done():
            fut.set_exception(exc)
    except (InvalidStateError, asyncio.InvalidStateError):
        pass


def settle_threadsafe(fut: Any, value: Any) -> None:
    """Settle ``fut`` with ``value`` (an exception fails it) from any thread: an asyncio
    future on its own loop, any other at once."""
    fn = set_exception if isinstance(value, BaseException) else set_result
    if isinstance(fut, asyncio.Future):
        fut.get_loop().call_soon_threadsafe(fn, fut, value)
    else:
        fn(fut, value)
