"""Snapshot install: the follower's InstallReceiver over a real SnapshotStore, the
EntryHandler's INSTALL pushes, and the EntryDispatcher's INSTALL state in front of the
reset of a follower whose log lies entirely below the leader's begin."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from rayledger.replication import (
    DispatcherState,
    EntryDispatcher,
    EntryHandler,
    PushType,
    ReplicationConfig,
    SnapshotChunk,
)
from rayledger.replication.install import InstallReceiver
from rayledger.replication.messages import Push
from rayledger.replication.push import FollowerAnswer, FreshState, NextPushes
from rayledger.storage import MemoryStore, ResponseCode
from rayledger.storage.snapshots import SnapshotMeta, SnapshotStore

from .helpers import FOLLOWER, GROUP, LEADER, append_req, follower_state, push, resp, store_with

S = ResponseCode.SUCCESS
BAD = ResponseCode.INCONSISTENT_STATE
CORRUPT = ResponseCode.CORRUPT_SNAPSHOT

FILES = {"kv.json": bytes(range(40)), "empty": b"", "sub/log": b"0123456789abcde"}
TOTAL = 55


def _snapshot(store: SnapshotStore, index: int, term: int, files: dict[str, bytes]):
    def write(path: str) -> None:
        for name, data in files.items():
            (Path(path) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(path) / name).write_bytes(data)

    return store.seal(index, term, write)


class Spy:
    """A SnapshotStore sink that records the calls made to it."""

    def __init__(self, store: SnapshotStore):
        self.store = store
        self.calls: list[tuple] = []

    def begin_install(self, index, term, files):
        self.calls.append(("begin", index, term))
        return self.store.begin_install(index, term, files)

    def write_at(self, tmp, files, offset, data):
        self.calls.append(("write", offset, len(data)))
        self.store.write_at(tmp, files, offset, data)

    def commit(self, tmp, index, term, expect=None):
        self.calls.append(("commit", index, term))
        return self.store.commit(tmp, index, term, expect=expect)

    def abort(self, tmp):
        self.calls.append(("abort", Path(tmp).name))
        self.store.abort(tmp)


@pytest.fixture
def leader(tmp_path) -> tuple[SnapshotStore, SnapshotMeta]:
    s = SnapshotStore(tmp_path / "leader")
    meta = _snapshot(s, 9, 1, FILES)
    assert meta.nbytes == TOTAL
    return s, meta


@pytest.fixture
def rx(tmp_path) -> InstallReceiver:
    return InstallReceiver(FOLLOWER, Spy(SnapshotStore(tmp_path / "follower")))


def _tmp_dirs(d: Path) -> list[str]:
    return sorted(p for p in os.listdir(d) if p.startswith(".tmp-"))


def chunk(src, meta, offset: int, length: int, term: int = 2, data=None, **kw):
    """The INSTALL push of stream bytes ``[offset, offset + length)`` of ``meta``."""
    if data is None:
        data = src.read(meta, offset, length)
    c = SnapshotChunk(meta.index, meta.term, tuple(meta.files), offset, length)
    return push(PushType.INSTALL, term, first_index=meta.index, entry_term=meta.term,
                snapshot=c, batch=data, **kw)  # fmt: skip


def chunks(src, meta, size: int, term: int = 2) -> list:
    return [
        chunk(src, meta, off, min(size, meta.nbytes - off), term)
        for off in range(0, meta.nbytes, size)
    ]


# ================================================================ InstallReceiver


def test_chunks_in_order_seal_the_snapshot(leader, rx) -> None:
    src, meta = leader
    answers = [rx.take(r) for r in chunks(src, meta, 20)]
    assert answers == [(S, 20), (S, 40), (S, 55)]
    (got,) = rx.sealed
    assert (got.index, got.term, got.nbytes) == (9, 1, TOTAL)
    assert sorted(got.files) == sorted(meta.files)
    assert Path(got.path).parent == rx.sink.store.dir
    for name, data in FILES.items():
        assert (Path(got.path) / name).read_bytes() == data
    assert rx.sink.store.list() == [got] and rx.sink.store.verify(got) is None
    assert _tmp_dirs(rx.sink.store.dir) == []
    assert rx.take_sealed() == [got]
    assert rx.sealed == [] and rx.take_sealed() == []
    assert [c[0] for c in rx.sink.calls] == ["begin", "write", "write", "write", "commit"]


def test_a_chunk_at_a_wrong_offset_is_answered_with_the_offset_held(leader, rx) -> None:
    src, meta = leader
    c0, c1, c2 = chunks(src, meta, 20)
    assert rx.take(c0) == (S, 20)
    calls = list(rx.sink.calls)
    assert rx.take(c2) == (S, 20)  # ahead of what we hold (c1 lost)
    assert rx.take(c0) == (S, 20)  # a duplicate
    late = chunk(src, meta, 10, 20)  # overlaps what we hold
    assert rx.take(late) == (S, 20)
    past = chunk(src, meta, 20, 40, data=src.read(meta, 20, 35) + b"\0" * 5)  # past the end
    assert rx.take(past) == (S, 20)
    assert rx.sink.calls == calls and rx.received == 20  # nothing written
    assert rx.take(c1) == (S, 40)
    assert rx.take(c2) == (S, TOTAL)
    (got,) = rx.take_sealed()
    assert rx.sink.store.verify(got) is None


def test_a_chunk_of_another_transfer_not_at_zero_starts_it_over(leader, rx) -> None:
    src, meta = leader
    c0, c1, _ = chunks(src, meta, 20)
    assert rx.take(c0) == (S, 20)
    calls = list(rx.sink.calls)
    # the same snapshot from another leader term, another snapshot index, another term
    other_term = replace(c1, term=3)
    other_index = replace(c1, snapshot=replace(c1.snapshot, index=12))
    other_snap_term = replace(c1, snapshot=replace(c1.snapshot, term=2))
    for r in (other_term, other_index, other_snap_term):
        assert rx.take(r) == (S, 0)
    assert rx.sink.calls == calls  # nothing begun, nothing dropped
    assert rx.take(c1) == (S, 40)  # the transfer in progress goes on


def test_a_new_transfer_at_zero_drops_the_old_temp_dir(tmp_path, leader, rx) -> None:
    src, old = leader
    new = _snapshot(src, 20, 2, {"kv.json": b"new state" * 3})
    assert rx.take(chunks(src, old, 20)[0]) == (S, 20)
    d = rx.sink.store.dir
    assert _tmp_dirs(d) == [f".tmp-in-{9:020d}-1"]
    first, *rest = chunks(src, new, 10)
    assert rx.take(first) == (S, 10)
    assert _tmp_dirs(d) == [f".tmp-in-{20:020d}-2"]
    assert ("abort", f".tmp-in-{9:020d}-1") in rx.sink.calls
    assert [rx.take(r) for r in rest] == [(S, 20), (S, 27)]
    (got,) = rx.take_sealed()
    assert (got.index, got.term) == (20, 2)
    assert [m.index for m in rx.sink.store.list()] == [20] and _tmp_dirs(d) == []


def test_the_same_snapshot_from_a_new_leader_term_starts_over_at_zero(leader, rx) -> None:
    src, meta = leader
    assert rx.take(chunks(src, meta, 20)[0]) == (S, 20)
    again = chunks(src, meta, 20, term=3)
    assert rx.take(again[1]) == (S, 0)
    assert [rx.take(r) for r in again] == [(S, 20), (S, 40), (S, TOTAL)]
    (got,) = rx.take_sealed()
    assert rx.sink.store.verify(got) is None


def test_a_late_duplicate_of_a_sealed_transfer_answers_the_total(leader, rx) -> None:
    src, meta = leader
    cs = chunks(src, meta, 20)
    for r in cs:
        rx.take(r)
    assert len(rx.take_sealed()) == 1
    calls = list(rx.sink.calls)
    assert rx.take(cs[0]) == (S, TOTAL)
    assert rx.take(cs[1]) == (S, TOTAL)
    assert rx.take(cs[2]) == (S, TOTAL)
    assert rx.sink.calls == calls and rx.sealed == []  # not sealed twice
    assert [m.index for m in rx.sink.store.list()] == [9]


def test_a_damaged_chunk_is_corrupt_and_the_next_transfer_starts_at_zero(leader, rx) -> None:
    src, meta = leader
    cs = chunks(src, meta, 20)
    bad = bytearray(cs[1].batch)
    bad[3] ^= 0x40
    damaged = replace(cs[1], batch=bytes(bad))
    assert rx.take(cs[0]) == (S, 20)
    assert rx.take(damaged) == (S, 40)  # a chunk alone carries no checksum
    assert rx.take(cs[2]) == (CORRUPT, 0)  # sealing finds it
    assert rx.sealed == [] and rx.received == 0
    store = rx.sink.store
    assert store.list() == [] and _tmp_dirs(store.dir) == []
    assert rx.take(cs[1]) == (S, 0)  # the transfer is gone: start over
    assert [rx.take(r) for r in cs] == [(S, 20), (S, 40), (S, TOTAL)]
    (got,) = rx.take_sealed()
    assert store.verify(got) is None
    assert (Path(got.path) / "kv.json").read_bytes() == FILES["kv.json"]


def test_a_zero_byte_snapshot_seals_on_one_empty_chunk(tmp_path, rx) -> None:
    src = SnapshotStore(tmp_path / "leader")
    meta = _snapshot(src, 4, 1, {"a": b"", "sub/b": b""})
    assert meta.nbytes == 0
    r = chunk(src, meta, 0, 0)
    assert r.batch == b"" and r.snapshot.total == 0 and r.snapshot.last
    assert rx.take(r) == (S, 0)
    (got,) = rx.take_sealed()
    assert (got.index, got.term) == (4, 1)
    assert sorted(got.files) == sorted(meta.files)
    assert (Path(got.path) / "sub" / "b").read_bytes() == b""
    assert rx.sink.store.verify(got) is None
    assert not [c for c in rx.sink.calls if c[0] == "write"]


def test_a_chunk_without_its_bytes_is_refused(leader, rx) -> None:
    src, meta = leader
    c0 = chunks(src, meta, 20)[0]
    assert rx.take(replace(c0, batch=None)) == (ResponseCode.UNEXPECTED_ARGUMENT, 0)
    assert rx.take(replace(c0, batch=c0.batch[:-1])) == (ResponseCode.UNEXPECTED_ARGUMENT, 0)
    assert not [c for c in rx.sink.calls if c[0] == "write"]
    assert rx.take(c0) == (S, 20)


def test_a_snapshot_naming_a_file_outside_its_directory_is_refused(tmp_path, rx) -> None:
    evil = SnapshotMeta(5, 1, (("../escape", 3, "0" * 64),), str(tmp_path))
    r = chunk(None, evil, 0, 3, data=b"abc")
    assert rx.take(r) == (CORRUPT, 0)
    assert not (rx.sink.store.dir / "escape").exists()
    assert rx.sealed == [] and rx.sink.store.list() == []


# ================================================================ EntryHandler


def handler(tmp_path=None, terms=(1,) * 6, term: int = 2):
    store = store_with(list(terms))
    h = EntryHandler(GROUP, FOLLOWER, follower_state(term), store, ReplicationConfig())
    if tmp_path is not None:
        h.installs = InstallReceiver(FOLLOWER, Spy(SnapshotStore(tmp_path / "follower")))
    return h, store


def only(answers):
    assert len(answers) == 1, answers
    return answers[0]


def test_a_handler_without_installs_answers_unsupported(leader) -> None:
    src, meta = leader
    h, store = handler()
    tok, r = only(h.step(Push(chunks(src, meta, 20)[0], "t"), 0))
    assert tok == "t" and r.code == ResponseCode.UNSUPPORTED and r.index == 0
    assert (r.begin_index, r.end_index) == (0, 5) and store.ledger_end_index == 5


def test_a_handler_takes_install_chunks_and_leaves_its_log_alone(tmp_path, leader) -> None:
    src, meta = leader
    h, store = handler(tmp_path)
    got = [only(h.step(Push(r, i), 0)) for i, r in enumerate(chunks(src, meta, 20))]
    assert [(t, r.code, r.index) for t, r in got] == [(0, S, 20), (1, S, 40), (2, S, TOTAL)]
    assert all((r.begin_index, r.end_index, r.term) == (0, 5, 2) for _, r in got)
    (sealed,) = h.installs.take_sealed()
    assert (sealed.index, sealed.term) == (9, 1)
    assert (store.ledger_begin_index, store.ledger_end_index) == (0, 5)
    assert h.matched_index == -1


@pytest.mark.parametrize(
    "term, code", [(1, ResponseCode.EXPIRED_TERM), (3, ResponseCode.TERM_NOT_READY)]
)
def test_install_pushes_are_fenced_by_term(tmp_path, leader, term, code) -> None:
    src, meta = leader
    h, _ = handler(tmp_path)
    tok, r = only(h.step(Push(chunks(src, meta, 20, term=term)[0], "t"), 0))
    assert tok == "t" and r.code == code and r.term == 2
    assert h.installs.sink.calls == [] and h.installs.received == 0


def test_an_install_from_another_leader_is_refused(tmp_path, leader) -> None:
    src, meta = leader
    h, _ = handler(tmp_path)
    _, r = only(h.step(Push(replace(chunks(src, meta, 20)[0], leader_id="x"), "t"), 0))
    assert r.code == ResponseCode.INCONSISTENT_LEADER and h.installs.sink.calls == []


def test_an_install_clears_queued_appends(tmp_path, leader) -> None:
    src, meta = leader
    lead = store_with([1] * 10)
    h, _ = handler(tmp_path)
    assert h.step(Push(append_req(lead, 8, 1), "queued"), 0) == []
    answers = h.step(Push(chunks(src, meta, 20)[0], "inst"), 0)
    assert [(t, r.code, r.index) for t, r in answers] == [
        ("queued", ResponseCode.UNKNOWN, 8),
        ("inst", S, 20),
    ]
    assert h.queued == 0


def test_a_damaged_install_is_answered_corrupt(tmp_path, leader) -> None:
    src, meta = leader
    h, _ = handler(tmp_path)
    cs = chunks(src, meta, 20)
    last = replace(cs[2], batch=b"X" * len(cs[2].batch))
    codes = [only(h.step(Push(r, "t"), 0))[1] for r in (cs[0], cs[1], last)]
    assert [(r.code, r.index) for r in codes] == [(S, 20), (S, 40), (CORRUPT, 0)]


def test_a_commit_naming_an_entry_below_our_begin_is_accepted(tmp_path) -> None:
    """After an install the follower's log restarts at the leader's begin: a COMMIT that
    names a compacted (so committed) entry below it proves the match up to it."""
    h, store = handler(tmp_path)
    reset = push(PushType.TRUNCATE, first_index=10, entry_term=2, entry_pos=4096, reset=True)
    _, r = only(h.step(Push(reset, "t"), 0))
    assert r.code == S and (store.ledger_begin_index, store.ledger_end_index) == (10, 9)
    assert h.matched_index == 9
    below = push(PushType.COMMIT, commit_index=9, first_index=7, entry_term=1, entry_pos=70)
    _, r = only(h.step(Push(below, "t"), 0))
    assert r.code == S and r.index == 9 and store.committed_index == 9
    assert h.matched_index == 9
    unheld = push(PushType.COMMIT, commit_index=11, first_index=11, entry_term=2, entry_pos=0)
    _, r = only(h.step(Push(unheld, "t"), 0))
    assert r.code == BAD and r.index == 11 and store.committed_index == 9


def test_a_commit_below_begin_raises_the_matched_index(tmp_path) -> None:
    h, store = handler(tmp_path, terms=())
    store.reset(10, 4096)
    below = push(PushType.COMMIT, commit_index=9, first_index=9, entry_term=1, entry_pos=90)
    _, r = only(h.step(Push(below, "t"), 0))
    assert r.code == S and h.matched_index == 9 and store.committed_index == 9


# ================================================================ EntryDispatcher


@dataclass(frozen=True)
class Snap:
    index: int
    term: int
    files: tuple


SNAP = Snap(9, 1, (("a", 12, "h1"), ("b", 0, "h2"), ("c", 13, "h3")))  # 25 bytes


class SnapLog:
    """A leader's log (a MemoryStore) that offers a snapshot, counting the calls."""

    def __init__(self, store: MemoryStore, snap=SNAP):
        self.store = store
        self.snap = snap
        self.peeks = 0
        self.takes = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def peek_snapshot(self, at_least=-1):
        self.peeks += 1
        return self.snap

    def take_snapshot(self):
        self.takes += 1
        return self.snap


