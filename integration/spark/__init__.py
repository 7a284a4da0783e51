"""The committed log for Spark: the RayDP reader, consumer checkpoints, Parquet export."""

from .reader import (
    COLUMNS,
    CommittedRead,
    CommittedSnapshot,
    SparkUnavailableError,
    committed_dataframe,
    committed_dataset,
    committed_read,
    init_spark,
    snapshot,
    spark_running,
    stop_spark,
)
from .topics import TopicRead, topic_dataframe, topic_dataset

__all__ = [
    "COLUMNS",
    "CommittedRead",
    "CommittedSnapshot",
    "SparkUnavailableError",
    "TopicRead",
    "committed_dataframe",
    "committed_dataset",
    "committed_read",
    "init_spark",
    "snapshot",
    "spark_running",
    "stop_spark",
    "topic_dataframe",
    "topic_dataset",
]
