"""EntryHandler: the follower's side of replication (sans-I/O).

DLedger's follower thread keeps APPEND pushes by index and writes them strictly
at ``ledgerEndIndex + 1``; COMPARE, TRUNCATE and COMMIT wait in their own queue
and go first.  Here the member's core steps :meth:`EntryHandler.step` with every
:class:`~.messages.Push` (its opaque ``token`` names the call) and gets back the answers
that are ready -- possibly for pushes queued earlier; a ``Tick`` runs the periodic
abnormal-push check.

Term checks follow DLedger's handlePush: an older term is EXPIRED_TERM, a newer
one TERM_NOT_READY (the elector learns terms from heartbeats and votes, not from
pushes), the same term from another leader INCONSISTENT_LEADER.

Raft's commit rule on a follower: the committed index follows the leader's but
never past the highest index known to match the *current* leader's log
(``matched_index``), so stale entries from an old leader are never reported
committed before a COMPARE/TRUNCATE has dealt with them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from logging import DEBUG, ERROR, INFO, WARNING
from typing import TYPE_CHECKING, Any

from rayledger.election.configuration import Configuration
from rayledger.election.logevent import log_event
from rayledger.election.messages import Tick
from rayledger.storage.codec import EntryBatch
from rayledger.storage.errors import LedgerError, ResponseCode

from .config import ReplicationConfig
from .install import InstallReceiver
from .messages import Push, PushEntryRequest, PushEntryResponse, PushType

if TYPE_CHECKING:
    from rayledger.election import MemberState
    from rayledger.storage import LogStore

log = logging.getLogger("rayledger.replication")

Answer = tuple[Any, PushEntryResponse]

_INCONSISTENT = frozenset(
    {
        ResponseCode.INCONSISTENT_STATE,
        ResponseCode.INCONSISTENT_TERM,
        ResponseCode.INCONSISTENT_INDEX,
        ResponseCode.INDEX_OUT_OF_BOUNDS,
    }
)
_NEVER = -(1 << 62)


class EntryHandler:
    """Follower side: stores the leader's pushes in index order and answers them."""

    def __init__(
        self,
        group: str,
        self_id: str,
        state: MemberState,
        store: LogStore,
        config: ReplicationConfig,
    ):
        self.group = group
        self.self_id = self_id
        self.state = state
        self.store = store
        self.config = config
        state.attach_log(store)  # the store owns the log end; the state reads it
        # APPEND pushes waiting for their turn: first index -> (request, token, received at ms)
        self._writes: dict[int, tuple[PushEntryRequest, Any, int]] = {}
        self._ctrl: deque[tuple[PushEntryRequest, Any]] = deque()  # COMPARE / TRUNCATE / COMMIT
        self._leader_key: tuple[int, str | None] = (-1, None)
        # highest index known to match the log of this term's leader; kept by term, not by
        # (term, leader): a term has one leader, so a same-term flap (heartbeats time out,
        # then the same leader again) must not forget it, or a late duplicate TRUNCATE
        # passes the guard in :meth:`_truncate` and cuts acknowledged entries
        self._matched_term = -1
        self.matched_index = -1
        self._last_abnormal_check = _NEVER
        self.installs: InstallReceiver | None = None  # set when the member takes snapshots
        # told the new begin after a reset (the member loads what its snapshot carries)
        self.on_reset: Callable[[int], None] | None = None
        # told our log's begin: the snapshot index at or past which our state machine must
        # start again when it stands below the begin, else -1 (see :meth:`_resp`)
        self.snapshot_wanted: Callable[[int], int] | None = None
        self._now_ms = 0  # the time of the push or tick being handled

    @property
    def queued(self) -> int:
        return len(self._writes) + len(self._ctrl)

    def __repr__(self) -> str:
        return (
            f"EntryHandler({self.self_id} term={self.state.current_term} leader={self.state.leader_id} "
            f"end={self.store.ledger_end_index} matched={self.matched_index} "
            f"committed={self.store.committed_index} queued={self.queued})"
        )

    def _event(self, level: int, event: str, req: PushEntryRequest, **fields: Any) -> None:
        """One protocol log line: our id and term, the push (index, term, sender, its last
        index or the entry term it names), ``fields``, then our log's span and commit."""
        if not log.isEnabledFor(level):
            return
        st = self.store
        ids = {"member": self.self_id, "term": self.state.current_term, "index": req.first_index}
        push: dict[str, Any] = {"req_term": req.term, "leader": req.leader_id}
        if req.type is PushType.APPEND:
            push["last"] = req.last_index
        else:
            push["entry_term"] = req.entry_term
        ours = {
            "span": f"{st.ledger_begin_index}..{st.ledger_end_index}",
            "committed": st.committed_index,
        }
        log_event(log, level, event, **ids, **push, **fields, **ours)

    # -- checks ---------------------------------------------------------------------------
    def _check(self, req: PushEntryRequest) -> ResponseCode | None:
        """None when ``req`` may be handled now, else the code to answer it with."""
        st = self.state
        if req.group != self.group:
            return ResponseCode.UNKNOWN_GROUP
        if req.remote_id != self.self_id:
            return ResponseCode.UNKNOWN_MEMBER
        term = st.current_term
        if req.term < term:
            return ResponseCode.EXPIRED_TERM
        if req.term > term:
            return ResponseCode.TERM_NOT_READY
        leader = st.leader_id
        if leader is None:
            return ResponseCode.TERM_NOT_READY  # we know the term but not its leader yet
        if leader != req.leader_id:
            return ResponseCode.INCONSISTENT_LEADER
        if not st.is_follower:
            return ResponseCode.TERM_NOT_READY
        return None

    def _sync_leader(self) -> bool:
        """A new (term, leader) drops queued pushes (see :meth:`_on_leader_change`); a new
        term also forgets what matched the old one.  True when (term, leader) changed."""
        key = (self.state.current_term, self.state.leader_id)
        if key == self._leader_key:
            return False
        self._leader_key = key
        if key[0] != self._matched_term:
            self._matched_term = key[0]
            self.matched_index = -1
        return True

    def _resp(
        self, req: PushEntryRequest, code: ResponseCode, index: int | None = None, **hint: int
    ) -> PushEntryResponse:
        store = self.store
        if index is None:
            index = (
                req.first_index + req.count - 1 if req.type is PushType.APPEND else req.first_index
            )
        # a machine stranded below our begin, or a session table lacking what lies below it
        # (a snapshot found damaged), needs a snapshot the leader sends on its own only
        # before a reset: every answer asks
        ask = self.snapshot_wanted
        wanted = -1 if ask is None else ask(store.ledger_begin_index)
        return PushEntryResponse(
            group=self.group,
            remote_id=self.self_id,
            term=self.state.current_term,
            code=code,
            index=index,
            begin_index=store.ledger_begin_index,
            end_index=store.ledger_end_index,
            count=req.count,
            snapshot_wanted=wanted,
            **hint,
        )

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: Push | Tick, now_ms: int) -> list[Answer]:
        """Deliver a push or the member's clock at ``now_ms``; returns every answer ready
        now, as ``(token, response)``."""
        match ev:
            case Push():
                return self._handle_push(ev.req, ev.token, now_ms)
            case Tick():
                return self._tick(now_ms)
        raise TypeError(f"not a handler event: {ev!r}")

    def _handle_push(self, req: PushEntryRequest, token: Any, now_ms: int) -> list[Answer]:
        """Take one push; returns every answer ready now (an out-of-order APPEND waits)."""
        self._now_ms = now_ms
        if (
            self._leader_key[0] != self.state.current_term
            or self._leader_key[1] != self.state.leader_id
        ):
            out = self._on_leader_change()
        else:
            out = []
        code = self._check(req)
        if code is not None:
            self._event(DEBUG, "push.refused", req, push=req.type.value, code=code.name)
            out.append((token, self._resp(req, code)))
            return out
        kind = req.type
        if kind is PushType.APPEND:
            first = req.first_index
            if first == self.store.ledger_end_index + 1 and not self._ctrl:
                out.append((token, self._append(req)))  # the common case: in order, nothing queued
                if self._writes:
                    self._drain_writes(out)
            elif first <= self.store.ledger_end_index:
                out.append((token, self._already_written(req)))
            elif first in self._writes:
                out.append((token, self._resp(req, ResponseCode.REPEATED_PUSH)))
            else:
                self._writes[first] = (req, token, now_ms)
        elif kind is PushType.COMMIT:
            self._ctrl.append((req, token))
            self._work(out)
        elif kind is PushType.COMPARE or kind is PushType.TRUNCATE or kind is PushType.INSTALL:
            if self._writes:
                # DLedger clears the write queue: those pushes belong to an APPEND round
                # the leader has abandoned; UNKNOWN tells it nothing it must act on
                for wreq, wtok, _ in self._writes.values():
                    out.append((wtok, self._resp(wreq, ResponseCode.UNKNOWN)))
                self._writes.clear()
            self._ctrl.append((req, token))
            self._work(out)
        else:
            out.append((token, self._resp(req, ResponseCode.UNEXPECTED_ARGUMENT)))
        return out

    def _tick(self, now_ms: int) -> list[Answer]:
        """Periodic work: the abnormal-push check (DLedger checkAbnormalFuture)."""
        self._now_ms = now_ms
        out: list[Answer] = []
        if (
            self._leader_key[0] != self.state.current_term
            or self._leader_key[1] != self.state.leader_id
        ):
            out = self._on_leader_change()
        if self._ctrl or self._writes:
            self._work(out)
        if self._writes and now_ms - self._last_abnormal_check >= self.config.abnormal_check_ms:
            self._last_abnormal_check = now_ms
            self._check_abnormal(now_ms, out)
        return out

    # -- work -------------------------------------------------------------------------------
    def _on_leader_change(self) -> list[Answer]:
        """The term or leader moved on: queued pushes that no longer pass are answered."""
        self._sync_leader()
        out: list[Answer] = []
        if self._ctrl:
            keep = deque()
            for req, tok in self._ctrl:
                code = self._check(req)
                if code is None:
                    keep.append((req, tok))
                else:
                    out.append((tok, self._resp(req, code)))
            self._ctrl = keep
        if self._writes:
            for first in list(self._writes):
                req, tok, _ = self._writes[first]
                code = self._check(req)
                if code is not None:
                    del self._writes[first]
                    out.append((tok, self._resp(req, code)))
        return out

    def _work(self, out: list[Answer]) -> None:
        """Control requests first, then queued appends that are next in line."""
        while self._ctrl:
            req, tok = self._ctrl.popleft()
            code = self._check(req)
            if code is not None:
                out.append((tok, self._resp(req, code)))
            elif req.type is PushType.COMPARE:
                out.append((tok, self._compare(req)))
            elif req.type is PushType.TRUNCATE:
                out.append((tok, self._truncate(req)))
            elif req.type is PushType.INSTALL:
                out.append((tok, self._install(req)))
            else:
                out.append((tok, self._commit(req)))
        if self._writes:
            self._drain_writes(out)

    def _drain_writes(self, out: list[Answer]) -> None:
        writes = self._writes
        while writes:
            item = writes.pop(self.store.ledger_end_index + 1, None)
            if item is None:
                return
            req, tok, _ = item
            code = self._check(req)
            out.append((tok, self._resp(req, code) if code is not None else self._append(req)))

    def _follow_commit(self, leader_commit: int) -> None:
        index = min(leader_commit, self.matched_index)
        if index > self.store.committed_index:
            self.store.update_committed_index(index)

    def _append(self, req: PushEntryRequest) -> PushEntryResponse:
        """Write a push that starts exactly at ``ledger_end_index + 1``."""
        self._start_where_the_leader_does(req)
        return self._append_batch(req, req.batch)

    def _start_where_the_leader_does(self, req: PushEntryRequest) -> None:
        """A log that holds nothing after its begin (a reset, an install) takes the leader's
        position for its first entry.  Where the entry after a snapshot point lies depends
        on that entry's size (a segment's padding), and the reset may have placed it as an
        old leader's entry that never committed: the new leader's would be refused for good
        (the all-features simulation: COMPARE at the point succeeded, APPEND after it
        failed, again and again)."""
        store = self.store
        data = getattr(req.batch, "data", None)
        if not data or not store.is_empty or req.first_index != store.ledger_begin_index:
            return
        pos = req.batch.first_pos
        if pos == store.write_pos:
            return
        self._event(INFO, "append.repositioned", req, was=store.write_pos, pos=pos)
        store.reset(req.first_index, pos, store.ledger_end_term)
        if self.on_reset is not None:
            self.on_reset(req.first_index)

    def _append_batch(self, req: PushEntryRequest, batch: EntryBatch) -> PushEntryResponse:
        try:
            self.store.append_as_follower(batch)
        except LedgerError as exc:
            code = ResponseCode.INCONSISTENT_STATE if exc.code in _INCONSISTENT else exc.code
            self._event(WARNING, "append.refused", req, code=code.name, why=exc.message)
            return self._resp(req, code)
        self._sync_leader()
        last = req.first_index + req.count - 1
        if last > self.matched_index:
            self.matched_index = last
        self._follow_commit(req.commit_index)
        self._event(DEBUG, "append", req)
        return self._resp(req, ResponseCode.SUCCESS, last)

    def _already_written(self, req: PushEntryRequest) -> PushEntryResponse:
        """A push starting at or below our end: answer from what we hold (a missed ack,
        a duplicate, or a batch that overlaps our end and continues past it)."""
        store = self.store
        first, last, end = req.first_index, req.last_index, store.ledger_end_index
        if first < store.ledger_begin_index:
            return self._resp(req, ResponseCode.INCONSISTENT_STATE)
        data = req.batch.data
        overlap = min(last, end) - first + 1
        local = store.read_batch(first, 1 << 62, overlap).data
        if data[: len(local)] != local:
            self._event(WARNING, "append.differs", req)
            return self._resp(req, ResponseCode.INCONSISTENT_STATE)
        if last <= end:
            self._event(INFO, "append.already_written", req)
            self._sync_leader()
            if last > self.matched_index:
                self.matched_index = last
            self._follow_commit(req.commit_index)
            return self._resp(req, ResponseCode.SUCCESS, last)
        rest = EntryBatch(end + 1, last - end, data[len(local) :])
        resp = self._append_batch(req, rest)
        return resp

    def _term_at(self, index: int) -> int:
        """The term of our entry at ``index``; -1 when we do not hold it."""
        store = self.store
        return (
            store.get_term(index)
            if store.ledger_begin_index <= index <= store.ledger_end_index
            else -1
        )

    def _entry_matches(self, index: int, term: int, pos: int) -> bool:
        store = self.store
        if not store.ledger_begin_index <= index <= store.ledger_end_index:
            return False
        return store.get_term(index) == term and store.get_pos(index) == pos

    def _at_snapshot_point(self, index: int) -> bool:
        """``index`` is the last entry our snapshot covers (our log begins right after it).
        It is committed, so every later leader holds the same entry there (Leader
        Completeness): a COMPARE there matches, and a TRUNCATE there cuts what follows.
        Without the first, a leader that did not send the snapshot compared there, found no
        entry, and asked for a reset below our committed index, which we refuse; without
        the second, a log whose first entries are an old leader's uncommitted ones matched
        there and refused the cut: both for good.  Committed whatever our committed index
        says: a log begins only past committed entries (a leader's reset, a compaction),
        and a restart may find the committed index checkpointed before the reset (the
        all-features simulation: a learner reset to 559 came back committed at 554, its
        COMPARE at 558 refused, the leader's reset below its committed index refused, for
        good)."""
        return index == self.store.ledger_begin_index - 1 and index >= 0

    def _compare(self, req: PushEntryRequest) -> PushEntryResponse:
        """Do we hold the leader's entry at ``first_index``?  (Raft: then the whole prefix matches.)"""
        index = req.first_index
        if self._entry_matches(index, req.entry_term, req.entry_pos) or self._at_snapshot_point(
            index
        ):
            self._sync_leader()
            if index > self.matched_index:
                self.matched_index = index
            self._follow_commit(req.commit_index)
            code = ResponseCode.SUCCESS
            hint = (-1, -1)
        else:
            code = ResponseCode.INCONSISTENT_STATE
            hint = self._conflict_hint(index)
        self._event(INFO, "compare", req, code=code.name, hint=hint)
        return self._resp(req, code, conflict_term=hint[0], conflict_index=hint[1])

    def _conflict_hint(self, index: int) -> tuple[int, int]:
        """(term we hold at ``index`` -- or at our end when shorter --, first index of that
        term in our log); (-1, -1) when we hold nothing there."""
        store = self.store
        probe = min(index, store.ledger_end_index)
        if probe < store.ledger_begin_index:
            return -1, -1
        term = store.get_term(probe)
        return term, store.first_index_of_term(term)

    def _truncate(self, req: PushEntryRequest) -> PushEntryResponse:
        """Cut our log after the leader's entry at ``first_index`` (or reset it to start there)."""
        store = self.store
        index = req.first_index
        if index < self.matched_index or (req.reset and index <= self.matched_index):
            # a late copy (a duplicate, or one a replaced dispatcher sent) of a TRUNCATE this
            # leader has already moved past: it would drop entries we acknowledged to it
            self._event(INFO, "truncate.stale", req, matched=self.matched_index)
            return self._resp(req, ResponseCode.SUCCESS)
        after = index if req.reset else index + 1
        if store.ledger_begin_index <= after <= store.ledger_end_index and (
            store.get_term(after) == req.term
        ):
            # the entries it would cut are of the requester's own term: only its leader
            # writes them and a leader's log only grows, so they match it -- a late copy,
            # even one that reaches us after a restart took our memory (``matched_index``)
            self._event(INFO, "truncate.stale", req, own_term_from=after)
            return self._resp(req, ResponseCode.SUCCESS)
        try:
            if req.reset:
                if not (store.is_empty and store.ledger_begin_index == index
                        and store.write_pos == req.entry_pos):  # fmt: skip
                    store.reset(index, req.entry_pos, req.entry_term)
                    if self.on_reset is not None:
                        self.on_reset(index)
                if req.config is not None:  # what the leader's log had below its begin
                    self.state.config.reset(Configuration.decode(req.config), index - 1)
                matched = index - 1
            elif self._entry_matches(index, req.entry_term, req.entry_pos) or (
                self._at_snapshot_point(index)
            ):
                # at the snapshot point the log holds no entry to check, but the point is
                # committed, so it is the leader's entry too: what follows it (an old
                # leader's uncommitted entries) goes; the store refuses to cut below our
                # committed index
                store.truncate(index)
                matched = index
            else:
                self._event(WARNING, "truncate.differs", req)
                return self._resp(req, ResponseCode.INCONSISTENT_STATE)
        except LedgerError as exc:
            self._event(ERROR, "truncate.refused", req, why=exc)
            return self._resp(req, ResponseCode.INCONSISTENT_STATE)
        self._sync_leader()
        self.matched_index = matched
        self._follow_commit(req.commit_index)
        self._event(INFO, "truncate", req, reset=req.reset)
        return self._resp(req, ResponseCode.SUCCESS)

    def _install(self, req: PushEntryRequest) -> PushEntryResponse:
        """A chunk of the leader's snapshot (see :class:`~.install.InstallReceiver`); the
        answer's ``index`` is the stream offset held.  It touches no log entry: the leader
        resets our log with a TRUNCATE once the snapshot is sealed -- or, when our machine
        asked for it (``snapshot_wanted``), leaves our log as it is: the snapshot holds
        committed entries only, and so does what of our log the machine applies after it."""
        if self.installs is None or req.snapshot is None:
            self._event(WARNING, "install.unsupported", req)
            return self._resp(req, ResponseCode.UNSUPPORTED, 0)
        code, held = self.installs.take(req, self._now_ms)
        self._event(DEBUG, "install", req, code=code.name, held=held)
        return self._resp(req, code, held)

    def _commit(self, req: PushEntryRequest) -> PushEntryResponse:
        """Follow the leader's committed index; a COMMIT that names an entry (``first_index``)
        also proves we match the leader up to it (or, when we do not hold it, that we must
        be compared again)."""
        index = req.first_index
        if index >= 0:
            # an entry below our begin was compacted away (after a snapshot) or lies below a
            # reset: only committed entries leave a log that way, and the leader names a
            # committed entry -- the same one
            held = index < self.store.ledger_begin_index or self._entry_matches(
                index, req.entry_term, req.entry_pos
            )
            if not held:
                self._event(WARNING, "commit.unheld", req, held_term=self._term_at(index))
                return self._resp(req, ResponseCode.INCONSISTENT_STATE, index)
            if index > self.matched_index:
                self.matched_index = index
        self._follow_commit(req.commit_index)
        return self._resp(req, ResponseCode.SUCCESS, self.store.committed_index)

    def _check_abnormal(self, now_ms: int, out: list[Answer]) -> None:
        """Answer pushes we already hold; report the smallest long-missing gap as
        INCONSISTENT_STATE so the leader compares instead of waiting for resends."""
        writes = self._writes
        end = self.store.ledger_end_index
        for first in [k for k in writes if k <= end]:
            req, tok, _ = writes.pop(first)
            code = self._check(req)
            out.append(
                (tok, self._resp(req, code) if code is not None else self._already_written(req))
            )
        self._drain_writes(out)
        end = self.store.ledger_end_index
        if not writes or end + 1 in writes:
            return
        timeout = self.config.push_wait_timeout_ms
        gap = min((k for k, v in writes.items() if now_ms - v[2] >= timeout), default=None)
        if gap is None:
            return
        req, tok, _ = writes.pop(gap)
        self._event(WARNING, "append.gap", req, waited_ms=timeout, missing=f"{end + 1}..{gap - 1}")
        out.append((tok, self._resp(req, ResponseCode.INCONSISTENT_STATE)))
