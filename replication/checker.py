"""QuorumAckChecker: the leader's commit rule and its waiting appends (sans-I/O).

Water marks are kept per term and member (DLedger ``peerWaterMarksByTerm``); the
leader's own end index is its water mark.  The quorum index is the median of the
sorted water marks: the highest index a majority stores.  Unlike DLedger, the
committed index only moves to an index of the leader's *current* term (Raft
section 5.4.2): a leader that could commit an older term's entry by counting
replicas may see it overwritten after it steps down.  The new leader appends an
empty entry when elected (``term_start_index``), so older entries commit as soon
as that one does.

Appends wait in index order; each resolves once, as SUCCESS when the committed
index covers its last entry, WAIT_QUORUM_ACK_TIMEOUT after
``max_wait_ack_time_ms``, or TERM_CHANGED / NOT_LEADER when leadership ends.
A timed-out or failed append may still commit later: the shell reports such an
outcome as unknown, never as a failure.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from logging import DEBUG, INFO, WARNING
from typing import Any

from rayledger.election.logevent import log_event
from rayledger.storage.errors import ResponseCode

from .config import ReplicationConfig

log = logging.getLogger("rayledger.replication")


@dataclass
class Resolved:
    """How one waiting append ended; the shell turns it into an AppendResult or a LedgerError."""

    token: Any
    code: ResponseCode
    first_index: int
    last_index: int
    term: int


class QuorumAckChecker:
    """Leader side: computes the committed index and resolves waiting appends."""

    def __init__(self, group: str, self_id: str, peers: list[str], config: ReplicationConfig):
        self.group = group
        self.self_id = self_id
        self.peers = list(peers) if self_id in peers else [self_id, *peers]
        self.config = config
        self.term = -1
        self.is_leader = False
        self.committed_index = -1
        self.term_start_index = -1
        self.voters = list(self.peers)  # whose water marks make a majority
        self._water_marks: dict[int, dict[str, int]] = {}
        # (first, last, token, deadline) in index order
        self._pending: deque[tuple[int, int, Any, int]] = deque()
        self._stale: list[Resolved] = []

    @property
    def pending_count(self) -> int:
        return len(self._pending) + len(self._stale)

    def water_marks(self, term: int | None = None) -> dict[str, int]:
        return dict(self._water_marks.get(self.term if term is None else term, {}))

    def __repr__(self) -> str:
        return (
            f"QuorumAckChecker({self.self_id} term={self.term} leader={self.is_leader} "
            f"committed={self.committed_index} pending={len(self._pending)} wm={self.water_marks()})"
        )

    def _event(self, level: int, event: str, index: int | None, **fields: Any) -> None:
        """One protocol log line: our id, the term we lead, the index, then our commit."""
        if log.isEnabledFor(level):
            ids = {"member": self.self_id, "term": self.term, "index": index}
            log_event(log, level, event, **ids, **fields, committed=self.committed_index)

    # -- leadership ---------------------------------------------------------------------
    def become_leader(
        self, term: int, term_start_index: int, leader_end_index: int, committed_index: int = -1
    ) -> list[Resolved]:
        """Start leading ``term``; older terms' appends fail and their water marks go."""
        failed = self._fail_all(ResponseCode.TERM_CHANGED, f"leader of term {term}")
        self.term = term
        self.is_leader = True
        self.term_start_index = term_start_index
        self.committed_index = committed_index
        self._water_marks = {term: {p: -1 for p in self.peers}}
        self._water_marks[term][self.self_id] = leader_end_index
        self._event(INFO, "checker.lead", term_start_index, end=leader_end_index)
        return failed

    def step_down(self, term: int) -> list[Resolved]:
        """Leadership ended: every waiting append fails (TERM_CHANGED when the term moved on),
        and so does every stale one not yet answered."""
        code = ResponseCode.TERM_CHANGED if term != self.term else ResponseCode.NOT_LEADER
        failed = self._stale + self._fail_all(code, f"stepped down at term {term}")
        self._stale = []
        self.is_leader = False
        self._water_marks.clear()
        return failed

    def _fail_all(self, code: ResponseCode, why: str) -> list[Resolved]:
        if not self._pending:
            return []
        out = [Resolved(tok, code, first, last, self.term) for first, last, tok, _ in self._pending]
        first, last = out[0].first_index, out[-1].last_index
        self._event(INFO, "checker.fail", first, last=last, code=code.name, why=why)
        self._pending.clear()
        return out

    # -- progress --------------------------------------------------------------------------
    def update_water_mark(self, term: int, peer: str, index: int) -> None:
        """``peer`` stores the leader's log up to ``index`` (stale terms are ignored)."""
        if term != self.term:
            return
        marks = self._water_marks.get(term)
        if marks is None or peer not in marks:
            return
        if index > marks[peer]:
            marks[peer] = index

    def add_pending(
        self, term: int, first_index: int, last_index: int, token: Any, now_ms: int
    ) -> bool:
        """An append of entries ``first_index..last_index`` waits for the quorum (True), or
        was written in a term this checker does not lead (False): it is answered by the next
        check, TERM_CHANGED or (the same term, leadership ended) NOT_LEADER -- an unknown
        outcome for its caller, never a plain failure.  The one place this is decided."""
        if term != self.term or not self.is_leader:
            code = ResponseCode.TERM_CHANGED if term != self.term else ResponseCode.NOT_LEADER
            self._stale.append(Resolved(token, code, first_index, last_index, term))
            return False
        item = (first_index, last_index, token, now_ms + self.config.max_wait_ack_time_ms)
        pending = self._pending
        if pending and first_index < pending[-1][0]:
            k = len(pending)
            while k and pending[k - 1][0] > first_index:
                k -= 1
            pending.insert(k, item)  # the shell delivered appends out of order: keep index order
        else:
            pending.append(item)
        return True

    def next_deadline_ms(self) -> int | None:
        """When the oldest waiting append times out (None when nothing waits)."""
        if self._stale:
            return 0
        return self._pending[0][3] if self._pending else None

    def set_configuration(self, voters: list[str], learners: list[str] = ()) -> None:
        """The leader acts on a new configuration (appended, committed or not): the
        majority is of ``voters`` from now on; members added get a water mark of -1 (until
        their dispatcher reports), members gone lose theirs."""
        self.voters = list(voters)
        self.peers = [*voters, *learners]
        marks = self._water_marks.get(self.term)
        if marks is not None:
            for p in self.peers:
                marks.setdefault(p, -1)
            for p in [p for p in marks if p not in self.peers and p != self.self_id]:
                del marks[p]

    def quorum_index(self) -> int:
        """The highest index a majority of the voters stores (in ascending order, the
        mark at ``(voters - 1) // 2``)."""
        marks = self._water_marks.get(self.term)
        if not marks:
            return -1
        values = sorted(marks.get(v, -1) for v in self.voters)
        return values[(len(values) - 1) // 2]

    def check(self, now_ms: int) -> tuple[int | None, list[Resolved]]:
        """(the new committed index or None, appends resolved now in index order)."""
        resolved: list[Resolved] = self._stale
        self._stale = []
        if not self.is_leader:
            return None, resolved
        new_committed = None
        quorum = self.quorum_index()
        if quorum > self.committed_index and quorum >= self.term_start_index >= 0:
            self.committed_index = quorum
            new_committed = quorum
            self._event(DEBUG, "checker.commit", quorum)
        pending = self._pending
        committed = self.committed_index
        term = self.term
        while pending and pending[0][1] <= committed:
            first, last, tok, _ = pending.popleft()
            resolved.append(Resolved(tok, ResponseCode.SUCCESS, first, last, term))
        while pending and pending[0][3] <= now_ms:
            first, last, tok, _ = pending.popleft()
            marks = self._water_marks.get(term)
            self._event(WARNING, "checker.ack_timeout", first, last=last, marks=marks)
            resolved.append(Resolved(tok, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, first, last, term))
        return new_committed, resolved
