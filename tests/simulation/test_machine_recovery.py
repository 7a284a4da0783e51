"""A state machine that loses the snapshot bridging the gap below its log's begin recovers:
a scripted whole-group run over the shipped cores (KV machines on file stores).

A follower away while the group compacted its logs gets the leader's snapshot and its log
reset to the leader's begin; it catches up, then restarts before its machine takes a
snapshot of its own, and that restart finds the installed snapshot damaged (the
simulation's own fault).  Its machine now stands below its log's begin, and its log matches
the leader's, so the leader would never reset it -- nor, before, send it a snapshot: the
machine waited for one for good.  Its push answers now ask for a snapshot, the leader's
dispatcher sends its newest, the machine loads it and applies on from its own log, which
is left as it is (nothing it acknowledged is dropped).
"""

from __future__ import annotations

import logging

import pytest

from .group_sim import GroupSim, sim_config_for

QUIET = dict(
    faults=False, hangs=False, dispatcher_faults=False, transfers=False, fast_path=False,
    slow_followers=False, readers=0,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _ready_leader(sim: GroupSim):
    ls = [m for m in sim.members.values() if m.alive and m.state.is_leader
          and m.node.logic.ready_term == m.state.current_term]  # fmt: skip
    return ls[0] if len(ls) == 1 else None


def _run_until(sim: GroupSim, pred, limit_ms: int) -> None:
    end = sim.clock.now_ms + limit_ms
    while sim.clock.now_ms < end:
        sim.step(end)
        if pred():
            return
    pytest.fail(f"gave up waiting at t={sim.clock.now_ms} ms")


def test_a_machine_whose_installed_snapshot_is_damaged_at_a_restart_catches_up() -> None:
    """A seed that reaches it: the follower installs the leader's snapshot with its log
    reset past its old end, and is the member that restarts with it damaged (its machine
    back at -1, the entries below its log's begin gone from every log)."""
    installed_snapshot_damaged_at_restart(DAMAGED_INSTALL_SEED)


DAMAGED_INSTALL_SEED = 13


def installed_snapshot_damaged_at_restart(seed: int) -> None:
    sim = GroupSim(3, seed, store_kind="file", replication=sim_config_for(seed), machine="kv",
                   clients=4, client_interval_ms=(1, 15), test_name="machine_recovery",
                   **QUIET)  # fmt: skip
    # compactions (the seeded draw below 0.5) but no random damage (below 0.3)
    sim._snapshot_rng.random = lambda: 0.4
    try:
        _run_until(sim, lambda: _ready_leader(sim) is not None
                   and _ready_leader(sim).store.committed_index >= 50, 20_000)  # fmt: skip
        lead = _ready_leader(sim)
        f = next(m for m in sim.members.values() if m is not lead and m.alive)
        sim.net.isolate(f.id)
        f_end = f.store.ledger_end_index
        _run_until(sim, lambda: lead.store.ledger_begin_index > f_end + 1, 30_000)
        sim.net.heal()
        _run_until(sim, lambda: f.node.applier.core.applied >= lead.store.ledger_begin_index - 1
                   and f.store.ledger_begin_index > f_end, 20_000)  # fmt: skip
        assert sim.stats["machine_installs"] >= 1, sim.stats
        begin = f.store.ledger_begin_index
        # the writers pause until the follower has caught up (it is no longer below the
        # leader's begin), then it crashes before its machine takes a snapshot of its own
        sim.clients_on = False
        _run_until(sim, lambda: f.store.ledger_end_index == lead.store.ledger_end_index
                   and all(c.outstanding is None for c in sim.clients), 10_000)  # fmt: skip
        sim.crash(f.id, power=False)
        sim._snapshot_rng.random = lambda: 0.0  # this restart finds its newest snapshot damaged
        sim.restart(f.id)
        sim._snapshot_rng.random = lambda: 0.4
        core = f.node.applier.core
        assert sim.stats["snapshot_damaged"] == 1, sim.stats
        assert core.applied < f.store.ledger_begin_index - 1 == begin - 1  # stranded
        kept = f.store.read_batch(begin, 1 << 30, 1 << 30).data
        sim.client_interval_ms = (40, 80)
        sim.clients_on = True
        _run_until(sim, lambda: core.applied >= begin and not core.stranded, 20_000)
        # the follower's log was left as it was: the install replaced no entry it held
        assert f.store.ledger_begin_index == begin
        assert f.store.read_batch(begin, 1 << 30, 1 << 30).data[: len(kept)] == kept
        sim.heal()
        assert sim.run_for(20_000, sim.converged), "the group did not converge"
        assert core.applied == f.store.committed_index and core.failed is None
        sim.check_machines()
        assert sim.stats["machine_installs"] >= 2, sim.stats
    finally:
        sim.close()
