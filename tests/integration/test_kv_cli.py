"""`rayledger kv` against one KV group on a running Ray cluster.  A few calls run the CLI in
a subprocess, as a user runs it (exit codes, quiet output, bytes on stdin and stdout, no
traceback); the rest call its ``main`` in this process, attached to the same cluster (each
process start costs seconds here)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import ray
from rayledger.integration.kv import KVClient

pytestmark = pytest.mark.ray


def kv_process(*args: str, stdin: bytes | None = None, env: dict | None = None):
    """``rayledger kv ...`` as a process of its own; stdout and stderr as bytes."""
    return subprocess.run(
        [sys.executable, "-m", "rayledger.integration.cli", "kv", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def kv(ray_session, tmp_path_factory):
    """One 3-member KV group on files for the whole module, always shut down."""
    name = f"t-kvcli-{uuid.uuid4().hex[:8]}"
    kv = KVClient.create(name, members=3, store_dir=str(tmp_path_factory.mktemp("kv")))
    try:
        yield kv
    finally:
        kv.close()
        kv.group.shutdown(delete_data=True)


@pytest.fixture
def g(kv) -> list[str]:
    return ["--group", kv.group.name, "--address", ray.get_runtime_context().gcs_address]


@pytest.fixture
def kv_here(capsys):
    """`rayledger kv ...` through the CLI's main in this process: (exit code, stdout, stderr);
    argparse's errors (SystemExit) are an exit code like the others."""
    from rayledger.integration.cli.main import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main(["kv", *args, "--verbose"])
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["kv", *args], code, out.out, out.err)

    return run


