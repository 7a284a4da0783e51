"""Exactly-once appends in the whole-group simulation: idempotent clients retry
every unknown outcome under the same identity -- across leader changes, drops, duplicates,
partitions, crashes and power loss -- and the committed log must hold each of their bodies
exactly once, at the index each acknowledgement named."""

from __future__ import annotations

import logging

import pytest
from rayledger.replication.sessions import Check, SessionTable, Verdict

from .group_sim import GroupSim, sim_config_for
from .network import SimulationFailure, sim_seeds


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _run(seed: int, **kw) -> GroupSim:
    sim = GroupSim(3, seed, replication=sim_config_for(seed), idempotent=True, clients=3,
                   test_name="test_idempotent", **kw)  # fmt: skip
    try:
        sim.run()
    finally:
        sim.close()
    return sim


@pytest.mark.parametrize("seed", sim_seeds(20, offset=24_000))
def test_retries_commit_once_memory(seed: int) -> None:
    sim = _run(seed)
    assert sim.stats["idempotent_retries"] > 0  # the faults made the clients retry


@pytest.mark.parametrize("seed", sim_seeds(10, offset=24_500))
def test_retries_commit_once_file(seed: int) -> None:
    _run(seed, store_kind="file")


@pytest.mark.parametrize("seed", sim_seeds(10, offset=24_800))
def test_retries_commit_once_file_sync_flush_power_loss(seed: int) -> None:
    _run(seed, store_kind="file", sync_flush=True, power_loss=0.3)


def test_without_the_session_check_retries_commit_twice(monkeypatch) -> None:
    """The guard matters: a leader that takes every retry as new writes it again."""
    monkeypatch.setattr(SessionTable, "check", lambda self, *a, **k: Check(Verdict.NEW))
    failed = 0
    for seed in sim_seeds(6, offset=24_000):
        try:
            _run(seed)
        except SimulationFailure as exc:
            failed += "committed twice" in str(exc) or "acknowledged twice" in str(exc)
    assert failed >= 1
