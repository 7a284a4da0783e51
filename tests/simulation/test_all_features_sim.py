"""Every feature of the simulation at once (:func:`~.sim_config.all_features`): operator
membership changes and lost nodes replaced by the leader, idempotent clients, the KV or
RocketMQ machine with snapshots, compaction and installs (the client sessions in the
snapshots), reads at every consistency on any member, KV gets, leadership transfers, sync
flush with power loss or async file stores, hung, killed and slowly booting helpers,
helpers' configurations that lag by seconds, and seeded delays on every message -- under the
random network faults, crashes and restarts of every other sweep.

Some seeds add short client-session TTLs with members' clocks off the clients', and an
operator who removes voters the leader just lost its links to, down to a single voter
(:func:`~.sim_config.all_features`).

Checked: Raft's safety properties (:mod:`.invariants`), every acknowledged append committed
once where it was acknowledged, no body committed twice, every machine equal to a replay of
the committed log, every member's session table the same once converged, and the clients'
KV history linearizable per key (:mod:`.kv_history`);
then the clients write again once the group has converged, each must get appends
acknowledged (none is wedged on its session), and every check runs again.

``RAYLEDGER_SIM_SEED=k`` reruns one seed; ``RAYLEDGER_SIM_SEEDS=N`` (or ``a:b``, ``1,5,9``)
runs others; ``python -m tests.simulation.sweep`` runs many and prints a summary.
"""

from __future__ import annotations

import logging

import pytest

from .group_sim import GroupSim
from .network import sim_seeds
from .sim_config import all_features

FILE = "tests/simulation/test_all_features_sim.py"
COVERAGE_SEEDS = (110_000, 110_001, 110_002)
CHAOS_MS = 15_000
CONVERGE_MS = 30_000


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def run_all_features(seed: int, name: str = "test_all_features", **kw) -> GroupSim:
    """One seed of the mode: three voters (five on every fifth seed) and two spares."""
    args = {**all_features(seed), **kw}
    n = 5 if seed % 5 == 4 else 3
    sim = GroupSim(n, seed, test_name=name, test_file=FILE,
                   label=f"all-features n={n} {args['machine']}", **args)  # fmt: skip
    try:
        sim.run(chaos_ms=CHAOS_MS, converge_within_ms=CONVERGE_MS)
        if not sim.durability_void:  # (a power loss without sync_flush may wedge it for good)
            acks = sim.clients_again()
            idle = [c for c, n in acks.items() if n == 0]
            if idle:
                sim.fail(f"no append acknowledged after the faults for {idle}")
    finally:
        sim.close()
    return sim


def ci_seeds() -> list[int]:
    """26 seeds from 110000 (or the seeds the environment asks for)."""
    return sim_seeds(26, offset=110_000)


@pytest.mark.parametrize("seed", ci_seeds())
def test_all_features(seed: int) -> None:
    run_all_features(seed)


REACHED = (
    "change_add", "change_replace", "change_remove", "nodes_lost", "spawns_ok",
    "dispatchers_booting", "calls_wait_for_boot", "checker_configures_delayed",
    "machine_snapshots", "machine_installs", "idempotent_retries", "kv_history_ok",
    "reads_served_lease_leader", "reads_served_linearizable_follower",
    "reads_served_committed_follower", "kv_gets_lease", "transfers_asked", "power_losses",
    "checker_hangs", "dispatcher_hangs", "dispatcher_kills",
)  # fmt: skip


def test_one_leader_per_term_when_a_change_shrinks_the_voters() -> None:
    """Seed 112744 reaches a candidate that lost the election of its term with a minority of
    five voters, then sees two removals leave three, and campaigns again in the same term:
    the votes it kept made a majority of the three, a second leader of the term."""
    run_all_features(112_744, "test_one_leader_per_term_when_a_change_shrinks_the_voters")


def test_the_mode_reaches_every_feature() -> None:
    """The mode is not the plain sweep again: three seeds together change members, lose
    nodes and replace them, boot dispatchers slowly, delay the checker's
    configurations, snapshot and install, retry idempotent appends, check a KV history,
    serve reads at every consistency, transfer, lose power and hang helpers."""
    total: dict[str, int] = {}
    for seed in COVERAGE_SEEDS:
        for k, v in run_all_features(seed, "test_the_mode_reaches_every_feature").stats.items():
            total[k] = total.get(k, 0) + v
    missing = [k for k in REACHED if not total.get(k)]
    assert not missing, (missing, total)


# For each safety fix (tests/simulation/fix_reverts.py), a seed of this mode that fails with
# that fix reverted -- found by ``python -m tests.simulation.revert_sweep --first`` -- run
# here with every fix in place; test_each_pinned_seed_fails_with_its_fix_reverted (a long
# run) checks that each still fails without its fix.
PINNED: dict[str, int] = {
    "kv-snapshot-cut": 111_006,
    "same-term-campaign": 112_744,
    "term-queue": 111_010,
    "checker-config": 111_506,
    "stranded-machine": 127_192,
    "votes-by-configuration": 114_315,
    "client-stays": 111_001,
    "session-born": 111_137,
    "snapshot-sessions-twice": 151_012,
    "read-expire": 111_112,
    "session-expiry": 114_006,
    "sessions-verify": 114_004,
    "sessions-whole-first": 112_643,
    "damaged-newest-ask": 111_735,
    "sessions-unknown": 114_803,
    "stranded-at-start": 200_040,
    "expired-cut": 200_178,
    "graph-stop": 200_286,
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_seed_pinned_for_each_fix(name: str) -> None:
    run_all_features(PINNED[name], f"test_the_seed_pinned_for_each_fix[{name}]")


@pytest.mark.chaos
@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_pinned_seed_fails_with_its_fix_reverted(name: str) -> None:
    from .fix_reverts import revert

    with revert(name), pytest.raises(Exception):  # noqa: B017 -- any failure of the run
        run_all_features(PINNED[name], f"test_each_pinned_seed_fails_with_its_fix_reverted[{name}]")


@pytest.mark.chaos
@pytest.mark.parametrize("seed", sim_seeds(1000, offset=111_000))
def test_chaos_all_features(seed: int) -> None:
    run_all_features(seed, "test_chaos_all_features")
