"""The `rayledger` command line against a group on a running Ray cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import ray
from rayledger.actors import LedgerGroup

pytestmark = pytest.mark.ray


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayledger.integration.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_many(*calls: list[str], timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Several commands, each its own process, run side by side (a start costs seconds)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "rayledger.integration.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in calls
    ]
    done = []
    for args, p in zip(calls, procs, strict=True):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        done.append(subprocess.CompletedProcess(list(args), p.returncode, out, err))
    return done


@pytest.fixture
def cli_here(capsys):
    """A command through the CLI's main in this process, attached to the test's cluster (a
    process start costs seconds here; the tests that check the process itself use cli)."""
    from rayledger.integration.cli.main import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main([*args, "--verbose"])
        except SystemExit as exc:  # --help and argparse errors
            code = exc.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def test_start_status_append_get_transfer(ray_session, group_name, tmp_path):
    address = ray.get_runtime_context().gcs_address
    g = ["--group", group_name, "--address", address]
    try:
        out = cli("start", *g, "--members", "3", "--store-dir", str(tmp_path), "--fast")
        assert out.returncode == 0, out.stderr[-2000:]
        started = json.loads(out.stdout.strip().splitlines()[-1])
        assert started["members"] == ["n0", "n1", "n2"] and started["leader"] in started["members"]

        out = cli("append", *g, "hello", "world")
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [json.loads(x) for x in out.stdout.strip().splitlines()]
        assert [r["index"] for r in rows] == [rows[0]["index"], rows[0]["index"] + 1]

        out = cli("get", *g, str(rows[0]["index"]), "--count", "2")
        assert out.returncode == 0, out.stderr[-2000:]
        got = [json.loads(x)["body"] for x in out.stdout.strip().splitlines()]
        assert got == ["hello", "world"]

        out = cli("status", *g, "--json")
        assert out.returncode == 0, out.stderr[-2000:]
        status = json.loads(out.stdout)
        assert sorted(r["member"] for r in status) == ["n0", "n1", "n2"]
        leader = next(r["member"] for r in status if r["role"] == "LEADER")

        target = next(m for m in ["n0", "n1", "n2"] if m != leader)
        out = cli("transfer", *g, target)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout)["leader"] == target

        # errors: one clear line, non-zero exit
        out = cli("get", "--group", "no-such-group", "--address", address, "0")
        assert out.returncode != 0 and "UNKNOWN_GROUP" in out.stderr
        out = cli("start", *g, "--members", "3")
        assert out.returncode != 0 and "already exists" in out.stderr
    finally:
        try:
            LedgerGroup.get(group_name).shutdown(delete_data=True)
        except Exception:
            pass


def _json_lines(out: subprocess.CompletedProcess) -> list:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [json.loads(x) for x in out.stdout.strip().splitlines()]


def _error(out: subprocess.CompletedProcess, code: str) -> str:
    """An expected error: non-zero exit, the code and a next step on stderr, no traceback."""
    assert out.returncode != 0, out.stdout[-2000:]
    assert code in out.stderr and "; " in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr + out.stdout
    return out.stderr


def _leader(g: list[str], run=cli, timeout_s: float = 60) -> str:
    """The leader as `status --json` reports it, waiting out an election (fast timers on a
    loaded machine re-elect now and then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = _json_lines(run("status", *g, "--json"))[0]
        leader = next((r["member"] for r in status if r["role"] == "LEADER"), None)
        if leader or time.monotonic() > deadline:
            assert leader, status
            return leader
        time.sleep(0.5)


def test_operating_commands(ray_session, group_name, tmp_path, cli_here):
    address = ray.get_runtime_context().gcs_address
    g = ["--group", group_name, "--address", address]
    out = cli("start", *g, "--members", "3", "--store-dir", str(tmp_path), "--fast")
    assert out.returncode == 0, out.stderr[-2000:]
    try:
        bodies = [f"e{i}" for i in range(5)]
        appended = _json_lines(cli_here("append", *g, *bodies))
        first = appended[0]["index"]

        # tail: committed entries from --from, as JSON lines; --follow stops at --max
        rows = _json_lines(cli_here("tail", *g, "--from", str(first), "--json"))
        assert [r["body"] for r in rows[:5]] == bodies and rows[0]["index"] == first
        assert all(r["body"] == "" for r in rows[5:])  # a new leader's empty entry, if any
        # each new command once as a process of its own: tail --follow, status --watch, list
        follow, watch, listed = cli_many(
            ["tail", *g, "--from", str(first + 3), "--follow", "--max", "2", "--json"],
            ["status", *g, "--watch", "--json", "--count", "2", "--interval", "0.2"],
            ["list", "--address", address, "--json"],
        )
        assert [r["body"] for r in _json_lines(follow)] == ["e3", "e4"]
        assert group_name in [r["group"] for r in _json_lines(listed)[0]]

        # status --watch: one JSON object per refresh, with lag and the append rate
        snaps = _json_lines(watch)
        assert len(snaps) == 2 and all(len(s["members"]) == 3 for s in snaps)
        assert {"role", "term", "end", "committed", "lag", "alive"} <= set(snaps[0]["members"][0])
        assert snaps[1]["append_rate"] is not None
        table = cli_here("status", *g, "--watch", "--count", "1")
        assert table.returncode == 0 and "LEADER" in table.stdout and "lag" in table.stdout

        listed = _json_lines(cli_here("list", "--address", address, "--json"))[0]
        mine = next(r for r in listed if r["group"] == group_name)
        assert mine["members"] == 3 and mine["alive"] == 3 and "leader" in mine

        # fault: pause and resume a follower, partition and heal, kill the leader
        leader = _leader(g, cli_here)
        follower = next(m for m in ["n0", "n1", "n2"] if m != leader)
        assert _json_lines(cli("fault", "pause", *g, follower))[0]["member"] == follower
        status = _json_lines(cli_here("status", *g, "--json"))[0]
        assert not next(r for r in status if r["member"] == follower)["alive"]
        _json_lines(cli_here("fault", "resume", *g, follower))
        status = _json_lines(cli_here("status", *g, "--json"))[0]
        assert next(r for r in status if r["member"] == follower)["alive"]
        others = ",".join(m for m in ["n0", "n1", "n2"] if m != leader)
        assert _json_lines(cli_here("fault", "partition", *g, leader, others))[0]["sides"]
        _json_lines(cli_here("fault", "heal", *g))
        killed = _json_lines(cli_here("fault", "kill", *g, "leader"))[0]
        assert killed["member"] in ["n0", "n1", "n2"]
        deadline = time.monotonic() + 60
        while True:  # right after the kill an append may reach the restarting member
            out = cli_here("append", *g, "after-kill")
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            assert any(c in out.stderr for c in ("OUTCOME_UNKNOWN", "NOT_LEADER", "NOT_READY"))
            time.sleep(0.5)
        assert _json_lines(out)[0]["index"] > appended[-1]["index"]

        out = _json_lines(cli("stop", *g, "--delete-data"))[0]
        assert out["stopped"] and not (tmp_path / group_name).exists()
        listed = _json_lines(cli_here("list", "--address", address, "--json"))[0]
        assert group_name not in [r["group"] for r in listed]
    finally:
        try:
            LedgerGroup.get(group_name).shutdown(delete_data=True)
        except Exception:
            pass


def test_operating_commands_bad_input(ray_session, group_name, tmp_path, cli_here):
    address = ray.get_runtime_context().gcs_address
    nog = ["--group", "no-such-group", "--address", address]
    for cmd in (["status"], ["stop"], ["fault", "heal"], ["status", "--watch"]):
        _error(cli_here(*cmd, *nog), "UNKNOWN_GROUP")
    # no cluster (a fresh process each: in this one Ray is already attached), and an unknown
    # group once as a process too
    nowhere = ["--group", group_name, "--address", "127.0.0.1:1"]
    cmds = (["status"], ["tail"], ["stop"], ["fault", "kill"])
    *unreachable, no_list, no_group = cli_many(
        *([*cmd, *nowhere] for cmd in cmds),
        ["list", "--address", "127.0.0.1:1"],
        ["tail", *nog],
    )
    for out in [*unreachable, no_list]:
        _error(out, "NETWORK_ERROR")
    _error(no_group, "UNKNOWN_GROUP")

    g = ["--group", group_name, "--address", address]
    out = cli_here("start", *g, "--members", "3", "--fast")
    assert out.returncode == 0, out.stderr[-2000:]
    try:
        _error(cli_here("tail", *g, "--from", "-1"), "UNEXPECTED_ARGUMENT")
        _error(cli("tail", *g, "--from", "1000000"), "INDEX_OUT_OF_BOUNDS")  # as a process
        _error(cli_here("get", *g, "1000000"), "INDEX_OUT_OF_BOUNDS")
        _error(cli_here("fault", "kill", *g, "n9"), "UNKNOWN_MEMBER")
        _error(cli_here("fault", "partition", *g, "n0"), "UNEXPECTED_ARGUMENT")
        _error(cli_here("status", *g, "--watch", "--interval", "0"), "UNEXPECTED_ARGUMENT")
    finally:
        LedgerGroup.get(group_name).shutdown(delete_data=True)


def test_help_for_every_subcommand(cli_here):
    subs = ["demo", "start", "status", "append", "get", "transfer", "export", "bench"]
    for sub in subs + ["tail", "stop", "list", "fault", "mq"]:
        out = cli_here(sub, "--help")
        assert out.returncode == 0 and "usage" in out.stdout, sub
    out = cli("mq", "produce", "--help", timeout=60)  # and once as a process
    assert out.returncode == 0 and "usage" in out.stdout
