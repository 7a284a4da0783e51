"""The committed log as a Spark DataFrame, through RayDP (Spark on Ray).

``committed_dataframe(spark, group)`` first fixes the committed index ``C`` of
the group *at the time of the call* (the maximum over the live members; the
leader's is the largest), then reads ``[start, min(stop, C + 1))`` with Ray Data
read tasks over index ranges and hands the pyarrow blocks to Spark with
``Dataset.to_spark``.  Nothing past ``C`` is ever returned, even when a member's
files already hold later (uncommitted) entries.

Where the tasks read:

* file store: the segment files of one member whose own committed index is at
  least ``C`` (so its log up to ``C`` is the committed log, Raft's log matching),
  through :class:`rayledger.storage.reader.StoreReader`, which only reads; the
  tasks run on that member's node;
* memory store: the member actors' ``read_batch(start, stop, committed_only=True)``,
  trying the members that already know ``C`` first.

A member that is down simply does not answer the status call and is skipped.

Rows are the client entries (channel 0), a term's empty first entry among them (an empty
``body``).  A group's configuration entries (membership changes, on their own
channel, JSON bodies) are left out: the ``index`` column keeps the log's numbering, so
their indexes are missing from it, and a range may hold fewer rows than indexes.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.reader import StoreReader, arrow_schema, batch_to_table

if TYPE_CHECKING:  # pragma: no cover
    import ray.data
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("rayledger.integration")

NAMESPACE = "rayledger"
COLUMNS = ("index", "term", "pos", "body")

#: Defaults for ``init_spark`` that fit a 2-core machine; every one can be overridden.
SPARK_DEFAULTS: dict[str, Any] = {"num_executors": 1, "executor_cores": 1, "executor_memory": "1GB"}
_SPARK_CONFIGS = {
    # RayDP's app master is a plain Ray actor: ask for no CPU so that a small cluster
    # keeps its cores for the executor and for the Ray Data read tasks.
    "spark.ray.raydp_spark_master.actor.resource.CPU": "0",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


class SparkUnavailableError(RuntimeError):
    """Spark cannot start here (no Java, or no room on the Ray cluster)."""


# -- Spark session ----------------------------------------------------------------------
def _find_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _memory_bytes(v: str | int) -> int:
    if isinstance(v, int):
        return v
    s = v.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def init_spark(app_name: str = "rayledger", **overrides: Any) -> SparkSession:
    """Start (or return the running) Spark session on Ray through RayDP.

    Defaults: 1 executor, 1 core, 1 GB (``SPARK_DEFAULTS``); ``configs=`` adds
    Spark settings; any other keyword goes to ``raydp.init_spark``.  Raises
    :class:`SparkUnavailableError` when Java is missing or the Ray cluster has no
    room for the executors (instead of hanging while RayDP waits for them).
    """
    import ray

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import raydp
    import raydp.context

    ctx = raydp.context._global_spark_context
    if ctx is not None and ctx._spark_session is not None:
        return ctx._spark_session
    if _find_java() is None:
        raise SparkUnavailableError(
            "Spark needs Java (17 works with pyspark 3.5): install a JDK (e.g. apt-get install "
            "openjdk-17-jre-headless) or set JAVA_HOME"
        )
    if not ray.is_initialized():
        ray.init(namespace=NAMESPACE)
    opts = {**SPARK_DEFAULTS, **overrides}
    configs = {**_SPARK_CONFIGS, **(opts.pop("configs", None) or {})}
    need_cpu = float(opts["num_executors"]) * float(opts["executor_cores"])
    free = ray.available_resources()
    if free.get("CPU", 0.0) + 1e-9 < need_cpu:
        raise SparkUnavailableError(
            f"the Ray cluster has {free.get('CPU', 0.0):g} free CPUs, Spark needs {need_cpu:g} "
            f"({opts['num_executors']} executors x {opts['executor_cores']} cores); free some or pass "
            f"smaller num_executors/executor_cores"
        )
    need_mem = _memory_bytes(opts["executor_memory"]) * int(opts["num_executors"])
    if "memory" in free and free["memory"] < need_mem:
        raise SparkUnavailableError(
            f"the Ray cluster has {free['memory'] / 2**30:.1f} GiB of memory free, Spark executors need "
            f"{need_mem / 2**30:.1f} GiB; pass a smaller executor_memory"
        )
    t0 = time.perf_counter()
    spark = raydp.init_spark(app_name, configs=configs, **opts)
    log.info("Spark on Ray started in %.1fs (%s)", time.perf_counter() - t0, opts)
    return spark


def spark_running() -> bool:
    """Is a RayDP Spark session running in this driver?"""
    import raydp.context

    ctx = raydp.context._global_spark_context
    return ctx is not None and ctx._spark_session is not None


def stop_spark() -> None:
    """Stop the RayDP Spark session, if one runs."""
    import raydp

    try:
        raydp.stop_spark()
    except Exception as exc:  # a half-dead session must not stop the caller's cleanup
        log.warning("stopping Spark: %s", exc)


def spark_schema():
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType(
        [
            StructField("index", LongType()),
            StructField("term", LongType()),
            StructField("pos", LongType()),
            StructField("body", BinaryType()),
        ]
    )


# -- which members hold what ----------------------------------------------------------------
@dataclass
class MemberView:
    member: str
    handle: Any
    committed_index: int
    begin_index: int
    store_dir: str | None
    node_id: str | None


@dataclass
class CommittedSnapshot:
    """The group's committed index at one moment and the members that can serve reads."""

    group: str
    committed_index: int
    begin_index: int
    members: list[MemberView] = field(default_factory=list)  # live ones, best source first
    offline_dir: str | None = None  # a store directory read without actors

    @property
    def file_backed(self) -> bool:
        return self.offline_dir is not None or any(m.store_dir for m in self.members)


