"""Protocol logs of the replication cores: one structured line per event (log_event), with
member, term and index, and the fields that explain it."""

from __future__ import annotations

import logging
import re

import pytest
from rayledger.integration.bench.divergent import converge
from rayledger.replication import EntryHandler, PushType, QuorumAckChecker, ReplicationConfig
from rayledger.replication.checker import AwaitQuorum, CheckQuorum, EndTerm, LeadTerm, MarkStored
from rayledger.replication.messages import Push

from .helpers import FOLLOWER, GROUP, LEADER, follower_state, push, store_with

LINE = re.compile(r"^\[\S+\] [a-z_.]+ term=-?\d+( idx=-?\d+)?( \S+=.*)?$")


def records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rayledger.replication"]


def test_commit_naming_an_entry_we_lack_says_whose_term_is_whose(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The follower (term 3) holds term 2 at index 4; the COMMIT of the term-3 leader names
    (4, term 0): the warning gives the request's term, ours and the one we hold there."""
    store = store_with([1, 1, 2, 2, 2])
    h = EntryHandler(GROUP, FOLLOWER, follower_state(term=3), store, ReplicationConfig())
    req = push(PushType.COMMIT, term=3, first_index=4, entry_term=0, entry_pos=0, commit_index=4)
    with caplog.at_level(logging.WARNING, "rayledger.replication"):
        h.step(Push(req, "t"), 0)
    (line,) = records(caplog)
    assert line.startswith(f"[{FOLLOWER}] commit.unheld term=3 idx=4 req_term=3 leader={LEADER}")
    assert "entry_term=0 held_term=2 span=0..4" in line
    caplog.clear()
    req = push(PushType.COMMIT, term=3, first_index=9, entry_term=3, entry_pos=0, commit_index=9)
    with caplog.at_level(logging.WARNING, "rayledger.replication"):
        h.step(Push(req, "t"), 0)
    (line,) = records(caplog)
    assert "idx=9" in line and "held_term=-1" in line  # beyond our end: nothing held


def test_every_protocol_log_is_one_structured_line(caplog: pytest.LogCaptureFixture) -> None:
    """A divergent follower converging and a checker failing its appends log at every level
    without error, each record in log_event's shape."""
    leader = store_with([1] * 5 + [4] * 50)
    follower = store_with([1] * 5 + [2] * 30 + [3] * 30)
    checker = QuorumAckChecker(GROUP, LEADER, [LEADER, FOLLOWER, "x"], ReplicationConfig())
    with caplog.at_level(logging.DEBUG, "rayledger.replication"):
        converge(leader, follower, 4)
        checker.step(LeadTerm(4, 55, 54), 0)
        checker.step(AwaitQuorum(4, 55, 56, "tok"), 0)
        checker.step(MarkStored(4, FOLLOWER, 60), 0)
        checker.step(CheckQuorum(), 10**9)
        checker.step(EndTerm(5), 0)
    lines = records(caplog)
    events = {line.split()[1] for line in lines}
    assert {"compare", "truncate", "send", "append", "push.state"} <= events
    assert {"checker.lead", "checker.ack_timeout"} <= events
    bad = [line for line in lines if not LINE.match(line)]
    assert not bad, bad[:3]
