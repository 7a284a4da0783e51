"""Scripted whole-group runs of combinations that once broke safety: each drives the shipped
cores through the simulation with a fixed seed and a few scripted faults of the kinds the
simulation injects, and fails on the code before its fix.

* a checker that learns configuration changes late (its leader's role lock held by a
  dispatcher that never starts) while the leader carries on its own membership plan;
* appends queued behind a configuration entry on a leader that loses its term;
* reads in flight while a change leaves the leader its group's only voter;
* a lease confirmed by the old voters, then two changes and the leader cut off (safe by
  pre-vote even with the lease kept across the changes);
* a leader cut off right after it snapshots and compacts at its committed index, and a
  learner it resets there: both logs begin right after their snapshot point with entries
  the next leader never got.
"""

from __future__ import annotations

import logging

import pytest
from rayledger.actors.core import member as mc
from rayledger.election.membership import Op

from . import member_delivery
from .group_sim import GroupSim, sim_config_for
from .network import SimulationFailure

QUIET = dict(
    membership=False, faults=False, hangs=False, dispatcher_faults=False, transfers=False,
    fast_path=False, slow_followers=False, readers=0,
)  # fmt: skip


def _ready_leader(sim: GroupSim):
    ls = [m for m in sim.members.values() if m.alive and m.state.is_leader
          and m.node.logic.ready_term == m.state.current_term]  # fmt: skip
    return ls[0] if len(ls) == 1 else None


def _run_until(sim: GroupSim, pred, limit_ms: int = 5000) -> None:
    end = sim.clock.now_ms + limit_ms
    while sim.clock.now_ms < end:
        sim.step(end)
        if pred():
            return
    pytest.fail(f"gave up waiting at t={sim.clock.now_ms} ms")


def _settled(sim: GroupSim, committed: int):
    """Once a member leads, ready, with ``committed`` entries committed: it and the other
    two members of n0..n2."""
    _run_until(sim, lambda: (m := _ready_leader(sim)) is not None
               and m.store.committed_index >= committed)  # fmt: skip
    leader = _ready_leader(sim)
    a, b = [p for p in ("n0", "n1", "n2") if p != leader.id]
    return leader, a, b


def _served_by_leaders(sim: GroupSim) -> int:
    return sum(v for k, v in sim.stats.items() if k.startswith("reads_served_") and
               k.endswith("_leader"))  # fmt: skip


