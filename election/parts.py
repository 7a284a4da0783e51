"""What the parts of the elector share: the member's state and timers, the configuration,
the rounds in flight, and one-line event logging.

:class:`~rayledger.election.elector.Elector` is assembled from three parts, each a module
with one job -- :mod:`.voting` (candidates' rounds, voters' answers), :mod:`.heartbeats`
(the leader's rounds, followers' answers and timeouts) and :mod:`.transfer` (handing
leadership on).  Each part reads and writes the attributes declared here; the elector
creates them and routes events to the parts.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import ElectionConfig
from .logevent import log_event
from .member_state import MemberState
from .messages import LeadershipTransferRequest, ParseResult, Role

if TYPE_CHECKING:
    from .votes import VoteTally

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


class ElectorParts:
    """The shared state of the elector's parts (set up by ``Elector.__init__``)."""

    state: MemberState
    config: ElectionConfig
    rng: random.Random
    _timers: Timers
    _announced: Announced
    _round_seq: int  # rounds of this incarnation; answers to another round never match
    _need_increase_term_immediately: bool
    _last_parse_result: ParseResult
    _last_vote_cost_ms: int
    _pre_vote_granted_term: int
    _restarted: bool
    _restart_term: int
    _first_event_ms: int | None
    _vote_round: VoteTally | None
    _heartbeat_round: HeartbeatRound | None
    _transfer: RunningTransfer | None
    _pending_take: PendingTake | None
    _taking_from: LeadershipTransferRequest | None
    _take_order_term: int  # the term this leader sent a take order in (no lease after it)

    if TYPE_CHECKING:  # the elector's (elector.py); parts call it, the elector defines it

        def step_down(self, now_ms: int) -> list: ...

    @property
    def self_id(self) -> str:
        return self.state.self_id

    def _log(self, level: int, event: str, **fields) -> None:
        """One protocol event on one line, with this member's id and the current term
        (or the ``term`` given) first, and ``index`` when one is given."""
        term = fields.pop("term", self.state.current_term)
        log_event(log, level, event, member=self.state.self_id, term=term, **fields)
