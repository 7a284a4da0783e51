"""Supervised helpers: SIGKILL a leader's checker or dispatcher while clients
append; the leader restores it (or hands leadership on) and writes continue."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import ray
from groupcheck import (
    Outcomes,
    Writer,
    check_history,
    helper_pids,
    stop_writers,
    wait_until,
)
from rayledger.storage import LedgerError, ResponseCode

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "victim",
    ["checker", pytest.param("dispatcher", marks=pytest.mark.chaos)],  # CI: the checker's
)
def test_a_killed_helper_is_restored_and_writes_continue(make_group, victim):
    g = make_group(members=3)
    leader = g.wait_for_leader()
    pids = helper_pids(g, leader)
    key = "checker" if victim == "checker" else next(k for k in pids if k.startswith("disp"))
    out = Outcomes()
    client = g.client(timeout_s=30)
    w = Writer(client, "w", out)
    w.start()
    try:
        wait_until(lambda: len(out.acked) >= 5, 30, "appends before the kill")
        killed_at = time.monotonic()
        os.kill(pids[key], signal.SIGKILL)
        wait_until(
            lambda: out.acks_since(killed_at + 0.5) >= 20,
            30,
            lambda: f"writes to go on after the {victim} was killed ({out})",
        )
    finally:
        stop_writers([w])
    # the killed helper is back as a new process that answers, whether its member restored
    # it and kept leading or handed leadership on (helpers are restarted either way)
    restored = helper_pids(g, leader, timeout_s=30)
    assert restored[key] != pids[key], (key, pids, restored)
    assert set(restored) == set(pids), (pids, restored)
    check_history(g, out, client)


def test_a_hung_checker_costs_the_leadership_and_writes_continue(make_group):
    """A helper that neither dies nor answers (SIGSTOP: Ray sees nothing to restart) must
    not leave a zombie leader: the leader hands leadership on within its helper wait."""
    g = make_group(members=3)
    leader = g.wait_for_leader()
    term = g.status()[leader].term
    pid = helper_pids(g, leader)["checker"]
    out = Outcomes()
    client = g.client(timeout_s=30)
    w = Writer(client, "w", out)
    w.start()
    stopped = False
    try:
        wait_until(lambda: len(out.acked) >= 5, 30, "appends before the checker hangs")
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        hung_at = time.monotonic()
        wait_until(
            lambda: any(
                s.role.name == "LEADER" and s.term > term and m != leader
                for m, s in g.status(5).items()
                if s.alive
            ),
            30,
            lambda: (
                "another member to lead a newer term ("
                + ", ".join(f"{m}: {s.role.name} t{s.term}" for m, s in g.status(5).items())
                + ")"
            ),
        )
        wait_until(
            lambda: out.acks_since(hung_at) >= 20,
            30,
            lambda: f"writes to go on while the old leader's checker hangs ({out})",
        )
    finally:
        stop_writers([w])
        if stopped:
            with contextlib.suppress(ProcessLookupError):  # the leader may have replaced it
                os.kill(pid, signal.SIGCONT)
    check_history(g, out, client)


def test_a_leader_whose_first_entry_cannot_be_written_steps_down(make_group):
    """A new leader that cannot write its term's empty entry (a full disk) used to hold
    leadership with heartbeats while every append got LEADER_NOT_READY."""

    def _break_leader_writes(self) -> None:  # runs inside the member
        def refuse(*_a, **_k):
            raise LedgerError.of(ResponseCode.DISK_FULL, "test: the disk is full")

        self.logic.store.append_as_leader = refuse

    g = make_group(members=3)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30)
    c.append(b"before")
    target = next(m for m in g.members if m != leader)
    ray.get(g.handle(target).__ray_call__.remote(_break_leader_writes))
    term = g.status()[leader].term
    try:  # one try is enough: the target takes the term, cannot write and steps down
        g.transfer_leadership(target, timeout_s=3)
    except LedgerError:
        pass  # the transferee stepped down again: the transfer may report a failure

    def writes_after_a_new_term():
        st = g.status(5)
        newer = [m for m, s in st.items() if s.alive and s.role.name == "LEADER" and s.term > term]
        if not newer or newer[0] == target:
            return False
        try:
            return c.append(b"after")
        except LedgerError:
            return False

    wait_until(writes_after_a_new_term, 30, lambda: f"a writable leader other than {target}")
    assert g.status()[target].role.name != "LEADER"


def _cut_off_a_follower(make_group):
    """A 3-member group with one entry, and a follower whose outgoing links are cut."""
    g = make_group(members=3)
    leader = g.wait_for_leader()
    isolated = next(m for m in g.members if m != leader)
    c = g.client(timeout_s=30)
    r = c.append(b"before")
    g.partition({isolated}, set(g.members) - {isolated}, one_way=True)
    return g, isolated, c, r


def test_a_partition_follows_a_member_through_its_restart_until_heal(make_group):
    """A member partitioned while it restarts used to come back healed.  Its outgoing
    links are cut: a linearizable read there must ask the leader and cannot."""
    g, isolated, c, r = _cut_off_a_follower(make_group)
    h = g.handle(isolated)

    def linearizable_index():
        return ray.get(h.committed_index.remote(consistency="linearizable"), timeout=30)

    with pytest.raises(LedgerError):
        linearizable_index()
    g.kill(isolated)

    def back() -> bool:
        try:
            ray.get(h.info.remote(), timeout=10)
            return True
        except ray.exceptions.RayError:
            return False

    wait_until(back, 60, "the killed member to come back")
    with pytest.raises(LedgerError):
        linearizable_index()  # still cut off after the restart
    g.heal()

    def reads_again() -> bool:
        try:
            return linearizable_index() >= r.index
        except LedgerError:
            return False

    wait_until(reads_again, 30, "heal() to restore the member's links")


def test_a_member_whose_election_clock_stopped_starts_it_again(make_group):
    """A member whose maintainer is gone would stay in its role for good (seen in CI: a
    restarted member stayed a candidate of an old term, refusing the leader's heartbeats).
    The next election message starts it again, and the group elects past the old leader."""

    def _stop_maintainer(self) -> None:  # runs inside the member (nested: pickled by value)
        e = self.election
        e.loop.call_soon_threadsafe(e._maintainer.cancel)

    def _maintainer_ticks(self) -> bool:
        e = self.election
        m = e._maintainer
        return m is not None and not m.done() and time.monotonic() - e._last_tick < 2

    g = make_group(members=3)
    leader = g.wait_for_leader()
    followers = [m for m in g.members if m != leader]
    for m in followers:
        ray.get(g.handle(m).__ray_call__.remote(_stop_maintainer))
    for m in followers:  # the leader's heartbeats restart it
        wait_until(
            lambda m=m: ray.get(g.handle(m).__ray_call__.remote(_maintainer_ticks)),
            10,
            f"{m}'s maintainer to tick again",
        )
    term = g.status()[leader].term
    g.kill(leader)  # only a ticking follower times out and campaigns
    wait_until(
        lambda: any(
            s.role.name == "LEADER" and s.term > term for s in g.status(5).values() if s.alive
        ),
        30,
        "a leader of a newer term",
    )


def test_heal_while_a_partitioned_member_restarts_restores_its_links(make_group):
    """heal() while the member is still restarting: heal waits for it (or the member reads
    the healed state when it starts), so it never comes back still cut off."""
    g, isolated, c, r = _cut_off_a_follower(make_group)
    h = g.handle(isolated)
    g.kill(isolated)
    g.heal()  # the member is down or restarting now

    def reads_again() -> bool:
        try:
            index = ray.get(h.committed_index.remote(consistency="linearizable"), timeout=10)
            return index >= r.index
        except (LedgerError, ray.exceptions.RayError):
            return False

    wait_until(reads_again, 60, "the restarted member to read through the leader again")
    assert c.append(b"after").index > r.index
