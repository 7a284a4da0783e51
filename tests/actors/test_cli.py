"""The `rayledger` command line against a group on a running Ray cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
from rayledger.actors import LedgerGroup

pytestmark = pytest.mark.ray


def cli(
    *args: str, timeout: float = 120, env: dict | None = None, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """One command as a process of its own (``prefix`` runs it under another program)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "rayledger.integration.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def cli_many(*calls: Sequence[str], workers: int = 4, **kw) -> list[subprocess.CompletedProcess]:
    """Several commands, each its own process, ``workers`` at a time (a process start costs
    seconds here); the results in the order of ``calls``."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda args: cli(*args, **kw), calls))


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
    """An expected error: exit 2, ``[CODE]`` and a next step on stderr, no traceback."""
    where = f"{out.args}\nstdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}"
    assert out.returncode == 2, where
    line = next((x for x in out.stderr.splitlines() if x.startswith("error: ")), "")
    assert f"[{code}]" in line and "; " in line, where  # the code, then what to do next
    assert "Traceback" not in out.stderr + out.stdout, where
    return line


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


def _alive(g: list[str], member: str, run) -> bool:
    status = _json_lines(run("status", *g, "--json"))[0]
    return next(r for r in status if r["member"] == member)["alive"]


def test_operating_commands(ray_session, group_name, tmp_path, cli_here):
    """Each operating command's happy path against the session's Ray: the group started by a
    process of its own, the commands through the CLI's main in this process (test_start_...
    runs every command of the first set as a process)."""
    address = ray.get_runtime_context().gcs_address
    g = ["--group", group_name, "--address", address]
    out = cli("start", *g, "--members", "3", "--store-dir", str(tmp_path), "--fast")
    assert out.returncode == 0, out.stderr[-2000:]
    try:
        bodies = [f"e{i}" for i in range(5)]
        appended = _json_lines(cli_here("append", *g, *bodies))
        first = appended[0]["index"]

        # tail (JSON and text), tail --follow, status --watch (JSON and table), list
        tail, text, follow, watch, table, listed = (
            cli_here(*args)
            for args in (
                ["tail", *g, "--from", str(first), "--json"],
                ["tail", *g, "--from", str(first), "--max", "2"],
                ["tail", *g, "--from", str(first + 3), "--follow", "--max", "2", "--json"],
                ["status", *g, "--watch", "--json", "--count", "4", "--interval", "0.2"],
                ["status", *g, "--watch", "--count", "1"],
                ["list", "--address", address, "--json"],
            )
        )
        rows = _json_lines(tail)
        assert [r["body"] for r in rows[:5]] == bodies and rows[0]["index"] == first
        assert all(r["body"] == "" for r in rows[5:])  # a new leader's empty entry, if any
        assert rows[0]["encoding"] == "utf-8"
        assert text.returncode == 0 and text.stdout.splitlines()[1].split("\t")[::2] == [
            str(first + 1),
            "e1",
        ], text.stdout
        assert [r["body"] for r in _json_lines(follow)] == ["e3", "e4"]

        # status --watch: one JSON object per refresh, with lag and the append rate
        snaps = _json_lines(watch)
        assert len(snaps) == 4 and all(len(s["members"]) == 3 for s in snaps)
        assert {"role", "term", "end", "committed", "lag", "alive"} <= set(snaps[0]["members"][0])
        # a rate once a leader was seen twice (fast timers on a loaded machine: an election
        # or a late answer may hide the leader from one refresh)
        assert any(s["append_rate"] is not None for s in snaps[1:]), snaps
        assert table.returncode == 0, table.stderr[-2000:]
        assert "LEADER" in table.stdout and "lag" in table.stdout and not table.stderr

        mine = next(r for r in _json_lines(listed)[0] if r["group"] == group_name)
        assert mine["members"] == 3 and mine["alive"] == 3 and "leader" in mine

        # fault: pause and resume a follower, partition and heal, kill the leader
        leader = _leader(g, cli_here)
        follower = next(m for m in ["n0", "n1", "n2"] if m != leader)
        assert _json_lines(cli_here("fault", "pause", *g, follower))[0]["member"] == follower
        assert not _alive(g, follower, cli_here)
        assert _json_lines(cli_here("fault", "resume", *g, follower))[0]["member"] == follower
        assert _alive(g, follower, cli_here)
        others = ",".join(m for m in ["n0", "n1", "n2"] if m != leader)
        done = _json_lines(cli_here("fault", "partition", *g, leader, others))[0]
        assert done["sides"] == [[leader], others.split(",")]
        assert _json_lines(cli_here("fault", "heal", *g))[0]["fault"] == "heal"
        killed = _json_lines(cli_here("fault", "kill", *g, "leader"))[0]
        assert killed["member"] in ["n0", "n1", "n2"]
        deadline = time.monotonic() + 60
        while True:  # right after the kill an append may reach the restarting member
            out = cli_here("append", *g, "after-kill")
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            # an unknown outcome prints its cause's code (TERM_CHANGED, WAIT_QUORUM_ACK_TIMEOUT,
            # ...) and "the outcome is unknown"
            assert any(
                c in out.stderr
                for c in ("OUTCOME_UNKNOWN", "outcome is unknown", "NOT_LEADER", "NOT_READY")
            ), out.stderr[-2000:]
            time.sleep(0.5)
        assert _json_lines(out)[0]["index"] > appended[-1]["index"]

        out = _json_lines(cli_here("stop", *g, "--delete-data"))[0]
        assert out["stopped"] and not (tmp_path / group_name).exists()
        listed = _json_lines(cli_here("list", "--address", address, "--json"))[0]
        assert group_name not in [r["group"] for r in listed]
    finally:
        try:
            LedgerGroup.get(group_name).shutdown(delete_data=True)
        except Exception:
            pass


#: Each new command that takes --group, with the arguments it needs to get that far.
GROUP_COMMANDS = (
    ["status"],
    ["status", "--watch"],
    ["tail"],
    ["tail", "--follow"],
    ["stop"],
    ["fault", "kill"],
    ["fault", "pause", "n1"],
    ["fault", "resume", "n1"],
    ["fault", "partition", "n0", "n1,n2"],
    ["fault", "heal"],
)

#: An unexpected failure inside a command (here a stand-in for a bug), quiet as usual.
CRASH = """
import sys
from rayledger.integration.cli import ops
from rayledger.integration.cli.main import main
def crash(args):
    raise RuntimeError("simulated bug\\nover two lines")
