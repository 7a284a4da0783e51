"""DLedger's leader elector (``DLedgerLeaderElector``) as a sans-I/O state machine.

The core never reads a clock, sleeps, spawns threads or does I/O other than the
term store write.  It is driven by

* :meth:`Elector.tick` -- DLedger's 10 ms ``maintainState`` step,
* ``handle_*`` -- a request from another member, answered at once,
* ``on_*_response`` -- the answer (or ``None`` when the call failed) to a
  request this core asked the shell to send,

and every call returns the actions for the shell: :class:`Send` (deliver a
message, feed the answer back), :class:`RoleChange` and :class:`TransferOutcome`.

Where DLedger blocks a thread on a latch (a candidate's vote round, a leader's
heartbeat round) the core keeps the round as data: the sends are emitted at the
start, answers fold in as they arrive, and the round is parsed as soon as
DLedger's latch would open (everyone answered, or the early-exit condition) or
when a tick finds the round's deadline passed.  Answers to an older round are
ignored.

Deliberate differences from DLedger, each for a stated reason:

* Pre-vote (Raft thesis 9.6, ``enable_pre_vote``): before a candidate *raises*
  its own term (``WAIT_TO_VOTE_NEXT``) it runs a pre-vote round at term + 1 that
  changes no one's state; voters refuse while they still hear from a live
  leader.  Catching up to a term already seen in the group, and taking
  leadership on the leader's request, need no pre-vote.
* A new leader starts its heartbeat-loss clock at its election (DLedger keeps
  the previous ``lastSuccHeartBeatTime``), so it gets ``maxHeartBeatLeak``
  intervals before it steps down.
* A leader told to transfer waits (up to ``leadership_transfer_wait_timeout_ms``)
  for the transferee to come within ``max_leadership_transfer_wait_index``
  entries instead of failing at once, refuses appends meanwhile, and gives up
  cleanly at the deadline.  Take-leadership vote intervals apply to any
  transferee, not only to preferred leaders.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from rayledger.storage.errors import LedgerError, ResponseCode

from .config import ElectionConfig
from .member_state import MemberState
from .messages import (
    Action,
    HeartbeatRequest,
    HeartbeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    ParseResult,
    Role,
    RoleChange,
    Send,
    TransferOutcome,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from .votes import VoteTally, Wait

log = logging.getLogger("rayledger.election")


@dataclass
class _HeartbeatRound:
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
class _Transfer:
    """A leadership transfer this leader is running."""

    transferee: str
    term: int
    started_ms: int
    deadline_ms: int
    take_sent: bool = False


@dataclass
class _PendingTake:
    """A take-leadership order waiting for this member's ledger to catch up."""

    request: LeadershipTransferRequest
    deadline_ms: int


@dataclass
class _Announced:
    term: int = -1
    role: Role | None = None
    leader_id: str | None = None


@dataclass
class _Timers:
    """DLedger's timestamps; None stands for DLedger's -1 ("long ago")."""

    last_leader_heartbeat_ms: int | None = None
    last_send_heartbeat_ms: int | None = None
    last_succ_heartbeat_ms: int | None = None
    next_time_to_request_vote: int = -1
    last_preferred_check_ms: int | None = None
    peers_live: dict[str, bool] = field(default_factory=dict)
    peer_match_index: dict[str, int] = field(default_factory=dict)


