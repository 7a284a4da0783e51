"""``rayledger export``: committed entries to Parquet through Spark, resumable.

The output directory holds one Spark Parquet directory per chunk,
``part-<first>-<end>`` (20-digit indexes, ``end`` exclusive), and the export's
consumer checkpoint ``_rayledger_export.json`` (Spark and pyarrow skip ``_``
files).  Each chunk is written to ``_tmp-...``, renamed into place, and only then
is the checkpoint advanced; a chunk found at or past the checkpoint on start (a
run that died between the rename and the commit) is removed and written again,
so a resumed export neither skips nor repeats an entry.

The rows are those of :func:`~rayledger.integration.spark.reader.committed_dataframe`: a
client entry each (a term's empty first entry included), configuration entries
left out -- their indexes are missing from the ``index`` column, while chunk names and the
checkpoint count log indexes.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from rayledger.storage import LedgerError, ResponseCode

from ..connect import connect
from .consumer import ConsumerCheckpoint

log = logging.getLogger("rayledger.integration")

CHECKPOINT_FILE = "_rayledger_export.json"
CHUNK_ENTRIES = 250_000
_CHUNK_RE = re.compile(r"^part-(\d{20})-(\d{20})$")


def chunks_in(out: Path) -> list[tuple[int, int, Path]]:
    """Exported chunks in ``out`` as (first, end, path), in index order."""
    found = []
    for p in out.iterdir() if out.is_dir() else []:
        m = _CHUNK_RE.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(found)


def _prepare(out: Path, checkpoint: ConsumerCheckpoint, start: int | None) -> int:
    """Drop leftovers of an interrupted run; returns the index to export from."""
    for p in out.glob("_tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    if start is not None:
        for a, b, p in chunks_in(out):
            if a < start < b:
                raise LedgerError.of(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"--from {start} falls inside the exported chunk {p.name}; use --from {a} or another --out",
                )
        checkpoint.reset(start)
    nxt = checkpoint.next_index
    for a, _b, p in chunks_in(out):
        if a >= nxt:
            log.warning("removing %s: written after the last committed checkpoint", p)
            shutil.rmtree(p)
    return nxt


def export(
    spark: Any,
    group: str,
    out: str | Path,
    start: int | None = None,
    chunk_entries: int = CHUNK_ENTRIES,
    progress: bool = True,
    timeout_s: float = 30.0,
    partition: int | None = None,
) -> dict[str, Any]:
    """Export the committed entries of ``group`` from ``start`` (None: resume) to ``out``.

    A row per client entry, as :func:`~.reader.committed_dataframe` reads them: a group's
    configuration entries are skipped (their indexes are missing from ``index``).  The
    result's ``entries`` counts the log indexes exported, ``from``/``to`` bound them.
    ``partition``: the group is this partition of a topic; every row says so in a first
    ``partition`` column."""
    from .reader import committed_read, snapshot

    out = Path(out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = ConsumerCheckpoint(out / CHECKPOINT_FILE, group=group)
    first = _prepare(out, checkpoint, start)
    snap = snapshot(group, timeout_s=min(timeout_s, 10.0))
    end = snap.committed_index + 1
    total = max(0, end - first)
    t0 = time.perf_counter()
    written = 0
    with _progress(progress, total, f"export {group}") as advance:
        a = first
        while a < end:
            b = min(end, a + chunk_entries)
            df, read = committed_read(spark, group, a, b, snap=snap)
            if partition is not None:
                from pyspark.sql import functions as F  # noqa: N812 -- Spark's own idiom

                df = df.select(F.lit(partition).cast("int").alias("partition"), "*")
            if read.stop != b:
                raise LedgerError.of(
                    ResponseCode.INTERNAL_ERROR,
                    f"read [{read.start}, {read.stop}), wanted [{a}, {b})",
                )
            name = f"part-{a:020d}-{b:020d}"
            tmp = out / f"_tmp-{name}"
            df.write.mode("overwrite").parquet(str(tmp))
            tmp.rename(out / name)
            checkpoint.commit(b, expected=a)
            written += b - a
            advance(b - a)
            a = b
    seconds = time.perf_counter() - t0
    return {
        "group": group,
        "out": str(out),
        "from": first,
        "to": max(first, end),
        "entries": written,
        "committed_index": snap.committed_index,
        "seconds": round(seconds, 3),
        "entries_per_s": round(written / seconds) if written and seconds > 0 else 0,
    }


def export_topic(
    spark: Any,
    topic: str,
    out: str | Path,
    start: int | None = None,
    chunk_entries: int = CHUNK_ENTRIES,
    progress: bool = True,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Export every partition of ``topic`` to ``out/partition-<p>/``, each as :func:`export`
    exports a group (its own chunks and checkpoint, so each resumes on its own) with a
    ``partition`` column: ``spark.read.parquet(f"{out}/partition-*/part-*")`` reads them all
    as one table."""
    from ..topic.layout import require

    layout = require(topic)
    out = Path(out).expanduser().resolve()
    parts = [
        export(
            spark,
            group,
            out / f"partition-{p}",
            start,
            chunk_entries,
            progress,
            timeout_s,
            partition=p,
        )  # fmt: skip
        for p, group in enumerate(layout.groups)
    ]
    return {
        "topic": topic,
        "out": str(out),
        "partitions": parts,
        "entries": sum(r["entries"] for r in parts),
        "seconds": round(sum(r["seconds"] for r in parts), 3),
    }


class _progress:
    """A rich progress bar (or nothing) that ``advance(n)`` moves on."""

    def __init__(self, enabled: bool, total: int, label: str):
        self.enabled = enabled and total > 0
        self.total = total
        self.label = label
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return lambda n: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self._bar.start()
        task = self._bar.add_task(self.label, total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


def export_main(args: Any) -> int:
    """Entry point of ``rayledger export`` (args: group or topic, out, start, address,
    timeout)."""
    from .reader import init_spark, spark_running, stop_spark

    topic = getattr(args, "topic", None) is not None

    if args.start is not None and args.start < 0:
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, f"--from must be >= 0, got {args.start}"
        )
    connect(args.address)
    own_spark = not spark_running()  # a caller's session is left running
    spark = init_spark(f"rayledger-export-{args.topic if topic else args.group}")
    try:
        if topic:
            result = export_topic(spark, args.topic, args.out, args.start, timeout_s=args.timeout)
        else:
            result = export(spark, args.group, args.out, args.start, timeout_s=args.timeout)
    finally:
        if own_spark:
            stop_spark()
    print(json.dumps(result))
    return 0
