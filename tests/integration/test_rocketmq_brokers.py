"""RocketMQ broker clusters on real groups and files: a topic's queues spread over two broker
groups, round robin and by sharding key; every message consumed once across all queues with
offsets committed per broker group; a broker group without a master is failed over and kept
off, a master kill under producer threads loses no acknowledged message; bad input gets a
coded error and creates or changes nothing."""

from __future__ import annotations

import itertools
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

import pytest
from rayledger.actors import LedgerError, LedgerGroup, ResponseCode
from rayledger.actors.naming import group_members
from rayledger.election import Role
from rayledger.integration.rocketmq import (
    BrokerCluster,
    MessageQueue,
    PutMessageStatus,
    SendResult,
)
from rayledger.integration.rocketmq.brokers import UNIQ_KEY, select_by_hash

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/actors")
from groupcheck import TEST_CONFIG, wait_until  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture
def cluster(ray_session, tmp_path, group_name):
    """Two 3-member broker groups on files, two queues per broker group, deleted after."""
    c = BrokerCluster.create(group_name, broker_groups=2, members=3,
                             store_dir=str(tmp_path / "mq"), config=TEST_CONFIG,
                             queues_per_broker=2)  # fmt: skip
    try:
        yield c
    finally:
        c.delete(delete_data=True)


def _code(exc_info) -> ResponseCode:
    return exc_info.value.code


def _consumed(cluster: BrokerCluster, topic: str) -> dict[MessageQueue, list]:
    """Every committed message of ``topic``, per queue (no consumer group)."""
    out: dict[MessageQueue, list] = {}
    for mq, m in cluster.consumer().consume(topic):
        out.setdefault(mq, []).append(m)
    return out


def test_sends_spread_over_broker_groups_and_each_message_is_consumed_once(cluster):
    other = BrokerCluster.get(cluster.name)  # the layout, as another driver finds it
    assert other.brokers == [f"{cluster.name}-b0", f"{cluster.name}-b1"]
    assert cluster.name in BrokerCluster.list()
    b0, b1 = other.brokers
    route = other.route("T")
    assert route.queues == [MessageQueue("T", b, q) for b in (b0, b1) for q in (0, 1)]
    p = other.producer()

    rs = [p.send("T", b"m%d" % i, tags="t", keys=f"k{i}") for i in range(24)]
    assert all(r.ok and not r.attempts for r in rs), [
        (r.attempts, r.error) for r in rs if not r.ok or r.attempts
    ]
    assert Counter(r.mq for r in rs) == {mq: 6 for mq in route.queues}  # round robin
    for mq in route.queues:
        assert [r.queue_offset for r in rs if r.mq == mq] == list(range(6))
    assert len({r.msg_id for r in rs}) == 24 and all(len(r.msg_id) == 32 for r in rs)

    keyed: dict[str, list[SendResult]] = {}
    for i in range(12):
        key = f"order-{i % 4}"
        keyed.setdefault(key, []).append(p.send("T", f"{key}:{i}".encode(), sharding_key=key))
    for key, krs in keyed.items():
        assert all(r.ok for r in krs)
        assert {r.mq for r in krs} == {select_by_hash(route.queues, key)}  # one queue per key
        assert [r.queue_offset for r in krs] == sorted(r.queue_offset for r in krs)
    batch = p.send_batch("T", [{"body": b"x1", "tags": "b"}, {"body": b"x2"}])
    assert batch[0].mq == batch[1].mq and batch[1].queue_offset == batch[0].queue_offset + 1
    assert p.send("U", b"other topic").ok

    acked = {(r.mq, r.queue_offset): r for r in [*rs, *itertools.chain(*keyed.values()), *batch]}
    bodies = {
        (r.mq, r.queue_offset): b for r, b in zip(rs, [b"m%d" % i for i in range(24)], strict=True)
    }
    topics = cluster.topics()
    assert set(topics["T"]) == {b0, b1} and sum(map(len, topics["T"].values())) == 4

    consumer = cluster.consumer("cg")
    got = list(consumer.consume("T"))
    assert len(got) == len(acked) == 24 + 12 + 2
    assert {(mq, m.queue_offset) for mq, m in got} == set(acked)  # each once, none missing
    for mq, m in got:
        r = acked[(mq, m.queue_offset)]
        assert m.topic == "T" and m.queue_id == mq.queue_id
        assert m.properties[UNIQ_KEY] == r.msg_id and m.msg_id == r.offset_msg_id
        if (mq, m.queue_offset) in bodies:
            assert m.body == bodies[(mq, m.queue_offset)] and m.tags == "t"
    assert list(cluster.consumer("cg").consume("T")) == []  # the offsets were committed
    for mq in route.queues:
        assert consumer.fetch_offset(mq) == consumer.max_offset(mq) > 0
        assert [m.queue_offset for m in consumer.pull(mq, 0, 100).messages] == list(
            range(consumer.max_offset(mq))
        )
    # follow: another consumer group from the start, across both broker groups
    followed = list(itertools.islice(cluster.consumer("cg2").follow("T"), len(acked)))
    assert {(mq, m.queue_offset) for mq, m in followed} == set(acked)