def ok(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, f"{out.args}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout.splitlines()


def coded_error(out: subprocess.CompletedProcess, code: str) -> str:
    """An expected error: exit 2 and one `error: [CODE] ...; next step` line on stderr."""
    where = f"{out.args}\nstdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}"
    assert out.returncode == 2, where
    errors = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and f"[{code}]" in errors[0] and "; " in errors[0], where
    assert "Traceback" not in out.stderr + out.stdout, where
    return errors[0]


def test_put_then_get_round_trip(kv, g, kv_here, tmp_path):
    r1 = int(ok(kv_here("put", *g, "rt/a", "hello wörld"))[0])
    put = json.loads(ok(kv_here("put", *g, "rt/b", "two", "--json"))[0])
    assert put["key"] == "rt/b" and put["revision"] > r1
    assert ok(kv_here("get", *g, "rt/a")) == ["hello wörld"]
    assert kv.get("rt/a") == "hello wörld".encode()  # the CLI stores UTF-8 bytes
    got = json.loads(ok(kv_here("get", *g, "rt/b", "--json"))[0])
    assert got == {"key": "rt/b", "value": "two", "encoding": "utf-8"}
    for consistency in ("lease", "committed"):
        out = kv_here("get", *g, "rt/b", "--consistency", consistency, "--member", "n1")
        assert ok(out) == ["two"]

    # bytes from a file; not UTF-8: base64 with a note on stderr
    blob = b"\x00\xff\xfe binary"
    (tmp_path / "blob").write_bytes(blob)
    ok(kv_here("put", *g, "rt/bin", "--file", str(tmp_path / "blob")))
    out = kv_here("get", *g, "rt/bin")
    assert ok(out) == [base64.b64encode(blob).decode()] and "not UTF-8" in out.stderr
    assert kv.get("rt/bin") == blob

    # as a user runs it: bytes on stdin (`-`), and back with --raw, nothing else on stdout
    put = kv_process("put", *g, "rt/stdin", "-", stdin=blob + b"\n")
    assert put.returncode == 0 and put.stdout.strip().isdigit(), put.stderr[-2000:]
    raw = kv_process("get", *g, "rt/stdin", "--raw")
    assert raw.returncode == 0 and raw.stdout == blob + b"\n", raw.stderr[-2000:]


def test_scan_orders_keys_and_takes_prefix_and_limit(kv, g, kv_here):
    for key in ("sc/c", "sc/a", "sc/b/2", "sc/b/1", "sd/x"):
        kv.put(key, key.upper().encode())
    lines = ok(kv_here("scan", *g, "sc/"))
    assert lines == ["sc/a\tSC/A", "sc/b/1\tSC/B/1", "sc/b/2\tSC/B/2", "sc/c\tSC/C"]
    assert ok(kv_here("scan", *g, "sc/", "--limit", "2")) == lines[:2]
    assert ok(kv_here("scan", *g, "sc/b/", "--consistency", "lease")) == lines[1:3]
    rows = [json.loads(x) for x in ok(kv_here("scan", *g, "s", "--json", "--limit", "5"))]
    assert [r["key"] for r in rows] == ["sc/a", "sc/b/1", "sc/b/2", "sc/c", "sd/x"]
    assert rows[-1] == {"key": "sd/x", "value": "SD/X", "encoding": "utf-8"}
    assert ok(kv_here("scan", *g, "no-such-prefix/")) == []
    every = [x.split("\t")[0] for x in ok(kv_here("scan", *g))]  # no prefix: every key
    assert every == sorted(every) and {"sc/a", "sd/x"} <= set(every)


def test_del_then_get_is_missing(kv, g, kv_here, tmp_path):
    kv.put("del/k", b"v")
    rev = int(ok(kv_here("del", *g, "del/k"))[0])
    assert rev > 0 and kv.get("del/k") is None
    out = kv_here("get", *g, "del/k")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: key 'del/k' not found in group " + repr(g[1])]
    assert ok(kv_here("scan", *g, "del/")) == []

    # as a user runs it: exit 1, that one line, and no log file left behind
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = kv_process("get", *g, "del/k", env=env)
    assert out.returncode == 1 and out.stdout == b""
    assert out.stderr.decode().splitlines() == [f"error: key 'del/k' not found in group {g[1]!r}"]
    assert not list(tmp_path.glob("rayledger-*.log"))


def test_watch_prints_changes_and_stops_after_count(kv, g, kv_here):
    start = kv.client.committed_index() + 1
    r1 = kv.put("w/a", b"1")
    kv.put("other", b"x")  # not under the prefix
    r2 = kv.put("w/b", b"2")
    r3 = kv.delete("w/a")
    lines = ok(kv_here("watch", *g, "w/", "--from-index", str(start), "--count", "3"))
    assert lines == [f"{r1}\tput\tw/a\t1", f"{r2}\tput\tw/b\t2", f"{r3}\tdelete\tw/a\t"]
    rows = ok(kv_here("watch", *g, "w/", "--from-index", str(start), "--count", "3", "--json"))
    assert json.loads(rows[2]) == {"revision": r3, "op": "delete", "key": "w/a",
                                   "value": None, "encoding": None}  # fmt: skip

    # without --from-index: only changes from now on
    before = kv.client.committed_index()
    done: list = []
    watcher = threading.Thread(
        target=lambda: done.append(kv_here("watch", *g, "now/", "--count", "1")), daemon=True
    )
    watcher.start()
    deadline = time.monotonic() + 60
    while watcher.is_alive() and time.monotonic() < deadline:
        kv.put("now/k", b"v")
        watcher.join(0.5)
    assert done, "watch --count 1 did not stop"
    rev, op, key, value = ok(done[0])[0].split("\t")
    assert int(rev) > before and (op, key, value) == ("put", "now/k", "v")


def test_bad_input_is_one_coded_line(kv, g, kv_here):
    coded_error(kv_here("get", "--group", "no-such-group", *g[2:], "k"), "UNKNOWN_GROUP")
    coded_error(kv_here("scan", "--group", "no-such-group", *g[2:]), "UNKNOWN_GROUP")
    coded_error(kv_here("put", *g), "UNEXPECTED_ARGUMENT")  # no KEY
    coded_error(kv_here("put", *g, "k"), "UNEXPECTED_ARGUMENT")  # no VALUE
    coded_error(kv_here("put", *g, "k", "v", "--file", "/dev/null"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("put", *g, "k", "--file", "/no/such/file"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("put", *g, "", "v"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("get", "k"), "UNEXPECTED_ARGUMENT")  # no --group
    coded_error(kv_here("get", *g, "k", "--consistency", "eventual"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("get", *g, "k", "--member", "n9"), "UNKNOWN_MEMBER")
    coded_error(kv_here("scan", *g, "--limit", "0"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("watch", *g, "--from-index", "-1"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("watch", *g, "--count", "0"), "UNEXPECTED_ARGUMENT")
    coded_error(kv_here("frob", *g), "UNEXPECTED_ARGUMENT")
    assert kv.get("k") is None  # nothing stored by the refusals

    # as a user runs it: exit 2, one line, no traceback
    out = kv_process("get", "--group", "no-such-group", *g[2:], "k")
    line = coded_error(
        subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(),
                                    out.stderr.decode()), "UNKNOWN_GROUP")  # fmt: skip
    assert "rayledger list" in line


def test_kv_refuses_a_group_without_the_kv_machine(ray_session, group_name, kv_here):
    from rayledger.actors import LedgerGroup

    plain = LedgerGroup.create(group_name, 1)
    try:
        line = coded_error(kv_here("scan", "--group", group_name), "UNEXPECTED_ARGUMENT")
        assert "does not run the key-value store" in line
    finally:
        plain.shutdown()


def test_help_for_every_kv_subcommand(kv_here):
    for sub in ([], ["put"], ["get"], ["del"], ["scan"], ["watch"]):
        out = kv_here(*sub, "--help")
        assert out.returncode == 0 and "usage: rayledger kv" in out.stdout, sub


def test_kv_start_keeps_the_store_on_disk_by_default(ray_session, kv_here, tmp_path, monkeypatch):
    """`start` keeps a group's files under $RAYLEDGER_DATA (else ~/.rayledger/data)
    unless told --memory; --memory with --store-dir is refused."""
    monkeypatch.setenv("RAYLEDGER_DATA", str(tmp_path / "data"))
    name = f"t-kvstart-{uuid.uuid4().hex[:8]}"
    g = ["--group", name, "--address", ray.get_runtime_context().gcs_address]
    bad = kv_here("start", *g, "--memory", "--store-dir", str(tmp_path))
    coded_error(bad, "UNEXPECTED_ARGUMENT")
    out = ok(kv_here("start", *g, "--members", "3", "--fast"))
    # (in this process, with --verbose, Ray's own notices may share stdout)
    started = json.loads(next(x for x in out if x.startswith('{"group"')))
    try:
        assert started["group"] == name and started["leader"] in started["members"]
        assert sorted(os.listdir(tmp_path / "data" / name)) == ["n0", "n1", "n2"]
        assert ok(kv_here("put", *g, "k", "v")) and ok(kv_here("get", *g, "k")) == ["v"]
    finally:
        from rayledger.actors import LedgerGroup

        LedgerGroup.get(name).shutdown(delete_data=True)
