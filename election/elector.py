"""DLedger's leader elector (``DLedgerLeaderElector``) as a sans-I/O state machine.

The core never reads a clock, sleeps, spawns threads or does I/O other than the
term store write.  Its one way in is :meth:`Elector.step`, with one of

* ``Tick`` -- DLedger's 10 ms ``maintainState`` step,
* ``ElectionRequest`` -- a request from another member, answered at once,
* ``ElectionAnswer`` -- the answer (or ``None`` when the call failed) to a
  request this core asked the shell to send,
* ``TransferOrder``, ``HandOverOrder``, ``PeerProgress`` and ``QuitLeadership`` -- the
  member's own requests,

and every step returns an :class:`~.messages.ElectorOut`: the direct answer and the actions
for the shell: :class:`Send` (deliver a message, feed the answer back), :class:`RoleChange`
and :class:`TransferOutcome`.

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

import random
from logging import INFO, WARNING

from rayledger.storage.errors import LedgerError, ResponseCode

from .config import ElectionConfig
from .heartbeats import Heartbeats
from .member_state import MemberState
from .messages import (
    Action,
    ElectionAnswer,
    ElectionRequest,
    ElectorEvent,
    ElectorOut,
    HandOverOrder,
    HeartbeatRequest,
    LeadershipTransferRequest,
    ParseResult,
    PeerProgress,
    QuitLeadership,
    Role,
    RoleChange,
    Tick,
    TransferOrder,
    VoteRequest,
)
from .parts import ElectorShared
from .transfer import LeadershipTransfer
from .voting import Voting


class Elector:
    """Leader election core for one member; see the module docstring.  Composed of three
    parts that share one :class:`~.parts.ElectorShared` -- :attr:`voting`,
    :attr:`heartbeats` and :attr:`transfer` -- it routes each event to the part that
    handles it, runs each role's maintenance and owns the role changes."""

    def __init__(self, state: MemberState, config: ElectionConfig, rng: random.Random) -> None:
        self.shared = ElectorShared(state, config, rng)
        self.state = state
        self.config = config
        self.voting = Voting(self.shared, self)
        self.heartbeats = Heartbeats(self.shared, self)
        self.transfer = LeadershipTransfer(self.shared, self)

    @property
    def self_id(self) -> str:
        return self.state.self_id

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
    def transferring(self) -> bool:
        """True while this leader hands over leadership (appends are refused)."""
        return self.state.transferee is not None

    def lease_allowed(self, term: int) -> bool:
        """Whether this member may serve a lease read in ``term`` (a lease that also has not
        run out: :class:`~rayledger.actors.core.reads.ReadIndexLogic`).  A lease rests on pre-vote:
        a quorum that heard from this leader grants no pre-vote for a heartbeat timeout.  A
        transferee skips pre-vote, so the lease is void from the moment a transfer starts,
        and once a take order has gone out in ``term``, for the rest of ``term``: giving the
        transfer up does not recall the order (the transferee may still win a real vote, or
        get the order late), and a read round confirmed meanwhile proves nothing either."""
        st = self.state
        return (
            self.config.enable_pre_vote
            and st.role is Role.LEADER
            and st.current_term == term
            and st.transferee is None
            and self.transfer.take_order_term != term
        )

    @property
    def last_parse_result(self) -> ParseResult:
        return self.shared.last_parse_result

    @property
    def next_time_to_request_vote(self) -> int:
        return self.shared.timers.next_time_to_request_vote

    @property
    def is_taking_leadership(self) -> bool:
        """DLedger's isTakingLeadership: voting for the term the leader handed us."""
        return self.shared.is_taking_leadership

    def peers_live(self) -> dict[str, bool]:
        """Which peers answered the last heartbeat (DLedger's peersLiveTable)."""
        return dict(self.shared.timers.peers_live)

    def snapshot(self) -> dict:
        """Plain-dict status for metadata calls (``MemberActor.info``) and logs."""
        st = self.state
        running = self.transfer.running
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
            "last_parse_result": self.shared.last_parse_result.value,
            "known_max_term_in_group": st.known_max_term_in_group,
            "in_vote_round": self.voting.round is not None,
            "need_increase_term_immediately": self.shared.need_increase_term_immediately,
            "transfer_deadline_ms": running.deadline_ms if running else None,
        }

    # -- the way in ------------------------------------------------------------------------
    def step(self, ev: ElectorEvent, now_ms: int) -> ElectorOut:
        """Deliver one event at ``now_ms``: the one way in, for the member's core and the
        tests alike.  Returns the direct answer (see each event) and the actions."""
        match ev:
            case Tick():
                return ElectorOut(None, self._tick(now_ms))
            case ElectionRequest():
                return ElectorOut(*self._handle(ev.req, now_ms))
            case ElectionAnswer():
                return ElectorOut(None, self._on_response(ev.peer, ev.req, ev.resp, now_ms))
            case PeerProgress():
                # how far a follower matches, as a dispatcher of ``ev.term`` learned it
                tr = self.transfer
                return ElectorOut(
                    None, tr.on_peer_progress(ev.peer, ev.term, ev.match_index, now_ms)
                )
            case TransferOrder():
                return ElectorOut(*self.transfer.transfer_leadership(ev.target, now_ms))
            case HandOverOrder():
                return ElectorOut(*self.transfer.hand_over(ev.target, now_ms))
            case QuitLeadership():
                return ElectorOut(None, self.step_down(now_ms))
        raise TypeError(f"not an elector event: {ev!r}")

    def _handle(self, request: object, now_ms: int) -> tuple[object, list[Action]]:
        """Answer any election request (routes by type)."""
        if isinstance(request, VoteRequest):
            return self.voting.handle(request, now_ms)
        if isinstance(request, HeartbeatRequest):
            self.voting.saw_event(now_ms)
            return self.heartbeats.handle(request, now_ms)
        if isinstance(request, LeadershipTransferRequest):
            return self.transfer.handle(request, now_ms)
        raise LedgerError.of(ResponseCode.UNSUPPORTED, f"not an election request: {request!r}")

    def _on_response(
        self, peer: str, request: object, response: object | None, now_ms: int
    ) -> list[Action]:
        """Fold in the answer to any request this core sent (routes by request type)."""
        if isinstance(request, VoteRequest):
            return self.voting.on_response(peer, request, response, now_ms)  # type: ignore[arg-type]
        if isinstance(request, HeartbeatRequest):
            return self.heartbeats.on_response(peer, request, response, now_ms)  # type: ignore[arg-type]
        if isinstance(request, LeadershipTransferRequest):
            return self.transfer.on_response(peer, request, response, now_ms)  # type: ignore[arg-type]
        raise LedgerError.of(ResponseCode.UNSUPPORTED, f"not an election request: {request!r}")

    def next_tick_ms(self, now_ms: int, granularity_ms: int = 10) -> int:
        """The latest time the next ``Tick`` may run without acting late.

        A leader's next heartbeat, a follower's heartbeat timeout; candidates, transfers
        and preferred-leader checks keep ``granularity_ms``.  Ticking earlier is always
        harmless, so a shell may sleep until then instead of polling (an idle group then
        costs next to nothing).
        """
        soon = now_ms + granularity_ms
        cfg = self.config
        role = self.state.role
        timers = self.shared.timers
        if role is Role.LEADER:
            if self.transfer.running is not None:
                return soon
            due = self._preferred_check_due_ms()
            rnd = self.heartbeats.round
            if rnd is not None:
                beat = min(rnd.deadline_ms, now_ms + cfg.heartbeat_interval_ms)
            elif (last := timers.last_send_heartbeat_ms) is not None:
                beat = last + cfg.heartbeat_interval_ms + 1
            else:
                return soon
            return max(now_ms + 1, beat if due is None else min(beat, due))
        if role is Role.FOLLOWER and self.transfer.pending_take is None:
            last = timers.last_leader_heartbeat_ms
            if last is None:
                return soon
            return max(now_ms + 1, last + cfg.heartbeat_timeout_ms + 1)
        return soon

    def _preferred_check_due_ms(self) -> int | None:
        """When the leader's next preferred-leader check is due; None when it has none to
        make (no preferred leaders, or this member is one: the check would hand over to
        nobody), so a preferred leader sleeps between heartbeats like any other."""
        cfg = self.config
        if not cfg.preferred_leader_ids or self.state.self_id in cfg.preferred_leader_ids:
            return None
        last = self.shared.timers.last_preferred_check_ms
        return 0 if last is None else last + cfg.check_preferred_leader_interval_ms

    def _tick(self, now_ms: int) -> list[Action]:
        """DLedger's ``maintainState``: one step of the role's maintenance loop."""
        self.voting.saw_event(now_ms)
        role = self.state.role
        if role is Role.LEADER:
            return self._maintain_as_leader(now_ms)
        if role is Role.FOLLOWER:
            return self._maintain_as_follower(now_ms)
        return self.voting.maintain(now_ms)

    def _maintain_as_leader(self, now_ms: int) -> list[Action]:
        """A running transfer's progress, the preferred-leader check, then the heartbeat."""
        actions: list[Action] = []
        if self.transfer.running is not None:
            actions.extend(self.transfer.progress(now_ms))
        timers = self.shared.timers
        if self.config.preferred_leader_ids and (
            timers.last_preferred_check_ms is None
            or now_ms - timers.last_preferred_check_ms
            >= self.config.check_preferred_leader_interval_ms
        ):
            timers.last_preferred_check_ms = now_ms
            actions.extend(self.transfer.check_preferred_leader(now_ms))
        if self.state.role is not Role.LEADER:
            return actions
        actions.extend(self.heartbeats.maintain_as_leader(now_ms))
        return actions

    def _maintain_as_follower(self, now_ms: int) -> list[Action]:
        """A take order waiting for our log, then the leader's heartbeat timeout."""
        actions: list[Action] = []
        if self.transfer.pending_take is not None:
            actions.extend(self.transfer.check_pending_take(now_ms))
            if self.state.role is not Role.FOLLOWER:
                return actions
        actions.extend(self.heartbeats.maintain_as_follower(now_ms))
        return actions

    # -- the role changes (the parts' :class:`~.parts.Roles`) -------------------------------
    def step_down(self, now_ms: int) -> list[Action]:
        """Leave leadership of the current term at once (the leader cannot serve it: its
        first entry cannot be written, its helpers are lost and no transfer could start).
        It waits one election timeout before it campaigns, so a peer that can serve is
        elected first; it still votes, and follows whoever wins."""
        st = self.state
        if st.role is not Role.LEADER:
            return []
        actions = self.change_role_to_candidate(st.current_term, now_ms)
        self.shared.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
        self.shared.timers.next_time_to_request_vote = self.voting.next_time_to_request_vote(
            now_ms + self.config.heartbeat_timeout_ms
        )
        self.shared.log(WARNING, "StepDown", term=st.current_term)
        return actions

    def change_role_to_leader(self, term: int, now_ms: int) -> list[Action]:
        st = self.state
        self.voting.head_start = False  # a leader is known
        if st.current_term != term:
            self.shared.log(WARNING, "SkipLeader", term=term, current_term=st.current_term)
            return []
        st.change_to_leader(term)
        self.voting.round = None
        self.voting.pre_vote_granted_term = -1
        self.transfer.pending_take = None
        timers = self.shared.timers
        timers.last_send_heartbeat_ms = None
        timers.last_succ_heartbeat_ms = now_ms
        timers.last_preferred_check_ms = now_ms
        timers.peers_live.clear()
        timers.peer_match_index.clear()
        self.shared.log(INFO, "ChangeRoleToLeader", term=term)
        return self._handle_role_change(term, Role.LEADER)

    def change_role_to_candidate(self, term: int, now_ms: int) -> list[Action]:
        st = self.state
        if term < st.current_term:
            self.shared.log(INFO, "SkipCandidate", term=term, current_term=st.current_term)
            return []
        actions: list[Action] = []
        was_leader = st.role is Role.LEADER
        transfer = self.transfer.running
        st.change_to_candidate(term)
        self.heartbeats.round = None
        self.transfer.pending_take = None
        if transfer is not None:
            self.transfer.running = None
            code = (
                ResponseCode.SUCCESS
                if term > transfer.term
                else ResponseCode.TAKE_LEADERSHIP_FAILED
            )
            actions.append(
                self.transfer.ended(transfer, code, INFO, "TransferEndedOnStepDown", new_term=term)
            )
        self.shared.log(
            INFO,
            "ChangeRoleToCandidate",
            term=term,
            current_term=st.current_term,
            stepped_down=was_leader,
        )
        actions.extend(self._handle_role_change(term, Role.CANDIDATE))
        return actions

    def change_role_to_follower(self, term: int, leader_id: str, now_ms: int) -> list[Action]:
        st = self.state
        self.shared.log(
            INFO, "ChangeRoleToFollower", term=term, leader=leader_id, current_term=st.current_term
        )
        self.shared.last_parse_result = ParseResult.WAIT_TO_REVOTE
        st.change_to_follower(term, leader_id)
        if st.vote_for is None:
            # following ``leader_id`` in ``term`` spends this member's vote of the term on it:
            # DLedger grants a vote in the current term to whoever asks first, so a member
            # that took the term from a heartbeat (a voter added in the term) could
            # otherwise help a second leader to a majority of the term
            st.set_vote_for(leader_id)
        self.voting.round = None
        self.voting.pre_vote_granted_term = -1  # a grant is only good for the round it enabled
        self.voting.head_start = False  # a leader is known
        self.heartbeats.round = None
        self.shared.timers.last_leader_heartbeat_ms = now_ms
        return self._handle_role_change(term, Role.FOLLOWER)

    def _handle_role_change(self, term: int, role: Role) -> list[Action]:
        self.transfer.check_take_leadership(term, role)
        st = self.state
        ann = self.shared.announced
        if ann.term == term and ann.role is role and ann.leader_id == st.leader_id:
            return []
        ann.term, ann.role, ann.leader_id = term, role, st.leader_id
        return [RoleChange(term, role, st.leader_id)]  # the one channel role changes leave by
