"""Space: expired and forced cleanup, DISK_FULL refusal, ENOSPC in the middle of a write."""

from __future__ import annotations

import errno
import os
import time

import pytest
from rayledger.storage import FileStore, LedgerError, ResponseCode, StorageError
from rayledger.storage.codec import HEADER_SIZE

from .helpers import data_files, index_files, small_config, snapshot


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


def filled(make_file_store, n=40, **kw) -> FileStore:
    s = make_file_store(**kw)
    s.disk_ratio = lambda: 0.2
    for i in range(n):
        s.append_as_leader([bytes([i]) * 976], 1)  # 4 entries fill a 4 KiB segment
    s.flush()  # a segment goes only once the one after it is on disk
    return s


def at_hour(hour: int) -> float:
    lt = time.localtime()
    return time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, hour, 30, 0, 0, 0, -1))


def age(files, hours: float) -> None:
    t = time.time() - hours * 3600
    for f in files:
        os.utime(f, (t, t))


def test_clean_removes_expired_committed_segments(make_file_store):
    s = filled(make_file_store)  # 10 data segments, entries 4k..4k+3 in segment k
    s.update_committed_index(21)  # segments 0..4 fully committed, 5 partly
    files = data_files(s.dir)
    assert len(files) == 10
    age(files, 100)
    n_index_before = len(index_files(s.dir))
    assert s.clean(now=at_hour((s.config.delete_when + 1) % 24)) == 0  # not the hour
    deleted = s.clean(now=at_hour(s.config.delete_when))
    assert deleted == 5 and s.ledger_begin_index == 20
    assert [f.exists() for f in files] == [False] * 5 + [True] * 5
    assert len(index_files(s.dir)) < n_index_before  # index segments below the begin went too
    with pytest.raises(LedgerError) as ei:
        s.get(19)
    assert ei.value.code == ResponseCode.INDEX_OUT_OF_BOUNDS
    assert s.get(20).body == bytes([20]) * 976 and s.get(39).body == bytes([39]) * 976
    s.append_as_leader([b"more"], 1)
    s.close()
    s = FileStore(s.config)  # the begin survives a reopen
    try:
        assert (s.ledger_begin_index, s.ledger_end_index, s.committed_index) == (20, 40, 21)
        assert s.get(40).body == b"more"
    finally:
        s.close()


def test_clean_keeps_young_segments(make_file_store):
    s = filled(make_file_store)
    s.update_committed_index(39)
    age(data_files(s.dir)[:3], 100)  # only the first three are old
    assert s.clean(now=at_hour(s.config.delete_when)) == 3
    assert s.ledger_begin_index == 12


def test_clean_when_disk_past_check_expired_ratio(make_file_store):
    s = filled(make_file_store)
    s.update_committed_index(39)
    age(data_files(s.dir), 100)
    s.disk_ratio = lambda: 0.75  # past check_expired (0.70): no need to wait for the hour
    assert s.clean(now=at_hour((s.config.delete_when + 5) % 24)) == 9
    assert len(data_files(s.dir)) == 1  # the last segment always stays


def test_force_clean_past_ratio_ignores_age_but_not_commit(make_file_store):
    s = filled(make_file_store)
    s.update_committed_index(13)  # segments 0..2 committed, 3 partly
    s.disk_ratio = lambda: 0.87
    assert s.clean() == 3
    assert s.ledger_begin_index == 12
    assert s.clean() == 0  # entry 14 is not committed: segment 3 stays
    assert s.get(13).body == bytes([13]) * 976


def test_disk_full_refuses_appends(make_file_store):
    s = filled(make_file_store, n=8)
    leader = filled(make_file_store, n=12, sub="leader")
    before = snapshot(s)
    s.disk_ratio = lambda: 0.95
    with pytest.raises(StorageError) as ei:
        s.append_as_leader([b"x"], 1)
    assert ei.value.code == ResponseCode.DISK_FULL and "disk_full_ratio" in ei.value.message
    with pytest.raises(StorageError):
        s.append_as_follower(leader.read_batch(8))
    assert snapshot(s) == before
    s.disk_ratio = lambda: 0.5
    s.append_as_follower(leader.read_batch(8))
    assert s.ledger_end_index == 11


