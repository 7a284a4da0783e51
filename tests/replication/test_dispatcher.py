"""Every EntryDispatcher transition (DLedger doCompare / doTruncate / doAppend)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rayledger.replication import (
    DispatcherState,
    EntryDispatcher,
    PushType,
    ReplicationConfig,
)
from rayledger.replication.push import COMMIT_LINGER_MS, FollowerAnswer, FreshState, NextPushes
from rayledger.storage import MemoryStore, ResponseCode

from .helpers import FOLLOWER, GROUP, LEADER, resp, store_with

S = ResponseCode.SUCCESS
BAD = ResponseCode.INCONSISTENT_STATE


def dispatcher(**cfg) -> EntryDispatcher:
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig(**cfg))
    d.step(FreshState(2, LEADER, True), 0)
    return d


def to_append(d: EntryDispatcher, log, index: int, now: int = 0) -> None:
    """Drive a COMPARE that finds the follower's log ending, matching, at ``index``."""
    (req,) = d.step(NextPushes(log), now)
    d.step(
        FollowerAnswer(
            req, resp(S if req.first_index == index else BAD, req.first_index, 0, index)
        ),
        now,
    )
    if d.state is DispatcherState.COMPARE:
        (req,) = d.step(NextPushes(log), now)
        assert req.first_index == index
        d.step(FollowerAnswer(req, resp(S, index, 0, index)), now)
    assert d.state is DispatcherState.APPEND


def to_empty_follower(d: EntryDispatcher, log) -> None:
    """Drive COMPARE/TRUNCATE against an empty follower: APPEND from index 0."""
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(BAD, req.first_index, 0, -1)), 0)
    (tr,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(tr, resp(S, 0, 0, -1)), 0)
    assert d.state is DispatcherState.APPEND and d.write_index == 0


def test_inactive_until_leader() -> None:
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig())
    log = store_with([1, 1])
    assert d.step(NextPushes(log), 0) == []
    d.step(FreshState(2, "someone", False), 0)
    assert d.step(NextPushes(log), 0) == [] and not d.active


def test_starts_with_compare_at_leader_end() -> None:
    d = dispatcher()
    log = store_with([1, 1, 2])
    (req,) = d.step(NextPushes(log), 0)
    assert req.type is PushType.COMPARE and req.first_index == 2
    assert (req.entry_term, req.entry_pos) == (2, log.get_pos(2))
    assert (req.term, req.leader_id, req.remote_id, req.group) == (2, LEADER, FOLLOWER, GROUP)
    assert d.state is DispatcherState.COMPARE and d.compare_index == 2


def test_empty_leader_log_waits() -> None:
    d = dispatcher()
    assert d.step(NextPushes(store_with([])), 0) == []


def test_one_compare_in_flight_resent_after_timeout() -> None:
    d = dispatcher(compare_timeout_ms=3000)
    log = store_with([1, 1])
    (req,) = d.step(NextPushes(log), 0)
    assert d.step(NextPushes(log), 2999) == []
    (again,) = d.step(NextPushes(log), 3000)
    assert again.type is PushType.COMPARE and again.first_index == req.first_index


def compared(follower_end: int) -> tuple[EntryDispatcher, MemoryStore]:
    """A dispatcher over the log [1, 1, 2] whose first COMPARE (at index 2) the follower
    answered with success and its log end ``follower_end``."""
    d = dispatcher()
    log = store_with([1, 1, 2])
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(S, 2, 0, follower_end)), 0)
    return d, log


def test_compare_equal_end_goes_to_append() -> None:
    d, _ = compared(2)
    assert d.state is DispatcherState.APPEND
    assert d.water_mark == 2 and d.write_index == 3 and d.compare_index == -1


def test_compare_success_with_longer_follower_truncates_there() -> None:
    d, log = compared(7)
    assert d.state is DispatcherState.TRUNCATE
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.first_index == 2 and not tr.reset
    assert (tr.entry_term, tr.entry_pos) == (2, log.get_pos(2))
    d.step(FollowerAnswer(tr, resp(S, 2, 0, 2)), 0)
    assert d.state is DispatcherState.APPEND and d.water_mark == 2 and d.write_index == 3