def _heal_and_check(sim: GroupSim) -> None:
    """Faults off: the group converges, and every safety check holds to the end."""
    sim.heal()
    if not sim.run_for(20000, sim.converged):
        pytest.fail("not converged:\n" + sim.describe())
    sim.check_invariants()
    sim.final_check()


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_checker_behind_a_busy_role_lock_never_counts_a_configuration_two_changes_old(
    seed, monkeypatch
):
    """Leader L with followers A and B; B is replaced by n3 (cut off from L, so it stays a
    learner), then learner n4 is added, and L's checker takes 30 s to take that
    configuration, so that reconfiguration holds L's role lock.  n3 heals: L promotes it
    and removes B on its own.  Its checker must count the latest voters {L, A, n3} before
    the next change (seed 1 and 2 acknowledged an append on {L, B}, a majority of the
    voters two changes old, which A and n3 then elected a leader without)."""
    sim = GroupSim(3, seed, store_kind="memory", replication=sim_config_for(seed), spares=2,
                   clients=2, test_name="checker_lag", **QUIET)  # fmt: skip
    try:
        L, A, B = _settled(sim, 5)
        clog = L.node.logic.config_log
        sim.net.cut_both(L.id, "n3")
        sim._step(L.node, mc.ChangeMembers(Op.REPLACE, "n3", None, B))
        _run_until(sim, lambda: not clog.pending(L.store.committed_index) and clog.entries)
        sim.helper_delays = True  # the checker's configuration waits in its queue
        monkeypatch.setattr(member_delivery, "CHECKER_CONFIGURE_MS", (30_000, 30_000))
        sim._step(L.node, mc.ChangeMembers(Op.ADD_LEARNER, "n4", None, ""))
        _run_until(sim, lambda: not clog.pending(L.store.committed_index)
                   and len(clog.entries) >= 2)  # fmt: skip
        assert L.node.core.role_queue.busy  # the scenario: the lock is held
        monkeypatch.setattr(member_delivery, "CHECKER_CONFIGURE_MS", (0, 0))
        sim.net.restore(L.id, "n3")
        sim.net.restore("n3", L.id)
        _run_until(sim, lambda: len(clog.entries) >= 4
                   and not clog.pending(L.store.committed_index))  # fmt: skip
        # the checker counts the latest voters or, at most one change behind, the ones before
        counted = sorted(L.node.checker.core.voters)
        assert counted in (sorted(clog.latest().voters), sorted(clog.entries[-2][1].voters))
        c4 = clog.latest_index()
        _run_until(sim, lambda: all(sim.members[p].store.ledger_end_index >= c4
                                    for p in (A, B, "n3")))  # fmt: skip
        sim.net.cut_both(L.id, A)
        sim.net.cut_both(L.id, "n3")
        sim.run_for(1500)  # appends may be acknowledged only by a majority of {L, A, n3}
        sim.crash(L.id)
        sim.net.heal()
        sim.run_for(4000)
        sim.restart(L.id)
        _heal_and_check(sim)
    except SimulationFailure as exc:
        pytest.fail(str(exc).split("\n")[0])
    finally:
        sim.close()


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_appends_queued_when_a_term_ends_are_never_written_in_a_later_one(seed):
    """An isolated leader holds a round and, behind a queued configuration change, an
    idempotent client's next append; it loses its term.  The queue must be refused then:
    the next leader commits the client's retry, and when the old leader leads again (an
    operator's transfer) it must not write the old queue (seed 4 and 5 committed the body
    twice)."""
    sim = GroupSim(3, seed, store_kind="memory", replication=sim_config_for(seed), spares=1,
                   clients=3, idempotent=True, client_interval_ms=(5, 20),
                   test_name="stale_queue", **QUIET)  # fmt: skip
    try:
        _run_until(sim, lambda: _ready_leader(sim) is not None
                   and _ready_leader(sim).store.committed_index >= 10)  # fmt: skip
        L = _ready_leader(sim)
        book = L.node.book
        sim.net.isolate(L.id)
        _run_until(sim, lambda: book.rounds and book.queue, 2000)
        sim._step(L.node, mc.ChangeMembers(Op.ADD_LEARNER, "n3", None, ""))
        _run_until(sim, lambda: not L.state.is_leader, 3000)
        assert book.queue == [] and not book.config_queued
        _run_until(sim, lambda: _ready_leader(sim) not in (None, L), 5000)
        L2 = _ready_leader(sim)
        sim.net.heal()
        _run_until(sim, lambda: L.store.ledger_end_index >= L2.store.committed_index
                   and L.state.leader_id == L2.id, 4000)  # fmt: skip
        sim._step(L2.node, mc.TransferOrder(L.id))  # L leads again (most seeds)
        sim.run_for(4000, lambda: _ready_leader(sim) is L)
        sim.run_for(1500)
        _heal_and_check(sim)
    except SimulationFailure as exc:
        pytest.fail(str(exc).split("\n")[0])
    finally:
        sim.close()


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_reads_in_flight_when_a_change_leaves_the_leader_the_only_voter(seed):
    """Readers read at the leader of three voters; the operator removes one follower, then,
    cut off from the other (a confirmation round stays in flight), that one too: the leader is its group's only
    voter, and the readers that round carried must be answered (its core raised an
    AssertionError and never answered them)."""
    sim = GroupSim(3, seed, store_kind="memory", replication=sim_config_for(seed), spares=1,
                   clients=1, test_name="single_voter_reads",
                   **{**QUIET, "readers": 3, "readers_stay": True, "follower_reads": 0.0})  # fmt: skip
    try:
        L, A, B = _settled(sim, 5)
        clog = L.node.logic.config_log
        sim._step(L.node, mc.ChangeMembers(Op.REMOVE, A, None, ""))
        _run_until(sim, lambda: not clog.pending(L.store.committed_index) and clog.entries)
        reads = L.node.core.reads
        _run_until(sim, lambda: reads.in_flight is not None, 3000)
        sim.net.cut_both(L.id, B)  # the round needs B's answer now: it stays in flight
        sim._step(L.node, mc.ChangeMembers(Op.REMOVE, B, None, ""))
        _run_until(sim, lambda: tuple(clog.latest().voters) == (L.id,), 3000)
        sim.net.heal()
        served = _served_by_leaders(sim)
        sim.run_for(1000)
        assert _served_by_leaders(sim) > served  # the leader alone serves reads
        _heal_and_check(sim)
    except SimulationFailure as exc:
        pytest.fail(str(exc).split("\n")[0])
    finally:
        sim.close()