def snapshot(group: str | os.PathLike, timeout_s: float = 5.0) -> CommittedSnapshot:
    """Fix the committed index now: max over the live members (or a stopped member's checkpoint).

    ``group`` is a running group's name, or the store directory of one member of a
    stopped group (then its checkpoint's committed index is the bound).
    """
    if not isinstance(group, str) or "/" in group:  # group names never hold "/": a directory
        with StoreReader(group) as r:
            return CommittedSnapshot(
                str(group), r.committed_index_on_disk(), r.begin_index(), [], str(group)
            )
    import ray
    from rayledger.actors.group import group_members

    if not ray.is_initialized():
        ray.init(address="auto", namespace=NAMESPACE)
    ids = group_members(group)
    if not ids:
        raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no group named {group!r} is running")
    handles = {}
    for m in ids:
        try:
            handles[m] = ray.get_actor(f"{group}/{m}", namespace=NAMESPACE)
        except ValueError:
            continue
    refs = {m: (h.status.remote(), h.info.remote()) for m, h in handles.items()}
    flat = [r for pair in refs.values() for r in pair]
    ready, _ = ray.wait(flat, num_returns=len(flat), timeout=timeout_s)
    ready = set(ready)
    views = []
    for m, (sref, iref) in refs.items():
        if sref not in ready or iref not in ready:
            continue
        try:
            st, info = ray.get([sref, iref], timeout=0.1)
        except Exception as exc:  # a member dying right now
            log.debug("member %s/%s skipped: %s", group, m, exc)
            continue
        if st.membership == "removed":  # left the configuration: not a source
            continue
        views.append(
            MemberView(
                m,
                handles[m],
                st.committed_index,
                st.ledger_begin_index,
                info["config"].store.data_dir,
                info.get("node_id"),
            )
        )
    if not views:
        raise LedgerError.of(
            ResponseCode.TIMEOUT, f"no member of {group!r} answered within {timeout_s}s"
        )
    committed = max(v.committed_index for v in views)
    # Best source first: knows the whole committed prefix; among those prefer a follower
    # (a file read costs nothing on the actor, an actor read does).
    views.sort(key=lambda v: (v.committed_index < committed, -v.committed_index, v.member))
    begin = max(v.begin_index for v in views if v.committed_index >= committed)
    return CommittedSnapshot(group, committed, begin, views)


# -- Ray Data -----------------------------------------------------------------------------------
#: The header channel of the entries read (a client's; configuration entries are left out).
CLIENT_CHANNEL = 0


def _read_files(data_dir: str, start: int, stop: int, verify_crc: bool) -> Iterator:
    with StoreReader(data_dir, verify_crc=verify_crc) as r:
        yield from r.iter_tables(start, stop, max_bytes=64 * 1024 * 1024, channel=CLIENT_CHANNEL)


def _read_actors(
    handles: Sequence[Any], start: int, stop: int, chunk: int, verify_crc: bool
) -> Iterator:
    import ray

    a = start
    while a < stop:
        b = min(stop, a + chunk)
        last: Exception | None = None
        for h in handles:
            try:
                batch = ray.get(h.read_batch.remote(a, b, True), timeout=30)
            except Exception as exc:  # member down or not caught up: try the next one
                last = exc
                continue
            if batch is None or batch.first_index != a or batch.count != b - a:
                last = LedgerError.of(
                    ResponseCode.INDEX_OUT_OF_BOUNDS,
                    f"a member returned a short batch for [{a}, {b})",
                )
                continue
            yield batch_to_table(
                batch.data, batch.first_index, batch.count, verify_crc, channel=CLIENT_CHANNEL
            )
            break
        else:
            raise LedgerError.of(
                ResponseCode.TIMEOUT, f"no member served committed entries [{a}, {b}): {last}"
            )
        a = b