def test_compare_above_follower_end_jumps_to_it() -> None:
    d = dispatcher()
    log = store_with([1] * 10)
    (req,) = d.step(NextPushes(log), 0)
    assert req.first_index == 9
    d.step(FollowerAnswer(req, resp(BAD, 9, 0, 4)), 0)
    assert d.state is DispatcherState.COMPARE and d.compare_index == 4
    (req,) = d.step(NextPushes(log), 0)
    assert req.first_index == 4
    d.step(FollowerAnswer(req, resp(S, 4, 0, 4)), 0)
    assert d.state is DispatcherState.APPEND and d.write_index == 5


def test_compare_inside_follower_range_steps_back() -> None:
    d = dispatcher()
    log = store_with([1, 1, 1, 2, 2])
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(BAD, 4, 0, 6)), 0)
    assert d.compare_index == 3
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(BAD, 3, 0, 6)), 0)
    assert d.compare_index == 2
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(S, 2, 0, 6)), 0)  # match at 2; follower holds more: cut there
    assert d.state is DispatcherState.TRUNCATE
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.first_index == 2 and not tr.reset


def test_follower_below_leader_begin_is_reset() -> None:
    d = dispatcher()
    log = store_with([1] * 6)
    log.reset(10, log.write_pos)  # the leader's log now begins at 10 (old entries cleaned)
    log.append_as_leader([b"a", b"b"], 2)
    (req,) = d.step(NextPushes(log), 0)
    assert req.first_index == 11
    d.step(FollowerAnswer(req, resp(BAD, 11, 0, 5)), 0)  # follower ends at 5 < our begin 10
    assert d.state is DispatcherState.TRUNCATE
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.reset and tr.first_index == 10 and tr.entry_pos == log.get_pos(10)
    d.step(FollowerAnswer(tr, resp(S, 10, 10, 9)), 0)
    assert d.state is DispatcherState.APPEND and d.water_mark == 9 and d.write_index == 10


def test_empty_follower_is_reset_to_leader_begin() -> None:
    d = dispatcher()
    log = store_with([1, 1])
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(BAD, 1, 0, -1)), 0)
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 0
    d.step(FollowerAnswer(tr, resp(S, 0, 0, -1)), 0)
    assert d.state is DispatcherState.APPEND and d.write_index == 0 and d.water_mark == -1


def test_compare_below_follower_begin_resets() -> None:
    d = dispatcher()
    log = store_with([1] * 5)
    (req,) = d.step(NextPushes(log), 0)
    d.step(
        FollowerAnswer(req, resp(BAD, 4, 8, 20)), 0
    )  # follower's log starts at 8, above what we compare
    assert d.state is DispatcherState.TRUNCATE
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.reset and tr.first_index == 0


def test_stepping_below_leader_begin_resets() -> None:
    d = dispatcher()
    log = store_with([1] * 4)
    for index in (3, 2, 1):
        (req,) = d.step(NextPushes(log), 0)
        assert req.first_index == index
        d.step(FollowerAnswer(req, resp(BAD, index, 0, 6)), 0)
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(BAD, 0, 0, 6)), 0)
    assert d.state is DispatcherState.TRUNCATE
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.reset and tr.first_index == 0


def test_failed_truncate_goes_back_to_compare_after_backoff() -> None:
    d = dispatcher(error_backoff_ms=500)
    log = store_with([1, 1])
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(S, 1, 0, 3)), 0)
    (tr,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(tr, resp(BAD, 1, 0, 3)), 10)
    assert d.state is DispatcherState.COMPARE
    assert d.step(NextPushes(log), 509) == []
    (req,) = d.step(NextPushes(log), 510)
    assert req.type is PushType.COMPARE


@pytest.mark.parametrize("code", [None, ResponseCode.TERM_NOT_READY, ResponseCode.EXPIRED_TERM])
def test_unexpected_compare_answer_backs_off(code) -> None:
    d = dispatcher(error_backoff_ms=500)
    log = store_with([1, 1])
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, None if code is None else resp(code, 1, 0, 1)), 0)
    assert d.state is DispatcherState.COMPARE
    assert d.step(NextPushes(log), 100) == []
    assert len(d.step(NextPushes(log), 500)) == 1


def test_new_term_starts_over_with_compare() -> None:
    d = dispatcher()
    log = store_with([1, 1, 2])
    to_append(d, log, 2)
    d.step(FreshState(2, LEADER, True), 0)  # same term: nothing changes
    assert d.state is DispatcherState.APPEND
    d.step(FreshState(3, LEADER, True), 0)
    assert d.state is DispatcherState.COMPARE and d.water_mark == -1 and d.term == 3
    d.step(FreshState(3, "other", False), 0)
    assert not d.active
    d.step(FreshState(3, LEADER, True), 0)  # leading again after a pause: compare again
    assert d.state is DispatcherState.COMPARE