def compacted_log(snap=SNAP) -> SnapLog:
    """The leader's log [10, 11] (term 2): everything up to 9 was cleaned."""
    store = store_with([1] * 6)
    store.reset(10, store.write_pos)
    store.append_as_leader([b"a" * 10, b"b" * 10], 2)
    assert (store.ledger_begin_index, store.ledger_end_index) == (10, 11)
    return SnapLog(store, snap)


def dispatcher(**cfg) -> EntryDispatcher:
    cfg.setdefault("install_chunk_bytes", 10)
    d = EntryDispatcher(GROUP, LEADER, FOLLOWER, ReplicationConfig(**cfg))
    d.step(FreshState(2, LEADER, True), 0)
    return d


def below_begin(d: EntryDispatcher, log, now: int = 0) -> None:
    """The first COMPARE answered by a follower whose log ends at 5, below our begin 10."""
    (req,) = d.step(NextPushes(log), now)
    assert req.type is PushType.COMPARE and req.first_index == 11
    d.step(FollowerAnswer(req, resp(BAD, 11, 0, 5)), now)
    assert d.state is DispatcherState.TRUNCATE


def held(index: int, code=S):
    return resp(code, index, 0, 5)


def test_a_follower_below_our_begin_gets_the_snapshot_then_the_reset() -> None:
    d, log = dispatcher(), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    assert d.state is DispatcherState.INSTALL
    assert c.type is PushType.INSTALL and c.snapshot == SnapshotChunk(9, 1, SNAP.files, 0, 10)
    assert (c.first_index, c.entry_term, c.term, c.batch) == (9, 1, 2, None)
    assert (log.peeks, log.takes) == (1, 1)
    assert d.step(NextPushes(log), 1) == []  # one chunk in flight
    sent = [(c.snapshot.offset, c.snapshot.length)]
    for answer in (10, 20):
        d.step(FollowerAnswer(c, held(answer)), 1)
        (c,) = d.step(NextPushes(log), 1)
        sent.append((c.snapshot.offset, c.snapshot.length))
    assert sent == [(0, 10), (10, 10), (20, 5)] and c.snapshot.last
    assert d.state is DispatcherState.INSTALL and d.installs == 0
    d.step(FollowerAnswer(c, held(25)), 2)
    assert d.state is DispatcherState.TRUNCATE and d.installs == 1
    (tr,) = d.step(NextPushes(log), 2)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10
    assert (tr.entry_term, tr.entry_pos) == (2, log.get_pos(10))
    assert (log.peeks, log.takes) == (1, 1)  # the snapshot was read once
    d.step(FollowerAnswer(tr, resp(S, 10, 10, 9)), 3)
    assert d.state is DispatcherState.APPEND and d.write_index == 10 and d.water_mark == 9


