"""The quorum-ack checker's core (sans-I/O: no Ray, no asyncio, no clock).

:class:`QuorumAckChecker` is the commit rule and its waiting appends.  Water marks are kept
per term and member (DLedger ``peerWaterMarksByTerm``); the leader's own end index is its
water mark.  The quorum index is the median of the sorted water marks: the highest index a
majority stores.  Unlike DLedger, the committed index only moves to an index of the
leader's *current* term (Raft section 5.4.2): a leader that could commit an older term's
entry by counting replicas may see it overwritten after it steps down.  The new leader
appends an empty entry when elected (``term_start_index``), so older entries commit as soon
as that one does.  Appends wait in index order; each resolves once, as SUCCESS when the
committed index covers its last entry, WAIT_QUORUM_ACK_TIMEOUT after
``max_wait_ack_time_ms``, or TERM_CHANGED / NOT_LEADER when leadership ends.  A timed-out or
failed append may still commit later: the shell reports such an outcome as unknown, never
as a failure.

:class:`CheckerLogic` is the checker actor's core around it: which rounds wait and which
are stale, which succeed, time out or lose their term, and when the dispatchers hear of a
new committed index.  Like etcd-io/raft's ``RawNode``, with one way in and out,
:meth:`CheckerLogic.step` (an event and the time; it returns the event's answer): a call's
direct answer, as ``Step`` returns its error, and for :class:`TurnEnd` one
:class:`CheckerReady` of what to tell the leader, what to tell the dispatchers and when to
run again.  The checker persists
nothing, so a Ready is taken as it is handed out; there is no separate ``Advance``.  The
driver that runs it on a loop is :class:`~rayledger.actors.core.pump.CheckerDriver`; the
Ray actor is :mod:`rayledger.actors.checker`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from logging import DEBUG, INFO, WARNING
from typing import Any

from rayledger.election.logevent import log_event
from rayledger.storage.errors import ResponseCode

from .config import ReplicationConfig
from .messages import GraphBegin, GraphEnd, TurnEnd

log = logging.getLogger("rayledger.replication")


@dataclass
class Resolved:
    """How one waiting append ended; the shell turns it into an AppendResult or a LedgerError."""

    token: Any
    code: ResponseCode
    first_index: int
    last_index: int
    term: int


@dataclass(frozen=True, slots=True)
class LeadTerm:
    """Start leading ``term`` (its first entry at ``term_start_index``, the leader's log
    ending at ``leader_end_index``); answers the waiting appends of older terms, failed."""

    term: int
    term_start_index: int
    leader_end_index: int
    committed_index: int = -1


@dataclass(frozen=True, slots=True)
class EndTerm:
    """Leadership of ``term`` ended; answers every waiting append, failed."""

    term: int


@dataclass(frozen=True, slots=True)
class MarkStored:
    """``peer`` stores the leader's log of ``term`` up to ``index``."""

    term: int
    peer: str
    index: int


@dataclass(frozen=True, slots=True)
class AwaitQuorum:
    """Entries ``first_index..last_index`` of ``term`` wait for the quorum (``token`` names
    them); answers False when written in a term this checker does not lead."""

    term: int
    first_index: int
    last_index: int
    token: Any


@dataclass(frozen=True, slots=True)
class CountVoters:
    """The majority is of ``voters`` from now on (``learners`` keep a water mark)."""

    voters: tuple
    learners: tuple = ()


@dataclass(frozen=True, slots=True)
class CheckQuorum:
    """Commit what a quorum stores; answers (the new committed index or None, the appends
    resolved now in index order)."""


