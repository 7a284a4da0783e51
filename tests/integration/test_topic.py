"""Topics on Ray: a topic is N ordinary groups found by name from its durable layout, a
client routes keyed appends to one partition each (per-key order), spreads unkeyed ones,
splits batches by partition and reads per partition and merged; each partition's leader is
its preferred member; bad input gets a coded error and changes nothing."""

from __future__ import annotations

import time

import pytest
from rayledger.actors import LedgerConfig, LedgerError, LedgerGroup, ResponseCode
from rayledger.integration.topic import LedgerTopic, TopicClient, partition_of


@pytest.fixture
def topic(ray_session, group_name):
    """Three one-member partitions on memory stores, deleted after the test."""
    t = LedgerTopic.create(group_name, partitions=3, members=1, config=LedgerConfig.fast())
    try:
        t.wait_for_leaders(60)
        yield t
    finally:
        t.delete(delete_data=True)


def test_keyed_appends_stay_on_their_partition_in_order(topic) -> None:
    c = topic.client()
    try:
        seen: dict[str, list] = {}
        for i in range(30):
            key = f"user-{i % 5}"
            r = c.append(f"{key}:{i}".encode(), key=key)
            assert r.partition == partition_of(key, 3)
            seen.setdefault(key, []).append(r)
        for key, rs in seen.items():
            assert len({r.partition for r in rs}) == 1
            assert [r.index for r in rs] == sorted(r.index for r in rs)  # per-key order
            got = [c.get(r.partition, r.index).body for r in rs]
            assert got == [f"{key}:{i}".encode() for i in range(30) if f"user-{i % 5}" == key]
        unkeyed = [c.append(b"u").partition for _ in range(6)]
        assert sorted(unkeyed) == [0, 0, 1, 1, 2, 2]
    finally:
        c.close()


def test_a_batch_is_split_by_partition_and_answered_in_order(topic) -> None:
    c = TopicClient.connect(topic.name)
    try:
        bodies = [f"b{i}".encode() for i in range(40)]
        keys = [None if i % 4 == 0 else f"k{i % 7}" for i in range(40)]
        rs = c.append_batch(bodies, keys)
        assert len(rs) == 40
        for i, r in enumerate(rs):
            if keys[i] is not None:
                assert r.partition == partition_of(keys[i], 3)
            assert c.get(r.partition, r.index).body == bodies[i]
        whole = [{r.partition for r in c.append_batch([b"x"] * 5)} for _ in range(3)]
        assert sorted(p for ps in whole for p in ps) == [0, 1, 2]  # each batch whole, in turn
        merged = list(c.tail())
        mine = [(t.partition, t.entry.index) for t in merged if t.entry.body in bodies]
        assert sorted(mine) == sorted((r.partition, r.index) for r in rs)
        for p in range(3):  # each partition's entries in its log order
            idx = [t.entry.index for t in merged if t.partition == p]
            assert idx == sorted(idx)
    finally:
        c.close()


def test_the_layout_is_found_from_any_driver_and_shows_each_leader(topic) -> None:
    again = LedgerTopic.get(topic.name)
    assert again.groups == [f"{topic.name}-p{i}" for i in range(3)]
    assert topic.name in LedgerTopic.list()
    rows = again.status()
    assert [r["partition"] for r in rows] == [0, 1, 2]
    assert all(r["leader"] == "n0" and r["node"] and r["term"] >= 0 for r in rows), rows
    assert again.rebalance() == []  # one node: nothing to even out


def test_bad_input_gets_a_code_and_changes_nothing(topic, group_name) -> None:
    def code(fn) -> ResponseCode:
        with pytest.raises(LedgerError) as e:
            fn()
        return e.value.code

    other = group_name + "-x"
    for bad in (0, -2, "3", True):
        assert code(lambda b=bad: LedgerTopic.create(other, partitions=b)) == (
            ResponseCode.UNEXPECTED_ARGUMENT
        )
    assert other not in LedgerTopic.list()
    assert code(lambda: LedgerTopic.create(topic.name, partitions=1)) == (
        ResponseCode.UNEXPECTED_ARGUMENT
    )
    assert code(lambda: LedgerGroup.create(f"{topic.name}-p1", 1)) == (
        ResponseCode.UNEXPECTED_ARGUMENT
    )
    assert code(lambda: LedgerTopic.get(other)) == ResponseCode.UNKNOWN_GROUP
    assert code(lambda: TopicClient.connect(other)) == ResponseCode.UNKNOWN_GROUP
    c = topic.client()
    try:
        before = [c.committed_index(p) for p in range(3)]
        assert code(lambda: c.append(b"v", key=17)) == ResponseCode.UNEXPECTED_ARGUMENT
        assert code(lambda: c.append("text")) == ResponseCode.UNEXPECTED_ARGUMENT
        assert code(lambda: c.append_batch([b"a", b"b"], [b"k"])) == (
            ResponseCode.UNEXPECTED_ARGUMENT
        )
        assert code(lambda: c.append_batch([])) == ResponseCode.REQUEST_WITH_EMPTY_BODYS
        assert code(lambda: c.read(3, 0, 1)) == ResponseCode.UNEXPECTED_ARGUMENT
        assert code(lambda: list(c.tail(partitions=[5]))) == ResponseCode.UNEXPECTED_ARGUMENT
        assert [c.committed_index(p) for p in range(3)] == before
    finally:
        c.close()


def test_a_topic_taken_by_a_running_group_is_refused_whole(ray_session, group_name) -> None:
    g = LedgerGroup.create(f"{group_name}-p1", 1)
    try:
        with pytest.raises(LedgerError) as e:
            LedgerTopic.create(group_name, partitions=2, members=1)
        assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
        assert group_name not in LedgerTopic.list()
        assert LedgerGroup.get(f"{group_name}-p1").members == ["n0"]
    finally:
        g.shutdown(delete_data=True)


def test_each_partition_is_led_by_its_preferred_member(ray_session, group_name, tmp_path) -> None:
    t = LedgerTopic.create(group_name, partitions=2, members=3, store_dir=tmp_path,
                           config=LedgerConfig.fast())  # fmt: skip
    try:
        t.wait_for_leaders(60)
        deadline = time.monotonic() + 30
        while [r["leader"] for r in t.status()] != ["n0", "n1"]:
            assert time.monotonic() < deadline, t.status()
            time.sleep(0.5)
        c = t.client()
        try:
            r = c.append(b"durable", key="k")
            assert c.get(r.partition, r.index).body == b"durable"
        finally:
            c.close()
    finally:
        t.delete(delete_data=True)
