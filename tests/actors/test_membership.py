"""Membership on Ray (issue 22): add, promote, replace and remove members of a running
group while a client appends, and the coded refusals that change nothing."""

from __future__ import annotations

import threading

import pytest
import ray
from groupcheck import assert_consistent, wait_until
from rayledger.actors import LedgerClient, LedgerError, LedgerGroup
from rayledger.storage import ResponseCode


def _writer(client, stop: threading.Event, acked: list, errors: list) -> threading.Thread:
    def run() -> None:
        k = 0
        while not stop.is_set():
            body = f"w{k}".encode()
            try:
                acked.append((client.append(body).index, body))
            except LedgerError as exc:
                errors.append(exc.code)
            k += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _code(fn) -> ResponseCode:
    with pytest.raises(LedgerError) as e:
        fn()
    return e.value.code


def test_add_replace_and_remove_while_a_client_appends(make_group) -> None:
    g = make_group(3)
    g.wait_for_leader()
    client = g.client()
    stop, acked, errors = threading.Event(), [], []
    t = _writer(client, stop, acked, errors)
    try:
        added = g.add_member()
        assert added == "n3" and g.roles()[added] == "voter"
        wait_until(lambda: g.status()[added].membership == "voter", 10, f"{added} to see it votes")
        # every member leads with the new configuration's helpers (a follower's
        # reconfiguration was once lost in MemberActor.push and held its role lock for good)
        for target in (added, "n2"):
            g.transfer_leadership(target)
            assert client.append(b"led-by-" + target.encode(), timeout_s=10).index > 0
        new = g.replace_member("n1")
        assert new == "n4" and "n1" not in g.members and g.roles()[new] == "voter"
        learner = g.add_member("l1", learner=True)
        assert g.roles()[learner] == "learner"
        g.transfer_leadership("n3")
        g.remove_member("n3")  # the leader: it hands leadership over first
        assert g.wait_for_leader() != "n3"
        assert g.members == ["n0", "n2", "n4", "l1"]
    finally:
        stop.set()
        t.join(30)
    assert len(acked) > 50
    # every acknowledged append is on every current member, at its index
    assert_consistent(g, dict(acked))
    end = g.client().committed_index()
    # a driver that connects now finds the members added
    other = LedgerGroup.get(g.name)
    assert other.members == g.members
    assert LedgerClient.connect(g.name).append(b"late").index > end


def test_refused_changes_leave_the_configuration_as_it_was(make_group) -> None:
    g = make_group(3)
    g.wait_for_leader()
    g.client().append(b"x")
    before = g.membership()["committed"]
    assert _code(lambda: g.add_member("n1")) == ResponseCode.UNEXPECTED_MEMBER
    assert _code(lambda: g.remove_member("nx")) == ResponseCode.UNKNOWN_MEMBER
    assert _code(lambda: g.add_member("bad/id")) == ResponseCode.UNEXPECTED_ARGUMENT
    assert _code(lambda: g.add_member(node_id="f" * 56)) == ResponseCode.NODE_UNAVAILABLE
    assert g.membership()["committed"] == before
    assert ray.get(g.handle("n0").membership.remote())["latest"] == before
