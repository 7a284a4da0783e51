"""Snapshots on a real KV group: a member holding 100,000 keys killed and restarted (from
its newest snapshot that verifies -- the newest is damaged -- and the log after it), and a
member whose data directory was wiped, which gets the leader's snapshot and serves reads."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time

import pytest
import ray
from groupcheck import TEST_CONFIG, wait_until
from rayledger.integration.kv import KVClient, put_command
from rayledger.storage import LedgerError, StoreConfig
from rayledger.storage.snapshots import SnapshotStore

KEYS = 100_000
BATCH = 2_000


def _snapshots(g, member: str) -> SnapshotStore:
    return SnapshotStore(f"{ray.get(g.handle(member).store_dir.remote())}/snapshots", owner=False)


def _on(g, member: str, request):
    """``request`` answered by ``member`` itself (a linearizable read through its own read
    path: the client would fall back to the leader), or None while it restarts."""
    try:
        return ray.get(g.handle(member).query.remote(request, "linearizable"), timeout=30)
    except (LedgerError, ray.exceptions.RayError):
        return None


def _count_on(g, member: str) -> int | None:
    keys = _on(g, member, {"keys": True})
    return None if keys is None else len(keys)


@pytest.mark.ray
def test_kv_members_come_back_from_snapshots(ray_session, group_name, tmp_path) -> None:
    config = dataclasses.replace(
        TEST_CONFIG,
        snapshot_every_entries=20_000,
        snapshot_keep=2,
        rpc_timeout_ms=10_000,
        store=StoreConfig(data_segment_size=1 << 20),  # segments the compaction can drop
    )
    kv = KVClient.create(group_name, members=3, store_dir=str(tmp_path), config=config)
    g = kv.group
    try:
        leader = g.wait_for_leader()
        c = kv.client
        for first in range(0, KEYS, BATCH):
            c.append_batch(
                [put_command(f"k/{i:06d}", b"v%d" % i) for i in range(first, first + BATCH)]
            )
        total = KEYS + 1
        last = kv.put("last", b"!")
        f1, f2 = [m for m in g.members if m != leader]
        wait_until(lambda: len(_snapshots(g, f1).list()) == 2, 60, f"{f1} keeps two snapshots")

        # 1. the newest snapshot of f1 is damaged, then f1 is killed: it comes back from the
        # older one and the log after it (the log keeps what follows the oldest kept)
        snaps = _snapshots(g, f1)
        newest = snaps.list()[-1]
        name = newest.files[0][0]
        with open(os.path.join(newest.path, name), "r+b") as f:
            f.seek(newest.files[0][1] // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
        assert snaps.verify(newest) is not None
        g.kill(f1)
        wait_until(lambda: _count_on(g, f1) == total, 120, f"{f1} serves {total} keys again")
        assert _on(g, f1, {"get": "k/000123"}) == [b"v123", 124]
        assert _on(g, f1, {"get": "last"}) == [b"!", last]

        # 2. the group compacts; f2 loses its whole data directory and restarts empty: it is
        # below the leader's begin and gets the leader's snapshot, then the log after it
        begins = g.compact()
        assert begins[leader] > 20_000, begins
        pid = g.pause(f2)
        d = ray.get(g.handle(leader).store_dir.remote()).replace(f"/{leader}", f"/{f2}")
        assert os.path.isdir(d)
        shutil.rmtree(d)
        os.kill(pid, signal.SIGKILL)  # Ray restarts it on an empty directory
        more = kv.put("after-wipe", b"x")
        wait_until(lambda: _count_on(g, f2) == total + 1, 120, f"wiped {f2} serves every key")
        assert _on(g, f2, {"get": "k/099999"}) == [b"v99999", 100_000]
        st = g.status()[f2]
        assert st.ledger_begin_index > 20_000 and st.committed_index >= more > last
        installed = _snapshots(g, f2).list()
        assert installed and installed[-1].index >= st.ledger_begin_index - 1
        # and it keeps following
        t0 = time.monotonic()
        kv.put("later", b"y")
        wait_until(lambda: (_on(g, f2, {"get": "later"}) or [None])[0] == b"y", 30,
                   f"{f2} follows")  # fmt: skip
        assert time.monotonic() - t0 < 30
    finally:
        kv.close()
        g.shutdown(delete_data=True)
