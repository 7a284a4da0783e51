"""The topic's rebalancing decisions (integration/topic/balance.py), without Ray."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from rayledger.integration.topic.balance import Lead, SettleWatch, plan_moves, share

NODES = ["n0", "n1", "n2", "n3"]


def counts(leads: list[Lead], live: list[str]) -> dict[str, int]:
    c = {n: 0 for n in live}
    for lead in leads:
        if lead.node in c:
            c[lead.node] += 1
    return c


def applied(leads: list[Lead], moves) -> list[Lead]:
    out = list(leads)
    for mv in moves:
        out[mv.partition] = dataclasses.replace(out[mv.partition], leader=mv.target, node=mv.node)
    return out


@st.composite
def topics(draw, full: bool = False):
    """A topic of 1-8 partitions of 3 members on 2-4 nodes (one member per node when there
    are enough), some nodes lost, each partition led by a live member or by none."""
    n_nodes = draw(st.integers(2, 4))
    nodes = NODES[:n_nodes]
    live = sorted(draw(st.sets(st.sampled_from(nodes), min_size=1)))
    parts = draw(st.integers(1, 8))
    leads = []
    for p in range(parts):
        members = {f"m{j}": nodes[(p + j) % n_nodes] for j in range(3 if not full else n_nodes)}
        alive = [m for m, n in members.items() if n in live]
        leader = draw(st.sampled_from([None, *alive])) if alive else None
        leads.append(Lead(p, leader, members.get(leader), f"m{p % len(members)}", members))
    return leads, live


@settings(max_examples=300, deadline=None)
@given(topics())
def test_moves_go_to_a_live_member_and_never_pile_up(t) -> None:
    leads, live = t
    before = counts(leads, live)
    moves = plan_moves(leads, live)
    for mv in moves:
        lead = leads[mv.partition]
        assert mv.source == lead.leader and mv.target != lead.leader
        assert lead.members[mv.target] == mv.node and mv.node in live
    after = counts(applied(leads, moves), live)
    assert sum(after.values()) == sum(before.values())  # nobody loses or gains a leader
    assert max(after.values()) <= max(before.values())
    if moves:  # each move evens the load: the spread's sum of squares falls
        assert sum(v * v for v in after.values()) < sum(v * v for v in before.values())


@settings(max_examples=300, deadline=None)
@given(topics(full=True))
def test_with_a_member_on_every_node_each_live_node_ends_at_its_share(t) -> None:
    leads, live = t
    moves = plan_moves(leads, live)
    after = applied(leads, moves)
    assert max(counts(after, live).values()) <= share(len(leads), len(live))
    assert plan_moves(after, live) == []  # settled: nothing more to do


def test_a_displaced_leader_moves_before_one_at_home() -> None:
    members = {"a": "n0", "b": "n1", "c": "n2"}
    leads = [  # n0 lost; n1 leads p0 (at home), p1 and p2 (displaced from n0)
        Lead(0, "b", "n1", "b", members),
        Lead(1, "b", "n1", "a", members),
        Lead(2, "b", "n1", "a", members),
        Lead(3, "c", "n2", "c", members),
    ]
    moves = plan_moves(leads, ["n1", "n2"])
    assert [(m.partition, m.target, m.node) for m in moves] == [(1, "c", "n2")]


def test_nothing_moves_when_no_member_sits_on_a_lighter_node() -> None:
    members = {"a": "n0", "b": "n1"}
    leads = [Lead(p, "a", "n0", "a", members) for p in range(3)]
    assert plan_moves(leads, ["n0", "n2"]) == []  # n2 leads none but holds no member
    assert len(plan_moves(leads, ["n0", "n1"])) == 1


def test_a_settle_watch_waits_for_still_leaders_all_led() -> None:
    members = {"a": "n0", "b": "n1"}
    led = [Lead(0, "a", "n0", "a", members), Lead(1, "b", "n1", "b", members)]
    unled = [led[0], Lead(1, None, None, "b", members)]
    w = SettleWatch(1000)
    assert not w.observe(0, unled, ["n0", "n1"])
    assert not w.observe(5000, unled, ["n0", "n1"])  # still and long enough, but unled
    assert not w.observe(6000, led, ["n0", "n1"])  # changed: the clock starts again
    assert not w.observe(6500, led, ["n0", "n1"])
    assert w.observe(7000, led, ["n0", "n1"])
    assert not w.observe(7100, led, ["n0"])  # a node went: starts again
    assert w.observe(8100, led, ["n0"])
    w.moved()
    assert not w.observe(8200, led, ["n0"])
