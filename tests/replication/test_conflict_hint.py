"""The follower's conflict hint on a refused COMPARE, and the dispatcher's jump.

Without the hint COMPARE steps back one index per round trip; with it a round trip skips a
whole term, and the dispatcher still lands on the exact match point (Log Matching).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rayledger.integration.bench.divergent import converge
from rayledger.replication import (
    DispatcherState,
    EntryDispatcher,
    EntryHandler,
    PushType,
    ReplicationConfig,
)
from rayledger.replication.dispatcher import LeaderView
from rayledger.replication.messages import LeaderInfo, Push
from rayledger.replication.push import FollowerAnswer, FreshState, NextPushes
from rayledger.storage import ResponseCode

from .helpers import FOLLOWER, GROUP, LEADER, follower_state, push, store_with

S = ResponseCode.SUCCESS
BAD = ResponseCode.INCONSISTENT_STATE


def compare_answer(follower_terms: list[int], index: int, entry_term: int = 9):
    """The real handler's answer to a COMPARE at ``index`` naming an entry it lacks."""
    h = EntryHandler(
        GROUP, FOLLOWER, follower_state(), store_with(follower_terms), ReplicationConfig()
    )
    ((_, r),) = h.step(
        Push(push(PushType.COMPARE, first_index=index, entry_term=entry_term, entry_pos=0), "t"), 0
    )
    return r


def test_hint_names_the_term_at_the_probe_and_its_first_index() -> None:
    r = compare_answer([1, 1, 2, 2, 2, 4, 4, 4, 4], 7)
    assert r.code == BAD and (r.conflict_term, r.conflict_index) == (4, 5)
    r = compare_answer([1, 1, 2, 2, 2, 4, 4, 4, 4], 4)  # the last entry of a term
    assert (r.conflict_term, r.conflict_index) == (2, 2)
    r = compare_answer([1, 1, 2, 2, 2, 4, 4, 4, 4], 5)  # the first entry of a term
    assert (r.conflict_term, r.conflict_index) == (4, 5)
    r = compare_answer([3] * 6, 4)  # one term from the log's first entry
    assert (r.conflict_term, r.conflict_index) == (3, 0)


def test_hint_from_a_follower_shorter_than_the_probe_is_about_its_end() -> None:
    r = compare_answer([1, 2, 2, 2], 50)
    assert r.code == BAD and r.end_index == 3
    assert (r.conflict_term, r.conflict_index) == (2, 1)


def test_hint_from_a_log_that_begins_inside_a_term() -> None:
    store = store_with([1] * 4)
    store.reset(10, store.write_pos)
    store.append_as_leader([b"a", b"b", b"c"], 5)
    h = EntryHandler(GROUP, FOLLOWER, follower_state(), store, ReplicationConfig())
    ((_, r),) = h.step(Push(push(PushType.COMPARE, first_index=12, entry_term=9), "t"), 0)
    assert (r.conflict_term, r.conflict_index) == (5, 10)


def test_no_hint_from_an_empty_log_or_on_a_match() -> None:
    r = compare_answer([], 3)
    assert r.code == BAD and (r.conflict_term, r.conflict_index) == (-1, -1)
    store = store_with([1, 1, 2])
    h = EntryHandler(GROUP, FOLLOWER, follower_state(), store, ReplicationConfig())
    req = push(PushType.COMPARE, first_index=2, entry_term=2, entry_pos=store.get_pos(2))
    ((_, r),) = h.step(Push(req, "t"), 0)
    assert r.code == S and (r.conflict_term, r.conflict_index) == (-1, -1)


def next_compare_after(leader_terms: list[int], follower_terms: list[int]) -> int:
    """The index of the second COMPARE once the follower's hinted answer to the first is in."""
    log = store_with(leader_terms)
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig())
    d.step(FreshState(2, LEADER, True), 0)
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, compare_answer(follower_terms, req.first_index, req.entry_term)), 0)
    assert d.state is DispatcherState.COMPARE
    (req,) = d.step(NextPushes(log), 0)
    assert req.type is PushType.COMPARE
    return req.first_index


@pytest.mark.parametrize(
    ("leader", "follower", "index"),
    [
        # a long divergent tail of an older term: straight to the shared prefix
        ([1, 1, 3, 3, 3, 3], [1, 1] + [2] * 20, 1),
        # the leader holds the hinted term too: to its last entry of that term
        ([1, 2, 2, 3, 3], [1, 2, 2, 2, 2, 2, 2], 2),
        # the leader's last entry of a term <= the hint is older than the hinted term:
        # everything from the hinted first index differs, go below it
        ([1, 1, 1, 1, 1, 3], [1, 1, 2, 2, 2, 2, 2], 1),
        # a follower shorter than the probe, its end in a term the leader lacks
        ([1, 1] + [3] * 8, [1, 1, 2, 2], 1),
        # a follower shorter than the probe whose end matches: compare right there
        ([1, 1, 2, 2, 3, 3, 3], [1, 1, 2, 2], 3),
    ],
)
def test_dispatcher_jumps_by_the_hint(leader: list[int], follower: list[int], index: int) -> None:
    assert next_compare_after(leader, follower) == index


