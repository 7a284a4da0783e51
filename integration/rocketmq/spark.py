"""Topics as Spark DataFrames: the committed log through RayDP, decoded into messages.

Built on the committed-log reader (integration/spark): it never shows an entry past the
committed index, and ``start`` (a ledger index, e.g. from a ConsumerCheckpoint) makes
incremental runs cheap.  Entries that are not commit-log records are skipped.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
from rayledger.storage.codec import HEADER_SIZE

from .message import MessageError, decode

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
        try:
            m = decode(body)
        except MessageError:
            continue
        if topic is not None and m.topic != topic:
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
    from rayledger.integration.spark import committed_dataset

    read = committed_dataset(group, start, **kw)
    if read.dataset is None:
        return spark.createDataFrame([], _spark_schema())
    from pyspark.sql import functions as F

    ds = read.dataset.map_batches(
        decode_block, fn_kwargs={"topic": topic}, batch_format="pyarrow", num_cpus=0.25
    )
    df = ds.to_spark(spark)
    return df.withColumn("properties", F.from_json("properties", "map<string,string>"))


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
