"""An idempotent client through a leader cut off from its peers (not from the client), on
Ray, with DLedger's default timers: the appends the old leader took and lost end unknown,
and the same client's appends flow again once the peers elect a new leader -- within that
election plus one client deadline, never wedged on its session's hole (OUT_OF_ORDER_SEQUENCE
until the session expires).  After healing, every acknowledged body is committed once.

Also: a call naming a member added after the client was made finds it."""

from __future__ import annotations

import time

import pytest
from groupcheck import Outcomes, Writer, check_history, stop_writers, wait_until
from rayledger.actors import LedgerConfig
from rayledger.election import Role

pytestmark = pytest.mark.ray

DEADLINE_S = 3.0  # each append's deadline: shorter than the election, so some end unknown
# a call the old leader still holds (its quorum wait), finding the new leader, one commit
# round, on a loaded 2-core machine
SLACK_S = 3.0


def _new_leader(g, old: str, term: int) -> tuple[str, int] | None:
    """A member other than ``old`` that leads a later term, and its term."""
    for m, s in g.status(timeout_s=1.0).items():
        if m != old and s.role == Role.LEADER and s.term > term:
            return m, s.term
    return None


def test_a_leader_cut_off_from_its_peers_does_not_wedge_an_idempotent_client(make_group):
    g = make_group(members=3, config=LedgerConfig())  # DLedger's timers, not the fast ones
    old = g.wait_for_leader(timeout_s=30)
    term = g.status()[old].term
    client = g.client()  # the default: idempotent
    out = Outcomes()
    writer = Writer(client, "w", out, timeout_s=DEADLINE_S)
    writer.start()
    try:
        wait_until(lambda: out.counts()["acked"] >= 20, 20, "appends before the cut")
        sessions = client.sessions_started
        t_cut = time.monotonic()
        g.partition({old}, set(g.members) - {old})
        new, new_term = wait_until(lambda: _new_leader(g, old, term), 30, "a new leader",
                                   every_s=0.2)  # fmt: skip
        t_elect = time.monotonic()
        wait_until(lambda: out.acks_since(t_elect), DEADLINE_S + SLACK_S + 10,
                   lambda: f"an ack after the election ({out})")  # fmt: skip
        t_ack = min(t for t in out.ack_times if t > t_elect)
        unknown_in_cut = out.counts()["unknown"]
        print(f"election {t_elect - t_cut:.1f}s after the cut ({old} -> {new}, term "
              f"{term} -> {new_term}); next ack {t_ack - t_elect:.1f}s after it; "
              f"{unknown_in_cut} unknown, sessions {sessions} -> {client.sessions_started}")  # fmt: skip
        assert t_ack - t_elect <= DEADLINE_S + SLACK_S, (
            f"the client's next ack came {t_ack - t_elect:.1f}s after the election"
        )
        assert unknown_in_cut >= 1, f"no append was left unknown by the cut: {out}"
        assert client.sessions_started > sessions, "the client never left its session"
        acked_after = out.counts()["acked"]
        wait_until(lambda: out.counts()["acked"] >= acked_after + 20, 20, "appends flowing")
    finally:
        g.heal()
        stop_writers([writer])
    check_history(g, out, g.client(timeout_s=60))


def test_a_member_added_after_the_client_was_made_is_found(make_group):
    g = make_group(members=3, store=False)
    g.wait_for_leader()
    client = g.client()
    r = client.append(b"before")
    added = g.add_member()
    assert added not in client.members
    wait_until(lambda: client.committed_index(consistency="committed", member=added) >= r.index,
               20, f"{added} to commit {r.index}")  # fmt: skip
    assert client.get(r.index, consistency="committed", member=added).body == b"before"
