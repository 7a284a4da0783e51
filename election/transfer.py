"""Leadership transfer: the leader's side (DLedger's ``handleLeadershipTransfer``, waiting
for the transferee to catch up, the preferred-leader check) and the transferee's
take-leadership (``TakeLeadershipTask``)."""

from __future__ import annotations

from logging import INFO, WARNING

from rayledger.storage.errors import ResponseCode

from .messages import (
    Action,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    Role,
    Send,
    TransferOutcome,
)
from .parts import ElectorShared, PendingTake, Roles, RunningTransfer


class LeadershipTransfer:
    """Handing leadership on, and taking it when told to; a part of
    :class:`~rayledger.election.elector.Elector`."""

    def __init__(self, sh: ElectorShared, roles: Roles) -> None:
        self.sh = sh
        self.roles = roles
        self.running: RunningTransfer | None = None  # the transfer this leader runs
        self.pending_take: PendingTake | None = None  # an order waiting for our log
        self.taking_from: LeadershipTransferRequest | None = None  # the order we act on
        # The term in which this leader sent a take-leadership order: its transferee skips
        # pre-vote, so no lease is trusted for the rest of that term (see lease_allowed).
        self.take_order_term = -1

    def transfer_leadership(
        self, transferee_id: str, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        """Ask this member (the leader) to hand leadership of its term to ``transferee_id``."""
        st = self.sh.state
        req = LeadershipTransferRequest(
            group=st.group,
            local_id=st.self_id,
            remote_id=st.self_id,
            term=st.current_term,
            transfer_id=st.self_id,
            transferee_id=transferee_id,
            leader_id=st.leader_id,
        )
        return self.handle(req, now_ms)

    def hand_over(self, transferee_id: str, now_ms: int) -> tuple[ResponseCode, list[Action]]:
        """Leave leadership of this term to ``transferee_id`` because this leader cannot
        serve it (its helpers are lost or hung): a transfer that, if it cannot start or is
        given up, ends in :meth:`Elector.step_down` instead of leaving the leader in office
        (a leader that cannot replicate holds its term forever with heartbeats alone)."""
        resp, actions = self.transfer_leadership(transferee_id, now_ms)
        transfer = self.running
        if resp.code is ResponseCode.SUCCESS and transfer is not None:
            transfer.must_leave = True
            return resp.code, actions
        self.sh.log(WARNING, "HandOverNotStarted", transferee=transferee_id, code=resp.code.name)
        return resp.code, actions + self.roles.step_down(now_ms)

    def handle(
        self, req: LeadershipTransferRequest, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        """On the leader: start a transfer.  On the transferee: take leadership."""
        st = self.sh.state
        C = ResponseCode
        self.sh.log(
            INFO,
            "HandleLeadershipTransfer",
            term=req.term,
            index=req.take_leadership_ledger_index,
            transfer=req.transfer_id,
            transferee=req.transferee_id,
            my_term=st.current_term,
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
        st = self.sh.state
        if code != ResponseCode.SUCCESS:
            self.sh.log(
                INFO, "TransferRefused", term=req.term, transferee=req.transferee_id, code=code.name
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
        st = self.sh.state
        C = ResponseCode
        if not st.is_peer_member(req.transferee_id):
            return self._transfer_response(req, C.UNKNOWN_MEMBER), []
        if not st.is_voter(req.transferee_id):  # a learner cannot lead
            return self._transfer_response(req, C.ILLEGAL_MEMBER_STATE), []
        if st.current_term != req.term:
            return self._transfer_response(req, C.INCONSISTENT_TERM), []
        if st.role is not Role.LEADER:
            return self._transfer_response(req, C.NOT_LEADER), []
        if req.transferee_id == st.self_id:
            return self._transfer_response(req, C.SUCCESS), []  # already leading
        if st.transferee is not None:
            return self._transfer_response(req, C.LEADER_TRANSFERRING), []
        st.set_transferee(req.transferee_id)
        self.running = RunningTransfer(
            transferee=req.transferee_id,
            term=st.current_term,
            started_ms=now_ms,
            deadline_ms=now_ms + self.sh.config.leadership_transfer_wait_timeout_ms,
        )
        self.sh.log(
            INFO,
            "StartTransfer",
            index=st.ledger_end_index,
            transferee=req.transferee_id,
            peer_match=self.sh.timers.peer_match_index.get(req.transferee_id, -1),
        )
        return self._transfer_response(req, C.SUCCESS), self.progress(now_ms)

    def _abandon_transfer(self, code: ResponseCode, why: str, now_ms: int) -> list[Action]:
        transfer = self.running
        if transfer is None:
            return []
        self.running = None
        if self.sh.state.transferee == transfer.transferee:
            self.sh.state.set_transferee(None)
        out: list[Action] = [self.ended(transfer, code, WARNING, "TransferAbandoned", why=why)]
        if transfer.must_leave:  # a failed hand-over: the leader cannot serve its term
            out += self.roles.step_down(now_ms)
        return out

    def ended(
        self, transfer: RunningTransfer, code: ResponseCode, level: int, event: str, **fields
    ) -> TransferOutcome:
        """Log how a transfer ended; its outcome, for the caller who asked for it."""
        self.sh.log(level, event, term=transfer.term, transferee=transfer.transferee,
                  code=code.name, **fields)  # fmt: skip
        return TransferOutcome(transfer.term, transfer.transferee, code)

    def progress(self, now_ms: int) -> list[Action]:
        transfer = self.running
        st = self.sh.state
        if transfer is None:
            return []
        if st.role is not Role.LEADER or st.current_term != transfer.term:
            return self._abandon_transfer(
                ResponseCode.TAKE_LEADERSHIP_FAILED, "no longer leader", now_ms
            )
        if now_ms > transfer.deadline_ms:
            return self._abandon_transfer(ResponseCode.TIMEOUT, "wait timeout", now_ms)
        if transfer.take_sent:
            return []
        match = self.sh.timers.peer_match_index.get(transfer.transferee, -1)
        fall_behind = st.ledger_end_index - match
        if fall_behind >= self.sh.config.max_leadership_transfer_wait_index:
            return []
        transfer.take_sent = True
        self.take_order_term = transfer.term  # no lease for the rest of this term
        self.sh.log(
            INFO,
            "TellTakeLeadership",
            term=transfer.term,
            index=st.ledger_end_index,
            transferee=transfer.transferee,
            fall_behind=fall_behind,
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

    def on_response(
        self,
        peer: str,
        req: LeadershipTransferRequest,
        resp: LeadershipTransferResponse | None,
        now_ms: int,
    ) -> list[Action]:
        """The transferee's answer to take-leadership; a refusal ends the transfer."""
        transfer = self.running
        if transfer is None or peer != transfer.transferee or req.term != transfer.term:
            return []
        if resp is None:
            return self._abandon_transfer(
                ResponseCode.TAKE_LEADERSHIP_FAILED, "transferee unreachable", now_ms
            )
        if resp.code != ResponseCode.SUCCESS:
            return self._abandon_transfer(ResponseCode(resp.code), "transferee refused", now_ms)
        return []  # it is voting; we step down when its term reaches us, or time out

    def on_peer_progress(self, peer: str, term: int, match_index: int, now_ms: int) -> list[Action]:
        """The shell reports a follower's match index (its replication water mark), as a
        dispatcher of ``term`` learned it.  A report of another term is dropped: an old
        term's water mark must not refill ``peer_match_index`` after an election, or a take
        order could go to a transferee that lags."""
        st = self.sh.state
        if term != st.current_term or st.role is not Role.LEADER:
            return []
        timers = self.sh.timers
        if match_index > timers.peer_match_index.get(peer, -1):
            timers.peer_match_index[peer] = match_index
        if self.running is not None and self.running.transferee == peer:
            return self.progress(now_ms)
        return []

    def check_preferred_leader(self, now_ms: int) -> list[Action]:
        """DLedgerServer.checkPreferredLeader: hand over to the least-behind live preferred peer."""
        st = self.sh.state
        preferred = self.sh.config.preferred_leader_ids
        if st.role is not Role.LEADER or not preferred or st.transferee is not None:
            return []
        if st.self_id in preferred:
            return []
        live = self.sh.timers.peers_live
        match = self.sh.timers.peer_match_index
        best: str | None = None
        best_behind = 0
        for peer in preferred:
            if not st.is_voter(peer):
                self.sh.log(WARNING, "PreferredNotAPeer", preferred=peer)
                continue
            if not live.get(peer, False):
                continue
            behind = st.ledger_end_index - match.get(peer, -1)
            if best is None or behind < best_behind:
                best, best_behind = peer, behind
        if best is None or best_behind >= self.sh.config.max_leadership_transfer_wait_index:
            return []
        self.sh.log(INFO, "PreferredTransferee", transferee=best, fall_behind=best_behind)
        resp, actions = self.transfer_leadership(best, now_ms)
        return actions

    def _take_leadership(
        self, req: LeadershipTransferRequest, now_ms: int
    ) -> tuple[LeadershipTransferResponse, list[Action]]:
        st = self.sh.state
        C = ResponseCode
        taking = self.taking_from
        if (
            taking is not None
            and taking.term == req.term
            and taking.transfer_id == req.transfer_id
            and st.term_to_take_leadership == req.term + 1
        ):
            return self._transfer_response(req, C.SUCCESS), []  # a repeated order
        pending = self.pending_take
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
        wait = req.wait_timeout_ms or self.sh.config.leadership_transfer_wait_timeout_ms
        self.pending_take = PendingTake(req, now_ms + wait)
        self.sh.log(
            INFO,
            "TakeLeadershipWaits",
            term=req.term,
            index=st.ledger_end_index,
            wait_for=req.take_leadership_ledger_index,
        )
        return self._transfer_response(req, C.SUCCESS), []

    def check_pending_take(self, now_ms: int) -> list[Action]:
        pending = self.pending_take
        st = self.sh.state
        if pending is None:
            return []
        req = pending.request
        if (
            st.current_term != req.term
            or st.leader_id != req.transfer_id
            or st.role is not Role.FOLLOWER
        ):
            self.pending_take = None
            return []
        if st.ledger_end_index >= req.take_leadership_ledger_index:
            self.pending_take = None
            return self._begin_take_leadership(req, now_ms)
        if now_ms > pending.deadline_ms:
            self.pending_take = None
            self.sh.log(
                WARNING,
                "TransfereeFallBehind",
                index=st.ledger_end_index,
                wait_for=req.take_leadership_ledger_index,
                code="TAKE_LEADERSHIP_FAILED",
            )
        return []

    def _begin_take_leadership(self, req: LeadershipTransferRequest, now_ms: int) -> list[Action]:
        """DLedger's handleTakeLeadership: vote at once for term + 1."""
        st = self.sh.state
        target = req.term + 1
        st.term_to_take_leadership = target
        self.taking_from = req
        self.sh.log(INFO, "TakeLeadershipVoteNow", term=target)
        actions = self.roles.change_role_to_candidate(target, now_ms)
        self.sh.need_increase_term_immediately = True
        return actions

    def check_take_leadership(self, term: int, role: Role) -> None:
        """DLedger's TakeLeadershipTask.check: end the take-leadership attempt when decided."""
        st = self.sh.state
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
        self.sh.log(
            INFO,
            "TakeLeadershipFinished",
            term=term,
            role=role.value,
            target=target,
            outcome=outcome.name,
        )
        st.term_to_take_leadership = -1
        self.taking_from = None
