"""`rayledger topic` and `append`/`tail --topic` against a running Ray, through the CLI's
``main`` in this process (one subprocess run checks the one-line coded error a user sees)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import ray
from rayledger.integration.topic import LedgerTopic, partition_of

pytestmark = pytest.mark.ray


@pytest.fixture
def cli(ray_session, capsys):
    """(exit code, stdout, stderr) of ``rayledger ARGS`` run through ``main`` here."""
    from rayledger.integration.cli.main import main

    address = ray.get_runtime_context().gcs_address

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main([*args, "--address", address, "--verbose"])
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def ok(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, f"{out.args}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout.splitlines()


def coded(out: subprocess.CompletedProcess, code: str) -> None:
    where = f"{out.args}\nstdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}"
    assert out.returncode == 2, where
    errors = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and f"[{code}]" in errors[0], where


def test_a_topic_from_create_to_delete(cli, group_name) -> None:
    t = group_name
    made = json.loads(ok(cli("topic", "create", "-t", t, "-p", "2", "--members", "1",
                             "--memory", "--fast"))[-1])  # fmt: skip
    try:
        assert made["groups"] == [f"{t}-p0", f"{t}-p1"] and len(made["leaders"]) == 2
        rows = [json.loads(x) for x in ok(cli("append", "--topic", t, "--key", "k1", "a", "b"))]
        assert {r["partition"] for r in rows} == {partition_of("k1", 2)}
        assert rows[1]["index"] == rows[0]["index"] + 1
        spread = [json.loads(x) for x in ok(cli("append", "-t", t, "x", "y"))]
        assert sorted(r["partition"] for r in spread) == [0, 1]
        status = json.loads(ok(cli("topic", "status", "-t", t, "--json"))[-1])
        assert [r["leader"] for r in status] == ["n0", "n0"]
        assert t in [r["topic"] for r in json.loads(ok(cli("topic", "list", "--json"))[-1])]
        tail = [json.loads(x) for x in ok(cli("tail", "--topic", t, "--json"))]
        bodies = sorted((r["partition"], r["body"]) for r in tail if r["body"])
        p = partition_of("k1", 2)
        assert (p, "a") in bodies and (p, "b") in bodies and len(bodies) == 4
        assert json.loads(ok(cli("topic", "rebalance", "-t", t))[-1])["moves"] == []
        coded(cli("append", "--topic", t, "--group", t, "z"), "UNEXPECTED_ARGUMENT")
        coded(cli("append", "--group", f"{t}-p0", "--key", "k", "z"), "UNEXPECTED_ARGUMENT")
        coded(cli("topic", "create", "-t", t, "-p", "1", "--memory"), "UNEXPECTED_ARGUMENT")
        coded(cli("topic", "create", "-t", t + "x", "-p", "0", "--memory"), "UNEXPECTED_ARGUMENT")
        assert ok(cli("topic", "delete", "-t", t))
        assert t not in LedgerTopic.list()
        coded(cli("topic", "status", "-t", t), "UNKNOWN_GROUP")
    finally:
        if t in LedgerTopic.list():
            LedgerTopic.get(t).delete(delete_data=True)


def test_an_unknown_topic_is_one_coded_line(ray_session) -> None:
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "-m", "rayledger.integration.cli", "topic", "status", "-t", "nope-t",
         "--address", address],  # fmt: skip
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "[UNKNOWN_GROUP]" in lines[0] and "Traceback" not in out.stderr
