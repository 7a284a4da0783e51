"""The group's metrics, read back from a real Ray metrics endpoint in Prometheus text format.

A child process starts its own Ray with a metrics export port (never the session's
Ray), drives a group (appends, reads, a leader kill) and prints the endpoint's text.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

DRIVER = textwrap.dedent(
    """
    import sys, time, urllib.request
    import ray
    from rayledger.actors import LedgerConfig, LedgerGroup
    from rayledger.storage import LedgerError

    port, store = int(sys.argv[1]), sys.argv[2]

    def scrape(wanted):
        deadline = time.monotonic() + 90
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            if all(w in text for w in wanted) or time.monotonic() > deadline:
                break
            time.sleep(2)
        time.sleep(3)  # one more export round, so the counters include the last calls
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    ray.init(address="local", num_cpus=2, namespace="rayledger", include_dashboard=False,
             log_to_driver=False, configure_logging=False, _metrics_export_port=port)
    group = LedgerGroup.create("metrics", 3, store_dir=store, config=LedgerConfig.fast())
    try:
        group.wait_for_leader(30)
        client = group.client(timeout_s=30)
        for i in range(20):
            client.append_batch([b"x" * 100] * 50)
        client.read(0, 10)  # linearizable, the default
        client.read(0, 10, consistency="committed")
        print("=== BEFORE ===")
        print(scrape(("rayledger_append_latency_ms", "rayledger_peer_water_mark",
                      "rayledger_flush_latency_ms", 'consistency="linearizable"',
                      'consistency="committed"', "rayledger_disk_bytes",
                      "rayledger_peer_push_latency_ms", "rayledger_elections_started",
                      "rayledger_pending_appends")))
        old = group.wait_for_leader(10)
        term = max(s.term for s in group.status().values())
        group.kill(old)
        deadline = time.monotonic() + 60  # a leader of a newer term (maybe the restarted one)
        while not any(s.role is not None and s.role.value == "LEADER" and s.term > term
                      for s in group.status().values()):
            assert time.monotonic() < deadline, "no new leader after the kill"
            time.sleep(0.2)
        print("=== AFTER ===")
        print(scrape(("rayledger_leader_changes",)))
    finally:
        group.shutdown(delete_data=True)
        ray.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of ``name`` (Ray adds the ``ray_`` prefix)."""
    out = []
    pat = re.compile(r"^ray_" + re.escape(name) + r"(?:_total)?\{(.*?)\} (\S+)$")
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out.append((labels, float(m.group(2))))
    return out


def test_metrics_reach_prometheus(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_metrics_report_interval_ms"] = "1000"
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(port), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before, after = proc.stdout.split("=== BEFORE ===", 1)[1].split("=== AFTER ===", 1)

    def members(name: str, text: str = before) -> dict[str, float]:
        got = {}
        for labels, value in _samples(text, name):
            assert labels["group"] == "metrics", labels
            key = labels["member"] + labels.get("peer", "") + labels.get("consistency", "")
            got[key] = got.get(key, 0.0) + value  # summed over processes (a restart is another)
        return got

    assert set(members("rayledger_term")) == {"n0", "n1", "n2"}
    assert max(members("rayledger_committed_index").values()) >= 1000
    assert max(members("rayledger_ledger_end_index").values()) >= 1000
    assert sorted(members("rayledger_role").values())[-1] == 2  # a leader
    assert sum(members("rayledger_elections_won").values()) >= 1
    assert sum(members("rayledger_appended_entries").values()) >= 1000
    entries = sum(members("rayledger_appended_entries").values())
    # entry bytes, headers included: more than the 100-byte bodies alone
    assert sum(members("rayledger_appended_bytes").values()) > 100 * entries >= 100_000
    assert sum(members("rayledger_append_latency_ms_count").values()) >= 1
    assert len(members("rayledger_peer_water_mark")) >= 2  # the leader's two followers
    assert len(members("rayledger_peer_lag")) >= 2
    assert sum(members("rayledger_peer_push_latency_ms_count").values()) >= 1
    assert sum(members("rayledger_flush_latency_ms_count").values()) >= 1
    assert min(members("rayledger_disk_bytes").values()) > 0
    assert sum(members("rayledger_elections_started").values()) >= 1  # the first leader's
    # every member samples it; every append call had returned a second (one sample) and
    # more before the scrape, so none is still counted: a leaked count stays above zero
    pending = members("rayledger_pending_appends")
    assert pending == {"n0": 0, "n1": 0, "n2": 0}, pending
    reads: dict[str, float] = {}
    for labels, value in _samples(before, "rayledger_reads"):
        assert labels["group"] == "metrics" and labels["member"] in ("n0", "n1", "n2"), labels
        reads[labels["consistency"]] = reads.get(labels["consistency"], 0.0) + value
    assert reads.get("linearizable", 0) >= 1 and reads.get("committed", 0) >= 1, reads
    # after the leader's kill: a new leader won an election and the others saw the change
    assert sum(members("rayledger_elections_won", after).values()) >= 1
    assert sum(members("rayledger_leader_changes", after).values()) >= 1