def _no_leader(group: LedgerGroup) -> bool:
    return not any(s.role is Role.LEADER for s in group.status().values() if s.alive)


@dataclass
class Sent:
    acked: list[SendResult] = field(default_factory=list)
    unknown: set[bytes] = field(default_factory=set)
    put: set[bytes] = field(default_factory=set)
    refused: list[SendResult] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def test_failover_to_another_broker_group_loses_no_acknowledged_message(cluster):
    b0, b1 = cluster.brokers
    g0 = cluster.broker(b0).group
    route = cluster.route("T")
    # b0 without a master: its members cannot reach each other
    g0.partition(*({m} for m in g0.members))
    try:
        wait_until(lambda: _no_leader(g0), 30, f"{b0} to lose its master")
        p = cluster.producer(send_timeout_s=2.0, fault_isolation_s=60.0)
        rs = [p.send("T", b"f%d" % i) for i in range(8)]
        assert all(r.ok and r.broker == b1 for r in rs), rs
        tried = [r.attempts for r in rs if r.attempts]
        assert tried == [((b0, PutMessageStatus.SERVICE_NOT_AVAILABLE),)]  # then kept off
        assert p.faults.isolated() == [b0]
        # ordered messages never change queues: refused, nothing stored, no failover
        key = next(k for k in map(str, range(100)) if select_by_hash(route.queues, k).broker == b0)
        r = p.send("T", b"ordered", sharding_key=key)
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and r.broker == b0
        assert not r.outcome_unknown and not r.attempts
    finally:
        g0.heal()
    g0.wait_for_leader(timeout_s=60)

    # a master kill on b1 while producer threads send round robin over both broker groups
    g1 = cluster.broker(b1).group
    p = cluster.producer(send_timeout_s=3.0, fault_isolation_s=1.0)
    sent, stop = Sent(), threading.Event()
    sent.put.update(b"f%d" % i for i in range(8))
    sent.acked.extend(rs)

    def produce(prefix: str) -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            body = f"{prefix}-{i}".encode()
            with sent.lock:
                sent.put.add(body)
            r = p.send("T", body)
            with sent.lock:
                if r.ok:
                    sent.acked.append(r)
                elif r.outcome_unknown:  # never resent: it may be stored
                    sent.unknown.add(body)
                else:  # refused by every broker group tried: nothing stored
                    sent.refused.append(r)

    threads = [threading.Thread(target=produce, args=(f"p{k}",), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(sent.acked) >= 48, 60, "acks before the kill")
        assert b0 in {r.broker for r in sent.acked[8:]}  # b0 is used again once healed
        leader = g1.wait_for_leader(timeout_s=30)
        term = max(s.term for s in g1.status().values())
        g1.kill(leader)
        wait_until(
            lambda: any(s.role is Role.LEADER and s.term > term for s in g1.status().values()),
            60, f"a new master of {b1}",
        )  # fmt: skip
        n = len(sent.acked)
        wait_until(  # b1's new master takes messages again once the isolation ends
            lambda: len(sent.acked) >= n + 40 and b1 in {r.broker for r in sent.acked[n:]},
            60, "acks after the kill, on both broker groups",
        )  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)

    print(f"acked {len(sent.acked)}, unknown {len(sent.unknown)}, refused {len(sent.refused)}, "
          f"failed over {sum(1 for r in sent.acked if r.attempts)}")  # fmt: skip
    retriable = {PutMessageStatus.SERVICE_NOT_AVAILABLE, PutMessageStatus.OS_PAGECACHE_BUSY}
    assert all(r.status in retriable for r in sent.refused), sent.refused
    queues = _consumed(cluster, "T")
    every = Counter(m.body for ms in queues.values() for m in ms)
    assert not [b for b, k in every.items() if k > 1], "a message stored twice"
    assert set(every) <= sent.put, "a message nobody put"
    for mq, ms in queues.items():
        assert [m.queue_offset for m in ms] == list(range(len(ms))), f"{mq}: a gap"
    at = {(mq, m.queue_offset): m for mq, ms in queues.items() for m in ms}
    for r in sent.acked:  # every acknowledged message, once, where its send said
        assert at[(r.mq, r.queue_offset)].properties[UNIQ_KEY] == r.msg_id
    acked_bodies = {at[(r.mq, r.queue_offset)].body for r in sent.acked}
    assert set(every) <= acked_bodies | sent.unknown, "refused, yet stored"


