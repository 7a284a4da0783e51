"""Seeded simulations of 3- and 5-member election groups.

Every step of every run checks Election Safety, monotonic terms, persisted votes
and transfer deadlines (see ``election_sim.py``); the scenarios add liveness.

Seeds: ``RAYLEDGER_SIM_SEEDS=2000`` (count, ``a:b`` range or ``1,2,3`` list) runs
more; ``RAYLEDGER_SIM_SEED=1234`` reproduces one failure.  Each failure message
names its seed and the command that replays it.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable

import pytest
from rayledger.election import ElectionConfig, Role
from rayledger.storage.errors import ResponseCode

from .election_sim import ElectionSim, SimulationFailure
from .network import FaultConfig, NetworkConfig, sim_seeds


def _admit(el) -> None:
    """The leader's admission check for one append (raises what the client would get)."""
    from rayledger.replication import ReplicationConfig
    from rayledger.replication.admission import check_append

    check_append(el.state, el.state.group, None, [b"x"], 0, ReplicationConfig())


# A leader must appear this soon once a majority is up and connected.  DLedger's
# slowest honest path: a follower's 6 s heartbeat timeout, a vote round of up to
# 3 s, an ALREADY_HAS_LEADER back-off of 6 s + vote interval, then two rounds for
# TERM_NOT_READY -> REVOTE_IMMEDIATELY.  Without message loss the worst of
# thousands of seeds is ~8 s.  When messages are dropped, a vote round that loses
# one answer waits for its deadline and an exact quorum (3 of 5) can split its
# votes several terms in a row (worst seen ~38 s at 4 % loss), hence a looser
# bound for lossy networks.
ELECTION_BOUND_MS = 30_000
LOSSY_ELECTION_BOUND_MS = 60_000
CFG = ElectionConfig()
TRANSFER_TIMEOUT_MS = CFG.leadership_transfer_wait_timeout_ms
STEP_DOWN_BOUND_MS = (CFG.max_heartbeat_leak + 1) * CFG.heartbeat_interval_ms + 100

# No loss; random delays, duplicates and reordering.  RELIABLE adds occasional
# 400-800 ms delays on top.
PROMPT = NetworkConfig(min_delay_ms=1, max_delay_ms=30, duplicate_rate=0.05)
RELIABLE = NetworkConfig(min_delay_ms=1, max_delay_ms=30, duplicate_rate=0.05, long_delay_rate=0.02)


@pytest.fixture(autouse=True)
def _quiet_election_log():
    """The simulations produce thousands of protocol lines; keep only errors."""
    logger = logging.getLogger("rayledger.election")
    old = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(old)


