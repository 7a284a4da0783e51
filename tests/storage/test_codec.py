"""Codec round-trips (property tests) and errors crossing a pickle boundary."""

from __future__ import annotations

import pickle

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rayledger.storage import (
    Entry,
    EntryBatch,
    InvalidRequestError,
    LedgerError,
    MemoryStore,
    ResponseCode,
    StorageError,
)
from rayledger.storage.codec import (
    HEADER_SIZE,
    INDEX_UNIT,
    blank_record,
    blank_size,
    check_entry,
    decode_entry,
    decode_index,
    encode_entries,
    encode_index,
    iter_entries,
)

from .helpers import small_config

bodies_st = st.lists(st.binary(max_size=300), min_size=1, max_size=20)
i64 = st.integers(min_value=0, max_value=2**62)


@settings(max_examples=60, deadline=None)
@given(bodies=bodies_st, first=i64, term=i64, base=i64, prev=st.integers(-(2**31), 2**31 - 1))
def test_entries_round_trip(bodies, first, term, base, prev):
    positions, pos = [], base
    for b in bodies:
        positions.append(pos)
        pos += HEADER_SIZE + len(b)
    data, last_chain = encode_entries(bodies, first, term, positions, prev, channel=7)
    assert len(data) == sum(HEADER_SIZE + len(b) for b in bodies)
    got = list(iter_entries(data))
    assert got == [Entry(first + k, term, positions[k], bodies[k], 7) for k in range(len(bodies))]
    # every entry passes the CRC and chain checks; the chain ends at last_chain
    chain, off = prev, 0
    for _ in got:
        h = check_entry(data, off, chain)
        assert h is not None
        chain = h[6]
        off += h[1]
    assert chain == last_chain
    # a batch is the same bytes seen as entries
    batch = EntryBatch(first, len(bodies), data)
    assert batch.entries() == got and batch.last_index == first + len(bodies) - 1
    assert [h[2] for h in batch.headers()] == [e.index for e in got]
    assert pickle.loads(pickle.dumps(batch)) == batch


@settings(max_examples=60, deadline=None)
@given(
    units=st.lists(
        st.tuples(i64, st.integers(HEADER_SIZE, 2**31 - 1), i64), min_size=1, max_size=50
    ),
    first=i64,
)
def test_index_units_round_trip(units, first):
    pos, size, term = (list(c) for c in zip(*units, strict=True))
    raw = encode_index(pos, size, first, term)
    assert len(raw) == INDEX_UNIT * len(units)
    arr = decode_index(raw)
    assert arr["pos"].tolist() == pos and arr["size"].tolist() == size
    assert arr["term"].tolist() == term
    assert arr["index"].tolist() == list(range(first, first + len(units)))


@settings(max_examples=40, deadline=None)
@given(body=st.binary(min_size=1, max_size=200), flip=st.data())
def test_any_flipped_body_or_crc_byte_is_caught(body, flip):
    data, _ = encode_entries([body], 0, 1, [0], 0)
    # bytes covered by a check: magic, size, index, pos, chain crc, body crc, body size, body
    covered = [*range(0, 8), *range(8, 16), *range(24, 32), *range(36, 48), *range(48, len(data))]
    k = flip.draw(st.sampled_from(covered))
    bad = bytearray(data)
    bad[k] ^= 0x01
    h = check_entry(bytes(bad), 0, 0)
    assert h is None or h[2] != 0 or h[4] != 0


@settings(max_examples=30, deadline=None)
@given(length=st.integers(0, 5000))
def test_blank_record(length):
    rec = blank_record(length)
    assert len(rec) == length
    if length >= 8:
        assert blank_size(rec, 0) == length


def test_decode_rejects_garbage():
    with pytest.raises(LedgerError) as ei:
        decode_entry(bytes(HEADER_SIZE))
    assert ei.value.code == ResponseCode.CORRUPT_LOG


def test_batch_from_store_round_trips_through_pickle():
    s = MemoryStore(small_config())
    s.append_as_leader([b"a" * n for n in range(0, 900, 50)], 3)
    batch = s.read_batch(0)
    again = pickle.loads(pickle.dumps(batch))
    assert again == batch and again.entries() == s.get_range(0, 100)


@pytest.mark.parametrize("code", list(ResponseCode))
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_ledger_error_pickles_with_class_and_code(code, dumps):
    err = LedgerError.of(code, f"boom {code.name}", leader_id="n1")
    back = pickle.loads(dumps(err))
    assert type(back) is type(err)
    assert back.code is code and back.message == err.message and back.leader_id == "n1"
    assert str(back) == str(err)
    try:
        raise back
    except LedgerError as caught:  # still catchable as the base class
        assert caught.code == code


def test_error_classes():
    assert isinstance(LedgerError.of(ResponseCode.DISK_FULL), StorageError)
    assert isinstance(LedgerError.of(ResponseCode.ENTRY_TOO_LARGE), InvalidRequestError)
    assert type(LedgerError.of(ResponseCode.SUCCESS)) is LedgerError
    assert np.dtype(">i8").itemsize == 8
