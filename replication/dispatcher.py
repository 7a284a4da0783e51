"""The entry dispatcher's core and its driver (sans-I/O: no Ray, no asyncio, no clock).

:class:`DispatcherLogic` is one leader -> follower pusher: the
:class:`~rayledger.replication.push.EntryDispatcher` protocol core over a :class:`LeaderView`
of the leader's log, plus everything a dispatcher decides around it -- what to fetch
from its member (and when to try again), the single water-mark report in flight to the
checker (it follows the current term), the throttled progress reports to the member's
elector (the last one always gets through), and its part of a compiled graph (the keys
of its pushes, a rewind when the graph is left).  Its one way in and out is
:meth:`DispatcherLogic.step` (an event and the time; it returns the call's direct answer,
and for :class:`~rayledger.replication.messages.TurnEnd` one :class:`DispatcherReady`,
taken as it is handed out: a dispatcher persists nothing, so there is no ``Advance``).

:class:`~rayledger.actors.core.pump.DispatcherDriver` carries a loop's events in and the Ready
out; the Ray actor (:mod:`rayledger.actors.dispatcher`) and the simulation differ only in the
loop and the ports.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rayledger.election.configuration import config_at
from rayledger.storage import LedgerError, ResponseCode

from .config import ReplicationConfig
from .leaderlog import NotCached
from .messages import (
    Announcement,
    GraphBegin,
    GraphEnd,
    Inline,
    LeaderInfo,
    Payload,
    PushEntryRequest,
    PushType,
    TurnEnd,
)
from .push import EntryDispatcher, FollowerAnswer, FreshState, NextPushes, Rewind

PROGRESS_MS = 250
"""How often at most a dispatcher tells its member's elector how far the follower matches
(a leadership transfer waits for it, the preferred-leader check reads it): a call of its
own, so not once a round; a transfer waits at most this much longer for it."""

FETCH_RETRY_MS = 50
"""After a failed fetch from the member, the next try waits this long."""

REPORT_RETRY_MS = 50
"""After a failed report to the checker, the next try waits this long."""

LEARNER_REPORT_MS = 250
"""A learner's water mark goes to the checker at most this often (it counts toward no
commit; the checker must only have it when the learner is promoted)."""


_UNKNOWN = object()


@dataclass(slots=True)
class CachedBatch:
    """A batch the dispatcher may push."""

    first_index: int
    count: int
    payload: Payload
    nbytes: int

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


class LeaderView:
    """The part of the leader's log a dispatcher needs: the batches its leader announced
    (bounded by ``cache_bytes``) and the (term, pos) of entries it learned.  A read of
    anything else raises :class:`~rayledger.replication.NotCached`."""

    def __init__(self, cache_bytes: int):
        self.cache_bytes = cache_bytes
        self.batches: OrderedDict[int, CachedBatch] = OrderedDict()
        self.meta: dict[int, tuple[int, int]] = {}
        self.cached_bytes = 0
        self.ledger_begin_index = 0
        self.ledger_end_index = -1
        self.committed_index = -1
        self.snapshot: Any = _UNKNOWN  # the leader's newest snapshot, fetched per install
        self._configs: tuple = ()  # the leader's configurations (LeaderInfo.configs)
        self._learners: frozenset[str] = frozenset()  # in the latest of them

    def reset(self, info: LeaderInfo) -> None:
        self.batches.clear()
        self.meta.clear()
        self.snapshot = _UNKNOWN
        self.cached_bytes = 0
        self.ledger_begin_index = info.begin
        self.ledger_end_index = info.end
        self.committed_index = info.committed
        self.configs = info.configs
        if info.end >= info.begin:
            self.meta[info.end] = (info.end_term, info.end_pos)

    def learn(self, info: LeaderInfo) -> None:
        """Fold in a fenced answer of the leader (same term by construction)."""
        self.ledger_begin_index = info.begin
        self.ledger_end_index = max(self.ledger_end_index, info.end)
        self.committed_index = max(self.committed_index, info.committed)
        if info.configs:
            self.configs = info.configs

    @property
    def configs(self) -> tuple:
        return self._configs

    @configs.setter
    def configs(self, configs: tuple) -> None:
        """Set when the configurations change, so each push asks a set, not the log."""
        self._configs = configs
        self._learners = frozenset(configs[-1][1].learners) if configs else frozenset()

    def is_learner(self, peer: str) -> bool:
        """Whether ``peer`` is a learner in the leader's latest configuration."""
        return peer in self._learners

    def config_at(self, index: int) -> bytes | None:
        """The leader's configuration in effect at ``index`` (a reset sends it along)."""
        return config_at(self.configs, index).encode() if self.configs else None

    def add(self, batch: CachedBatch) -> None:
        old = self.batches.pop(batch.first_index, None)
        if old is not None:
            self.cached_bytes -= old.nbytes
        self.batches[batch.first_index] = batch
        self.cached_bytes += batch.nbytes
        while self.cached_bytes > self.cache_bytes and len(self.batches) > 1:
            _, old = self.batches.popitem(last=False)
            self.cached_bytes -= old.nbytes

    def prune(self, water_mark: int) -> None:
        while self.batches:
            b = next(iter(self.batches.values()))
            if b.last_index > water_mark:
                break
            self.batches.popitem(last=False)
            self.cached_bytes -= b.nbytes
        if len(self.meta) > 4096:
            self.meta = {k: v for k, v in self.meta.items() if k > water_mark}

    # -- the LeaderLog protocol -------------------------------------------------------------
    def _below_begin(self, index: int) -> None:
        """A read below the leader's begin (its log was compacted past it) fails as the
        store's would, so the core compares again instead of fetching it for ever."""
        if index < self.ledger_begin_index:
            raise LedgerError.of(
                ResponseCode.INDEX_OUT_OF_BOUNDS,
                f"entry {index} is below the leader's begin {self.ledger_begin_index}",
            )

    def get_term(self, index: int) -> int:
        m = self.meta.get(index)
        if m is None:
            self._below_begin(index)
            raise NotCached("meta", index)
        return m[0]

    def get_pos(self, index: int) -> int:
        m = self.meta.get(index)
        if m is None:
            self._below_begin(index)
            raise NotCached("meta", index)
        return m[1]

    def peek_snapshot(self, at_least: int = -1) -> Any:
        if self.snapshot is _UNKNOWN:
            raise NotCached("snapshot", at_least)
        return self.snapshot

    def take_snapshot(self) -> Any:
        snap, self.snapshot = self.snapshot, _UNKNOWN
        return None if snap is _UNKNOWN else snap

    def read_batch(self, start: int, max_bytes: int = 1 << 62, max_count: int = 1 << 62):
        b = self.batches.get(start)
        if b is None or b.count > max_count:
            self._below_begin(start)
            # a resend wants exactly its original range: fetch no more than that, or a
            # larger cached batch would be fetched (and refused) again and again
            raise NotCached("batch", start, max_count if max_count < (1 << 40) else None)
        return b


