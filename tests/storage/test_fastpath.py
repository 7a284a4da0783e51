"""The vectorised fast paths of the store agree with the entry-by-entry reference.

- ``codec.chain_crcs`` (numpy slicing-by-4) equals ``chain_crc`` (zlib);
- ``encode_entries`` gives the same bytes whether the batch goes through the
  numpy encoder (equal small bodies) or the per-entry loop;
- a short follower batch is checked entry by entry (numpy's per-call cost outweighs
  its loops there), a long one vectorised;
- ``LogStore._verify_fast`` accepts good follower batches on its own (uniform
  and mixed sizes, inside a segment and across rolls), and for every damaged
  batch the store answers exactly what the reference check answers (same code,
  same message, store unchanged).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from rayledger.replication.messages import Announcement, Inline
from rayledger.storage import EntryBatch, LedgerError, MemoryStore, codec
from rayledger.storage import store as store_module
from rayledger.storage.codec import HEADER_SIZE, chain_crc, chain_crcs, encode_entries
from rayledger.storage.store import LogStore

from .helpers import small_config, snapshot


def test_chain_crcs_matches_zlib():
    r = random.Random(7)
    prev = [r.getrandbits(32) for _ in range(5000)] + [0, 0xFFFF_FFFF]
    bcrc = [r.getrandbits(32) for _ in range(5000)] + [0xFFFF_FFFF, 0]
    want = np.array([chain_crc(p, b) for p, b in zip(prev, bcrc, strict=True)], dtype=np.uint32)
    assert (chain_crcs(np.array(prev, dtype=np.uint32), np.array(bcrc, dtype=">u4")) == want).all()
    assert (chain_crcs(np.array(prev, dtype=">u4"), np.array(bcrc, dtype=np.uint32)) == want).all()


@pytest.mark.parametrize("body_len", [0, 1, 7, 128, 2048, 2049])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 300])
def test_uniform_encoding_matches_the_loop(monkeypatch, body_len, n):
    r = random.Random(body_len * 1000 + n)
    bodies = [r.randbytes(body_len) for _ in range(n)]
    positions = [12_345 + k * (HEADER_SIZE + body_len) for k in range(n)]
    for prev, channel, term in ((0, 0, 0), (-123_456_789, 7, 2**40), (0x7FFF_FFFF, 2**30 - 1, 3)):
        monkeypatch.setattr(codec, "_UNIFORM_MIN", 1)
        fast = encode_entries(bodies, 2**33, term, positions, prev, channel)
        monkeypatch.setattr(codec, "_UNIFORM_MIN", 10**9)
        slow = encode_entries(bodies, 2**33, term, positions, prev, channel)
        monkeypatch.undo()
        assert fast == slow
        assert [e.body for e in codec.iter_entries(fast[0])] == bodies


def test_encoding_refuses_mismatched_positions():
    with pytest.raises(ValueError):
        encode_entries([b"a"] * 10, 0, 1, [0] * 9, 0)


def _vectorised(monkeypatch):
    """Every follower batch through the vectorised check, however short."""
    monkeypatch.setattr(store_module, "_VECTOR_MIN", 0)


def _no_fallback(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a good batch fell back to the slow check")

    _vectorised(monkeypatch)
    monkeypatch.setattr(LogStore, "_verify_slow", refuse)


@pytest.mark.parametrize(
    "make_bodies",
    [
        lambda k: [bytes([k % 251]) * 100] * 20,  # uniform
        lambda k: [bytes([k % 251]) * ((k * 37 + j * 11) % 700) for j in range(k % 9 + 1)],  # mixed
        lambda k: [b""] * (k % 5 + 1),  # empty bodies
    ],
    ids=["uniform", "mixed", "empty"],
)
def test_fast_path_takes_good_batches(monkeypatch, make_store, make_bodies):
    leader, follower = make_store(), make_store()
    for k in range(40):  # 4 KiB segments: plenty of rolls, some inside a batch
        leader.append_as_leader(make_bodies(k), k // 10)
    _no_fallback(monkeypatch)
    i = 0
    while i <= leader.ledger_end_index:
        batch = leader.read_batch(i, max_bytes=3000 + i * 17 % 2000)
        follower.append_as_follower(batch)
        i += batch.count
    assert follower.read_batch(0).data == leader.read_batch(0).data
    assert follower.ledger_end_term == leader.ledger_end_term
    assert follower._chain == leader._chain
    assert follower.write_pos == leader.write_pos


def test_fast_path_after_reset_skips_only_the_first_chain(monkeypatch):
    leader = MemoryStore(small_config())
    leader.append_as_leader([b"a" * 50] * 30, 1)
    follower = MemoryStore(small_config())
    follower.reset(10, leader.get_pos(10))
    assert follower._chain is None
    good = leader.read_batch(10, max_count=10)
    d = bytearray(good.data)
    d[98 + 36] ^= 1  # entry 11's chain CRC: still checked
    before = snapshot(follower)
    with pytest.raises(LedgerError) as err:
        follower.append_as_follower(EntryBatch(10, 10, bytes(d)))
    assert "chain CRC" in err.value.message
    assert snapshot(follower) == before
    _no_fallback(monkeypatch)
    follower.append_as_follower(good)
    assert follower._chain == leader.read_batch(19, max_count=1).headers()[0][6]


def _outcome(store, batch):
    before = snapshot(store)
    try:
        store.append_as_follower(batch)
    except LedgerError as e:
        assert snapshot(store) == before
        return (e.code, e.message)
    return ("ok", store.read_batch(store.ledger_begin_index).data, store._chain)


@pytest.mark.parametrize("leader_crc", [False, True], ids=["no-crc", "leader-crc"])
@pytest.mark.parametrize("sizes", ["uniform", "mixed"])
def test_damaged_batches_get_the_reference_answer(monkeypatch, sizes, leader_crc):
    """Flip bytes (headers and bodies) and rewrite whole fields; the store with the
    fast path must answer exactly as the store that only has the reference check --
    also when the batch carries the CRC the leader took of its intact bytes (which the
    fast path then trusts for the bodies only if the bytes still match it)."""
    r = random.Random(sizes)
    leader = MemoryStore(small_config())
    mk = (
        (lambda: [r.randbytes(60) for _ in range(12)])
        if sizes == "uniform"
        else (lambda: [r.randbytes(r.randrange(0, 300)) for _ in range(12)])
    )
    leader.append_as_leader(mk(), 1)
    leader.append_as_leader(mk(), 2)
    leader.append_as_leader(mk(), 2)
    leader.append_as_leader(mk(), 3)

    _vectorised(monkeypatch)

    def pair():
        a, b = MemoryStore(small_config()), MemoryStore(small_config())
        for s in (a, b):
            s.append_as_follower(leader.read_batch(0, max_count=12))
        monkeypatch.setattr(b, "_verify_fast", lambda *_a: None)
        return a, b

    good = leader.read_batch(12)
    heads = good.headers()
    offs = np.cumsum([0] + [h[1] for h in heads]).tolist()
    cases = []
    for _ in range(250):
        d = bytearray(good.data)
        k = r.randrange(len(heads))
        if r.random() < 0.6:  # a header byte of entry k
            d[offs[k] + r.randrange(HEADER_SIZE)] ^= 1 << r.randrange(8)
        else:  # any byte
            d[r.randrange(len(d))] ^= 1 << r.randrange(8)
        cases.append(EntryBatch(good.first_index, good.count, bytes(d)))
    cases += [
        EntryBatch(good.first_index, good.count - 1, good.data),
        EntryBatch(good.first_index, good.count, good.data[: offs[-2]]),
        EntryBatch(good.first_index, good.count, good.data + good.data[:HEADER_SIZE]),
        EntryBatch(good.first_index, good.count, good.data[:-1]),
        EntryBatch(good.first_index, 1, good.data[: offs[1]]),
        good,
    ]
    if leader_crc:
        crc = codec.crc32(good.data)
        cases = [EntryBatch(c.first_index, c.count, c.data, crc) for c in cases]
    for batch in cases:
        a, b = pair()
        assert _outcome(a, batch) == _outcome(b, batch)


def test_a_leader_batch_with_its_crc_is_taken_without_a_crc_per_body(monkeypatch):
    """The batch a leader appended carries the CRC of its bytes: intact, the follower
    takes every body's CRC from its header (one CRC call for the batch) and stores the
    same bytes and chain as when it computes each."""
    leader = MemoryStore(small_config())
    f1, f2 = MemoryStore(small_config()), MemoryStore(small_config())
    _vectorised(monkeypatch)
    calls = []
    crc = store_module.crc32
    for k in range(6):
        appended = leader.append_as_leader([bytes([k]) * 40] * 50, 1)
        batch = appended.batch()
        assert batch.crc == codec.crc32(batch.data)
        f2.append_as_follower(EntryBatch(batch.first_index, batch.count, batch.data))
        calls.clear()
        monkeypatch.setattr(store_module, "crc32", lambda *a: calls.append(1) or crc(*a))
        f1.append_as_follower(batch)
        monkeypatch.setattr(store_module, "crc32", crc)
        assert len(calls) == 1
    assert f1.read_batch(0).data == f2.read_batch(0).data == leader.read_batch(0).data
    assert f1._chain == f2._chain == leader._chain


def test_joined_rounds_keep_a_crc_of_their_joined_bytes():
    leader = MemoryStore(small_config())
    a = leader.append_as_leader([b"a" * 30] * 3, 1).batch()
    b = leader.append_as_leader([b"b" * 30] * 4, 1).batch()
    ann = [
        Announcement(1, x.first_index, x.count, Inline(x), len(x.data), (0, 0), -1) for x in (a, b)
    ]
    joined = ann[0].followed_by(ann[1]).payload.batch
    assert joined.crc == codec.crc32(a.data + b.data) and joined.count == 7


def test_short_follower_batches_are_checked_entry_by_entry(monkeypatch):
    leader, follower = MemoryStore(small_config()), MemoryStore(small_config())
    leader.append_as_leader([b"x" * 20] * 100, 1)
    seen = []
    fast, slow = LogStore._verify_fast, LogStore._verify_slow
    monkeypatch.setattr(LogStore, "_verify_fast", lambda *a: seen.append("fast") or fast(*a))
    monkeypatch.setattr(LogStore, "_verify_slow", lambda *a: seen.append("slow") or slow(*a))
    follower.append_as_follower(leader.read_batch(0, max_count=store_module._VECTOR_MIN - 1))
    assert seen == ["slow"]
    follower.append_as_follower(leader.read_batch(follower.ledger_end_index + 1, max_count=40))
    assert seen == ["slow", "fast"]
