"""Consumer checkpoints: incremental pipelines over the committed log.

Like a RocketMQ consumer offset, a :class:`ConsumerCheckpoint` is one small JSON
file (``{"group", "next_index", ...}``) written atomically.  A run reads the
entries committed since the last run with :func:`read_new`, processes them, and
only then commits the new offset, so across runs no entry is skipped or read
twice (a run that fails before committing is read again by the next run):

.. code-block:: python

    cp = ConsumerCheckpoint("/pipelines/orders.offset", group="orders")
    with consume(spark, "orders", cp) as batch:      # commits on a clean exit only
        batch.df.groupBy("term").count().write.parquet(f"/out/{batch.start}")

    # or by hand
    batch = read_new(spark, "orders", cp)
    process(batch.df)
    batch.commit()
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.metafile import atomic_write_json, read_json

from .reader import committed_read

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("rayledger.integration")


class ConsumerCheckpoint:
    """The next index a pipeline has not processed yet, kept in a JSON file.

    ``group`` (optional) is recorded on the first commit and checked on every
    later one, so a checkpoint is never used against the wrong group.
    """

    def __init__(self, path: str | os.PathLike, group: str | None = None):
        self.path = Path(path)
        self.group = group
        data = self._load()
        if data and group is not None and data.get("group") not in (None, group):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"checkpoint {self.path} belongs to group {data['group']!r}, not {group!r}",
            )

    def _load(self) -> dict[str, Any]:
        data = read_json(self.path) or {}
        if data and (not isinstance(data.get("next_index"), int) or data["next_index"] < 0):
            raise LedgerError.of(
                ResponseCode.CORRUPT_LOG, f"checkpoint {self.path} has no valid next_index: {data}"
            )
        return data

    @property
    def next_index(self) -> int:
        """The first index not processed yet (0 for a new checkpoint)."""
        return int(self._load().get("next_index", 0))

    def commit(self, next_index: int, expected: int | None = None) -> None:
        """Record that everything below ``next_index`` is processed.

        ``expected`` is the offset the caller read from; if another run committed
        meanwhile the commit is refused (INCONSISTENT_STATE) rather than skip or
        repeat entries.  The offset never moves backwards.
        """
        data = self._load()
        current = int(data.get("next_index", 0))
        if expected is not None and current != expected:
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"checkpoint {self.path} moved from {expected} to {current} while this batch ran; "
                f"another consumer committed it",
            )
        if next_index < current:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"checkpoint {self.path}: {next_index} is below {current}",
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            self.path,
            {
                "group": self.group if self.group is not None else data.get("group"),
                "next_index": int(next_index),
                "runs": int(data.get("runs", 0)) + 1,
                "updated_at": time.time(),
            },
        )
        log.info("checkpoint %s: next index %d -> %d", self.path, current, next_index)

    def reset(self, next_index: int = 0) -> None:
        """Start over from ``next_index`` (an explicit rewind)."""
        data = self._load()
        atomic_write_json(
            self.path,
            {
                "group": self.group or data.get("group"),
                "next_index": int(next_index),
                "runs": 0,
                "updated_at": time.time(),
            },
        )

    def __repr__(self) -> str:
        return f"ConsumerCheckpoint({str(self.path)!r}, next_index={self.next_index})"


@dataclass
class PendingBatch:
    """Entries ``[start, stop)`` read for a run; :meth:`commit` once they are processed."""

    df: DataFrame
    start: int
    stop: int
    committed_index: int
    checkpoint: ConsumerCheckpoint
    committed: bool = False

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def empty(self) -> bool:
        return self.stop <= self.start

    def commit(self) -> None:
        if self.committed:
            return
        if not self.empty:
            self.checkpoint.commit(self.stop, expected=self.start)
        self.committed = True


def read_new(
    spark: SparkSession,
    group: str | os.PathLike,
    checkpoint: ConsumerCheckpoint,
    max_entries: int | None = None,
) -> PendingBatch:
    """The entries committed since ``checkpoint`` (at most ``max_entries`` indexes); nothing
    is committed yet.  Rows as :func:`~.reader.committed_dataframe` (configuration entries
    skipped); the checkpoint moves past their indexes like any other."""
    start = checkpoint.next_index
    stop = None if max_entries is None else start + max_entries
    df, read = committed_read(spark, group, start, stop)
    log.info(
        "consumer %s: read [%d, %d) (committed index %d)",
        checkpoint.path,
        read.start,
        read.stop,
        read.committed_index,
    )
    return PendingBatch(df, read.start, read.stop, read.committed_index, checkpoint)


@contextmanager
def consume(
    spark: SparkSession,
    group: str | os.PathLike,
    checkpoint: ConsumerCheckpoint,
    max_entries: int | None = None,
) -> Iterator[PendingBatch]:
    """:func:`read_new` as a context manager: commits when the block exits without an error."""
    batch = read_new(spark, group, checkpoint, max_entries)
    yield batch
    batch.commit()
