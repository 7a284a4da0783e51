"""Idempotent clients that give appends up at a deadline, with several in flight, in the
whole-group simulation: the shipped session decisions (actors/core/client_session.py) under
leader changes, drops, partitions and crashes.  Sessions are left behind and appends move
to new ones, yet no body is committed twice; and once the faults stop, every client's
appends commit again (none is wedged on a hole in its session)."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from rayledger.actors.core.client_session import ClientSessions

from .group_sim import GroupSim, sim_config_for
from .network import SimulationFailure, sim_seeds

DEADLINE_MS = 900  # an append is given up this long after it was first sent
CALL_TIMEOUT_MS = 300  # a call with no answer by then is unknown: sent again


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _sim(seed: int, **kw) -> GroupSim:
    sim = GroupSim(3, seed, replication=sim_config_for(seed), idempotent=True, clients=3,
                   client_timeout_ms=CALL_TIMEOUT_MS, test_name="test_client_sessions",
                   **kw)  # fmt: skip
    sim.test_file = __file__
    for c in sim.clients:
        c.pipeline, c.deadline_ms = 3, DEADLINE_MS
    return sim


def _run(seed: int, **kw) -> GroupSim:
    sim = _sim(seed, **kw)
    try:
        sim.run()
        acks = sim.clients_again()
        idle = [c.id for c in sim.clients if acks[c.id] < 5]
        assert not idle, f"seed {seed}: no appends acknowledged after the faults for {idle}"
    finally:
        sim.close()
    return sim


@pytest.mark.parametrize("seed", sim_seeds(10, offset=36_000))
def test_sessions_left_behind_commit_nothing_twice(seed: int) -> None:
    _run(seed)


@pytest.mark.parametrize("seed", sim_seeds(6, offset=36_500))
def test_sessions_left_behind_file_stores(seed: int) -> None:
    _run(seed, store_kind="file", sync_flush=True, power_loss=0.3)


def test_the_seeds_leave_sessions_behind_and_move_appends() -> None:
    """The runs above go through what they check: seed 36001 leaves sessions at deadlines
    and for gaps, renumbers appends into new sessions and ends appends unknown."""
    sim = _run(36_001)
    stats = Counter({k: v for k, v in sim.stats.items() if k.startswith("client_")})
    assert stats["client_sessions_left_gave_up"] > 0, stats
    assert stats["client_renumbered"] > 0, stats
    assert stats["client_gap_refusals"] > 0, stats
    assert sim.unknown_outcomes > 0


def test_renumbering_an_append_that_may_be_stored_commits_it_twice(monkeypatch) -> None:
    """The checks bite: a client that sends an append which may be stored under a new
    identity (as if its unknown outcome could be ignored) gets it committed twice."""

    def careless(self, key) -> bool:
        a = self._appends.get(key)
        return a is not None and (a.in_flight or (a.ident[0] == self.client_id and not a.maybe))

    monkeypatch.setattr(ClientSessions, "pinned", careless)
    failed = 0
    for seed in sim_seeds(8, offset=36_000):
        try:
            _run(seed)
        except SimulationFailure as exc:
            failed += "committed twice" in str(exc) or "acknowledged twice" in str(exc)
    assert failed >= 1
