"""Append admission on the leader (DLedger ``DLedgerServer.handleAppend`` checks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rayledger.storage.errors import LedgerError, ResponseCode

from .config import ReplicationConfig

if TYPE_CHECKING:
    from rayledger.election import MemberState


def known_leader(state: MemberState) -> str | None:
    """The leader this member knows of, unless that is itself."""
    return state.leader_id if state.leader_id != state.self_id else None


def not_leader(state: MemberState, message: str) -> LedgerError:
    """NOT_LEADER from a member that does not lead, pointing at the leader when it knows one."""
    return LedgerError.of(ResponseCode.NOT_LEADER, message, leader_id=known_leader(state))


def check_append(
    state: MemberState,
    req_group: str,
    target_id: str | None,
    bodies: Sequence[bytes],
    pending: int,
    config: ReplicationConfig,
) -> None:
    """Raise the LedgerError DLedger would answer with, or return when the append may go ahead.

    ``pending`` is how many appends already wait for a quorum; ``target_id`` None
    skips the member check (a client that addresses the group, not a member).
    Body sizes and types are checked by the store when it encodes the batch.
    """
    if req_group != state.group:
        raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"{req_group!r} != {state.group!r}")
    if target_id is not None and target_id != state.self_id:
        raise LedgerError.of(ResponseCode.UNKNOWN_MEMBER, f"{target_id!r} != {state.self_id!r}")
    if not state.is_leader:
        raise not_leader(
            state,
            f"{state.self_id} is {state.role.value} in term {state.current_term}, "
            f"leader {known_leader(state)}",
        )
    if state.transferee is not None:  # a transfer runs: the leader refuses appends
        raise LedgerError.of(
            ResponseCode.LEADER_TRANSFERRING,
            f"{state.self_id} is handing leadership to {state.transferee}",
            leader_id=state.self_id,
        )
    if pending > config.max_pending_requests_num:
        raise LedgerError.of(
            ResponseCode.LEADER_PENDING_FULL,
            f"{pending} appends wait for a quorum (max {config.max_pending_requests_num})",
            leader_id=state.self_id,
        )
    if bodies is None or len(bodies) == 0:
        raise LedgerError.of(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
