"""A topic read as one dataset: every partition's committed entries with a ``partition``
column, through Ray Data and through Spark (RayDP), and incremental reads that keep one
checkpoint per partition."""

from __future__ import annotations

import pytest
from rayledger.actors import LedgerConfig, LedgerError, ResponseCode
from rayledger.integration.spark import topic_dataframe, topic_dataset
from rayledger.integration.topic import LedgerTopic


@pytest.fixture
def topic(ray_session, group_name):
    t = LedgerTopic.create(group_name, partitions=3, members=1, config=LedgerConfig.fast())
    try:
        t.wait_for_leaders(60)
        yield t
    finally:
        t.delete(delete_data=True)


def _append(topic, keys: list[str], tag: str) -> set[tuple[int, int, bytes]]:
    c = topic.client()
    try:
        rs = c.append_batch([f"{tag}{k}".encode() for k in keys], keys)
        return {(r.partition, r.index, f"{tag}{k}".encode()) for r, k in zip(rs, keys, strict=True)}
    finally:
        c.close()


def _rows(read) -> set[tuple[int, int, bytes]]:
    rows = read.dataset.take_all() if read.dataset is not None else []
    return {(r["partition"], r["index"], bytes(r["body"])) for r in rows if r["body"]}


def test_every_partition_reads_as_one_dataset_and_resumes(topic) -> None:
    first = _append(topic, [f"k{i}" for i in range(30)], "a-")
    assert len({p for p, _, _ in first}) == 3  # the keys reach every partition
    read = topic_dataset(topic.name)
    assert _rows(read) == first
    assert set(read.reads) == {0, 1, 2}
    more = _append(topic, [f"k{i}" for i in range(6)], "b-")
    again = topic_dataset(topic.name, start=read.next_start())
    assert _rows(again) == more  # only what committed since, in each partition
    assert topic_dataset(topic.name, start=again.next_start()).dataset is None
    with pytest.raises(LedgerError) as e:
        topic_dataset(topic.name, start={7: 0})
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    with pytest.raises(LedgerError) as e:
        topic_dataset(topic.name + "-none")
    assert e.value.code == ResponseCode.UNKNOWN_GROUP


def test_spark_reads_a_topic_with_a_partition_column(topic, spark) -> None:
    appended = _append(topic, [f"k{i}" for i in range(40)], "s-")
    df = topic_dataframe(spark, topic.name)
    assert df.columns == ["partition", "index", "term", "pos", "body"]
    rows = {(r["partition"], r["index"], bytes(r["body"])) for r in df.collect() if r["body"]}
    assert rows == appended
    per = {
        r["partition"]: r["count"]
        for r in df.where("length(body) > 0").groupBy("partition").count().collect()
    }
    assert per == {p: sum(1 for q, _, _ in appended if q == p) for p in range(3)}


def test_a_topic_exports_to_parquet_per_partition_and_resumes(topic, spark, tmp_path) -> None:
    from rayledger.integration.spark.export import export_topic

    first = _append(topic, [f"k{i}" for i in range(24)], "e-")
    out = tmp_path / "export"
    r = export_topic(spark, topic.name, out, progress=False)
    assert [p["group"] for p in r["partitions"]] == topic.groups
    assert sorted(d.name for d in out.iterdir()) == ["partition-0", "partition-1", "partition-2"]

    def exported() -> set[tuple[int, int, bytes]]:
        df = spark.read.parquet(f"{out}/partition-*/part-*")
        assert df.columns[0] == "partition"
        return {(x["partition"], x["index"], bytes(x["body"])) for x in df.collect() if x["body"]}

    assert exported() == first
    more = _append(topic, [f"k{i}" for i in range(6)], "f-")
    again = export_topic(spark, topic.name, out, progress=False)  # resumes each partition
    assert again["entries"] >= len(more)  # log indexes: a new term's first entry counts too
    assert exported() == first | more  # nothing twice, nothing skipped
