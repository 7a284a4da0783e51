"""What the member, dispatcher and checker actors decide, without Ray, asyncio or a clock.

Each actor of the design card is two parts: this logic (events in, actions out,
``now_ms`` passed in) and a transport that delivers the events -- the Ray
actors of :mod:`.member`, :mod:`.dispatcher` and :mod:`.checker` (plain actor
calls, or the compiled steady-state path of :mod:`.fastpath`), and the
simulated network of ``tests/simulation/group_sim.py``.  So the seeded safety
checks of the simulation run the code that ships.

Helpers obey their member's term: every answer the member gives its
dispatchers (:meth:`MemberLogic.read_for_push`, :meth:`MemberLogic.entry_meta`)
is fenced by the term they serve, and a dispatcher only learns a committed
index from its own term's leader or checker.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayledger.election import (
    ElectionConfig,
    Elector,
    MemberState,
    RoleChange,
    Send,
    TermStore,
)
from rayledger.replication import (
    EntryDispatcher,
    EntryHandler,
    NotCached,
    PushEntryRequest,
    PushEntryResponse,
    QuorumAckChecker,
    ReplicationConfig,
    Resolved,
    check_append,
)
from rayledger.replication.admission import not_leader
from rayledger.storage import (
    Appended,
    EntryBatch,
    LedgerError,
    LogStore,
    OutcomeUnknownError,
    ResponseCode,
)

from .reads import ReadIndexLogic

log = logging.getLogger("rayledger.actors")


# ====================================================================== messages


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The leader's log as its helpers start from it (all of one term)."""

    term: int
    begin: int
    end: int
    end_term: int
    end_pos: int
    committed: int
    # how far the leader counts its own copy toward a quorum: ``end``, or with sync_flush
    # its flushed end (a restarted checker must not count an unflushed copy)
    water_mark: int


@dataclass(frozen=True, slots=True)
class StartLeading:
    """The member leads ``term``: set up its checker and dispatchers for it."""

    term: int
    term_start_index: int  # the term's empty entry (Raft section 5.4.2)
    info: LeaderInfo


@dataclass(frozen=True, slots=True)
class StopLeading:
    """The member no longer leads ``term``: its helpers stop and fail what waits."""

    term: int
    new_term: int


@dataclass(frozen=True, slots=True)
class Round:
    """One store batch and one replication round: the appends coalesced into it."""

    term: int
    appended: Appended
    calls: tuple[tuple[Any, int, int], ...]  # (token, first index, last index) per append call

    @property
    def first_index(self) -> int:
        return self.appended.first_index

    @property
    def last_index(self) -> int:
        return self.appended.last_index


@dataclass(frozen=True, slots=True)
class Announcement:
    """What a leader tells its dispatchers about a round; ``payload`` carries the bytes
    (an :class:`~rayledger.storage.EntryBatch`, or a stand-in the transport understands)."""

    term: int
    first: int
    count: int
    payload: Any
    nbytes: int
    edges: tuple[int, int]  # positions of the first and the last entry
    committed: int

    def followed_by(self, b: Announcement) -> Announcement:
        """This round and the next one as one (their entries are contiguous); both carry
        their bytes as an :class:`~rayledger.storage.EntryBatch`."""
        pa, pb = self.payload, b.payload
        return Announcement(
            term=self.term,
            first=self.first,
            count=self.count + b.count,
            payload=EntryBatch(pa.first_index, pa.count + pb.count, pa.data + pb.data),
            nbytes=self.nbytes + b.nbytes,
            edges=(self.edges[0], b.edges[1]),
            committed=max(self.committed, b.committed),
        )


# ======================================================================== member


