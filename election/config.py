"""Election settings with DLedger's defaults (``DLedgerConfig``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rayledger.storage.errors import LedgerError, ResponseCode


def _bad(message: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"ElectionConfig: {message}")


@dataclass(frozen=True)
class ElectionConfig:
    """Timing and policy of the leader elector; all durations in milliseconds.

    ``preferred_leader_ids`` may be given as an iterable of member ids or as
    DLedger's ``"n1;n2"`` string; it is normalised to a tuple.
    """

    heartbeat_interval_ms: int = 2000
    max_heartbeat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    min_take_leadership_vote_interval_ms: int = 30
    max_take_leadership_vote_interval_ms: int = 100
    max_leadership_transfer_wait_index: int = 1000
    leadership_transfer_wait_timeout_ms: int = 1000
    preferred_leader_ids: tuple[str, ...] = ()
    enable_pre_vote: bool = True
    # DLedger waits 2000 ms + random(maxVoteIntervalMs) for a vote round's answers.
    vote_wait_base_ms: int = 2000
    # DLedgerServer runs checkPreferredLeader every 1000 ms.
    check_preferred_leader_interval_ms: int = 1000

    def __post_init__(self) -> None:
        ids = self.preferred_leader_ids
        if ids is None:
            ids = ()
        elif isinstance(ids, str):
            ids = tuple(p.strip() for p in ids.split(";") if p.strip())
        elif isinstance(ids, Iterable):
            ids = tuple(ids)
        else:
            raise _bad(f"preferred_leader_ids must be ids or 'a;b', got {ids!r}")
        for member in ids:
            if not isinstance(member, str) or not member:
                raise _bad(f"preferred_leader_ids holds a non-id {member!r}")
        if len(set(ids)) != len(ids):
            raise _bad(f"preferred_leader_ids has duplicates: {ids}")
        object.__setattr__(self, "preferred_leader_ids", ids)

        positive = (
            "heartbeat_interval_ms",
            "max_heartbeat_leak",
            "max_vote_interval_ms",
            "max_take_leadership_vote_interval_ms",
            "max_leadership_transfer_wait_index",
            "leadership_transfer_wait_timeout_ms",
            "check_preferred_leader_interval_ms",
        )
        non_negative = (
            "min_vote_interval_ms",
            "min_take_leadership_vote_interval_ms",
            "vote_wait_base_ms",
        )
        for name in positive + non_negative:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(f"{name} must be an int, got {value!r}")
            if name in positive and value <= 0:
                raise _bad(f"{name} must be > 0, got {value}")
            if value < 0:
                raise _bad(f"{name} must be >= 0, got {value}")
        # DLedger draws random.nextInt(max - min), which needs max > min.
        if self.max_vote_interval_ms <= self.min_vote_interval_ms:
            raise _bad(
                f"max_vote_interval_ms ({self.max_vote_interval_ms}) must exceed "
                f"min_vote_interval_ms ({self.min_vote_interval_ms})"
            )
        if self.max_take_leadership_vote_interval_ms <= self.min_take_leadership_vote_interval_ms:
            raise _bad(
                "max_take_leadership_vote_interval_ms "
                f"({self.max_take_leadership_vote_interval_ms}) must exceed "
                "min_take_leadership_vote_interval_ms "
                f"({self.min_take_leadership_vote_interval_ms})"
            )
        if not isinstance(self.enable_pre_vote, bool):
            raise _bad(f"enable_pre_vote must be a bool, got {self.enable_pre_vote!r}")

    @property
    def heartbeat_timeout_ms(self) -> int:
        """How long a follower (or a leader without quorum) tolerates silence."""
        return self.heartbeat_interval_ms * self.max_heartbeat_leak