def test_the_install_resumes_at_the_offset_the_follower_holds() -> None:
    d, log = dispatcher(), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c, held(10)), 0)
    (c,) = d.step(NextPushes(log), 0)
    assert c.snapshot.offset == 10
    d.step(FollowerAnswer(c, held(4)), 0)  # the follower holds less than we thought
    (c,) = d.step(NextPushes(log), 0)
    assert (c.snapshot.offset, c.snapshot.length) == (4, 10)
    d.step(FollowerAnswer(c, held(17)), 0)
    (c,) = d.step(NextPushes(log), 0)
    assert (c.snapshot.offset, c.snapshot.length) == (17, 8)
    d.step(FollowerAnswer(c, held(25)), 0)
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10


def test_a_chunk_size_larger_than_the_snapshot_sends_one_chunk() -> None:
    d, log = dispatcher(install_chunk_bytes=1 << 20), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    assert (c.snapshot.offset, c.snapshot.length, c.snapshot.total) == (0, 25, 25)


def test_a_zero_byte_snapshot_is_one_empty_chunk() -> None:
    d, log = dispatcher(), compacted_log(Snap(9, 1, (("a", 0, "h"), ("b", 0, "h"))))
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    assert (c.snapshot.offset, c.snapshot.length, c.snapshot.total) == (0, 0, 0)
    d.step(FollowerAnswer(c, held(0)), 0)
    assert d.installs == 1
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10


