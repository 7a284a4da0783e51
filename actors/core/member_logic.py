"""What a member decides, without Ray, asyncio or a clock: :class:`MemberLogic` (its log,
its elector, its follower-side handler, its leadership's rounds and announcements) and the
rounds it writes (:class:`Round`); what it tells its helpers, :class:`LeaderInfo` and
:class:`Announcement`, is in :mod:`rayledger.replication.messages`.

Events go in and actions come out, ``now_ms`` passed in; the Ray member
(:mod:`rayledger.actors.member.actor`) and the simulation (``tests/simulation``) only deliver them,
so the seeded safety checks of the simulation run the code that ships.  The dispatcher's and
checker's decisions are theirs (:mod:`.dispatcher`, :mod:`.checker`).

Helpers obey their member's term: every answer the member gives its
dispatchers (:meth:`MemberLogic.answer_fetch`, :meth:`MemberLogic.snapshot_chunk`)
is fenced by the term they serve, and a dispatcher only learns a committed
index from its own term's leader or checker.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from rayledger.actors.core.reads import ReadIndexLogic
from rayledger.election import (
    ElectionConfig,
    Elector,
    MemberState,
    RoleChange,
    Send,
    TermStore,
)
from rayledger.election.configuration import (
    CONFIG_CHANNEL,
    Configuration,
    ConfigWatch,
    FileConfigStore,
    MemoryConfigStore,
    check_change,
    recover_config_log,
)
from rayledger.election.messages import ElectionAnswer, ElectionRequest, PeerProgress, Tick
from rayledger.replication import (
    EntryHandler,
    ReplicationConfig,
    check_append,
)
from rayledger.replication.admission import not_leader
from rayledger.replication.dispatcher import Fetch
from rayledger.replication.install import InstallReceiver
from rayledger.replication.messages import Announcement, Inline, LeaderInfo, Push
from rayledger.replication.sessions import SessionTable, recover_sessions
from rayledger.storage import (
    Appended,
    LedgerError,
    LogStore,
    OutcomeUnknownError,
    ResponseCode,
)
from rayledger.storage.snapshots import SESSIONS_FILE, read_sessions

__all__ = [
    "MemberLogic",
    "Round",
    "StartLeading",
    "StopLeading",
]

log = logging.getLogger("rayledger.actors")


# ====================================================================== messages


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


# ======================================================================== member


class SnapshotSource(Protocol):
    """A member's machine snapshots (:class:`~rayledger.actors.machine.Applier`): the newest that
    verifies, one by (index, term) -- CORRUPT_SNAPSHOT when gone -- and the directory
    (:class:`~rayledger.storage.snapshots.SnapshotStore`) that reads and installs them."""

    store: Any

    def newest(self) -> Any: ...

    def find(self, index: int, term: int) -> Any: ...


@dataclass(frozen=True, slots=True)
class EntriesRead:
    """The member's answer to a dispatcher's fetch of entries, once fenced: read them from
    ``start`` (at most ``max_bytes`` and ``max_count``) outside the member's lock -- a
    leader's log only grows in its term -- and answer them with ``info``."""

    start: int
    max_bytes: int
    max_count: int
    info: LeaderInfo


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
        initial: Configuration | None = None,
        config_store: Any = None,
    ):
        self.group = group
        self.self_id = self_id
        self.peers = list(peers)
        self.store = store
        self.replication = replication
        # the configurations in its log, kept beside it: a restart reads them back
        # (an added member starts from ``initial``, the group's first ones from ``peers``)
        if config_store is None:
            config_store = FileConfigStore(data_dir) if data_dir else MemoryConfigStore()
        first = initial if initial is not None else Configuration.of(self.peers)
        self.config_log = recover_config_log(config_store, store, first)
        self.state = MemberState(group, self_id, self.peers, term_store, data_dir=data_dir,
                                 config=self.config_log)  # fmt: skip
        self.state.attach_log(store)  # the store owns the log end; the state reads it
        store.watch_channel(CONFIG_CHANNEL, ConfigWatch(self.config_log))
        # idempotent clients' sessions as this log holds them: any member that
        # leads next answers a retry from its own log
        self.sessions = recover_sessions(store, replication.client_session_ttl_ms)
        self.elector = Elector(self.state, election, rng or random.Random())
        self.handler = EntryHandler(group, self_id, self.state, store, replication)
        self.leading_term = -1  # the term whose helpers were told to start
        self.ready_term = -1  # the term whose helpers confirmed they started
        self.term_start_index = -1  # the index of the leading term's empty entry
        # (term, index): the configuration entry whose voters this leader's checker counts
        self.checker_config = (-1, -1)
        # the machine's snapshots: offered to followers below our begin, and
        # where a follower's INSTALL chunks go; None when the member takes no snapshots
        self.snapshots: SnapshotSource | None = None
        # the machine's answer to a follower that needs a snapshot further than our newest:
        # take one as soon as it stands that far (set with the snapshots)
        self.snapshot_asked: Callable[[int, int], None] | None = None
        # the snapshot index the machine needs to start again, given the log's begin (-1:
        # none; set by the machine's shell)
        self.machine_wanted: Callable[[int], int] | None = None
        # past the newest of the leader's snapshots that came without the sessions this
        # member lacks (the leader lacked them too when it cut it): the one asked for next
        self.sessions_not_below = -1

    def take_snapshots(
        self,
        source: SnapshotSource,
        wanted: Callable[[int], int] | None = None,
        asked: Callable[[int, int], None] | None = None,
    ) -> None:
        """The member's machine takes snapshots: offer them, and take them from leaders.
        Each carries the client sessions at its index: a log compacted up to
        one is rebuilt from it, and so is a log reset to one installed from a leader.
        ``wanted`` says which snapshot the machine needs to start again (push answers carry
        it); ``asked`` asks the machine for a snapshot a follower needs."""
        self.snapshots = source
        self.machine_wanted, self.snapshot_asked = wanted, asked
        self.handler.installs = InstallReceiver(self.self_id, source.store)
        self.handler.on_reset = self._sessions_from_snapshot
        self.handler.snapshot_wanted = self.snapshot_wanted
        # what was compacted lives on in a snapshot; and one past a log that lost its tail (a
        # power loss) holds committed entries it will get again: the table starts from the
        # newest whole one, as after a reset
        self._sessions_from_snapshot(self.store.ledger_begin_index)

    def _sessions_from_snapshot(self, begin: int, table: SessionTable | None = None) -> bool:
        """Rebuild ``table`` (the member's own by default) from the sessions of the newest
        whole snapshot at or above ``begin - 1`` and the log's entries after it -- one whose
        table knows every session before one that was cut while some were unknown (a
        leader's sealed below this member's own newest brings them); False when none
        stands there: the log's entries alone, the sessions below ``begin`` unknown until
        a leader's snapshot brings them (:meth:`snapshot_wanted`)."""
        table = self.sessions if table is None else table
        store = self.snapshots.store
        metas = sorted((m for m in store.list() if m.index >= begin - 1),
                       key=lambda m: m.index, reverse=True)  # fmt: skip
        partial = None  # the newest whole table with sessions unknown: the last resort
        for meta in metas:
            files = tuple(f for f in meta.files if f[0] == SESSIONS_FILE)
            # its checksum first: a damaged table could say a session is further behind
            # than its log is, and a retry would be written twice
            why = store.verify(replace(meta, files=files)) if files else "no session table"
            try:
                if why is None:
                    doc = read_sessions(meta.path)
                    if int(doc.get("unknown_upto", -1)) < 0:
                        table.rebuild(doc, self.store.session_records(meta.index + 1),
                                      covered=meta.index)  # fmt: skip
                        return True
                    partial = partial or (meta, doc)
                    continue
            except (OSError, ValueError) as exc:
                why = repr(exc)
            log.warning("[%s] client sessions of snapshot %d not used: %s", self.self_id,
                        meta.index, why)  # fmt: skip
        if partial is not None:
            meta, doc = partial
            table.rebuild(doc, self.store.session_records(meta.index + 1), covered=meta.index)
            return True
        table.rebuild(None, self.store.session_records(self.store.ledger_begin_index),
                      unknown_upto=self.store.ledger_begin_index - 1)  # fmt: skip
        return False

    def sealed(self, metas: list) -> None:
        """Snapshots sealed from the leader: the table starts again from the newest whole one,
        as a restart's would (one past the log's end knows sessions of committed entries
        the log gets later; one at or past where the sessions were unknown brings them)."""
        if metas and self.snapshots is not None:
            self._sessions_from_snapshot(self.store.ledger_begin_index)
            if self.sessions.unknown_upto >= 0:
                newest = max(m.index for m in metas)
                self.sessions_not_below = max(self.sessions_not_below, newest + 1)

    def snapshot_wanted(self, begin: int) -> int:
        """The snapshot index this member needs from its leader, or -1: one its machine
        needs (stranded below ``begin``, :attr:`machine_wanted`), or one whose session
        table this member lacks (a member that leads without it could take a retry of a
        session it lacks for a new session).  That one must reach ``begin - 1``: the table
        is rebuilt from a snapshot the log goes on from, and this member's own snapshots,
        cut meanwhile, may have let its log go past where the sessions became unknown (one
        of the leader's below its begin would be sealed and never used, asked for again).
        Past the newest one that came without them (its leader lacked them too): a leader's
        snapshot cut later may hold them, and meanwhile the log's stamps show them expired
        in time (``SessionTable.committed``)."""
        machine = -1 if self.machine_wanted is None else self.machine_wanted(begin)
        unknown = self.sessions.unknown_upto
        if unknown < 0:
            return machine
        return max(machine, unknown, begin - 1, self.sessions_not_below)

    # -- election ------------------------------------------------------------------------
    def tick(self, now_ms: int) -> tuple[list, list]:
        """(election actions, push answers) due now."""
        return self.elector.step(Tick(), now_ms).actions, self.handler.step(Tick(), now_ms)

    def next_tick_ms(self, now_ms: int, granularity_ms: int) -> int:
        """When :meth:`tick` must run next (the elector's next deadline; queued
        out-of-order pushes need the handler's periodic check)."""
        if self.handler.queued:
            return now_ms + granularity_ms
        return self.elector.next_tick_ms(now_ms, granularity_ms)

    def handle_election(self, req: object, now_ms: int) -> tuple[object, list]:
        return self.elector.step(ElectionRequest(req), now_ms)

    def on_election_response(self, peer: str, req: object, resp: object, now_ms: int) -> list:
        return self.elector.step(ElectionAnswer(peer, req, resp), now_ms).actions

    def on_peer_progress(self, peer: str, term: int, match_index: int, now_ms: int) -> list:
        return self.elector.step(PeerProgress(peer, term, match_index), now_ms).actions

    @staticmethod
    def split(actions: list) -> tuple[list[Send], bool]:
        """(messages to send, whether the role may have changed)."""
        sends = [a for a in actions if isinstance(a, Send)]
        return sends, any(isinstance(a, RoleChange) for a in actions)

    # -- follower ------------------------------------------------------------------------
    def on_push(self, push: Push, now_ms: int) -> list:
        """A push from a leader's dispatcher (the member's own event, handed on as it is);
        returns the answers ready now."""
        return self.handler.step(push, now_ms)

    def must_flush(self, answers: Sequence) -> bool:
        """Whether ``answers`` (to pushes, or the handler's queued ones a tick releases)
        wait for a flush of this member's store first: with sync_flush a follower
        acknowledges only what is on disk, and a store that defers its sync to its caller
        (``defer_sync``, so that no lock is held through an fsync) has not flushed yet."""
        return self.store.defer_sync and bool(answers)

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
            configs=self.config_log.frozen(),
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

    def ready_leading_term(self) -> int:
        """The term this member leads with its helpers set up for it, or -1."""
        term = self.ready_term
        return term if term >= 0 and self.leads(term) else -1

    def holds_office(self, term: int) -> bool:
        """Whether the office of ``term`` is still this member's to take up: no role change
        stopped it and no newer term began -- it may be a candidate for a moment, elected
        again in the same term (then no role change runs, and what waited for the term
        must go on waiting)."""
        return self.leading_term == term and self.state.current_term == term

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

    def admit_config(self, proposed: Configuration, queued: bool = False) -> bytes:
        """Whether this leader may append configuration ``proposed`` now (the entry's body)
        or why not: the single-server rules (``check_change``), with a change already
        queued or appended and not committed counting as in progress."""
        not_ready = self.ready_term != self.state.current_term or not self.state.is_leader
        if not_ready:
            raise not_leader(self.state, f"{self.self_id} does not lead")
        log = self.config_log
        committed = self.store.committed_index
        check_change(
            log.latest(),
            proposed,
            pending=queued or log.pending(committed) or not self.checker_counts_latest(),
            committed_own_term=committed >= self.term_start_index >= 0,
        )
        return proposed.encode()

    def checker_counts(self, term: int, index: int) -> None:
        """This leader's checker of ``term`` counts the voters of the configuration entry at
        ``index`` (it said so in a resolution, or it was set up or configured with it)."""
        if term != self.leading_term:
            return
        t, i = self.checker_config
        self.checker_config = (term, max(index, i) if t == term else index)

    def checker_counts_latest(self) -> bool:
        """Whether the checker counts the log's latest configuration.  A single-server
        change is safe while the majority counted is of the configuration before it (any
        two majorities of configurations one change apart meet); two changes apart they
        need not.  So the next change waits until the checker counts the latest one, however
        long the role lock keeps a configure from it."""
        term, index = self.checker_config
        return term == self.leading_term and index >= self.config_log.latest_index()

    def write_round(
        self, calls: Sequence[tuple[Any, Sequence[bytes]]], term: int, channel: int = 0
    ) -> Round:
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
            appended = self.store.append_as_leader(bodies, term, channel)
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

    def existing_round(self, first: int, last: int, term: int) -> Round:
        """Entries ``first..last`` of ``term`` already in the log, as a round to send on
        again (a retry waits on them): no append call of its own."""
        store = self.store
        data = store.read_batch(first, 1 << 62, last - first + 1).data
        positions = [store.get_pos(i) for i in range(first, last + 1)]
        return Round(term, Appended(first, term, positions, data), ())

    def announcement(self, rnd: Round) -> Announcement:
        """Round ``rnd``'s announcement, its bytes :class:`Inline` (a transport may move
        large ones to its object store, :class:`Ref`, at its boundary)."""
        a = rnd.appended
        return Announcement(
            term=rnd.term,
            first=a.first_index,
            count=len(a.positions),
            payload=Inline(a.batch()),
            nbytes=len(a.data),
            edges=(a.positions[0], a.positions[-1]),
            committed=self.store.committed_index,
            configs=self.config_log.frozen()
            if self.config_log.latest_index() >= a.first_index
            else (),
        )

    def on_committed(self, term: int, index: int) -> None:
        """From the checker: a quorum stores everything up to ``index`` in ``term``."""
        if self.state.current_term == term and index > self.store.committed_index:
            self.store.update_committed_index(min(index, self.store.ledger_end_index))

    # -- fenced answers to the helpers ----------------------------------------------------
    def answer_fetch(self, f: Fetch, read_failed: bool = False) -> Any:
        """The fenced answer to a dispatcher's :class:`~rayledger.replication.dispatcher.Fetch`
        (None unless this member leads ``f.term``: a helper of another term gets nothing it
        can act on).  Entries are answered with an :class:`EntriesRead`, read
        outside the member's lock; ``read_failed``: that read failed as a compaction
        meanwhile removed them, answered as found compacted, ``(None, info)``."""
        if read_failed:
            return None, self.leader_info()
        if f.kind == "snapshot":
            return self._snapshot_for_push(f.term, f.index)
        if f.kind == "meta":
            return self._entry_meta(f.term, f.index)
        if not self.leads(f.term):
            return None
        info = self.leader_info()
        if f.index < self.store.ledger_begin_index:
            return None, info
        return EntriesRead(f.index, f.max_bytes, f.max_count, info)

    def _snapshot_for_push(self, term: int, at_least: int = -1):
        """``(newest valid snapshot or None, leader info)`` for a dispatcher of ``term``
        about to reset a follower below our begin, or whose follower's machine needs a
        snapshot at or past ``at_least``; None when fenced.  When ours stop short of
        ``at_least`` the machine is asked for one: a stranded follower would otherwise wait
        for the next periodic snapshot, which an idle group never reaches."""
        if not self.leads(term):
            return None
        snap = self.snapshots.newest() if self.snapshots is not None else None
        if at_least >= 0 and (snap is None or snap.index < at_least) and self.snapshot_asked:
            self.snapshot_asked(at_least, -1 if snap is None else snap.index)
        return snap, self.leader_info()

    def snapshot_chunk(self, term: int, index: int, snap_term: int):
        """Where a chunk of snapshot ``index`` is for a dispatcher of ``term`` (the bytes
        are read outside the member's lock by :meth:`SnapshotSource.read`): the snapshot,
        or a coded error -- fenced (TERM_CHANGED), or it is gone (CORRUPT_SNAPSHOT)."""
        if not self.leads(term):
            raise LedgerError.of(
                ResponseCode.TERM_CHANGED, f"{self.self_id} no longer leads {term}"
            )
        if self.snapshots is None:
            raise LedgerError.of(ResponseCode.UNSUPPORTED, f"{self.self_id} takes no snapshots")
        return self.snapshots.find(index, snap_term)

    def _entry_meta(self, term: int, index: int):
        """((term, pos) of entry ``index``, leader info) for a dispatcher of ``term``; None
        when fenced; (None, info) when the entry was compacted away."""
        if not self.leads(term):
            return None
        if index < self.store.ledger_begin_index:  # compacted: the dispatcher learns our begin
            return None, self.leader_info()
        return (self.store.get_term(index), self.store.get_pos(index)), self.leader_info()
