"""The committed log through RayDP: exact reads, never past the committed index, incremental runs.

One RayDP session for the whole module (it takes 10-40 s to start).
"""

from __future__ import annotations

import argparse
import threading
import time

import pyarrow.dataset as pads
import pytest
import ray
from rayledger.actors import LedgerConfig, LedgerError, LedgerGroup, OutcomeUnknownError
from rayledger.integration.bench.spark import build_log
from rayledger.integration.spark import committed_dataframe, committed_read
from rayledger.integration.spark.consumer import ConsumerCheckpoint, consume, read_new
from rayledger.integration.spark.export import CHECKPOINT_FILE, chunks_in, export, export_main
from rayledger.replication import ReplicationConfig

pytestmark = [pytest.mark.ray, pytest.mark.spark]


@pytest.fixture
def groups(ray_session, tmp_path):
    made = []

    def make(name, store=True, members=3):
        # patient quorum waits: CI machines may be loaded while Spark runs
        config = LedgerConfig.fast(replication=ReplicationConfig(max_wait_ack_time_ms=10_000))
        g = LedgerGroup.create(
            name, members, store_dir=str(tmp_path / "store") if store else None, config=config
        )
        g.wait_for_leader(timeout_s=30)
        made.append(g)
        return g

    yield make
    for g in made:
        g.shutdown(delete_data=True)