@pytest.mark.parametrize("snap", [None, Snap(8, 1, (("a", 5, "h"),))])
def test_no_snapshot_that_bridges_the_gap_means_the_plain_reset(snap) -> None:
    d, log = dispatcher(), compacted_log(snap)
    below_begin(d, log)
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10
    assert d.state is DispatcherState.TRUNCATE and d.installs == 0
    assert (log.peeks, log.takes) == (1, 1)  # taken to forget it


def test_a_log_offering_no_snapshots_means_the_plain_reset() -> None:
    d, log = dispatcher(), compacted_log().store  # a bare MemoryStore
    below_begin(d, log)
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10


def test_a_follower_with_no_snapshots_gets_the_plain_reset() -> None:
    d, log = dispatcher(error_backoff_ms=500), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c, held(0, ResponseCode.UNSUPPORTED)), 10)
    assert d.state is DispatcherState.TRUNCATE and d.installs == 0
    (tr,) = d.step(NextPushes(log), 10)  # at once: no backoff
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10
    assert (log.peeks, log.takes) == (1, 1)


@pytest.mark.parametrize("answer", [None, held(0, CORRUPT), held(20, ResponseCode.DISK_FULL)])
def test_a_lost_or_failed_chunk_fetches_the_snapshot_again(answer) -> None:
    d, log = dispatcher(error_backoff_ms=500), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c, held(10)), 0)
    (c,) = d.step(NextPushes(log), 0)
    assert c.snapshot.offset == 10
    d.step(FollowerAnswer(c, answer), 100)
    assert d.state is DispatcherState.TRUNCATE
    assert d.step(NextPushes(log), 599) == []  # the backoff
    (again,) = d.step(NextPushes(log), 600)
    assert again.type is PushType.INSTALL and d.state is DispatcherState.INSTALL
    assert (again.snapshot.offset, again.snapshot.length) == (0, 10)
    assert (log.peeks, log.takes) == (2, 2)
    d.step(FollowerAnswer(again, held(10)), 600)  # a lost chunk: the follower still holds 10
    (c,) = d.step(NextPushes(log), 600)
    assert c.snapshot.offset == 10


