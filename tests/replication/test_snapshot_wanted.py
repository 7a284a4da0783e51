"""A follower whose state machine stands below its log's begin (the snapshot that bridged
the gap was found damaged at a restart) asks for a snapshot in its push answers, and the
leader's dispatcher sends its newest one though the logs match -- leaving the follower's
log as it is."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from rayledger.replication import (
    DispatcherState,
    EntryDispatcher,
    EntryHandler,
    PushType,
    ReplicationConfig,
)
from rayledger.replication.messages import Push
from rayledger.replication.push import FollowerAnswer, FreshState, NextPushes
from rayledger.storage import MemoryStore, ResponseCode

from .helpers import FOLLOWER, GROUP, LEADER, follower_state, push, resp, store_with

S = ResponseCode.SUCCESS


# ================================================================ EntryHandler


def test_every_answer_says_what_the_machine_wants_at_our_begin() -> None:
    store = store_with([1, 1, 1])
    h = EntryHandler(GROUP, FOLLOWER, follower_state(), store, ReplicationConfig())
    cmp = push(PushType.COMPARE, first_index=2, entry_term=1, entry_pos=store.get_pos(2))
    (_, r), = h.step(Push(cmp, "c"), 0)  # fmt: skip
    assert r.code == S and r.snapshot_wanted == -1  # no machine told us anything
    asked = []
    h.snapshot_wanted = lambda begin: asked.append(begin) or 7
    (_, r), = h.step(Push(cmp, "c"), 0)  # fmt: skip
    assert r.snapshot_wanted == 7 and asked == [0]
    (_, r), = h.step(Push(replace(cmp, term=1), "old"), 0)  # fmt: skip
    assert r.code == ResponseCode.EXPIRED_TERM and r.snapshot_wanted == 7  # refusals too


# ================================================================ EntryDispatcher


@dataclass(frozen=True)
class Snap:
    index: int
    term: int
    files: tuple


SNAP = Snap(9, 1, (("a", 12, "h1"), ("c", 13, "h3")))  # 25 bytes


class SnapLog:
    """A leader's log (a MemoryStore) that offers its newest snapshot."""

    def __init__(self, store: MemoryStore, snap):
        self.store = store
        self.snap = snap
        self.takes = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def peek_snapshot(self, at_least=-1):
        return self.snap

    def take_snapshot(self):
        self.takes += 1
        return self.snap


def leader_log(snap=SNAP) -> SnapLog:
    """The leader's log [10, 11] (term 2, all committed): everything up to 9 was compacted."""
    store = store_with([1] * 6)
    store.reset(10, store.write_pos)
    store.append_as_leader([b"a" * 10, b"b" * 10], 2)
    store.update_committed_index(11)
    return SnapLog(store, snap)


def in_append(snap=SNAP, **cfg) -> tuple[EntryDispatcher, SnapLog]:
    """A dispatcher pushing to a follower whose log (10..11) matches ours."""
    cfg.setdefault("install_chunk_bytes", 10)
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig(**cfg))
    d.step(FreshState(2, LEADER, True), 0)
    log = leader_log(snap)
    (cmp,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(cmp, resp(S, 11, 10, 11)), 0)
    assert d.state is DispatcherState.APPEND and d.water_mark == 11
    return d, log


def wants(index: int, code=S, held: int = 11):
    return replace(resp(code, held, 10, 11), snapshot_wanted=index)


def commit_answered(d: EntryDispatcher, log, now: int, wanted: int) -> list:
    """The next COMMIT, answered with ``wanted``; returns what goes out next."""
    (c,) = d.step(NextPushes(log), now)
    assert c.type is PushType.COMMIT
    d.step(FollowerAnswer(c, wants(wanted)), now)
    return d.step(NextPushes(log), now)


def send_all(d: EntryDispatcher, log, first, now: int) -> None:
    c = first
    while True:
        held = c.snapshot.offset + c.snapshot.length
        d.step(FollowerAnswer(c, wants(9, held=held)), now)
        if held >= c.snapshot.total:
            return
        (c,) = d.step(NextPushes(log), now)


def test_a_machine_that_asks_gets_our_snapshot_and_the_log_is_left_alone() -> None:
    d, log = in_append(compare_timeout_ms=3000)
    (c,) = commit_answered(d, log, 1000, wanted=9)
    assert d.state is DispatcherState.INSTALL
    assert c.type is PushType.INSTALL and c.snapshot.index == 9 and c.snapshot.offset == 0
    assert d.step(NextPushes(log), 1000) == []  # one chunk in flight
    send_all(d, log, c, 1000)
    assert d.installs == 1 and d.state is DispatcherState.APPEND
    assert d.water_mark == 11 and d.write_index == 12  # pushes go on where they were
    (c,) = d.step(NextPushes(log), 2000)
    assert c.type is PushType.COMMIT  # no TRUNCATE: the log stays
    d.step(FollowerAnswer(c, wants(9)), 2000)  # an answer computed before the machine took it
    (c,) = d.step(NextPushes(log), 3000)
    assert c.type is PushType.COMMIT and d.installs == 1  # not sent twice
    d.step(FollowerAnswer(c, wants(-1)), 3000)  # the machine has it
    (c,) = d.step(NextPushes(log), 5000)
    assert c.type is PushType.COMMIT and d.installs == 1


