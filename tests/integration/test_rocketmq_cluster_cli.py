"""`rayledger mq cluster ...` and `mq produce|consume --cluster` against broker clusters on the
session's Ray, through the CLI's ``main`` in this process (a process start costs seconds)."""

from __future__ import annotations

import io
import json
import subprocess
from contextlib import redirect_stderr, redirect_stdout

import pytest
import ray
from rayledger.actors.naming import group_members
from rayledger.integration.rocketmq import BrokerCluster
from rayledger.integration.topic import partition_of

pytestmark = pytest.mark.ray


def mq_here(*args: str) -> subprocess.CompletedProcess:
    """(exit code, stdout, stderr) of ``rayledger mq ARGS`` through the CLI's ``main`` in this
    process (a process start costs seconds here); --help's and argparse's exits count too."""
    from rayledger.integration.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["mq", *args, "--verbose"])
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(["mq", *args], code, out.getvalue(), err.getvalue())


def ok(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, f"{out.args}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout.splitlines()


def rows(out: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(x) for x in ok(out) if x.startswith("{")]


def coded(out: subprocess.CompletedProcess, code: str) -> None:
    where = f"{out.args}\nstdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}"
    assert out.returncode == 2 and not out.stdout.strip(), where
    errors = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and f"[{code}]" in errors[0], where


def test_a_broker_cluster_from_create_to_delete(ray_session, group_name, tmp_path):
    address = ray.get_runtime_context().gcs_address

    def mq(*args: str) -> subprocess.CompletedProcess:
        return mq_here(*args, "--address", address)

    name = group_name
    made = rows(mq("cluster", "create", name, "--brokers", "2", "--members", "1",
                   "--queues", "2", "--store-dir", str(tmp_path), "--fast"))[-1]  # fmt: skip
    try:
        brokers = [f"{name}-b0", f"{name}-b1"]
        assert made["brokers"] == brokers and made["leaders"] == dict.fromkeys(brokers, "n0")
        listed = json.loads(ok(mq("cluster", "list", "--json"))[-1])
        assert {"cluster": name, "brokers": 2, "led": 2, "members": 1,
                "queues_per_broker": 2} in listed  # fmt: skip
        status = json.loads(ok(mq("cluster", "status", name, "--json"))[-1])
        assert [(r["broker"], r["leader"]) for r in status] == [(b, "n0") for b in brokers]
        assert all(r["term"] >= 0 and r["committed_index"] >= 0 for r in status), status
        table = "".join(ok(mq("cluster", "status", name)))
        assert "committed_index" in table and table.count("n0") == 2

        # round robin: one message to each of the four queues; a sharding key: one queue
        sent = rows(mq("produce", "--cluster", name, "-t", "Orders", "a", "b", "c", "d"))
        assert sorted((r["broker"], r["queue_id"]) for r in sent) == [
            (b, q) for b in brokers for q in (0, 1)
        ]
        assert {r["queue_offset"] for r in sent} == {0} and len({r["msg_id"] for r in sent}) == 4
        keyed = rows(mq("produce", "-c", name, "-t", "Orders", "--sharding-key", "k1", "e", "f"))
        p = partition_of("k1", 4)
        assert [(r["broker"], r["queue_id"], r["queue_offset"]) for r in keyed] == [
            (brokers[p // 2], p % 2, 1), (brokers[p // 2], p % 2, 2)
        ]  # fmt: skip

        # a consumer group cut short by --max goes on from where it stopped: each once
        cg = ["consume", "--cluster", name, "-t", "Orders", "--consumer-group", "cg"]
        first, rest = rows(mq(*cg, "--max", "3")), rows(mq(*cg))
        assert len(first) == 3 and sorted(r["body"] for r in first + rest) == list("abcdef")
        assert rows(mq(*cg)) == []
        every = rows(mq("consume", "--cluster", name, "-t", "Orders"))
        assert {(r["broker"], r["queue"], r["offset"]) for r in every} == {
            (r["broker"], r["queue_id"], r["queue_offset"]) for r in sent + keyed
        }

        # bad input: one coded line, nothing created or sent
        coded(mq("produce", "--cluster", name, "--group", brokers[0], "-t", "Orders", "x"),
              "UNEXPECTED_ARGUMENT")  # fmt: skip
        coded(mq("consume", "--cluster", name, "-t", "Orders", "-q", "0"), "UNEXPECTED_ARGUMENT")
        coded(mq("produce", "--cluster", "no-such-cluster", "-t", "Orders", "x"), "UNKNOWN_GROUP")
        coded(mq("cluster", "status", "no-such-cluster"), "UNKNOWN_GROUP")
        coded(mq("cluster", "create", name, "--brokers", "1", "--members", "1", "--memory"),
              "UNEXPECTED_ARGUMENT")  # fmt: skip
        coded(mq("cluster", "create", name + "-z", "--brokers", "0", "--memory"),
              "UNEXPECTED_ARGUMENT")  # fmt: skip
        assert BrokerCluster.list().count(name) == 1 and name + "-z" not in BrokerCluster.list()
        assert not group_members(f"{name}-z-b0")
        assert len(rows(mq("consume", "--cluster", name, "-t", "Orders"))) == 6

        done = rows(mq("cluster", "delete", name, "--delete-data"))[-1]
        assert done == {"cluster": name, "deleted": True, "deleted_data": True}
        assert name not in BrokerCluster.list() and not any(group_members(b) for b in brokers)
        coded(mq("cluster", "delete", name), "UNKNOWN_GROUP")
    finally:
        if name in BrokerCluster.list():
            BrokerCluster.get(name).delete(delete_data=True)


def test_help_for_every_mq_cluster_subcommand():
    for sub in (["cluster"], *(["cluster", c] for c in ("create", "list", "status", "delete"))):
        out = mq_here(*sub, "--help")
        assert out.returncode == 0 and f"usage: rayledger mq {' '.join(sub)}" in out.stdout, sub
    for sub in ("produce", "consume"):
        assert "--cluster" in mq_here(sub, "--help").stdout, sub
