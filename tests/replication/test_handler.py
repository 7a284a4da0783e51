"""Every EntryHandler branch (DLedger EntryHandler and handlePush)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rayledger.election.messages import Tick
from rayledger.replication import EntryHandler, PushType, ReplicationConfig
from rayledger.replication.messages import Push
from rayledger.storage import ResponseCode

from .helpers import FOLLOWER, GROUP, append_req, follower_state, push, store_with

S = ResponseCode.SUCCESS
BAD = ResponseCode.INCONSISTENT_STATE


def handler(terms=(), term: int = 2, leader="l", **cfg):
    store = store_with(list(terms))
    state = follower_state(term, leader)
    return EntryHandler(GROUP, FOLLOWER, state, store, ReplicationConfig(**cfg)), store, state


def only(answers):
    assert len(answers) == 1, answers
    return answers[0]


@pytest.mark.parametrize(
    "change, code",
    [
        (dict(term=1), ResponseCode.EXPIRED_TERM),
        (dict(term=3), ResponseCode.TERM_NOT_READY),
        (dict(leader_id="x"), ResponseCode.INCONSISTENT_LEADER),
        (dict(group="other"), ResponseCode.UNKNOWN_GROUP),
        (dict(remote_id="x"), ResponseCode.UNKNOWN_MEMBER),
    ],
)
def test_term_and_address_checks(change, code) -> None:
    h, store, state = handler([1])
    req = replace(push(PushType.COMPARE, first_index=0, entry_term=1, entry_pos=0), **change)
    tok, r = only(h.step(Push(req, "t"), 0))
    assert tok == "t" and r.code == code and r.term == 2 and r.remote_id == FOLLOWER


def test_same_term_unknown_leader_is_not_ready() -> None:
    h, _, _ = handler([1], leader=None)
    _, r = only(h.step(Push(push(PushType.COMMIT, commit_index=0), "t"), 0))
    assert r.code == ResponseCode.TERM_NOT_READY


def test_in_order_append_is_written_and_reported() -> None:
    leader = store_with([1, 1, 2])
    h, store, state = handler()
    tok, r = only(h.step(Push(append_req(leader, 0, 3, commit=1), "t"), 0))
    assert r.code == S and r.index == 2 and r.end_index == 2 and r.count == 3
    assert store.read_batch(0).data == leader.read_batch(0).data
    assert (state.ledger_end_index, state.ledger_end_term) == (2, 2)
    assert h.matched_index == 2 and store.committed_index == 1


def test_out_of_order_append_waits_for_the_gap() -> None:
    leader = store_with([1] * 6)
    h, store, _ = handler()
    assert h.step(Push(append_req(leader, 4, 2), "late"), 0) == []
    assert h.step(Push(append_req(leader, 2, 2), "mid"), 0) == []
    answers = h.step(Push(append_req(leader, 0, 2), "first"), 0)
    assert [(t, r.code, r.index) for t, r in answers] == [
        ("first", S, 1),
        ("mid", S, 3),
        ("late", S, 5),
    ]
    assert store.ledger_end_index == 5 and h.queued == 0


def test_repeated_push_while_queued() -> None:
    leader = store_with([1] * 4)
    h, _, _ = handler()
    h.step(Push(append_req(leader, 2, 2), "a"), 0)
    _, r = only(h.step(Push(append_req(leader, 2, 2), "b"), 0))
    assert r.code == ResponseCode.REPEATED_PUSH


def test_push_already_written_is_compared() -> None:
    leader = store_with([1] * 4)
    h, store, _ = handler()
    h.step(Push(append_req(leader, 0, 4), "a"), 0)
    _, r = only(h.step(Push(append_req(leader, 1, 2), "dup"), 0))
    assert r.code == S and r.index == 2
    other = store_with([1] * 4, tag=b"z")
    _, r = only(h.step(Push(append_req(other, 1, 2), "diff"), 0))
    assert r.code == BAD


def test_push_overlapping_the_end_appends_the_rest() -> None:
    leader = store_with([1] * 6)
    h, store, _ = handler()
    h.step(Push(append_req(leader, 0, 3), "a"), 0)
    _, r = only(h.step(Push(append_req(leader, 1, 5), "b"), 0))
    assert r.code == S and r.index == 5 and store.ledger_end_index == 5
    assert store.read_batch(0).data == leader.read_batch(0).data


def test_append_that_does_not_follow_our_log_is_inconsistent() -> None:
    ours = [1, 1, 1]
    h, store, _ = handler(ours)
    leader = store_with([1, 1, 2, 2], tag=b"q")  # diverged at 0: chain CRCs differ
    _, r = only(h.step(Push(append_req(leader, 3, 1), "t"), 0))
    assert r.code == BAD and store.ledger_end_index == 2


def test_compare() -> None:
    h, store, _ = handler([1, 1, 2])
    ok = push(
        PushType.COMPARE, first_index=1, entry_term=1, entry_pos=store.get_pos(1), commit_index=5
    )
    _, r = only(h.step(Push(ok, "t"), 0))
    assert (r.code, r.index, r.begin_index, r.end_index) == (S, 1, 0, 2)
    assert h.matched_index == 1 and store.committed_index == 1  # min(leader's commit, matched)
    for bad in (
        push(PushType.COMPARE, first_index=1, entry_term=2, entry_pos=store.get_pos(1)),
        push(PushType.COMPARE, first_index=1, entry_term=1, entry_pos=999),
        push(PushType.COMPARE, first_index=7, entry_term=2, entry_pos=0),
    ):
        _, r = only(h.step(Push(bad, "t"), 0))
        assert r.code == BAD and (r.begin_index, r.end_index) == (0, 2)


def test_truncate_cuts_after_the_matching_entry() -> None:
    h, store, state = handler([1, 1, 1, 1])
    req = push(PushType.TRUNCATE, first_index=1, entry_term=1, entry_pos=store.get_pos(1))
    _, r = only(h.step(Push(req, "t"), 0))
    assert r.code == S and r.end_index == 1 and store.ledger_end_index == 1
    assert state.ledger_end_index == 1 and h.matched_index == 1


def test_truncate_at_an_entry_we_do_not_hold_is_refused() -> None:
    h, store, _ = handler([1, 1, 1])
    _, r = only(
        h.step(Push(push(PushType.TRUNCATE, first_index=1, entry_term=5, entry_pos=0), "t"), 0)
    )
    assert r.code == BAD and store.ledger_end_index == 2


def test_truncate_never_below_the_committed_index() -> None:
    h, store, _ = handler([1, 1, 1, 1])
    store.update_committed_index(2)
    req = push(PushType.TRUNCATE, first_index=1, entry_term=1, entry_pos=store.get_pos(1))
    _, r = only(h.step(Push(req, "t"), 0))
    assert r.code == BAD and store.ledger_end_index == 3


def test_truncate_reset_restarts_the_log_at_the_leaders_begin() -> None:
    h, store, state = handler([1, 1])
    req = push(PushType.TRUNCATE, first_index=5, entry_term=2, entry_pos=4096, reset=True)
    _, r = only(h.step(Push(req, "t"), 0))
    assert r.code == S and (r.begin_index, r.end_index) == (5, 4)
    assert store.ledger_begin_index == 5 and store.is_empty and state.ledger_end_index == 4
    assert h.matched_index == 4


@pytest.mark.parametrize("committed", [True, False])
def test_a_log_a_snapshot_left_empty_matches_at_the_snapshot_point(committed) -> None:
    """The simulation's install seed 70100: a follower whose log begins after its snapshot
    (committed, so every later leader holds the same entry there) was compared there by a
    leader that had not sent the snapshot, answered no match, and was asked for a reset
    below its committed index, which it refuses: for good.  It matches there now, and the
    leader appends from the next index -- also when its committed index stands below the
    point (a restart found it checkpointed before the reset): a log begins only past
    committed entries."""
    leader = store_with([1] * 5 + [2] * 3)
    h, store, state = handler([1, 1])
    reset = push(PushType.TRUNCATE, first_index=5, entry_term=2, entry_pos=leader.get_pos(5),
                 reset=True)  # fmt: skip
    assert only(h.step(Push(reset, "t"), 0))[1].code == S
    if committed:  # what a snapshot install leaves: the log's begin right after the snapshot
        store.update_committed_index(4)
    cmp = push(PushType.COMPARE, first_index=4, entry_term=1, entry_pos=leader.get_pos(4))
    _, r = only(h.step(Push(cmp, "c"), 0))
    assert r.code == S, r
    _, r = only(h.step(Push(append_req(leader, 5, 3), "a"), 0))
    assert r.code == S and store.ledger_end_index == 7 and h.matched_index == 7


@pytest.mark.parametrize("reset", [True, False])
def test_a_late_copy_of_a_truncate_never_drops_what_we_acknowledged(reset) -> None:
    """The only ``commit.unheld`` the simulation could not put down to a power loss (seed
    30092 of test_chaos_n5_file): a duplicated TRUNCATE from the same leader and term
    arrived after the appends that followed it and wiped entries this follower had
    acknowledged (on Ray: a TRUNCATE sent by a dispatcher that was killed and replaced)."""
    leader = store_with([2, 2, 2, 2])
    h, store, state = handler([] if reset else [2])
    trunc = push(PushType.TRUNCATE, first_index=0, entry_term=2, entry_pos=0, reset=reset)
    _, r = only(h.step(Push(trunc, "t"), 0))
    assert r.code == S
    _, r = only(h.step(Push(append_req(leader, 1 - reset, 3 + reset), "a"), 0))
    assert r.code == S and h.matched_index == 3  # acknowledged up to 3
    _, r = only(h.step(Push(trunc, "late"), 0))  # the late copy
    assert r.code == S
    assert store.ledger_end_index == 3 and state.ledger_end_index == 3 and h.matched_index == 3
    assert store.read_batch(0).data == leader.read_batch(0).data


def test_compare_and_truncate_clear_queued_appends() -> None:
    leader = store_with([1] * 5)
    h, store, _ = handler([1])
    h.step(Push(append_req(leader, 3, 1), "queued"), 0)
    answers = h.step(
        Push(push(PushType.COMPARE, first_index=0, entry_term=1, entry_pos=0), "cmp"), 0
    )
    assert [(t, r.code) for t, r in answers] == [("queued", ResponseCode.UNKNOWN), ("cmp", S)]
    assert h.queued == 0


def test_commit_follows_the_leader_only_as_far_as_we_match() -> None:
    h, store, _ = handler([1, 1, 1, 1])  # entries from an old leader: not known to match
    _, r = only(h.step(Push(push(PushType.COMMIT, commit_index=3), "t"), 0))
    assert r.code == S and store.committed_index == -1
    named = push(
        PushType.COMMIT, commit_index=3, first_index=1, entry_term=1, entry_pos=store.get_pos(1)
    )
    _, r = only(h.step(Push(named, "t"), 0))
    assert r.code == S and store.committed_index == 1 and r.index == 1
    wrong = push(PushType.COMMIT, commit_index=3, first_index=2, entry_term=9, entry_pos=0)
    _, r = only(h.step(Push(wrong, "t"), 0))
    assert r.code == BAD and store.committed_index == 1


def test_committed_index_never_beyond_our_end() -> None:
    leader = store_with([1] * 3)
    h, store, _ = handler()
    h.step(Push(append_req(leader, 0, 2, commit=2), "t"), 0)
    assert store.committed_index == 1


def test_new_leader_forgets_what_matched() -> None:
    leader = store_with([1] * 3)
    h, store, state = handler()
    h.step(Push(append_req(leader, 0, 3), "t"), 0)
    assert h.matched_index == 2
    state.change_to_candidate(3)
    state.next_term()
    state.change_to_follower(3, "x")
    req = replace(push(PushType.COMMIT, term=3, commit_index=2), leader_id="x")
    _, r = only(h.step(Push(req, "t"), 0))
    assert r.code == S and h.matched_index == -1 and store.committed_index == -1


def test_abnormal_check_reports_the_smallest_stale_gap() -> None:
    leader = store_with([1] * 8)
    h, store, _ = handler(abnormal_check_ms=1000, push_wait_timeout_ms=1000)
    h.step(Push(append_req(leader, 0, 2), "a"), 0)
    h.step(Push(append_req(leader, 5, 1), "five"), 0)
    h.step(Push(append_req(leader, 3, 1), "three"), 500)
    h.step(Push(append_req(leader, 7, 1), "seven"), 900)
    assert h.step(Tick(), 999) == []  # the first check looks, but nothing waited long enough
    assert h.step(Tick(), 1500) == []  # not yet time for the next check
    tok, r = only(h.step(Tick(), 2000))  # 3 waited 1500 ms, 5 waited 2000: answer the smallest
    assert (tok, r.code, r.index, r.end_index) == ("three", BAD, 3, 1)
    assert h.queued == 2


def test_abnormal_check_answers_pushes_we_already_hold() -> None:
    leader = store_with([1] * 4)
    h, store, _ = handler(abnormal_check_ms=10)
    h.step(Push(append_req(leader, 2, 2), "later"), 0)
    h.step(Push(append_req(leader, 0, 2), "first"), 0)  # also drains "later"
    h._writes[1] = (append_req(leader, 1, 1), "stale", 0)  # held while the log moved past it
    tok, r = only(h.step(Tick(), 100))
    assert (tok, r.code) == ("stale", S)


def test_queued_pushes_of_an_old_term_are_answered_expired() -> None:
    leader = store_with([1] * 4)
    h, store, state = handler()
    h.step(Push(append_req(leader, 2, 1), "q"), 0)
    state.change_to_candidate(3)
    state.next_term()
    tok, r = only(h.step(Tick(), 1))
    assert (tok, r.code) == ("q", ResponseCode.EXPIRED_TERM) and h.queued == 0


def test_unknown_push_type() -> None:
    h, _, _ = handler()
    req = replace(push(PushType.COMMIT), type="BOGUS")
    _, r = only(h.step(Push(req, "t"), 0))
    assert r.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_the_truncate_guard_remembers_the_term_through_a_same_term_flap() -> None:
    """A follower whose heartbeats time out becomes a candidate in the same term with no
    leader, then follows the same leader again.  There is one leader per term, so what
    matched it is still known: a late duplicate TRUNCATE must not cut entries the follower
    acknowledged (the store only refuses cuts below its own committed index, which lags the
    leader's)."""
    leader = store_with([2] * 21)
    h, store, state = handler([2] * 10)
    trunc = push(PushType.TRUNCATE, first_index=9, entry_term=2, entry_pos=leader.get_pos(9))
    _, r = only(h.step(Push(trunc, "t"), 0))
    assert r.code == S and h.matched_index == 9
    _, r = only(h.step(Push(append_req(leader, 10, 11, commit=5), "a"), 0))
    assert r.code == S and store.ledger_end_index == 20 and h.matched_index == 20
    state.change_to_candidate(2)  # the heartbeat timeout: same term, no leader
    h.step(Tick(), 1)
    state.change_to_follower(2, "l")  # the same leader's next heartbeat
    h.step(Tick(), 2)
    assert h.matched_index == 20
    _, r = only(h.step(Push(trunc, "late"), 3))  # the late duplicate
    assert r.code == S
    assert store.ledger_end_index == 20 and store.read_batch(10).data == leader.read_batch(10).data


def test_a_late_truncate_after_a_restart_keeps_the_leaders_own_entries() -> None:
    """Found by the simulation (seed 30255 of test_chaos_n5_file, with late duplicate
    TRUNCATEs): a follower restarted between a TRUNCATE and its late duplicate has no
    ``matched_index`` memory, and the duplicate cut entries it had acknowledged.  Entries of
    the requester's own term match its log (one leader per term, its log only grows), so a
    TRUNCATE never cuts them, memory or not."""
    leader = store_with([2] * 21)
    h, store, _ = handler([2] * 10)
    trunc = push(PushType.TRUNCATE, first_index=9, entry_term=2, entry_pos=leader.get_pos(9))
    _, r = only(h.step(Push(trunc, "t"), 0))
    _, r = only(h.step(Push(append_req(leader, 10, 11, commit=5), "a"), 0))
    assert r.code == S and store.ledger_end_index == 20
    h.matched_index = -1  # a restarted process: no memory of what matched
    _, r = only(h.step(Push(trunc, "late"), 3))
    assert r.code == S
    assert store.ledger_end_index == 20 and store.read_batch(10).data == leader.read_batch(10).data
