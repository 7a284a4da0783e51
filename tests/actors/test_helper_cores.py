"""The helpers' sans-I/O cores stepped by hand: the decisions that used to live in the Ray
shells (and in the simulation's copies of them)."""

from __future__ import annotations

import dataclasses

from rayledger.election.configuration import Configuration
from rayledger.replication import PushEntryResponse, ReplicationConfig
from rayledger.replication.checker import (
    COMMIT_NOTICE_MS,
    AddRound,
    BecomeLeader,
    CheckerLogic,
    LeadershipEnded,
    Report,
    ReportAnswer,
)
from rayledger.replication.dispatcher import (
    LEARNER_REPORT_MS,
    PROGRESS_MS,
    REPORT_RETRY_MS,
    Activate,
    DispatcherLogic,
    FollowerAnswer,
    Reported,
    RoundAnnounced,
)
from rayledger.replication.messages import TURN_END, Announcement, Inline, LeaderInfo
from rayledger.storage import EntryBatch, ResponseCode

CFG = ReplicationConfig()
PEERS = ["n0", "n1", "n2"]
INFO = LeaderInfo(term=2, begin=0, end=4, end_term=2, end_pos=400, committed=3, water_mark=4)


def _caught_up(d: DispatcherLogic, now: int):
    """Answer the dispatcher's first push with a follower that holds everything; returns
    the Ready that pushed it."""
    ready = d.step(TURN_END, now)
    reqs = ready.pushes
    assert reqs, "the dispatcher pushes on activation"
    resp = PushEntryResponse(group="g", remote_id="n1", term=2, code=ResponseCode.SUCCESS,
                             index=reqs[0].first_index, end_index=4)  # fmt: skip
    d.step(FollowerAnswer(reqs[0], resp), now)
    return ready


def test_a_failed_report_is_sent_again_after_its_backoff() -> None:
    """A restarted checker must learn a caught-up follower's mark (simulation seed 40129:
    the dead checker's report failed, the mark never rose again, a round hung)."""
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.step(Activate(INFO), 0)
    _caught_up(d, 0)
    r = d.step(TURN_END, 1)
    assert r.report is not None and d.reporting
    d.step(Reported(*r.report, failed=True), 2)
    assert d.step(TURN_END, 3).report is None  # backing off, with a wake-up for the retry
    again = d.step(TURN_END, 2 + REPORT_RETRY_MS)
    assert again.report == r.report


def test_a_dispatcher_set_up_again_reports_its_mark_to_the_restarted_checker() -> None:
    """A checker restarted after this follower's report got through: the dispatcher is
    set up again in the same term and reports the caught-up mark at once (before, it
    waited for the mark to rise, which an idle follower's never does)."""
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.step(Activate(INFO), 0)
    _caught_up(d, 0)
    r = d.step(TURN_END, 1)
    d.step(Reported(*r.report, committed=3), 2)
    assert d.step(TURN_END, 3).report is None  # nothing new to report
    d.step(Activate(INFO), 0)  # the supervisor's restore after the checker restarted
    assert d.step(TURN_END, 4).report == (2, 4)


def test_a_learner_reports_seldom_and_at_once_when_promoted() -> None:
    """A learner's mark counts toward no commit, so it reaches the checker every
    LEARNER_REPORT_MS only -- and at once when the round promoting it is announced: the
    bench's heal run hung when the promotion could only commit with the new voter's mark
    (one voter lost) and the dispatcher, with a stale configuration, never reported it."""
    learner = Configuration(voters=("n0", "n2"), learners=("n1",))
    promoted = Configuration(voters=("n0", "n1", "n2"))
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.step(Activate(dataclasses.replace(INFO, configs=((-1, learner),))), 0)
    assert _caught_up(d, 0).background is True  # a learner's pushes: in the background
    first = d.step(TURN_END, 1)
    assert first.report == (2, 4)
    d.step(Reported(2, 4, committed=3), 2)

    def round_at(index: int, now: int, configs: tuple = ()):
        """The leader announces round ``index`` and the learner stores it."""
        batch = EntryBatch(index, 1, b"x" * 40)  # the bytes are never looked at here
        a = Announcement(2, index, 1, Inline(batch), 40, (index * 100,) * 2, 3, configs)
        d.step(RoundAnnounced(a), now)
        r = d.step(TURN_END, now)
        (push,) = [p for p in r.pushes if p.first_index == index]
        resp = PushEntryResponse(group="g", remote_id="n1", term=2, code=ResponseCode.SUCCESS,
                                 index=index, end_index=index)  # fmt: skip
        d.step(FollowerAnswer(push, resp), now)
        return r

    round_at(5, 3)  # the mark rises: its report is held back for LEARNER_REPORT_MS
    held = d.step(TURN_END, 5)
    assert held.report is None and held.wake_at_ms <= 1 + LEARNER_REPORT_MS
    promotion = round_at(6, 6, configs=((-1, learner), (6, promoted)))
    assert promotion.background is False  # a voter's pushes: in the foreground again
    assert promotion.report == (2, 5)  # and its mark went to the checker at once


