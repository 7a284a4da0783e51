"""The compiled path parks when idle and wakes on the next round (``FastPathLogic``, no Ray).

A live Ray Compiled Graph's participants busy-wait on their input channels, about a core
each, so the core tears an idle graph down after ``park_ms`` and builds it again when the
next round is offered, which meanwhile travels as plain calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayledger.actors.core.fastpath import (
    Admits,
    Began,
    Built,
    Collected,
    Enqueue,
    FastPathLogic,
    Route,
    Start,
    Stop,
)
from rayledger.replication.messages import TURN_END

PARK = 1000


@dataclass(frozen=True)
class Ann:
    nbytes: int = 100

    def followed_by(self, other: Ann) -> Ann:
        return Ann(self.nbytes + other.nbytes)


def live(now: int = 0) -> tuple[FastPathLogic, object]:
    """A leader of term 3 whose graph is built and begun at ``now``."""
    fp = FastPathLogic(followers=2, stall_ms=50_000, park_ms=PARK)
    fp.step(Start(3), now)
    build_id, term = fp.step(TURN_END, now).build
    graph = object()
    fp.step(Built(build_id, term, graph, None), now)
    term, gen = fp.step(TURN_END, now).begin
    fp.step(Began(term, gen, True), now)
    assert fp.active and fp.offered
    return fp, graph


def run_round(fp: FastPathLogic, now: int) -> None:
    assert fp.step(Admits(Ann()), now) is Route.GRAPH
    fp.step(Enqueue(Ann(), [(0, 0, "r")]), now)
    ((_, ex),) = fp.step(TURN_END, now).executions
    for _ in range(fp.followers):
        fp.step(Collected(ex, None), now)


def test_an_idle_graph_is_torn_down_after_park_ms() -> None:
    fp, graph = live(0)
    run_round(fp, 100)
    assert fp.step(TURN_END, 100 + PARK - 1).wake_at_ms == 100 + PARK  # not yet: wake then
    out = fp.step(TURN_END, 100 + PARK)
    assert out.teardown == [graph] and out.ended is not None and out.fallback == []
    assert fp.parked and not fp.active and fp.offered and fp.parks == 1 and fp.fallbacks == 0
    assert fp.step(TURN_END, 100 + 10 * PARK).build is None  # parked: nothing is built meanwhile


def test_the_next_round_goes_plain_and_builds_the_graph_again() -> None:
    fp, _ = live(0)
    fp.step(TURN_END, PARK)  # parked
    assert fp.step(Admits(Ann()), 5000) is Route.RESUME  # this round: plain calls
    assert not fp.parked and fp.step(TURN_END, 5000).build is not None
    assert fp.step(Admits(Ann()), 5001) is Route.PLAIN  # building: plain, no second build
    assert fp.step(TURN_END, 5001).build is None


def test_a_graph_with_an_execution_in_flight_is_never_parked() -> None:
    fp, _ = live(0)
    assert fp.step(Admits(Ann()), 10) is Route.GRAPH
    fp.step(Enqueue(Ann(), [(0, 0, "r")]), 10)
    ((_, ex),) = fp.step(TURN_END, 10).executions
    out = fp.step(TURN_END, 10 + 5 * PARK)  # one chain still has not answered
    assert out.teardown == [] and fp.active and not fp.parked
    fp.step(Collected(ex, None), 10 + 5 * PARK)
    fp.step(Collected(ex, None), 10 + 5 * PARK)
    assert fp.step(TURN_END, 10 + 5 * PARK).teardown  # idle since its last round: parked now


def test_a_round_keeps_the_graph_live_for_another_park_ms() -> None:
    fp, _ = live(0)
    for t in range(0, 10 * PARK, PARK // 2):  # a round every half park_ms
        run_round(fp, t)
        assert not fp.step(TURN_END, t).teardown
    assert fp.active and fp.parks == 0


def test_a_term_that_ends_while_parked_leaves_nothing_to_wake() -> None:
    fp, _ = live(0)
    fp.step(TURN_END, PARK)
    fp.step(Stop(), PARK + 1)
    assert not fp.parked and not fp.offered
    assert fp.step(Admits(Ann()), PARK + 2) is Route.PLAIN
    assert fp.step(TURN_END, PARK + 2).build is None


def test_a_graph_that_served_long_falls_back_with_the_shortest_backoff() -> None:
    """Backoff doubles for graphs that fail soon after they begin, and starts over for one
    that served longer than the longest backoff (a stall now and then on a busy host)."""
    fp = FastPathLogic(followers=2, stall_ms=50, park_ms=10**9, retry_ms=(1000, 15000))
    fp.step(Start(3), 0)

    def build_and_stall(now: int) -> int:
        """Build at ``now``, then stall an execution; returns when the next build is due."""
        build_id, term = fp.step(TURN_END, now).build
        fp.step(Built(build_id, term, object(), None), now)
        fp.step(Began(*fp.step(TURN_END, now).begin, True), now)
        assert fp.step(Admits(Ann()), now) is Route.GRAPH
        fp.step(Enqueue(Ann(), [(0, 0, "r")]), now)
        fp.step(TURN_END, now)
        assert fp.step(TURN_END, now + 50).fallback  # stalled: plain calls take over
        return fp.step(TURN_END, now + 50).wake_at_ms - (now + 50)

    assert build_and_stall(0) == 1000
    assert build_and_stall(2000) == 2000  # failed soon after it began: twice as long
    assert build_and_stall(5000) == 4000
    t = 20_000
    build_id, term = fp.step(TURN_END, t).build
    fp.step(Built(build_id, term, object(), None), t)
    fp.step(Began(*fp.step(TURN_END, t).begin, True), t)
    for now in range(t, t + 20_000, 1000):
        run_round(fp, now)  # served 20 s
    assert fp.step(Admits(Ann()), t + 20_000) is Route.GRAPH
    fp.step(Enqueue(Ann(), [(0, 0, "r")]), t + 20_000)
    fp.step(TURN_END, t + 20_000)
    assert fp.step(TURN_END, t + 20_050).fallback
    assert fp.step(TURN_END, t + 20_050).wake_at_ms == t + 20_050 + 1000


def test_a_stop_within_the_term_hands_its_rounds_back_as_plain_calls() -> None:
    """A reconfiguration or a restored helper stops the graph while the member still leads:
    rounds in flight or queued in it must go as plain calls -- dropped, they waited
    unanswered until the term ended."""
    fp, graph = live(0)
    assert fp.step(Admits(Ann()), 10) is Route.GRAPH
    fp.step(Enqueue(Ann(), [(0, 0, "in flight")]), 10)
    fp.step(TURN_END, 10)  # executing
    assert fp.step(Admits(Ann(5000)), 11) is Route.GRAPH
    fp.step(Enqueue(Ann(5000), [(1, 1, "queued")]), 11)
    fp.step(Stop(), 12)
    out = fp.step(TURN_END, 12)
    assert [rounds for _, rounds in out.fallback] == [((0, 0, "in flight"),), ((1, 1, "queued"),)]
    assert graph in out.teardown and not fp.active
