"""The single-server change bug: testdata/single_server_change.txt runs the
scenario with the shipped guard -- one leader per term.  Here the same script runs with the
guard removed (a leader may change the configuration before it committed an entry of its
own term), and two leaders of one term appear: the guard is what prevents it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from interaction import Env, parse
from rayledger.actors.core import member_logic as logic
from rayledger.election import configuration

SCRIPT = Path(__file__).parent / "testdata" / "single_server_change.txt"


def _leaders_by_term() -> dict[int, set[str]]:
    env = Env()
    seen: dict[int, set[str]] = {}
    for _comments, cmd, _expected in parse(SCRIPT.read_text()):
        if not cmd:
            continue
        for who, term in re.findall(r"(n\d) is LEADER term=(\d+)", env.run(cmd)):
            seen.setdefault(int(term), set()).add(who)
    return seen


def _no_guard(current, proposed, *, pending, committed_own_term):
    del committed_own_term  # the bug: a new leader changes the configuration at once
    return configuration.check_change(current, proposed, pending=pending, committed_own_term=True)


def test_with_the_guard_every_term_has_one_leader() -> None:
    seen = _leaders_by_term()
    assert seen and all(len(who) == 1 for who in seen.values()), seen


def test_without_the_guard_two_leaders_share_a_term(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logic, "check_change", _no_guard)
    seen = _leaders_by_term()
    assert seen.get(2) == {"n0", "n1"}, seen