def _each_seed(seeds: list[int], one: Callable[[int], None]) -> None:
    """Run ``one`` per seed; any failure names its seed and how to replay it."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    for seed in seeds:
        try:
            one(seed)
        except SimulationFailure:
            raise
        except Exception as exc:
            raise AssertionError(
                f"seed={seed}: {type(exc).__name__}: {exc}\n"
                f"reproduce with: RAYLEDGER_SIM_SEED={seed} pytest '{test}'"
            ) from exc


def _elect(sim: ElectionSim) -> str:
    sim.wait_for(
        "first leader followed by everyone",
        lambda: sim.stable_leader() is not None,
        ELECTION_BOUND_MS,
    )
    leader = sim.stable_leader()
    assert leader is not None
    return leader


def _elected(n: int, seed: int, network: NetworkConfig, label: str) -> tuple[ElectionSim, str]:
    """A simulation of ``n`` members and the first leader everyone follows."""
    sim = ElectionSim(n, seed, network=network, label=label)
    return sim, _elect(sim)


def _others(sim: ElectionSim, mid: str) -> list[str]:
    return [other for other in sim.ids if other != mid]


# ----------------------------------------------------------------- chaos


@pytest.mark.parametrize("n", [3, 5])
def test_chaos_safety_then_recovery(n: int) -> None:
    """Drops, duplicates, reordering, partitions, one-way cuts, crashes, restarts and
    transfer requests for 40 s; then heal, and a leader must emerge in time."""

    def one(seed: int) -> None:
        sim = ElectionSim(
            n,
            seed,
            network=NetworkConfig.lossy(1.0),
            faults=FaultConfig(),
            label=f"chaos-{n}",
        )
        rng = random.Random(seed)
        while sim.clock.now_ms < 40_000:
            sim.run_for(rng.randint(500, 4000))
            if rng.random() < 0.4:
                sim.request_transfer(rng.choice(sim.ids))
        assert sim.injector is not None
        sim.injector.heal_all(NetworkConfig.lossy(0.2))
        sim.wait_for(
            "a leader followed by every member after healing",
            lambda: sim.stable_leader() is not None,
            LOSSY_ELECTION_BOUND_MS,
        )

    _each_seed(sim_seeds(150 if n == 3 else 100, offset=10_000 * n), one)


@pytest.mark.parametrize("n", [3, 5])
def test_restart_storm_never_contradicts_a_persisted_vote(n: int) -> None:
    """Crash and restart members every few hundred ms; restarts keep only the
    persisted term/vote, and no member may vote twice in a term."""
    faults = FaultConfig(
        mean_interval_ms=400,
        weights=(("crash", 3.0), ("restart", 3.0), ("heal", 1.0), ("one_way", 0.5)),
    )

    def one(seed: int) -> None:
        sim = ElectionSim(
            n, seed, network=NetworkConfig.lossy(0.5), faults=faults, label=f"restart-storm-{n}"
        )
        sim.run_for(30_000)
        assert sim.votes, "no vote was ever cast"
        assert sim.injector is not None
        sim.injector.heal_all(NetworkConfig())
        sim.wait_for(
            "a leader after the storm", lambda: sim.stable_leader() is not None, ELECTION_BOUND_MS
        )

    _each_seed(sim_seeds(60, offset=20_000 * n), one)


# -------------------------------------------------------------- liveness


@pytest.mark.parametrize("lossy", [False, True], ids=["reliable", "lossy"])
@pytest.mark.parametrize("n", [3, 5])
def test_leader_elected_with_a_healthy_majority(n: int, lossy: bool) -> None:
    """A minority down or cut off from the start must not prevent an election."""
    network = NetworkConfig.lossy(0.5) if lossy else RELIABLE
    bound = LOSSY_ELECTION_BOUND_MS if lossy else ELECTION_BOUND_MS

    def one(seed: int) -> None:
        sim = ElectionSim(n, seed, network=network, label=f"majority-{n}")
        rng = random.Random(seed)
        minority = rng.sample(sim.ids, rng.randint(0, (n - 1) // 2))
        for mid in minority:
            if rng.random() < 0.5:
                sim.crash(mid)
            else:
                sim.net.isolate(mid)
        majority = [mid for mid in sim.ids if mid not in minority]
        sim.wait_for(
            f"a leader of {majority}", lambda: sim.stable_leader(majority) is not None, bound
        )

    _each_seed(sim_seeds(100, offset=30_000 * n + 1000 * lossy), one)


@pytest.mark.parametrize("n", [3, 5])
def test_isolated_leader_steps_down_and_majority_moves_on(n: int) -> None:
    def one(seed: int) -> None:
        sim, old = _elected(n, seed, RELIABLE, f"isolate-leader-{n}")
        sim.run_for(random.Random(seed).randint(0, 4000))
        sim.net.isolate(old)
        t0 = sim.clock.now_ms
        sim.wait_for(
            f"isolated leader {old} stepping down",
            lambda: sim.elector(old).role is not Role.LEADER,
            STEP_DOWN_BOUND_MS,
        )
        assert sim.clock.now_ms - t0 > CFG.heartbeat_interval_ms, "stepped down too early"
        rest = _others(sim, old)
        sim.wait_for(
            "a new leader of the majority",
            lambda: sim.stable_leader(rest) is not None,
            ELECTION_BOUND_MS,
        )
        new = sim.stable_leader(rest)
        new_term = sim.elector(new).term
        sim.net.heal()
        sim.wait_for(
            f"old leader {old} following after heal",
            lambda: sim.stable_leader() is not None,
            ELECTION_BOUND_MS,
        )
        # the majority's leader kept its term: the returning old leader follows it
        leader = sim.stable_leader()
        assert (leader, sim.elector(new).term) == (new, new_term), (old, leader, sim.terms())

    _each_seed(sim_seeds(60, offset=40_000 * n), one)


@pytest.mark.parametrize("n", [3, 5])
def test_pre_vote_keeps_a_reconnecting_member_from_deposing_the_leader(n: int) -> None:
    """Cut one follower from the leader only (it still reaches the others), then
    isolate it entirely, then reconnect it: the healthy leader keeps its term."""

    def one(seed: int) -> None:
        sim, leader = _elected(n, seed, RELIABLE, f"pre-vote-{n}")
        sim.run_for(2000)
        term = sim.elector(leader).term
        rng = random.Random(seed)
        member = rng.choice(_others(sim, leader))
        changes_before = len(sim.role_changes)

        sim.net.cut_both(leader, member)
        sim.run_for(rng.randint(15_000, 30_000))
        sim.net.heal()
        sim.net.isolate(member)
        sim.run_for(rng.randint(10_000, 25_000))
        sim.net.heal()
        sim.wait_for(
            f"{member} following {leader} again",
            lambda: sim.stable_leader() == leader,
            ELECTION_BOUND_MS,
        )
        leader_changes = [rc for _, mid, rc in sim.role_changes[changes_before:] if mid == leader]
        if leader_changes or max(sim.terms().values()) != term:
            sim.fail(
                f"{member} disturbed leader {leader} of term {term}: "
                f"leader role changes {leader_changes}, terms {sim.terms()}"
            )

    _each_seed(sim_seeds(40, offset=50_000 * n), one)


@pytest.mark.parametrize("n", [3, 5])
def test_preferred_leader_ends_up_leading(n: int) -> None:
    def one(seed: int) -> None:
        rng = random.Random(seed)
        preferred = f"n{rng.randrange(n)}"
        sim = ElectionSim(
            n,
            seed,
            config=ElectionConfig(preferred_leader_ids=(preferred,)),
            network=NetworkConfig.lossy(0.5),
            label=f"preferred-{n}",
        )
        sim.wait_for(
            f"preferred leader {preferred} leading",
            lambda: sim.stable_leader() == preferred,
            LOSSY_ELECTION_BOUND_MS,
        )

    _each_seed(sim_seeds(60, offset=60_000 * n), one)


@pytest.mark.parametrize("n", [3, 5])
def test_a_new_group_first_elects_its_preferred_leader(n: int) -> None:
    """The others wait one vote interval more before their first campaign: on a
    reliable network the group's first leader is the preferred member, with no hand-over."""

    def one(seed: int) -> None:
        preferred = f"n{random.Random(seed).randrange(n)}"
        sim = ElectionSim(n, seed, config=ElectionConfig(preferred_leader_ids=(preferred,)),
                          label=f"first-{n}")  # fmt: skip
        sim.wait_for("a first leader", lambda: bool(sim.leaders()), LOSSY_ELECTION_BOUND_MS)
        assert sim.leaders() == [preferred], (sim.leaders(), sim.terms())

    _each_seed(sim_seeds(30, offset=65_000 * n), one)


