"""Entries of idempotent clients: the session prefix is stored, replicated and
followed, and every reader strips it -- a caller sees exactly the bytes it appended."""

from __future__ import annotations

import numpy as np
from rayledger.storage import EntryBatch, MemoryStore
from rayledger.storage.codec import SESSION, SESSION_FLAG, SESSION_SIZE
from rayledger.storage.reader import (
    StoreReader,
    batch_to_table,  # noqa: F811
)

from .helpers import small_config

CONFIG = 0x43_46_47


class Follow:
    """A session watcher that records what the store tells it."""

    def __init__(self):
        self.seen: list[tuple[int, int, int, int]] = []  # (index, client, seq, stamp)
        self.cuts: list[tuple[str, int]] = []

    def appended(self, indexes, records):  # numpy records, or tuples for a few entries
        rows = [(r["client"], r["seq"], r["stamp"]) if not isinstance(r, tuple) else r[:3]
                for r in records]  # fmt: skip
        self.seen += [(int(i), *map(int, r)) for i, r in zip(indexes, rows, strict=True)]

    def truncated(self, end_index):
        self.cuts.append(("truncated", end_index))

    def reset(self, begin_index):
        self.cuts.append(("reset", begin_index))

    def committed(self, index):
        self.cuts.append(("committed", index))


def _mixed(store, term: int = 1):
    """Plain, idempotent (client 7, seqs 0..2) and configuration entries in one batch."""
    own = [b"plain-0", b"a" * 300, b"", b"bb", b"plain-1", b"{}"]
    ch = [0, SESSION_FLAG, SESSION_FLAG, SESSION_FLAG, 0, CONFIG]
    stored = [
        b if not c & SESSION_FLAG else SESSION.pack(7, seq, 1_000 + seq, 0) + b
        for seq, (b, c) in enumerate(zip(own, ch, strict=True))
    ]
    stored[1:4] = [SESSION.pack(7, k, 1_000, 0) + own[1 + k] for k in range(3)]
    return store.append_as_leader(stored, term, ch), own, [0, 0, 0, 0, 0, CONFIG]


def test_readers_strip_the_prefix_and_the_flag(store, tmp_path):
    w = Follow()
    store.watch_sessions(w)
    appended, own, channels = _mixed(store)
    assert w.seen == [(1, 7, 0, 1_000), (2, 7, 1, 1_000), (3, 7, 2, 1_000)]
    got = store.get_range(0, 6)
    assert [e.body for e in got] == own and [e.channel for e in got] == channels
    assert [store.get(i).body for i in range(6)] == own
    assert store.get(1).pos == appended.positions[1]  # where the whole entry starts
    table = batch_to_table(appended.data, 0, 6, verify_crc=True)
    assert table.column("body").to_pylist() == own
    clients = batch_to_table(appended.data, 0, 6, channel=0)
    assert clients.column("index").to_pylist() == [0, 1, 2, 3, 4]
    if getattr(store, "dir", None) is not None:
        store.update_committed_index(5)
        store.flush()
        with StoreReader(store.dir, verify_crc=True) as r:
            assert r.read_table(0, 6).column("body").to_pylist() == own
            assert [e.channel for e in r.read_entries(0, 6)] == channels
            assert r.read_table(0, 6, channel=0).num_rows == 5


def test_a_follower_is_told_and_a_cut_forgets(store):
    leader = MemoryStore(small_config())
    appended, own, _ = _mixed(leader)
    w = Follow()
    store.watch_sessions(w)
    store.append_as_follower(EntryBatch(0, 3, appended.data[: appended.positions[3]]))
    store.append_as_follower(EntryBatch(3, 3, appended.data[appended.positions[3] :]))
    assert [s[:3] for s in w.seen] == [(1, 7, 0), (2, 7, 1), (3, 7, 2)]
    assert [e.body for e in store.get_range(0, 6)] == own
    store.truncate(2)
    assert w.cuts == [("truncated", 2)]
    found = [(int(i), int(r["seq"])) for ix, rs in store.session_records(0)
             for i, r in zip(ix, rs, strict=True)]  # fmt: skip
    assert found == [(1, 0), (2, 1)]


def test_an_append_hook_sees_only_the_clients_bytes(store):
    seen = []
    store.add_append_hook(lambda i, pos, body: seen.append((i, bytes(body))))
    _, own, _ = _mixed(store)
    assert seen == [(k, own[k]) for k in range(5)]  # not the configuration entry


def test_session_records_match_the_prefixes():
    s = MemoryStore(small_config())
    stored = [SESSION.pack(c, q, 5, 0) + b"x" * q for c in (1, 2) for q in range(20)]
    s.append_as_leader(stored, 1, SESSION_FLAG)
    ix, recs = (
        np.concatenate([a for a, _ in s.session_records()]),
        np.concatenate([b for _, b in s.session_records()]),
    )
    assert ix.tolist() == list(range(40))
    assert recs["client"].tolist() == [1] * 20 + [2] * 20
    assert recs["seq"].tolist() == list(range(20)) * 2
    assert SESSION_SIZE == 28


def test_bodies_with_their_session_prefix_either_way():
    from rayledger.storage.codec import with_session

    for bodies in ([b"x" * 40] * 9, [b"a", b"bb", b""] * 3, [b"q" * 7] * 3, [b""] * 12):
        got = [bytes(b) for b in with_session(bodies, 5, 100, 77)]
        want = [SESSION.pack(5, 100 + k, 77, __import__("zlib").crc32(b)) + b
                for k, b in enumerate(bodies)]  # fmt: skip
        assert got == want
