"""`rayledger bench membership`: changing a running group's members.

Figures (``--json`` prints them as one object):

- ``replace_s``: ``LedgerGroup.replace_member`` of a follower of a group holding ``log_mb``
  MiB of log (1 GiB; ``--quick`` 128 MiB): a learner started, caught up, promoted, the old
  member removed and stopped -- the whole call;
- ``catch_up_mb_per_s``: the log's bytes over the time from the learner joining the
  configuration to its promotion (it starts empty: every byte crosses).  Goal: >= 100;
- ``append_p99_ms_before`` / ``append_p99_ms_during_catch_up``: one client appending one
  small entry at a time, before the replacement and while the learner catches up.  Goal:
  during <= 2x before;
- ``heal_s``: a four-node cluster (``ray.cluster_utils.Cluster``, in a child process) runs
  a three-member group with ``replace_lost_after_s=0``; one member's node is removed; the
  seconds until the committed configuration has three live voters again (the leader
  replaced the lost member on the free node by itself).

Members are file-backed with the fast timers, on a local Ray with 2 CPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import ray
from rayledger.actors import LedgerConfig, LedgerGroup
from rayledger.election.configuration import Configuration

from .loads import in_threads, pct

BODY = 64 << 10  # the load's entries: 64 KiB


def _load(group: LedgerGroup, mb: int, clients: int = 4, per_call: int = 16) -> float:
    """Append ``mb`` MiB in 64 KiB entries from ``clients`` threads; MB/s."""
    calls = max(1, (mb << 20) // (BODY * per_call) // clients)
    body = os.urandom(BODY)

    def work(_k: int) -> None:
        c = group.client(timeout_s=120)
        for _ in range(calls):
            c.append_batch([body] * per_call, timeout_s=120)

    wall = in_threads(work, clients)
    return round(calls * clients * per_call * BODY / (1 << 20) / wall, 1)


class _Prober:
    """One client appending one small entry at a time, its latencies stamped."""

    def __init__(self, group: LedgerGroup):
        self.client = group.client(timeout_s=60)
        self.samples: list[tuple[float, float]] = []  # (when, ms)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.client.append(b"probe", timeout_s=60)
            except Exception:  # counted as its time: a stall is what the figure is about
                pass
            self.samples.append((time.monotonic(), (time.perf_counter() - t0) * 1000))
            time.sleep(0.005)

    def between(self, t0: float, t1: float) -> list[float]:
        return [ms for t, ms in self.samples if t0 <= t <= t1]


def _replace(group: LedgerGroup, log_mb: float) -> dict:
    """Replace a follower while the prober appends; the learner's join and promotion times
    from the configuration as the leader sees it."""
    leader = group.wait_for_leader(timeout_s=60)
    old = next(m for m in group.members if m != leader)
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                latest = Configuration.from_doc(group.membership()["latest"])
            except Exception:
                continue
            new = latest.replacement_of(old) if old in latest else None
            now = time.monotonic()
            if new is not None and latest.is_learner(new):
                seen.setdefault("joined", now)
            if new is not None and latest.is_voter(new):
                seen.setdefault("promoted", now)
            time.sleep(0.2)  # a call the leader serves each time: few, not to slow the probe

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    t0 = time.monotonic()
    new = group.replace_member(old, timeout_s=900)
    replace_s = time.monotonic() - t0
    stop.set()
    w.join(5)
    joined, promoted = seen.get("joined", t0), seen.get("promoted", time.monotonic())
    return {
        "replaced": old,
        "replacement": new,
        "replace_s": round(replace_s, 2),
        "catch_up_s": round(promoted - joined, 2),
        "catch_up_mb_per_s": round(log_mb / max(promoted - joined, 1e-3), 1),
        "_window": (joined, promoted),
    }


HEAL = textwrap.dedent(
    """
    import json, sys, time, tempfile, shutil
    import ray
    from ray.cluster_utils import Cluster
    from rayledger.actors import LedgerGroup, LedgerConfig
    root = tempfile.mkdtemp(prefix="rayledger-bench-heal-")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="rayledger", log_to_driver=False)
    out = {}
    try:
        while sum(1 for n in ray.nodes() if n["Alive"]) < 4:
            time.sleep(0.1)
        cfg = LedgerConfig.fast(replace_lost_after_s=0.0)
        g = LedgerGroup.create("heal", 3, store_dir=root, config=cfg,
                               nodes=[w.node_id for w in workers])
        leader = g.wait_for_leader(timeout_s=60)
        c = g.client(timeout_s=60)
        for i in range(200):
            c.append(b"x" * 100)
        victim = next(m for m in g.members if m != leader)
        node_id = ray.get(g.handle(victim).info.remote())["node_id"]
        t0 = time.monotonic()
        cluster.remove_node(next(w for w in workers if w.node_id == node_id),
                            allow_graceful=False)
        while True:
            roles = g.roles()
            if victim not in roles and sum(r == "voter" for r in roles.values()) == 3:
                break
            if time.monotonic() - t0 > 300:
                raise TimeoutError(f"not healed: {g.membership()}")
            time.sleep(0.05)
        out["heal_s"] = round(time.monotonic() - t0, 2)
        out["healed_members"] = g.members
        g.shutdown(delete_data=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(out))
    """
)


def _heal() -> dict:
    proc = subprocess.run([sys.executable, "-c", HEAL], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        return {"heal_error": (proc.stderr or proc.stdout)[-500:]}
    return json.loads(line[len("RESULT ") :])


def run(quick: bool = False, heal: bool = True, **_ignored) -> dict:
    log_mb = 128 if quick else 1024
    out: dict = {"members": 3, "store": "file", "log_mb": log_mb, "entry_kib": BODY >> 10,
                 "load_avg_1m_before": round(os.getloadavg()[0], 2)}  # fmt: skip
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, namespace="rayledger",
                 include_dashboard=False, log_to_driver=False)  # fmt: skip
    root = tempfile.mkdtemp(prefix="rayledger-bench-members-")
    group = None
    try:
        cfg = LedgerConfig.fast(rpc_timeout_ms=10_000)
        group = LedgerGroup.create(f"bench-members-{uuid.uuid4().hex[:6]}", 3, root, cfg)
        group.wait_for_leader(timeout_s=60)
        out["load_mb_per_s"] = _load(group, log_mb)
        prober = _Prober(group)
        prober.thread.start()
        time.sleep(5 if quick else 10)
        before = prober.between(0, time.monotonic())
        replaced = _replace(group, log_mb)
        joined, promoted = replaced.pop("_window")
        during = prober.between(joined, promoted)
        prober.stop.set()
        prober.thread.join(60)
        out.update(replaced)
        out["append_p50_ms_before"] = pct(before, 0.5)
        out["append_p99_ms_before"] = pct(before, 0.99)
        out["append_p50_ms_during_catch_up"] = pct(during, 0.5)
        out["append_p99_ms_during_catch_up"] = pct(during, 0.99)
        out["appends_during_catch_up"] = len(during)
    finally:
        if group is not None:
            group.shutdown(delete_data=True)
        if started:
            ray.shutdown()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    if heal:
        out.update(_heal())
    return out
