"""Client sessions travel with a state machine's snapshots: a member whose log
starts after a snapshot -- installed from a leader, or compacted -- knows the sessions of
the entries it no longer holds, and answers a retry of them from its log."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.replication.sessions import Verdict
from rayledger.storage import EntryBatch, FileStore, StoreConfig
from rayledger.storage.codec import SESSION, SESSION_FLAG
from rayledger.storage.snapshots import SESSIONS_FILE, SnapshotStore, write_sessions


class Shelf:
    def __init__(self, directory):
        self.store = SnapshotStore(directory)


def _logic(path, sub: str, segment: int = 1 << 16) -> MemberLogic:
    store = FileStore(StoreConfig(data_dir=str(path / sub), data_segment_size=segment))
    return MemberLogic("g", sub, ["a", "b", "c"], store, ElectionConfig(), ReplicationConfig(),
                       MemoryTermStore(term=1))  # fmt: skip


def _leader(tmp_path, segment: int = 1 << 16) -> MemberLogic:
    m = _logic(tmp_path, "a", segment)
    for k in range(30):  # three clients, interleaved, ten calls of two entries each
        client = k % 3 + 1
        bodies = [SESSION.pack(client, k // 3 * 2 + j, 1000 + k, 0) + b"v%d" % k for j in range(2)]
        m.store.append_as_leader(bodies, 1, [SESSION_FLAG] * 2)
    m.store.update_committed_index(m.store.ledger_end_index)
    return m


@pytest.fixture
def leader(tmp_path):
    m = _leader(tmp_path)
    yield m
    m.store.close()


def _snapshot(m: MemberLogic, shelf: Shelf, index: int) -> None:
    tmp = shelf.store.begin(index, 1)
    write_sessions(tmp, m.sessions.at(index))  # as the machine runner does
    shelf.store.commit(tmp, index, 1)


def test_a_follower_reset_to_an_installed_snapshot_knows_its_sessions(leader, tmp_path):
    shelf = Shelf(tmp_path / "snaps-b")
    _snapshot(leader, shelf, 39)
    f = _logic(tmp_path, "b")
    try:
        f.take_snapshots(shelf)
        f.store.reset(40, leader.store.get_pos(40))  # the leader's TRUNCATE with reset ...
        f.handler.on_reset(40)  # ... and what the handler then tells the member
        data = leader.store.read_batch(40, 1 << 30, 20).data
        f.store.append_as_follower(EntryBatch(40, 20, data))
        assert f.sessions.dump() == leader.sessions.dump()
        # client 2's calls k = 1, 4, 7, ...: the oldest kept (8 runs) is k = 7, entries
        # 14, 15 -- held only in the snapshot
        c = f.sessions.check(2, 4, 2, now=f.sessions.last_stamp)
        assert c.verdict is Verdict.DUPLICATE and c.spans == ((14, 2),)
    finally:
        f.store.close()


def test_a_restart_after_compaction_rebuilds_from_the_snapshot(leader, tmp_path):
    shelf = Shelf(tmp_path / "snaps-a")
    _snapshot(leader, shelf, 29)
    want = leader.sessions.dump()
    m = _logic(tmp_path, "c")
    try:
        m.store.reset(30, leader.store.get_pos(30))  # a log that begins after the snapshot
        m.store.append_as_follower(
            EntryBatch(30, 30, leader.store.read_batch(30, 1 << 30, 30).data)
        )
        m.store.close()
        again = _logic(tmp_path, "c")  # restarted: the scan finds only entries 30..59
        assert again.sessions.dump() != want
        again.take_snapshots(shelf)  # the machine attaches its snapshots
        assert again.sessions.dump() == want
        again.store.close()
    finally:
        m.store.close()


def test_a_damaged_sessions_file_is_never_loaded(leader, tmp_path):
    """A snapshot whose session table fails its checksum is passed over for an older whole
    one at or past the log's begin, or for what the log itself holds: a damaged table could
    put a session behind its log, and a retry would be written twice."""
    shelf = Shelf(tmp_path / "snaps-d")
    _snapshot(leader, shelf, 29)
    _snapshot(leader, shelf, 59)
    newest = max(shelf.store.list(), key=lambda m: m.index)
    path = os.path.join(newest.path, SESSIONS_FILE)
    doc = json.load(open(path))
    for row in doc["sessions"]:
        row[1] -= 4  # each session's last sequence set back: as if never written
    with open(path, "w") as f:
        json.dump(doc, f)
    want = leader.sessions.dump()
    m = _logic(tmp_path, "e")
    try:
        m.store.reset(30, leader.store.get_pos(30))
        m.store.append_as_follower(
            EntryBatch(30, 30, leader.store.read_batch(30, 1 << 30, 30).data)
        )
        m.take_snapshots(shelf)
        assert m.sessions.dump() == want  # from the whole snapshot at 29, not the one at 59
        for client in (1, 2, 3):
            s = m.sessions.sessions[client]
            assert m.sessions.check(client, s.last_seq - 1, 1, 2000).verdict is not Verdict.NEW
    finally:
        m.store.close()


def test_a_reset_with_its_snapshot_damaged_asks_for_the_leaders_and_then_knows(leader, tmp_path):
    """A follower's log is reset to the leader's begin while its own snapshot there is
    damaged: it knows it lacks the sessions below (a young session it lacks is UNKNOWN,
    not new), asks its leader for a snapshot that far in every push answer, and the one it
    seals brings them."""
    from rayledger.replication.sessions import new_client_id

    shelf = Shelf(tmp_path / "snaps-d")
    _snapshot(leader, shelf, 39)
    meta = shelf.store.list()[0]
    with open(os.path.join(meta.path, SESSIONS_FILE), "a") as f:
        f.write(" ")  # damaged: its checksum no longer matches
    f = _logic(tmp_path, "d")
    try:
        f.take_snapshots(shelf)
        f.store.reset(40, leader.store.get_pos(40))
        f.handler.on_reset(40)
        data = leader.store.read_batch(40, 1 << 30, 20).data
        f.store.append_as_follower(EntryBatch(40, 20, data))
        assert f.sessions.unknown_upto == 39
        assert f.snapshot_wanted(40) == 39
        now = f.sessions.last_stamp
        young = new_client_id(now, 5)
        assert f.sessions.check(young, 0, 1, now=now).verdict is Verdict.UNKNOWN
        good = Shelf(tmp_path / "snaps-d")  # the leader's snapshot at 39, sealed here
        shutil.rmtree(meta.path)
        _snapshot(leader, good, 39)
        f.sealed(good.store.list())
        assert f.sessions.unknown_upto == -1 and f.snapshot_wanted(40) == -1
        assert f.sessions.dump() == leader.sessions.dump()
        assert f.sessions.check(young, 0, 1, now=now).verdict is Verdict.NEW
    finally:
        f.store.close()


def _reset_lacking_sessions(leader: MemberLogic, shelf: Shelf, f: MemberLogic) -> None:
    """``f``'s only snapshot, the leader's at 39, has a damaged session table; its log is
    reset to 40 and gets the leader's 40..59: it lacks the sessions below 40."""
    _snapshot(leader, shelf, 39)
    meta = shelf.store.list()[0]
    with open(os.path.join(meta.path, SESSIONS_FILE), "a") as out:
        out.write(" ")  # damaged: its checksum no longer matches
    f.take_snapshots(shelf)
    f.store.reset(40, leader.store.get_pos(40))
    f.handler.on_reset(40)
    f.store.append_as_follower(EntryBatch(40, 20, leader.store.read_batch(40, 1 << 30, 20).data))