class MemberLogic:
    """A member: its store, MemberState, elector and entry handler, and when it leads,
    admission, coalescing of concurrent appends into rounds, and fenced answers to its
    helpers."""

    def __init__(
        self,
        group: str,
        self_id: str,
        peers: Sequence[str],
        store: LogStore,
        election: ElectionConfig,
        replication: ReplicationConfig,
        term_store: TermStore | None = None,
        *,
        data_dir: str | None = None,
        rng: random.Random | None = None,
    ):
        self.group = group
        self.self_id = self_id
        self.peers = list(peers)
        self.store = store
        self.replication = replication
        self.state = MemberState(group, self_id, self.peers, term_store, data_dir=data_dir)
        self.state.attach_log(store)  # the store owns the log end; the state reads it
        self.elector = Elector(self.state, election, rng or random.Random())
        self.handler = EntryHandler(group, self_id, self.state, store, replication)
        self.leading_term = -1  # the term whose helpers were told to start
        self.ready_term = -1  # the term whose helpers confirmed they started
        self.term_start_index = -1  # the index of the leading term's empty entry

    # -- election ------------------------------------------------------------------------
    def tick(self, now_ms: int) -> tuple[list, list]:
        """(election actions, push answers) due now."""
        return self.elector.tick(now_ms), self.handler.tick(now_ms)

    def next_tick_ms(self, now_ms: int, granularity_ms: int) -> int:
        """When :meth:`tick` must run next (the elector's next deadline; queued
        out-of-order pushes need the handler's periodic check)."""
        if self.handler.queued:
            return now_ms + granularity_ms
        return self.elector.next_tick_ms(now_ms, granularity_ms)

    def handle_election(self, req: object, now_ms: int) -> tuple[object, list]:
        return self.elector.handle(req, now_ms)

    def on_election_response(self, peer: str, req: object, resp: object, now_ms: int) -> list:
        return self.elector.on_response(peer, req, resp, now_ms)

    def on_peer_progress(self, peer: str, term: int, match_index: int, now_ms: int) -> list:
        return self.elector.on_peer_progress(peer, term, match_index, now_ms)

    @staticmethod
    def split(actions: list) -> tuple[list[Send], bool]:
        """(messages to send, whether the role may have changed)."""
        sends = [a for a in actions if isinstance(a, Send)]
        return sends, any(isinstance(a, RoleChange) for a in actions)

    # -- follower ------------------------------------------------------------------------
    def on_push(self, req: PushEntryRequest, token: Any, now_ms: int) -> list:
        """A push from a leader's dispatcher; returns the answers ready now."""
        return self.handler.handle_push(req, token, now_ms)

    # -- leadership ----------------------------------------------------------------------
    def leadership(self) -> list[StartLeading | StopLeading]:
        """Bring the helpers in line with the role: stop an old term, start a new one.

        Starting a term writes its empty entry first (Raft section 5.4.2), so older
        terms' entries commit as soon as it does.
        """
        st = self.state
        out: list[StartLeading | StopLeading] = []
        term = st.current_term
        if self.leading_term != -1 and (not st.is_leader or self.leading_term != term):
            out.append(StopLeading(self.leading_term, term))
            log.info("[%s] term=%d: stops leading term %d", self.self_id, term, self.leading_term)
            self.leading_term = self.ready_term = -1
        if st.is_leader and self.leading_term != term:
            appended = self.store.append_as_leader([b""], term)
            self.leading_term = term
            self.term_start_index = appended.first_index
            info = self.leader_info()
            log.info(
                "[%s] term=%d: leads from index %d (end %d, committed %d)",
                self.self_id,
                term,
                appended.first_index,
                info.end,
                info.committed,
            )
            out.append(StartLeading(term, appended.first_index, info))
        return out

    def mark_ready(self, term: int) -> bool:
        """The helpers of ``term`` started; appends are taken from now on."""
        if self.leading_term == term and self.state.is_leader and self.state.current_term == term:
            self.ready_term = term
            return True
        return False

    def leader_info(self) -> LeaderInfo:
        s = self.store
        end = s.ledger_end_index
        return LeaderInfo(
            term=self.state.current_term,
            begin=s.ledger_begin_index,
            end=end,
            end_term=s.ledger_end_term,
            end_pos=s.get_pos(end) if end >= s.ledger_begin_index else -1,
            committed=s.committed_index,
            water_mark=self.water_mark(),
        )

    def water_mark(self) -> int:
        """How far this leader's own copy counts toward a quorum (the checker's mark for
        it): its log end, or with sync_flush only what is flushed (``durable_end_index``),
        wherever the checker learns it -- a round's registration, a restarted checker's
        start, the rounds re-registered with it."""
        return self.store.durable_end_index

    def read_base(self) -> tuple[int, int]:
        """``(term, index of its first entry)`` for a read index on this leader: the read
        index is valid only once that entry has committed (Raft section 6.4).  NOT_LEADER
        (with the leader's id when known) or LEADER_NOT_READY otherwise."""
        st = self.state
        term = st.current_term
        if not st.is_leader:
            raise not_leader(st, f"{self.self_id} does not lead {self.group!r} (term {term})")
        if self.ready_term != term:
            raise LedgerError.of(
                ResponseCode.LEADER_NOT_READY,
                f"{self.self_id} is taking office for term {term}",
                leader_id=self.self_id,
            )
        return term, self.term_start_index

    def lease_holds(self, reads: ReadIndexLogic, term: int, now_ms: int) -> bool:
        """A lease read may skip its confirmation round: the elector allows a lease in
        ``term`` (pre-vote on, no take-leadership order sent in it) and the lease of the
        last confirmed round has not run out."""
        return self.elector.lease_allowed(term) and reads.lease_holds(term, now_ms)

    def leads(self, term: int) -> bool:
        return (
            self.leading_term == term and self.state.is_leader and self.state.current_term == term
        )

    # -- appends on the leader -------------------------------------------------------------
    def admit(
        self, bodies: Sequence[bytes], group: str, target: str | None, pending: int
    ) -> tuple[int, list]:
        """DLedger's append checks and the store's body checks, before anything is queued
        (a bad append never fails the round it would have joined); returns the term the
        append will be written in and the bodies as a list."""
        check_append(self.state, group, target, bodies, pending, self.replication)
        term = self.state.current_term
        if self.ready_term != term:
            raise LedgerError.of(
                ResponseCode.LEADER_NOT_READY,
                f"{self.self_id} is taking office for term {term}",
                leader_id=self.self_id,
            )
        bodies = self.store.check_bodies(bodies)
        self.store.check_disk()
        return term, bodies

    def write_round(self, calls: Sequence[tuple[Any, Sequence[bytes]]], term: int) -> Round:
        """Write the bodies of several append calls as one store batch (group commit).

        Raises LedgerError (nothing written) when the member no longer leads ``term``
        or the store refuses the batch (sizes, types, a full disk).
        """
        if not self.leads(term) or self.ready_term != term:
            raise not_leader(self.state, f"{self.self_id} no longer leads term {term}")
        if len(calls) == 1:
            bodies = calls[0][1]
        else:
            bodies = [b for _, bs in calls for b in bs]
        end = self.store.ledger_end_index
        try:
            appended = self.store.append_as_leader(bodies, term)
        except LedgerError as exc:
            if self.store.ledger_end_index == end:
                raise  # nothing was written: a plain failure, safe to retry
            # written, then the store failed (a sync flush): they may still commit
            raise OutcomeUnknownError(
                ResponseCode.APPEND_OUTCOME_UNKNOWN,
                f"entries {end + 1}..{self.store.ledger_end_index} were written by "
                f"{self.self_id} but the store then failed ({exc.code.name}: {exc.message}); "
                "the outcome is unknown, check before retrying",
            ) from exc
        spans = []
        first = appended.first_index
        for token, bs in calls:
            spans.append((token, first, first + len(bs) - 1))
            first += len(bs)
        return Round(term, appended, tuple(spans))

    def announcement(self, rnd: Round, payload: Any) -> Announcement:
        a = rnd.appended
        return Announcement(
            term=rnd.term,
            first=a.first_index,
            count=len(a.positions),
            payload=payload,
            nbytes=len(a.data),
            edges=(a.positions[0], a.positions[-1]),
            committed=self.store.committed_index,
        )

    def on_committed(self, term: int, index: int) -> None:
        """From the checker: a quorum stores everything up to ``index`` in ``term``."""
        if self.state.current_term == term and index > self.store.committed_index:
            self.store.update_committed_index(min(index, self.store.ledger_end_index))

    # -- fenced answers to the helpers ----------------------------------------------------
    def read_for_push(self, term: int, start: int, max_bytes: int, max_count: int):
        """Entries from ``start`` for a dispatcher of ``term``; None unless this member
        leads ``term`` (a helper of another term gets nothing it can act on)."""
        if not self.leads(term):
            return None
        return self.store.read_batch(start, max_bytes, max_count), self.leader_info()

    def entry_meta(self, term: int, index: int):
        """(term, pos) of entry ``index`` for a dispatcher of ``term``; None when fenced."""
        if not self.leads(term):
            return None
        return (self.store.get_term(index), self.store.get_pos(index)), self.leader_info()