def wait_until(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _rows(df) -> list[tuple[int, int, int, bytes]]:
    return sorted((r["index"], r["term"], r["pos"], bytes(r["body"])) for r in df.collect())


def _log(group: LedgerGroup, stop: int) -> list[tuple[int, int, int, bytes]]:
    es = group.client().read(0, stop)
    return [(e.index, e.term, e.pos, e.body) for e in es]


def _append(group, n: int, tag: str, batch: int = 50) -> dict[int, bytes]:
    c = group.client()
    acked = {}
    for a in range(0, n, batch):
        bodies = [f"{tag}-{i}".encode() for i in range(a, min(n, a + batch))]
        try:
            results = c.append_batch(bodies)
        except OutcomeUnknownError:  # may or may not be in the log: not counted, not retried
            continue
        for r, b in zip(results, bodies, strict=True):
            acked[r.index] = b
    return acked


@pytest.mark.parametrize(
    "store",
    [True, pytest.param(False, marks=pytest.mark.chaos)],  # CI: the file store's
    ids=["file", "memory"],
)
def test_reads_exactly_the_committed_entries_with_a_follower_down(spark, groups, group_name, store):
    g = groups(group_name, store=store)
    acked = _append(g, 300, "a")
    follower = next(m for m in g.members if m != g.leader_id())
    ray.kill(g.handle(follower), no_restart=True)  # down for good
    acked |= _append(g, 200, "b")
    assert len(acked) >= 250, "too few appends acknowledged to check anything"
    df, read = committed_read(spark, group_name)
    rows = _rows(df)
    assert read.start == 0 and len(rows) == read.count == read.committed_index + 1
    assert [r[0] for r in rows] == list(range(read.count))
    assert rows == _log(g, read.count)  # same terms, positions and bodies as the group serves
    got = {i: b for i, _t, _p, b in rows}
    assert all(got[i] == b for i, b in acked.items())
    assert list(df.columns) == ["index", "term", "pos", "body"]
    assert dict(df.dtypes) == {
        "index": "bigint",
        "term": "bigint",
        "pos": "bigint",
        "body": "binary",
    }
    # a sub-range, and an empty one
    assert [r[0] for r in _rows(committed_dataframe(spark, group_name, 10, 25))] == list(
        range(10, 25)
    )
    assert committed_dataframe(spark, group_name, read.count + 100).count() == 0


def test_reading_during_appends_never_shows_an_uncommitted_entry(spark, groups, group_name):
    """Reads run while a writer appends and, in the middle, while the leader is cut off: it
    keeps storing entries that never commit and are truncated after the heal, at indexes the
    new leader commits differently.  A read that showed one would differ from the final log."""
    g = groups(group_name)
    _append(g, 50, "seed")
    stop = threading.Event()
    acked: dict[int, bytes] = {}

    def writer():
        c = g.client()
        i = 0
        while not stop.is_set():
            bodies = [f"w-{i + k}".encode() for k in range(40)]
            i += 40
            try:
                results = c.append_batch(bodies, timeout_s=5)
            except LedgerError:  # unknown outcomes and refusals alike: not counted
                continue
            for r, b in zip(results, bodies, strict=True):
                acked[r.index] = b

    t = threading.Thread(target=writer)
    t.start()
    seen = []
    old = g.leader_id()
    try:
        for step in range(4):
            if step == 1:  # the leader can no longer reach the others
                g.partition({old}, set(g.members) - {old}, one_way=True)
                g.wait_for_leader(timeout_s=60, exclude=old)
            elif step == 3:
                g.heal()
            df, read = committed_read(spark, group_name)
            rows = _rows(df)
            after = max(s.committed_index for s in g.status().values())
            assert [r[0] for r in rows] == list(range(read.count))
            assert read.committed_index <= after
            seen.append(rows)
    finally:
        stop.set()
        t.join()
        g.heal()
    g.wait_for_leader(timeout_s=60)
    wait_until(lambda: g.status()[old].committed_index >= read.committed_index, 60, "catch-up")
    final = {r[0]: r for r in _log(g, 1 << 40)}
    for rows in seen:  # every row read was (and stays) the committed entry at its index
        assert all(final[r[0]] == r for r in rows)
    assert len(seen[-1]) > len(seen[0])


def test_entries_beyond_the_committed_index_are_never_returned(spark, groups, group_name):
    g = groups(group_name)
    _append(g, 20, "ok")
    for attempt in range(3):  # until the cut-off leader stored its batch before stepping down
        old = g.wait_for_leader(timeout_s=30)
        g.partition({old}, set(g.members) - {old})
        # Straight to the cut-off leader: it stores the batch in its files, no quorum acks it.
        orphans = [b"orphan-%d-%d" % (attempt, i) for i in range(30)]
        ref = g.handle(old).append.remote(orphans, group_name, old)
        g.wait_for_leader(timeout_s=30, exclude=old)
        ray.wait([ref], timeout=10)
        st = g.status()
        committed = max(s.committed_index for s in st.values())
        if st[old].ledger_end_index > st[old].committed_index:
            break
        g.heal()  # it stepped down before storing the batch: nothing uncommitted to hide yet
    else:
        pytest.fail("the cut-off leader never stored a batch in 3 tries")
    df, read = committed_read(spark, group_name)
    bodies = [r[3] for r in _rows(df)]
    assert len(bodies) == read.count and read.committed_index >= committed
    assert not any(b.startswith(b"orphan") for b in bodies)
    g.heal()


def test_incremental_runs_neither_skip_nor_repeat(spark, groups, group_name, tmp_path):
    g = groups(group_name)
    cp = ConsumerCheckpoint(tmp_path / "offsets" / "pipeline.json", group=group_name)
    seen: list[int] = []
    _append(g, 120, "r1")
    with consume(spark, group_name, cp) as batch:
        seen += [r["index"] for r in batch.df.select("index").collect()]
    assert cp.next_index == batch.stop == len(seen)

    _append(g, 80, "r2")
    failed = read_new(spark, group_name, cp)  # processed but never committed: read again next run
    assert failed.start == len(seen) and failed.count > 0
    with pytest.raises(RuntimeError), consume(spark, group_name, cp) as batch:
        raise RuntimeError("pipeline crashed")
    assert cp.next_index == len(seen)

    for _ in range(2):
        with consume(spark, group_name, cp, max_entries=60) as batch:
            seen += [r["index"] for r in batch.df.select("index").collect()]
    nothing = read_new(spark, group_name, cp, max_entries=10**9)
    seen += [r["index"] for r in nothing.df.select("index").collect()]
    nothing.commit()
    committed = max(s.committed_index for s in g.status().values())
    assert sorted(seen) == seen == list(range(len(seen)))
    assert len(seen) >= 201 and seen[-1] <= committed
    empty = read_new(spark, group_name, cp)
    empty.commit()
    assert cp.next_index >= len(seen)


def test_export_to_parquet_resumes(spark, groups, group_name, tmp_path):
    g = groups(group_name)
    _append(g, 150, "e")
    out = tmp_path / "export"
    r1 = export(spark, group_name, out, chunk_entries=70, progress=False)
    assert r1["from"] == 0 and r1["entries"] == r1["committed_index"] + 1
    acked_f = _append(g, 60, "f")
    # a chunk left by a run that died between its rename and the checkpoint commit
    stray = out / f"part-{r1['to']:020d}-{r1['to'] + 5:020d}"
    stray.mkdir()
    r2 = export(spark, group_name, out, chunk_entries=1000, progress=False)
    assert r2["from"] == r1["to"] and not stray.exists()
    t = pads.dataset(str(out), format="parquet").to_table().sort_by("index")
    assert t.column("index").to_pylist() == list(range(r2["to"]))
    exported = list(
        zip(*(t.column(c).to_pylist() for c in ("index", "term", "pos", "body")), strict=True)
    )
    assert exported == _log(g, r2["to"])
    assert acked_f and all(r1["to"] <= i < r2["to"] for i in acked_f)
    assert (out / CHECKPOINT_FILE).exists() and len(chunks_in(out)) >= 4
    # the CLI entry point, with --from inside a chunk refused
    args = argparse.Namespace(group=group_name, out=str(out), start=5, address=None, timeout=30.0)
    with pytest.raises(Exception, match="falls inside"):
        export(spark, group_name, out, start=5, progress=False)
    args.start = None
    assert export_main(args) == 0  # nothing new: resumes at the end


def test_offline_directory_is_bounded_by_its_checkpoint(spark, tmp_path):
    from rayledger.storage import FileStore, StoreConfig

    path = build_log(tmp_path / "g" / "n0", 3000)
    store = FileStore(StoreConfig(data_dir=str(path), data_segment_size=64 << 20))
    store.append_as_leader([b"uncommitted"] * 5, 2)  # on disk, never committed
    store.close()
    t0 = time.perf_counter()
    df = committed_dataframe(spark, path)
    assert df.count() == 3000
    assert df.filter(df.term == 2).count() == 0
    assert time.perf_counter() - t0 < 60


def test_rocketmq_topics_as_dataframes(spark, ray_session, tmp_path, group_name):
    """A topic's committed messages, decoded, bounded by the committed index."""
    from rayledger.integration.rocketmq import CommitLog
    from rayledger.integration.rocketmq.spark import messages_dataframe

    log = CommitLog.create(group_name, 3, str(tmp_path / "mq"), LedgerConfig.fast())
    try:
        for i in range(12):
            r = log.put_message("T" if i % 3 else "U", i % 2, b"m%d" % i, tags="t", keys=f"k{i}")
            assert r.ok
        df = messages_dataframe(spark, group_name, topic="T")
        rows = sorted(df.collect(), key=lambda r: r["index"])
        assert [bytes(r["body"]) for r in rows] == [b"m%d" % i for i in range(12) if i % 3]
        assert {r["topic"] for r in rows} == {"T"} and rows[0]["tags"] == "t"
        assert rows[0]["properties"]["KEYS"] == rows[0]["keys"]
        for r in rows:
            m = log.get_message(r["phys_offset"])
            assert (
                m is not None and m.body == bytes(r["body"]) and m.queue_offset == r["queue_offset"]
            )
        assert messages_dataframe(spark, group_name).count() == 12
        assert (
            messages_dataframe(spark, group_name, start=rows[-1]["index"] + 1, topic="T").count()
            == 0
        )
    finally:
        log.group.shutdown(delete_data=True)
