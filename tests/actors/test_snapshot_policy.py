"""SnapshotPolicy (actors/core/snapshot_policy.py): when to snapshot, what to keep, where to
start from and how far the log may be compacted."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rayledger.actors.core.snapshot_policy import SnapshotConfig, SnapshotPolicy
from rayledger.storage import LedgerError, ResponseCode


@dataclass(frozen=True)
class Snap:
    index: int
    term: int = 1


def test_a_snapshot_is_due_every_n_entries_one_at_a_time() -> None:
    p = SnapshotPolicy(SnapshotConfig(every_entries=100), last=-1)
    assert not p.due(98) and p.due(99)
    p.begin(99)
    assert not p.due(500)  # one at a time
    p.taken(99, [Snap(99)])
    assert not p.due(198) and p.due(199)


def test_the_byte_trigger() -> None:
    p = SnapshotPolicy(SnapshotConfig(every_entries=0, every_bytes=1000), last=10)
    p.applied(600)
    assert not p.due(20)
    p.applied(600)
    assert p.due(20)
    p.begin(20)
    p.taken(20, [Snap(20)])
    assert not p.due(21)  # the byte count starts again


def test_a_failed_snapshot_is_tried_again_when_next_due() -> None:
    p = SnapshotPolicy(SnapshotConfig(every_entries=10))
    p.begin(9)
    p.failed()
    assert p.due(9)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=30, unique=True), st.integers(1, 5))
def test_the_newest_keep_snapshots_stay(indexes: list[int], keep: int) -> None:
    p = SnapshotPolicy(SnapshotConfig(keep=keep))
    have = [Snap(i) for i in indexes]
    gone = p.taken(max(indexes), have)
    stay = sorted(set(indexes) - {s.index for s in gone})
    assert stay == sorted(indexes)[-keep:]
    assert p.last == max(indexes)


def test_start_from_the_newest_snapshot_that_verifies() -> None:
    have = [Snap(5), Snap(50), Snap(30)]
    bad = {50: "state fails its checksum"}
    assert SnapshotPolicy.start_from(have, lambda s: bad.get(s.index)).index == 30
    assert SnapshotPolicy.start_from(have, lambda s: "damaged") is None
    assert SnapshotPolicy.start_from([], lambda s: None) is None


def test_the_log_keeps_what_the_machine_needs_to_come_back() -> None:
    assert SnapshotPolicy(SnapshotConfig(), last=-1).compaction_floor() == 0
    assert SnapshotPolicy(SnapshotConfig(), last=100).compaction_floor() == 101


def test_bad_settings_are_a_coded_error() -> None:
    with pytest.raises(LedgerError) as e:
        SnapshotConfig(keep=0)
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_a_snapshot_asked_for_is_due_once_the_machine_stands_that_far() -> None:
    """A follower stranded below its log's begin waits for a snapshot at or past its
    point; an idle group never reaches the next periodic one."""
    p = SnapshotPolicy(SnapshotConfig(every_entries=100), last=86)
    assert not p.due(140)
    p.ask(150)
    assert not p.due(140)  # not that far yet: the batch that gets there takes it
    p.ask(98)
    assert p.due(140)  # the nearest ask counts
    p.begin(140)
    assert not p.due(141)  # one at a time
    p.taken(140, [Snap(86), Snap(140)])
    assert not p.due(160)  # answered: periodic again (a follower still short asks again)
    p.ask(120)
    assert not p.due(160)  # what the newest snapshot holds already
    p.ask(150)
    assert p.due(150) and not p.due(149)


def test_an_ask_past_a_damaged_newest_snapshot_cuts_a_new_one() -> None:
    """The newest snapshot (140) was found damaged: the newest that can be sent is 86. A
    follower asking for 120 gets a new one cut at once, not when the next periodic one is
    due (an idle group never reaches it, and the follower stays stranded)."""
    p = SnapshotPolicy(SnapshotConfig(every_entries=100), last=140)
    p.ask(120)
    assert not p.due(160)  # as far as it knows, 140 answers it
    p.ask(120, have=86)
    assert p.due(160)