def test_answers_from_another_term_are_ignored() -> None:
    d = dispatcher()
    log = store_with([1, 1, 2])
    (req,) = d.step(NextPushes(log), 0)
    d.step(FreshState(3, LEADER, True), 0)
    d.step(FollowerAnswer(req, resp(S, 2, 0, 2)), 0)
    assert d.state is DispatcherState.COMPARE and d.water_mark == -1


def test_append_batches_by_bytes_and_pipelines() -> None:
    log = store_with([1] * 10, size=52)  # 100-byte entries
    d = dispatcher(max_batch_push_bytes=300, max_pending_pushes=2)
    to_empty_follower(d, log)
    reqs = d.step(NextPushes(log), 1)
    assert [(r.type, r.first_index, r.count) for r in reqs] == [
        (PushType.APPEND, 0, 3),
        (PushType.APPEND, 3, 3),
    ]
    assert reqs[0].batch_bytes == 300 and reqs[0].batch.last_index == 2
    assert d.pending_pushes == 2 and d.write_index == 6
    assert d.step(NextPushes(log), 2) == []  # window full
    d.step(FollowerAnswer(reqs[0], resp(S, 2, 0, 2)), 3)
    assert d.water_mark == 2
    (nxt,) = d.step(NextPushes(log), 4)
    assert (nxt.first_index, nxt.count) == (6, 3)


def test_commit_index_rides_on_pushes() -> None:
    log = store_with([1] * 4)
    log.update_committed_index(1)
    d = dispatcher()
    to_append(d, log, 1)
    (req,) = d.step(NextPushes(log), 0)
    assert req.type is PushType.APPEND and req.commit_index == 1


def test_success_out_of_order_and_prune_below_water_mark() -> None:
    log = store_with([1] * 6, size=52)
    d = dispatcher(max_batch_push_bytes=100, leak_check_interval_ms=1000)
    to_empty_follower(d, log)
    reqs = d.step(NextPushes(log), 0)
    assert len(reqs) == 6
    d.step(
        FollowerAnswer(reqs[3], resp(S, 3, 0, 3)), 1
    )  # the follower holds 0..3: earlier acks were lost
    assert d.water_mark == 3 and d.pending_pushes == 5
    d.step(NextPushes(log), 1000)  # the leak check prunes pushes below the water mark
    assert d.pending_pushes == 2


def test_resend_oldest_after_push_timeout() -> None:
    log = store_with([1] * 3)
    d = dispatcher(max_push_timeout_ms=1000, max_batch_push_bytes=1)
    to_append(d, log, 0)
    reqs = d.step(NextPushes(log), 0)
    assert [r.first_index for r in reqs] == [1, 2]
    assert [r.type for r in d.step(NextPushes(log), 1000)] == [PushType.COMMIT]  # not yet timed out
    (again,) = d.step(NextPushes(log), 1001)
    assert again.type is PushType.APPEND and (again.first_index, again.count) == (1, 1)
    assert d.resends == 1
    assert d.step(NextPushes(log), 1002) == []  # its clock restarted
    d.step(FollowerAnswer(again, resp(S, 1, 0, 1)), 1003)
    (third,) = d.step(NextPushes(log), 1004)  # now 2 is the oldest and long overdue
    assert third.first_index == 2


def test_inconsistent_append_answer_goes_back_to_compare() -> None:
    log = store_with([1] * 3)
    d = dispatcher()
    to_append(d, log, 0)
    reqs = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(reqs[0], resp(BAD, 2, 0, 0)), 1)
    assert d.state is DispatcherState.COMPARE and d.pending_pushes == 0 and d.compare_index == -1
    (req,) = d.step(NextPushes(log), 1)
    assert req.type is PushType.COMPARE and req.first_index == 2


def test_stale_inconsistent_for_forgotten_push_is_ignored() -> None:
    log = store_with([1] * 3)
    d = dispatcher()
    to_append(d, log, 0)
    (old,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(old, resp(S, 2, 0, 2)), 1)
    d.step(
        FollowerAnswer(old, resp(BAD, 2, 0, 2)), 2
    )  # a duplicate answer for a push no longer pending
    assert d.state is DispatcherState.APPEND


