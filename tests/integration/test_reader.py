"""storage/reader.py: the read-only reader of a member's store directory (no Ray)."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from pathlib import Path

import pytest
from rayledger.storage import FileStore, LedgerError, ResponseCode, StoreConfig
from rayledger.storage.reader import StoreReader, batch_to_table


def _fingerprint(root: Path) -> dict[str, tuple[int, float, str]]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p)] = (st.st_size, st.st_mtime, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture
def small_store(tmp_path):
    """A FileStore with tiny segments (many rolls), bodies of random sizes over three terms."""
    cfg = StoreConfig(
        data_dir=str(tmp_path / "n0"), data_segment_size=4096, index_segment_size=32 * 50
    )
    store = FileStore(cfg)
    rnd = random.Random(7)
    bodies = []
    for term in (1, 2, 5):
        for _ in range(25):
            batch = [rnd.randbytes(rnd.randint(0, 300)) for _ in range(rnd.randint(1, 8))]
            store.append_as_leader(batch, term)
            bodies += batch
    store.update_committed_index(store.ledger_end_index)
    yield store, bodies
    store.close()


def test_reads_match_the_store_for_every_range(small_store):
    store, bodies = small_store
    n = len(bodies)
    with StoreReader(store.dir, verify_crc=True) as r:
        assert r.begin_index() == 0 and r.end_index() == n - 1
        assert r.read_table(0, n).column("body").to_pylist() == bodies
        for a in range(0, n, 5):
            for b in {a, a + 1, a + 37, n}:
                b = min(b, n)
                got = [(e.index, e.term, e.pos, e.body) for e in r.read_entries(a, b)]
                want = [(e.index, e.term, e.pos, e.body) for e in store.get_range(a, b)]
                assert got == want, (a, b)


def test_batches_are_the_stores_pushes_byte_for_byte(small_store):
    """A leader's dispatcher reads committed batches from the files: exactly what
    the member's store would push, across segment ends, within both bounds."""
    store, bodies = small_store
    n = len(bodies)
    with StoreReader(store.dir) as r:
        for start in range(0, n, 3):
            for max_bytes, max_count in ((1, 5), (700, 100), (5000, 7), (1 << 30, n - start)):
                got = r.read_batch(start, max_bytes, min(max_count, n - start))
                want = store.read_batch(start, max_bytes, min(max_count, n - start))
                assert (got.first_index, got.count, got.data) == (
                    want.first_index, want.count, want.data
                ), (start, max_bytes, max_count)  # fmt: skip
        with pytest.raises(LedgerError) as e:
            r.read_batch(n, 1000, 5)  # nothing on disk there
        assert e.value.code in (ResponseCode.INDEX_OUT_OF_BOUNDS, ResponseCode.CORRUPT_LOG)


def test_a_long_lived_reader_lets_go_of_deleted_segments(small_store):
    """A leader's dispatcher keeps its reader for the term: segments the leader compacts
    away are closed at the next refresh (their disk space is never pinned), and the
    reader's begin moves with them."""
    store, _ = small_store
    with StoreReader(store.dir) as r:
        r.read_batch(0, 1 << 20, 50)
        first = r._data.starts[0]
        assert first in r._data._fds
        os.remove(store.dir / "data" / f"{first:020d}")
        r.refresh()
        assert first not in r._data._fds and first not in r._data.starts
        assert r.begin_index() > 0


def test_small_tables_cover_the_range_once(small_store):
    store, bodies = small_store
    with StoreReader(store.dir) as r:
        tables = list(r.iter_tables(3, len(bodies), max_bytes=700))
    assert len(tables) > 5
    idx = [i for t in tables for i in t.column("index").to_pylist()]
    assert idx == list(range(3, len(bodies)))


def test_reader_never_modifies_the_directory(small_store):
    store, bodies = small_store
    store.flush()
    before = _fingerprint(store.dir)
    with StoreReader(store.dir, verify_crc=True) as r:
        r.read_table(0, len(bodies))
        r.checkpoint()
        r.committed_index_on_disk()
    assert _fingerprint(store.dir) == before


def test_reads_committed_prefix_while_the_writer_appends(tmp_path):
    cfg = StoreConfig(
        data_dir=str(tmp_path / "n0"), data_segment_size=64 * 1024, index_segment_size=32 * 1000
    )
    store = FileStore(cfg)
    store.append_as_leader([b"first"], 1)
    store.update_committed_index(0)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 100_000:
            store.append_as_leader([b"w%06d" % (i + k) for k in range(50)], 1)
            store.update_committed_index(store.ledger_end_index)
            i += 50
            time.sleep(0.001)

    t = threading.Thread(target=writer)
    t.start()
    try:
        reads = 0
        with StoreReader(store.dir, verify_crc=True) as r:
            while reads < 30:
                c = store.committed_index
                t_ = r.read_table(0, c + 1)
                assert t_.column("index").to_pylist() == list(range(c + 1))
                assert t_.column("body")[0].as_py() == b"first"
                reads += 1
    finally:
        stop.set()
        t.join()
        store.close()


