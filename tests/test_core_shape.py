"""Every core has one way in, ``step(event, now_ms)``, and its shells use no other door.

A core's public surface is ``step`` and the read-only queries named here (what a shell
reads for its timers, status and the store's compaction floor); a new public method is a
second way in and fails this test until it becomes an event or is named a query.  The
shells (``actors/*.py``, ``actors/member/``) are scanned for calls into a core or the
member's logic other than those, and for assignments into them.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from rayledger.actors.core.client_session import ClientSessions, SessionLanes
from rayledger.actors.core.fastpath import FastPathLogic
from rayledger.actors.core.machine import MachineCore
from rayledger.actors.core.member import MemberCore
from rayledger.election.elector import Elector
from rayledger.replication.checker import CheckerLogic, QuorumAckChecker
from rayledger.replication.dispatcher import DispatcherLogic
from rayledger.replication.handler import EntryHandler
from rayledger.replication.push import EntryDispatcher

ROOT = Path(__file__).resolve().parents[1]

# the actors' cores: step, plus the queries a shell may ask (they change nothing)
ACTOR_CORES: dict[type, set[str]] = {
    MemberCore: {"next_tick_ms"},  # when the elector's clock is due
    MachineCore: {"snapshot_wanted", "keep_from", "due"},  # what the log keeps, what is next
    CheckerLogic: set(),
    DispatcherLogic: set(),
    FastPathLogic: set(),
}

# the client's session cores: the same one way in, without a clock (no session decision
# depends on time), and the questions its shell asks before a call
CLIENT_CORES: dict[type, set[str]] = {
    ClientSessions: {"pinned", "maybe_stored", "ident"},
    SessionLanes: {"pinned", "maybe_stored", "lane_of", "sendable"},
}

# the protocol parts inside them, stepped by their core with the same shape
PARTS = (Elector, EntryHandler, QuorumAckChecker, EntryDispatcher)

# what a shell calls on a core (``*.core.name(...)``) or on the member's logic
# (``*.logic.name(...)``): step, the queries above, the member's own read-only questions,
# and the machine attaching its snapshots at boot
SHELL_CALLS = {
    "step",
    "next_tick_ms",
    "keep_from",
    "ready_leading_term",
    "holds_office",
    "take_snapshots",
}
# read-only questions to the core's parts: what a shell reports (status, metrics) and
# which helpers a member keeps (asked when it creates them)
SHELL_READS = {
    "latest",
    "committed",
    "snapshot",
    "at",
    "lost_count",
    "is_voter",
    "dispatcher_peers",
}


def _public_methods(cls: type) -> set[str]:
    return {
        n
        for n, v in vars(cls).items()
        if not n.startswith("_") and callable(v) and not isinstance(v, property | staticmethod)
    }


@pytest.mark.parametrize("cls", list(ACTOR_CORES), ids=lambda c: c.__name__)
def test_an_actor_core_changes_only_through_step(cls: type) -> None:
    assert _public_methods(cls) == {"step"} | ACTOR_CORES[cls]


@pytest.mark.parametrize("cls", list(CLIENT_CORES), ids=lambda c: c.__name__)
def test_a_client_core_changes_only_through_step(cls: type) -> None:
    assert _public_methods(cls) == {"step"} | CLIENT_CORES[cls]
    assert list(inspect.signature(cls.step).parameters) == ["self", "event"]


@pytest.mark.parametrize("cls", [*ACTOR_CORES, *PARTS], ids=lambda c: c.__name__)
def test_every_step_takes_an_event_and_the_time(cls: type) -> None:
    params = list(inspect.signature(cls.step).parameters)
    assert params == ["self", params[1], "now_ms"], params


def _shell_files() -> list[Path]:
    return sorted((ROOT / "actors").glob("*.py")) + sorted((ROOT / "actors/member").glob("*.py"))


def _side_doors(source: str) -> list[str]:
    """Calls into a core or the member's logic other than :data:`SHELL_CALLS`, and
    assignments into them."""
    found = []

    def into_core(node: ast.AST) -> bool:
        """Whether the chain of attributes ``node`` ends in reaches a core or a logic."""
        while isinstance(node, ast.Attribute):
            if node.attr in ("core", "logic"):
                return True
            node = node.value
        return isinstance(node, ast.Name) and node.id in ("core", "logic")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            allowed = SHELL_CALLS | SHELL_READS
            if into_core(node.func.value) and node.func.attr not in allowed:
                found.append(f"line {node.lineno}: calls {node.func.attr}")
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(el, ast.Attribute) and into_core(el.value):
                    found.append(f"line {node.lineno}: sets {el.attr}")
    return sorted(found)


@pytest.mark.parametrize("path", _shell_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shell_enters_its_core_only_by_stepping_it(path: Path) -> None:
    assert _side_doors(path.read_text()) == []


def test_the_shell_scan_sees_a_side_door() -> None:
    src = (
        "self.ctx.core.close()\nself.logic.term = 3\nself.core.step(ev, 0)\n"
        "self.ctx.logic.elector.step_down(0)\nself.logic.state.leader_id = 'x'\n"
    )
    assert _side_doors(src) == [
        "line 1: calls close",
        "line 2: sets term",
        "line 4: calls step_down",
        "line 5: sets leader_id",
    ]
