"""A follower whose log begins right after its snapshot point (after a reset or a
compaction): a TRUNCATE at that point drops an old leader's uncommitted entries, and never
an entry the follower knows to be committed."""

from __future__ import annotations

import pytest
from rayledger.election.messages import Tick
from rayledger.replication import EntryHandler, PushType, ReplicationConfig
from rayledger.replication.messages import Push
from rayledger.replication.push import EntryDispatcher, FollowerAnswer, FreshState, NextPushes
from rayledger.storage import MemoryStore, ResponseCode, StoreConfig

from .helpers import FOLLOWER, GROUP, LEADER, append_req, follower_state, push

S = ResponseCode.SUCCESS
BAD = ResponseCode.INCONSISTENT_STATE


def _store() -> MemoryStore:
    return MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 * 1024))


def _logs(committed_above: bool) -> tuple[MemoryStore, MemoryStore]:
    """(new leader of term 3, follower).  Both share the committed prefix 0..9; the
    follower's log was reset to begin at 10 and holds 10..12 after it: an old leader's
    uncommitted entries (term 2, which the new leader never got), or -- with
    ``committed_above`` -- entries the new leader holds too and the follower knows to be
    committed."""
    common = [b"committed-%02d" % i for i in range(10)]
    old = _store()
    old.append_as_leader(common, 1)
    old.append_as_leader([b"old-leader-%d" % i for i in range(3)], 2)
    leader = _store()
    leader.append_as_leader(common, 1)
    if committed_above:
        leader.append_as_leader([b"old-leader-%d" % i for i in range(3)], 2)
    leader.append_as_leader([b"new-leader-%d" % i for i in range(4)], 3)
    leader.update_committed_index(12 if committed_above else 9)
    follower = _store()
    follower.reset(10, old.get_pos(10))
    follower.update_committed_index(9)
    follower.append_as_follower(old.read_batch(10, 1 << 30, 3))
    if committed_above:
        follower.update_committed_index(12)
    return leader, follower


def _handler(follower: MemoryStore) -> EntryHandler:
    return EntryHandler(GROUP, FOLLOWER, follower_state(3), follower, ReplicationConfig())


def _truncate_at_9(leader: MemoryStore):
    return push(PushType.TRUNCATE, term=3, first_index=9, entry_term=1,
                entry_pos=leader.get_pos(9), commit_index=leader.committed_index)  # fmt: skip


def test_a_truncate_at_the_snapshot_point_drops_an_old_leaders_uncommitted_entries() -> None:
    """The snapshot point (9, committed) matches every later leader's log: the cut there is
    accepted, the log is left empty at its begin, and the new leader's entries follow."""
    leader, follower = _logs(committed_above=False)
    h = _handler(follower)
    (_, r), = h.step(Push(_truncate_at_9(leader), "t"), 0)  # fmt: skip
    assert r.code == S and (r.begin_index, r.end_index) == (10, 9)
    assert follower.is_empty and follower.ledger_begin_index == 10 and h.matched_index == 9
    (_, r), = h.step(Push(append_req(leader, 10, 4, term=3, commit=9), "a"), 0)  # fmt: skip
    assert r.code == S and follower.ledger_end_index == 13 and follower.get_term(10) == 3


def test_a_truncate_at_the_snapshot_point_never_drops_committed_entries() -> None:
    """Entries above the snapshot point that the follower knows to be committed stay (the
    store refuses the cut), whatever a (late or stray) TRUNCATE there asks."""
    leader, follower = _logs(committed_above=True)
    before = follower.read_batch(10, 1 << 30, 3).data
    h = _handler(follower)
    (_, r), = h.step(Push(_truncate_at_9(leader), "t"), 0)  # fmt: skip
    assert r.code == BAD
    assert (follower.ledger_begin_index, follower.ledger_end_index) == (10, 12)
    assert follower.read_batch(10, 1 << 30, 3).data == before


def _run(leader: MemoryStore, follower: MemoryStore, ms: int = 30_000) -> list[str]:
    """The new leader's dispatcher and the follower's handler, exchanging directly."""
    h = _handler(follower)
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig())
    d.step(FreshState(3, LEADER, True), 0)
    seen = []
    for now in range(10, ms, 10):
        for req in d.step(NextPushes(leader), now):
            for _tok, resp in h.step(Push(req, None), now):
                d.step(FollowerAnswer(req, resp), now)
                seen.append(f"{req.type.value}@{req.first_index} -> {resp.code.name}")
        h.step(Tick(), now)
    return seen


@pytest.mark.parametrize("committed_above", [False, True])
def test_the_new_leader_brings_such_a_follower_in_line(committed_above) -> None:
    """Before, the COMPARE at the snapshot point matched and the TRUNCATE there was refused
    (no entry held to check), for ever: the follower never got the new leader's entries.
    Committed entries above the point are never cut: the leader matches after them."""
    leader, follower = _logs(committed_above)
    kept = follower.read_batch(10, 1 << 30, 3).data
    seen = _run(leader, follower)
    assert (follower.ledger_begin_index, follower.ledger_end_index) == (10, leader.ledger_end_index)
    assert follower.read_batch(10).data == leader.read_batch(10).data
    if committed_above:
        assert not any(s.startswith("TRUNCATE") for s in seen), seen
        assert follower.read_batch(10, 1 << 30, 3).data == kept
    else:
        assert "TRUNCATE@9 -> SUCCESS" in seen, seen[:6]
        assert seen.count("TRUNCATE@9 -> INCONSISTENT_STATE") == 0, seen[:6]


def _reset_for_an_old_entry() -> tuple[MemoryStore, MemoryStore]:
    """(new leader, follower) on 512-byte segments: the follower's log was reset to begin at
    10 where an old leader's long entry 10 went (padded into the next segment); the new
    leader's entry 10, short, lies at the end of the segment before."""

    def store() -> MemoryStore:
        return MemoryStore(StoreConfig(data_segment_size=512, index_segment_size=32 * 1024))

    common = [b"c%d" % i for i in range(6)]
    old, leader = store(), store()
    for s in (old, leader):
        s.append_as_leader(common, 1)
    old.append_as_leader([b"x" * 200], 2)
    leader.append_as_leader([b"y"] * 4, 3)
    leader.update_committed_index(5)
    follower = store()
    follower.reset(6, old.get_pos(6), 1)
    follower.update_committed_index(5)
    assert old.get_pos(6) != leader.get_pos(6)
    return leader, follower


def test_an_empty_log_takes_the_leaders_position_for_its_first_entry() -> None:
    """Where the entry after a snapshot point lies depends on its size (a segment's
    padding): the follower, reset there for an old leader's entry that never committed,
    takes the new leader's entry at the new leader's position (before, the APPEND was
    refused for good, and the COMPARE before it matched: a loop)."""
    leader, follower = _reset_for_an_old_entry()
    seen = _run(leader, follower, ms=3_000)
    assert (follower.ledger_begin_index, follower.ledger_end_index) == (6, 9), seen[:8]
    assert follower.read_batch(6).data == leader.read_batch(6).data
    assert follower.get_pos(6) == leader.get_pos(6)