@pytest.mark.parametrize("n", [3, 5])
def test_transfer_completes_within_its_timeout(n: int) -> None:
    def one(seed: int) -> None:
        # No long delays here: the old leader must hear of the new term in time.
        sim, leader = _elected(n, seed, PROMPT, f"transfer-{n}")
        rng = random.Random(seed)
        sim.run_for(rng.randint(2500, 5000))  # followers caught up, peers marked live
        target = rng.choice(_others(sim, leader))
        resp = sim.request_transfer(target)
        assert resp is not None and resp.code == ResponseCode.SUCCESS, resp
        with pytest.raises(Exception) as refused:
            _admit(sim.elector(leader))
        assert refused.value.code == ResponseCode.LEADER_TRANSFERRING
        sim.wait_for(
            f"{target} leading after the transfer",
            lambda: sim.elector(target).role is Role.LEADER,
            TRANSFER_TIMEOUT_MS,
        )
        sim.wait_for(
            f"{leader} seeing the transfer through",
            lambda: any(mid == leader for _, mid, _ in sim.transfer_outcomes),
            TRANSFER_TIMEOUT_MS,
        )
        outcomes = [o for _, mid, o in sim.transfer_outcomes if mid == leader]
        assert outcomes[-1].code == ResponseCode.SUCCESS, outcomes
        sim.wait_for(
            "everyone following the transferee", lambda: sim.stable_leader() == target, 10_000
        )

    _each_seed(sim_seeds(60, offset=70_000 * n), one)


