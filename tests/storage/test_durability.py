"""Durability: sync flush with group commit, the async flush service, the checkpoint."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from rayledger.storage import FileStore, LedgerError, ResponseCode, metafile

from .helpers import abandon, small_config


class SyncCounter:
    """Counts fdatasync calls (optionally slowing them down like a real disk)."""

    def __init__(self, monkeypatch, delay: float = 0.0):
        self.calls = 0
        self.delay = delay
        real = os.fdatasync

        def fdatasync(fd):
            self.calls += 1
            if self.delay:
                time.sleep(self.delay)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)


def test_sync_flush_covers_the_append_when_it_returns(make_file_store):
    s = make_file_store(sync_flush=True, data_segment_size=1 << 20)
    for k in range(20):
        a = s.append_as_leader([b"x" * 100] * (k + 1), 1)
        assert s.flushed_index >= a.last_index
        assert s.flushed_pos >= a.positions[-1] + 148


def test_sync_flush_group_commit(make_file_store, monkeypatch):
    s = make_file_store(sync_flush=True, data_segment_size=1 << 20, index_segment_size=1 << 16)
    counter = SyncCounter(monkeypatch, delay=0.005)
    threads, per_thread = 8, 15
    errors = []

    def worker(t):
        try:
            for _k in range(per_thread):
                a = s.append_as_leader([bytes([t]) * 50], 1)
                assert s.flushed_index >= a.last_index
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    appends = threads * per_thread
    assert s.ledger_end_index == appends - 1
    rounds = counter.calls / 2  # one data + one index segment per round
    assert rounds < appends / 3, f"{counter.calls} fdatasyncs for {appends} appends"


def test_async_flush_service_catches_up(make_file_store):
    s = make_file_store(flush_interval_ms=10)
    a = s.append_as_leader([b"y" * 500] * 5, 1)
    deadline = time.monotonic() + 2.0
    while s.flushed_index < a.last_index and time.monotonic() < deadline:
        time.sleep(0.005)
    assert s.flushed_index == a.last_index
    assert s.flushed_pos == s.write_pos


def test_explicit_flush_and_truncate(make_file_store):
    s = make_file_store(flush_interval_ms=10_000)  # the service will not get to it by itself
    s.append_as_leader([b"z" * 300] * 10, 1)
    assert s.flushed_index < 9
    s.flush()
    assert (s.flushed_index, s.flushed_pos) == (9, s.write_pos)
    s.truncate(4)
    assert (s.flushed_index, s.flushed_pos) == (4, s.write_pos)
    s.append_as_leader([b"w"], 2)
    s.flush()
    assert s.flushed_index == 5


def test_checkpoint_written_periodically_and_reloaded(tmp_path):
    s = FileStore(small_config(tmp_path, checkpoint_interval_ms=20, flush_interval_ms=5))
    s.append_as_leader([b"c" * 200] * 12, 1)
    s.update_committed_index(8)
    deadline = time.monotonic() + 3
    cp = {}
    while time.monotonic() < deadline:
        cp = json.loads((tmp_path / "checkpoint").read_text())
        if cp["committed_index"] == 8 and cp["flushed_index"] == 11:
            break
        time.sleep(0.01)
    assert cp["committed_index"] == 8 and cp["flushed_index"] == 11 and cp["end_index"] == 11
    assert not (tmp_path / "checkpoint.tmp").exists()
    abandon(s)  # crash: no final checkpoint
    s = FileStore(small_config(tmp_path))
    try:
        assert s.committed_index == 8 and s.ledger_end_index == 11
        assert not s.recovery.full_scan and s.recovery.scanned_entries == 0
    finally:
        s.close()


def test_checkpoint_never_claims_more_committed_than_flushed(make_file_store):
    s = make_file_store(flush_interval_ms=10_000)
    s.append_as_leader([b"a"] * 5, 1)
    s.update_committed_index(4)
    with s._lock:
        s._checkpoint(force=True)
    cp = json.loads((s.dir / "checkpoint").read_text())
    assert cp["committed_index"] <= cp["flushed_index"]


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    p = tmp_path / "cp"
    metafile.atomic_write_json(p, {"v": 1})

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(LedgerError) as ei:
        metafile.atomic_write_json(p, {"v": 2})
    assert ei.value.code == ResponseCode.DISK_FULL
    assert metafile.read_json(p) == {"v": 1}  # the old file is intact


def test_fsync_failure_stops_appends(make_file_store, monkeypatch):
    s = make_file_store(sync_flush=True)
    s.append_as_leader([b"ok"], 1)

    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(LedgerError) as ei:
        s.append_as_leader([b"lost?"], 1)
    assert ei.value.code == ResponseCode.DISK_ERROR
    with pytest.raises(LedgerError) as ei:
        s.append_as_leader([b"more"], 1)
    assert ei.value.code == ResponseCode.DISK_ERROR
    monkeypatch.undo()


def test_new_segment_files_are_made_durable(make_file_store, monkeypatch):
    """Creating a segment file dirties its directory; the flush fsyncs the directory."""
    s = make_file_store(sync_flush=True)
    synced_dirs = []
    real = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            synced_dirs.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    s.append_as_leader([b"x" * 3000] * 3, 1)  # rolls twice
    assert str(s.dir / "data") in synced_dirs
