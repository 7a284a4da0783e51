"""Heartbeats from both sides: the leader's rounds (DLedger's ``maintainAsLeader``,
``sendHeartbeats`` and their parse) and a follower's answers and timeout
(``handleHeartBeat``, ``maintainAsFollower``)."""

from __future__ import annotations

from logging import DEBUG, ERROR, INFO, WARNING

from rayledger.storage.errors import ResponseCode

from .messages import (
    Action,
    HeartbeatRequest,
    HeartbeatResponse,
    Role,
    Send,
)
from .parts import ElectorShared, HeartbeatRound, Roles


class Heartbeats:
    """The leader's heartbeat rounds and the follower's side of them; a part of
    :class:`~rayledger.election.elector.Elector`."""

    def __init__(self, sh: ElectorShared, roles: Roles) -> None:
        self.sh = sh
        self.roles = roles
        self.round: HeartbeatRound | None = None  # the leader's round in flight

    def maintain_as_leader(self, now_ms: int) -> list[Action]:
        """The leader's heartbeat: parse the round at its deadline, or send the next."""
        actions: list[Action] = []
        timers = self.sh.timers
        rnd = self.round
        if rnd is not None:
            # DLedger's maintainer waits on the heartbeat latch until the deadline.
            if now_ms >= rnd.deadline_ms:
                actions.extend(self._parse_heartbeat_round(rnd, now_ms))
            return actions
        last = timers.last_send_heartbeat_ms
        if last is None or now_ms - last > self.sh.config.heartbeat_interval_ms:
            timers.last_send_heartbeat_ms = now_ms
            actions.extend(self._send_heartbeats(now_ms))
        return actions

    def _send_heartbeats(self, now_ms: int) -> list[Action]:
        st = self.sh.state
        rnd = HeartbeatRound(
            round_id=self.sh.next_round_id(),
            term=st.current_term,
            started_ms=now_ms,
            deadline_ms=now_ms + self.sh.config.heartbeat_interval_ms,
            waiting=set(),
        )
        self.round = rnd
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
        self.sh.log(DEBUG, "SendHeartbeats", term=rnd.term, round=rnd.round_id)
        if self._heartbeat_round_done(rnd):  # a group of one
            actions.extend(self._parse_heartbeat_round(rnd, now_ms))
        return actions

    def on_response(
        self, peer: str, req: HeartbeatRequest, resp: HeartbeatResponse | None, now_ms: int
    ) -> list[Action]:
        """Count one follower's heartbeat answer (None = the call failed)."""
        st = self.sh.state
        if st.role is Role.LEADER and req.term == st.current_term:
            # Late answers still tell who is alive, as in DLedger's callbacks.
            self.sh.timers.peers_live[peer] = (
                resp is not None and resp.code != ResponseCode.NETWORK_ERROR
            )
        rnd = self.round
        if (
            rnd is None
            or req.round_id != rnd.round_id
            or req.term != rnd.term
            or peer not in rnd.waiting
        ):
            self.sh.log(DEBUG, "StaleHeartbeatResponse", peer=peer, resp=resp)
            return []
        rnd.waiting.discard(peer)
        rnd.all_num += 1
        if resp is not None:
            code = resp.code
            if code == ResponseCode.SUCCESS:
                if st.is_voter(peer):  # a learner's answer makes no majority
                    rnd.succ_num += 1
            elif code == ResponseCode.EXPIRED_TERM:
                rnd.max_term = max(rnd.max_term, resp.term)
            elif code == ResponseCode.INCONSISTENT_LEADER:
                rnd.inconsistent_leader = True
            elif code == ResponseCode.TERM_NOT_READY and st.is_voter(peer):
                rnd.not_ready_num += 1
            if code != ResponseCode.SUCCESS:
                self.sh.log(
                    INFO,
                    "HeartbeatAnswer",
                    term=rnd.term,
                    peer=peer,
                    code=ResponseCode(code).name,
                    resp_term=resp.term,
                )
        if self._heartbeat_round_done(rnd):
            return self._parse_heartbeat_round(rnd, now_ms)
        return []

    def _heartbeat_round_done(self, rnd: HeartbeatRound) -> bool:
        st = self.sh.state
        return (
            rnd.all_num >= st.peer_size
            or st.is_quorum(rnd.succ_num)
            or st.is_quorum(rnd.succ_num + rnd.not_ready_num)
        )

    def _parse_heartbeat_round(self, rnd: HeartbeatRound, now_ms: int) -> list[Action]:
        if self.round is rnd:
            self.round = None
        st = self.sh.state
        if st.role is not Role.LEADER or st.current_term != rnd.term:
            return []
        timers = self.sh.timers
        term = rnd.term
        if rnd.max_term > term:
            self.sh.log(WARNING, "NotTheBiggestTerm", term=term, max_term=rnd.max_term)
            actions = self.roles.change_role_to_candidate(rnd.max_term, now_ms)
            # take that term before campaigning, as a follower does on a larger heartbeat:
            # campaigning again in this term re-elected this leader by the same voters, and a
            # non-voter at the larger term (a learner) then deposed it again, for good
            self.sh.need_increase_term_immediately = True
            return actions
        if st.is_quorum(rnd.succ_num):
            timers.last_succ_heartbeat_ms = now_ms
            return []
        self.sh.log(
            INFO,
            "ParseHeartbeats",
            term=term,
            cost=now_ms - rnd.started_ms,
            all=rnd.all_num,
            succ=rnd.succ_num,
            not_ready=rnd.not_ready_num,
            inconsistent_leader=rnd.inconsistent_leader,
            max_term=rnd.max_term,
            peers=st.peer_size,
            last_succ=timers.last_succ_heartbeat_ms,
        )
        if st.is_quorum(rnd.succ_num + rnd.not_ready_num):
            timers.last_send_heartbeat_ms = None  # send again at the next tick
        elif rnd.inconsistent_leader:
            return self.roles.change_role_to_candidate(term, now_ms)
        elif (
            timers.last_succ_heartbeat_ms is None
            or now_ms - timers.last_succ_heartbeat_ms > self.sh.config.heartbeat_timeout_ms
        ):
            return self.roles.change_role_to_candidate(term, now_ms)
        return []

    def maintain_as_follower(self, now_ms: int) -> list[Action]:
        """A follower that has not heard from its leader for a heartbeat timeout campaigns."""
        actions: list[Action] = []
        last = self.sh.timers.last_leader_heartbeat_ms
        if last is None or now_ms - last > self.sh.config.heartbeat_timeout_ms:
            st = self.sh.state
            self.sh.log(
                INFO,
                "HeartBeatTimeOut",
                last_leader_heartbeat=last,
                interval=self.sh.config.heartbeat_interval_ms,
                last_leader=st.leader_id,
            )
            actions.extend(self.roles.change_role_to_candidate(st.current_term, now_ms))
        return actions

    def handle(self, req: HeartbeatRequest, now_ms: int) -> tuple[HeartbeatResponse, list[Action]]:
        """DLedger's handleHeartBeat (plus DLedgerServer's receiver and group checks)."""
        st = self.sh.state
        C = ResponseCode
        if req.remote_id != st.self_id:
            self.sh.log(WARNING, "HandleHeartBeat", addressed_to=req.remote_id)
            return self._heartbeat_response(req, C.UNKNOWN_MEMBER), []
        if req.group != st.group:
            self.sh.log(WARNING, "HandleHeartBeat", group=req.group, my_group=st.group)
            return self._heartbeat_response(req, C.UNKNOWN_GROUP), []
        if not isinstance(req.leader_id, str) or not req.leader_id:
            self.sh.log(WARNING, "BUG HandleHeartBeat", unknown_member=req.leader_id)
            return self._heartbeat_response(req, C.UNKNOWN_MEMBER), []
        # a leader outside this member's latest configuration is still followed (Raft
        # §4.2.1: requests are processed without consulting the configuration): this
        # member's newest configuration may be an uncommitted one the leader will cut, or
        # this member the one being added
        if req.leader_id == st.self_id:
            self.sh.log(WARNING, "BUG HandleHeartBeat", from_self=req.leader_id)
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
                actions = self.roles.change_role_to_follower(req.term, req.leader_id, now_ms)
                return self._heartbeat_response(req, C.SUCCESS), actions
            if req.leader_id == st.leader_id:
                self.sh.timers.last_leader_heartbeat_ms = now_ms
                return self._heartbeat_response(req, C.SUCCESS), []
            self.sh.log(
                ERROR, "BUG InconsistentLeader", leader=st.leader_id, received=req.leader_id
            )
            return self._heartbeat_response(req, C.INCONSISTENT_LEADER), []
        # A larger term: become a candidate first; the term catches up at the next tick.
        actions = self.roles.change_role_to_candidate(req.term, now_ms)
        self.sh.need_increase_term_immediately = True
        return self._heartbeat_response(req, C.TERM_NOT_READY), actions

    def _heartbeat_response(
        self, req: HeartbeatRequest, code: ResponseCode, term: int | None = None
    ) -> HeartbeatResponse:
        st = self.sh.state
        if code != ResponseCode.SUCCESS:
            self.sh.log(
                INFO,
                "HandleHeartBeat",
                term=req.term,
                leader=req.leader_id,
                my_term=st.current_term,
                my_leader=st.leader_id,
                code=code.name,
            )
        return HeartbeatResponse(
            code,
            st.current_term if term is None else term,
            group=st.group,
            local_id=st.self_id,
            remote_id=req.local_id,
            leader_id=st.leader_id,
        )
