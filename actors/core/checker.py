"""The quorum-ack checker's core and its driver (sans-I/O: no Ray, no asyncio, no clock).

:class:`CheckerLogic` decides: which rounds wait for their quorum and which are stale,
the committed index (the commit rule of :class:`~rayledger.replication.QuorumAckChecker`),
which rounds succeed, time out or lose their term, and when the dispatchers hear of a new
committed index.  Its way out is :meth:`CheckerLogic.ready`: one :class:`CheckerReady` of
what to tell the leader, what to tell the dispatchers and when to run again.

:class:`CheckerDriver` carries a :class:`~.pump.Loop`'s events into the core and its
Ready out through :class:`CheckerPorts`; the Ray actor (:mod:`rayledger.actors.checker`) and the
simulation differ only in the loop and the ports they give it.

Like etcd-io/raft's ``RawNode``: one way in, :meth:`CheckerLogic.step` (an event and the
time; it returns the call's direct answer, as ``Step`` returns its error), and one way out,
:meth:`CheckerLogic.ready`.  The checker persists nothing, so a Ready is taken as it is
handed out (``RawNode.Ready`` accepts it at once); there is no separate ``Advance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rayledger.actors.core.graph_events import GraphBegin, GraphEnd
from rayledger.actors.core.pump import Driver
from rayledger.replication import QuorumAckChecker, ReplicationConfig, Resolved
from rayledger.storage import ResponseCode

COMMIT_NOTICE_MS = 5
"""How long the committed index stands still before the dispatchers hear of it -- only when
one of them was not told it in a report's answer (its follower is slow or down, or the
leader's own flush made the quorum).  Under load every announcement and report answer
carries it, and after a round each follower's report is answered with its commit, so in a
steady group the notice is never sent."""

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
        self._told: dict[str, int] = {}  # the committed index each peer's report was answered
        self.graph_gen: int | None = None
        self.config_index = -1  # the configuration entry whose voters it counts

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: CheckerEvent, now_ms: int) -> Any:
        """Deliver one event; returns the call's direct answer (see each event)."""
        match ev:
            case AddRound():
                if ev.config is not None and ev.term == self.term:
                    self._count(*ev.config)
                return self._add_round(ev.term, ev.first, ev.last, ev.token, now_ms,
                                       ev.leader_mark)  # fmt: skip
            case Report():
                return self._report(ev.term, ev.peer, ev.water_mark)
            case GraphReport():
                return self._graph_report(ev.ack, now_ms)
            case BecomeLeader():
                return self._become_leader(ev.term, ev.term_start_index, ev.info)
            case Configure():
                return self._configure(ev.term, ev.info)
            case LeadershipEnded():
                return self._step_down(ev.term)
            case GraphBegin():
                return self._graph_begin(ev.term, ev.gen)
            case GraphEnd():
                return self._graph_end(ev.gen)
        raise TypeError(f"not a checker event: {ev!r}")

    # -- its cases ---------------------------------------------------------------------------
    def _become_leader(self, term: int, term_start_index: int, info: Any) -> list[Outcome]:
        """Serve ``term`` (``info``: the leader's LeaderInfo); what waited for an older term
        fails."""
        self.term = term
        self._registered.clear()
        self._committed_sent = -1
        self._told.clear()
        self.config_index = -1
        failed = self.core.become_leader(term, term_start_index, info.water_mark, info.committed)
        self._configure(term, info)
        return _outcomes(failed)

    def _configure(self, term: int, info: Any) -> bool:
        """The leader's latest configuration (from its LeaderInfo); False when this checker
        does not serve ``term``."""
        configs = getattr(info, "configs", ())
        if term != self.term or not configs:
            return False
        self._count(*configs[-1])
        return True

    def _count(self, index: int, config: Any) -> None:
        """Count the voters of the configuration entry at ``index`` -- unless it counts a
        later one already: a Configure delayed behind a round that carried a newer
        configuration must not take the checker back."""
        if index < self.config_index:
            return
        self.config_index = index
        self.core.set_configuration(list(config.voters), list(config.learners))

    def _step_down(self, term: int) -> list[Outcome]:
        """Leadership of ``term`` ended: everything waiting is answered to the caller."""
        self.graph_gen = None
        if term < self.term:
            return []
        self.term = -1
        self._registered.clear()
        return _outcomes(self.core.step_down(term))

    def _add_round(
        self, term: int, first: int, last: int, token: Any, now_ms: int, leader_mark: int
    ) -> None:
        """A round of ``term`` waits for its quorum (registering one twice is harmless);
        ``leader_mark`` is the leader's :meth:`MemberLogic.water_mark` when it registered
        the round (with sync_flush it may stand below the round: not flushed yet).  A round
        of another term is answered by the next :meth:`ready`."""
        self.core.update_water_mark(term, self.self_id, leader_mark)
        if token in self._registered:
            return
        if self.core.add_pending(term, first, last, token, now_ms):
            self._registered.add(token)

    def _report(self, term: int, peer: str, water_mark: int) -> bool:
        """A follower stores the leader's log of ``term`` up to ``water_mark``; False when
        this checker does not serve ``term`` (the reporter gets no committed index)."""
        if term != self.term:
            return False
        self.core.update_water_mark(term, peer, water_mark)
        return True

    def told(self, peer: str) -> int:
        """The committed index a report of ``peer`` is answered with (after its check): its
        dispatcher needs no notice of it."""
        committed = self.core.committed_index
        if committed > self._told.get(peer, -1):
            self._told[peer] = committed
        return committed

    def _untold(self, committed: int) -> bool:
        """Whether a dispatcher was not told ``committed`` in a report's answer."""
        told = self._told
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
            self.core.update_water_mark(term, peer, wm)
        committed, outcomes = self._check(now_ms)
        return term, committed, outcomes

    # -- the way out -----------------------------------------------------------------------
    def _check(self, now_ms: int) -> tuple[int | None, list[Outcome]]:
        """Commit what a quorum stores; the index is new only once per rise."""
        committed, resolved = self.core.check(now_ms)
        for r in resolved:
            self._registered.discard(r.token)
        if committed is not None and committed > self._committed_sent:
            self._committed_sent = committed
            self._notice = (self.term, committed)
            self._notice_at = now_ms + COMMIT_NOTICE_MS
        else:
            committed = None
        return committed, _outcomes(resolved)

    def ready(self, now_ms: int) -> CheckerReady:
        resolution = None
        wake = None
        if self.term >= 0:
            committed, outcomes = self._check(now_ms)
            if committed is not None or outcomes:
                resolution = Resolution(self.term, committed, outcomes, self.config_index)
            wake = self.core.next_deadline_ms()
        notice = None
        if self._notice is not None:
            if now_ms >= self._notice_at:
                notice, self._notice = self._notice, None
                if not self._untold(notice[1]):
                    notice = None
            elif wake is None or self._notice_at < wake:
                wake = self._notice_at
        return CheckerReady(resolution, notice, self.core.committed_index, wake)

    @property
    def committed_index(self) -> int:
        return self.core.committed_index

    def next_deadline_ms(self) -> int | None:
        return self.core.next_deadline_ms()