# ==================================================================== dispatcher


@dataclass(slots=True)
class CachedBatch:
    """A batch the dispatcher may push; ``payload`` is opaque to the logic."""

    first_index: int
    count: int
    payload: Any
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

    def reset(self, info: LeaderInfo) -> None:
        self.batches.clear()
        self.meta.clear()
        self.cached_bytes = 0
        self.ledger_begin_index = info.begin
        self.ledger_end_index = info.end
        self.committed_index = info.committed
        if info.end >= info.begin:
            self.meta[info.end] = (info.end_term, info.end_pos)

    def learn(self, info: LeaderInfo) -> None:
        """Fold in a fenced answer of the leader (same term by construction)."""
        self.ledger_begin_index = info.begin
        self.ledger_end_index = max(self.ledger_end_index, info.end)
        self.committed_index = max(self.committed_index, info.committed)

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
    def get_term(self, index: int) -> int:
        m = self.meta.get(index)
        if m is None:
            raise NotCached("meta", index)
        return m[0]

    def get_pos(self, index: int) -> int:
        m = self.meta.get(index)
        if m is None:
            raise NotCached("meta", index)
        return m[1]

    def read_batch(self, start: int, max_bytes: int = 1 << 62, max_count: int = 1 << 62):
        b = self.batches.get(start)
        if b is None or b.count > max_count:
            # a resend wants exactly its original range: fetch no more than that, or a
            # larger cached batch would be fetched (and refused) again and again
            raise NotCached("batch", start, max_count if max_count < (1 << 40) else None)
        return b


