"""A topic's committed entries as one Ray Dataset or Spark DataFrame, with a ``partition``
column: one read per partition (each its own group's committed range, as
:func:`~.reader.committed_dataset` reads a group), in parallel, unioned.

Each partition's range is fixed at its own committed index when the call reads it; the
:class:`TopicRead` says which range of each was read, so an incremental reader keeps one
checkpoint per partition (``start={p: read.reads[p].stop}`` next time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayledger.storage import LedgerError, ResponseCode

from ..topic.layout import require
from .reader import CommittedRead, committed_dataset, spark_schema

if TYPE_CHECKING:  # pragma: no cover
    import ray.data
    from pyspark.sql import DataFrame, SparkSession

Bound = int | Mapping[int, int] | None


@dataclass
class TopicRead:
    """What :func:`topic_dataset` read: ``dataset`` (None when every range was empty) and
    each partition's :class:`~.reader.CommittedRead`."""

    dataset: ray.data.Dataset | None
    reads: dict[int, CommittedRead]

    def next_start(self) -> dict[int, int]:
        """Where the next incremental read of each partition starts."""
        return {p: r.stop for p, r in self.reads.items()}


class _WithPartition:
    """Adds the ``partition`` column to a partition's pyarrow blocks (first column)."""

    def __init__(self, partition: int):
        self.partition = partition

    def __call__(self, table):
        import pyarrow as pa

        column = pa.array([self.partition] * table.num_rows, type=pa.int32())
        return table.add_column(0, "partition", column)


def _bound(b: Bound, p: int, default: int | None) -> int | None:
    if isinstance(b, Mapping):
        return b.get(p, default)
    return default if b is None else b


def topic_dataset(
    topic: str, start: Bound = 0, stop: Bound = None, *, verify_crc: bool = False
) -> TopicRead:
    """The committed entries of every partition of ``topic`` as one Dataset (columns
    ``partition, index, term, pos, body``).  ``start``/``stop``: one bound for every
    partition or one per partition (a mapping; missing partitions from 0 / to their
    committed index)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", namespace="rayledger")
    layout = require(topic)
    for b in (start, stop):
        if isinstance(b, Mapping) and any(not 0 <= p < layout.partitions for p in b):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"topic {topic!r} has partitions 0..{layout.partitions - 1}: {dict(b)!r}",
            )
    reads: dict[int, CommittedRead] = {}
    parts = []
    for p, group in enumerate(layout.groups):
        read = committed_dataset(group, _bound(start, p, 0), _bound(stop, p, None),
                                 verify_crc=verify_crc)  # fmt: skip
        reads[p] = read
        if read.dataset is not None:
            parts.append(read.dataset.map_batches(_WithPartition(p), batch_format="pyarrow"))
    dataset = parts[0].union(*parts[1:]) if len(parts) > 1 else (parts[0] if parts else None)
    return TopicRead(dataset, reads)


def topic_schema():
    from pyspark.sql.types import IntegerType, StructField, StructType

    return StructType([StructField("partition", IntegerType()), *spark_schema().fields])


def topic_dataframe(
    spark: SparkSession, topic: str, start: Bound = 0, stop: Bound = None, **kwargs: Any
) -> DataFrame:
    """:func:`topic_dataset` as a Spark DataFrame (through RayDP)."""
    read = topic_dataset(topic, start, stop, **kwargs)
    if read.dataset is None:
        return spark.createDataFrame([], topic_schema())
    return read.dataset.to_spark(spark)
