"""A topic's routing without Ray: the key hash is the one written down (CRC-32 of the key's
bytes, str as UTF-8, modulo the partitions), stable across processes, unkeyed appends and
batches go round robin (a batch whole), batches split by key keep every entry once, and bad keys, counts and
partitions get UNEXPECTED_ARGUMENT."""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rayledger.integration.topic import TopicLayout, partition_of
from rayledger.integration.topic.routing import Router
from rayledger.storage import LedgerError, ResponseCode


def test_the_hash_is_crc32_of_the_keys_bytes() -> None:
    assert partition_of(b"order-17", 7) == zlib.crc32(b"order-17") % 7
    assert partition_of("zürich", 5) == zlib.crc32("zürich".encode()) % 5
    assert partition_of("k", 1) == 0


def test_the_hash_is_the_same_in_another_process() -> None:
    """Python's own str hash is salted per process; the routing must not be."""
    code = "from rayledger.integration.topic import partition_of; print(partition_of('abc', 13))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == partition_of("abc", 13)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=8)), max_size=60),
       st.integers(1, 9))  # fmt: skip
def test_a_split_keeps_every_entry_once_and_keys_together(keys, n) -> None:
    parts = Router(n).split(len(keys), keys)
    assert sorted(k for part in parts for k in part) == list(range(len(keys)))
    for p, at in enumerate(parts):
        assert at == sorted(at)  # each part keeps the batch's order
        for k in at:
            if keys[k] is not None:
                assert partition_of(keys[k], n) == p


def test_unkeyed_appends_go_round_robin() -> None:
    r = Router(3)
    first = r.one(None)
    assert [r.one(None) for _ in range(5)] == [(first + k) % 3 for k in range(1, 6)]
    one, two = r.split(5), r.split(5)  # an unkeyed batch stays whole, the next one goes on
    assert sorted(map(len, one)) == [0, 0, 5] and sorted(map(len, two)) == [0, 0, 5]
    assert [p for p, at in enumerate(two) if at] == [(first + 7) % 3]
    mixed = r.split(4, [None, None, None, None])  # unkeyed entries of a keyed batch: spread
    assert sorted(len(p) for p in mixed) == [1, 1, 2]
    one = Router(4).split(3, b"same")
    assert one[partition_of(b"same", 4)] == [0, 1, 2]


@pytest.mark.parametrize("key", [17, 1.5, ["k"], object()])
def test_a_key_that_is_not_str_or_bytes_is_refused(key) -> None:
    with pytest.raises(LedgerError) as e:
        Router(3).one(key)
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "3"])
def test_a_bad_partition_count_is_refused(n) -> None:
    with pytest.raises(LedgerError) as e:
        partition_of(b"k", n)
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_keys_of_another_length_than_the_batch_are_refused() -> None:
    with pytest.raises(LedgerError) as e:
        Router(2).split(3, [b"a", b"b"])
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


@pytest.mark.parametrize("p", [-1, 4, True, "0"])
def test_a_partition_out_of_range_is_refused(p) -> None:
    layout = TopicLayout("t", 4, ["n0"], None)
    assert layout.groups == ["t-p0", "t-p1", "t-p2", "t-p3"]
    with pytest.raises(LedgerError) as e:
        layout.group(p)
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_a_layout_reads_back_as_written() -> None:
    layout = TopicLayout("t", 2, ["a", "b", "c"], "/data", 123)
    assert TopicLayout.from_json(layout.to_json()) == layout
