"""Spark benchmark: committed entries into a DataFrame (``rayledger bench spark``)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from rayledger.storage import LedgerError, ResponseCode

from ..spark.reader import NAMESPACE, committed_dataframe, init_spark, stop_spark


def build_log(
    path: str | os.PathLike, entries: int, body_size: int = 128, batch: int = 2000
) -> Path:
    """Write a committed log of ``entries`` bodies straight into a FileStore at ``path``."""
    from rayledger.storage import FileStore, StoreConfig

    store = FileStore(StoreConfig(data_dir=str(path), data_segment_size=64 << 20))
    try:
        done = 0
        while done < entries:
            n = min(batch, entries - done)
            pad = bytes(body_size - 8)
            store.append_as_leader([(done + k).to_bytes(8, "big") + pad for k in range(n)], 1)
            done += n
        store.update_committed_index(store.ledger_end_index)
    finally:
        store.close()
    return Path(path)


def run_spark_bench(quick: bool) -> dict:
    """``rows_per_s`` of committed 128-byte entries into a DataFrame and counted (Spark start excluded).

    The log is written straight into a FileStore directory (no 1M appends through Ray),
    then read through the real :func:`committed_dataframe` path (Ray Data read tasks,
    the store reader, ``Dataset.to_spark``) with the checkpoint's committed index as the bound.
    """
    import tempfile

    import ray

    entries = 100_000 if quick else 1_000_000
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(
            address="local",
            namespace=NAMESPACE,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    tmp = tempfile.mkdtemp(prefix="rayledger-spark-bench-")
    try:
        t0 = time.perf_counter()
        path = build_log(Path(tmp) / "bench" / "n0", entries)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        spark = init_spark("rayledger-bench")
        start_s = time.perf_counter() - t0
        committed_dataframe(spark, path, 0, 1000).count()  # warm up the executor's Python workers
        t0 = time.perf_counter()
        df = committed_dataframe(spark, path)
        count = df.count()
        read_s = time.perf_counter() - t0
        if count != entries:
            raise LedgerError.of(
                ResponseCode.INTERNAL_ERROR, f"bench read {count} rows, expected {entries}"
            )
        return {
            "bench": "spark",
            "entries": entries,
            "body_bytes": 128,
            "rows_per_s": round(count / read_s),
            "read_s": round(read_s, 3),
            "spark_start_s": round(start_s, 2),
            "build_log_s": round(build_s, 2),
        }
    finally:
        stop_spark()
        shutil.rmtree(tmp, ignore_errors=True)
        if own_ray:
            ray.shutdown()
