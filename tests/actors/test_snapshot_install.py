"""Snapshot install on Ray: a member that was away while the group compacted its logs comes back
below the leader's begin, gets the leader's snapshot through the object store in chunks,
loads it into its machine and serves reads; the keys it missed are all there."""

from __future__ import annotations

import dataclasses
import time

import pytest
import ray
from groupcheck import TEST_CONFIG, wait_until
from rayledger.integration.kv import set_command
from rayledger.replication import ReplicationConfig
from rayledger.storage import StoreConfig
from rayledger.storage.snapshots import SnapshotStore

KV = "rayledger.integration.kv:KvMachine"


def _keys(client, member: str) -> dict:
    return client.query({"keys": True}, consistency="committed", member=member)


@pytest.mark.ray
def test_a_member_below_the_leaders_begin_gets_its_snapshot_and_serves_reads(make_group):
    config = dataclasses.replace(
        TEST_CONFIG,
        state_machine=KV,
        snapshot_every_entries=300,
        snapshot_keep=1,  # the log may go up to the newest snapshot
        store=StoreConfig(data_segment_size=64 * 1024),
        replication=ReplicationConfig(install_chunk_bytes=4096),  # a snapshot of many chunks
        dispatcher_cache_bytes=16 * 1024,  # the leader's dispatchers keep little of the log
    )
    g = make_group(members=3, config=config)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30)
    c.append_batch([set_command(f"before-{j}", j) for j in range(50)])
    away = next(m for m in g.members if m != leader)
    here = [m for m in g.members if m != away]
    g.partition([away], here)
    try:
        for k in range(20):  # ~2,000 entries over many 64 KiB segments, snapshots every 300
            c.append_batch([set_command(f"k{k}-{j}", "x" * 40) for j in range(100)])
        last = c.append(set_command("last", True)).index

        def compacted():  # once their machines snapshotted past the old segments
            begins = {m: g.compact(m)[m] for m in here}
            return begins if min(begins.values()) > 100 else None

        begins = wait_until(compacted, 60, "the two members compact their logs past 100")
        # a new leader: the old one's dispatcher may still hold the gap it read from its
        # files before they were compacted, and would push that instead of a snapshot
        leader = next(m for m in here if m != leader)
        g.transfer_leadership(leader)
    finally:
        g.heal()
    leader = g.wait_for_leader()
    assert g.status()[leader].ledger_begin_index == begins[leader] > 50

    # the new leader's machine has every key once its term's first entry commits
    def every_key():
        keys = _keys(c, leader)
        return keys if len(keys) == 2051 else None

    want = wait_until(every_key, 30, "every key on the leader")
    wait_until(
        lambda: _keys(c, away) == want,
        90,
        lambda: f"{away} serves every key (status {g.status()[away]})",
    )
    st = g.status()[away]
    assert st.ledger_begin_index > 50 and st.ledger_end_index >= last  # its log was reset
    # the snapshot it got is sealed in its own directory, whole
    snaps = SnapshotStore(f"{ray.get(g.handle(away).store_dir.remote())}/snapshots", owner=False)
    have = snaps.list()
    assert have and all(snaps.verify(s) is None for s in have)
    assert have[-1].index >= st.ledger_begin_index - 1
    # and it keeps following: a new key reaches it
    c.append(set_command("after", 1))
    deadline = time.monotonic() + 30
    while "after" not in _keys(c, away):
        assert time.monotonic() < deadline
        time.sleep(0.1)
