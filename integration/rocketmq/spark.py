"""Topics as Spark DataFrames: the committed log through RayDP, decoded into messages.

Built on the committed-log reader (integration/spark): it never shows an entry past the
committed index.  A row is a message the consume queues hold: entries that are no
well-formed record (a term's empty first entry, say), and prepared or rolled-back
transactional messages, are left out; the group's configuration entries never
reach ``decode_block``: the committed-log reader leaves them out, as the commit log's
dispatch never sees them.
``start`` (a ledger index) or ``read_new_messages`` with a ConsumerCheckpoint make
incremental runs cheap.

A broker cluster's topic reads as one DataFrame over all its broker groups
(:func:`cluster_messages_dataframe`), with a ``broker`` column naming each row's broker
group (RocketMQ's brokerName); ``queue_offset`` is per (broker, queue_id).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.codec import HEADER_SIZE

from .commitlog import _QUEUED, _route
from .message import MessageError, decode

if TYPE_CHECKING:  # pragma: no cover
    from rayledger.integration.spark import CommittedRead
    from rayledger.integration.spark.consumer import ConsumerCheckpoint, PendingBatch

#: one ledger index for every broker group, or one per broker group (missing: the default)
Bound = int | Mapping[str, int] | None

SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("phys_offset", pa.int64()),
        ("born_timestamp", pa.int64()),
        ("store_timestamp", pa.int64()),
        ("tags", pa.string()),
        ("keys", pa.string()),
        # JSON, made a map in Spark (the Arrow -> Spark hop cannot carry Arrow maps)
        ("properties", pa.string()),
        ("body", pa.binary()),
    ]
)


def decode_block(block: pa.Table, topic: str | None = None) -> pa.Table:
    """Committed entries (index, term, pos, body) -> one row per message of ``topic``."""
    rows: dict[str, list] = {name: [] for name in SCHEMA.names}
    for index, pos, body in zip(
        block.column("index").to_pylist(),
        block.column("pos").to_pylist(),
        block.column("body").to_pylist(),
        strict=True,
    ):
        if _route(body) is None:  # dispatch skips it too
            continue
        try:
            m = decode(body)
        except MessageError:
            continue
        if m.transaction_type not in _QUEUED or (topic is not None and m.topic != topic):
            continue
        values = (
            index, m.topic, m.queue_id, m.queue_offset, pos + HEADER_SIZE, m.born_timestamp,
            m.store_timestamp, m.tags, m.keys,
            json.dumps(m.properties), m.body,
        )  # fmt: skip
        for name, v in zip(SCHEMA.names, values, strict=True):
            rows[name].append(v)
    return pa.table(rows, schema=SCHEMA)


def messages_dataframe(
    spark: Any, group: str | os.PathLike, topic: str | None = None, start: int = 0, **kw: Any
):
    """The committed messages (of ``topic``) from ledger index ``start`` as a DataFrame."""
    return _messages_read(spark, group, topic, start, None, **kw)[0]


def read_new_messages(
    spark: Any,
    group: str | os.PathLike,
    checkpoint: ConsumerCheckpoint,
    topic: str | None = None,
    max_entries: int | None = None,
) -> PendingBatch:
    """The messages committed since ``checkpoint`` (consumer.read_new, decoded); call
    ``commit()`` on the batch once it is processed, so the next run starts after it."""
    from rayledger.integration.spark.consumer import PendingBatch

    start = checkpoint.next_index
    stop = None if max_entries is None else start + max_entries
    df, read = _messages_read(spark, group, topic, start, stop)
    return PendingBatch(df, read.start, read.stop, read.committed_index, checkpoint)


def _messages_read(spark: Any, group, topic, start: int, stop: int | None, **kw: Any):
    from rayledger.integration.spark import committed_dataset

    read = committed_dataset(group, start, stop, **kw)
    if read.dataset is None:
        return spark.createDataFrame([], _spark_schema()), read
    return _to_spark(spark, _decoded(read.dataset, topic)), read


def _decoded(dataset, topic: str | None, broker: str | None = None):
    """Committed entries -> message rows (``broker``: with that column first)."""
    kwargs = {"topic": topic} if broker is None else {"topic": topic, "broker": broker}
    fn = decode_block if broker is None else _decode_broker_block
    return dataset.map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow", num_cpus=0.25)


def _decode_broker_block(block: pa.Table, topic: str | None, broker: str) -> pa.Table:
    table = decode_block(block, topic)
    return table.add_column(0, "broker", pa.array([broker] * table.num_rows, pa.string()))


def _to_spark(spark: Any, dataset):
    from pyspark.sql import functions as F

    df = dataset.to_spark(spark)
    return df.withColumn("properties", F.from_json("properties", "map<string,string>"))


@dataclass
class ClusterMessagesRead:
    """What :func:`cluster_messages_read` read: the DataFrame and each broker group's
    :class:`~rayledger.integration.spark.CommittedRead` (its ledger range)."""

    df: Any
    reads: dict[str, CommittedRead]

    def next_start(self) -> dict[str, int]:
        """Where the next incremental read of each broker group starts (pass as ``start``)."""
        return {b: r.stop for b, r in self.reads.items()}


def _bound(b: Bound, broker: str, default: int | None) -> int | None:
    if isinstance(b, Mapping):
        return b.get(broker, default)
    return default if b is None else b


def cluster_messages_read(
    spark: Any, cluster: str, topic: str | None = None, start: Bound = 0, stop: Bound = None,
    **kw: Any,
) -> ClusterMessagesRead:  # fmt: skip
    """The committed messages (of ``topic``) of every broker group of broker cluster
    ``cluster`` as one DataFrame with a ``broker`` column.  ``start``/``stop``: ledger
    indexes, one for every broker group or one per broker group (a mapping by broker group
    name).  UNKNOWN_GROUP for an unknown cluster, UNEXPECTED_ARGUMENT for a bound naming a
    broker group the cluster does not have."""
    from rayledger.integration.spark import committed_dataset

    from .brokers import BrokerCluster

    brokers = BrokerCluster.get(cluster).brokers
    for b in (start, stop):
        if isinstance(b, Mapping) and set(b) - set(brokers):
            unknown = sorted(set(b) - set(brokers))
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"cluster {cluster!r} has broker groups {brokers}, not {unknown}",
            )
    reads: dict[str, CommittedRead] = {}
    parts = []
    for broker in brokers:
        read = committed_dataset(broker, _bound(start, broker, 0), _bound(stop, broker, None), **kw)
        reads[broker] = read
        if read.dataset is not None:
            parts.append(_decoded(read.dataset, topic, broker))
    if not parts:
        return ClusterMessagesRead(spark.createDataFrame([], _spark_schema(broker=True)), reads)
    dataset = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    return ClusterMessagesRead(_to_spark(spark, dataset), reads)


def cluster_messages_dataframe(
    spark: Any, cluster: str, topic: str | None = None, start: Bound = 0, stop: Bound = None,
    **kw: Any,
):  # fmt: skip
    """:func:`cluster_messages_read`'s DataFrame: columns ``broker`` and the messages'."""
    return cluster_messages_read(spark, cluster, topic, start, stop, **kw).df


def _spark_schema(broker: bool = False):
    from pyspark.sql import types as T

    first = [T.StructField("broker", T.StringType())] if broker else []
    return T.StructType(
        [
            *first,
            T.StructField("index", T.LongType()),
            T.StructField("topic", T.StringType()),
            T.StructField("queue_id", T.IntegerType()),
            T.StructField("queue_offset", T.LongType()),
            T.StructField("phys_offset", T.LongType()),
            T.StructField("born_timestamp", T.LongType()),
            T.StructField("store_timestamp", T.LongType()),
            T.StructField("tags", T.StringType()),
            T.StructField("keys", T.StringType()),
            T.StructField("properties", T.MapType(T.StringType(), T.StringType())),
            T.StructField("body", T.BinaryType()),
        ]
    )