def test_a_newer_snapshot_fetched_again_is_the_one_sent() -> None:
    d, log = dispatcher(error_backoff_ms=0), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c, None), 0)
    log.snap = Snap(11, 2, (("a", 30, "h"),))
    (c,) = d.step(NextPushes(log), 0)
    assert (c.first_index, c.entry_term, c.snapshot.index, c.snapshot.total) == (11, 2, 11, 30)


def test_an_unanswered_chunk_is_sent_again_after_the_timeout() -> None:
    d, log = dispatcher(compare_timeout_ms=3000), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c, held(10)), 0)
    (c,) = d.step(NextPushes(log), 0)
    assert d.step(NextPushes(log), 2999) == []
    (again,) = d.step(NextPushes(log), 3000)
    assert again.snapshot == c.snapshot and again.type is PushType.INSTALL


def test_an_answer_to_a_chunk_no_longer_in_flight_is_ignored() -> None:
    d, log = dispatcher(), compacted_log()
    below_begin(d, log)
    (c0,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c0, held(10)), 0)
    (c1,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c0, held(25)), 0)  # a late copy of the answer to the first chunk
    assert d.state is DispatcherState.INSTALL and d.installs == 0
    assert d.step(NextPushes(log), 1) == []  # c1 still in flight
    d.step(FollowerAnswer(c1, held(20)), 1)
    (c2,) = d.step(NextPushes(log), 1)
    assert c2.snapshot.offset == 20