def test_a_machine_that_asks_again_later_gets_it_again() -> None:
    """It restarted and found the snapshot damaged again: the same index is asked for."""
    d, log = in_append(compare_timeout_ms=3000)
    (c,) = commit_answered(d, log, 1000, wanted=9)
    send_all(d, log, c, 1000)
    (c,) = d.step(NextPushes(log), 2000)
    d.step(FollowerAnswer(c, wants(-1)), 2000)
    (c,) = d.step(NextPushes(log), 3000)
    d.step(FollowerAnswer(c, wants(9)), 3000)
    assert d.step(NextPushes(log), 3999) == []
    (c,) = d.step(NextPushes(log), 4000)
    assert c.type is PushType.INSTALL and c.snapshot.index == 9


def _too_old() -> tuple[EntryDispatcher, SnapLog]:
    """The follower's machine asks for 9 or later; our newest snapshot is at 8."""
    d, log = in_append(Snap(8, 1, (("a", 5, "h"),)), commit_push_interval_ms=1000)
    assert commit_answered(d, log, 1000, wanted=9) == []
    assert d.state is DispatcherState.APPEND and log.takes == 1  # taken to forget it
    assert d.next_wakeup_ms(1000) == 2000
    log.snap = Snap(12, 2, (("a", 5, "h"),))  # the next look would find this one
    return d, log


def test_a_snapshot_older_than_wanted_is_looked_for_again_once_more_is_committed() -> None:
    d, log = _too_old()
    log.store.append_as_leader([b"c" * 10], 2)
    (a,) = d.step(NextPushes(log), 1500)  # appends flow meanwhile
    assert a.type is PushType.APPEND and a.first_index == 12
    d.step(FollowerAnswer(a, wants(9, held=12)), 1500)
    assert d.step(NextPushes(log), 2000) == []  # a COMMIT interval on, nothing new committed
    assert log.takes == 1  # so no look
    log.store.update_committed_index(12)  # a newer snapshot may come only with this
    (c,) = d.step(NextPushes(log), 2001)
    assert c.type is PushType.INSTALL and c.snapshot.index == 12


def test_in_an_idle_group_it_is_looked_for_again_after_ten_commit_intervals() -> None:
    d, log = _too_old()
    for now in range(2000, 11_000, 1000):
        (c,) = d.step(NextPushes(log), now)
        assert c.type is PushType.COMMIT, now
        d.step(FollowerAnswer(c, wants(9)), now)
    assert log.takes == 1
    (c,) = d.step(NextPushes(log), 11_000)
    assert c.type is PushType.INSTALL and c.snapshot.index == 12


@pytest.mark.parametrize("answer", [None, wants(9, ResponseCode.CORRUPT_SNAPSHOT, held=0)])
def test_a_failed_chunk_goes_back_to_append_and_the_install_is_tried_again(answer) -> None:
    d, log = in_append(error_backoff_ms=500)
    (c,) = commit_answered(d, log, 1000, wanted=9)
    d.step(FollowerAnswer(c, answer), 1000)
    assert d.state is DispatcherState.APPEND and d.installs == 0
    assert d.step(NextPushes(log), 1499) == []  # the backoff
    (again,) = d.step(NextPushes(log), 1500)  # the follower still asks
    assert again.type is PushType.INSTALL and again.snapshot.offset == 0


def test_no_install_while_the_logs_are_being_matched() -> None:
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig())
    d.step(FreshState(2, LEADER, True), 0)
    log = leader_log()
    (cmp,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(cmp, replace(resp(ResponseCode.INCONSISTENT_STATE, 11, 10, 10),
                               snapshot_wanted=9)), 0)  # fmt: skip
    (cmp,) = d.step(NextPushes(log), 0)
    assert cmp.type is PushType.COMPARE and cmp.first_index == 10
    d.step(FollowerAnswer(cmp, replace(resp(S, 10, 10, 10), snapshot_wanted=9)), 0)
    assert d.state is DispatcherState.APPEND
    (c,) = d.step(NextPushes(log), 0)  # matched: now the snapshot, then entry 11
    assert c.type is PushType.INSTALL


def test_a_new_term_forgets_what_the_machine_asked() -> None:
    d, log = in_append()
    (c,) = d.step(NextPushes(log), 1000)
    d.step(FollowerAnswer(c, wants(9)), 1000)
    d.step(FreshState(3, LEADER, True), 0)
    (cmp,) = d.step(NextPushes(log), 1000)
    assert cmp.type is PushType.COMPARE and cmp.term == 3