def test_a_fresh_dispatcher_reports_nothing_before_its_follower_answers() -> None:
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.step(Activate(INFO), 0)
    assert d.step(TURN_END, 0).report is None


def test_the_last_progress_report_gets_through_the_throttle() -> None:
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.step(Activate(INFO), 0)
    d.step(Reported(2, 3), 0)
    assert d.step(TURN_END, 0).progress == (2, 3)
    d.step(Reported(2, 4), 10)  # within PROGRESS_MS: held back, not dropped
    held = d.step(TURN_END, 10)
    assert held.progress is None and held.wake_at_ms == PROGRESS_MS
    assert d.step(TURN_END, PROGRESS_MS).progress == (2, 4)
    d.step(Reported(1, 9), 200)  # another term's mark is dropped
    assert d.step(TURN_END, 300).progress is None


def test_a_round_of_an_ended_term_is_answered_not_counted() -> None:
    c = CheckerLogic("g", "n0", PEERS, CFG)
    c.step(BecomeLeader(2, 4, INFO), 0)
    c.step(AddRound(1, 5, 5, "old", 5), 0)  # written in term 1: TERM_CHANGED at the next ready
    c.step(AddRound(2, 5, 5, "new", 5), 0)
    res = c.step(TURN_END, 0).resolution
    assert res is not None and res.outcomes == [("old", ResponseCode.TERM_CHANGED)]
    assert "old" not in c._registered and "new" in c._registered
    c.step(LeadershipEnded(2), 0)
    c.step(AddRound(2, 6, 6, "late", 6), 0)  # same term, leadership over: NOT_LEADER on step-down
    assert c.step(LeadershipEnded(2), 0) == [("late", ResponseCode.NOT_LEADER)]


def test_the_commit_notice_waits_for_the_index_to_stand_still() -> None:
    c = CheckerLogic("g", "n0", PEERS, CFG)
    c.step(BecomeLeader(2, 4, INFO), 0)
    c.step(AddRound(2, 5, 5, "r", 5), 0)
    c.step(Report(2, "n1", 5), 0)
    first = c.step(TURN_END, 0)
    assert first.resolution.committed == 5 and first.notice is None
    assert first.wake_at_ms == COMMIT_NOTICE_MS
    assert c.step(TURN_END, COMMIT_NOTICE_MS).notice == (2, 5)
    assert c.step(TURN_END, COMMIT_NOTICE_MS + 1).notice is None  # once


def test_no_commit_notice_when_every_report_was_answered_with_the_index() -> None:
    """After a round, each follower's report is answered with its commit (``told``): the
    dispatchers know it, and no notice follows.  One not told (its follower is down) gets
    the notice."""
    c = CheckerLogic("g", "n0", PEERS, CFG)
    c.step(BecomeLeader(2, 4, INFO), 0)
    c.step(AddRound(2, 5, 5, "r", 5), 0)
    c.step(Report(2, "n1", 5), 0)
    assert c.step(TURN_END, 0).resolution.committed == 5
    assert c.step(ReportAnswer("n1"), 0) == 5
    c.step(Report(2, "n2", 5), 1)
    assert c.step(ReportAnswer("n2"), 0) == 5
    assert c.step(TURN_END, 1).wake_at_ms is None  # nothing to wait for: no notice timer
    assert c.step(TURN_END, COMMIT_NOTICE_MS).notice is None
    c.step(AddRound(2, 6, 6, "s", 6), 10)
    c.step(Report(2, "n1", 6), 10)
    assert c.step(TURN_END, 10).resolution.committed == 6 and c.step(ReportAnswer("n1"), 0) == 6
    assert c.step(TURN_END, 10 + COMMIT_NOTICE_MS).notice == (2, 6)  # n2 was not told
