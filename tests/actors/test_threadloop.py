"""The helpers' loop: callbacks in the order asked from any thread, timers by deadline
(a cancelled one never runs, nor wakes the loop), a call's answer or error handed over on the loop's thread,
and a failing callback that does not stop the loop."""

from __future__ import annotations

import concurrent.futures
import threading
import time

from rayledger.actors.threadloop import ThreadLoop


class _Ref:
    """What the loop uses of an ObjectRef: its ``future()``."""

    def __init__(self) -> None:
        self.fut: concurrent.futures.Future = concurrent.futures.Future()

    def future(self) -> concurrent.futures.Future:
        return self.fut


def _wait(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "the loop did not get there in time"
        time.sleep(0.001)


def test_callbacks_run_in_order_on_the_loops_thread() -> None:
    loop, seen = ThreadLoop("test-order"), []
    for i in range(200):
        loop.call_soon(lambda i=i: seen.append((i, threading.current_thread().name)))
    _wait(lambda: len(seen) == 200)
    assert [i for i, _ in seen] == list(range(200))
    assert {name for _, name in seen} == {"test-order"}


def test_timers_fire_by_deadline_and_a_cancelled_one_never() -> None:
    loop, seen = ThreadLoop("test-timers"), []
    loop.call_later_ms(60, seen.append, "late")
    gone = loop.call_later_ms(20, seen.append, "cancelled")
    loop.call_later_ms(10, seen.append, "early")
    gone.cancel()
    _wait(lambda: "late" in seen)
    time.sleep(0.03)
    assert seen == ["early", "late"]


def test_a_timer_cancelled_on_the_loop_does_not_wake_it() -> None:
    """A pump re-arms its timer on every run (cancel, then a later one): the loop sleeps to
    the live timer, not to the cancelled one's deadline."""
    loop, fired = ThreadLoop("test-rearm"), threading.Event()
    waits: list[float | None] = []
    wait = loop._cv.wait

    def counted(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return wait(timeout)

    loop._cv.wait = counted  # type: ignore[method-assign]

    def rearm() -> None:
        loop.call_later_ms(20, fired.set).cancel()
        waits.clear()
        loop.call_later_ms(150, fired.set)

    loop.call_soon(rearm)
    assert fired.wait(5)
    assert waits[0] is not None and waits[0] > 0.1, waits  # then None: no timer left


def test_a_calls_answer_and_error_come_back_on_the_loop() -> None:
    loop, seen = ThreadLoop("test-done"), []
    ok, bad = _Ref(), _Ref()
    note = lambda v, e: seen.append((v, type(e).__name__, threading.current_thread().name))  # noqa: E731
    loop.on_done(ok, note)
    loop.on_done(bad, note)
    threading.Thread(target=ok.fut.set_result, args=(7,)).start()
    threading.Thread(target=bad.fut.set_exception, args=(ValueError("x"),)).start()
    _wait(lambda: len(seen) == 2)
    assert sorted(seen, key=repr) == [
        (7, "NoneType", "test-done"),
        (None, "ValueError", "test-done"),
    ]


def test_a_failing_callback_does_not_stop_the_loop() -> None:
    loop, seen = ThreadLoop("test-fail"), []
    loop.call_soon(lambda: 1 / 0)
    loop.call_soon(seen.append, "after")
    _wait(lambda: seen == ["after"])
