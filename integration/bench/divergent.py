"""How fast a follower with a long divergent tail converges on the leader's log.

An old leader that rejoins with a long uncommitted tail of its own term must find where its
log stops matching the new leader's, drop the rest and take the leader's entries.  COMPARE
used to step back one index per round trip; with the follower's conflict hint
it skips a term per round trip.  :func:`converge` drives the real :class:`EntryDispatcher`
and :class:`EntryHandler` cores against each other in process (a push is answered by a
function call) and counts round trips; :func:`divergent_tail` times the worst case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rayledger.election import MemberState, MemoryTermStore
from rayledger.replication import (
    DispatcherState,
    EntryDispatcher,
    EntryHandler,
    PushType,
    ReplicationConfig,
)
from rayledger.replication.messages import Push
from rayledger.replication.push import FollowerAnswer, FreshState, NextPushes
from rayledger.storage import LogStore, MemoryStore, StoreConfig

GROUP = "diverge"
LEADER = "leader"
FOLLOWER = "follower"


@dataclass
class Convergence:
    """What :func:`converge` took: ``round_trips`` counts every batch of pushes sent
    together (pipelined APPENDs count once), ``compares`` the COMPARE round trips."""

    round_trips: int
    compares: int
    truncates: int
    matched_at: int  # the index COMPARE found the logs matching up to (-1: none, reset)
    seconds: float


def _logs_equal(a: LogStore, b: LogStore) -> bool:
    if (a.ledger_begin_index, a.ledger_end_index) != (b.ledger_begin_index, b.ledger_end_index):
        return False
    if a.ledger_end_index < a.ledger_begin_index:
        return True
    start = a.ledger_begin_index
    return a.read_batch(start).data == b.read_batch(start).data


def converge(
    leader: LogStore,
    follower: LogStore,
    term: int,
    *,
    config: ReplicationConfig | None = None,
    max_round_trips: int = 1_000_000,
) -> Convergence:
    """Replicate ``leader`` (leading ``term``) to ``follower`` until both logs are equal.

    Raises RuntimeError when the follower has not converged after ``max_round_trips``, or
    when the logs differ at the end (the cores broke Log Matching).
    """
    cfg = config or ReplicationConfig()
    state = MemberState(GROUP, FOLLOWER, [LEADER, FOLLOWER], MemoryTermStore(term=term))
    state.change_to_follower(term, LEADER)
    dispatcher = EntryDispatcher(GROUP, LEADER, FOLLOWER, cfg)
    dispatcher.step(FreshState(term, LEADER, True), 0)
    handler = EntryHandler(GROUP, FOLLOWER, state, follower, cfg)
    trips = compares = truncates = 0
    matched_at = -1
    now = idle = 0
    t0 = time.perf_counter()
    while not (
        dispatcher.state is DispatcherState.APPEND
        and dispatcher.water_mark == leader.ledger_end_index
    ):
        if trips >= max_round_trips:
            raise RuntimeError(f"no convergence after {trips} round trips: {dispatcher!r}")
        reqs = dispatcher.step(NextPushes(leader), now)
        if not reqs:
            idle += 1
            if idle > 1000:
                raise RuntimeError(f"the dispatcher sends nothing: {dispatcher!r}")
            now = dispatcher.next_wakeup_ms(now) or now + 1
            continue
        trips += 1
        idle = 0
        for req in reqs:
            if req.type is PushType.COMPARE:
                compares += 1
            elif req.type is PushType.TRUNCATE:
                truncates += 1
                matched_at = req.first_index - 1 if req.reset else req.first_index
            for tok, resp in handler.step(Push(req, req), now):
                dispatcher.step(FollowerAnswer(tok, resp), now)
                if tok.type is PushType.COMPARE and dispatcher.state is DispatcherState.APPEND:
                    matched_at = tok.first_index
    seconds = time.perf_counter() - t0
    if not _logs_equal(leader, follower):
        raise RuntimeError(f"logs differ after converging: {dispatcher!r} {handler!r}")
    return Convergence(trips, compares, truncates, matched_at, seconds)


def _store(runs: list[tuple[int, int]], tag: bytes) -> MemoryStore:
    """A MemoryStore holding ``count`` entries of ``term`` for each (term, count) in order."""
    store = MemoryStore(
        StoreConfig(data_segment_size=256 * 1024 * 1024, index_segment_size=64 * 1024 * 1024)
    )
    n = 0
    for term, count in runs:
        for start in range(0, count, 10_000):
            k = min(10_000, count - start)
            store.append_as_leader([tag + str(n + i).encode() for i in range(k)], term)
            n += k
    return store


def divergent_tail(entries: int = 100_000, prefix: int = 1000) -> dict:
    """A follower holding ``prefix`` shared entries (term 1) then ``entries`` of its own
    term 2; the leader (term 3) holds the same prefix then ``entries`` of term 3.  Returns
    the seconds and round trips until the follower's log equals the leader's."""
    if entries <= 0 or prefix < 0:
        raise ValueError("entries must be positive, prefix non-negative")
    leader = _store([(1, prefix), (3, entries)], b"p")
    follower = _store([(1, prefix), (2, entries)], b"p")
    res = converge(leader, follower, 3)
    if res.matched_at != prefix - 1:
        raise RuntimeError(f"matched at {res.matched_at}, expected {prefix - 1}")
    return {
        "entries": entries,
        "seconds": round(res.seconds, 4),
        "round_trips": res.round_trips,
        "compares": res.compares,
        "truncates": res.truncates,
        "matched_at": res.matched_at,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(divergent_tail()))