def test_corruption_is_reported_not_returned(small_store):
    store, bodies = small_store
    store.flush()
    seg = sorted((store.dir / "data").iterdir())[0]
    data = bytearray(seg.read_bytes())
    data[60] ^= 0xFF  # inside the first entry's body
    seg.write_bytes(bytes(data))
    with StoreReader(store.dir, verify_crc=True) as r, pytest.raises(LedgerError) as ei:
        r.read_table(0, 3)
    assert ei.value.code == ResponseCode.CORRUPT_LOG
    with StoreReader(store.dir) as r, pytest.raises(LedgerError) as ei:
        r.read_table(0, len(bodies) + 5)  # past the end of the index
    assert ei.value.code in (ResponseCode.INDEX_OUT_OF_BOUNDS, ResponseCode.CORRUPT_LOG)


def test_not_a_store_dir(tmp_path):
    with pytest.raises(LedgerError) as ei:
        StoreReader(tmp_path)
    assert ei.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_batch_to_table_matches_entries(small_store):
    store, bodies = small_store
    batch = store.read_batch(4, max_count=40)
    t = batch_to_table(batch.data, batch.first_index, batch.count, verify_crc=True)
    assert t.column("index").to_pylist() == list(range(4, 44))
    assert t.column("body").to_pylist() == bodies[4:44]
    assert t.column("pos").to_pylist() == [e.pos for e in batch.entries()]


def test_checkpoint_bound(small_store):
    store, bodies = small_store
    store.close()  # writes the final checkpoint
    with StoreReader(store.dir) as r:
        assert r.committed_index_on_disk() == len(bodies) - 1
    assert os.path.exists(store.dir / "checkpoint")


def test_configuration_entries_are_left_out_on_request(tmp_path):
    """``channel=0`` keeps the client entries (a term's empty first entry among them) and
    leaves the configuration entries out, indexes as the log's; with no channel every entry
    comes back, with its channel."""
    from rayledger.election.configuration import CONFIG_CHANNEL, Configuration

    cfg = StoreConfig(data_dir=str(tmp_path / "n0"), data_segment_size=4096)
    store = FileStore(cfg)
    try:
        cfg_at = []
        for term in (1, 2, 3):
            store.append_as_leader([b""], term)  # the term's first entry
            store.append_as_leader([b"t%d-%d" % (term, k) * 20 for k in range(9)], term)
            doc = Configuration.of(["n0", "n1"], [f"l{term}"]).encode()
            cfg_at.append(store.append_as_leader([doc], term, channel=CONFIG_CHANNEL).first_index)
        store.append_as_leader([b"last"], 3)
        store.update_committed_index(store.ledger_end_index)
        n = store.ledger_end_index + 1
        everything = store.get_range(0, n)
        clients = [e for e in everything if e.index not in cfg_at]
        assert [e.channel for e in everything if e.index in cfg_at] == [CONFIG_CHANNEL] * 3
        with StoreReader(store.dir, verify_crc=True) as r:
            assert r.read_entries(0, n) == everything  # channels included
            assert r.read_entries(0, n, channel=0) == clients
            assert r.read_table(0, n).num_rows == n
            t = r.read_table(0, n, channel=0)
            assert t.column("index").to_pylist() == [e.index for e in clients]
            assert t.column("body").to_pylist() == [e.body for e in clients]
            assert b"" in t.column("body").to_pylist()  # the terms' empty entries stay
            small = list(r.iter_tables(0, n, max_bytes=1, channel=0))  # one entry each
            assert [tb.num_rows for tb in small].count(0) == 3  # the configurations
            assert [i for tb in small for i in tb.column("index").to_pylist()] == [
                e.index for e in clients
            ]
            assert r.read_table(cfg_at[0], cfg_at[0] + 1, channel=0).num_rows == 0
        batch = store.read_batch(0)
        full = batch_to_table(batch.data, 0, batch.count, verify_crc=True)
        only = batch_to_table(batch.data, 0, batch.count, verify_crc=True, channel=0)
        assert full.num_rows == n and only.equals(t)
    finally:
        store.close()


def test_a_segment_made_again_under_its_name_is_read_anew(tmp_path):
    """A member that led, was reset by a later leader and leads again keeps its dispatchers'
    readers: a segment file deleted and made again under the same name (the reset log
    starts at the same position) is opened again, never read through the old file."""
    cfg = StoreConfig(data_dir=str(tmp_path / "n0"), data_segment_size=4096)
    store = FileStore(cfg)
    try:
        store.append_as_leader([b"old-%d" % i for i in range(20)], 1)
        with StoreReader(store.dir) as r:
            assert r.read_batch(0, 1 << 20, 20).entries()[0].body == b"old-0"
            store.reset(0, 0)  # nothing committed: the whole log goes
            store.append_as_leader([b"new-%d" % i for i in range(20)], 3)
            store.flush()
            r.refresh()
            got = r.read_batch(0, 1 << 20, 20).entries()
            assert [(e.term, e.body) for e in got[:2]] == [(3, b"new-0"), (3, b"new-1")]
    finally:
        store.close()