@dataclass(frozen=True, slots=True)
class Fetch:
    """Ask the member (fenced by ``term``) for a batch from ``index``, an entry's
    (term, pos), or its newest snapshot: what the :class:`LeaderView` lacks.

    ``committed`` >= ``index`` (a batch): entries ``index..committed`` are committed, so
    they may be read without the fence, straight from the leader's files where the
    transport can (its dispatcher runs on the leader's node).  Committed entries are never
    rewritten, in this member's log or any later leader's, so those bytes are the log's
    whatever happens to the term meanwhile -- and a follower far behind (a learner catching
    up) then costs the leader's process nothing."""

    term: int
    kind: str  # "batch" | "meta" | "snapshot"
    index: int
    max_bytes: int
    max_count: int
    committed: int = -1

    @property
    def from_files(self) -> bool:
        """Whether the leader's files may answer, unfenced: a batch of committed entries."""
        return self.kind == "batch" and self.committed >= self.index


class CommittedFiles(Protocol):
    """A read-only view of the leader's log files (:class:`~rayledger.storage.StoreReader`)."""

    def refresh(self) -> None: ...

    def begin_index(self) -> int: ...

    def read_batch(self, start: int, max_bytes: int, max_count: int) -> Any: ...


def read_committed(files: CommittedFiles, f: Fetch) -> CachedBatch | None:
    """The committed entries ``f`` allows, read from the leader's files, or None: they are
    not there (compacted away, or not yet on disk), and the member's fenced answer -- which
    also tells the dispatcher the leader's new begin -- is asked instead."""
    count = min(f.max_count, f.committed - f.index + 1)
    try:
        files.refresh()
        if f.index < files.begin_index():
            return None
        batch = files.read_batch(f.index, f.max_bytes, count)
    except LedgerError:
        return None
    return CachedBatch(batch.first_index, batch.count, Inline(batch), len(batch.data))