def test_bad_input_gets_a_coded_error_and_changes_nothing(ray_session, tmp_path, group_name):
    name, store = group_name, str(tmp_path / "mq")
    for kw in ({"broker_groups": 0}, {"broker_groups": -2}, {"broker_groups": True},
               {"broker_groups": "2"}, {"queues_per_broker": 0}, {"queues_per_broker": -1},
               {"members": 0}, {"config": object()}):  # fmt: skip
        with pytest.raises(LedgerError) as e:
            BrokerCluster.create(name, store_dir=store, **{"broker_groups": 2, **kw})
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT, kw
    for bad in ("", "a/b", None):
        with pytest.raises(LedgerError) as e:
            BrokerCluster.create(bad, 2)
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
    with pytest.raises(LedgerError) as e:
        BrokerCluster.get(name)
    assert _code(e) is ResponseCode.UNKNOWN_GROUP and name in str(e.value)
    assert not group_members(f"{name}-b0")

    # a group already running under a broker group's name: refused before anything starts
    blocker = LedgerGroup.create(f"{name}-b1", 1, config=TEST_CONFIG)
    try:
        with pytest.raises(LedgerError) as e:
            BrokerCluster.create(name, 2, 1, store, TEST_CONFIG)
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT and f"{name}-b1" in str(e.value)
        assert name not in BrokerCluster.list() and not group_members(f"{name}-b0")
    finally:
        blocker.shutdown(delete_data=True)

    cluster = BrokerCluster.create(name, 2, 1, store, TEST_CONFIG, queues_per_broker=2)
    try:
        b0, b1 = cluster.brokers
        with pytest.raises(LedgerError) as e:  # the name exists
            BrokerCluster.create(name, 3, 1, store, TEST_CONFIG)
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT and "exists" in str(e.value)
        assert not group_members(f"{name}-b2")
        assert BrokerCluster.get(name).layout.broker_groups == 2

        p, c = cluster.producer(), cluster.consumer()
        assert p.send("T", b"ok").ok
        before = cluster.topics()
        for mq in (MessageQueue("T", b0, 2), MessageQueue("T", b0, -1),
                   MessageQueue("T", f"{name}-b9", 0), ("T", b0, 0)):  # fmt: skip
            with pytest.raises(LedgerError) as e:
                p.send("T", b"never", mq=mq)
            assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT, mq
            with pytest.raises(LedgerError) as e:
                c.pull(mq, 0)
            assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT, mq
        with pytest.raises(LedgerError) as e:  # a queue of another topic
            p.send("T", b"never", mq=MessageQueue("U", b0, 0))
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
        with pytest.raises(LedgerError) as e:
            c.pull(MessageQueue("T", b0, 0), -1)
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
        with pytest.raises(LedgerError) as e:  # a selector choosing outside the route
            p.send(
                "T", b"never", sharding_key="k", selector=lambda mqs, k: MessageQueue("T", b0, 7)
            )
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
        r = p.send("bad/topic", b"never")
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and not r.ok
        assert cluster.topics() == before  # nothing stored

        with pytest.raises(LedgerError) as e:
            cluster.create_topic("T2", 0)
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
        assert cluster.create_topic("T2", 3).queues_per_broker == 3
        assert BrokerCluster.get(name).route("T2").queues_per_broker == 3  # kept in the KV
        with pytest.raises(LedgerError) as e:
            cluster.create_topic("T2", 2)
        assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
        assert p.send("T2", b"q", mq=MessageQueue("T2", b1, 2)).queue_id == 2
        for call in (lambda: cluster.broker(5), lambda: cluster.broker("nope"),
                     lambda: cluster.producer(retry_times_when_send_failed=-1),
                     lambda: c.commit_offset(MessageQueue("T", b0, 0), 1),
                     lambda: cluster.consumer(group=""),
                     lambda: p.send_batch("T", [])):  # fmt: skip
            with pytest.raises(LedgerError) as e:
                call()
            assert _code(e) is ResponseCode.UNEXPECTED_ARGUMENT
    finally:
        cluster.delete(delete_data=True)
    with pytest.raises(LedgerError) as e:
        BrokerCluster.get(name)
    assert _code(e) is ResponseCode.UNKNOWN_GROUP
    assert not group_members(f"{name}-b0") and not group_members(f"{name}-b1")
