"""What the public API returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from rayledger.election import Role


class AppendResult(NamedTuple):
    """Where a committed append landed.  (A named tuple: a batch of a thousand entries
    gets a thousand of them, and a tuple is made in a quarter of a frozen dataclass's time.)"""

    index: int
    term: int
    pos: int
    receipt: Any = None  # what the group's state machine decided for it (StateMachine.receipt)


@dataclass(frozen=True, slots=True)
class MemberStatus:
    role: Role | None
    term: int
    leader_id: str | None
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    alive: bool
    # "voter" or "learner" in the committed configuration this member knows,
    # "removed", or None (no answer); on the leader, the lost members waiting for a node
    membership: str | None = None
    lost: tuple[str, ...] = ()
