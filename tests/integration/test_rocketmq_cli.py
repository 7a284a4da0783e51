"""`rayledger mq` against a commit-log group on a running Ray cluster.  A few calls run the
CLI in a subprocess, as a user runs it (exit codes, quiet output, no traceback); the rest
call its ``main`` in this process, attached to the same cluster (each process start costs
seconds here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import ray
from rayledger.actors import LedgerGroup

pytestmark = pytest.mark.ray


def mq_process(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayledger.integration.cli", "mq", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(out: subprocess.CompletedProcess) -> list[dict]:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [json.loads(x) for x in out.stdout.strip().splitlines()]


@pytest.fixture
def mq_here(capsys):
    """`rayledger mq ...` through the CLI's main in this process: (exit code, JSON rows or
    stderr)."""
    from rayledger.integration.cli.main import main

    def run(*args: str):
        capsys.readouterr()
        code = main(["mq", *args, "--verbose"])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["mq", *args], code, out.out, out.err)

    return run


def test_mq_produce_consume_topics_query_stats(ray_session, group_name, tmp_path, mq_here):
    g = ["--group", group_name, "--address", ray.get_runtime_context().gcs_address]
    started = rows(mq_process("start", *g, "--store-dir", str(tmp_path), "--fast"))[0]
    try:
        assert started["leader"] in started["members"]
        put = rows(
            mq_here("produce", *g, "-t", "Orders", "a", "b", "--keys", "k1 k2", "--tags", "x")
        )
        assert [r["queue_offset"] for r in put] == [0, 1] and all(r["msg_id"] for r in put)
        assert {r["status"] for r in put} == {"PUT_OK"}
        put = rows(
            mq_here("produce", *g, "-t", "Orders", "-q", "1", "--count", "40", "--size", "16")
        )
        assert [r["queue_offset"] for r in put] == list(range(40))

        got = rows(mq_here("consume", *g, "-t", "Orders", "-q", "0"))
        assert [(r["offset"], r["body"], r["keys"]) for r in got] == [(0, "a", "k1 k2"),
                                                                       (1, "b", "k1 k2")]  # fmt: skip
        assert len(rows(mq_here("consume", *g, "-t", "Orders"))) == 42  # every queue
        # a consumer group starts from its committed offset and commits as it goes
        first = rows(mq_here("consume", *g, "-t", "Orders", "-q", "1", "--max", "15",
                        "--consumer-group", "cg"))  # fmt: skip
        rest = rows(mq_here("consume", *g, "-t", "Orders", "-q", "1", "--consumer-group", "cg"))
        assert [r["offset"] for r in first + rest] == list(range(40))
        # --follow with --max stops once it has seen that many
        assert len(rows(mq_here("consume", *g, "-t", "Orders", "--follow", "--max", "3"))) == 3

        topics = rows(mq_here("topics", *g))
        assert topics == [{"topic": "Orders", "queue": 0, "max_offset": 2},
                          {"topic": "Orders", "queue": 1, "max_offset": 40}]  # fmt: skip
        found = rows(mq_here("query", *g, "-t", "Orders", "-k", "k2"))
        assert [r["body"] for r in found] == ["a", "b"]
        stats = rows(mq_here("stats", *g))[0]
        assert stats["messages"] == 42 and stats["leader"] in started["members"]
        assert stats["consumer_groups"] == [
            {"consumer_group": "cg", "topic": "Orders", "queue": 1, "offset": 40, "lag": 0}
        ]

        # errors: RocketMQ's status or DLedger's code, a next step, nothing stored
        bad = mq_process("produce", *g, "-t", "", "x")
        assert bad.returncode == 2 and "MESSAGE_ILLEGAL" in bad.stderr
        assert "Traceback" not in bad.stderr
        bad = mq_here("produce", *g, "-t", "Orders")
        assert bad.returncode == 2 and "UNEXPECTED_ARGUMENT" in bad.stderr
        bad = mq_here("topics", "--group", "no-such-group", *g[2:])
        assert bad.returncode == 2 and "UNKNOWN_GROUP" in bad.stderr
        assert rows(mq_here("topics", *g)) == topics  # nothing stored by the refusals
    finally:
        LedgerGroup.get(group_name).shutdown(delete_data=True)


def test_mq_refuses_a_group_without_the_commit_log(ray_session, group_name):
    address = ray.get_runtime_context().gcs_address
    g = LedgerGroup.create(group_name, 3)
    try:
        out = mq_process("topics", "--group", group_name, "--address", address)
        assert out.returncode == 2 and "does not run the RocketMQ commit log" in out.stderr
        assert "mq start" in out.stderr and "Traceback" not in out.stderr
    finally:
        g.shutdown()
