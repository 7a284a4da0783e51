"""A topic in one simulated cluster (:mod:`.topic_sim`): three partitions, each a group of
the all-features mode, on five nodes that each host one member of every partition, under
one clock and one network -- node crashes take down a member of each group at once --
with clients routing keyed batches by the shipped router through each partition's
idempotent session client.

Checked: every group's own checks, and across the topic every acknowledged append
committed once in its key's partition at its acknowledged index, no body committed twice,
and each client's acknowledged appends of a key in the order it issued them; then the
clients write again once every group converged, each must get appends acknowledged by
every partition, and every check runs again.

``RAYLEDGER_SIM_SEED=k`` reruns one seed; ``RAYLEDGER_SIM_SEEDS=N`` (or ``a:b``,
``1,5,9``) runs others.
"""

from __future__ import annotations

import logging

import pytest

from .network import SimulationFailure, sim_seeds
from .topic_sim import TopicSim

CHAOS_MS = 15_000
CONVERGE_MS = 30_000


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def run_topic(seed: int, name: str = "test_topic", chaos_ms: int = CHAOS_MS, **kw) -> TopicSim:
    """One seed: chaos, convergence, the checks; then the clients again and the checks."""
    sim = TopicSim(seed, test_name=name, **kw)
    try:
        sim.run(chaos_ms=chaos_ms, converge_within_ms=CONVERGE_MS)
        # (a power loss without sync_flush may wedge a group for good)
        if not any(g.durability_void for g in sim.groups):
            acks = sim.clients_again()
            idle = [f"p{p}:{c}" for (p, c), n in acks.items() if n == 0]
            if idle:
                sim.fail(f"no append acknowledged after the faults for {idle}")
    finally:
        sim.close()
    return sim


@pytest.mark.parametrize("seed", sim_seeds(8, offset=300_000))
def test_topic(seed: int) -> None:
    run_topic(seed)


def test_the_topic_run_reaches_what_it_checks() -> None:
    """Seed 300002 has leaders change in every partition, appends acknowledged in several
    terms of each, two node crashes that each take down members of several groups, and
    keyed appends acknowledged by every partition, several per client and key."""
    got = run_topic(300_002, "test_the_topic_run_reaches_what_it_checks").reached()
    assert got["partitions_with_leader_changes"] >= 2, got
    assert got["partitions_acked_in_several_terms"] >= 2, got
    assert got["node_crashes_several_groups"] >= 1, got
    assert got["partitions_acked"] == 3, got
    assert got["key_order_pairs"] >= 100, got


def test_a_router_over_another_count_fails_the_partition_check() -> None:
    """Clients that hash keys over two partitions of the three: every check of each group
    holds, the topic's catches appends acknowledged outside their key's partition."""
    with pytest.raises(SimulationFailure, match=r"but the key maps to p\d"):
        run_topic(300_000, "test_a_router_over_another_count_fails_the_partition_check",
                  chaos_ms=3000, route_partitions=2)  # fmt: skip


@pytest.mark.chaos
@pytest.mark.parametrize("seed", sim_seeds(300, offset=310_000))
def test_chaos_topic(seed: int) -> None:
    run_topic(seed, "test_chaos_topic")
