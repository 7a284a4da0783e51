"""RocketMQ's commit log on a real 3-member group: puts, pulls, a leader kill in the middle,
consumer-group offsets through the ledger, bad input with RocketMQ's codes."""

from __future__ import annotations

import sys
import time

import pytest
from rayledger.election import Role
from rayledger.integration.rocketmq import CommitLog, PutMessageStatus

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/actors")
from groupcheck import TEST_CONFIG  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture
def commitlog(ray_session, tmp_path, group_name):
    log = CommitLog.create(group_name, 3, store_dir=str(tmp_path / "mq"), config=TEST_CONFIG)
    yield log
    log.group.shutdown(delete_data=True)


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
            assert r.status in (PutMessageStatus.UNKNOWN_ERROR,
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


def test_bad_messages_get_rocketmq_codes_and_store_nothing(commitlog):
    log = commitlog
    before = log.group.client().committed_index()
    assert log.put_message("", 0, b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
    assert log.put_message("T" * 200, 0, b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
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