# ====================================================================== events in


@dataclass(frozen=True, slots=True)
class Activate:
    """Push for the leader of ``info.term`` (:class:`~rayledger.replication.messages.LeaderInfo`),
    from its log."""

    info: LeaderInfo


@dataclass(frozen=True, slots=True)
class Deactivate:
    """Stop pushing; ``term`` is the term that ended (a later one may start)."""

    term: int


@dataclass(frozen=True, slots=True)
class RoundAnnounced:
    """The leader stored a round (:class:`~rayledger.replication.messages.Announcement`)."""

    a: Announcement


@dataclass(frozen=True, slots=True)
class Committed:
    """The checker of ``term`` committed ``index``."""

    term: int
    index: int


@dataclass(frozen=True, slots=True)
class Fetched:
    """The member's fenced answer to a :class:`Fetch` (``answer`` None: it no longer leads
    ``fetch.term``; ``failed``: it did not answer at all)."""

    fetch: Fetch
    answer: Any = None
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Reported:
    """The checker's answer to the report ``(term, wm)``: its committed index (None: it does
    not serve ``term``); ``failed``: it did not answer (its process died or hangs)."""

    term: int
    wm: int
    committed: int | None = None
    failed: bool = False


@dataclass(frozen=True, slots=True)
class GraphPush:
    """A round through the compiled graph (on the graph's thread); answers ``(carry,
    wire)``."""

    g: Any


@dataclass(frozen=True, slots=True)
class GraphAck:
    """The follower's answers through the graph; answers the checker's ``(gen, term, peer,
    water mark, rounds)``."""

    answered: tuple


DispatcherEvent = (
    Activate | Deactivate | RoundAnnounced | Committed | FollowerAnswer | Fetched | Reported
    | GraphBegin | GraphEnd | GraphPush | GraphAck | TurnEnd
)  # fmt: skip


@dataclass(slots=True)
class DispatcherReady:
    pushes: list[PushEntryRequest] = field(default_factory=list)
    fetch: Fetch | None = None
    report: tuple[int, int] | None = None  # (term, water mark) for the checker
    progress: tuple[int, int] | None = None  # (term, match index) for the member's elector
    # run in the background from now on (True: the follower is a learner catching up, whose
    # pushes must take only CPU the voters' rounds leave) or in the foreground (False)
    background: bool | None = None
    wake_at_ms: int | None = None


