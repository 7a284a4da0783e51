"""The RocketMQ commit log after a reset: a broker (member) that was away while the group
compacted its logs comes back below the leader's begin, loads the leader's topic-queue
table and continues its consume queues from there, and its consumers get RocketMQ's
OFFSET_TOO_SMALL with the lowest offset still readable -- and move on to it -- instead of
an error loop."""

from __future__ import annotations

import dataclasses

import pytest
import ray
from groupcheck import TEST_CONFIG, wait_until
from rayledger.integration.rocketmq import CommitLog
from rayledger.storage import LedgerError, StoreConfig

TOPIC = "Orders"


def _pull_on(g, member: str, offset: int):
    """A pull answered by ``member`` itself (None while it cannot answer)."""
    try:
        return ray.get(
            g.handle(member).query.remote(("pull", TOPIC, 0, offset, 64), "linearizable"),
            timeout=30,
        )
    except (LedgerError, ray.exceptions.RayError):
        return None


@pytest.mark.ray
def test_a_broker_reset_past_its_queues_rebuilds_them_and_consumers_move_on(
    ray_session, group_name, tmp_path
) -> None:
    config = dataclasses.replace(
        TEST_CONFIG,
        store=StoreConfig(data_segment_size=64 * 1024),
        # the leader's dispatchers keep little of the log: a few small batches, far less than
        # the entries the away broker misses, so it cannot be caught up from their cache
        dispatcher_cache_bytes=16 * 1024,
        replication=dataclasses.replace(TEST_CONFIG.replication, max_batch_push_bytes=4 * 1024),
        state_machine_args={"checkpoint_interval_ms": 0},  # a checkpoint after every batch
        snapshot_every_entries=300,  # the log is compacted up to the older of two tables
    )
    log = CommitLog.create(group_name, 3, store_dir=str(tmp_path), config=config)
    g = log.group
    try:
        leader = g.wait_for_leader()
        log.put_messages(
            [{"topic": TOPIC, "queue_id": 0, "body": b"early-%d" % i} for i in range(50)]
        )
        away = next(m for m in g.members if m != leader)
        here = [m for m in g.members if m != away]
        g.partition([away], here)
        try:
            for k in range(30):  # ~1,500 messages over many 64 KiB segments
                log.put_messages(
                    [
                        {"topic": TOPIC, "queue_id": 0, "body": b"m%d-%d" % (k, i) + b"x" * 100}
                        for i in range(50)
                    ]  # fmt: skip
                )

            def compacted():
                begins = {m: g.compact(m)[m] for m in here}
                return begins if min(begins.values()) > 200 else None

            begins = wait_until(compacted, 60, "the two members compact their logs")
        finally:
            g.heal()
        total = log.max_offset(TOPIC, 0)
        assert total == 50 + 30 * 50

        # the broker that was away comes back below the leader's begin and continues its
        # consume queue after the leader's table: offset 0 is gone, the newest message is there
        r = wait_until(
            lambda: (p := _pull_on(g, away, 0)) and p["max_offset"] == total and p,
            90,
            f"{away} rebuilds its consume queue",
        )
        assert r["status"] == "OFFSET_TOO_SMALL" and r["next_offset"] == r["min_offset"] > 50
        assert g.status()[away].ledger_begin_index >= min(begins.values())

        # the snapshot it loaded may hold every message (the leader takes one as far as it
        # has applied when a follower asks): what comes next is dispatched on that broker
        more = [{"topic": TOPIC, "queue_id": 0, "body": b"n-%d" % i} for i in range(20)]
        log.put_messages(more)
        total += len(more)
        r = wait_until(
            lambda: (p := _pull_on(g, away, 0)) and p["max_offset"] == total and p,
            30,
            f"{away} dispatches what follows the snapshot",
        )
        low = r["min_offset"]
        assert r["status"] == "OFFSET_TOO_SMALL" and 50 < low < total
        assert _pull_on(g, away, low)["status"] == "FOUND"
        assert _pull_on(g, away, total)["status"] == "NO_NEW_MSG"

        # a consumer that starts at 0 on that broker moves on to what is left, in order
        got = list(log.consume(TOPIC, 0, 0, batch=500, member=away))
        assert [m.queue_offset for m in got] == list(range(low, total))
        assert got[-1].body == b"n-19"
        # the leader compacted too: the same answer there, not an error
        lead = log.pull(TOPIC, 0, 0)
        assert lead.status == "OFFSET_TOO_SMALL" and lead.next_offset > 0 and not lead.messages
        # and the broker keeps dispatching what comes next at the next offset
        res = log.put_message(TOPIC, 0, b"after")
        assert res.ok and res.queue_offset == total
        wait_until(
            lambda: (p := _pull_on(g, away, total)) and p["status"] == "FOUND",
            30,
            f"{away} dispatches the next message",
        )
    finally:
        g.shutdown(delete_data=True)