@pytest.mark.parametrize(
    "code", [ResponseCode.REPEATED_PUSH, ResponseCode.UNKNOWN, ResponseCode.TERM_NOT_READY]
)
def test_other_append_answers_wait_for_resend(code) -> None:
    log = store_with([1] * 2)
    d = dispatcher()
    to_append(d, log, 0)
    (req,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(req, resp(code, 1, 0, 0)), 1)
    assert d.state is DispatcherState.APPEND and d.pending_pushes == 1 and d.water_mark == 0


def test_failed_call_pushes_again_from_the_water_mark_after_a_pause() -> None:
    log = store_with([1] * 4)
    d = dispatcher(error_backoff_ms=100)
    to_append(d, log, 0)
    log.append_as_leader([b"x"], 1)
    first = d.step(NextPushes(log), 0)
    assert [r.first_index for r in first] == [1]
    d.step(FollowerAnswer(first[0], None), 5)  # the follower is down: no answer at all
    assert d.pending_pushes == 0 and d.write_index == 1 and d.water_mark == 0
    assert d.step(NextPushes(log), 50) == []  # pausing, not spinning on a dead follower
    assert d.next_wakeup_ms(50) == 105
    (again,) = d.step(NextPushes(log), 105)
    assert again.first_index == 1 and again.type is PushType.APPEND


def test_commit_when_idle() -> None:
    log = store_with([1] * 2)
    d = dispatcher(commit_push_interval_ms=1000)
    to_append(d, log, 1)
    assert d.step(NextPushes(log), 0) == []
    log.update_committed_index(1)
    # the committed index moved: a push would carry it; with none, a COMMIT tells the
    # follower COMMIT_LINGER_MS later
    assert d.step(NextPushes(log), 5) == []
    assert d.next_wakeup_ms(5) == 5 + COMMIT_LINGER_MS
    (c,) = d.step(NextPushes(log), 5 + COMMIT_LINGER_MS)
    assert c.type is PushType.COMMIT and c.commit_index == 1
    assert (c.first_index, c.entry_term, c.entry_pos) == (1, 1, log.get_pos(1))
    assert d.step(NextPushes(log), 6 + COMMIT_LINGER_MS) == []
    (c2,) = d.step(NextPushes(log), 1030)  # and at least every commit_push_interval_ms
    assert c2.type is PushType.COMMIT


def test_a_push_carries_a_risen_committed_index_instead_of_a_commit() -> None:
    """A steady stream sends no COMMIT: each push carries the committed index."""
    log = store_with([1] * 2)
    d = dispatcher(commit_push_interval_ms=1000)
    to_append(d, log, 1)
    log.update_committed_index(1)
    assert d.step(NextPushes(log), 5) == []
    log.append_as_leader([b"x"], 1)
    (p,) = d.step(NextPushes(log), 10)
    assert p.type is PushType.APPEND and p.commit_index == 1
    d.step(FollowerAnswer(p, resp(ResponseCode.SUCCESS, 2)), 12)
    assert d.step(NextPushes(log), 5 + COMMIT_LINGER_MS) == []  # nothing new to tell


def test_commit_waits_for_a_water_mark_to_name() -> None:
    log = store_with([1])
    log.update_committed_index(0)
    d = dispatcher(commit_push_interval_ms=1000)
    to_empty_follower(d, log)
    (a,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(a, resp(ResponseCode.TERM_NOT_READY, 0, 0, -1)), 1)  # water mark still -1
    commits = [r for r in d.step(NextPushes(log), 1500) if r.type is PushType.COMMIT]
    assert not commits  # the unanswered push is resent first
    d.step(FollowerAnswer(a, resp(S, 0, 0, 0)), 1600)
    (c,) = d.step(NextPushes(log), 3000)
    assert c.type is PushType.COMMIT and c.first_index == 0


def test_inconsistent_commit_answer_goes_back_to_compare() -> None:
    log = store_with([1] * 2)
    log.update_committed_index(1)
    d = dispatcher()
    to_append(d, log, 1)
    (c,) = d.step(NextPushes(log), 0) + d.step(NextPushes(log), COMMIT_LINGER_MS)
    assert c.type is PushType.COMMIT
    d.step(FollowerAnswer(c, resp(BAD, 1, 0, -1)), COMMIT_LINGER_MS + 1)
    assert d.state is DispatcherState.COMPARE


@dataclass
class StandIn:
    """What the Ray shell may hand out instead of an EntryBatch: no ``data``."""

    first_index: int
    count: int
    nbytes: int

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