class Elector:
    """Leader election core for one member; see the module docstring."""

    def __init__(self, state: MemberState, config: ElectionConfig, rng: random.Random) -> None:
        self.state = state
        self.config = config
        self.rng = rng
        self._timers = _Timers()
        self._need_increase_term_immediately = False
        # A member that restarts from persisted state may have lost entries it acknowledged
        # in its last term (a power loss drops the unflushed tail): its first candidacy
        # raises the term, so it never leads a term it may have written differently before.
        restarted = state.current_term > 0 or state.vote_for is not None
        self._last_parse_result = (
            ParseResult.WAIT_TO_VOTE_NEXT if restarted else ParseResult.WAIT_TO_REVOTE
        )
        # It has also forgotten when it last heard from a leader.  Granting pre-votes at once
        # could elect a new leader while the old one still serves lease reads confirmed with
        # this member's help, so it grants none for one heartbeat timeout after its first
        # event, as if it had just heard from a leader (see docs/SAFETY.md, lease reads).
        self._restarted = restarted
        self._first_event_ms: int | None = None
        self._last_vote_cost_ms = 0
        self._pre_vote_granted_term = -1
        self._vote_round: VoteTally | None = None
        self._heartbeat_round: _HeartbeatRound | None = None
        self._transfer: _Transfer | None = None
        self._pending_take: _PendingTake | None = None
        self._taking_from: LeadershipTransferRequest | None = None
        # Random start so answers to a previous incarnation's rounds never match.
        self._round_seq = rng.getrandbits(31)
        self._announced = _Announced(state.current_term, state.role, state.leader_id)

    # ================================================================ queries

    @property
    def role(self) -> Role:
        return self.state.role

    @property
    def term(self) -> int:
        return self.state.current_term

    @property
    def leader_id(self) -> str | None:
        return self.state.leader_id

    @property
    def self_id(self) -> str:
        return self.state.self_id

    @property
    def transferring(self) -> bool:
        """True while this leader hands over leadership (appends are refused)."""
        return self.state.transferee is not None

    @property
    def transfer_deadline_ms(self) -> int | None:
        return self._transfer.deadline_ms if self._transfer is not None else None

    @property
    def last_parse_result(self) -> ParseResult:
        return self._last_parse_result

    @property
    def need_increase_term_immediately(self) -> bool:
        return self._need_increase_term_immediately

    @property
    def next_time_to_request_vote(self) -> int:
        return self._timers.next_time_to_request_vote

    @property
    def in_vote_round(self) -> bool:
        return self._vote_round is not None

    @property
    def is_taking_leadership(self) -> bool:
        """DLedger's isTakingLeadership: voting for the term the leader handed us."""
        return (
            self.state.term_to_take_leadership != -1
            and self.state.term_to_take_leadership == self.state.current_term
        )

    def peers_live(self) -> dict[str, bool]:
        """Which peers answered the last heartbeat (DLedger's peersLiveTable)."""
        return dict(self._timers.peers_live)

    def snapshot(self) -> dict:
        """Plain-dict status for metadata calls and logs."""
        st = self.state
        return {
            "group": st.group,
            "self_id": st.self_id,
            "role": st.role.value,
            "term": st.current_term,
            "vote_for": st.vote_for,
            "leader_id": st.leader_id,
            "ledger_end_index": st.ledger_end_index,
            "ledger_end_term": st.ledger_end_term,
            "transferee": st.transferee,
            "last_parse_result": self._last_parse_result.value,
            "known_max_term_in_group": st.known_max_term_in_group,
        }

    # ================================================================ dispatch

    def handle(self, request: object, now_ms: int) -> tuple[object, list[Action]]:
        """Answer any election request (routes by type)."""
        if isinstance(request, VoteRequest):
            return self.handle_vote(request, now_ms)
        if isinstance(request, HeartbeatRequest):
            return self.handle_heartbeat(request, now_ms)
        if isinstance(request, LeadershipTransferRequest):
            return self.handle_leadership_transfer(request, now_ms)
        raise LedgerError.of(ResponseCode.UNSUPPORTED, f"not an election request: {request!r}")

    def on_response(
        self, peer: str, request: object, response: object | None, now_ms: int
    ) -> list[Action]:
        """Fold in the answer to any request this core sent (routes by request type)."""
        if isinstance(request, VoteRequest):
            return self.on_vote_response(peer, request, response, now_ms)  # type: ignore[arg-type]
        if isinstance(request, HeartbeatRequest):
            return self.on_heartbeat_response(peer, request, response, now_ms)  # type: ignore[arg-type]
        if isinstance(request, LeadershipTransferRequest):
            return self.on_leadership_transfer_response(peer, request, response, now_ms)  # type: ignore[arg-type]
        raise LedgerError.of(ResponseCode.UNSUPPORTED, f"not an election request: {request!r}")

    # ==================================================================== tick

    def next_tick_ms(self, now_ms: int, granularity_ms: int = 10) -> int:
        """The latest time the next :meth:`tick` may run without acting late.

        A leader's next heartbeat, a follower's heartbeat timeout; candidates, transfers
        and preferred-leader checks keep ``granularity_ms``.  Ticking earlier is always
        harmless, so a shell may sleep until then instead of polling (an idle group then
        costs next to nothing).
        """
        soon = now_ms + granularity_ms
        cfg = self.config
        role = self.state.role
        timers = self._timers
        if role is Role.LEADER:
            if self._transfer is not None or cfg.preferred_leader_ids:
                return soon
            rnd = self._heartbeat_round
            if rnd is not None:
                return max(now_ms + 1, min(rnd.deadline_ms, now_ms + cfg.heartbeat_interval_ms))
            last = timers.last_send_heartbeat_ms
            if last is None:
                return soon
            return max(now_ms + 1, last + cfg.heartbeat_interval_ms + 1)
        if role is Role.FOLLOWER and self._pending_take is None:
            last = timers.last_leader_heartbeat_ms
            if last is None:
                return soon
            return max(now_ms + 1, last + cfg.heartbeat_timeout_ms + 1)
        return soon

    def tick(self, now_ms: int) -> list[Action]:
        """DLedger's ``maintainState``: one step of the role's maintenance loop."""
        self._saw_event(now_ms)
        role = self.state.role
        if role is Role.LEADER:
            return self._maintain_as_leader(now_ms)
        if role is Role.FOLLOWER:
            return self._maintain_as_follower(now_ms)
        return self._maintain_as_candidate(now_ms)

    # =============================================================== candidate

    def _get_next_time_to_request_vote(self, now_ms: int) -> int:
        cfg = self.config
        if self.is_taking_leadership:
            lo, hi = (
                cfg.min_take_leadership_vote_interval_ms,
                cfg.max_take_leadership_vote_interval_ms,
            )
        else:
            lo, hi = cfg.min_vote_interval_ms, cfg.max_vote_interval_ms
        return now_ms + lo + self.rng.randrange(hi - lo)

    def _pre_vote_required(self) -> bool:
        st = self.state
        return (
            self.config.enable_pre_vote
            and st.known_max_term_in_group <= st.current_term
            and self._pre_vote_granted_term != st.current_term + 1
            and not self.is_taking_leadership
        )

    def _maintain_as_candidate(self, now_ms: int) -> list[Action]:
        rnd = self._vote_round
        if rnd is not None:
            # DLedger's maintainer is blocked on the vote latch until the deadline.
            if now_ms >= rnd.deadline_ms:
                return self._parse_vote_round(rnd, now_ms)
            return []
        timers = self._timers
        if now_ms < timers.next_time_to_request_vote and not self._need_increase_term_immediately:
            return []
        st = self.state
        if st.role is not Role.CANDIDATE:
            return []
        if (
            self._last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
            or self._need_increase_term_immediately
        ):
            if not self._need_increase_term_immediately and self._pre_vote_required():
                return self._start_vote_round(now_ms, pre_vote=True)
            prev = st.current_term
            term = st.next_term()
            self._pre_vote_granted_term = -1
            log.info("[%s] [INCREASE_TERM] from %d to %d", st.self_id, prev, term)
            self._last_parse_result = ParseResult.WAIT_TO_REVOTE
        if self._need_increase_term_immediately:
            timers.next_time_to_request_vote = self._get_next_time_to_request_vote(now_ms)
            self._need_increase_term_immediately = False
            return []
        return self._start_vote_round(now_ms, pre_vote=False)

    def _start_vote_round(self, now_ms: int, *, pre_vote: bool) -> list[Action]:
        st = self.state
        term = st.current_term + 1 if pre_vote else st.current_term
        self._round_seq += 1
        deadline = (
            now_ms
            + self.config.vote_wait_base_ms
            + self.rng.randrange(self.config.max_vote_interval_ms)
        )
        rnd = VoteTally(
            round_id=self._round_seq,
            term=term,
            pre_vote=pre_vote,
            started_ms=now_ms,
            deadline_ms=deadline,
            waiting=set(),
            known_max_term_in_group=term,
        )
        self._vote_round = rnd
        taking = self.is_taking_leadership
        log.info(
            "[%s] [%s] term=%d ledgerEndIndex=%d ledgerEndTerm=%d round=%d",
            st.self_id,
            "PRE_VOTE" if pre_vote else "VOTE",
            term,
            st.ledger_end_index,
            st.ledger_end_term,
            rnd.round_id,
        )
        actions: list[Action] = []
        self_request = None
        for peer in st.peers:
            req = VoteRequest(
                group=st.group,
                local_id=st.self_id,
                remote_id=peer,
                leader_id=st.self_id,
                term=term,
                ledger_end_index=st.ledger_end_index,
                ledger_end_term=st.ledger_end_term,
                pre_vote=pre_vote,
                take_leadership=taking,
                round_id=rnd.round_id,
            )
            if peer == st.self_id:
                self_request = req
            else:
                rnd.waiting.add(peer)
                actions.append(Send(peer, req))
        assert self_request is not None
        self_response, self_actions = self._judge_vote(self_request, now_ms, self_vote=True)
        actions.extend(self_actions)
        rnd.count(self_response)
        if rnd.done(st.peer_size):
            actions.extend(self._parse_vote_round(rnd, now_ms))
        return actions

    def on_vote_response(
        self, peer: str, req: VoteRequest, resp: VoteResponse | None, now_ms: int
    ) -> list[Action]:
        """Count one voter's answer (None = the call failed) into the current round."""
        rnd = self._vote_round
        if (
            rnd is None
            or req.round_id != rnd.round_id
            or req.term != rnd.term
            or req.pre_vote != rnd.pre_vote
            or peer not in rnd.waiting
        ):
            log.debug("[%s] ignore stale vote response from %s: %s", self.self_id, peer, resp)
            return []
        rnd.waiting.discard(peer)
        log.info(
            "[%s][GetVoteResponse] from=%s term=%d pre=%s result=%s respTerm=%s",
            self.self_id,
            peer,
            rnd.term,
            rnd.pre_vote,
            None if resp is None else resp.result.value,
            None if resp is None else resp.term,
        )
        rnd.count(resp)
        if rnd.done(self.state.peer_size):
            return self._parse_vote_round(rnd, now_ms)
        return []

    def _parse_vote_round(self, rnd: VoteTally, now_ms: int) -> list[Action]:
        if self._vote_round is rnd:
            self._vote_round = None
        st = self.state
        actions: list[Action] = []
        term = rnd.term
        self._last_vote_cost_ms = now_ms - rnd.started_ms
        decision = rnd.decide(st.peer_size)
        result = decision.result
        if decision.wait is not Wait.NONE:
            extra = {
                Wait.PLUS_HEARTBEAT_TIMEOUT: self.config.heartbeat_timeout_ms,
                Wait.PLUS_MAX_VOTE_INTERVAL: self.config.max_vote_interval_ms,
            }.get(decision.wait, 0)
            self._timers.next_time_to_request_vote = (
                self._get_next_time_to_request_vote(now_ms) + extra
            )
        if decision.raise_term_to is not None:
            actions.extend(self._change_role_to_candidate(decision.raise_term_to, now_ms))
        log.info(
            "[%s] [PARSE_%sVOTE_RESULT] cost=%d term=%d memberNum=%d allNum=%d validNum=%d "
            "acceptedNum=%d notReadyTermNum=%d biggerLedgerNum=%d alreadyHasLeader=%s "
            "maxTerm=%d result=%s",
            st.self_id,
            "PRE_" if rnd.pre_vote else "",
            self._last_vote_cost_ms,
            term,
            st.peer_size,
            rnd.all_num,
            rnd.valid_num,
            rnd.accepted_num,
            rnd.not_ready_term_num,
            rnd.bigger_ledger_num,
            rnd.already_has_leader,
            rnd.known_max_term_in_group,
            result.value,
        )
        if rnd.pre_vote:
            if result is ParseResult.PASSED and st.role is Role.CANDIDATE:
                # Could win term + 1: raise the term now and ask for real votes.
                self._pre_vote_granted_term = term
                self._last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
                actions.extend(self._maintain_as_candidate(now_ms))
            else:
                self._last_parse_result = result
            return actions
        self._last_parse_result = result
        if result is ParseResult.PASSED:
            log.info(
                "[%s] [VOTE_RESULT] has been elected to be the leader in term %d", st.self_id, term
            )
            actions.extend(self._change_role_to_leader(term, now_ms))
        return actions

    # ============================================================ handle_vote

    def handle_vote(self, req: VoteRequest, now_ms: int) -> tuple[VoteResponse, list[Action]]:
        """Answer a (pre-)vote request from another member."""
        st = self.state
        if req.remote_id != st.self_id:
            log.warning("[%s] [HandleVote] addressed to %s", st.self_id, req.remote_id)
            return self._vote_response(
                req, VoteResult.UNKNOWN, code=ResponseCode.UNKNOWN_MEMBER
            ), []
        if req.group != st.group:
            log.warning("[%s] [HandleVote] group %s != %s", st.self_id, req.group, st.group)
            return self._vote_response(req, VoteResult.UNKNOWN, code=ResponseCode.UNKNOWN_GROUP), []
        resp, actions = self._judge_vote(req, now_ms, self_vote=False)
        log.info(
            "[%s] [HandleVote] candidate=%s term=%d pre=%s ledger=(%d,%d) myTerm=%d "
            "myLedger=(%d,%d) -> %s",
            st.self_id,
            req.leader_id,
            req.term,
            req.pre_vote,
            req.ledger_end_index,
            req.ledger_end_term,
            st.current_term,
            st.ledger_end_index,
            st.ledger_end_term,
            resp.result.value,
        )
        return resp, actions

    def _vote_response(
        self,
        req: VoteRequest,
        result: VoteResult,
        term: int | None = None,
        code: ResponseCode = ResponseCode.SUCCESS,
    ) -> VoteResponse:
        st = self.state
        return VoteResponse(
            result,
            st.current_term if term is None else term,
            group=st.group,
            local_id=st.self_id,
            remote_id=req.local_id,
            leader_id=st.leader_id,
            code=code,
            pre_vote=req.pre_vote,
        )

    def _refuses_for_taking_leadership(self, req: VoteRequest) -> bool:
        st = self.state
        return (
            self.is_taking_leadership
            and req.ledger_end_term == st.ledger_end_term
            and st.ledger_end_index >= req.ledger_end_index
        )

    def _judge_vote(
        self, req: VoteRequest, now_ms: int, *, self_vote: bool
    ) -> tuple[VoteResponse, list[Action]]:
        """DLedger's handleVote (and the pre-vote variant, which changes no state)."""
        st = self.state
        R = VoteResult
        if not st.is_peer_member(req.leader_id):
            log.warning(
                "[%s] [BUG] [HandleVote] remoteId=%s is an unknown member",
                st.self_id,
                req.leader_id,
            )
            return self._vote_response(req, R.REJECT_UNKNOWN_LEADER), []
        if not self_vote and req.leader_id == st.self_id:
            log.warning(
                "[%s] [BUG] [HandleVote] selfId=%s but remoteId=%s",
                st.self_id,
                st.self_id,
                req.leader_id,
            )
            return self._vote_response(req, R.REJECT_UNEXPECTED_LEADER), []

        if req.ledger_end_term < st.ledger_end_term:
            return self._vote_response(req, R.REJECT_EXPIRED_LEDGER_TERM), []
        if req.ledger_end_term == st.ledger_end_term and req.ledger_end_index < st.ledger_end_index:
            return self._vote_response(req, R.REJECT_SMALL_LEDGER_END_INDEX), []

        if req.pre_vote:
            return self._judge_pre_vote(req, now_ms, self_vote=self_vote), []

        actions: list[Action] = []
        if req.term < st.current_term:
            return self._vote_response(req, R.REJECT_EXPIRED_VOTE_TERM), []
        if req.term == st.current_term:
            vote = st.vote_for
            if vote is not None and vote != req.leader_id:
                if st.leader_id is not None:
                    return self._vote_response(req, R.REJECT_ALREADY_HAS_LEADER), []
                return self._vote_response(req, R.REJECT_ALREADY_VOTED), []
        else:
            # Stepped down by a larger term; vote only once our term has caught up.
            actions.extend(self._change_role_to_candidate(req.term, now_ms))
            self._need_increase_term_immediately = True
            return self._vote_response(req, R.REJECT_TERM_NOT_READY), actions

        if req.term < st.ledger_end_term:
            return self._vote_response(req, R.REJECT_TERM_SMALL_THAN_LEDGER, st.ledger_end_term), []
        if not self_vote and self._refuses_for_taking_leadership(req):
            return self._vote_response(req, R.REJECT_TAKING_LEADERSHIP), []

        st.set_vote_for(req.leader_id)  # durable before the answer leaves
        return self._vote_response(req, R.ACCEPT), []

    def _has_live_leader(self, now_ms: int) -> bool:
        st = self.state
        timeout = self.config.heartbeat_timeout_ms
        if st.role is Role.FOLLOWER:
            last = self._timers.last_leader_heartbeat_ms
        elif st.role is Role.LEADER:
            last = self._timers.last_succ_heartbeat_ms
        else:
            return False
        return last is not None and now_ms - last <= timeout

    def _saw_event(self, now_ms: int) -> None:
        if self._first_event_ms is None:
            self._first_event_ms = now_ms

    def _quiet_after_restart(self, now_ms: int) -> bool:
        """Within one heartbeat timeout of a restarted member's first event."""
        self._saw_event(now_ms)
        return self._restarted and now_ms - self._first_event_ms <= self.config.heartbeat_timeout_ms

    def _judge_pre_vote(self, req: VoteRequest, now_ms: int, *, self_vote: bool) -> VoteResponse:
        """Would we vote for ``req.leader_id`` in ``req.term``?  No state changes."""
        st = self.state
        R = VoteResult
        if req.term < st.current_term:
            return self._vote_response(req, R.REJECT_EXPIRED_VOTE_TERM)
        if req.term < st.ledger_end_term:
            return self._vote_response(req, R.REJECT_TERM_SMALL_THAN_LEDGER, st.ledger_end_term)
        if not self_vote and (self._has_live_leader(now_ms) or self._quiet_after_restart(now_ms)):
            return self._vote_response(req, R.REJECT_ALREADY_HAS_LEADER)
        if not self_vote and self._refuses_for_taking_leadership(req):
            return self._vote_response(req, R.REJECT_TAKING_LEADERSHIP)
        return self._vote_response(req, R.ACCEPT)

    # ================================================================= leader

    def _maintain_as_leader(self, now_ms: int) -> list[Action]:
        actions: list[Action] = []
        if self._transfer is not None:
            actions.extend(self._progress_transfer(now_ms))
        timers = self._timers
        if self.config.preferred_leader_ids and (
            timers.last_preferred_check_ms is None
            or now_ms - timers.last_preferred_check_ms
            >= self.config.check_preferred_leader_interval_ms
        ):
            timers.last_preferred_check_ms = now_ms
            actions.extend(self._check_preferred_leader(now_ms))
        if self.state.role is not Role.LEADER:
            return actions
        rnd = self._heartbeat_round
        if rnd is not None:
            # DLedger's maintainer waits on the heartbeat latch until the deadline.
            if now_ms >= rnd.deadline_ms:
                actions.extend(self._parse_heartbeat_round(rnd, now_ms))
            return actions
        last = timers.last_send_heartbeat_ms
        if last is None or now_ms - last > self.config.heartbeat_interval_ms:
            timers.last_send_heartbeat_ms = now_ms
            actions.extend(self._send_heartbeats(now_ms))
        return actions

    def _send_heartbeats(self, now_ms: int) -> list[Action]:
        st = self.state
        self._round_seq += 1
        rnd = _HeartbeatRound(
            round_id=self._round_seq,
            term=st.current_term,
            started_ms=now_ms,
            deadline_ms=now_ms + self.config.heartbeat_interval_ms,
            waiting=set(),
        )
        self._heartbeat_round = rnd
        actions: list[Action] = []
        for peer in st.peers:
            if peer == st.self_id:
                continue
            rnd.waiting.add(peer)
            actions.append(
                Send(
                    peer,
                    HeartbeatRequest(
                        group=st.group,
                        local_id=st.self_id,
                        remote_id=peer,
                        leader_id=st.self_id,
                        term=st.current_term,
                        round_id=rnd.round_id,
                    ),
                )
            )
        log.debug("[%s] [SendHeartbeats] term=%d round=%d", st.self_id, rnd.term, rnd.round_id)
        if self._heartbeat_round_done(rnd):  # a group of one
            actions.extend(self._parse_heartbeat_round(rnd, now_ms))
        return actions

    def on_heartbeat_response(
        self, peer: str, req: HeartbeatRequest, resp: HeartbeatResponse | None, now_ms: int
    ) -> list[Action]:
        """Count one follower's heartbeat answer (None = the call failed)."""
        st = self.state
        if st.role is Role.LEADER and req.term == st.current_term:
            # Late answers still tell who is alive, as in DLedger's callbacks.
            self._timers.peers_live[peer] = (
                resp is not None and resp.code != ResponseCode.NETWORK_ERROR
            )
        rnd = self._heartbeat_round
        if (
            rnd is None
            or req.round_id != rnd.round_id
            or req.term != rnd.term
            or peer not in rnd.waiting
        ):
            log.debug("[%s] ignore stale heartbeat response from %s: %s", self.self_id, peer, resp)
            return []
        rnd.waiting.discard(peer)
        rnd.all_num += 1
        if resp is not None:
            code = resp.code
            if code == ResponseCode.SUCCESS:
                rnd.succ_num += 1
            elif code == ResponseCode.EXPIRED_TERM:
                rnd.max_term = max(rnd.max_term, resp.term)
            elif code == ResponseCode.INCONSISTENT_LEADER:
                rnd.inconsistent_leader = True
            elif code == ResponseCode.TERM_NOT_READY:
                rnd.not_ready_num += 1
            if code != ResponseCode.SUCCESS:
                log.info(
                    "[%s] heartbeat term=%d to %s answered %s (term %d)",
                    self.self_id,
                    rnd.term,
                    peer,
                    ResponseCode(code).name,
                    resp.term,
                )
        if self._heartbeat_round_done(rnd):
            return self._parse_heartbeat_round(rnd, now_ms)
        return []

    def _heartbeat_round_done(self, rnd: _HeartbeatRound) -> bool:
        st = self.state
        return (
            rnd.all_num >= st.peer_size
            or st.is_quorum(rnd.succ_num)
            or st.is_quorum(rnd.succ_num + rnd.not_ready_num)
        )

    def _parse_heartbeat_round(self, rnd: _HeartbeatRound, now_ms: int) -> list[Action]:
        if self._heartbeat_round is rnd:
            self._heartbeat_round = None
        st = self.state
        if st.role is not Role.LEADER or st.current_term != rnd.term:
            return []
        timers = self._timers
        term = rnd.term
        if rnd.max_term > term:
            log.warning(
                "[%s] currentTerm %d is not the biggest=%d, deal with it",
                st.self_id,
                term,
                rnd.max_term,
            )
            return self._change_role_to_candidate(rnd.max_term, now_ms)
        if st.is_quorum(rnd.succ_num):
            timers.last_succ_heartbeat_ms = now_ms
            return []
        log.info(
            "[%s] Parse heartbeat responses in cost=%d term=%d allNum=%d succNum=%d "
            "notReadyNum=%d inconsistLeader=%s maxTerm=%d peerSize=%d lastSuccHeartBeatTime=%s",
            st.self_id,
            now_ms - rnd.started_ms,
            term,
            rnd.all_num,
            rnd.succ_num,
            rnd.not_ready_num,
            rnd.inconsistent_leader,
            rnd.max_term,
            st.peer_size,
            timers.last_succ_heartbeat_ms,
        )
        if st.is_quorum(rnd.succ_num + rnd.not_ready_num):
            timers.last_send_heartbeat_ms = None  # send again at the next tick
        elif rnd.inconsistent_leader:
            return self._change_role_to_candidate(term, now_ms)
        elif (
            timers.last_succ_heartbeat_ms is None
            or now_ms - timers.last_succ_heartbeat_ms > self.config.heartbeat_timeout_ms
        ):
            return self._change_role_to_candidate(term, now_ms)
        return []

    # =============================================================== follower

    def _maintain_as_follower(self, now_ms: int) -> list[Action]:
        actions: list[Action] = []
        if self._pending_take is not None:
            actions.extend(self._check_pending_take(now_ms))
            if self.state.role is not Role.FOLLOWER:
                return actions
        last = self._timers.last_leader_heartbeat_ms
        if last is None or now_ms - last > self.config.heartbeat_timeout_ms:
            st = self.state
            log.info(
                "[%s][HeartBeatTimeOut] lastLeaderHeartBeatTime=%s heartBeatTimeIntervalMs=%d lastLeader=%s term=%d",
                st.self_id,
                last,
                self.config.heartbeat_interval_ms,
                st.leader_id,
                st.current_term,
            )
            actions.extend(self._change_role_to_candidate(st.current_term, now_ms))
        return actions

    def handle_heartbeat(
        self, req: HeartbeatRequest, now_ms: int
    ) -> tuple[HeartbeatResponse, list[Action]]:
        """DLedger's handleHeartBeat (plus DLedgerServer's receiver and group checks)."""
        self._saw_event(now_ms)
        st = self.state
        C = ResponseCode
        if req.remote_id != st.self_id:
            log.warning("[%s] [HandleHeartBeat] addressed to %s", st.self_id, req.remote_id)
            return self._heartbeat_response(req, C.UNKNOWN_MEMBER), []
        if req.group != st.group:
            log.warning("[%s] [HandleHeartBeat] group %s != %s", st.self_id, req.group, st.group)
            return self._heartbeat_response(req, C.UNKNOWN_GROUP), []
        if not st.is_peer_member(req.leader_id):
            log.warning(
                "[%s] [BUG] [HandleHeartBeat] remoteId=%s is an unknown member",
                st.self_id,
                req.leader_id,
            )
            return self._heartbeat_response(req, C.UNKNOWN_MEMBER), []
        if req.leader_id == st.self_id:
            log.warning(
                "[%s] [BUG] [HandleHeartBeat] selfId=%s but remoteId=%s",
                st.self_id,
                st.self_id,
                req.leader_id,
            )
            return self._heartbeat_response(req, C.UNEXPECTED_MEMBER), []

        if req.term < st.current_term:
            return self._heartbeat_response(req, C.EXPIRED_TERM), []
        if req.term < st.known_max_term_in_group:
            # We stepped down for a newer term that becomes current at our next tick
            # (DLedger defers it to the maintainer).  Following the old leader in that
            # window would undo the step-down and cancel a take-leadership.
            return self._heartbeat_response(req, C.EXPIRED_TERM, st.known_max_term_in_group), []
        if req.term == st.current_term:
            if st.leader_id is None:
                actions = self._change_role_to_follower(req.term, req.leader_id, now_ms)
                return self._heartbeat_response(req, C.SUCCESS), actions
            if req.leader_id == st.leader_id:
                self._timers.last_leader_heartbeat_ms = now_ms
                return self._heartbeat_response(req, C.SUCCESS), []
            log.error(
                "[%s][BUG] currTerm %d has leader %s, but received leader %s",
                st.self_id,
                st.current_term,
                st.leader_id,
                req.leader_id,
            )
            return self._heartbeat_response(req, C.INCONSISTENT_LEADER), []
        # A larger term: become a candidate first; the term catches up at the next tick.
        actions = self._change_role_to_candidate(req.term, now_ms)
        self._need_increase_term_immediately = True
        return self._heartbeat_response(req, C.TERM_NOT_READY), actions

    def _heartbeat_response(
        self, req: HeartbeatRequest, code: ResponseCode, term: int | None = None
    ) -> HeartbeatResponse:
        st = self.state
        if code != ResponseCode.SUCCESS:
            log.info(
                "[%s] [HandleHeartBeat] leader=%s term=%d myTerm=%d myLeader=%s -> %s",
                st.self_id,
                req.leader_id,
                req.term,
                st.current_term,
                st.leader_id,
                code.name,
            )
        return HeartbeatResponse(
            code,
            st.current_term if term is None else term,
            group=st.group,
            local_id=st.self_id,
            remote_id=req.local_id,
            leader_id=st.leader_id,
        )

    # ========================================================== role changes

    def _change_role_to_leader(self, term: int, now_ms: int) -> list[Action]:
        st = self.state
        if st.current_term != term:
            log.warning(
                "[%s] skip to be the leader in term: %d, but currTerm is: %d",
                st.self_id,
                term,
                st.current_term,
            )
            return []
        st.change_to_leader(term)
        self._vote_round = None
        self._pre_vote_granted_term = -1
        self._pending_take = None
        timers = self._timers
        timers.last_send_heartbeat_ms = None
        timers.last_succ_heartbeat_ms = now_ms
        timers.last_preferred_check_ms = now_ms
        timers.peers_live.clear()
        timers.peer_match_index.clear()
        log.info(
            "[%s] [ChangeRoleToLeader] from term: %d and currTerm: %d",
            st.self_id,
            term,
            st.current_term,
        )
        return self._handle_role_change(term, Role.LEADER)

    def _change_role_to_candidate(self, term: int, now_ms: int) -> list[Action]:
        st = self.state
        if term < st.current_term:
            log.info(
                "[%s] skip to be candidate in term: %d, but currTerm: %d",
                st.self_id,
                term,
                st.current_term,
            )
            return []
        actions: list[Action] = []
        was_leader = st.role is Role.LEADER
        transfer = self._transfer
        st.change_to_candidate(term)
        self._heartbeat_round = None
        self._pending_take = None
        if transfer is not None:
            self._transfer = None
            code = (
                ResponseCode.SUCCESS
                if term > transfer.term
                else ResponseCode.TAKE_LEADERSHIP_FAILED
            )
            log.info(
                "[%s] leadership transfer to %s of term %d ended on step-down to term %d: %s",
                st.self_id,
                transfer.transferee,
                transfer.term,
                term,
                code.name,
            )
            actions.append(TransferOutcome(transfer.term, transfer.transferee, code))
        log.info(
            "[%s] [ChangeRoleToCandidate] from term: %d and currTerm: %d%s",
            st.self_id,
            term,
            st.current_term,
            " (stepped down)" if was_leader else "",
        )
        actions.extend(self._handle_role_change(term, Role.CANDIDATE))
        return actions

    def _change_role_to_follower(self, term: int, leader_id: str, now_ms: int) -> list[Action]:
        st = self.state
        log.info(
            "[%s][ChangeRoleToFollower] from term: %d leaderId: %s and currTerm: %d",
            st.self_id,
            term,
            leader_id,
            st.current_term,
        )
        self._last_parse_result = ParseResult.WAIT_TO_REVOTE
        st.change_to_follower(term, leader_id)
        self._vote_round = None
        self._pre_vote_granted_term = -1  # a grant is only good for the round it enabled
        self._heartbeat_round = None
        self._timers.last_leader_heartbeat_ms = now_ms
        return self._handle_role_change(term, Role.FOLLOWER)

    def _handle_role_change(self, term: int, role: Role) -> list[Action]:
        self._check_take_leadership(term, role)
        st = self.state
        ann = self._announced
        if ann.term == term and ann.role is role and ann.leader_id == st.leader_id:
            return []
        ann.term, ann.role, ann.leader_id = term, role, st.leader_id
        return [RoleChange(term, role, st.leader_id)]  # the one channel role changes leave by

    # =================================================== leadership transfer

    def transfer_leadership(
        self, transferee_id: str, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        """Ask this member (the leader) to hand leadership of its term to ``transferee_id``."""
        st = self.state
        req = LeadershipTransferRequest(
            group=st.group,
            local_id=st.self_id,
            remote_id=st.self_id,
            term=st.current_term,
            transfer_id=st.self_id,
            transferee_id=transferee_id,
            leader_id=st.leader_id,
        )
        return self.handle_leadership_transfer(req, now_ms)

    def handle_leadership_transfer(
        self, req: LeadershipTransferRequest, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        """On the leader: start a transfer.  On the transferee: take leadership."""
        st = self.state
        C = ResponseCode
        log.info(
            "[%s] handleLeadershipTransfer term=%d transfer=%s transferee=%s index=%d myTerm=%d",
            st.self_id,
            req.term,
            req.transfer_id,
            req.transferee_id,
            req.take_leadership_ledger_index,
            st.current_term,
        )
        if req.remote_id != st.self_id:
            return self._transfer_response(req, C.UNKNOWN_MEMBER), []
        if req.group != st.group:
            return self._transfer_response(req, C.UNKNOWN_GROUP), []
        if req.transfer_id == st.self_id:
            return self._start_transfer(req, now_ms)
        if req.transferee_id == st.self_id:
            return self._take_leadership(req, now_ms)
        return self._transfer_response(req, C.UNEXPECTED_ARGUMENT), []

    def _transfer_response(
        self, req: LeadershipTransferRequest, code: ResponseCode
    ) -> LeadershipTransferResponse:
        st = self.state
        if code != ResponseCode.SUCCESS:
            log.info(
                "[%s] leadership transfer term=%d to %s refused: %s",
                st.self_id,
                req.term,
                req.transferee_id,
                code.name,
            )
        return LeadershipTransferResponse(
            code,
            st.current_term,
            group=st.group,
            local_id=st.self_id,
            remote_id=req.local_id,
            leader_id=st.leader_id,
        )

    def _start_transfer(
        self, req: LeadershipTransferRequest, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        st = self.state
        C = ResponseCode
        if not st.is_peer_member(req.transferee_id):
            return self._transfer_response(req, C.UNKNOWN_MEMBER), []
        if st.current_term != req.term:
            return self._transfer_response(req, C.INCONSISTENT_TERM), []
        if st.role is not Role.LEADER:
            return self._transfer_response(req, C.NOT_LEADER), []
        if req.transferee_id == st.self_id:
            return self._transfer_response(req, C.SUCCESS), []  # already leading
        if st.transferee is not None:
            return self._transfer_response(req, C.LEADER_TRANSFERRING), []
        st.set_transferee(req.transferee_id)
        self._transfer = _Transfer(
            transferee=req.transferee_id,
            term=st.current_term,
            started_ms=now_ms,
            deadline_ms=now_ms + self.config.leadership_transfer_wait_timeout_ms,
        )
        log.info(
            "[%s] start leadership transfer term=%d to %s ledgerEndIndex=%d peerMatch=%d",
            st.self_id,
            st.current_term,
            req.transferee_id,
            st.ledger_end_index,
            self._timers.peer_match_index.get(req.transferee_id, -1),
        )
        return self._transfer_response(req, C.SUCCESS), self._progress_transfer(now_ms)

    def _abandon_transfer(self, code: ResponseCode, why: str) -> list[Action]:
        transfer = self._transfer
        if transfer is None:
            return []
        self._transfer = None
        if self.state.transferee == transfer.transferee:
            self.state.set_transferee(None)
        log.warning(
            "[%s] leadership transfer term=%d to %s abandoned (%s): %s",
            self.self_id,
            transfer.term,
            transfer.transferee,
            why,
            code.name,
        )
        return [TransferOutcome(transfer.term, transfer.transferee, code)]

    def _progress_transfer(self, now_ms: int) -> list[Action]:
        transfer = self._transfer
        st = self.state
        if transfer is None:
            return []
        if st.role is not Role.LEADER or st.current_term != transfer.term:
            return self._abandon_transfer(ResponseCode.TAKE_LEADERSHIP_FAILED, "no longer leader")
        if now_ms > transfer.deadline_ms:
            return self._abandon_transfer(ResponseCode.TIMEOUT, "wait timeout")
        if transfer.take_sent:
            return []
        match = self._timers.peer_match_index.get(transfer.transferee, -1)
        fall_behind = st.ledger_end_index - match
        if fall_behind >= self.config.max_leadership_transfer_wait_index:
            return []
        transfer.take_sent = True
        log.info(
            "[%s] tell %s to take leadership of term %d at index %d (fall behind %d)",
            st.self_id,
            transfer.transferee,
            transfer.term,
            st.ledger_end_index,
            fall_behind,
        )
        return [
            Send(
                transfer.transferee,
                LeadershipTransferRequest(
                    group=st.group,
                    local_id=st.self_id,
                    remote_id=transfer.transferee,
                    term=transfer.term,
                    transfer_id=st.self_id,
                    transferee_id=transfer.transferee,
                    leader_id=st.self_id,
                    take_leadership_ledger_index=st.ledger_end_index,
                    wait_timeout_ms=transfer.deadline_ms - now_ms,
                ),
            )
        ]

    def on_leadership_transfer_response(
        self,
        peer: str,
        req: LeadershipTransferRequest,
        resp: LeadershipTransferResponse | None,
        now_ms: int,
    ) -> list[Action]:
        """The transferee's answer to take-leadership; a refusal ends the transfer."""
        transfer = self._transfer
        if transfer is None or peer != transfer.transferee or req.term != transfer.term:
            return []
        if resp is None:
            return self._abandon_transfer(
                ResponseCode.TAKE_LEADERSHIP_FAILED, "transferee unreachable"
            )
        if resp.code != ResponseCode.SUCCESS:
            return self._abandon_transfer(ResponseCode(resp.code), "transferee refused")
        return []  # it is voting; we step down when its term reaches us, or time out

    def on_peer_progress(self, peer: str, match_index: int, now_ms: int) -> list[Action]:
        """The shell reports a follower's match index (its replication water mark)."""
        timers = self._timers
        if match_index > timers.peer_match_index.get(peer, -1):
            timers.peer_match_index[peer] = match_index
        if self._transfer is not None and self._transfer.transferee == peer:
            return self._progress_transfer(now_ms)
        return []

    def _check_preferred_leader(self, now_ms: int) -> list[Action]:
        """DLedgerServer.checkPreferredLeader: hand over to the least-behind live preferred peer."""
        st = self.state
        preferred = self.config.preferred_leader_ids
        if st.role is not Role.LEADER or not preferred or st.transferee is not None:
            return []
        if st.self_id in preferred:
            return []
        live = self._timers.peers_live
        match = self._timers.peer_match_index
        best: str | None = None
        best_behind = 0
        for peer in preferred:
            if not st.is_peer_member(peer):
                log.warning("[%s] preferredLeaderId = %s is not a peer member", st.self_id, peer)
                continue
            if not live.get(peer, False):
                continue
            behind = st.ledger_end_index - match.get(peer, -1)
            if best is None or behind < best_behind:
                best, best_behind = peer, behind
        if best is None or best_behind >= self.config.max_leadership_transfer_wait_index:
            return []
        log.info(
            "[%s] preferredLeaderId = %s, which has the smallest fall behind index = %d, is the transferee",
            st.self_id,
            best,
            best_behind,
        )
        resp, actions = self.transfer_leadership(best, now_ms)
        return actions

    # ---------------------------------------------------------- transferee

    def _take_leadership(
        self, req: LeadershipTransferRequest, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        st = self.state
        C = ResponseCode
        taking = self._taking_from
        if (
            taking is not None
            and taking.term == req.term
            and taking.transfer_id == req.transfer_id
            and st.term_to_take_leadership == req.term + 1
        ):
            return self._transfer_response(req, C.SUCCESS), []  # a repeated order
        pending = self._pending_take
        if (
            pending is not None
            and pending.request.term == req.term
            and pending.request.transfer_id == req.transfer_id
        ):
            return self._transfer_response(req, C.SUCCESS), []
        if req.transfer_id != st.leader_id:
            return self._transfer_response(req, C.INCONSISTENT_LEADER), []
        if st.current_term != req.term:
            return self._transfer_response(req, C.INCONSISTENT_TERM), []
        if st.ledger_end_index >= req.take_leadership_ledger_index:
            return self._transfer_response(req, C.SUCCESS), self._begin_take_leadership(req, now_ms)
        wait = req.wait_timeout_ms or self.config.leadership_transfer_wait_timeout_ms
        self._pending_take = _PendingTake(req, now_ms + wait)
        log.info(
            "[%s] take leadership of term %d waits for index %d (at %d)",
            st.self_id,
            req.term,
            req.take_leadership_ledger_index,
            st.ledger_end_index,
        )
        return self._transfer_response(req, C.SUCCESS), []

    def _check_pending_take(self, now_ms: int) -> list[Action]:
        pending = self._pending_take
        st = self.state
        if pending is None:
            return []
        req = pending.request
        if (
            st.current_term != req.term
            or st.leader_id != req.transfer_id
            or st.role is not Role.FOLLOWER
        ):
            self._pending_take = None
            return []
        if st.ledger_end_index >= req.take_leadership_ledger_index:
            self._pending_take = None
            return self._begin_take_leadership(req, now_ms)
        if now_ms > pending.deadline_ms:
            self._pending_take = None
            log.warning(
                "[%s] transferee fall behind, wait timeout: index %d < %d; TAKE_LEADERSHIP_FAILED",
                st.self_id,
                st.ledger_end_index,
                req.take_leadership_ledger_index,
            )
        return []

    def _begin_take_leadership(self, req: LeadershipTransferRequest, now_ms: int) -> list[Action]:
        """DLedger's handleTakeLeadership: vote at once for term + 1."""
        st = self.state
        target = req.term + 1
        st.term_to_take_leadership = target
        self._taking_from = req
        log.info("[%s] take leadership: vote for term %d now", st.self_id, target)
        actions = self._change_role_to_candidate(target, now_ms)
        self._need_increase_term_immediately = True
        return actions

    def _check_take_leadership(self, term: int, role: Role) -> None:
        """DLedger's TakeLeadershipTask.check: end the take-leadership attempt when decided."""
        st = self.state
        target = st.term_to_take_leadership
        if target == -1:
            return
        if term > target:
            outcome = ResponseCode.EXPIRED_TERM
        elif term == target:
            if role is Role.LEADER:
                outcome = ResponseCode.SUCCESS
            elif role is Role.FOLLOWER:
                outcome = ResponseCode.TAKE_LEADERSHIP_FAILED
            else:
                return
        else:
            outcome = (
                ResponseCode.TAKE_LEADERSHIP_FAILED
                if role is Role.FOLLOWER
                else ResponseCode.INTERNAL_ERROR
            )
        log.info(
            "[%s] TakeLeadershipTask finished term=%d role=%s target=%d: %s",
            st.self_id,
            term,
            role.value,
            target,
            outcome.name,
        )
        st.term_to_take_leadership = -1
        self._taking_from = None
