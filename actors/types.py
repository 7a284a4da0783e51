"""What the public API returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayledger.election import Role


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where a committed append landed."""

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