def test_an_installed_follower_is_not_sent_the_snapshot_twice_in_a_term() -> None:
    d, log = dispatcher(error_backoff_ms=0), compacted_log()
    below_begin(d, log)
    for _ in range(3):
        (c,) = d.step(NextPushes(log), 0)
        d.step(FollowerAnswer(c, held(c.snapshot.offset + c.snapshot.length)), 0)
    assert d.installs == 1 and d.state is DispatcherState.TRUNCATE
    (tr,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(tr, resp(BAD, 10, 0, 5)), 0)  # the reset failed
    assert d.state is DispatcherState.COMPARE
    below_begin(d, log)
    (tr,) = d.step(NextPushes(log), 0)
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10  # no 2nd install
    assert (log.peeks, log.takes) == (1, 1) and d.installs == 1


def test_a_new_term_forgets_the_install() -> None:
    d, log = dispatcher(), compacted_log()
    below_begin(d, log)
    (c,) = d.step(NextPushes(log), 0)
    d.step(FollowerAnswer(c, held(10)), 0)
    d.step(FreshState(3, LEADER, True), 0)
    assert d.state is DispatcherState.COMPARE
    d.step(FollowerAnswer(c, held(20)), 0)  # an answer of the old term
    (req,) = d.step(NextPushes(log), 0)
    assert req.type is PushType.COMPARE and req.term == 3


