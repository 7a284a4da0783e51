"""RocketMQ's commit log on a real 3-member group: puts, pulls, a leader kill in the middle
(also under producer threads), consumer-group offsets through the ledger, bad input with
RocketMQ's codes."""

from __future__ import annotations

import sys
import time

import pytest
import ray
from rayledger.actors import LedgerError
from rayledger.election import Role
from rayledger.integration.rocketmq import CommitLog, PutMessageStatus
from rayledger.integration.rocketmq.message import pulled_messages

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/actors")
from groupcheck import wait_until  # noqa: E402
from test_rocketmq_chaos import (  # noqa: E402
    QUEUES,
    Produced,
    Producer,
    check_queues,
    check_stored_offsets,
)
from test_rocketmq_commitlog import MALFORMED  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.mark.chaos  # long run; CI keeps the master kill under producer threads
def test_produce_and_consume_through_a_leader_kill(commitlog):
    log = commitlog
    acked: dict[tuple[str, int], list[tuple[int, bytes]]] = {}

    def put(i: int) -> None:
        topic, q = ("A", i % 2) if i % 3 else ("B", 0)
        r = log.put_message(topic, q, b"m%d" % i, tags=f"t{i % 4}", keys=f"k{i}")
        if r.ok:
            acked.setdefault((topic, q), []).append((r.queue_offset, b"m%d" % i))
            assert r.msg_id and r.wrote_offset > 0
        else:  # an unknown outcome or a refusal during the failover
            assert r.status in (PutMessageStatus.UNKNOWN_ERROR, PutMessageStatus.OS_PAGECACHE_BUSY,
                                PutMessageStatus.SERVICE_NOT_AVAILABLE), r  # fmt: skip

    for i in range(30):
        put(i)
    batch = log.put_messages([{"topic": "A", "queue_id": 0, "body": b"b%d" % k} for k in range(5)])
    assert [r.queue_offset for r in batch] == list(
        range(batch[0].queue_offset, batch[0].queue_offset + 5)
    )
    acked[("A", 0)] += [(r.queue_offset, b"b%d" % k) for k, r in enumerate(batch)]
    log.commit_offset("cg", "A", 0, 3)
    leader = log.group.wait_for_leader()
    term = max(s.term for s in log.group.status().values())
    log.group.kill(leader)
    deadline = time.monotonic() + 60  # a leader of a newer term (maybe the restarted one)
    while not any(s.role is Role.LEADER and s.term > term for s in log.group.status().values()):
        assert time.monotonic() < deadline, "no new leader after the kill"
        time.sleep(0.2)
    for i in range(30, 60):
        put(i)
    assert log.fetch_offset("cg", "A", 0) == 3  # survived the failover
    check_stored_offsets(log, {k: log.pull(*k, 0, 1000).messages for k in acked})
    for (topic, q), puts in acked.items():
        pulled = log.pull(topic, q, 0, 1000)
        offsets = [m.queue_offset for m in pulled.messages]
        assert offsets == list(range(len(offsets))), "a gap or a duplicate in the queue"
        by_offset = {m.queue_offset: m.body for m in pulled.messages}
        for off, body in puts:  # every acknowledged message, once, at its offset
            assert by_offset[off] == body
        bodies = [m.body for m in pulled.messages]
        assert len(bodies) == len(set(bodies))
    topics = log.topics()
    assert set(topics) == {"A", "B"} and topics["A"][0] >= len(acked[("A", 0)])


def test_producer_threads_keep_queue_offsets_contiguous_through_a_master_kill(commitlog):
    """The master is killed while producer threads put; the new master's table continues
    every queue with no gap and no duplicate (stored offsets included)."""
    log, out = commitlog, Produced()
    own = CommitLog.connect(log.group.name)  # half the threads share a client, half do not
    producers = [Producer(log if k % 2 else own, f"p{k}", out) for k in range(4)]
    for p in producers:
        p.start()
    try:
        wait_until(lambda: out.count() >= 40, 30, "acks before the kill")
        leader = log.group.wait_for_leader(timeout_s=30)
        term = max(s.term for s in log.group.status().values())
        log.group.kill(leader)
        wait_until(
            lambda: any(s.role is Role.LEADER and s.term > term
                        for s in log.group.status().values()),
            30, "a new master",
        )  # fmt: skip
        n = out.count()
        wait_until(lambda: out.count() >= n + 40, 30, "acks from the new master")
    finally:
        for p in producers:
            p.stop.set()
        for p in producers:
            p.join(timeout=60)
    queues = check_queues(log, out)
    assert all(queues[k] for k in QUEUES)


def test_malformed_raw_appends_leave_dispatch_running_on_every_member(commitlog):
    """Anyone may append to the group with a plain LedgerClient: bad records (a topic that
    is a path, a NUL byte, a torn record) and bad consumer-offset commands are skipped by
    every member, before and after a restart, and the queues go on with no gap."""
    log = commitlog
    assert log.put_message("T", 0, b"before").ok
    raw = log.group.client()
    raw.append_batch([bytes(b) for b in MALFORMED])
    for b in MALFORMED[:4]:
        raw.append(bytes(b))  # one call each, too
    assert log.put_message("T", 0, b"after").ok
    follower = next(m for m in log.group.members if m != log.group.wait_for_leader())
    log.group.kill(follower)  # reopens its consume queues from disk, replays, dispatches
    assert log.put_message("T", 0, b"late").ok
    want = [b"before", b"after", b"late"]

    def served(member: str) -> list | None:
        """The queue as ``member`` itself serves it (a client's pull would fall back to
        the leader while it restarts)."""
        pull = log.group.handle(member).query.remote(
            ("pull", "T", 0, 0, 100), consistency="committed"
        )
        try:
            r = ray.get(pull, timeout=10)
        except (LedgerError, ray.exceptions.RayError):  # restarting
            return None
        msgs = pulled_messages(r["data"], r["bounds"], r["first_offset"])
        return msgs if [m.body for m in msgs] == want else None

    for m in log.group.members:
        wait_until(lambda m=m: served(m), 60, f"{m} to serve every message")
    check_stored_offsets(log, {("T", 0): served(log.group.members[0])})
    assert log.topics() == {"T": {0: 3}}


def test_bad_messages_get_rocketmq_codes_and_store_nothing(commitlog):
    log = commitlog
    before = log.group.client().committed_index()
    assert log.put_message("", 0, b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
    assert log.put_message("T" * 200, 0, b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
    for topic in ("a/b", "..", "a\x00b"):  # paths under cq/, or none at all
        assert log.put_message(topic, 0, b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
    assert log.put_message("T", -1, b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
    for level in (-1, 19):
        r = log.put_message("T", 0, b"x", delay_level=level)
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
    big = {"p": "v" * 40000}
    assert log.put_message("T", 0, b"x", properties=big).status is (
        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    )
    r = log.put_messages(
        [{"topic": "T", "body": b"x"}, {"topic": "T", "body": b"y", "delay_level": 2}]
    )
    assert all(x.status is PutMessageStatus.MESSAGE_ILLEGAL for x in r)
    assert log.group.client().committed_index() == before
    delayed = log.put_message("T", 1, b"later", delay_level=3)
    m = log.pull("SCHEDULE_TOPIC_XXXX", 2, 0).messages[0]
    assert delayed.ok and m.properties["REAL_TOPIC"] == "T" and m.properties["REAL_QID"] == "1"
