"""Topics as Spark DataFrames: the committed log through RayDP, decoded into messages.

Built on the committed-log reader (integration/spark): it never shows an entry past the
committed index.  A row is a message the consume queues hold: entries that are no
well-formed record (a term's empty first entry, say), and prepared or rolled-back
transactional messages, are left out; the group's configuration entries never
reach ``decode_block``: the committed-log reader leaves them out, as the commit log's
dispatch never sees them.
``start`` (a ledger index) or ``read_new_messages`` with a ConsumerCheckpoint make
incremental runs cheap.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from rayledger.storage.codec import HEADER_SIZE

from .commitlog import _QUEUED, _route
from .message import MessageError, decode

if TYPE_CHECKING:  # pragma: no cover
    from rayledger.integration.spark.consumer import ConsumerCheckpoint, PendingBatch

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
    from pyspark.sql import functions as F

    ds = read.dataset.map_batches(
        decode_block, fn_kwargs={"topic": topic}, batch_format="pyarrow", num_cpus=0.25
    )
    df = ds.to_spark(spark)
    return df.withColumn("properties", F.from_json("properties", "map<string,string>")), read


def _spark_schema():
    from pyspark.sql import types as T

    return T.StructType(
        [
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
