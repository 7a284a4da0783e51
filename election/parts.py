"""What the parts of the elector share: the member's state and timers, the configuration,
the election's progress, and one-line event logging.

:class:`~rayledger.election.elector.Elector` is composed of three parts, each a module with
one job and each holding its own rounds -- :mod:`.voting` (candidates' rounds, voters'
answers), :mod:`.heartbeats` (the leader's rounds, followers' answers and timeouts) and
:mod:`.transfer` (handing leadership on, and taking it).  Each part gets the one
:class:`ElectorShared` and the elector's role changes (:class:`Roles`); the elector owns
both, routes events to the parts and runs each role's maintenance.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Protocol

from .config import ElectionConfig
from .logevent import log_event
from .member_state import MemberState
from .messages import Action, LeadershipTransferRequest, ParseResult, Role

log = logging.getLogger("rayledger.election")


@dataclass
class HeartbeatRound:
    """One ``sendHeartbeats`` round; the leader counts itself as answered."""

    round_id: int
    term: int
    started_ms: int
    deadline_ms: int
    waiting: set[str]
    all_num: int = 1
    succ_num: int = 1
    not_ready_num: int = 0
    max_term: int = -1
    inconsistent_leader: bool = False


@dataclass
class RunningTransfer:
    """A leadership transfer this leader is running."""

    transferee: str
    term: int
    started_ms: int
    deadline_ms: int
    take_sent: bool = False
    must_leave: bool = False  # a hand-over: if the transfer fails, the leader steps down


@dataclass
class PendingTake:
    """A take-leadership order waiting for this member's ledger to catch up."""

    request: LeadershipTransferRequest
    deadline_ms: int


@dataclass
class Announced:
    """The role change last announced (a RoleChange action goes out only when it differs)."""

    term: int = -1
    role: Role | None = None
    leader_id: str | None = None


@dataclass
class Timers:
    """DLedger's timestamps; None stands for DLedger's -1 ("long ago")."""

    last_leader_heartbeat_ms: int | None = None
    last_send_heartbeat_ms: int | None = None
    last_succ_heartbeat_ms: int | None = None
    next_time_to_request_vote: int = -1
    last_preferred_check_ms: int | None = None
    peers_live: dict[str, bool] = field(default_factory=dict)
    peer_match_index: dict[str, int] = field(default_factory=dict)


class Roles(Protocol):
    """The elector's role changes, the one way a part changes this member's role."""

    def change_role_to_leader(self, term: int, now_ms: int) -> list[Action]: ...

    def change_role_to_candidate(self, term: int, now_ms: int) -> list[Action]: ...

    def change_role_to_follower(self, term: int, leader_id: str, now_ms: int) -> list[Action]: ...

    def step_down(self, now_ms: int) -> list[Action]: ...


class ElectorShared:
    """What every part of the elector reads and writes."""

    def __init__(self, state: MemberState, config: ElectionConfig, rng: random.Random) -> None:
        self.state = state
        self.config = config
        self.rng = rng
        self.timers = Timers()
        # a voter raised its term from a request or a heartbeat: take it at the next tick
        self.need_increase_term_immediately = False
        # A member that restarts from persisted state may have lost entries it acknowledged
        # in its last term (a power loss drops the unflushed tail): its first candidacy
        # raises the term, so it never leads a term it may have written differently before.
        self.restarted = state.current_term > 0 or state.vote_for is not None
        self.last_parse_result = (
            ParseResult.WAIT_TO_VOTE_NEXT if self.restarted else ParseResult.WAIT_TO_REVOTE
        )
        # Random start so answers to a previous incarnation's rounds never match.
        self.round_seq = rng.getrandbits(31)
        self.announced = Announced(state.current_term, state.role, state.leader_id)

    def next_round_id(self) -> int:
        """The id of a new vote or heartbeat round of this incarnation."""
        self.round_seq += 1
        return self.round_seq

    @property
    def self_id(self) -> str:
        return self.state.self_id

    @property
    def is_taking_leadership(self) -> bool:
        """DLedger's isTakingLeadership: voting for the term the leader handed us."""
        st = self.state
        return st.term_to_take_leadership != -1 and st.term_to_take_leadership == st.current_term

    def log(self, level: int, event: str, **fields) -> None:
        """One protocol event on one line, with this member's id and the current term
        (or the ``term`` given) first, and ``index`` when one is given."""
        term = fields.pop("term", self.state.current_term)
        log_event(log, level, event, member=self.state.self_id, term=term, **fields)
