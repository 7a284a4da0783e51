"""Elections from both sides: a candidate's vote and pre-vote rounds (DLedger's
``maintainAsCandidate`` and ``parseVoteResult``), and a voter's judgement of a request
(``handleVote``, plus the pre-vote rule that refuses while a live leader is heard)."""

from __future__ import annotations

from logging import DEBUG, INFO, WARNING

from rayledger.storage.errors import ResponseCode

from .messages import (
    Action,
    ParseResult,
    Role,
    Send,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from .parts import ElectorShared, Roles
from .votes import VoteTally, Wait


class Voting:
    """The candidate's rounds and the voter's answers; a part of
    :class:`~rayledger.election.elector.Elector`."""

    def __init__(self, sh: ElectorShared, roles: Roles) -> None:
        self.sh = sh
        self.roles = roles
        self.round: VoteTally | None = None  # the candidate's vote or pre-vote round
        self.pre_vote_granted_term = -1  # the term a passed pre-vote lets it raise to
        self.last_vote_cost_ms = 0
        # The term it held when it restarted: it never runs a real vote round in it, however
        # its pre-votes go (a failed pre-vote must not fall back to a vote in the old term).
        self.restart_term = sh.state.current_term if sh.restarted else -1
        # A restarted member has also forgotten when it last heard from a leader.  Granting
        # pre-votes at once could elect a new leader while the old one still serves lease
        # reads confirmed with this member's help, so it grants none for one heartbeat
        # timeout after its first event, as if it had just heard from a leader (see
        # docs/SAFETY.md, lease reads).
        self.first_event_ms: int | None = None
        # In a new group, a member that is not a preferred leader waits one vote interval
        # more before its first campaign, so a preferred one starts the group's first
        # election: the group does not open with a term that a hand-over to the preferred
        # member ends at once (its leader would keep its helpers' processes for a term to
        # come).  Once a leader is known (the elector clears it) or after a restart, none.
        self.head_start = (
            bool(sh.config.preferred_leader_ids)
            and sh.state.self_id not in sh.config.preferred_leader_ids
            and not sh.restarted
        )

    def next_time_to_request_vote(self, now_ms: int) -> int:
        cfg = self.sh.config
        if self.sh.is_taking_leadership:
            lo, hi = (
                cfg.min_take_leadership_vote_interval_ms,
                cfg.max_take_leadership_vote_interval_ms,
            )
        else:
            lo, hi = cfg.min_vote_interval_ms, cfg.max_vote_interval_ms
        wait = lo + self.sh.rng.randrange(hi - lo)
        if self.head_start:
            self.head_start = False
            wait += cfg.max_vote_interval_ms
        return now_ms + wait

    def _pre_vote_required(self) -> bool:
        st = self.sh.state
        return (
            self.sh.config.enable_pre_vote
            and st.known_max_term_in_group <= st.current_term
            and self.pre_vote_granted_term != st.current_term + 1
            and not self.sh.is_taking_leadership
        )

    def maintain(self, now_ms: int) -> list[Action]:
        rnd = self.round
        if rnd is not None:
            # DLedger's maintainer is blocked on the vote latch until the deadline.
            if now_ms >= rnd.deadline_ms:
                return self._parse_vote_round(rnd, now_ms)
            return []
        timers = self.sh.timers
        if now_ms < timers.next_time_to_request_vote and not self.sh.need_increase_term_immediately:
            return []
        st = self.sh.state
        if st.role is not Role.CANDIDATE:
            return []
        if not st.is_voter():  # a learner, or a member removed: it never campaigns,
            if self.sh.need_increase_term_immediately and (
                st.known_max_term_in_group > st.current_term
            ):  # but takes the term of the leader that wrote to it, to follow it
                term = st.next_term()
                self.sh.log(INFO, "LEARNER_TAKES_TERM", term=term)
            self.sh.need_increase_term_immediately = False
            timers.next_time_to_request_vote = self.next_time_to_request_vote(now_ms)
            return []
        # DLedger campaigns again in its current term after a lost vote -- but not once the
        # voters changed in it: votes granted in the term stay granted, and a minority of
        # the old voters that voted for this member in an election it lost could make a
        # majority of the new ones, two leaders of one term (the all-features simulation
        # found it)
        if (
            self.sh.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
            or self.sh.need_increase_term_immediately
            or st.current_term <= self.restart_term
            or st.voters_changed_in_term()
        ):
            if not self.sh.need_increase_term_immediately and self._pre_vote_required():
                return self._start_vote_round(now_ms, pre_vote=True)
            prev = st.current_term
            term = st.next_term()
            self.pre_vote_granted_term = -1
            self.sh.log(INFO, "INCREASE_TERM", term=term, prev=prev)
            self.sh.last_parse_result = ParseResult.WAIT_TO_REVOTE
        if self.sh.need_increase_term_immediately:
            timers.next_time_to_request_vote = self.next_time_to_request_vote(now_ms)
            self.sh.need_increase_term_immediately = False
            return []
        return self._start_vote_round(now_ms, pre_vote=False)

    def _start_vote_round(self, now_ms: int, *, pre_vote: bool) -> list[Action]:
        st = self.sh.state
        term = st.current_term + 1 if pre_vote else st.current_term
        deadline = (
            now_ms
            + self.sh.config.vote_wait_base_ms
            + self.sh.rng.randrange(self.sh.config.max_vote_interval_ms)
        )
        rnd = VoteTally(
            round_id=self.sh.next_round_id(),
            term=term,
            pre_vote=pre_vote,
            started_ms=now_ms,
            deadline_ms=deadline,
            waiting=set(),
            known_max_term_in_group=term,
        )
        self.round = rnd
        taking = self.sh.is_taking_leadership
        self.sh.log(
            INFO,
            "PRE_VOTE" if pre_vote else "VOTE",
            term=term,
            index=st.ledger_end_index,
            ledger_end_term=st.ledger_end_term,
            round=rnd.round_id,
        )
        actions: list[Action] = []
        self_request = None
        for peer in st.voters:
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
        if rnd.done(st.voter_size):
            actions.extend(self._parse_vote_round(rnd, now_ms))
        return actions

    def on_response(
        self, peer: str, req: VoteRequest, resp: VoteResponse | None, now_ms: int
    ) -> list[Action]:
        """Count one voter's answer (None = the call failed) into the current round."""
        rnd = self.round
        if (
            rnd is None
            or req.round_id != rnd.round_id
            or req.term != rnd.term
            or req.pre_vote != rnd.pre_vote
            or peer not in rnd.waiting
        ):
            self.sh.log(DEBUG, "StaleVoteResponse", voter=peer, resp=resp)
            return []
        rnd.waiting.discard(peer)
        self.sh.log(
            INFO,
            "GetVoteResponse",
            term=rnd.term,
            voter=peer,
            pre=rnd.pre_vote,
            result=None if resp is None else resp.result.value,
            resp_term=None if resp is None else resp.term,
        )
        rnd.count(resp)
        if rnd.done(self.sh.state.voter_size):
            return self._parse_vote_round(rnd, now_ms)
        return []

    def _parse_vote_round(self, rnd: VoteTally, now_ms: int) -> list[Action]:
        if self.round is rnd:
            self.round = None
        st = self.sh.state
        actions: list[Action] = []
        term = rnd.term
        self.last_vote_cost_ms = now_ms - rnd.started_ms
        decision = rnd.decide(st.voter_size)
        result = decision.result
        if decision.wait is not Wait.NONE:
            extra = {
                Wait.PLUS_HEARTBEAT_TIMEOUT: self.sh.config.heartbeat_timeout_ms,
                Wait.PLUS_MAX_VOTE_INTERVAL: self.sh.config.max_vote_interval_ms,
            }.get(decision.wait, 0)
            self.sh.timers.next_time_to_request_vote = (
                self.next_time_to_request_vote(now_ms) + extra
            )
        if decision.raise_term_to is not None:
            actions.extend(self.roles.change_role_to_candidate(decision.raise_term_to, now_ms))
        self.sh.log(
            INFO,
            "PARSE_PRE_VOTE_RESULT" if rnd.pre_vote else "PARSE_VOTE_RESULT",
            term=term,
            cost=self.last_vote_cost_ms,
            members=st.voter_size,
            all=rnd.all_num,
            valid=rnd.valid_num,
            accepted=rnd.accepted_num,
            not_ready=rnd.not_ready_term_num,
            bigger_ledger=rnd.bigger_ledger_num,
            has_leader=rnd.already_has_leader,
            max_term=rnd.known_max_term_in_group,
            result=result.value,
        )
        if rnd.pre_vote:
            if result is ParseResult.PASSED and st.role is Role.CANDIDATE:
                # Could win term + 1: raise the term now and ask for real votes.
                self.pre_vote_granted_term = term
                self.sh.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
                actions.extend(self.maintain(now_ms))
            else:
                self.sh.last_parse_result = result
            return actions
        self.sh.last_parse_result = result
        if result is ParseResult.PASSED:
            self.sh.log(INFO, "VOTE_RESULT", term=term, elected=True)
            actions.extend(self.roles.change_role_to_leader(term, now_ms))
        return actions

    def handle(self, req: VoteRequest, now_ms: int) -> tuple[VoteResponse, list[Action]]:
        """Answer a (pre-)vote request from another member."""
        st = self.sh.state
        if req.remote_id != st.self_id:
            self.sh.log(WARNING, "HandleVote", addressed_to=req.remote_id)
            return self._vote_response(
                req, VoteResult.UNKNOWN, code=ResponseCode.UNKNOWN_MEMBER
            ), []
        if req.group != st.group:
            self.sh.log(WARNING, "HandleVote", group=req.group, my_group=st.group)
            return self._vote_response(req, VoteResult.UNKNOWN, code=ResponseCode.UNKNOWN_GROUP), []
        resp, actions = self._judge_vote(req, now_ms, self_vote=False)
        self.sh.log(
            INFO,
            "HandleVote",
            term=req.term,
            candidate=req.leader_id,
            pre=req.pre_vote,
            ledger=(req.ledger_end_index, req.ledger_end_term),
            my_term=st.current_term,
            my_ledger=(st.ledger_end_index, st.ledger_end_term),
            result=resp.result.value,
        )
        return resp, actions

    def _vote_response(
        self,
        req: VoteRequest,
        result: VoteResult,
        term: int | None = None,
        code: ResponseCode = ResponseCode.SUCCESS,
    ) -> VoteResponse:
        st = self.sh.state
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
        st = self.sh.state
        return (
            self.sh.is_taking_leadership
            and req.ledger_end_term == st.ledger_end_term
            and st.ledger_end_index >= req.ledger_end_index
        )

    def _judge_vote(
        self, req: VoteRequest, now_ms: int, *, self_vote: bool
    ) -> tuple[VoteResponse, list[Action]]:
        """DLedger's handleVote (and the pre-vote variant, which changes no state)."""
        st = self.sh.state
        R = VoteResult
        # a vote is judged by the logs, never by this member's configuration (Raft §4.2.1):
        # that may be stale -- a member restarted empty, or one behind a promotion -- and
        # refusing a candidate it does not know as a voter wedged a group whose only live
        # majority needed this vote.  A candidate outside the group's latest configuration
        # cannot win: a majority of the configuration it counts holds the later entries
        # that removed it (or never added it) and refuses it on the logs below; pre-vote
        # keeps it from raising terms meanwhile
        if not self_vote and req.leader_id == st.self_id:
            self.sh.log(WARNING, "BUG HandleVote", from_self=req.leader_id)
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
            actions.extend(self.roles.change_role_to_candidate(req.term, now_ms))
            self.sh.need_increase_term_immediately = True
            return self._vote_response(req, R.REJECT_TERM_NOT_READY), actions

        if req.term < st.ledger_end_term:
            return self._vote_response(req, R.REJECT_TERM_SMALL_THAN_LEDGER, st.ledger_end_term), []
        if not self_vote and self._refuses_for_taking_leadership(req):
            return self._vote_response(req, R.REJECT_TAKING_LEADERSHIP), []

        st.set_vote_for(req.leader_id)  # durable before the answer leaves
        return self._vote_response(req, R.ACCEPT), []

    def _has_live_leader(self, now_ms: int) -> bool:
        st = self.sh.state
        timeout = self.sh.config.heartbeat_timeout_ms
        if st.role is Role.FOLLOWER:
            last = self.sh.timers.last_leader_heartbeat_ms
        elif st.role is Role.LEADER:
            last = self.sh.timers.last_succ_heartbeat_ms
        else:
            return False
        return last is not None and now_ms - last <= timeout

    def saw_event(self, now_ms: int) -> None:
        if self.first_event_ms is None:
            self.first_event_ms = now_ms

    def _quiet_after_restart(self, now_ms: int) -> bool:
        """Within one heartbeat timeout of a restarted member's first event."""
        self.saw_event(now_ms)
        return (
            self.sh.restarted
            and now_ms - self.first_event_ms <= self.sh.config.heartbeat_timeout_ms
        )

    def _judge_pre_vote(self, req: VoteRequest, now_ms: int, *, self_vote: bool) -> VoteResponse:
        """Would we vote for ``req.leader_id`` in ``req.term``?  No state changes."""
        st = self.sh.state
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
