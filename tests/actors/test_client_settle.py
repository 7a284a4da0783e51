"""LedgerClient settles every append of a call exactly once, without Ray, when the call's
answer races the caller's deadline (``_expire``) or an ``append_future`` caller's cancel.

Each race is made deterministic by a future that lets the competitor in at its first look:
with ``done`` at a ``done()`` check (which then answers stale), with ``set`` (or when nothing
checks) in ``set_result``/``set_exception``, just before they would have won."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import numpy as np
import pytest
from rayledger.actors.client import LedgerClient, _Pending
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

TRIGGERS = ["done", "set"]


class Racy(concurrent.futures.Future):
    """A pending future that runs ``competitor`` once, at the first ``done()`` (when the
    trigger is ``done``) or ``set_*``: ``done`` answers stale, ``set_*`` finds it taken."""

    def __init__(self, trigger: str):
        super().__init__()
        self.trigger = trigger
        self.competitor: Callable[[], object] | None = None
        self.fired = False

    def _fire(self) -> None:
        if self.competitor is not None and not super().done():
            fn, self.competitor = self.competitor, None
            self.fired = True
            fn()

    def done(self) -> bool:
        d = super().done()
        if self.trigger == "done":
            self._fire()
        return d

    def set_result(self, result) -> None:
        self._fire()
        super().set_result(result)

    def set_exception(self, exception) -> None:
        self._fire()
        super().set_exception(exception)


def sent(bodies: list[bytes], future: concurrent.futures.Future | None = None) -> _Pending:
    p = _Pending(bodies, time.monotonic() + 30, **({"future": future} if future else {}))
    p.sent = True
    return p


def answer(first: int, positions: list[int]) -> concurrent.futures.Future:
    """The Ray future of a call whose entries committed from ``first`` at ``positions``."""
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_result((first, 7, np.array(positions, dtype=np.int64).tobytes()))
    return f


def outcome(p: _Pending):
    assert p.future.done(), "an append of the call was never settled"
    return p.future.exception() or p.future.result()


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_deadline_racing_the_answer_never_stops_the_rest_of_the_call(trigger):
    c = LedgerClient("g", ["n0"])
    p1 = sent([b"a"], Racy(trigger))
    p2, p3 = sent([b"b", b"c"]), sent([b"d"])
    expired = []
    p1.future.competitor = lambda: expired.append(c._expire(p1))  # the caller's own thread
    c._in_flight = 1
    c._done([p1, p2, p3], "n0", answer(8, [0, 10, 20, 30]))
    assert c._in_flight == 0
    assert p1.future.fired and isinstance(expired[0], OutcomeUnknownError)
    assert outcome(p1) is expired[0]  # the caller gets exactly what the future holds
    assert [(r.index, r.pos) for r in outcome(p2)] == [(9, 10), (10, 20)]
    assert [(r.index, r.pos) for r in outcome(p3)] == [(11, 30)]


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_deadline_racing_a_failed_call_never_stops_the_rest_of_the_call(trigger):
    c = LedgerClient("g", ["n0"])
    p1 = sent([b"a"], Racy(trigger))
    p2, p3 = sent([b"b"]), sent([b"c"])
    expired = []
    p1.future.competitor = lambda: expired.append(c._expire(p1))
    c._in_flight = 1
    died: concurrent.futures.Future = concurrent.futures.Future()
    died.set_exception(RuntimeError("the actor died"))
    c._done([p1, p2, p3], "n0", died)
    assert c._in_flight == 0
    assert p1.future.fired
    assert outcome(p1) is expired[0]
    for p in (p1, p2, p3):
        e = outcome(p)
        assert isinstance(e, OutcomeUnknownError), e
        assert e.code == ResponseCode.APPEND_OUTCOME_UNKNOWN


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_an_answer_landing_as_the_deadline_fires_is_what_the_caller_gets(trigger):
    c = LedgerClient("g", ["n0"])
    p = sent([b"a"], Racy(trigger))
    c._in_flight = 1
    p.future.competitor = lambda: c._done([p], "n0", answer(4, [64]))  # on a Ray thread
    exc = c._expire(p)
    assert p.future.fired
    assert exc is None, f"the append committed, yet the caller gets {exc!r}"
    assert [(r.index, r.pos) for r in p.future.result()] == [(4, 64)]
    assert c._in_flight == 0


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_cancel_racing_the_sender_or_close_leaves_the_rest_settled(trigger):
    """``append_future`` hands out the future, so its caller may cancel it at any moment."""
    c = LedgerClient("g", ["n0"])
    gone = _Pending([b"a"], time.monotonic() - 1, future=Racy(trigger))
    also_gone = _Pending([b"b"], time.monotonic() - 1)
    gone.future.competitor = gone.future.cancel
    with c._cv:
        c._queue.extend([gone, also_gone])
        assert c._take() == []
    assert gone.future.cancelled()
    assert outcome(also_gone).code == ResponseCode.TIMEOUT

    queued = [_Pending([b"c"], time.monotonic() + 30, future=Racy(trigger)), _Pending([b"d"], 0)]
    queued[0].future.competitor = queued[0].future.cancel
    c._queue.extend(queued)
    c.close()
    assert queued[0].future.cancelled()
    e = outcome(queued[1])
    assert isinstance(e, LedgerError) and e.code == ResponseCode.TIMEOUT
