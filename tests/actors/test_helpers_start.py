"""Helpers start with leadership, without Ray: a member runs no checker or dispatchers until
it first takes office (a follower's helpers idled: they doubled an idle group's processes,
memory and CPU), then keeps them while it follows."""

from __future__ import annotations

from rayledger.actors.core.supervision import (
    CHECKER,
    HELPER_START_MS,
    Answer,
    SetUpHelpers,
    Sleep,
    Supervisor,
)
from test_stop_leading import _supervisor as supervisor


def _supervisor() -> Supervisor:
    return supervisor(led=False)


def _first_term(sup: Supervisor) -> SetUpHelpers:
    """Lead term 3: the role change's actions up to its SetUpHelpers."""
    sup.logic.state.change_to_leader(3)
    proc = sup.role_changes()
    action = proc.start()
    while isinstance(action, Sleep):
        action = proc.send(Answer(0, None))
    assert isinstance(action, SetUpHelpers) and action.term == 3
    return action


def test_a_member_that_never_led_runs_no_helpers() -> None:
    sup = _supervisor()
    assert not sup.runs_helpers() and sup.dispatcher_peers() == ()
    assert sup.keys() == (CHECKER,) and sup.is_voter()


def test_its_first_term_starts_them_and_waits_for_them_to_boot() -> None:
    sup = _supervisor()
    action = _first_term(sup)
    assert sup.runs_helpers() and sup.dispatcher_peers() == ("n1", "n2")
    assert set(sup.keys()) == {CHECKER, ("dispatcher", "n1"), ("dispatcher", "n2")}
    # new processes: the first try gets the whole start-up window, not one RPC time-out
    assert action.timeout_ms == HELPER_START_MS == sup.helper_wait_ms()


def test_a_member_that_led_keeps_them_while_it_follows() -> None:
    sup = _supervisor()
    _first_term(sup)
    sup.logic.state.change_to_follower(3, "n1")  # stepped down (a transfer, say)
    assert sup.runs_helpers() and sup.dispatcher_peers() == ("n1", "n2")
