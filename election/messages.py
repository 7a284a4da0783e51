"""Election messages and the actions the elector core asks its shell to perform.

Every message is a frozen dataclass of plain values (no callables, no handles)
because the Ray shell pickles them between member actors.  Field names follow
DLedger's ``RequestOrResponse`` in snake_case, with DLedger's meaning:

* ``local_id``  -- the member that *sends* the message,
* ``remote_id`` -- the member the message is *addressed to* (a receiver whose id
  differs answers ``UNKNOWN_MEMBER``),
* ``leader_id`` -- in a vote request the candidate, in a heartbeat the leader.

Requests are keyword-only so a misplaced positional argument cannot silently
swap two member ids.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from enum import Enum
from typing import Any, NamedTuple

from rayledger.storage.errors import ResponseCode


class Role(str, Enum):
    """DLedger's ``MemberState.Role`` (a member starts as CANDIDATE)."""

    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"


class VoteResult(str, Enum):
    """DLedger's ``VoteResponse.RESULT``; UNKNOWN means the voter did not judge the request."""

    UNKNOWN = "UNKNOWN"
    ACCEPT = "ACCEPT"
    REJECT_UNKNOWN_LEADER = "REJECT_UNKNOWN_LEADER"
    REJECT_UNEXPECTED_LEADER = "REJECT_UNEXPECTED_LEADER"
    REJECT_EXPIRED_VOTE_TERM = "REJECT_EXPIRED_VOTE_TERM"
    REJECT_ALREADY_VOTED = "REJECT_ALREADY_VOTED"
    REJECT_ALREADY_HAS_LEADER = "REJECT_ALREADY_HAS_LEADER"
    REJECT_TERM_NOT_READY = "REJECT_TERM_NOT_READY"
    REJECT_TERM_SMALL_THAN_LEDGER = "REJECT_TERM_SMALL_THAN_LEDGER"
    REJECT_EXPIRED_LEDGER_TERM = "REJECT_EXPIRED_LEDGER_TERM"
    REJECT_SMALL_LEDGER_END_INDEX = "REJECT_SMALL_LEDGER_END_INDEX"
    REJECT_TAKING_LEADERSHIP = "REJECT_TAKING_LEADERSHIP"


class ParseResult(str, Enum):
    """DLedger's ``VoteResponse.ParseResult``: what a candidate does after a vote round."""

    WAIT_TO_REVOTE = "WAIT_TO_REVOTE"
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"
    PASSED = "PASSED"
    WAIT_TO_VOTE_NEXT = "WAIT_TO_VOTE_NEXT"


# --------------------------------------------------------------------------- votes


@dataclass(frozen=True)
class VoteRequest:
    """A candidate asking ``remote_id`` for its vote in ``term``.

    ``pre_vote`` marks a Raft pre-vote (thesis section 9.6): the voter answers
    whether it *would* vote for the candidate in ``term`` without changing any of
    its own state.  ``take_leadership`` marks a candidate elected on the leader's
    request during a leadership transfer (informational).  ``round_id`` lets the
    candidate drop answers that belong to an older round.
    """

    _: KW_ONLY
    group: str
    local_id: str
    remote_id: str
    leader_id: str
    term: int
    ledger_end_index: int
    ledger_end_term: int
    pre_vote: bool = False
    take_leadership: bool = False
    round_id: int = 0


@dataclass(frozen=True)
class _Answer:
    """The ids every answer carries (keyword-only, after the answer's own fields)."""

    _: KW_ONLY
    group: str = ""
    local_id: str = ""
    remote_id: str = ""
    leader_id: str | None = None


@dataclass(frozen=True)
class VoteResponse(_Answer):
    """The voter's verdict; ``term`` is the voter's term (its ledger end term for
    ``REJECT_TERM_SMALL_THAN_LEDGER``, as in DLedger)."""

    result: VoteResult
    term: int
    _: KW_ONLY
    code: ResponseCode = ResponseCode.SUCCESS
    pre_vote: bool = False


# ----------------------------------------------------------------------- heartbeats


@dataclass(frozen=True)
class HeartbeatRequest:
    """The leader ``leader_id`` of ``term`` asserting its leadership to ``remote_id``."""

    _: KW_ONLY
    group: str
    local_id: str
    remote_id: str
    leader_id: str
    term: int
    round_id: int = 0


