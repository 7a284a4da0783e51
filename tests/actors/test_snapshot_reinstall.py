"""On Ray: a member whose log was reset after a snapshot install, and whose snapshots are
all found damaged at its next start, has a machine below its log's begin.  Its log matches
the leader's, so no reset will come; its push answers ask for a snapshot, the leader sends
its newest, and the member serves every key again."""

from __future__ import annotations

import dataclasses
import os

import pytest
import ray
from groupcheck import TEST_CONFIG, wait_until
from rayledger.integration.kv import set_command
from rayledger.replication import ReplicationConfig
from rayledger.storage import LedgerError, StoreConfig
from rayledger.storage.snapshots import SnapshotStore

KV = "rayledger.integration.kv:KvMachine"


def _keys(g, member: str) -> dict | None:
    """Every key as ``member``'s own machine has it (None while it restarts)."""
    try:
        return ray.get(g.handle(member).query.remote({"keys": True}, "committed"), timeout=30)
    except (LedgerError, ray.exceptions.RayError):
        return None


def _damage(snaps: SnapshotStore) -> int:
    """Flip a byte in every snapshot; returns how many."""
    have = snaps.list()
    for meta in have:
        name, size, _ = next(f for f in meta.files if f[1] > 0)
        with open(os.path.join(meta.path, name), "r+b") as f:
            f.seek(size // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
        assert snaps.verify(meta) is not None
    return len(have)


@pytest.mark.ray
def test_a_machine_that_lost_its_installed_snapshot_gets_another(make_group):
    config = dataclasses.replace(
        TEST_CONFIG,
        state_machine=KV,
        snapshot_every_entries=300,
        snapshot_keep=1,  # the log may go up to the newest snapshot
        store=StoreConfig(data_segment_size=64 * 1024),
        replication=ReplicationConfig(install_chunk_bytes=4096),
        dispatcher_cache_bytes=16 * 1024,  # else the leader pushes the away member's gap from it
    )
    g = make_group(members=3, config=config)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30)
    c.append_batch([set_command(f"before-{j}", j) for j in range(50)])
    away = next(m for m in g.members if m != leader)
    here = [m for m in g.members if m != away]
    g.partition([away], here)
    try:
        for k in range(20):
            c.append_batch([set_command(f"k{k}-{j}", "x" * 40) for j in range(100)])

        def compacted():  # past the away member's end: it can come back only by a reset
            away_end = g.status()[away].ledger_end_index
            begins = {m: g.compact(m)[m] for m in here}
            return begins if min(begins.values()) > max(100, away_end + 1) else None

        wait_until(compacted, 60, "the two members compact their logs past 100")
        # a new leader: the old one's dispatcher may still hold the gap it read from its
        # files before they were compacted, and would push that instead of a snapshot
        leader = next(m for m in here if m != leader)
        g.transfer_leadership(leader)
    finally:
        g.heal()
    leader = g.wait_for_leader()

    # the new leader's machine has every key once its term's first entry commits
    def every_key():
        keys = _keys(g, leader)
        return keys if keys is not None and len(keys) == 2050 else None

    want = wait_until(every_key, 30, "every key on the leader")

    def reset():  # the machine may load the snapshot before the log's reset arrives
        begin = g.status()[away].ledger_begin_index
        return begin if begin > 50 and _keys(g, away) == want else None

    # its log was reset: what its machine needs below it is gone
    begin = wait_until(reset, 90, f"{away} gets the snapshot, every key and a reset log")

    snaps = SnapshotStore(f"{ray.get(g.handle(away).store_dir.remote())}/snapshots", owner=False)
    assert _damage(snaps) >= 1
    g.kill(away)  # Ray restarts it: no snapshot verifies, its machine starts empty
    c.append(set_command("after", 1))
    want = _keys(g, leader)
    wait_until(
        lambda: _keys(g, away) == want,
        90,
        lambda: f"{away} serves every key again (status {g.status().get(away)})",
    )
    assert g.status()[away].ledger_begin_index == begin  # its log was left as it was