@pytest.mark.parametrize("reverted", [False, True], ids=["fixed", "lease-kept"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_leader_is_elected_inside_a_lease_confirmed_before_two_changes(seed, reverted):
    """Lease reads at the leader L of {L, A, B} with B cut off from L; the operator adds N
    (L, A and N acknowledge it) and removes A (L and N do): {B, N} is a majority of the new
    configuration, and B never confirmed L's lease.  L is then cut off from everyone.

    A lease confirmed by the old voters must not be trusted under the new ones, so a change
    ends it (the fix).  Pre-vote alone already covers it: each configuration's entry was
    acknowledged by a majority of that configuration after the lease's round went out, and
    a member that acknowledged L grants no pre-vote for a heartbeat timeout (longer than the
    lease), so every majority that could elect holds one that waits.  The run shows it with
    the lease kept across both changes too: no leader is elected before L's lease runs out,
    and every lease read answered holds every acknowledged append."""
    import contextlib

    from .fix_reverts import revert
    from .sim_config import LEASE_ELECTION

    sim = GroupSim(3, seed, store_kind="memory", replication=sim_config_for(seed), spares=1,
                   clients=1, election=LEASE_ELECTION, test_name="lease_two_changes",
                   **{**QUIET, "readers": 3, "readers_stay": True, "follower_reads": 0.0})  # fmt: skip
    try:
        with revert("lease-config") if reverted else contextlib.nullcontext():
            L, A, B = _settled(sim, 5)
            N = "n3"
            clog = L.node.logic.config_log
            reads = L.node.core.reads
            _run_until(sim, lambda: reads.lease_holds(L.state.current_term, sim.clock.now_ms))
            confirmed = reads._lease[1]  # the lease before the changes
            sim.net.cut_both(L.id, B)
            sim._step(L.node, mc.ChangeMembers(Op.ADD, N, None, ""))
            _run_until(sim, lambda: N in clog.latest().voters
                       and not clog.pending(L.store.committed_index))  # fmt: skip
            sim._step(L.node, mc.ChangeMembers(Op.REMOVE, A, None, ""))
            _run_until(sim, lambda: A not in clog.latest().members
                       and not clog.pending(L.store.committed_index))  # fmt: skip
            term = L.state.current_term
            _run_until(sim, lambda: reads.lease_holds(term, sim.clock.now_ms))
            until = reads._lease[1]  # L serves lease reads until then
            if reverted:  # the lease of the old voters outlived both changes
                assert until >= confirmed
            cut_at = sim.clock.now_ms
            for p in (A, N):
                sim.net.cut_both(L.id, p)
            others = [sim.members[p] for p in (B, N)]
            _run_until(sim, lambda: any(m.alive and m.state.is_leader
                                        and m.state.current_term > term for m in others))  # fmt: skip
            assert sim.clock.now_ms >= until, (cut_at, until, sim.clock.now_ms)
            sim.net.heal()
            _heal_and_check(sim)
    except SimulationFailure as exc:
        pytest.fail(str(exc).split("\n")[0])
    finally:
        sim.close()


@pytest.mark.parametrize("reverted", [False, True], ids=["fixed", "refused"])
@pytest.mark.parametrize("seed", [2, 4, 5])
def test_a_log_beginning_right_after_its_snapshot_point_takes_the_next_leaders_entries(
    seed, reverted
):
    """Leader L of {L, A, B}, learner n3 still empty (cut off from L since it was added).
    The clients pause until every voter holds L's whole log, committed at c; L is cut off
    from A and B, takes its clients' next appends (never committed), snapshots at c and
    compacts its log to begin at c + 1; n3 comes back and L resets it there and sends it
    those appends.  A or B leads next, with its own entries after c.  L and n3 both hold a
    log that begins right after their snapshot point with an old leader's uncommitted
    entries: the next leader's COMPARE at c matches, and its TRUNCATE there must be taken
    (refused, with the fix reverted, for ever: the group never converges)."""
    import contextlib
    import dataclasses

    from .fix_reverts import revert
    from .sim_config import SIM_ELECTION

    election = dataclasses.replace(SIM_ELECTION, heartbeat_interval_ms=500)  # L leads ~1.5 s
    replication = dataclasses.replace(sim_config_for(seed), compare_timeout_ms=200)
    sim = GroupSim(3, seed, store_kind="file", machine="kv", replication=replication,
                   election=election, spares=1, clients=4, snapshot_keep=1, segment_bytes=256,
                   test_name="snapshot_point", **QUIET)  # fmt: skip
    try:
        with revert("snapshot-point") if reverted else contextlib.nullcontext():
            L, A, B = _settled(sim, 10)
            n3 = sim.members["n3"]
            clog = L.node.logic.config_log
            sim.net.cut_both(L.id, n3.id)
            sim._step(L.node, mc.ChangeMembers(Op.ADD_LEARNER, n3.id, None, ""))
            _run_until(sim, lambda: not clog.pending(L.store.committed_index) and clog.entries)
            sim.clients_on = False
            log_ = L.store
            _run_until(sim, lambda: log_.committed_index == log_.ledger_end_index
                       == L.node.machine_next - 1 and all(
                           sim.members[p].store.ledger_end_index == log_.ledger_end_index
                           for p in (A, B)))  # fmt: skip
            c = L.store.committed_index
            sim.net.cut_both(L.id, A)
            sim.net.cut_both(L.id, B)
            sim.net.restore(L.id, n3.id)
            sim.net.restore(n3.id, L.id)
            sim.clients_on = True
            _run_until(sim, lambda: L.store.ledger_end_index >= c + 2, 2000)
            sim._m_snapshot(L.node, c)  # where its snapshot schedule may cut one
            L.store.flush()  # a segment goes only once the one after it is on disk
            L.store.clean(compact=True)
            assert (L.store.ledger_begin_index, L.store.committed_index) == (c + 1, c)
            _run_until(sim, lambda: n3.store.ledger_begin_index == c + 1
                       and n3.store.ledger_end_index > c, 3000)  # fmt: skip
            _run_until(sim, lambda: any(sim.members[p].state.is_leader for p in (A, B)), 3000)
            if reverted:
                with pytest.raises(pytest.fail.Exception, match="not converged"):
                    _heal_and_check(sim)
            else:
                _heal_and_check(sim)
                assert n3.store.get_term(c + 1) == sim.members[A].store.get_term(c + 1)
    except SimulationFailure as exc:
        pytest.fail(str(exc).split("\n")[0])
    finally:
        sim.close()
