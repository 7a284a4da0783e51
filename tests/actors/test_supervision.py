"""Supervised helpers (issue 10 §2): SIGKILL a leader's checker or dispatcher while clients
append; the leader restores it (or hands leadership on) and writes continue."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray
from groupcheck import assert_consistent, committed_log
from rayledger.storage import LedgerError, OutcomeUnknownError

pytestmark = pytest.mark.ray


class Writer(threading.Thread):
    """Appends numbered bodies until stopped; records every outcome with its time."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.acked: dict[int, bytes] = {}
        self.ack_times: list[float] = []
        self.unknown: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            body = b"w%d" % i
            i += 1
            try:
                r = self.client.append(body, timeout_s=10)
                self.acked[r.index] = body
                self.ack_times.append(time.monotonic())
            except OutcomeUnknownError:
                self.unknown.append(body)
            except LedgerError as exc:
                self.failed.append((body, exc.code.name))


@pytest.mark.parametrize("victim", ["checker", "dispatcher"])
def test_a_killed_helper_is_restored_and_writes_continue(make_group, victim):
    g = make_group(members=3)
    leader = g.wait_for_leader()
    pids = ray.get(g.handle(leader).helper_pids.remote())
    key = "checker" if victim == "checker" else next(k for k in pids if k.startswith("disp"))
    w = Writer(g.client(timeout_s=30))
    w.start()
    try:
        time.sleep(1.0)
        assert w.acked, "nothing was appended before the kill"
        killed_at = time.monotonic()
        os.kill(pids[key], signal.SIGKILL)
        deadline = killed_at + 30
        while time.monotonic() < deadline:
            if sum(t > killed_at + 0.5 for t in w.ack_times) >= 20:
                break
            time.sleep(0.1)
    finally:
        w.stop.set()
        w.join(30)
    after = sum(t > killed_at + 0.5 for t in w.ack_times)
    assert after >= 20, f"writes stalled after the {victim} was killed: {w.failed[-5:]}"
    # the killed helper is back (a new process) when the same member still leads
    if g.leader_id() == leader:
        new_pids = ray.get(g.handle(leader).helper_pids.remote(), timeout=30)
        assert new_pids[key] != pids[key]
    assert_consistent(g, w.acked)
    bodies = [b for _, _, b in committed_log(g, g.members[0]) if b]  # b"": a term's first entry
    assert len(bodies) == len(set(bodies)), "an append was stored twice"
    assert set(w.acked.values()) <= set(bodies)


def test_a_partition_follows_a_member_through_its_restart_until_heal(make_group):
    """Issue 10 §5: a member partitioned while it restarts used to come back healed.  Its
    outgoing links are cut: a linearizable read there must ask the leader and cannot."""
    g = make_group(members=3)
    leader = g.wait_for_leader()
    isolated = next(m for m in g.members if m != leader)
    c = g.client(timeout_s=30)
    r = c.append(b"before")
    g.partition({isolated}, set(g.members) - {isolated}, one_way=True)
    h = g.handle(isolated)

    def linearizable_index():
        return ray.get(h.committed_index.remote(consistency="linearizable"), timeout=30)

    with pytest.raises(LedgerError):
        linearizable_index()
    g.kill(isolated)
    deadline = time.monotonic() + 60
    while True:  # wait for the restarted member
        try:
            ray.get(h.info.remote(), timeout=10)
            break
        except ray.exceptions.RayError:
            assert time.monotonic() < deadline, "the killed member did not come back"
            time.sleep(0.2)
    with pytest.raises(LedgerError):
        linearizable_index()  # still cut off after the restart
    g.heal()
    deadline = time.monotonic() + 30
    while True:
        try:
            assert linearizable_index() >= r.index
            break
        except LedgerError:
            assert time.monotonic() < deadline, "heal() did not restore the member's links"
            time.sleep(0.2)