QuorumEvent = LeadTerm | EndTerm | MarkStored | AwaitQuorum | CountVoters | CheckQuorum


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

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: QuorumEvent, now_ms: int) -> Any:
        """Deliver one event at ``now_ms``; returns its direct answer (see each event)."""
        match ev:
            case MarkStored():
                return self._update_water_mark(ev.term, ev.peer, ev.index)
            case CheckQuorum():
                return self._check(now_ms)
            case AwaitQuorum():
                return self._add_pending(ev.term, ev.first_index, ev.last_index, ev.token, now_ms)
            case LeadTerm():
                return self._become_leader(
                    ev.term, ev.term_start_index, ev.leader_end_index, ev.committed_index
                )
            case EndTerm():
                return self._step_down(ev.term)
            case CountVoters():
                return self._set_configuration(list(ev.voters), list(ev.learners))
        raise TypeError(f"not a quorum event: {ev!r}")

    # -- leadership ---------------------------------------------------------------------
    def _become_leader(
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

    def _step_down(self, term: int) -> list[Resolved]:
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
    def _update_water_mark(self, term: int, peer: str, index: int) -> None:
        """``peer`` stores the leader's log up to ``index`` (stale terms are ignored)."""
        if term != self.term:
            return
        marks = self._water_marks.get(term)
        if marks is None or peer not in marks:
            return
        if index > marks[peer]:
            marks[peer] = index

    def _add_pending(
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

    def _set_configuration(self, voters: list[str], learners: list[str] = ()) -> None:
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

    def _check(self, now_ms: int) -> tuple[int | None, list[Resolved]]:
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


COMMIT_NOTICE_MS = 5
"""How long the committed index stands still before the dispatchers hear of it -- only when
one of them was not told it in a report's answer (its follower is slow or down, or the
leader's own flush made the quorum).  Under load every announcement and report answer
carries it, and after a round each follower's report is answered with its commit, so in a
steady group the notice is never sent, and its timer is dropped once every dispatcher was
told."""

Outcome = tuple[Any, ResponseCode]  # (a round's token, how it ended)


# ====================================================================== events in


@dataclass(frozen=True, slots=True)
class BecomeLeader:
    """Serve ``term`` from the leader's :class:`~.member_logic.LeaderInfo`; answers the outcomes
    of what waited for an older term."""

    term: int
    term_start_index: int
    info: Any


@dataclass(frozen=True, slots=True)
class LeadershipEnded:
    """Leadership of ``term`` ended; answers the outcomes of everything waiting."""

    term: int


@dataclass(frozen=True, slots=True)
class AddRound:
    """A round of ``term`` waits for its quorum; ``leader_mark`` is how far the leader
    counts its own copy (:meth:`~.member_logic.MemberLogic.water_mark`)."""

    term: int
    first: int
    last: int
    token: Any
    leader_mark: int
    # ``(index, Configuration)`` when the round holds the leader's latest configuration
    # entry: the checker counts its voters from the round's registration on, in order with
    # the round, instead of when the leader's role lock lets a Configure through
    config: tuple | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """A follower stores the leader's log of ``term`` up to ``water_mark``; answers the
    committed index of ``term`` (None: not served here, the reporter learns nothing)."""

    term: int
    peer: str
    water_mark: int


@dataclass(frozen=True, slots=True)
class ReportAnswer:
    """What a report of ``peer`` is answered with, asked after its check: the committed
    index (that dispatcher then needs no commit notice of it)."""

    peer: str


@dataclass(frozen=True, slots=True)
class GraphReport:
    """A follower's water mark and the rounds of its execution, from the graph: ``(gen,
    term, peer, water mark, rounds)``; answers ``(term, committed, outcomes)`` (None: not
    this checker's graph or term)."""

    ack: tuple


@dataclass(frozen=True, slots=True)
class Configure:
    """The leader of ``term`` acts on a new configuration (``info.configs``): the
    majority is of its voters from now on."""

    term: int
    info: Any


CheckerEvent = (
    BecomeLeader
    | LeadershipEnded
    | AddRound
    | Report
    | ReportAnswer
    | TurnEnd
    | GraphBegin
    | GraphEnd
    | GraphReport
    | Configure
)


@dataclass(frozen=True, slots=True)
class Resolution:
    """For the leader (``MemberActor.on_resolved``): the new committed index of ``term``
    (None: unchanged) and the rounds that ended."""

    term: int
    committed: int | None
    outcomes: list[Outcome]
    # the index of the configuration entry whose voters the checker counts (-1: not said):
    # the leader admits its next change only once its checker counts the latest
    config_index: int = -1


@dataclass(frozen=True, slots=True)
class CheckerReady:
    resolution: Resolution | None
    notice: tuple[int, int] | None  # (term, committed index) for every dispatcher
    committed_index: int  # of the term served (what a report is answered with)
    wake_at_ms: int | None


class CheckerLogic:
    """The leader's QuorumAckChecker, the rounds waiting for it (by token), the commit
    notice and the compiled graph it serves."""

    def __init__(self, group: str, self_id: str, peers: Sequence[str], config: ReplicationConfig):
        self.self_id = self_id
        self.core = QuorumAckChecker(group, self_id, list(peers), config)
        self.term = -1  # the term served (-1: none)
        self._registered: set[Any] = set()
        self._committed_sent = -1
        self._notice: tuple[int, int] | None = None
        self._notice_at = 0
        self._told_at: dict[str, int] = {}  # the committed index each peer's report was answered
        self.graph_gen: int | None = None
        self.config_index = -1  # the configuration entry whose voters it counts

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: CheckerEvent, now_ms: int) -> Any:
        """Deliver one event; returns the call's direct answer (see each event)."""
        match ev:
            case AddRound():
                if ev.config is not None and ev.term == self.term:
                    self._count(*ev.config, now_ms)
                return self._add_round(ev.term, ev.first, ev.last, ev.token, now_ms,
                                       ev.leader_mark)  # fmt: skip
            case Report():
                return self._report(ev.term, ev.peer, ev.water_mark, now_ms)
            case ReportAnswer():
                return self._told(ev.peer)
            case TurnEnd():
                return self._ready(now_ms)
            case GraphReport():
                return self._graph_report(ev.ack, now_ms)
            case BecomeLeader():
                return self._become_leader(ev.term, ev.term_start_index, ev.info, now_ms)
            case Configure():
                return self._configure(ev.term, ev.info, now_ms)
            case LeadershipEnded():
                return self._step_down(ev.term, now_ms)
            case GraphBegin():
                return self._graph_begin(ev.term, ev.gen)
            case GraphEnd():
                return self._graph_end(ev.gen)
        raise TypeError(f"not a checker event: {ev!r}")

    # -- its cases ---------------------------------------------------------------------------
    def _become_leader(
        self, term: int, term_start_index: int, info: Any, now_ms: int
    ) -> list[Outcome]:
        """Serve ``term`` (``info``: the leader's LeaderInfo); what waited for an older term
        fails."""
        self.term = term
        self._registered.clear()
        self._committed_sent = -1
        self._told_at.clear()
        self.config_index = -1
        failed = self.core.step(
            LeadTerm(term, term_start_index, info.water_mark, info.committed), now_ms
        )
        self._configure(term, info, now_ms)
        return _outcomes(failed)

    def _configure(self, term: int, info: Any, now_ms: int) -> bool:
        """The leader's latest configuration (from its LeaderInfo); False when this checker
        does not serve ``term``."""
        configs = getattr(info, "configs", ())
        if term != self.term or not configs:
            return False
        self._count(*configs[-1], now_ms)
        return True

    def _count(self, index: int, config: Any, now_ms: int) -> None:
        """Count the voters of the configuration entry at ``index`` -- unless it counts a
        later one already: a Configure delayed behind a round that carried a newer
        configuration must not take the checker back."""
        if index < self.config_index:
            return
        self.config_index = index
        self.core.step(CountVoters(tuple(config.voters), tuple(config.learners)), now_ms)

    def _step_down(self, term: int, now_ms: int) -> list[Outcome]:
        """Leadership of ``term`` ended: everything waiting is answered to the caller."""
        self.graph_gen = None
        if term < self.term:
            return []
        self.term = -1
        self._registered.clear()
        return _outcomes(self.core.step(EndTerm(term), now_ms))

    def _add_round(
        self, term: int, first: int, last: int, token: Any, now_ms: int, leader_mark: int
    ) -> None:
        """A round of ``term`` waits for its quorum (registering one twice is harmless);
        ``leader_mark`` is the leader's :meth:`MemberLogic.water_mark` when it registered
        the round (with sync_flush it may stand below the round: not flushed yet).  A round
        of another term is answered by the next Ready."""
        self.core.step(MarkStored(term, self.self_id, leader_mark), now_ms)
        if token in self._registered:
            return
        if self.core.step(AwaitQuorum(term, first, last, token), now_ms):
            self._registered.add(token)

    def _report(self, term: int, peer: str, water_mark: int, now_ms: int) -> bool:
        """A follower stores the leader's log of ``term`` up to ``water_mark``; False when
        this checker does not serve ``term`` (the reporter gets no committed index)."""
        if term != self.term:
            return False
        self.core.step(MarkStored(term, peer, water_mark), now_ms)
        return True

    def _told(self, peer: str) -> int:
        """The committed index a report of ``peer`` is answered with (after its check): its
        dispatcher needs no notice of it."""
        committed = self.core.committed_index
        if committed > self._told_at.get(peer, -1):
            self._told_at[peer] = committed
        return committed

    def _untold(self, committed: int) -> bool:
        """Whether a dispatcher was not told ``committed`` in a report's answer."""
        told = self._told_at
        return any(told.get(p, -1) < committed for p in self.core.peers if p != self.self_id)

    def _graph_begin(self, term: int, gen: int) -> bool:
        if term != self.term:
            return False
        self.graph_gen = gen
        return True

    def _graph_end(self, gen: int) -> None:
        if self.graph_gen == gen:
            self.graph_gen = None

    def _graph_report(self, ack: tuple, now_ms: int) -> tuple | None:
        """A follower's water mark and the rounds of its execution, from the graph
        (None: not this checker's graph or term); answers ``(term, committed, outcomes)``."""
        gen, term, peer, wm, rounds = ack
        if gen != self.graph_gen or term != self.term:
            return None
        for first, last, token in rounds:  # a graph runs only without sync_flush:
            self._add_round(term, first, last, token, now_ms, last)  # written counts
        if wm >= 0:
            self.core.step(MarkStored(term, peer, wm), now_ms)
        committed, outcomes = self._check(now_ms)
        return term, committed, outcomes

    # -- the way out -----------------------------------------------------------------------
    def _check(self, now_ms: int) -> tuple[int | None, list[Outcome]]:
        """Commit what a quorum stores; the index is new only once per rise."""
        committed, resolved = self.core.step(CheckQuorum(), now_ms)
        for r in resolved:
            self._registered.discard(r.token)
        if committed is not None and committed > self._committed_sent:
            self._committed_sent = committed
            self._notice = (self.term, committed)
            self._notice_at = now_ms + COMMIT_NOTICE_MS
        else:
            committed = None
        return committed, _outcomes(resolved)

    def _ready(self, now_ms: int) -> CheckerReady:
        resolution = None
        wake = None
        if self.term >= 0:
            committed, outcomes = self._check(now_ms)
            if committed is not None or outcomes:
                resolution = Resolution(self.term, committed, outcomes, self.config_index)
            wake = self.core.next_deadline_ms()
        notice = None
        if self._notice is not None and not self._untold(self._notice[1]):
            self._notice = None  # every report's answer told it: no notice, no timer
        if self._notice is not None:
            if now_ms >= self._notice_at:
                notice, self._notice = self._notice, None
            elif wake is None or self._notice_at < wake:
                wake = self._notice_at
        return CheckerReady(resolution, notice, self.core.committed_index, wake)

    @property
    def committed_index(self) -> int:
        return self.core.committed_index


def _outcomes(resolved: list[Resolved]) -> list[Outcome]:
    return [(r.token, r.code) for r in resolved]