@dataclass(frozen=True)
class _CodedResponse(_Answer):
    """An answer that is a response code and the answerer's term."""

    code: ResponseCode
    term: int


@dataclass(frozen=True)
class HeartbeatResponse(_CodedResponse):
    """``code`` is SUCCESS, EXPIRED_TERM, INCONSISTENT_LEADER, TERM_NOT_READY,
    UNKNOWN_MEMBER, UNEXPECTED_MEMBER or UNKNOWN_GROUP; ``term`` is the follower's."""


# ------------------------------------------------------------ leadership transfer


@dataclass(frozen=True)
class LeadershipTransferRequest:
    """DLedger's LeadershipTransferRequest, used for both legs of a transfer.

    * Sent to the leader (``transfer_id`` == the leader == ``remote_id``): start
      handing leadership of ``term`` to ``transferee_id``.
    * Sent by the leader to the transferee (``transferee_id`` == ``remote_id``):
      take leadership once your ledger reaches ``take_leadership_ledger_index``;
      ``wait_timeout_ms`` is how long the leader will still wait for you.
    """

    _: KW_ONLY
    group: str
    local_id: str
    remote_id: str
    term: int
    transfer_id: str
    transferee_id: str
    leader_id: str | None = None
    take_leadership_ledger_index: int = -1
    wait_timeout_ms: int = 0


@dataclass(frozen=True)
class LeadershipTransferResponse(_CodedResponse):
    """SUCCESS means the transfer (or the take-leadership vote) has *started*; the
    outcome is seen as role changes and, on the old leader, a :class:`TransferOutcome`."""


# ------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Send:
    """Deliver ``message`` to member ``to`` and feed its answer (or None on failure)
    back as an ``ElectionAnswer``."""

    to: str
    message: object


@dataclass(frozen=True)
class RoleChange:
    """This member's role changed; the shell announces it (broker master/slave switch)."""

    term: int
    role: Role
    leader_id: str | None


@dataclass(frozen=True)
class TransferOutcome:
    """A leadership transfer this member led has ended (seen from the old leader).

    ``code`` is SUCCESS when the member stepped down for a newer term while
    transferring, otherwise the reason it gave up (TIMEOUT, TAKE_LEADERSHIP_FAILED,
    or the transferee's refusal code).
    """

    term: int
    transferee: str
    code: ResponseCode


Action = Send | RoleChange | TransferOutcome


# ====================================================================== the elector's events
# What :meth:`~rayledger.election.elector.Elector.step` takes; the member's core steps the
# elector with the very events it is given.


@dataclass(frozen=True, slots=True)
class Tick:
    """The elector's clock (DLedger's ``maintainState``)."""


@dataclass(frozen=True, slots=True)
class ElectionRequest:
    """A vote, pre-vote, heartbeat or take-leadership order from a peer; answers its
    response."""

    req: Any


@dataclass(frozen=True, slots=True)
class ElectionAnswer:
    """A peer's answer to this member's election message (None: none in time)."""

    peer: str
    req: Any
    resp: Any


@dataclass(frozen=True, slots=True)
class PeerProgress:
    """How far a follower matches this leader's log of ``term`` (from its dispatcher)."""

    peer: str
    term: int
    match_index: int


@dataclass(frozen=True, slots=True)
class TransferOrder:
    """An operator asks this leader to hand leadership to ``target``; answers the
    elector's response (``transferring``: whether a transfer now runs)."""

    target: str


@dataclass(frozen=True, slots=True)
class HandOverOrder:
    """This leader cannot serve its term (its helpers are lost or hung): hand it to
    ``target``, stepping down if the transfer cannot start or is given up; answers the
    transfer's code."""

    target: str


@dataclass(frozen=True, slots=True)
class QuitLeadership:
    """Leave leadership of the current term at once."""


ElectorEvent = (
    Tick | ElectionRequest | ElectionAnswer | PeerProgress | TransferOrder | HandOverOrder
    | QuitLeadership
)  # fmt: skip


class ElectorOut(NamedTuple):
    """What one step of the elector gives: the direct answer (an election request's
    response, a transfer's; None for the others) and the actions for the shell."""

    reply: Any
    actions: list[Action]
