"""Crash tests on real files: torn tails, flipped bytes, damaged index, torn segment rolls."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from rayledger.storage import FileStore, LedgerError, MemoryStore, ResponseCode, StorageError
from rayledger.storage.codec import HEADER_SIZE

from .helpers import abandon, data_files, dir_digest, index_files, small_config

SIZES = [100, 700, 1500, 30, 900, 2000, 64, 333]  # rolls into a few 4 KiB segments


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch):
    """Crashes here are simulated on the page cache, so real fsyncs only cost time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


def body(i: int) -> bytes:
    return bytes([i % 251]) * SIZES[i % len(SIZES)]


def build(path: Path, n: int = 12, commit: int = -1, crash: bool = False, **kw) -> list:
    """A store with ``n`` entries (term bumps every 4) under ``path``; returns the entries."""
    s = FileStore(small_config(path, **kw))
    for i in range(n):
        s.append_as_leader([body(i)], 1 + i // 4)
    s.update_committed_index(commit)
    entries = s.get_range(0, n)
    if crash:
        s.flush()
        abandon(s)
    else:
        s.close()
    return entries


def reopen(path: Path, **kw) -> FileStore:
    return FileStore(small_config(path, **kw))


def assert_prefix(s: FileStore, entries: list, n: int) -> None:
    assert (s.ledger_begin_index, s.ledger_end_index) == (0, n - 1)
    assert s.get_range(0, n) == entries[:n]
    assert s.ledger_end_term == (entries[n - 1].term if n else -1)


def assert_appends_like_a_clean_log(s: FileStore, entries: list, n: int) -> None:
    """The next entries land exactly where a log holding only the prefix puts them."""
    ref = MemoryStore(small_config())
    for e in entries[:n]:
        ref.append_as_leader([e.body], e.term)
    more = [b"q" * 1200, b"r" * 3000, b"s" * 10]
    assert s.append_as_leader(more, 9).positions == ref.append_as_leader(more, 9).positions
    assert s.read_batch(0).data == ref.read_batch(0).data


def data_file_of(path: Path, pos: int, seg: int = 4096) -> Path:
    return path / "data" / f"{pos - pos % seg:020d}"


@pytest.mark.parametrize("crash", [False, True], ids=["closed", "crashed"])
def test_cut_last_entry_at_every_byte(tmp_path, crash):
    src = tmp_path / "src"
    entries = build(src, n=12, commit=5, crash=crash)
    last = entries[-1]
    assert len(last.body) == 30
    seg_file = data_file_of(src, last.pos)
    start_in_file = last.pos % 4096
    total = HEADER_SIZE + len(last.body)
    for cut in range(total):
        d = tmp_path / f"c{cut}"
        shutil.copytree(src, d)
        os.truncate(data_file_of(d, last.pos), start_in_file + cut)
        with reopen(d) as s:
            assert s.recovery.dropped_bytes == cut, cut
            assert s.recovery.dropped_at_pos == (last.pos if cut else None)
            assert_prefix(s, entries, 11)
            if crash:  # no clean close: the last checkpoint may be older, never newer
                assert -1 <= s.committed_index <= min(5, s.ledger_end_index)
            else:
                assert s.committed_index == 5
            if cut in (0, 1, HEADER_SIZE, total - 1):
                assert_appends_like_a_clean_log(s, entries, 11)
        shutil.rmtree(d)
    assert seg_file.exists()


def test_flip_any_checked_byte_of_the_tail(tmp_path):
    src = tmp_path / "src"
    entries = build(src, n=9, commit=3, crash=True)
    last = entries[-1]
    total = HEADER_SIZE + len(last.body)
    # channel (32..36) is not covered by any check in DLedger's format
    offsets = [k for k in range(total) if not 32 <= k < 36]
    offsets = offsets[:60] + offsets[60::37]
    for k in offsets:
        d = tmp_path / f"f{k}"
        shutil.copytree(src, d)
        f = data_file_of(d, last.pos)
        raw = bytearray(f.read_bytes())
        raw[last.pos % 4096 + k] ^= 0x5A
        f.write_bytes(raw)
        with reopen(d) as s:
            assert s.recovery.dropped_bytes == total, k
            assert_prefix(s, entries, 8)
        shutil.rmtree(d)


def test_garbage_after_the_tail_is_dropped(tmp_path):
    entries = build(tmp_path, n=6, crash=True)
    last = entries[-1]
    f = data_file_of(tmp_path, last.pos)
    with open(f, "ab") as fh:
        fh.write(b"\0" * 100)  # e.g. a file system that extended the file with zeros
    with reopen(tmp_path) as s:
        assert s.recovery.dropped_bytes == 100
        assert_prefix(s, entries, 6)
        assert_appends_like_a_clean_log(s, entries, 6)


@pytest.mark.parametrize("damage", ["delete_dir", "delete_file", "truncate", "flip", "zero"])
def test_damaged_index_is_rebuilt_from_the_data(tmp_path, damage):
    entries = build(tmp_path, n=30, commit=20)
    files = index_files(tmp_path)
    assert len(files) >= 3
    victim = files[1]
    if damage == "delete_dir":
        shutil.rmtree(tmp_path / "index")
    elif damage == "delete_file":
        victim.unlink()
    elif damage == "truncate":
        os.truncate(victim, 40)
    elif damage == "flip":
        raw = bytearray(victim.read_bytes())
        raw[32 * 3 + 6] ^= 0x10  # the pos of a unit in the middle
        victim.write_bytes(raw)
    else:
        victim.write_bytes(bytes(victim.stat().st_size))
    with reopen(tmp_path) as s:
        assert s.recovery.full_scan and s.recovery.index_rebuilt_from == 0
        assert s.recovery.dropped_bytes == 0
        assert_prefix(s, entries, 30)
        assert s.committed_index == 20
    with reopen(tmp_path) as s:  # and the rebuilt index is trusted next time
        assert not s.recovery.full_scan and s.recovery.index_rebuilt_from is None
        assert_prefix(s, entries, 30)


def test_index_behind_the_data_is_completed(tmp_path):
    """A crash can persist data but not the index units written just after it."""
    entries = build(tmp_path, n=20, crash=True)
    last_index = index_files(tmp_path)[-1]
    os.truncate(last_index, last_index.stat().st_size - 32 * 2)
    with reopen(tmp_path) as s:
        assert s.recovery.dropped_bytes == 0
        assert s.recovery.index_rebuilt_from is not None
        assert_prefix(s, entries, 20)


def test_term_mismatch_with_index_drops_the_uncommitted_tail(tmp_path):
    """The header term is not under a CRC; the index unit is a second copy of it."""
    entries = build(tmp_path, n=8, crash=True)
    last = entries[-1]
    f = data_file_of(tmp_path, last.pos)
    raw = bytearray(f.read_bytes())
    raw[last.pos % 4096 + 16] ^= 0x01  # high byte of the term
    f.write_bytes(raw)
    with reopen(tmp_path) as s:
        assert s.recovery.dropped_bytes == HEADER_SIZE + len(last.body)
        assert_prefix(s, entries, 7)


def test_crash_after_new_segment_created_empty(tmp_path):
    entries = build(tmp_path, n=5, crash=True)
    last = entries[-1]
    nxt = (last.pos // 4096 + 1) * 4096
    (tmp_path / "data" / f"{nxt:020d}").write_bytes(b"")
    (tmp_path / "index" / f"{(5 * 32 // 256 + 1) * 256:020d}").write_bytes(b"")
    with reopen(tmp_path) as s:
        assert s.recovery.dropped_bytes == 0
        assert_prefix(s, entries, 5)
        assert s.write_pos == last.pos + HEADER_SIZE + len(last.body)
        assert_appends_like_a_clean_log(s, entries, 5)


def test_crash_with_roll_padding_written_but_no_entry(tmp_path):
    entries = build(tmp_path, n=5, crash=True)
    last = entries[-1]
    f = data_file_of(tmp_path, last.pos)
    with open(f, "ab") as fh:  # the padding of a roll, whose entry never made it
        from rayledger.storage.codec import blank_record

        fh.write(blank_record(4096 - f.stat().st_size))
    with reopen(tmp_path) as s:
        assert s.recovery.dropped_bytes == 0 and s.recovery.trimmed_bytes > 0
        assert_prefix(s, entries, 5)
        assert_appends_like_a_clean_log(s, entries, 5)


def test_crash_with_padding_missing_before_the_next_segment(tmp_path):
    entries = build(tmp_path, n=12, crash=True)
    # find a segment that ends with padding, and cut the padding off
    files = data_files(tmp_path)
    first_seg = files[0]
    last_in_first = max((e for e in entries if e.pos < 4096), key=lambda e: e.pos)
    end = last_in_first.pos + HEADER_SIZE + len(last_in_first.body)
    assert end < 4096 and first_seg.stat().st_size == 4096
    os.truncate(first_seg, end)
    with reopen(tmp_path, verify_all_on_open=True) as s:
        assert s.recovery.dropped_bytes == 0
        assert_prefix(s, entries, 12)
        assert first_seg.stat().st_size == 4096  # padded again
    with reopen(tmp_path, verify_all_on_open=True) as s:
        assert_prefix(s, entries, 12)
        assert_appends_like_a_clean_log(s, entries, 12)


def test_torn_first_entry_of_a_new_segment(tmp_path):
    entries = build(tmp_path, n=12, crash=True)
    k = next(i for i, e in enumerate(entries) if e.pos % 4096 == 0 and e.pos)
    e = entries[k]
    n_after = sum(HEADER_SIZE + len(x.body) for x in entries[k:])
    os.truncate(data_file_of(tmp_path, e.pos), 20)
    for later in data_files(tmp_path):
        if int(later.name) > e.pos:
            later.unlink()
    with reopen(tmp_path) as s:
        assert 0 < s.recovery.dropped_bytes <= n_after
        assert_prefix(s, entries, k)
        assert_appends_like_a_clean_log(s, entries, k)


# -- committed entries are never dropped -------------------------------------------------
def _flip(path: Path, pos: int) -> None:
    f = data_file_of(path, pos)
    raw = bytearray(f.read_bytes())
    raw[pos % 4096] ^= 0xFF
    f.write_bytes(raw)


@pytest.mark.parametrize("how", ["verify_all", "index_gone"])
def test_corrupt_committed_entry_is_a_hard_error(tmp_path, how):
    entries = build(tmp_path, n=12, commit=10)
    victim = entries[6]
    _flip(tmp_path, victim.pos + HEADER_SIZE + 3)
    kw = {}
    if how == "verify_all":
        kw["verify_all_on_open"] = True
    else:
        shutil.rmtree(tmp_path / "index")
        (tmp_path / "index").mkdir()
    before = dir_digest(tmp_path)
    with pytest.raises(StorageError) as ei:
        reopen(tmp_path, **kw)
    err = ei.value
    assert err.code == ResponseCode.CORRUPT_LOG
    assert "entry 6" in err.message and "committed" in err.message and str(tmp_path) in err.message
    assert dir_digest(tmp_path) == before  # nothing was repaired, truncated or rewritten
    with pytest.raises(LedgerError):  # and it stays refused
        reopen(tmp_path, **kw)


def test_uncommitted_corruption_is_cut_even_in_the_middle(tmp_path):
    entries = build(tmp_path, n=12, commit=4)
    _flip(tmp_path, entries[7].pos + HEADER_SIZE)
    with reopen(tmp_path, verify_all_on_open=True) as s:
        assert s.recovery.dropped_at_pos == entries[7].pos
        assert_prefix(s, entries, 7)


def test_lost_data_segment_with_committed_entries_is_a_hard_error(tmp_path):
    build(tmp_path, n=12, commit=11)
    data_files(tmp_path)[-1].unlink()
    before = dir_digest(tmp_path)
    with pytest.raises(StorageError) as ei:
        reopen(tmp_path)
    assert ei.value.code == ResponseCode.CORRUPT_LOG
    assert dir_digest(tmp_path) == before


def test_all_data_lost_with_committed_entries_is_a_hard_error(tmp_path):
    build(tmp_path, n=3, commit=1)
    shutil.rmtree(tmp_path / "data")
    with pytest.raises(StorageError) as ei:
        reopen(tmp_path)
    assert ei.value.code == ResponseCode.CORRUPT_LOG


def test_malformed_checkpoint_is_a_hard_error(tmp_path):
    build(tmp_path, n=3, commit=1)
    (tmp_path / "checkpoint").write_text("{not json")
    with pytest.raises(StorageError):
        reopen(tmp_path)
    (tmp_path / "checkpoint").write_text('{"committed_index": "x"}')
    with pytest.raises(StorageError):
        reopen(tmp_path)


def test_missing_checkpoint_means_a_full_scan(tmp_path):
    entries = build(tmp_path, n=12, commit=5)
    (tmp_path / "checkpoint").unlink()
    with reopen(tmp_path) as s:
        assert s.recovery.full_scan and s.recovery.dropped_bytes == 0
        assert_prefix(s, entries, 12)
        assert s.committed_index == -1  # unknown; the leader will tell again


def test_copy_of_an_open_store_after_flush(tmp_path):
    """Copying the directory of a live store after flush() is a valid crash image."""
    with FileStore(small_config(tmp_path / "live")) as s:
        for i in range(15):
            s.append_as_leader([body(i)], 1)
        s.update_committed_index(9)
        s.flush()
        shutil.copytree(tmp_path / "live", tmp_path / "copy")
        entries = s.get_range(0, 15)
    with reopen(tmp_path / "copy") as c:
        assert c.recovery.dropped_bytes == 0
        assert_prefix(c, entries, 15)


def test_reopen_after_reset_keeps_the_base(tmp_path):
    s = FileStore(small_config(tmp_path))
    s.append_as_leader([b"x" * 10], 1)
    s.reset(50, 10_000)
    s.close()
    with reopen(tmp_path) as s:
        assert (s.ledger_begin_index, s.ledger_end_index, s.write_pos) == (50, 49, 10_000)
        s.append_as_leader([b"y"], 3)
        assert s.get(50).pos == 10_000
    with reopen(tmp_path, verify_all_on_open=True) as s:
        assert s.get(50).body == b"y" and s.recovery.dropped_bytes == 0


def test_a_reset_log_keeps_its_term_floor_for_votes_across_a_restart(tmp_path):
    """An empty log reset to the leader's begin reports the term of the leader's entry there
    as its last term, also after a restart: with -1 its member voted for a candidate that
    missed the committed entries below that begin (the all-features simulation: Leader
    Completeness broken, a leader of term 7 whose log ended at 18 with 196 committed)."""
    s = FileStore(small_config(tmp_path))
    s.append_as_leader([b"x" * 10], 1)
    s.reset(50, 10_000, term_floor=4)
    assert (s.ledger_end_index, s.ledger_end_term) == (49, 4)
    s.close()
    with reopen(tmp_path) as s:
        assert (s.ledger_end_index, s.ledger_end_term) == (49, 4)
        s.truncate(49)  # nothing to cut: still the floor
        assert s.ledger_end_term == 4
        s.append_as_leader([b"y"], 4)  # the leader's entry at the base, its term
        assert (s.ledger_end_index, s.ledger_end_term) == (50, 4)
