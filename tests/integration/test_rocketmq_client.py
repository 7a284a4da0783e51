"""CommitLog's put path without Ray: DLedger's codes to RocketMQ's statuses (put_status), and
input RocketMQ refuses never reaching the ledger.  A fake member stands behind a real
LedgerClient, so the codes arrive as the client really reports them."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import pytest
from rayledger.actors import LedgerClient
from rayledger.integration.rocketmq import CommitLog, PutMessageStatus
from rayledger.integration.rocketmq.client import put_status
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

RC, ST = ResponseCode, PutMessageStatus


def timeout_after(refusal: LedgerError | None) -> LedgerError:
    """The LedgerClient's TIMEOUT after it retried ``refusal`` until the deadline."""
    exc = LedgerError.of(RC.TIMEOUT, f"no leader took the append before the deadline: {refusal}")
    exc.__cause__ = refusal
    return exc


@pytest.mark.parametrize(
    "exc, status",
    [
        (LedgerError.of(RC.NOT_LEADER), ST.SERVICE_NOT_AVAILABLE),
        (LedgerError.of(RC.LEADER_NOT_READY), ST.SERVICE_NOT_AVAILABLE),
        (LedgerError.of(RC.DISK_FULL), ST.SERVICE_NOT_AVAILABLE),
        (LedgerError.of(RC.LEADER_PENDING_FULL), ST.OS_PAGECACHE_BUSY),
        (LedgerError.of(RC.WAIT_QUORUM_ACK_TIMEOUT), ST.OS_PAGECACHE_BUSY),
        # the member stored it, no quorum acked in time (actors/core/round_path.py decides the code)
        (OutcomeUnknownError(RC.WAIT_QUORUM_ACK_TIMEOUT, "not acked"), ST.OS_PAGECACHE_BUSY),
        (OutcomeUnknownError(RC.APPEND_OUTCOME_UNKNOWN, "member died"), ST.UNKNOWN_ERROR),
        (OutcomeUnknownError(RC.TERM_CHANGED, "lost its term"), ST.UNKNOWN_ERROR),
        # the client's deadline, after retrying what the leader refused
        (timeout_after(LedgerError.of(RC.NOT_LEADER)), ST.SERVICE_NOT_AVAILABLE),
        (timeout_after(LedgerError.of(RC.LEADER_PENDING_FULL)), ST.OS_PAGECACHE_BUSY),
        (timeout_after(None), ST.SERVICE_NOT_AVAILABLE),
        (LedgerError.of(RC.CORRUPT_LOG), ST.UNKNOWN_ERROR),
    ],
)  # fmt: skip
def test_ledger_codes_map_to_rocketmq_statuses(exc, status):
    assert put_status(exc) is status


class FakeMember:
    """A member whose every append call fails with ``exc`` (as Ray's future would)."""

    def __init__(self, exc: BaseException):
        self.exc, self.calls = exc, 0
        self.append = self

    def remote(self, bodies, group, target, ident=None, maybe_stored=True):
        self.calls += 1
        f: concurrent.futures.Future = concurrent.futures.Future()
        f.set_exception(self.exc)
        return SimpleNamespace(future=lambda: f)


class FakeClient(LedgerClient):
    def __init__(self, member: FakeMember, timeout_s: float):
        super().__init__("g", ["n0"], timeout_s)
        self.member, self._leader = member, "n0"

    def _handle(self, name: str) -> FakeMember:
        return self.member

    def _find_leader(self, timeout_s: float = 1.0) -> str:
        return "n0"


def commitlog(exc: BaseException, timeout_s: float = 0.3) -> tuple[CommitLog, FakeMember]:
    member = FakeMember(exc)
    group = SimpleNamespace(client=lambda timeout_s: FakeClient(member, timeout_s))
    return CommitLog(group, timeout_s=timeout_s), member


@pytest.mark.parametrize(
    "exc, status, unknown",
    [
        (OutcomeUnknownError(RC.WAIT_QUORUM_ACK_TIMEOUT, "not acked"), ST.OS_PAGECACHE_BUSY, True),
        (LedgerError.of(RC.LEADER_PENDING_FULL, "full"), ST.OS_PAGECACHE_BUSY, False),  # retried
        (LedgerError.of(RC.NOT_LEADER, "no"), ST.SERVICE_NOT_AVAILABLE, False),  # retried
        (RuntimeError("the actor died"), ST.UNKNOWN_ERROR, True),
    ],
)  # fmt: skip
def test_a_put_reports_the_status_the_ledger_client_gives(exc, status, unknown):
    log, member = commitlog(exc)
    r = log.put_message("T", 0, b"x")
    assert (r.status, r.outcome_unknown, r.ok) == (status, unknown, False), r
    assert member.calls >= 1
    batch = log.put_messages([{"topic": "T", "body": b"a"}, {"topic": "T", "body": b"b"}])
    assert [(x.status, x.outcome_unknown) for x in batch] == [(status, unknown)] * 2


@pytest.mark.parametrize(
    "kw",
    [
        {"topic": "a/b"}, {"topic": ".."}, {"topic": "a\x00b"}, {"topic": "t" * 128},
        {"queue_id": -1}, {"queue_id": "0"}, {"delay_level": 19}, {"delay_level": -1},
        {"delay_level": 1.5},
    ],
)  # fmt: skip
def test_bad_topics_queues_and_delay_levels_are_refused_before_the_ledger(kw):
    log, member = commitlog(AssertionError("nothing may be appended"))
    args = {"topic": "T", "queue_id": 0, "body": b"x", **kw}
    r = log.put_message(**args)
    assert r.status is ST.MESSAGE_ILLEGAL and not r.outcome_unknown, r
    # in a batch it fails the whole batch (a batch takes no delayed message, bad or not)
    rs = log.put_messages([{"topic": "T", "body": b"ok"}, args])
    assert [x.status for x in rs] == [ST.MESSAGE_ILLEGAL] * 2
    assert member.calls == 0


def test_delay_levels_1_to_18_park_in_the_schedule_topic():
    log, _member = commitlog(AssertionError())
    for level in (1, 18):
        m = log._message("T", 3, b"x", None, None, None, 0, level)
        assert (m.topic, m.queue_id, m.properties["DELAY"]) == (
            "SCHEDULE_TOPIC_XXXX",
            level - 1,
            str(level),
        )