# ================================================================ both ends together


def test_a_follower_below_the_leaders_begin_is_installed_end_to_end(tmp_path, leader) -> None:
    """The dispatcher, the handler and both snapshot stores: the follower (log 0..5) ends
    up holding the leader's snapshot at 9 and its log restarted at 10 with the leader's
    entries 10 and 11."""
    src, meta = leader
    log = compacted_log(meta)
    d = dispatcher(install_chunk_bytes=16)
    h, store = handler(tmp_path)
    sent = []
    for step in range(40):
        if d.state is DispatcherState.APPEND and d.water_mark == 11:
            break
        for req in d.step(NextPushes(log), step):
            sent.append(req.type)
            wire = req
            if req.type is PushType.INSTALL:  # the transport reads the chunk's bytes
                c = req.snapshot
                wire = replace(req, batch=src.read(meta, c.offset, c.length))
            for tok, r in h.step(Push(wire, req), step):
                d.step(FollowerAnswer(tok, r), step)
    assert d.state is DispatcherState.APPEND and d.water_mark == 11
    assert sent[:6] == [PushType.COMPARE] + [PushType.INSTALL] * 4 + [PushType.TRUNCATE]
    assert sent.count(PushType.INSTALL) == 4  # 55 bytes in chunks of 16
    assert d.installs == 1
    (got,) = h.installs.take_sealed()
    assert (got.index, got.term) == (9, 1) and sorted(got.files) == sorted(meta.files)
    assert h.installs.sink.store.verify(got) is None
    assert (store.ledger_begin_index, store.ledger_end_index) == (10, 11)
    assert store.read_batch(10).data == log.read_batch(10).data
    assert hashlib.sha256((Path(got.path) / "kv.json").read_bytes()).hexdigest() == next(
        h for n, _, h in meta.files if n == "kv.json"
    )