ops.cmd_list = crash
sys.exit(main(["list"]))
"""


def test_operating_commands_bad_input(ray_session, group_name, tmp_path, cli_here):
    """Every operating command's bad-input paths: no cluster (a port where nothing
    listens), a bad argument before any connection and an unexpected error, each as a
    process (the test's own process is attached to a cluster); unknown group and bad
    values through the CLI's main in this process, meanwhile."""
    address = ray.get_runtime_context().gcs_address
    nog = ["--group", "no-such-group", "--address", address]
    nowhere = ["--group", group_name, "--address", "127.0.0.1:1"]
    g = ["--group", group_name, "--address", address]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:

        def run(*calls: Sequence[str]):
            return [pool.submit(cli, *args) for args in calls]

        # processes first: they run while this one asks for an unknown group, starts the
        # group and sends it bad values
        unreachable = run(
            *([*cmd, *nowhere] for cmd in GROUP_COMMANDS), ["list", "--address", "127.0.0.1:1"]
        )
        bad_start = run(["start", *g, "--members", "abc"])
        crash = pool.submit(
            subprocess.run, [sys.executable, "-c", CRASH], capture_output=True, text=True
        )
        unknown = [cli_here(*cmd, *nog) for cmd in GROUP_COMMANDS]
        out = cli_here("start", *g, "--members", "3", "--fast")
        assert out.returncode == 0, out.stderr[-2000:]
        try:
            bad = [
                cli_here(*args)
                for args in (
                    ["tail", *g, "--from", "-1"],
                    ["tail", *g, "--from", "abc"],
                    ["tail", *g, "--from", "1000000"],
                    ["get", *g, "-1"],
                    ["get", *g, "abc"],
                    ["get", *g, "1000000"],
                    ["fault", "kill", *g, "n9"],
                    ["fault", "partition", *g, "n0"],
                    ["status", *g, "--watch", "--interval", "0"],
                )
            ]
            codes = ["UNEXPECTED_ARGUMENT"] * 2 + ["INDEX_OUT_OF_BOUNDS"]
            codes += ["UNEXPECTED_ARGUMENT"] * 2 + ["INDEX_OUT_OF_BOUNDS", "UNKNOWN_MEMBER"]
            codes += ["UNEXPECTED_ARGUMENT"] * 2
            for out, code in zip(bad, codes, strict=True):
                _error(out, code)
            status = _json_lines(cli_here("status", *g, "--json"))[0]
            assert all(r["alive"] for r in status)  # nothing above touched the group
        finally:
            LedgerGroup.get(group_name).shutdown(delete_data=True)

        for out in unknown:
            assert "rayledger list" in _error(out, "UNKNOWN_GROUP")
        for f in unreachable:
            assert "ray start --head" in _error(f.result(), "NETWORK_ERROR")
        assert "--members" in _error(bad_start[0].result(), "UNEXPECTED_ARGUMENT")

        # an unexpected error: one line with a code and the log's path; the log keeps the
        # traceback, the terminal shows none
        crashed = crash.result()
        assert crashed.returncode == 1 and "Traceback" not in crashed.stderr, crashed.stderr
        m = re.fullmatch(
            r"error: \[INTERNAL_ERROR\] RuntimeError: simulated bug over two lines; "
            r".*; see the log at (\S+)\n",
            crashed.stderr,
        )
        assert m, crashed.stderr
        log = Path(m.group(1))
        assert "Traceback" in log.read_text() and "simulated bug" in log.read_text()
        log.unlink()
    print(f"bad-input processes: {time.monotonic() - t0:.1f} s")


def _no_ray_visible() -> list[str] | None:
    """A command prefix under which no Ray process on this machine can be seen (a new pid
    namespace: ``ray.init("auto")`` finds clusters by scanning processes), or None."""
    cmd = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    if not shutil.which("unshare"):
        return None
    probe = subprocess.run([*cmd, "true"], capture_output=True, timeout=30)
    return cmd if probe.returncode == 0 else None


def test_no_cluster_by_default(ray_session, group_name, tmp_path):
    """Without --address and RAY_ADDRESS the commands look for a cluster on the machine, as
    ``ray.init("auto")`` does: the file of the last `ray start` under Ray's temp dir, then
    any GCS process.  Hidden from both (an empty RAY_TMPDIR, a pid namespace of its own),
    each says there is none.  (The session's Ray runs beside it: without the namespace the
    command would find and use it.)"""
    prefix = _no_ray_visible()
    if prefix is None:
        pytest.skip("needs `unshare` with user and pid namespaces to hide the running Rays")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path)
    g = ["--group", group_name]
    outs = cli_many(
        *([*cmd, *g] for cmd in GROUP_COMMANDS),
        ["list"],
        ["get", *g, "0"],
        env=env,
        prefix=prefix,
    )
    for out in outs:
        line = _error(out, "NETWORK_ERROR")
        assert "no Ray cluster at auto" in line and "ray start --head" in line


def test_help_for_every_subcommand(cli_here):
    subs = ["demo", "start", "status", "append", "get", "transfer", "export", "bench"]
    for sub in subs + ["tail", "stop", "list", "fault", "mq"]:
        out = cli_here(sub, "--help")
        assert out.returncode == 0 and "usage" in out.stdout, sub
    out = cli("mq", "produce", "--help", timeout=60)  # and once as a process
    assert out.returncode == 0 and "usage" in out.stdout


def test_bench_flags_reach_the_group_bench() -> None:
    """``bench group --fast-path on --max-rounds 4`` becomes the group bench's keywords
    (the knee of overlapping rounds is measured with them)."""
    from rayledger.integration.bench.run import group_options
    from rayledger.integration.cli.main import parse_args

    opts = group_options(parse_args(["bench", "group", "--fast-path", "on", "--max-rounds", "4"]))
    assert opts["fast_path"] is True and opts["max_rounds"] == 4
    opts = group_options(parse_args(["bench", "group"]))
    assert opts["fast_path"] is None and opts["max_rounds"] is None  # LedgerConfig's defaults