def test_hint_below_the_leader_begin_resets_the_follower() -> None:
    log = store_with([1] * 4)
    log.reset(10, log.write_pos)  # the leader's log begins at 10
    log.append_as_leader([b"a", b"b", b"c"], 5)
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig())
    d.step(FreshState(5, LEADER, True), 0)
    (req,) = d.step(NextPushes(log), 0)
    assert req.first_index == 12
    follower = compare_answer([1] * 5 + [3] * 10, 12)  # term 3 from 5: nothing at 10.. matches
    d.step(FollowerAnswer(req, follower), 0)
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10


def test_hint_reads_wait_for_a_leader_view_to_fetch_them() -> None:
    """Through the actors' cache of the leader's log a read may be missing: the jump waits
    for it (``need``) and lands where it would on the store itself."""
    store = store_with([1, 1] + [3] * 30)
    end = store.ledger_end_index
    view = LeaderView(1 << 20)
    view.reset(LeaderInfo(3, 0, end, 3, store.get_pos(end), -1, end))
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig())
    d.step(FreshState(3, LEADER, True), 0)
    (req,) = d.step(NextPushes(view), 0)
    d.step(FollowerAnswer(req, compare_answer([1, 1] + [2] * 40, req.first_index, 3)), 0)
    fetches = 0
    while not (reqs := d.step(NextPushes(view), 0)):
        assert d.need is not None and d.need.kind == "meta"
        view.meta[d.need.index] = (store.get_term(d.need.index), store.get_pos(d.need.index))
        fetches += 1
    assert fetches <= 8  # a binary search, not a walk over 30 entries
    (req,) = reqs
    assert req.type is PushType.COMPARE and req.first_index == 1


def run(leader_runs: list[tuple[int, int]], follower_runs: list[tuple[int, int]], term: int):
    """Build both logs from (term, count) runs (an entry is its index and term) and drive
    the real cores until the follower holds the leader's log."""
    leader = store_with([t for t, n in leader_runs for _ in range(n)], b"e")
    follower = store_with([t for t, n in follower_runs for _ in range(n)], b"e")
    return converge(leader, follower, term)


def test_long_divergent_tail_over_several_terms_converges_in_few_round_trips() -> None:
    res = run([(1, 50), (6, 3000)], [(1, 50), (2, 1000), (3, 1000), (5, 1000)], 6)
    assert res.matched_at == 49
    assert res.compares <= 3  # stepping back: 3001 COMPAREs


def test_leader_holding_some_of_the_follower_terms() -> None:
    # both received term 2 entries 0..99 from its leader; the follower kept more of term 2
    res = run([(1, 10), (2, 90), (4, 500)], [(1, 10), (2, 400), (3, 200)], 4)
    assert res.matched_at == 99
    assert res.compares <= 4


def test_follower_shorter_than_the_leader_and_divergent() -> None:
    res = run([(1, 10), (4, 2000)], [(1, 10), (2, 5), (3, 5)], 4)
    assert res.matched_at == 9
    assert res.compares <= 3


def test_follower_that_is_a_prefix_needs_two_compares() -> None:
    res = run([(1, 10), (2, 500)], [(1, 10), (2, 100)], 2)
    assert res.matched_at == 109 and res.compares == 2  # its end, then a match


@settings(max_examples=60, deadline=None)
@given(
    shared=st.lists(st.integers(1, 30), max_size=4),
    leader_tail=st.lists(st.integers(1, 30), max_size=4),
    follower_tail=st.lists(st.integers(1, 30), max_size=4),
    owners=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_any_divergence_converges_to_the_exact_match_point(
    shared: list[int], leader_tail: list[int], follower_tail: list[int], owners: list[bool]
) -> None:
    """Raft-shaped logs: a shared prefix (terms 1..), then each side's own terms (a term's
    entries come from one leader, so the two tails never share a term).  The match point is
    the end of the shared prefix; at most one COMPARE per term run plus two."""
    runs = [(t + 1, n) for t, n in enumerate(shared)]
    base = len(runs) + 1
    # each later term belongs to one side: the two tails never share a term
    mine = [base + i for i, leader_owns in enumerate(owners) if leader_owns]
    theirs = [base + i for i, leader_owns in enumerate(owners) if not leader_owns]
    lead = list(zip(mine, leader_tail, strict=False))
    foll = list(zip(theirs, follower_tail, strict=False))
    assume(runs or lead)  # the leader has a log to replicate
    res = run(runs + lead, runs + foll, base + 9)
    assert res.matched_at == sum(n for _, n in runs) - 1
    assert res.compares <= len(lead) + len(foll) + 2


def test_divergent_tail_measurement() -> None:
    from rayledger.integration.bench.divergent import divergent_tail

    out = divergent_tail(5000, prefix=100)
    assert out["matched_at"] == 99 and out["compares"] == 2 and out["round_trips"] <= 5
    with pytest.raises(ValueError):
        divergent_tail(0)