def _make_datasource(snap: CommittedSnapshot, start: int, stop: int, verify_crc: bool):
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class LedgerDatasource(Datasource):
        """Committed entries ``[start, stop)`` of one group, one read task per index range."""

        def __init__(self) -> None:
            super().__init__()

        def get_name(self) -> str:
            return "RayLedger"

        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit=None, data_context=None
        ) -> list:
            n = stop - start
            k = max(1, min(int(parallelism) if parallelism and parallelism > 0 else 1, n))
            step = math.ceil(n / k)
            if snap.offline_dir is not None:
                source = [snap.offline_dir]
            else:
                source = [
                    m.store_dir
                    for m in snap.members
                    if m.committed_index >= stop - 1 and m.store_dir
                ]
            handles = [m.handle for m in snap.members]
            tasks = []
            for a in range(start, stop, step):
                b = min(stop, a + step)
                if snap.file_backed:
                    fn = _task(_read_files, source[0], a, b, verify_crc)
                else:
                    fn = _task(_read_actors, handles, a, b, 16384, verify_crc)
                # rows unknown until read: configuration entries in [a, b) are left out
                meta = BlockMetadata(
                    num_rows=None, size_bytes=None, input_files=None, exec_stats=None
                )
                tasks.append(
                    ReadTask(fn, meta, schema=arrow_schema(), per_task_row_limit=per_task_row_limit)
                )
            return tasks

    return LedgerDatasource()


def _task(fn, *args):
    def read():
        return fn(*args)

    return read


@dataclass
class CommittedRead:
    """What :func:`committed_dataset` read: entries ``[start, stop)``; ``dataset`` None when
    empty.  ``count`` is the number of indexes; the dataset's rows leave configuration
    entries out, so it may hold fewer."""

    dataset: ray.data.Dataset | None
    start: int
    stop: int
    committed_index: int

    @property
    def count(self) -> int:
        return self.stop - self.start


def committed_dataset(
    group: str | os.PathLike,
    start: int = 0,
    stop: int | None = None,
    *,
    rows_per_task: int | None = None,
    verify_crc: bool = False,
    snap: CommittedSnapshot | None = None,
) -> CommittedRead:
    """A Ray Dataset of the committed entries ``start <= index < stop`` (clipped to the committed index).

    Blocks are pyarrow tables with columns ``index, term, pos, body``: a row per client
    entry (a term's empty first entry included); configuration entries are skipped, their
    indexes missing from the ``index`` column.
    """
    if type(start) is not int or start < 0 or (stop is not None and type(stop) is not int):
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, f"bad range start={start!r} stop={stop!r}"
        )
    snap = snap or snapshot(group)
    end = snap.committed_index + 1 if stop is None else min(stop, snap.committed_index + 1)
    if start >= end:
        return CommittedRead(None, start, start, snap.committed_index)
    if start < snap.begin_index:
        raise LedgerError.of(
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            f"entries below {snap.begin_index} of {snap.group!r} were cleaned up; cannot read from {start}",
        )
    import ray

    n = end - start
    per = rows_per_task or min(max(math.ceil(n / 8), 4096), 131072)
    blocks = max(1, math.ceil(n / per))
    remote_args: dict[str, Any] = {}
    if snap.file_backed and snap.members:
        node = next(
            (m.node_id for m in snap.members if m.committed_index >= end - 1 and m.store_dir), None
        )
        if node and len(ray.nodes()) > 1:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            remote_args["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=node, soft=False
            )
    ds = ray.data.read_datasource(
        _make_datasource(snap, start, end, verify_crc),
        override_num_blocks=blocks,
        num_cpus=0.25,
        ray_remote_args=remote_args or None,
    )
    log.info("reading committed entries [%d, %d) of %s in %d tasks", start, end, snap.group, blocks)
    return CommittedRead(ds, start, end, snap.committed_index)


def committed_dataframe(
    spark: SparkSession,
    group: str | os.PathLike,
    start: int = 0,
    stop: int | None = None,
    **kwargs: Any,
) -> DataFrame:
    """The committed entries ``start <= index < stop`` as a DataFrame (index, term, pos, body).

    ``stop`` None means "up to the committed index at the time of this call", read at
    ``committed`` consistency: the highest committed index any live member reports (an
    index a member knows committed is committed, so nothing uncommitted is ever read; an
    append acknowledged a moment before the call may be left for the next read, as with
    ``client.read(..., consistency="committed")``).  ``group`` may also be one member's
    store directory of a stopped group.

    A row per client entry, a term's empty first entry included (an empty ``body``).  A
    group's configuration entries (its membership changes, JSON bodies on their
    own header channel) are skipped: ``index`` keeps the log's numbering, so their indexes
    are missing, and ``df.count()`` may be below the number of indexes read.
    """
    return committed_read(spark, group, start, stop, **kwargs)[0]


def committed_read(
    spark: SparkSession,
    group: str | os.PathLike,
    start: int = 0,
    stop: int | None = None,
    **kwargs: Any,
) -> tuple[DataFrame, CommittedRead]:
    """Like :func:`committed_dataframe`, and also says which range it read."""
    read = committed_dataset(group, start, stop, **kwargs)
    if read.dataset is None:
        return spark.createDataFrame([], spark_schema()), read
    return read.dataset.to_spark(spark), read
