"""Settling asyncio futures that may already be done (a waiter that timed out, an answer
that came twice): the member and its parts never settle one twice."""

from __future__ import annotations

import asyncio


def set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