def test_disk_full_first_tries_to_clean(make_file_store):
    s = filled(make_file_store)
    s.update_committed_index(39)
    begin, end = s.ledger_begin_index, s.ledger_end_index
    files_before = data_files(s.dir)
    # the disk is full until the oldest segment is deleted
    s.disk_ratio = lambda: 0.95 if files_before[0].exists() else 0.5
    appended = s.append_as_leader([b"fits after cleaning"], 1)
    assert appended.first_index == end + 1  # the append went through ...
    assert s.ledger_begin_index > begin  # ... because committed segments were cleaned
    assert not files_before[0].exists()
    assert s.get(end + 1).body == b"fits after cleaning"


def _failing_pwrite(monkeypatch, fail_on_call: int, partial: bool = False):
    real = os.pwrite
    calls = [0]

    def pwrite(fd, data, off):
        calls[0] += 1
        if calls[0] == fail_on_call:
            if partial and len(data) > 10:
                real(fd, memoryview(data)[:10], off)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", pwrite)


@pytest.mark.parametrize(
    "fail_on_call,partial",
    [(1, False), (1, True), (2, False), (3, True)],
    ids=["data", "data-partial", "index-or-roll", "later-partial"],
)
def test_enospc_rolls_back(make_file_store, monkeypatch, fail_on_call, partial):
    s = filled(make_file_store, n=7)
    s.update_committed_index(3)
    before = snapshot(s)
    _failing_pwrite(monkeypatch, fail_on_call, partial)
    with pytest.raises(StorageError) as ei:
        s.append_as_leader([b"a" * 1500, b"b" * 3000, b"c" * 10], 1)  # rolls a segment
    assert ei.value.code == ResponseCode.DISK_FULL
    monkeypatch.undo()
    assert snapshot(s) == before
    a = s.append_as_leader([b"a" * 1500, b"b" * 3000, b"c" * 10], 1)
    assert a.first_index == 7
    s.close()
    s2 = FileStore(small_config(s.dir, verify_all_on_open=True))
    try:
        assert s2.recovery.dropped_bytes == 0 and s2.ledger_end_index == 9
        assert s2.get(8).body == b"b" * 3000 and s2.get(8).pos == a.positions[1]
        assert s2.get(9).pos == a.positions[2] and a.positions[1] % 4096 == 0
        assert a.positions[2] == a.positions[1] + HEADER_SIZE + 3000
    finally:
        s2.close()


def test_clean_stops_at_what_the_state_machine_still_needs(make_file_store):
    """A segment goes only when the member's machine can come back without its entries
    (``keep_from``: after its newest snapshot or what it saved), even when forced."""
    s = filled(make_file_store)  # entries 4k..4k+3 in segment k
    s.update_committed_index(39)
    age(data_files(s.dir), 100)
    s.keep_from = 9  # the machine needs entries from 9 on: segments 0 and 1 may go
    s.disk_ratio = lambda: 0.99  # past the force-clean ratio
    assert s.clean(now=at_hour(s.config.delete_when)) == 2 and s.ledger_begin_index == 8
    s.keep_from = 24  # a snapshot at 23 now
    assert s.clean(now=at_hour(s.config.delete_when)) == 4 and s.ledger_begin_index == 24
    s.close()


def test_a_compaction_keeps_a_segment_on_disk_through_a_power_loss(make_file_store):
    """A compaction keeps the segment before one written since the last flush: deleting
    it left, after a power loss, no data file at all beside a checkpoint that promised
    committed entries (CORRUPT_LOG at open; the all-features simulation reached it)."""
    s = filled(make_file_store, flush_interval_ms=60_000)  # the flush thread stays asleep
    # entries 0..39 on disk (filled flushes them), 10 full segments
    s.append_as_leader([b"x" * 976, b"y" * 976], 1)  # 40..41: a new segment, not flushed
    s.update_committed_index(39)
    s.clean(compact=True)
    at = s.abandon()
    for seg in s._data.segments:  # the power loss: what was not flushed is gone
        if seg.start >= at.durable[0]:
            seg.path.unlink(missing_ok=True)
    s = FileStore(s.config)
    try:
        assert (s.ledger_end_index, s.committed_index) == (39, 39)
        assert s.get(39).body == bytes([39]) * 976
    finally:
        s.close()