def _outcomes(resolved: list[Resolved]) -> list[Outcome]:
    return [(r.token, r.code) for r in resolved]


class CheckerPorts(Protocol):
    """Where the checker's messages go: its leader and the leader's dispatchers."""

    def resolved(self, r: Resolution) -> None: ...

    def notice(self, term: int, committed: int) -> None: ...


class CheckerDriver(Driver[CheckerLogic, CheckerPorts]):
    """Delivers events to a :class:`CheckerLogic` and carries its Ready out: one message to
    the leader per loop turn with what changed, a timer for the oldest round's deadline or
    the commit notice, nothing polled.  Graph events come from another thread (the lock)."""

    def _after(self, ev: CheckerEvent, reply: Any) -> Any:
        match ev:
            case AddRound():
                self.pump.kick()  # every round of this loop turn, then one check
            case BecomeLeader() | Configure():
                self.pump.run()
            case Report():
                if not reply:
                    return None  # not this checker's term: no committed index
                self.pump.run()
                return self.logic.told(ev.peer)  # after the report's check
            case GraphReport():
                # on the graph's thread: the answer goes back through the graph, the loop
                # re-arms its timer
                if reply is not None and self.pump.loop is not None:
                    self.pump.loop.call_threadsafe(self.pump.run)
        return reply

    def _run(self, now_ms: int) -> int | None:
        with self.lock:
            r = self.logic.ready(now_ms)
        if r.resolution is not None:
            self.ports.resolved(r.resolution)
        if r.notice is not None:
            self.ports.notice(*r.notice)
        return r.wake_at_ms