def test_a_member_lacking_sessions_asks_for_a_snapshot_its_log_goes_on_from(tmp_path):
    """Its sessions unknown below 39, the member's own snapshot at 49 (cut from the table it
    has) lets its log go up to 50: a leader's snapshot at 39 would be sealed and never used
    (below the log's begin, no log after it), so it asks for one at 49 or later, and the
    leader's at 55 brings every session."""
    leader = _leader(tmp_path, segment=256)  # a few entries a segment: compaction is close
    shelf = Shelf(tmp_path / "snaps-f")
    f = _logic(tmp_path, "f", segment=256)
    try:
        _reset_lacking_sessions(leader, shelf, f)
        assert f.sessions.unknown_upto == 39 and f.snapshot_wanted(40) == 39
        _snapshot(f, shelf, 49)  # its own, of the table it has
        f.store.update_committed_index(59)
        f.store.keep_from = 50
        f.store.flush()  # a segment goes only once the one after it is on disk
        f.store.clean(compact=True)
        begin = f.store.ledger_begin_index
        assert begin > 40
        assert f.snapshot_wanted(begin) == begin - 1  # not 39: one it could not rebuild from
        _snapshot(leader, shelf, 55)
        f.sealed([m for m in shelf.store.list() if m.index == 55])
        assert f.sessions.unknown_upto == -1 and f.snapshot_wanted(begin) == -1
        assert f.sessions.dump() == leader.sessions.dump()
    finally:
        f.store.close()
        leader.store.close()


def test_a_leaders_whole_table_is_used_below_the_members_own_newer_one(leader, tmp_path):
    """Its sessions unknown below 39, the member cut its own snapshot at 55 from the table
    it has; the leader's at 49 is sealed after it: the table comes from the leader's (it
    knows every session) and the log after it, not from the newer one that lacks some.
    (Until then it asks for one past 55: that one came without them.)"""
    shelf = Shelf(tmp_path / "snaps-g")
    f = _logic(tmp_path, "g")
    try:
        _reset_lacking_sessions(leader, shelf, f)
        assert f.sessions.unknown_upto == 39
        _snapshot(f, shelf, 55)  # its own: its table says what it lacks
        f.sealed([m for m in shelf.store.list() if m.index == 55])
        assert f.sessions.unknown_upto == 39  # still lacking them
        assert f.snapshot_wanted(40) == 56  # a later one than the one that lacked them
        _snapshot(leader, shelf, 49)
        f.sealed([m for m in shelf.store.list() if m.index == 49])
        assert f.sessions.unknown_upto == -1 and f.snapshot_wanted(40) == -1
        assert f.sessions.dump() == leader.sessions.dump()
    finally:
        f.store.close()
