"""Topics in Spark: the rows are the messages the consume queues hold, and a
ConsumerCheckpoint makes runs incremental (RayDP starts in 10-40 s: one test)."""

from __future__ import annotations

import pytest
from rayledger.actors import LedgerConfig
from rayledger.integration.rocketmq import CommitLog, Message, encode
from rayledger.integration.rocketmq.message import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)

pytestmark = [pytest.mark.ray, pytest.mark.spark]


def test_incremental_runs_read_each_consumable_message_once(spark, tmp_path, group_name):
    from rayledger.integration.rocketmq.spark import read_new_messages
    from rayledger.integration.spark.consumer import ConsumerCheckpoint

    log = CommitLog.create(group_name, 3, str(tmp_path / "mq"), LedgerConfig.fast())
    try:
        cp = ConsumerCheckpoint(tmp_path / "cp.json", group=group_name)

        def run() -> list[bytes]:
            batch = read_new_messages(spark, group_name, cp, topic="T")
            rows = sorted(batch.df.collect(), key=lambda r: r["index"])
            batch.commit()
            return [bytes(r["body"]) for r in rows]

        for i in range(3):
            assert log.put_message("T", i % 2, b"m%d" % i).ok
        log.put_message("U", 0, b"other topic")
        half = [Message("T", b"half", sys_flag=f) for f in (TRANSACTION_PREPARED_TYPE,
                                                             TRANSACTION_ROLLBACK_TYPE)]  # fmt: skip
        log.client.append_batch([encode(m) for m in half])  # not consumable: not rows either
        assert run() == [b"m0", b"m1", b"m2"]
        assert log.put_message("T", 0, b"m3").ok
        assert run() == [b"m3"]
        assert run() == []
    finally:
        log.group.shutdown(delete_data=True)
