"""Behaviour shared by FileStore and MemoryStore: appends, reads, truncate, reset, bad input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from rayledger.storage import (
    Entry,
    EntryBatch,
    FileStore,
    LedgerError,
    MemoryStore,
    ResponseCode,
    StoreConfig,
)
from rayledger.storage.codec import HEADER, HEADER_SIZE, encode_entries

from .helpers import small_config, snapshot

RC = ResponseCode


def bodies(n: int, size: int = 100, tag: int = 0) -> list[bytes]:
    return [bytes([(tag + k) % 256]) * size for k in range(n)]


def expect_error(code: ResponseCode, fn, *args, **kw) -> LedgerError:
    with pytest.raises(LedgerError) as ei:
        fn(*args, **kw)
    assert ei.value.code == code, ei.value
    return ei.value


# -- the basics -------------------------------------------------------------------------
def test_fresh_store(store):
    assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term) == (0, -1, -1)
    assert store.committed_index == -1 and store.is_empty
    assert store.first_index_of_term(1) == -1


def test_append_get_and_metadata(store):
    a = store.append_as_leader(bodies(3), 1)
    assert (a.first_index, a.last_index, a.term) == (0, 2, 1)
    assert a.positions == [0, 148, 296]
    b = store.append_as_leader([b"", b"x" * 10], 2)
    assert (b.first_index, b.positions) == (3, [444, 492])
    assert store.ledger_end_index == 4 and store.ledger_end_term == 2
    assert store.get(0) == Entry(0, 1, 0, bodies(3)[0])
    assert store.get(3).body == b"" and store.get(4).body == b"x" * 10
    assert [store.get_term(i) for i in range(5)] == [1, 1, 1, 2, 2]
    assert store.get_pos(4) == 492
    assert store.get(np.int64(2)).index == 2  # numpy integers are fine
    assert store.first_index_of_term(2) == 3 and store.first_index_of_term(1) == 0
    assert store.first_index_of_term(3) == -1
    assert [e.index for e in store.get_range(1, 100)] == [1, 2, 3, 4]
    assert store.get_range(5, 9) == []


def test_rolls_keep_positions_inside_segments(store):
    seg = store.config.data_segment_size
    for k in range(40):
        store.append_as_leader([bytes([k]) * (k * 37 % 700)], 1 + k // 10)
    for i in range(40):
        e = store.get(i)
        assert e.pos // seg == (e.pos + HEADER_SIZE + len(e.body) - 1) // seg
        assert e.body == bytes([i]) * (i * 37 % 700)


def test_entries_exactly_filling_a_segment(store):
    """Regression: a batch (or read) running exactly up to a segment end, then on."""
    body = b"z" * (1024 - HEADER_SIZE)  # four entries fill a 4 KiB segment exactly
    a = store.append_as_leader([body] * 10, 1)
    assert a.positions == [k * 1024 for k in range(10)]
    batch = store.read_batch(0)
    assert batch.count == 10 and len(batch.data) == 10 * 1024
    assert [e.body for e in store.get_range(0, 10)] == [body] * 10


def test_read_batch_limits(store):
    store.append_as_leader(bodies(20, 200), 1)
    b = store.read_batch(3, max_bytes=1)
    assert (b.first_index, b.count) == (3, 1)  # at least one entry
    b = store.read_batch(3, max_bytes=3 * 248)
    assert b.count == 3
    b = store.read_batch(3, max_count=5)
    assert b.count == 5 and [e.index for e in b.entries()] == [3, 4, 5, 6, 7]
    b = store.read_batch(15)
    assert b.count == 5


def test_truncate_and_reappend(store):
    store.append_as_leader(bodies(30, 300), 1)
    store.update_committed_index(5)
    assert store.truncate(29) == 0
    assert store.truncate(12) == 17
    assert store.ledger_end_index == 12 and store.ledger_end_term == 1
    expect_error(RC.INDEX_OUT_OF_BOUNDS, store.get, 13)
    a = store.append_as_leader([b"new"], 2)
    assert a.first_index == 13 and store.get(13).body == b"new"
    assert store.get(12).body == bodies(30, 300)[12]


def test_truncate_drops_roll_padding(make_store):
    """After a truncate, the next entry lands where a log that never had the tail puts it."""
    s, ref = make_store(), make_store()
    big = b"b" * 3600
    s.append_as_leader([b"a" * 500, big], 1)  # the big one rolls into segment 1
    assert s.get_pos(1) == 4096
    s.truncate(0)
    ref.append_as_leader([b"a" * 500], 1)
    assert s.write_pos == ref.write_pos == 548
    assert (
        s.append_as_leader([b"c" * 100], 2).positions
        == ref.append_as_leader([b"c" * 100], 2).positions
    )


def test_truncate_everything_and_reset(store):
    store.append_as_leader(bodies(5), 1)
    store.truncate(-1)
    assert store.is_empty and store.ledger_end_term == -1 and store.write_pos == 0
    store.append_as_leader(bodies(2), 1)
    store.update_committed_index(1)
    store.reset(100, 5000)
    assert (store.ledger_begin_index, store.ledger_end_index) == (100, 99)
    assert store.write_pos == 5000
    a = store.append_as_leader([b"r"], 7)
    assert (a.first_index, a.positions) == (100, [5000])
    assert store.get(100).body == b"r"
    expect_error(RC.INDEX_OUT_OF_BOUNDS, store.get, 99)
    store.truncate(99)  # empty again, same start
    assert store.write_pos == 5000 and store.is_empty


def test_committed_index(store):
    store.append_as_leader(bodies(4), 1)
    assert store.update_committed_index(2) == 2
    assert store.committed_pos == store.get_pos(2) + HEADER_SIZE + 100
    assert store.update_committed_index(1) == 2  # never backwards
    assert store.update_committed_index(99) == 3  # never past the end


# -- replication: read_batch -> append_as_follower ------------------------------------
def test_follower_replication_is_byte_identical(make_store):
    leader, follower = make_store(), make_store()
    for k in range(12):
        leader.append_as_leader([bytes([k]) * (k * 211 % 1500) for _ in range(k % 3 + 1)], k // 4)
    i = 0
    while i <= leader.ledger_end_index:
        batch = leader.read_batch(i, max_bytes=5000)
        follower.append_as_follower(batch)
        i += batch.count
    assert follower.read_batch(0).data == leader.read_batch(0).data
    assert follower.ledger_end_term == leader.ledger_end_term
    assert follower._chain == leader._chain


def _follower_with(make_store, n=3):
    leader, follower = make_store(), make_store()
    leader.append_as_leader(bodies(n, 200), 1)
    follower.append_as_follower(leader.read_batch(0))
    leader.append_as_leader(bodies(4, 300, tag=9), 2)
    return leader, follower, leader.read_batch(n)


def test_follower_refuses_bad_batches(make_store):
    leader, f, good = _follower_with(make_store)
    before = snapshot(f)
    data = bytearray(good.data)

    def flip(off):
        d = bytearray(data)
        d[off] ^= 0xFF
        return EntryBatch(good.first_index, good.count, bytes(d))

    def with_header(k, **fields):  # rewrite header fields of entry k (offsets of a 248/348 layout)
        d = bytearray(data)
        off = sum(h[1] for h in good.headers()[:k])
        h = list(HEADER.unpack_from(d, off))
        names = ["magic", "size", "index", "term", "pos", "channel", "chain", "bcrc", "bsize"]
        for name, v in fields.items():
            h[names.index(name)] = v
        HEADER.pack_into(d, off, *h)
        return EntryBatch(good.first_index, good.count, bytes(d))

    cases = [
        (RC.INCONSISTENT_STATE, EntryBatch(good.first_index + 1, good.count, good.data)),
        (RC.INCONSISTENT_STATE, EntryBatch(0, good.count, good.data)),
        (RC.UNEXPECTED_ARGUMENT, flip(HEADER_SIZE + 5)),  # body byte: CRC
        (RC.UNEXPECTED_ARGUMENT, flip(0)),  # magic
        (RC.UNEXPECTED_ARGUMENT, EntryBatch(good.first_index, good.count + 1, good.data)),
        (RC.UNEXPECTED_ARGUMENT, EntryBatch(good.first_index, good.count, good.data[:-1])),
        (RC.UNEXPECTED_ARGUMENT, EntryBatch(good.first_index, good.count, good.data[:30])),
        (RC.REQUEST_WITH_EMPTY_BODYS, EntryBatch(good.first_index, 0, b"")),
        (RC.INCONSISTENT_STATE, with_header(1, pos=data and good.headers()[1][4] + 8)),
        (RC.INCONSISTENT_STATE, with_header(0, pos=good.headers()[0][4] + 48)),
        (RC.INCONSISTENT_STATE, with_header(2, term=0)),  # term goes backwards
        (RC.INCONSISTENT_STATE, with_header(0, index=7)),
        (RC.INCONSISTENT_STATE, with_header(0, chain=12345)),  # logs diverged
        (RC.UNEXPECTED_ARGUMENT, with_header(0, bsize=-10, size=38)),
        (RC.UNEXPECTED_ARGUMENT, "not a batch"),
        (RC.UNEXPECTED_ARGUMENT, EntryBatch("3", good.count, good.data)),
        (RC.UNEXPECTED_ARGUMENT, EntryBatch(good.first_index, good.count, "text")),
    ]
    for code, batch in cases:
        err = expect_error(code, f.append_as_follower, batch)
        assert err.message, batch
        assert snapshot(f) == before, (code, err)
    f.append_as_follower(good)  # and the good one still goes in
    assert f.read_batch(0).data == leader.read_batch(0).data


def test_follower_refuses_positions_of_other_segment_size(tmp_path):
    leader = MemoryStore(small_config())
    follower = MemoryStore(small_config(data_segment_size=8192))
    leader.append_as_leader([b"x" * 3000] * 3, 1)
    follower.append_as_follower(leader.read_batch(0, max_count=1))
    before = snapshot(follower)
    err = expect_error(RC.INCONSISTENT_STATE, follower.append_as_follower, leader.read_batch(1))
    assert "segment sizes differ" in err.message
    assert snapshot(follower) == before


# -- bad input: every refusal leaves the store as it was ------------------------------
def test_bad_leader_appends_change_nothing(store):
    store.append_as_leader(bodies(3), 2)
    store.update_committed_index(1)
    before = snapshot(store)
    limit = store.config.max_entry_size
    cases = [
        (RC.UNEXPECTED_ARGUMENT, (b"bare bytes", 2)),
        (RC.UNEXPECTED_ARGUMENT, (bytearray(b"bare"), 2)),
        (RC.UNEXPECTED_ARGUMENT, ("a string", 2)),
        (RC.UNEXPECTED_ARGUMENT, (["not", "bytes"], 2)),
        (RC.UNEXPECTED_ARGUMENT, ([b"ok", 5], 2)),
        (RC.UNEXPECTED_ARGUMENT, ([b"ok", None], 2)),
        (RC.UNEXPECTED_ARGUMENT, (iter([b"x"]), 2)),
        (RC.UNEXPECTED_ARGUMENT, (None, 2)),
        (RC.REQUEST_WITH_EMPTY_BODYS, ([], 2)),
        (RC.REQUEST_WITH_EMPTY_BODYS, ((), 2)),
        (RC.ENTRY_TOO_LARGE, ([b"ok", b"x" * (limit + 1)], 2)),
        (RC.UNEXPECTED_ARGUMENT, ([b"x"], -1)),
        (RC.UNEXPECTED_ARGUMENT, ([b"x"], "2")),
        (RC.UNEXPECTED_ARGUMENT, ([b"x"], 2.0)),
        (RC.UNEXPECTED_ARGUMENT, ([b"x"], None)),
        (RC.EXPIRED_TERM, ([b"x"], 1)),
    ]
    for code, args in cases:
        err = expect_error(code, store.append_as_leader, *args)
        assert err.message
        assert snapshot(store) == before, (code, args)
    expect_error(RC.UNEXPECTED_ARGUMENT, store.append_as_leader, [b"x"], 2, channel="c")
    assert snapshot(store) == before
    # exactly max_entry_size is fine
    store.append_as_leader([b"x" * limit], 2)


def test_memoryview_and_bytearray_bodies(store):
    arr = np.arange(10, dtype=np.int32)
    store.append_as_leader([memoryview(arr), bytearray(b"ba"), memoryview(b"mv")], 1)
    assert store.get(0).body == arr.tobytes()
    assert [store.get(i).body for i in (1, 2)] == [b"ba", b"mv"]


def test_bad_reads_and_indexes(store):
    store.append_as_leader(bodies(3), 1)
    store.update_committed_index(1)
    before = snapshot(store)
    for i in (-1, 3, 10**12):
        expect_error(RC.INDEX_OUT_OF_BOUNDS, store.get, i)
        expect_error(RC.INDEX_OUT_OF_BOUNDS, store.get_term, i)
        expect_error(RC.INDEX_OUT_OF_BOUNDS, store.get_pos, i)
        expect_error(RC.INDEX_OUT_OF_BOUNDS, store.read_batch, i)
    expect_error(RC.INDEX_OUT_OF_BOUNDS, store.get_range, -1, 2)
    for bad in ("1", 1.0, None, True, b"\x01", [1]):
        expect_error(RC.UNEXPECTED_ARGUMENT, store.get, bad)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.get_term, bad)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.get_pos, bad)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.read_batch, bad)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.get_range, bad, 3)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.truncate, bad)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.update_committed_index, bad)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.reset, bad, 0)
        expect_error(RC.UNEXPECTED_ARGUMENT, store.first_index_of_term, bad)
    expect_error(RC.UNEXPECTED_ARGUMENT, store.read_batch, 0, max_count=0)
    assert snapshot(store) == before


def test_refused_truncates_and_resets(store):
    store.append_as_leader(bodies(6), 1)
    store.update_committed_index(3)
    before = snapshot(store)
    err = expect_error(RC.INCONSISTENT_STATE, store.truncate, 2)
    assert "committed" in err.message
    expect_error(RC.INCONSISTENT_STATE, store.reset, 3, 0)
    expect_error(RC.INCONSISTENT_STATE, store.reset, 0, 0)
    expect_error(RC.UNEXPECTED_ARGUMENT, store.reset, 10, -1)
    assert snapshot(store) == before
    assert store.truncate(3) == 2  # down to the committed index is fine


def test_truncate_below_begin_is_out_of_bounds(store):
    store.reset(10, 0)
    store.append_as_leader(bodies(3), 1)
    before = snapshot(store)
    expect_error(RC.INDEX_OUT_OF_BOUNDS, store.truncate, 5)
    assert snapshot(store) == before


def test_hook_that_changes_length_is_refused(store):
    store.append_as_leader(bodies(2), 1)
    before = snapshot(store)
    store.add_append_hook(lambda i, p, body: body.extend(b"!"))
    expect_error(RC.UNEXPECTED_ARGUMENT, store.append_as_leader, bodies(2), 1)
    assert snapshot(store) == before
    expect_error(RC.UNEXPECTED_ARGUMENT, store.add_append_hook, "not callable")


# -- append hooks -----------------------------------------------------------------------
def stamp_physical_offset(index: int, pos: int, body: bytearray) -> None:
    """RocketMQ-style: the message records its own physical offset (the body's position)."""
    struct.pack_into(">qq", body, 0, pos + HEADER_SIZE, index)


def test_hooks_stamp_before_crc_and_replicate(make_store):
    leader, follower = make_store(), make_store()
    leader.add_append_hook(stamp_physical_offset)
    for k in range(15):
        leader.append_as_leader(
            [bytes(16) + bytes([k]) * (k * 97 % 900) for _ in range(k % 3 + 1)], 1
        )
    for i in range(leader.ledger_end_index + 1):
        e = leader.get(i)
        assert struct.unpack_from(">qq", e.body) == (e.pos + HEADER_SIZE, i)
    i = 0
    while i <= leader.ledger_end_index:
        b = leader.read_batch(i, max_bytes=3000)
        follower.append_as_follower(b)  # checks every CRC: the stamp is covered
        i += b.count
    assert follower.read_batch(0).data == leader.read_batch(0).data


def test_hooks_leave_configuration_entries_alone(make_store):
    """A configuration entry is the group's; a machine's pre_append never sees it."""
    from rayledger.election.configuration import CONFIG_CHANNEL, Configuration

    store = make_store()
    seen = []

    def stamp(index: int, pos: int, body: bytearray) -> None:
        seen.append(index)
        body[:1] = b"X"[: len(body)]

    store.add_append_hook(stamp)
    doc = Configuration.of(["n0", "n1"], ["n2"]).encode()
    store.append_as_leader([b"a", b""], 1)  # a client's entry, a term's empty one
    store.append_as_leader([doc], 1, channel=CONFIG_CHANNEL)
    store.append_as_leader([b"b"], 1)
    assert seen == [0, 1, 3]
    assert [store.get(i).body for i in (0, 1, 3)] == [b"X", b"", b"X"]
    assert store.get(2).body == doc and store.get(2).channel == CONFIG_CHANNEL


def test_hooked_entries_survive_reopen(tmp_path):
    cfg = small_config(tmp_path / "s")
    s = FileStore(cfg)
    s.add_append_hook(stamp_physical_offset)
    for k in range(10):
        s.append_as_leader([bytes(16) + b"m" * (k * 300)], 1)
    data = s.read_batch(0).data
    s.close()
    s = FileStore(StoreConfig(**{**cfg.__dict__, "verify_all_on_open": True}))
    try:
        assert s.recovery.dropped_bytes == 0 and s.recovery.full_scan
        assert s.read_batch(0).data == data
        for i in range(10):
            e = s.get(i)
            assert struct.unpack_from(">qq", e.body) == (e.pos + HEADER_SIZE, i)
    finally:
        s.close()


def test_encoded_batch_matches_store_bytes(store):
    a = store.append_as_leader(bodies(5, 33), 4)
    data, _ = encode_entries(bodies(5, 33), 0, 4, a.positions, 0)
    assert store.read_batch(0).data == data


def test_closed_store_refuses(make_store):
    s = make_store()
    s.append_as_leader(bodies(2), 1)
    s.close()
    s.close()  # idempotent
    with pytest.raises(LedgerError) as ei:
        s.append_as_leader(bodies(1), 1)
    assert ei.value.code == RC.DISK_ERROR
    with pytest.raises(LedgerError):
        s.get(0)