@pytest.mark.parametrize("n", [3, 5])
def test_transfer_to_a_lagging_member_is_abandoned_in_time(n: int) -> None:
    def one(seed: int) -> None:
        sim, leader = _elected(n, seed, RELIABLE, f"transfer-abandon-{n}")
        sim.run_for(3000)
        rng = random.Random(seed)
        target = rng.choice(_others(sim, leader))
        # The target hears nothing from the leader any more (no log, no orders),
        # but still answers and is marked live from the leader's last round.
        sim.net.cut(leader, target)
        sim.run_for(rng.randint(1, 500))
        term = sim.elector(leader).term
        resp = sim.request_transfer(target)
        assert resp is not None and resp.code == ResponseCode.SUCCESS
        t0 = sim.clock.now_ms
        sim.wait_for(
            "the transfer ending",
            lambda: not sim.elector(leader).transferring,
            TRANSFER_TIMEOUT_MS + 2 * sim.tick_ms,
        )
        assert sim.clock.now_ms - t0 <= TRANSFER_TIMEOUT_MS + 2 * sim.tick_ms
        # abandoned: the leader still leads its term (the others still hear it, so the cut-off
        # target gets no pre-vote), takes appends again and reports the transfer failed
        el = sim.elector(leader)
        assert el.role is Role.LEADER and el.term == term, (el.role, el.term, term)
        _admit(el)  # appends flow again
        assert [o.code for _, mid, o in sim.transfer_outcomes if mid == leader][-1] in (
            ResponseCode.TIMEOUT,
            ResponseCode.TAKE_LEADERSHIP_FAILED,
        )

    _each_seed(sim_seeds(40, offset=80_000 * n), one)


# ------------------------------------------------------------- long runs


@pytest.mark.chaos
@pytest.mark.parametrize("n", [3, 5])
def test_long_chaos(n: int) -> None:
    """Five simulated minutes of faults per seed, with a preferred leader and transfers."""

    def one(seed: int) -> None:
        sim = ElectionSim(
            n,
            seed,
            config=ElectionConfig(preferred_leader_ids=("n0",)),
            network=NetworkConfig.lossy(1.0),
            faults=FaultConfig(mean_interval_ms=1500),
            label=f"long-chaos-{n}",
        )
        rng = random.Random(seed)
        while sim.clock.now_ms < 300_000:
            sim.run_for(rng.randint(500, 5000))
            if rng.random() < 0.3:
                sim.request_transfer(rng.choice(sim.ids))
        assert sim.injector is not None
        sim.injector.heal_all(NetworkConfig.lossy(0.2))
        sim.wait_for("preferred leader after healing", lambda: sim.stable_leader() == "n0", 60_000)

    _each_seed(sim_seeds(4, offset=90_000 * n), one)
