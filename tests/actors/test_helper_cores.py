"""The helpers' sans-I/O cores stepped by hand: the decisions that used to live in the Ray
shells (and in the simulation's copies of them)."""

from __future__ import annotations

from rayledger.actors.checker_logic import COMMIT_NOTICE_MS, CheckerLogic
from rayledger.actors.dispatcher_logic import PROGRESS_MS, REPORT_RETRY_MS, DispatcherLogic
from rayledger.actors.logic import LeaderInfo
from rayledger.replication import PushEntryResponse, ReplicationConfig
from rayledger.storage import ResponseCode

CFG = ReplicationConfig()
PEERS = ["n0", "n1", "n2"]
INFO = LeaderInfo(term=2, begin=0, end=4, end_term=2, end_pos=400, committed=3, water_mark=4)


def _caught_up(d: DispatcherLogic, now: int) -> None:
    """Answer the dispatcher's first push with a follower that holds everything."""
    reqs = d.ready(now).pushes
    assert reqs, "the dispatcher pushes on activation"
    resp = PushEntryResponse(group="g", remote_id="n1", term=2, code=ResponseCode.SUCCESS,
                             index=reqs[0].first_index, end_index=4)  # fmt: skip
    d.on_response(reqs[0], resp, now)


def test_a_failed_report_is_sent_again_after_its_backoff() -> None:
    """A restarted checker must learn a caught-up follower's mark (simulation seed 40129:
    the dead checker's report failed, the mark never rose again, a round hung)."""
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.activate(INFO)
    _caught_up(d, 0)
    r = d.ready(1)
    assert r.report is not None and d.reporting
    d.report_failed(2)
    assert d.ready(3).report is None  # backing off, with a wake-up for the retry
    again = d.ready(2 + REPORT_RETRY_MS)
    assert again.report == r.report


def test_a_dispatcher_set_up_again_reports_its_mark_to_the_restarted_checker() -> None:
    """A checker restarted after this follower's report got through: the dispatcher is
    set up again in the same term and reports the caught-up mark at once (before, it
    waited for the mark to rise, which an idle follower's never does)."""
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.activate(INFO)
    _caught_up(d, 0)
    r = d.ready(1)
    d.reported_to_checker(*r.report, committed=3, now_ms=2)
    assert d.ready(3).report is None  # nothing new to report
    d.activate(INFO)  # the supervisor's restore after the checker restarted
    assert d.ready(4).report == (2, 4)


def test_a_fresh_dispatcher_reports_nothing_before_its_follower_answers() -> None:
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.activate(INFO)
    assert d.ready(0).report is None


def test_the_last_progress_report_gets_through_the_throttle() -> None:
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.activate(INFO)
    d.reported_to_checker(2, 3, None, 0)
    assert d.ready(0).progress == (2, 3)
    d.reported_to_checker(2, 4, None, 10)  # within PROGRESS_MS: held back, not dropped
    held = d.ready(10)
    assert held.progress is None and held.wake_at_ms == PROGRESS_MS
    assert d.ready(PROGRESS_MS).progress == (2, 4)
    d.reported_to_checker(1, 9, None, 200)  # another term's mark is dropped
    assert d.ready(300).progress is None


def test_a_round_of_an_ended_term_is_answered_not_counted() -> None:
    c = CheckerLogic("g", "n0", PEERS, CFG)
    c.become_leader(2, 4, INFO)
    c.add_round(1, 5, 5, "old", 0, 5)  # written in term 1: TERM_CHANGED at the next ready
    c.add_round(2, 5, 5, "new", 0, 5)
    res = c.ready(0).resolution
    assert res is not None and res.outcomes == [("old", ResponseCode.TERM_CHANGED)]
    assert not c.is_registered("old") and c.is_registered("new")
    c.step_down(2)
    c.add_round(2, 6, 6, "late", 0, 6)  # same term, leadership over: NOT_LEADER on step-down
    assert c.step_down(2) == [("late", ResponseCode.NOT_LEADER)]


def test_the_commit_notice_waits_for_the_index_to_stand_still() -> None:
    c = CheckerLogic("g", "n0", PEERS, CFG)
    c.become_leader(2, 4, INFO)
    c.add_round(2, 5, 5, "r", 0, 5)
    c.report(2, "n1", 5)
    first = c.ready(0)
    assert first.resolution.committed == 5 and first.notice is None
    assert first.wake_at_ms == COMMIT_NOTICE_MS
    assert c.ready(COMMIT_NOTICE_MS).notice == (2, 5)
    assert c.ready(COMMIT_NOTICE_MS + 1).notice is None  # once