class RemoteLog:
    """A LeaderLog whose batches live elsewhere; the dispatcher must not need their bytes."""

    def __init__(self, store) -> None:
        self.store = store

    ledger_begin_index = property(lambda self: self.store.ledger_begin_index)
    ledger_end_index = property(lambda self: self.store.ledger_end_index)
    committed_index = property(lambda self: self.store.committed_index)

    def get_term(self, index: int) -> int:
        return self.store.get_term(index)

    def get_pos(self, index: int) -> int:
        return self.store.get_pos(index)

    def read_batch(self, start: int, max_bytes: int, max_count: int) -> StandIn:
        b = self.store.read_batch(start, max_bytes, max_count)
        return StandIn(b.first_index, b.count, len(b.data))


def test_dispatcher_never_reads_batch_data() -> None:
    log = RemoteLog(store_with([1] * 5))
    d = dispatcher(max_batch_push_bytes=40)
    to_append(d, log, 0)
    reqs = d.step(NextPushes(log), 0)
    assert [r.first_index for r in reqs] == [1, 2, 3, 4]
    assert all(isinstance(r.batch, StandIn) and r.batch_bytes == 58 for r in reqs)
    (again,) = d.step(NextPushes(log), 5000)
    assert again.first_index == 1


def test_quota_throttles_a_lagging_follower() -> None:
    log = store_with([1] * 200, size=52)  # 100-byte entries, 20 KB behind
    d = dispatcher(
        max_batch_push_bytes=1000,
        peer_push_throttle_point=5000,
        peer_push_quota=3000,
        max_pending_pushes=1000,
        max_push_timeout_ms=60_000,  # no answers come: no resends meanwhile
    )
    to_empty_follower(d, log)
    first = d.step(NextPushes(log), 0)
    assert sum(r.batch_bytes for r in first) == 1000  # one batch's worth of tokens at most
    assert d.step(NextPushes(log), 300) == []
    assert d.next_wakeup_ms(300) == 334  # when the bucket holds a batch again
    sent = [(t, r.batch_bytes) for t in range(1, 3000) for r in d.step(NextPushes(log), t)]
    # the quota spread evenly: one 1000-byte push every third of a second, never a burst
    times = [t for t, _ in sent]
    assert times[0] == 334 and all(
        333 <= b - a <= 335 for a, b in zip(times, times[1:], strict=False)
    )
    assert {n for _, n in sent} == {1000} and len(sent) == 8


def test_learner_is_paced_whatever_its_lag() -> None:
    log = store_with([1] * 40, size=52)
    d = dispatcher(max_batch_push_bytes=1000, peer_push_throttle_point=5000,
                   peer_push_quota=1000, learner_push_quota=2000)  # fmt: skip
    to_empty_follower(d, log)
    log.is_learner = lambda peer: True  # 4 KB behind, under the throttle point: paced anyway
    first = d.step(NextPushes(log), 0)
    assert sum(r.batch_bytes for r in first) == 1000
    assert d.step(NextPushes(log), 400) == []
    assert sum(r.batch_bytes for r in d.step(NextPushes(log), 501)) == 1000  # at 2000 B/s


def test_quota_does_not_slow_a_follower_that_keeps_up() -> None:
    log = store_with([1] * 40, size=52)
    d = dispatcher(max_batch_push_bytes=1000, peer_push_throttle_point=5000, peer_push_quota=1000)
    to_empty_follower(d, log)
    reqs = d.step(NextPushes(log), 0)  # 4 KB behind, under the throttle point: no limit
    assert sum(r.count for r in reqs) == 40


def test_a_bucket_left_short_with_nothing_to_send_sets_no_wake_up() -> None:
    """The bucket refills only as pushes are built: once a learner has everything, a bucket
    its last push left short must not wake the dispatcher (its refill time lies in the past
    for good: the dispatcher woke every millisecond on an idle group)."""
    log = store_with([1] * 10, size=52)  # one 1000-byte batch: the whole log
    d = dispatcher(max_batch_push_bytes=1000, learner_push_quota=2000, max_push_timeout_ms=60_000)
    to_empty_follower(d, log)
    log.is_learner = lambda peer: True
    assert sum(r.count for r in d.step(NextPushes(log), 0)) == 10  # the bucket is now empty
    assert d.step(NextPushes(log), 600) == []  # nothing more to send
    assert d.next_wakeup_ms(600) == 1000  # the idle COMMIT push, not the bucket's refill