class DispatcherLogic:
    """One leader -> follower pusher: the EntryDispatcher core over a :class:`LeaderView`,
    and the fetches, reports and graph pushes around it."""

    def __init__(
        self,
        group: str,
        self_id: str,
        peer_id: str,
        config: ReplicationConfig,
        cache_bytes: int = 64 << 20,
    ):
        self.self_id, self.peer_id = self_id, peer_id
        self.config = config
        self.core = EntryDispatcher(group, self_id, peer_id, config)
        self.view = LeaderView(cache_bytes)
        self.term = -1
        self.reported = -1  # the water mark last handed to a report
        self.fetching = False
        self._fetch_after = 0
        self.reporting = False
        self._report_due = False
        self._report_after = 0
        self._progress_wm = -1
        self._progress_at: int | None = None
        self._last_progress = -(1 << 62)
        self.graph_gen: int | None = None  # the compiled-graph generation served
        self._graph_sent: dict[tuple, PushEntryRequest] = {}
        self._graph_keys = itertools.count()
        self._outbox: list[PushEntryRequest] = []
        self._background = False  # what the last Ready said about the follower (a learner)
        self._last_report_ms = -(1 << 62)

    @property
    def active(self) -> bool:
        return self.core.active

    @property
    def water_mark(self) -> int:
        return self.core.water_mark

    @property
    def need(self) -> NotCached | None:
        return self.core.need

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: DispatcherEvent, now_ms: int) -> Any:  # noqa: C901 -- one case each
        """Deliver one event; returns the call's direct answer (see each event)."""
        match ev:
            case FollowerAnswer():
                return self._on_response(ev, now_ms)
            case RoundAnnounced():
                return self._on_announcement(ev.a)
            case Committed():
                return self._on_committed(ev.term, ev.index)
            case Fetched():
                f = ev.fetch
                if ev.failed:
                    return self._fetch_failed(now_ms)
                if f.kind == "batch":
                    return self._took_batch(f.term, ev.answer)
                if f.kind == "snapshot":
                    return self._took_snapshot(f.term, ev.answer)
                return self._took_meta(f.term, f.index, ev.answer)
            case Reported():
                if ev.failed:
                    return self._report_failed(now_ms)
                return self._reported_to_checker(ev.term, ev.wm, ev.committed, now_ms)
            case GraphPush():
                return self._graph_push(ev.g, now_ms)
            case GraphAck():
                return self._graph_ack(ev.answered, now_ms)
            case Activate():
                return self._activate(ev.info, now_ms)
            case Deactivate():
                return self._deactivate(ev.term, now_ms)
            case GraphBegin():
                return self._graph_begin(ev.term, ev.gen)
            case GraphEnd():
                return self._graph_end(ev.gen, now_ms)
            case TurnEnd():
                return self._ready(now_ms)
        raise TypeError(f"not a dispatcher event: {ev!r}")

    # -- its cases: from the member and the checker ----------------------------------------
    def _activate(self, info: LeaderInfo, now_ms: int) -> None:
        self.term = info.term
        self.view.reset(info)
        self.core.step(FreshState(info.term, self.self_id, True), now_ms)
        self.reported = -1
        # set up again in the same term (its checker restarted): the fresh checker learns
        # this follower's mark now, not when it next rises (an idle, caught-up follower's
        # mark may never rise, and the rounds re-registered with the checker wait for it)
        self._report_due = self.core.water_mark >= 0
        self._progress_wm = -1

    def _deactivate(self, term: int, now_ms: int) -> None:
        """Stop pushing; ``term`` is the term that ended (a later one may start)."""
        self.graph_gen = None
        self._graph_sent.clear()
        self._outbox.clear()
        self._progress_wm = -1
        self._progress_at = None
        self._report_due = False
        if term >= self.term:
            self.core.step(FreshState(term, None, False), now_ms)
            self.view.batches.clear()
            self.view.cached_bytes = 0

    def _on_announcement(self, a: Announcement) -> bool:
        """The leader stored a round; True when it may be pushed right away."""
        if a.term != self.term or not self.core.active:
            return False
        view = self.view
        view.add(CachedBatch(a.first, a.count, a.payload, a.nbytes))
        # every entry of a round has the leader's term: COMPARE/COMMIT pushes naming a
        # round's edge need no fetch from the member
        view.meta[a.first] = (a.term, a.edges[0])
        view.meta[a.first + a.count - 1] = (a.term, a.edges[1])
        last = a.first + a.count - 1
        if last > view.ledger_end_index:
            view.ledger_end_index = last
        if a.committed > view.committed_index:
            view.committed_index = a.committed
        if a.configs:  # a configuration round: a learner promoted reports from now on
            view.configs = a.configs
        return self.core.write_index == a.first

    def _on_committed(self, term: int, index: int) -> bool:
        """The checker of ``term`` committed ``index``; True when a COMMIT may be due."""
        if term == self.term and index > self.view.committed_index:
            self.view.committed_index = index
            return True
        return False

    # -- answers ---------------------------------------------------------------------------
    def _on_response(self, ev: FollowerAnswer, now_ms: int):
        """Fold in a push's answer (None: lost or timed out -- a timeout is an answer too);
        returns the new water mark (a report to the checker is then due), or None."""
        wm = self._fold(ev, now_ms)
        if wm is not None:
            self._report_due = True
            if self.view.is_learner(self.peer_id):  # not reported: the elector hears it here
                self._note_progress(self.term, wm, now_ms)
        return wm

    def _fold(self, ev: FollowerAnswer, now_ms: int):
        if ev.req.term != self.term:
            return None
        self.core.step(ev, now_ms)
        wm = self.core.water_mark
        if wm > self.reported and self.core.active:
            self.reported = wm
            self.view.prune(wm)
            return wm
        return None

    def _took_batch(self, term: int, answer) -> None:
        """A fenced :meth:`MemberLogic.answer_fetch` answer (None: the member stopped
        leading ``term``), or committed entries read from the leader's files (no info)."""
        self.fetching = False
        if answer is None or term != self.term:
            return
        batch, info = answer
        if info is not None:
            self.view.learn(info)
        if batch is not None and batch.count:
            self.view.add(batch)

    def _took_meta(self, term: int, index: int, answer) -> None:
        self.fetching = False
        if answer is None or term != self.term:
            return
        meta, info = answer
        self.view.learn(info)
        if meta is not None:  # None: compacted away (the view now knows the begin)
            self.view.meta[index] = meta

    def _took_snapshot(self, term: int, answer) -> None:
        """A fenced :meth:`MemberLogic.answer_fetch` answer: ``(snapshot or None,
        info)``, or None when the member stopped leading ``term``."""
        self.fetching = False
        if answer is None or term != self.term:
            return
        snap, info = answer
        self.view.learn(info)
        self.view.snapshot = snap

    def _fetch_failed(self, now_ms: int) -> None:
        """The member did not answer: try again after :data:`FETCH_RETRY_MS`."""
        self.fetching = False
        self._fetch_after = now_ms + FETCH_RETRY_MS

    def _reported_to_checker(self, term: int, wm: int, committed: int | None, now_ms: int) -> None:
        """The checker took the report ``(term, wm)`` and answered its committed index
        (None: it does not serve ``term``).  Another report is due when the water mark
        rose meanwhile or a new term started (a report of an older term must not swallow
        the new term's first)."""
        self.reporting = False
        if committed is not None:
            self._on_committed(term, committed)
        self._note_progress(term, wm, now_ms)
        if self.term != term or self.core.water_mark > wm:
            self._report_due = True

    def _report_failed(self, now_ms: int) -> None:
        """The checker did not answer (its process died or was killed): report again after
        :data:`REPORT_RETRY_MS`.  Waiting for the next rise of the water mark instead would
        leave a restarted checker without this follower's mark for good once the follower
        has caught up (found by the simulation: a round never answered)."""
        self.reporting = False
        self._report_due = True
        self._report_after = now_ms + REPORT_RETRY_MS

    def _note_progress(self, term: int, wm: int, now_ms: int) -> None:
        """The member's elector hears of ``wm`` at most every :data:`PROGRESS_MS`, and the
        last one always gets through; one learned in another term is dropped."""
        if term != self.term:
            return
        self._progress_wm = max(self._progress_wm, wm)
        if self._progress_at is None:
            self._progress_at = max(now_ms, self._last_progress + PROGRESS_MS)

    # -- the compiled path (fastpath.py) -----------------------------------------------------
    def _graph_begin(self, term: int, gen: int) -> bool:
        if term != self.term:
            return False
        self.graph_gen = gen
        self._graph_sent.clear()
        return True

    def _graph_end(self, gen: int, now_ms: int) -> bool:
        """The leader left graph ``gen``: its pushes in flight are lost, push again, and
        report again (water marks that went into the graph may never have reached the
        checker).  False when ``gen`` is not the graph served."""
        if self.graph_gen != gen:
            return False
        self.graph_gen = None
        self._graph_sent.clear()
        self.core.step(Rewind(), now_ms)
        self._report_due = True
        return True

    def _graph_push(self, g: Any, now_ms: int) -> tuple[tuple, list, bool]:
        """A round through the graph: ``(carry, wire, run)`` -- the pushes the core wants
        now that the graph can carry (inline APPEND/COMMIT), keyed by leader, term, graph
        and a counter so that no other leader's answer is ever folded into one; the others
        wait in the outbox and ``run`` asks the loop to send them (or to fetch)."""
        a = g.announcement
        carry = (g.gen, a.term, g.rounds)
        if g.gen != self.graph_gen:
            return carry, [], False
        self._on_announcement(a)
        wire = []
        for req in self.core.step(NextPushes(self.view), now_ms):
            batch = req.batch
            inline = batch is None or isinstance(batch.payload, Inline)
            if inline and req.type in (PushType.APPEND, PushType.COMMIT):
                key = (self.self_id, a.term, g.gen, next(self._graph_keys))
                self._graph_sent[key] = req
                wire.append((key, replace(req, batch=batch.payload.batch) if batch else req))
            else:
                self._outbox.append(req)
        return carry, wire, bool(self._outbox) or self.need is not None

    def _graph_ack(self, answered: tuple, now_ms: int) -> tuple:
        """The follower's answers through the graph; returns ``(gen, term, peer, water
        mark, rounds)`` for the checker (water mark -1: another term is served now)."""
        (gen, term, rounds), answers = answered
        for key, resp in answers:
            req = self._graph_sent.pop(key, None)
            if req is not None:
                self._fold(FollowerAnswer(req, resp), now_ms)  # the graph carries the water mark on
        wm = self.core.water_mark if self.term == term else -1
        if wm >= 0:
            self._note_progress(term, wm, now_ms)
        return gen, term, self.peer_id, wm, rounds

    # -- the way out -----------------------------------------------------------------------
    def _ready(self, now_ms: int) -> DispatcherReady:
        out = DispatcherReady(self._outbox)
        self._outbox = []
        if not self.core.active:
            return out
        out.pushes += self.core.step(NextPushes(self.view), now_ms)
        wake = self.core.next_wakeup_ms(now_ms)
        need = self.core.need
        if need is not None and not self.fetching:
            if now_ms >= self._fetch_after:
                self.fetching = True
                cfg = self.config
                committed = self.view.committed_index
                out.fetch = Fetch(
                    self.term,
                    need.kind,
                    need.index,
                    cfg.max_batch_push_bytes,
                    need.count or cfg.max_batch_push_count,
                    committed if need.kind == "batch" and need.index <= committed else -1,
                )
            else:
                wake = _earliest(wake, self._fetch_after)
        # a learner's mark counts toward no commit: the checker hears of it every
        # LEARNER_REPORT_MS (it has it when the learner is promoted), not at every push the
        # learner answers -- a call into the process every round of the voters waits on
        if self._report_due and not self.reporting:
            after = self._report_after
            if self.view.is_learner(self.peer_id):
                after = max(after, self._last_report_ms + LEARNER_REPORT_MS)
            if now_ms >= after:
                self._last_report_ms = now_ms
                self._report_due = False
                self.reporting = True
                out.report = (self.term, self.core.water_mark)
            else:
                wake = _earliest(wake, after)
        if self._progress_at is not None:
            if now_ms >= self._progress_at:
                self._progress_at = None
                self._last_progress = now_ms
                if self._progress_wm >= 0:
                    out.progress = (self.term, self._progress_wm)
            else:
                wake = _earliest(wake, self._progress_at)
        background = self.view.is_learner(self.peer_id)
        if background != self._background:
            self._background = out.background = background
        out.wake_at_ms = wake
        return out


def _earliest(a: int | None, b: int) -> int:
    return b if a is None or b < a else a
