"""A broker cluster's topic in Spark: one DataFrame over every broker group, with a
``broker`` column, and incremental runs from each broker group's next ledger index (RayDP
is slow to start: the session's shared Spark, one test)."""

from __future__ import annotations

import collections
import sys

import pytest
from rayledger.actors import LedgerError, ResponseCode
from rayledger.integration.rocketmq import BrokerCluster

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/actors")
from groupcheck import TEST_CONFIG  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.spark]


def test_a_topic_reads_across_broker_groups_as_one_dataframe(spark, tmp_path, group_name):
    from rayledger.integration.rocketmq.spark import (
        cluster_messages_dataframe,
        cluster_messages_read,
    )

    cluster = BrokerCluster.create(group_name, 2, 1, str(tmp_path / "mq"), TEST_CONFIG,
                                   queues_per_broker=2)  # fmt: skip
    try:
        p = cluster.producer()
        rs = [p.send("T", b"m%d" % i, tags=f"t{i % 2}") for i in range(10)]
        assert all(r.ok for r in rs)
        assert p.send("U", b"other topic").ok

        def rows(df) -> dict[tuple[str, int, int], bytes]:
            return {(r["broker"], r["queue_id"], r["queue_offset"]): bytes(r["body"])
                    for r in df.collect()}  # fmt: skip

        read = cluster_messages_read(spark, cluster.name, topic="T")
        want = {(r.broker, r.queue_id, r.queue_offset): b"m%d" % i for i, r in enumerate(rs)}
        assert rows(read.df) == want
        assert {b for b, _q, _o in want} == set(cluster.brokers)
        assert read.df.columns[0] == "broker" and "properties" in read.df.columns
        by_broker = {r["broker"]: r["count"] for r in read.df.groupBy("broker").count().collect()}
        # round robin spreads them, unless a broker group not yet taking messages sent
        # one on to the other (failover): the counts are the send results'
        assert by_broker == dict(collections.Counter(r.broker for r in rs))

        more = [p.send("T", b"n%d" % i) for i in range(4)]
        again = cluster_messages_read(spark, cluster.name, "T", start=read.next_start())
        assert rows(again.df) == {(r.broker, r.queue_id, r.queue_offset): b"n%d" % i
                                  for i, r in enumerate(more)}  # fmt: skip
        empty = cluster_messages_dataframe(spark, cluster.name, "T", start=again.next_start())
        assert empty.count() == 0 and empty.columns[0] == "broker"

        with pytest.raises(LedgerError) as e:
            cluster_messages_dataframe(spark, f"{group_name}-none")
        assert e.value.code is ResponseCode.UNKNOWN_GROUP
        with pytest.raises(LedgerError) as e:
            cluster_messages_dataframe(spark, cluster.name, start={f"{group_name}-b9": 0})
        assert e.value.code is ResponseCode.UNEXPECTED_ARGUMENT
    finally:
        cluster.delete(delete_data=True)
