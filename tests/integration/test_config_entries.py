"""A group's configuration entries (membership changes, on their own header channel) are
never handed to a reader as a client's data.  Each reader treats them the way
it treats a term's empty first entry: ``LedgerClient.read/get`` and ``tail`` return it,
marked by its channel; Spark, Ray Data, ``export``, the RocketMQ layer and the KV watch
skip it.  One group and the session's Spark for all the Ray checks; the rest needs no Ray.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pyarrow.dataset as pads
import pytest
import ray
from rayledger.actors import LedgerConfig, LedgerGroup
from rayledger.actors.types import AppendResult
from rayledger.election.configuration import CONFIG_CHANNEL, Configuration
from rayledger.integration.cli.ops import CONFIG_MARK, _entry_line
from rayledger.integration.kv import KVClient, put_command, set_command
from rayledger.integration.rocketmq.client import CommitLog
from rayledger.integration.rocketmq.message import Message, encode
from rayledger.integration.spark import committed_read
from rayledger.integration.spark.export import export
from rayledger.integration.spark.reader import _read_actors
from rayledger.replication import ReplicationConfig
from rayledger.storage import Entry

DOC = Configuration.of(["n0", "n1", "n2"], ["l1"]).encode()


def test_tail_prints_a_configuration_entry_marked():
    client = Entry(4, 2, 400, b"hello")
    empty = Entry(5, 3, 500, b"")
    conf = Entry(6, 3, 548, DOC, CONFIG_CHANNEL)
    lines = [json.loads(_entry_line(e, True)) for e in (client, empty, conf)]
    assert [(x["index"], x["body"], x["channel"]) for x in lines] == [
        (4, "hello", 0), (5, "", 0), (6, DOC.decode(), CONFIG_CHANNEL)]  # fmt: skip
    assert _entry_line(client, False) == "4\t2\thello"
    assert _entry_line(empty, False) == "5\t3\t"
    assert _entry_line(conf, False) == f"6\t3\t{CONFIG_MARK}{DOC.decode()}"


class _Log:
    """A LedgerClient stand-in over a fixed committed log."""

    def __init__(self, entries: list[Entry]):
        self.entries = entries

    def committed_index(self, *a, **kw) -> int:
        return self.entries[-1].index

    def read(self, start: int, stop: int, consistency: str = "linearizable") -> list[Entry]:
        return [e for e in self.entries if start <= e.index < stop]


def test_kv_watch_skips_a_configuration_entry():
    kv = KVClient.__new__(KVClient)
    # a configuration entry whose body would read as a command: its channel alone says no
    kv.client = _Log([Entry(0, 1, 0, b""), Entry(1, 1, 48, set_command("k", 1), CONFIG_CHANNEL),
                      Entry(2, 1, 120, put_command("k", b"v"))])  # fmt: skip
    (change,) = itertools.islice(kv.watch(), 1)
    assert (change.revision, change.op, change.key, change.value) == (2, "put", "k", b"v")


def test_rocketmq_put_reads_back_only_its_own_entries():
    """No receipt: the producer reads its messages back, and a configuration entry between
    two of them (a batch sent in two calls) is not taken for one."""
    ms = [Message("T", b"m0"), Message("T", b"m1")]
    stored = [encode(replace(m, queue_offset=7 + k)) for k, m in enumerate(ms)]

    class Client(_Log):
        def append_batch(self, bodies):
            return [AppendResult(4, 1, 400), AppendResult(6, 1, 600)]

    log = CommitLog.__new__(CommitLog)
    log.client = Client([Entry(4, 1, 400, stored[0]), Entry(5, 1, 500, DOC, CONFIG_CHANNEL),
                         Entry(6, 1, 600, stored[1])])  # fmt: skip
    assert [r.queue_offset for r in log._put(ms)] == [7, 8]


@pytest.mark.ray
@pytest.mark.spark
def test_readers_of_a_log_holding_a_configuration_entry(spark, tmp_path, group_name, capsys):
    from rayledger.integration.cli.main import main

    # calm timers and patient quorum waits: the machine may be loaded while Spark runs, and
    # this test is about readers, not elections
    config = LedgerConfig.fast(
        heartbeat_interval_ms=400, replication=ReplicationConfig(max_wait_ack_time_ms=10_000)
    )
    g = LedgerGroup.create(group_name, 3, store_dir=str(tmp_path / "store"), config=config)
    try:
        g.wait_for_leader(timeout_s=30)
        c = g.client()
        c.append_batch([b"a%d" % i for i in range(5)])
        learner = g.add_member("l1", learner=True)  # the leader writes a configuration entry
        c.append_batch([b"b%d" % i for i in range(5)])
        end = c.committed_index()

        # LedgerClient.read/get: every entry, a configuration told by its channel
        log = c.read(0, end + 1)
        assert [e.index for e in log] == list(range(end + 1))
        confs = [e for e in log if e.channel == CONFIG_CHANNEL]
        assert confs and learner in Configuration.decode(confs[-1].body).learners
        assert all(e.channel == 0 for e in log if e not in confs)
        assert c.get(confs[0].index) == confs[0]
        clients = [(e.index, e.term, e.pos, e.body) for e in log if not e.channel]
        assert b"" in [b for *_, b in clients]  # the first leader's empty entry: a row

        # rayledger tail: every entry, the configuration marked
        address = ray.get_runtime_context().gcs_address
        for as_json in (True, False):
            capsys.readouterr()
            args = ["tail", "--group", group_name, "--address", address, "--max", str(end + 1),
                    "--verbose"]  # fmt: skip
            assert main([*args, *(["--json"] if as_json else [])]) == 0
            lines = capsys.readouterr().out.splitlines()
            assert len(lines) == end + 1
            if as_json:
                rows = [json.loads(x) for x in lines]
                assert [r["index"] for r in rows if r["channel"] == CONFIG_CHANNEL] == [
                    e.index for e in confs
                ]
            else:
                marked = [int(x.split("\t")[0]) for x in lines if CONFIG_MARK in x]
                assert marked == [e.index for e in confs]

        # Spark (file store): configuration rows left out, the index numbering the log's
        df, read = committed_read(spark, group_name, 0, end + 1)
        assert read.stop == end + 1
        rows = sorted((r["index"], r["term"], r["pos"], bytes(r["body"])) for r in df.collect())
        assert rows == clients

        # what a read task does from the members' actors (a memory store): the same rows
        handles = [g.handle(m) for m in g.members]
        tables = list(_read_actors(handles, 0, end + 1, 4, verify_crc=True))
        got = [row for t in tables for row in zip(*t.to_pydict().values(), strict=True)]
        assert got == clients

        # export: the Parquet rows are the client entries; the checkpoint counts indexes
        r = export(spark, group_name, tmp_path / "export", chunk_entries=1000, progress=False)
        assert r["entries"] == r["to"] >= end + 1
        t = pads.dataset(str(tmp_path / "export"), format="parquet").to_table().sort_by("index")
        whole = [e for e in c.read(0, r["to"]) if not e.channel]
        assert t.column("index").to_pylist() == [e.index for e in whole]
        assert t.column("body").to_pylist() == [e.body for e in whole]
    finally:
        g.shutdown(delete_data=True)
