"""ReadIndexLogic and CommitWaiters, stepped by hand (no Ray): rounds, quorum, leases."""

from __future__ import annotations

import pytest
from rayledger.actors.core.reads import Consistency, ReadIndexLogic
from rayledger.actors.member.reads import CommitWaiters
from rayledger.storage import LedgerError, ResponseCode

PEERS = ["n0", "n1", "n2", "n3", "n4"]


def logic(peers=PEERS, lease_ms=500, timeout_ms=1000) -> ReadIndexLogic:
    return ReadIndexLogic("n0", peers, lease_ms, timeout_ms)


def test_consistency_parses_values_and_refuses_others():
    assert Consistency.of("lease") is Consistency.LEASE
    with pytest.raises(LedgerError) as e:
        Consistency.of("strong")
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_a_read_is_confirmed_only_by_a_quorum_of_the_round():
    r = logic()
    sends, confirmed = r.request(term=3, read_index=10, token="a", now_ms=0)
    assert [s.term for s in sends] == [3] and confirmed == []
    rid = sends[0].round_id
    assert r.on_answer(rid, "n1", True, 1) == ([], [])
    assert r.on_answer(rid, "n2", False, 1) == ([], [])  # a refusal does not count
    assert r.on_answer(rid, "n1", True, 2) == ([], [])  # nor does a duplicate
    assert r.on_answer(rid, "n3", True, 3) == ([], [("a", 10)])  # self + n1 + n3 of 5


def test_requests_during_a_round_wait_for_the_next_one():
    r = logic()
    (first,), _ = r.request(3, 10, "a", 0)
    assert r.request(3, 11, "b", 5) == ([], [])  # joins the next round, not this one
    r.on_answer(first.round_id, "n1", True, 6)
    sends, confirmed = r.on_answer(first.round_id, "n2", True, 7)
    assert confirmed == [("a", 10)]
    (second,) = sends
    assert second.round_id != first.round_id and second.tickets == [("b", 11)]
    r.on_answer(second.round_id, "n3", True, 8)
    assert r.on_answer(second.round_id, "n4", True, 9)[1] == [("b", 11)]


def test_answers_to_an_old_round_are_ignored():
    r = logic()
    (first,), _ = r.request(3, 10, "a", 0)
    _, expired, _ = r.expire(1000)
    assert expired == ["a"]
    (second,), _ = r.request(3, 12, "b", 1001)
    r.on_answer(first.round_id, "n1", True, 1002)
    assert r.on_answer(first.round_id, "n2", True, 1002) == ([], [])
    assert second.acks == set()


def test_expiry_only_after_the_timeout_and_then_a_fresh_round_for_waiters():
    r = logic()
    r.request(3, 10, "a", 0)
    r.request(3, 11, "b", 10)
    assert r.expire(999) == ([], [], [])
    sends, expired, confirmed = r.expire(1000)
    assert expired == ["a"] and sends[0].tickets == [("b", 11)] and confirmed == []


def test_a_round_after_a_change_to_a_single_voter_confirms_at_once_on_expiry():
    """A change leaves the leader its group's only voter while a round is in flight: the
    round's readers join a round under the new voters, which confirms at once; a reader
    that waited behind an expired round is confirmed, not lost to an assertion."""
    r = logic(peers=["n0", "n1", "n2"])
    (rnd,), _ = r.request(3, 10, "a", 0)
    r.request(3, 11, "b", 5)
    sends, confirmed = r.configure(["n0"], 10)
    assert sends == [] and confirmed == [("a", 10), ("b", 11)]
    # an expiry with readers waiting while the group is a single voter confirms them too
    r2 = logic(peers=["n0", "n1", "n2"])
    r2.request(3, 10, "a", 0)
    r2.request(3, 11, "b", 5)
    r2.others, r2.quorum = [], 1  # as configure(["n0"]) would leave it, round still out
    sends, expired, confirmed = r2.expire(1000)
    assert expired == ["a"] and sends == [] and confirmed == [("b", 11)]


def test_a_configuration_change_ends_the_lease_and_recounts_the_round():
    """A lease confirmed by a majority of the old voters says nothing of the new ones: it
    ends with the change, and a round in flight is sent again to the new voters."""
    r = logic(peers=["n0", "n1", "n2"], lease_ms=500)
    (rnd,), _ = r.request(3, 10, "a", 100)
    assert r.on_answer(rnd.round_id, "n1", True, 150)[1] == [("a", 10)]
    assert r.lease_holds(3, 200)
    (rnd2,), _ = r.request(3, 11, "b", 210)
    sends, confirmed = r.configure(["n0", "n2", "n3"], 220)
    assert not r.lease_holds(3, 230) and confirmed == []
    (again,) = sends
    assert again.round_id != rnd2.round_id and again.tickets == [("b", 11)]
    assert r.on_answer(rnd2.round_id, "n2", True, 230) == ([], [])  # the old round is gone
    assert r.on_answer(again.round_id, "n1", True, 231) == ([], [])  # n1 is no voter now
    assert r.on_answer(again.round_id, "n3", True, 232)[1] == [("b", 11)]


def test_lease_from_the_rounds_send_time_for_its_term_only():
    r = logic(lease_ms=500)
    assert not r.lease_holds(3, 0)
    (rnd,), _ = r.request(3, 10, "a", 100)
    r.on_answer(rnd.round_id, "n1", True, 300)
    r.on_answer(rnd.round_id, "n2", True, 400)
    assert r.lease_holds(3, 599) and not r.lease_holds(3, 600)  # from the send time, 100
    assert not r.lease_holds(4, 300)


def test_step_down_fails_every_reader_and_ends_the_lease():
    r = logic()
    (rnd,), _ = r.request(3, 10, "a", 0)
    r.request(3, 11, "b", 1)
    assert sorted(r.step_down()) == ["a", "b"]
    assert not r.lease_holds(3, 2)
    assert r.on_answer(rnd.round_id, "n1", True, 3) == ([], [])


def test_a_group_of_one_confirms_at_once():
    r = ReadIndexLogic("n0", ["n0"], 500, 1000)
    assert r.request(1, 4, "a", 0) == ([], [("a", 4)])


def test_after_a_step_down_a_new_term_starts_clean():
    r = logic()
    r.request(3, 10, "a", 0)
    r.request(3, 11, "b", 1)
    r.step_down()
    sends, _ = r.request(4, 20, "c", 2)
    assert sends[0].term == 4 and sends[0].tickets == [("c", 20)]


def test_commit_waiters_release_in_any_order_of_indexes():
    w = CommitWaiters()
    w.add(5, "a")
    w.add(3, "b")
    w.add(9, "c")
    assert w.reached(2) == []
    assert sorted(w.reached(5)) == ["a", "b"]
    w.discard("c")
    assert w.reached(100) == []