class DispatcherLogic:
    """One leader -> follower pusher: the EntryDispatcher core over a :class:`LeaderView`."""

    def __init__(
        self,
        group: str,
        self_id: str,
        peer_id: str,
        config: ReplicationConfig,
        cache_bytes: int = 64 << 20,
    ):
        self.self_id, self.peer_id = self_id, peer_id
        self.core = EntryDispatcher(group, self_id, peer_id, config)
        self.view = LeaderView(cache_bytes)
        self.term = -1
        self.reported = -1  # the water mark last reported to the checker

    @property
    def active(self) -> bool:
        return self.core.active

    @property
    def water_mark(self) -> int:
        return self.core.water_mark

    def activate(self, info: LeaderInfo) -> None:
        self.term = info.term
        self.view.reset(info)
        self.core.check_and_fresh_state(info.term, self.self_id, True)
        self.reported = -1

    def deactivate(self, term: int) -> None:
        """Stop pushing; ``term`` is the term that ended (a later one may start)."""
        if term >= self.term:
            self.core.check_and_fresh_state(term, None, False)
            self.view.batches.clear()
            self.view.cached_bytes = 0

    def on_announcement(self, a: Announcement) -> bool:
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
        return self.core.write_index == a.first

    def on_committed(self, term: int, index: int) -> bool:
        """The checker of ``term`` committed ``index``; True when a COMMIT may be due."""
        if term == self.term and index > self.view.committed_index:
            self.view.committed_index = index
            return True
        return False

    def next_requests(self, now_ms: int) -> list[PushEntryRequest]:
        """Pushes to send now; afterwards :attr:`need` says what to fetch, if anything."""
        return self.core.next_requests(now_ms, self.view)

    @property
    def need(self) -> NotCached | None:
        return self.core.need

    def took_batch(self, term: int, answer) -> None:
        """A fenced :meth:`MemberLogic.read_for_push` answer (None: the member stopped
        leading ``term``)."""
        if answer is None or term != self.term:
            return
        batch, info = answer
        self.view.learn(info)
        if batch is not None and batch.count:
            self.view.add(batch)

    def took_meta(self, term: int, index: int, answer) -> None:
        if answer is None or term != self.term:
            return
        (t, pos), info = answer
        self.view.learn(info)
        self.view.meta[index] = (t, pos)

    def on_response(self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int):
        """Fold in an answer; returns the new water mark to report, or None."""
        if req.term != self.term:
            return None
        self.core.on_response(req, resp, now_ms)
        wm = self.core.water_mark
        if wm > self.reported and self.core.active:
            self.reported = wm
            self.view.prune(wm)
            return wm
        return None

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        return self.core.next_wakeup_ms(now_ms)

    def rewind(self) -> None:
        self.core.rewind()


# ======================================================================= checker


class CheckerLogic:
    """The leader's QuorumAckChecker and the rounds waiting for it (by token)."""

    def __init__(self, group: str, self_id: str, peers: Sequence[str], config: ReplicationConfig):
        self.self_id = self_id
        self.core = QuorumAckChecker(group, self_id, list(peers), config)
        self.term = -1
        self._registered: set[Any] = set()

    def become_leader(self, term: int, term_start_index: int, info: LeaderInfo) -> list[Resolved]:
        self.term = term
        self._registered.clear()
        out = self.core.become_leader(term, term_start_index, info.water_mark, info.committed)
        return out

    def step_down(self, term: int) -> list[Resolved]:
        if term < self.term:
            return []
        self.term = -1
        self._registered.clear()
        return self.core.step_down(term)

    def add_round(
        self, term: int, first: int, last: int, token: Any, now_ms: int, leader_mark: int
    ) -> None:
        """A round of ``term`` waits for its quorum (registering one twice is harmless);
        ``leader_mark`` is the leader's :meth:`MemberLogic.water_mark` when it registered
        the round (with sync_flush it may stand below the round: not flushed yet)."""
        self.core.update_water_mark(term, self.self_id, leader_mark)
        if token in self._registered:
            return
        self._registered.add(token)
        self.core.add_pending(term, first, last, token, now_ms)

    def report(self, term: int, peer: str, water_mark: int) -> None:
        self.core.update_water_mark(term, peer, water_mark)

    def check(self, now_ms: int) -> tuple[int | None, list[Resolved]]:
        committed, resolved = self.core.check(now_ms)
        for r in resolved:
            self._registered.discard(r.token)
        return committed, resolved

    @property
    def committed_index(self) -> int:
        return self.core.committed_index

    def next_deadline_ms(self) -> int | None:
        return self.core.next_deadline_ms()
