from __future__ import annotations

from rayledger.replication import QuorumAckChecker, ReplicationConfig
from rayledger.replication.checker import AwaitQuorum, CheckQuorum, EndTerm, LeadTerm, MarkStored
from rayledger.storage import ResponseCode


def checker(n: int = 3, **cfg) -> QuorumAckChecker:
    ids = [f"m{i}" for i in range(n)]
    return QuorumAckChecker("g", "m0", ids, ReplicationConfig(**cfg))


def leading(end: int, *rounds: tuple[int, int, str]) -> QuorumAckChecker:
    """A 3-member checker leading term 1 from index 0 with its own log ending at ``end``,
    waiting for the quorum of ``rounds`` (first, last, token) registered at time 0."""
    c = checker(3)
    c.step(LeadTerm(1, 0, end), 0)
    for first, last, token in rounds:
        c.step(AwaitQuorum(1, first, last, token), 0)
    return c


def codes(resolved) -> list[tuple]:
    return [(r.token, r.code) for r in resolved]


def test_quorum_index_is_the_median_of_water_marks() -> None:
    c = checker(3)
    c.step(LeadTerm(1, 0, 10), 0)
    c.step(MarkStored(1, "m1", 7), 0)
    assert c.quorum_index() == 7  # {10, 7, -1}: two members hold 7
    c.step(MarkStored(1, "m2", 9), 0)
    assert c.quorum_index() == 9
    c5 = checker(5)
    c5.step(LeadTerm(1, 0, 20), 0)
    for peer, wm in (("m1", 3), ("m2", 15), ("m3", 8), ("m4", -1)):
        c5.step(MarkStored(1, peer, wm), 0)
    assert c5.quorum_index() == 8  # {20, 15, 8, 3, -1}: three hold 8


def test_even_group_needs_a_strict_majority() -> None:
    c = checker(4)
    c.step(LeadTerm(1, 0, 10), 0)
    c.step(MarkStored(1, "m1", 10), 0)
    assert c.quorum_index() == -1  # 2 of 4 is not a quorum
    c.step(MarkStored(1, "m2", 5), 0)
    assert c.quorum_index() == 5


def test_water_marks_only_rise_and_stale_terms_are_ignored() -> None:
    c = checker(3)
    c.step(LeadTerm(2, 0, 10), 0)
    c.step(MarkStored(2, "m1", 8), 0)
    c.step(MarkStored(2, "m1", 4), 0)
    c.step(MarkStored(1, "m2", 10), 0)  # a report from the previous term
    c.step(MarkStored(2, "nobody", 10), 0)
    assert c.water_marks() == {"m0": 10, "m1": 8, "m2": -1}


def test_commit_only_at_an_index_of_the_current_term() -> None:
    c = checker(3)
    c.step(LeadTerm(5, 10, 10), 0)  # entries 0..9 from older terms, 10 is our empty entry
    c.step(MarkStored(5, "m1", 9), 0)
    committed, resolved = c.step(CheckQuorum(), 0)
    assert committed is None and c.committed_index == -1  # 9 is an older term's entry
    c.step(MarkStored(5, "m1", 10), 0)
    committed, _ = c.step(CheckQuorum(), 1)
    assert committed == 10 and c.committed_index == 10  # commits 0..9 with it


def test_committed_index_never_goes_back() -> None:
    c = checker(3)
    c.step(LeadTerm(1, 0, 5, committed_index=3), 0)
    committed, _ = c.step(CheckQuorum(), 0)
    assert committed is None and c.committed_index == 3
    c.step(MarkStored(1, "m1", 5), 0)
    assert c.step(CheckQuorum(), 1)[0] == 5


