"""A hung helper is killed by its pid only while that pid still names the helper's process
(pids are reused): otherwise by Ray, through its handle."""

from __future__ import annotations

import subprocess
import sys

from rayledger.actors.core import supervision as sv
from rayledger.actors.member import leadership as ml


class _Part(ml.LeadershipPart):
    def __init__(self, handles):  # no actor context: only what _replace reads
        self._started_at = {}
        self._handles = handles

    @property
    def self_id(self) -> str:
        return "n0"

    def _helper_handles(self):
        return self._handles


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_hung_helper_is_killed_by_its_pid(monkeypatch):
    killed = []
    monkeypatch.setattr(ml.ray, "kill", lambda h, no_restart: killed.append(h))
    proc = _sleeper()
    try:
        part = _Part({("checker", None): "handle"})
        part.helper_started(proc.pid)
        part._replace(sv.Replace(3, (("checker", None),), (proc.pid,)))
        assert proc.wait(timeout=10) == -9 and killed == []
    finally:
        proc.kill()


def test_a_pid_that_names_another_process_now_is_not_signalled(monkeypatch):
    killed = []
    monkeypatch.setattr(ml.ray, "kill", lambda h, no_restart: killed.append(h))
    proc = _sleeper()
    try:
        part = _Part({("dispatcher", "n1"): "handle"})
        part.helper_started(proc.pid)
        part._started_at[proc.pid] -= 5.0  # the helper's process was another, since gone
        part._replace(sv.Replace(3, (("dispatcher", "n1"),), (proc.pid,)))
        assert proc.poll() is None and killed == ["handle"]
    finally:
        proc.kill()
        proc.wait()
