"""``ray job submit`` of the append-and-read job against a real ``ray start --head`` cluster.

How the cluster is stopped: ``ray stop`` is machine-wide and would also kill the
test session's own local Ray (and any other cluster on the machine), so it is
never called.  The head is started with its own ``--temp-dir`` and its own free
ports; at the end every process whose command line names that temp dir (GCS,
raylet, dashboard, agents, ...) is killed together with all its descendants (the
workers, the job's driver and the group's actors).  Nothing else is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each socket held open until all are picked: the OS gives
    a closed one out again, and two of the head's servers on one port fail its start)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # A throw-away cluster on 127.0.0.1 for one test: no token authentication, so the
    # job CLI needs no token file (Ray 2.60 enables tokens for `ray start` clusters).
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def _kill_cluster(temp_dir: str) -> int:
    """Kill the processes of the cluster that uses ``temp_dir``, with their children."""
    import psutil

    roots = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(temp_dir in part for part in (p.info["cmdline"] or [])):
                roots.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    procs = {}
    for p in roots:
        procs[p.pid] = p
        try:
            for c in p.children(recursive=True):
                procs[c.pid] = c
        except psutil.NoSuchProcess:
            pass
    for p in procs.values():
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(procs.values()), timeout=10)
    return len(procs)


@pytest.fixture(scope="module")
def head_cluster():
    """A Ray head started with `ray start --head` on free ports and its own temp dir."""
    temp_dir = tempfile.mkdtemp(prefix="rl-job-", dir="/tmp")  # short: unix socket paths
    try:
        for attempt in range(3):  # a port taken between picking and binding: pick again
            gcs, dash, client, agent, agent_grpc, runtime, metrics, node, objects = (
                _free_ports(9))  # fmt: skip
            cmd = [
                RAY, "start", "--head", f"--port={gcs}", f"--dashboard-port={dash}",
                "--dashboard-host=127.0.0.1", "--include-dashboard=true", "--num-cpus=2",
                f"--temp-dir={temp_dir}", "--disable-usage-stats",
                f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
                f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime}",
                f"--metrics-export-port={metrics}", f"--node-manager-port={node}",
                f"--object-manager-port={objects}",
            ]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
            if proc.returncode == 0 or attempt == 2:
                break
            _kill_cluster(temp_dir)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        address = f"http://127.0.0.1:{dash}"
        deadline = time.monotonic() + 60
        while True:  # the job server comes up a little after `ray start` returns
            st = subprocess.run(
                [RAY, "job", "list", "--address", address],
                capture_output=True,
                text=True,
                env=_env(),
            )
            if st.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        yield address
    finally:
        _kill_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _submit(address: str, *job_args: str) -> dict:
    cmd = [
        RAY, "job", "submit", "--address", address, "--working-dir", ".", "--",
        sys.executable, "-m", "rayledger.integration.cli.job", *job_args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=_env())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{") and '"group"' in ln]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(lines[-1])


@pytest.mark.timeout(660)  # two job submissions of up to 300 s each
def test_job_submit_creates_appends_and_reads(head_cluster, tmp_path):
    store = tmp_path / "store"
    first = _submit(
        head_cluster, "--group", "jobgrp", "--create", "--fast", "--store-dir", str(store),
        "--entries", "600", "--batch", "50", "--read", "dataset",
    )  # fmt: skip
    assert first["ok"] and first["created"]
    # a batch whose outcome is unknown (a timeout on a loaded machine) counts as such
    assert first["acked"] + first["unknown"] == 600 and first["acked"] >= 300, first
    assert first["mismatched"] == 0
    # the reader reads [first acked, last acked]: every acked entry, and unknown ones that committed
    assert first["reader_rows"] >= first["acked"] and first["reader_mismatched"] == 0
    assert (store / "jobgrp").is_dir()

    # A second job (another driver) attaches to the running group by name.
    second = _submit(
        head_cluster, "--group", "jobgrp", "--entries", "300", "--batch", "100", "--shutdown"
    )
    assert second["ok"] and not second["created"]
    assert second["acked"] + second["unknown"] == 300 and second["acked"] >= 100, second
    assert second["first_index"] > first["last_index"]
    assert second["shutdown"]


@pytest.mark.chaos  # long run; in CI: test_job_submit_creates_appends_and_reads stays in CI
def test_job_without_create_fails_cleanly(head_cluster):
    cmd = [
        RAY, "job", "submit", "--address", head_cluster, "--working-dir", ".", "--",
        sys.executable, "-m", "rayledger.integration.cli.job", "--group", "nosuchgroup",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, env=_env())
    assert proc.returncode != 0
    assert "UNKNOWN_GROUP" in proc.stdout