def test_pending_resolved_in_index_order() -> None:
    c = checker(3)
    c.step(LeadTerm(1, 0, 0), 0)
    for k, (first, last) in enumerate(((1, 3), (4, 4), (5, 9))):
        c.step(AwaitQuorum(1, first, last, f"t{k}"), 0)
    c.step(MarkStored(1, "m0", 9), 0)
    c.step(MarkStored(1, "m1", 4), 0)
    committed, resolved = c.step(CheckQuorum(), 10)
    assert committed == 4
    assert codes(resolved) == [("t0", ResponseCode.SUCCESS), ("t1", ResponseCode.SUCCESS)]
    assert [(r.first_index, r.last_index, r.term) for r in resolved] == [(1, 3, 1), (4, 4, 1)]
    assert c.pending_count == 1
    c.step(MarkStored(1, "m2", 9), 0)
    _, resolved = c.step(CheckQuorum(), 20)
    assert codes(resolved) == [("t2", ResponseCode.SUCCESS)]
    assert c.step(CheckQuorum(), 30) == (None, [])


def test_batch_waits_for_its_last_entry() -> None:
    c = leading(10, (1, 10, "batch"))
    c.step(MarkStored(1, "m1", 9), 0)
    assert c.step(CheckQuorum(), 0)[1] == []
    c.step(MarkStored(1, "m1", 10), 0)
    assert codes(c.step(CheckQuorum(), 0)[1]) == [("batch", ResponseCode.SUCCESS)]


def test_wait_quorum_ack_timeout() -> None:
    c = checker(3, max_wait_ack_time_ms=2500)
    c.step(LeadTerm(1, 0, 3), 0)
    c.step(AwaitQuorum(1, 1, 1, "a"), 100)
    c.step(AwaitQuorum(1, 2, 2, "b"), 900)
    c.step(AwaitQuorum(1, 3, 3, "c"), 1000)
    assert c.step(CheckQuorum(), 2599)[1] == []
    assert codes(c.step(CheckQuorum(), 2600)[1]) == [("a", ResponseCode.WAIT_QUORUM_ACK_TIMEOUT)]
    c.step(MarkStored(1, "m1", 2), 0)
    _, resolved = c.step(CheckQuorum(), 2700)  # b commits before it times out; c still waits
    assert codes(resolved) == [("b", ResponseCode.SUCCESS)]
    assert codes(c.step(CheckQuorum(), 3500)[1]) == [("c", ResponseCode.WAIT_QUORUM_ACK_TIMEOUT)]
    assert c.pending_count == 0


def test_new_term_fails_old_pendings_with_term_changed() -> None:
    c = leading(2, (1, 2, "old"))
    failed = c.step(LeadTerm(3, 3, 3), 0)
    assert codes(failed) == [("old", ResponseCode.TERM_CHANGED)] and failed[0].term == 1
    assert c.water_marks(1) == {} and c.water_marks() == {"m0": 3, "m1": -1, "m2": -1}
    c.step(AwaitQuorum(2, 4, 4, "late"), 0)  # an append written in a term we no longer lead
    assert codes(c.step(CheckQuorum(), 0)[1]) == [("late", ResponseCode.TERM_CHANGED)]


def test_step_down() -> None:
    c = leading(2, (1, 1, "a"), (2, 2, "b"))
    assert codes(c.step(EndTerm(2), 0)) == [
        ("a", ResponseCode.TERM_CHANGED),
        ("b", ResponseCode.TERM_CHANGED),
    ]
    assert c.step(CheckQuorum(), 0) == (None, [])
    c.step(LeadTerm(3, 5, 5), 0)
    c.step(AwaitQuorum(3, 6, 6, "x"), 0)
    assert codes(c.step(EndTerm(3), 0)) == [("x", ResponseCode.NOT_LEADER)]
    c.step(AwaitQuorum(3, 7, 7, "y"), 0)
    assert codes(c.step(CheckQuorum(), 0)[1]) == [("y", ResponseCode.NOT_LEADER)]


def test_out_of_order_add_pending_keeps_index_order() -> None:
    c = leading(5, (3, 5, "second"), (1, 2, "first"))
    c.step(MarkStored(1, "m1", 5), 0)
    assert [r.token for r in c.step(CheckQuorum(), 0)[1]] == ["first", "second"]


def test_single_member_group_commits_alone() -> None:
    c = QuorumAckChecker("g", "solo", ["solo"], ReplicationConfig())
    c.step(LeadTerm(1, 0, 0), 0)
    c.step(AwaitQuorum(1, 0, 0, "t"), 0)
    assert c.step(CheckQuorum(), 0)[0] == 0
