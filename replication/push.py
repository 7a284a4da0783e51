"""EntryDispatcher: the leader's push state machine for one follower (sans-I/O).

DLedger runs one ``EntryDispatcher`` thread per follower; here the same logic is
a plain object the shell drives: it calls :meth:`EntryDispatcher.next_requests`
whenever something may have changed (a tick, an append, an answer) and sends
what comes back, then feeds every answer (or ``None`` for a failed call) to
:meth:`EntryDispatcher.on_response`.

States, as in DLedger's DLedgerEntryPusher.EntryDispatcher:

* COMPARE -- find where the follower's log stops matching the leader's, walking
  ``compare_index`` down from the leader's end (one COMPARE in flight).  A refusal
  carrying the follower's conflict hint (its term at the probe and that term's first
  index) skips a whole term at a time, as etcd's ``findConflictByTerm`` does.
* TRUNCATE -- cut the follower's log at the matching index (or reset it to the
  leader's begin when the logs do not overlap), then APPEND.
* INSTALL -- before such a reset, when the leader has a snapshot at or past the entry
  before its begin (its state machine's): send it in chunks, one in flight,
  resuming at the offset the follower holds; then the reset.  Without it a follower whose
  machine stands below the leader's begin could never apply again.  A failed or lost chunk
  goes back to TRUNCATE, which fetches the newest snapshot again (a lost chunk of the same
  snapshot resumes where the follower stands).  Also from APPEND, when the follower's
  answers say its machine stands below its log's begin (``snapshot_wanted``: the snapshot
  that bridged the gap was lost): our newest snapshot, if it reaches that far (else asked
  again later), and then APPEND again from the water mark -- the follower's log is left
  as it is, so no entry it acknowledged is ever dropped for it.
* APPEND -- push batches from ``write_index``, many in flight (pipelining),
  remembering when each was sent; resend the oldest after ``max_push_timeout_ms``;
  an INCONSISTENT_STATE answer sends the dispatcher back to COMPARE.  When no
  entries flow a COMMIT push carries the leader's committed index: :data:`COMMIT_LINGER_MS`
  after it rose (the next push carries it meanwhile, so a steady stream sends none), and
  at least every ``commit_push_interval_ms``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from enum import Enum
from logging import DEBUG, INFO, WARNING
from typing import Any

from rayledger.election.logevent import log_event
from rayledger.storage.errors import LedgerError, ResponseCode

from .config import ReplicationConfig
from .inflights import Inflights
from .leaderlog import LeaderLog, NotCached, batch_bytes
from .messages import PushEntryRequest, PushEntryResponse, PushType, SnapshotChunk

log = logging.getLogger("rayledger.replication")

_NEVER = -(1 << 62)

COMMIT_LINGER_MS = 20
"""How long a risen committed index waits for a push to carry it before a COMMIT does: the
next round's push, in a group that appends (one client's next append follows its answer
by a few hops).  An idle follower learns it this much later."""


class DispatcherState(str, Enum):
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"
    APPEND = "APPEND"
    INSTALL = "INSTALL"


def _peek_snapshot(log_: LeaderLog, at_least: int = -1) -> Any:
    """The leader's newest snapshot as the log offers it (None: it has none, or the log
    offers no snapshots at all); may raise NotCached.  ``at_least``: the index a
    follower's machine needs (the leader snapshots that far when its newest is short)."""
    peek = getattr(log_, "peek_snapshot", None)
    return None if peek is None else peek(at_least)


def _config_below(log_: LeaderLog, begin: int) -> bytes | None:
    """The leader's configuration in effect below ``begin``, which a reset follower no
    longer finds in its log (a log that offers none: None)."""
    at = getattr(log_, "config_at", None)
    return None if at is None else at(begin - 1)


def _snapshot_of(log_: LeaderLog) -> Any:
    """Take the snapshot :func:`_peek_snapshot` saw (a cache fetches the next one afresh)."""
    take = getattr(log_, "take_snapshot", None)
    return None if take is None else take()


def _span(resp: PushEntryResponse) -> str:
    return f"{resp.begin_index}..{resp.end_index}"


@dataclass(frozen=True, slots=True)
class FreshState:
    """The member is (``is_leader``) the leader ``leader_id`` of ``term``: a new term or
    leader starts over with a COMPARE (DLedger checkAndFreshState)."""

    term: int
    leader_id: str | None
    is_leader: bool


@dataclass(frozen=True, slots=True)
class NextPushes:
    """What to send now over the leader's ``log``; answers the pushes (pipelined pushes,
    a resend, a COMPARE/TRUNCATE/INSTALL or a COMMIT)."""

    log: LeaderLog


@dataclass(frozen=True, slots=True)
class FollowerAnswer:
    """The follower's answer to ``req`` (``resp`` None: the call failed or timed out)."""

    req: PushEntryRequest
    resp: PushEntryResponse | None


@dataclass(frozen=True, slots=True)
class Rewind:
    """Push again from the follower's water mark: the pushes in flight were lost with
    their transport."""


PushEvent = FreshState | NextPushes | FollowerAnswer | Rewind


class EntryDispatcher:
    """Leader side, one per follower: decides what to push to ``peer_id`` and when."""

    def __init__(self, group: str, self_id: str, peer_id: str, config: ReplicationConfig):
        self.group = group
        self.self_id = self_id
        self.peer_id = peer_id
        self.config = config
        self.term = -1
        self.leader_id: str | None = None
        self.active = False
        self._state = DispatcherState.COMPARE
        self._compare_index = -1
        self._write_index = -1
        self._water_mark = -1
        self._inflight = Inflights()  # APPEND pushes in flight, in index order
        self._ctrl: PushEntryRequest | None = None  # the COMPARE/TRUNCATE in flight
        self._ctrl_sent_ms = _NEVER
        self._truncate_index = -1
        self._truncate_reset = False
        self._backoff_until = _NEVER
        self._last_push_ms = _NEVER  # DLedger lastPushCommitTimeMs
        self._commit_sent = -1
        self._commit_rose_ms = _NEVER  # when the committed index passed _commit_sent
        self._last_leak_check_ms = _NEVER
        # the pacing bucket, in bytes (see _pace_allows)
        self._tokens: float = config.max_batch_push_bytes
        self._tokens_ms = _NEVER
        self._paced = False  # the push being built is paced (it spends tokens)
        self._held = False  # a push waits for the bucket (the only reason to wake for it)
        self._rate = config.peer_push_quota  # bytes/s the bucket refills at (learner or not)
        self._leader_begin = 0  # the leader's begin index when the last COMPARE was built
        # the follower's conflict hint (its term, that term's first index) still to apply to
        # _compare_index; applied when the next COMPARE is built, where reads may be retried
        self._hint: tuple[int, int] | None = None
        self._install: Any = None  # the snapshot being sent (index, term, files)
        self._install_offset = 0
        self._installed = -1  # the follower sealed our snapshot at this index (this term)
        self._install_resets = True  # the install leads to a reset (else: a machine asked)
        self._wanted = -1  # the follower's machine needs a snapshot at or past this index
        # not before then: none of ours reached that far, or one was just sealed (answers
        # from before the seal still ask)
        self._wanted_after = _NEVER
        self._wanted_commit = -1  # our committed index when none of ours reached that far
        self._install_started_ms = 0
        self.last_install: tuple[int, int, int] | None = None  # (index, bytes, ms) sent
        self.pushes_sent = 0
        self.resends = 0
        self.installs = 0
        self.need: NotCached | None = None  # what the last next_requests lacked

    # -- observers ----------------------------------------------------------------------
    @property
    def state(self) -> DispatcherState:
        return self._state

    @property
    def water_mark(self) -> int:
        """The follower's highest index known to match the leader's log (-1 when unknown)."""
        return self._water_mark

    @property
    def write_index(self) -> int:
        return self._write_index

    @property
    def compare_index(self) -> int:
        return self._compare_index

    @property
    def pending_pushes(self) -> int:
        return len(self._inflight)

    def __repr__(self) -> str:
        return (
            f"EntryDispatcher({self.self_id}->{self.peer_id} term={self.term} {self._state.value} "
            f"compare={self._compare_index} write={self._write_index} wm={self._water_mark} "
            f"pending={len(self._inflight)})"
        )

    def _event(self, level: int, event: str, index: int | None, **fields: Any) -> None:
        """One protocol log line: our id and term, the index it is about, the follower."""
        if log.isEnabledFor(level):
            ids = {"member": self.self_id, "term": self.term, "index": index, "peer": self.peer_id}
            log_event(log, level, event, **ids, **fields)

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: PushEvent, now_ms: int) -> Any:
        """Deliver one event at ``now_ms``; returns its direct answer (see each event)."""
        match ev:
            case NextPushes():
                return self._next_requests(now_ms, ev.log)
            case FollowerAnswer():
                return self._on_response(ev.req, ev.resp, now_ms)
            case FreshState():
                return self._check_and_fresh_state(ev.term, ev.leader_id, ev.is_leader)
            case Rewind():
                return self._rewind()
        raise TypeError(f"not a push event: {ev!r}")

    # -- state ------------------------------------------------------------------------------
    def _check_and_fresh_state(self, term: int, leader_id: str | None, is_leader: bool) -> None:
        """DLedger checkAndFreshState: a new term or leader starts over with a COMPARE."""
        if not is_leader or leader_id != self.self_id:
            self.active = False
            return
        was_active, self.active = self.active, True
        if term != self.term or leader_id != self.leader_id or not was_active:
            # a new term, or leading the same term again after a pause (DLedger lets a
            # candidate be re-elected in its term): what we knew about the follower is stale
            self._event(INFO, "push.fresh", None, new_term=term)
            self.term = term
            self.leader_id = leader_id
            self._water_mark = -1
            self._write_index = -1
            self._commit_sent = -1
            self._commit_rose_ms = _NEVER
            self._last_push_ms = _NEVER
            self._backoff_until = _NEVER
            self._tokens, self._tokens_ms = self.config.max_batch_push_bytes, _NEVER
            self._install, self._installed = None, -1
            self._wanted, self._wanted_after, self._wanted_commit = -1, _NEVER, -1
            self._change_state(DispatcherState.COMPARE, -1, force=True)

    def _change_state(self, target: DispatcherState, index: int, force: bool = False) -> None:
        """DLedger changeState: ``index`` is the follower's matching end when entering APPEND."""
        self._event(INFO, "push.state", index, old=self._state.value, new=target.value)
        if target is DispatcherState.APPEND:
            self._compare_index = -1
            if index > self._water_mark:
                self._water_mark = index
            self._write_index = index + 1
            self._inflight.clear()
        elif target is DispatcherState.COMPARE:
            if force or self._state is DispatcherState.APPEND:
                self._compare_index = -1
                self._inflight.clear()
        elif target is DispatcherState.TRUNCATE:
            self._compare_index = -1
        self._ctrl = None
        self._hint = None
        self._state = target

    # -- what to send -------------------------------------------------------------------
    def _next_requests(self, now_ms: int, log_: LeaderLog) -> list[PushEntryRequest]:
        """Everything to send now: pipelined pushes, a resend, a COMPARE/TRUNCATE or a COMMIT."""
        self.need = None
        if not self.active:
            return []
        try:
            if self._state is DispatcherState.APPEND:
                return self._append_requests(now_ms, log_)
            return self._control_request(now_ms, log_)
        except NotCached as exc:
            self.need = exc  # raised before any state changed: ask again once fetched
            return []
        except LedgerError as exc:
            # e.g. the entries to push were cleaned from the leader's log: compare again
            self._event(WARNING, "push.read_failed", self._write_index, why=exc)
            self._change_state(DispatcherState.COMPARE, -1, force=True)
            self._backoff_until = now_ms + self.config.error_backoff_ms
            return []

    def _base(self, kind: PushType, log_: LeaderLog, **fields: Any) -> PushEntryRequest:
        return PushEntryRequest(
            group=self.group,
            leader_id=self.self_id,
            remote_id=self.peer_id,
            term=self.term,
            type=kind,
            commit_index=log_.committed_index,
            **fields,
        )

    def _control_request(self, now_ms: int, log_: LeaderLog) -> list[PushEntryRequest]:
        if self._ctrl is not None:
            if now_ms - self._ctrl_sent_ms < self.config.compare_timeout_ms:
                return []
            ctrl, waited = self._ctrl, now_ms - self._ctrl_sent_ms
            self._event(WARNING, "ctrl.resend", ctrl.first_index, push=ctrl.type.value, ms=waited)
            self._ctrl = None
        if now_ms < self._backoff_until:
            return []
        begin, end = log_.ledger_begin_index, log_.ledger_end_index
        self._leader_begin = begin
        if self._hint is not None:
            self._apply_hint(log_, begin)
        if self._state is DispatcherState.TRUNCATE and self._needs_install(log_):
            self._install, self._install_offset = _snapshot_of(log_), 0
            self._install_started_ms, self._install_resets = now_ms, True
            self._change_state(DispatcherState.INSTALL, self._install.index)
        if self._state is DispatcherState.INSTALL:
            return [self._install_request(now_ms, log_)]
        if self._state is DispatcherState.TRUNCATE:
            index, kind = self._truncate_index, PushType.TRUNCATE
        else:
            if end < begin:
                return []  # nothing to compare yet (DLedger: compareIndex == -1 && end == -1)
            if self._compare_index == -1 or not begin <= self._compare_index <= end:
                self._compare_index = end
            index, kind = self._compare_index, PushType.COMPARE
        term, pos = log_.get_term(index), log_.get_pos(index)
        reset = kind is PushType.TRUNCATE and self._truncate_reset
        req = self._base(kind, log_, first_index=index, entry_term=term, entry_pos=pos, reset=reset,
                         config=_config_below(log_, index) if reset else None)  # fmt: skip
        self._ctrl = req
        self._ctrl_sent_ms = now_ms
        self._last_push_ms = now_ms
        self._event(DEBUG, "send", index, push=req.type.value, entry_term=req.entry_term)
        return [req]

    def _needs_install(self, log_: LeaderLog) -> bool:
        """A reset is due and the follower has not sealed a snapshot that bridges the gap
        below our begin: is there one?  (Reads the snapshot the log offers -- a fetch
        when the leader's view lacks it -- and keeps it for :meth:`_control_request`.)"""
        if not self._truncate_reset or self._installed >= self._truncate_index - 1:
            return False
        snap = _peek_snapshot(log_)
        if snap is None or snap.index < self._truncate_index - 1:
            self._event(INFO, "install.none", self._truncate_index,
                        snapshot=None if snap is None else snap.index)  # fmt: skip
            _snapshot_of(log_)  # forget it: the next reset asks afresh
            self._installed = self._truncate_index - 1  # nothing bridges it: reset plainly
            return False
        return True

    def _machine_install_due(self, now_ms: int, log_: LeaderLog) -> bool:
        """Whether to look for a snapshot for the follower's machine now: it asks, and our
        last look found none that far a COMMIT interval ago with our committed index moved
        since (a newer snapshot comes only as our machine applies more), or ten ago."""
        if self._wanted < 0 or now_ms < self._wanted_after:
            return False
        idle = self._wanted_after + 9 * self.config.commit_push_interval_ms
        return log_.committed_index > self._wanted_commit or now_ms >= idle

    def _machine_install(self, now_ms: int, log_: LeaderLog) -> bool:
        """The follower's machine needs a snapshot at or past ``_wanted`` though our logs
        match: start sending our newest when it reaches that far (True).  None does yet
        (the follower's own snapshots, or another leader's, went further than ours): look
        again later (:meth:`_machine_install_due`).  May raise NotCached before any change."""
        snap = _peek_snapshot(log_, self._wanted)
        if snap is None or snap.index < self._wanted:
            self._event(DEBUG, "install.none", self._wanted,
                        snapshot=None if snap is None else snap.index)  # fmt: skip
            _snapshot_of(log_)  # forget it: the next try asks afresh
            self._wanted_after = now_ms + self.config.commit_push_interval_ms
            self._wanted_commit = log_.committed_index
            return False
        self._event(INFO, "install.wanted", snap.index, wanted=self._wanted, wm=self._water_mark)
        self._install, self._install_offset = _snapshot_of(log_), 0
        self._install_started_ms, self._install_resets = now_ms, False
        self._change_state(DispatcherState.INSTALL, snap.index)
        return True

    def _install_request(self, now_ms: int, log_: LeaderLog) -> PushEntryRequest:
        snap, offset = self._install, self._install_offset
        total = sum(f[1] for f in snap.files)
        chunk = SnapshotChunk(snap.index, snap.term, tuple(snap.files), offset,
                              min(self.config.install_chunk_bytes, total - offset))  # fmt: skip
        req = self._base(PushType.INSTALL, log_, first_index=snap.index, entry_term=snap.term,
                         snapshot=chunk)  # fmt: skip
        self._ctrl, self._ctrl_sent_ms, self._last_push_ms = req, now_ms, now_ms
        self._event(DEBUG, "send", snap.index, push="INSTALL", offset=offset, total=total)
        return req

    def _apply_hint(self, log_: LeaderLog, begin: int) -> None:
        """Move ``_compare_index`` down past every index the hint proves cannot match.

        The follower holds ``term`` on ``[first, probe]`` and only smaller terms below
        ``first``; terms never decrease along a log.  So every leader entry above the last
        one of a term <= ``term`` differs from the follower's, and when that entry's term
        is below ``term`` so does every one from ``first`` up.  The next COMPARE is at the
        highest index that may still match, never below the real match point (Log
        Matching is still checked by that COMPARE).  Reads come first: a NotCached leaves
        the hint in place for the retry.
        """
        term, first = self._hint  # type: ignore[misc]
        j = self._compare_index
        if j >= begin and log_.get_term(j) > term:
            if log_.get_term(begin) > term:
                j = begin - 1
            else:
                lo, hi = begin, j  # term(lo) <= term < term(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if log_.get_term(mid) <= term:
                        lo = mid
                    else:
                        hi = mid
                j = lo
        if begin <= first <= j and log_.get_term(j) < term:
            j = first - 1
        self._hint = None
        self._compare_index = j
        if j < begin:
            self._change_state(DispatcherState.TRUNCATE, begin)
            self._truncate_index, self._truncate_reset = begin, True

    def _append_requests(self, now_ms: int, log_: LeaderLog) -> list[PushEntryRequest]:
        """DLedger doAppend: resend the oldest push when overdue, push what is new, and when
        nothing flows a COMMIT with our committed index."""
        if now_ms < self._backoff_until:
            return []
        if self._machine_install_due(now_ms, log_) and self._machine_install(now_ms, log_):
            return [self._install_request(now_ms, log_)]
        out = self._resend_overdue(now_ms, log_)
        end = log_.ledger_end_index
        self._push_new(now_ms, end, log_, out)
        if out:
            self._last_push_ms = now_ms
            self._commit_sent = log_.committed_index
            self._commit_rose_ms = _NEVER
            self.pushes_sent += len(out)
            return out
        if log_.committed_index > self._commit_sent and self._commit_rose_ms == _NEVER:
            self._commit_rose_ms = now_ms
        if self._write_index > end and (
            (self._commit_rose_ms != _NEVER and now_ms - self._commit_rose_ms >= COMMIT_LINGER_MS)
            or now_ms - self._last_push_ms >= self.config.commit_push_interval_ms
        ):
            req = self._commit_request(log_)
            out.append(req)
            self._last_push_ms = now_ms
            self._commit_sent = req.commit_index
            self._commit_rose_ms = _NEVER
        return out

    def _resend_overdue(self, now_ms: int, log_: LeaderLog) -> list[PushEntryRequest]:
        """DLedger doCheckAppendResponse: the oldest push unanswered too long goes again;
        pushes the water mark covers are forgotten (at the pipeline's limit or now and then)."""
        cfg = self.config
        inflight = self._inflight
        oldest = inflight.oldest()
        out: list[PushEntryRequest] = []
        if oldest is None:
            return out
        if now_ms - oldest.sent_ms > cfg.max_push_timeout_ms:
            first, last = oldest.first, oldest.last
            if last <= self._water_mark:
                inflight.drop(first)
            else:
                batch = log_.read_batch(first, 1 << 62, last - first + 1)
                out.append(self._append_request(batch, oldest.nbytes, log_))
                oldest.sent_ms = now_ms
                self.resends += 1
                self._event(WARNING, "append.resend", first, last=last, wm=self._water_mark)
        if (
            len(inflight) >= cfg.max_pending_pushes
            or now_ms - self._last_leak_check_ms >= cfg.leak_check_interval_ms
        ):
            inflight.prune(self._water_mark)
            self._last_leak_check_ms = now_ms
        return out

    def _push_new(
        self, now_ms: int, end: int, log_: LeaderLog, out: list[PushEntryRequest]
    ) -> None:
        """Pipeline batches from ``write_index`` up to ``end`` while the pipeline and the
        quota allow; a batch the leader's cache lacks stops here (``need``)."""
        cfg = self.config
        inflight = self._inflight
        while self._write_index <= end and len(inflight) < cfg.max_pending_pushes:
            start = self._write_index
            try:
                # the batch first: one the leader's cache lacks is fetched while the pace waits
                batch = log_.read_batch(start, cfg.max_batch_push_bytes, cfg.max_batch_push_count)
                if not self._pace_allows(now_ms, end, log_):
                    break
            except NotCached as exc:
                self.need = exc  # send what was built; the shell fetches the rest
                break
            last = start + batch.count - 1
            nbytes = batch_bytes(batch)
            out.append(self._append_request(batch, nbytes, log_))
            inflight.add(start, last, nbytes, now_ms)
            self._write_index = last + 1
            if self._paced:
                self._tokens -= nbytes

    def _commit_request(self, log_: LeaderLog) -> PushEntryRequest:
        """Unlike DLedger, a COMMIT names an entry the follower is known to hold (like Raft's
        prevLogIndex): a follower that restarted learns it matches us there and may follow
        our committed index, and one that does not gets us to COMPARE."""
        check = min(log_.committed_index, self._water_mark)
        if check < log_.ledger_begin_index:
            return self._base(PushType.COMMIT, log_)
        term, pos = log_.get_term(check), log_.get_pos(check)
        return self._base(PushType.COMMIT, log_, first_index=check, entry_term=term, entry_pos=pos)

    def _append_request(self, batch: Any, nbytes: int, log_: LeaderLog) -> PushEntryRequest:
        first, count = batch.first_index, batch.count
        fields = {"first_index": first, "count": count, "batch": batch, "batch_bytes": nbytes}
        req = self._base(PushType.APPEND, log_, **fields)
        self._event(DEBUG, "send", first, push=req.type.value, last=req.last_index)
        return req

    def _to_learner(self, log_: LeaderLog) -> bool:
        """Whether the follower is a learner in the leader's latest configuration (a log
        that knows of no configurations: never)."""
        learner = getattr(log_, "is_learner", None)
        return learner is not None and learner(self.peer_id)

    def _refill(self, now_ms: int, quota: int) -> None:
        if self._tokens_ms == _NEVER:
            self._tokens_ms = now_ms
        elif now_ms > self._tokens_ms:
            cap = self.config.max_batch_push_bytes
            self._tokens = min(cap, self._tokens + (now_ms - self._tokens_ms) * quota / 1000)
            self._tokens_ms = now_ms

    def _pace_allows(self, now_ms: int, end: int, log_: LeaderLog) -> bool:
        """DLedger's checkQuotaAndWait, smoothed: a follower lagging more than the throttle
        point (a learner: always -- its catch-up must never hold back the voters' rounds)
        gets at most its quota of bytes per second, so it cannot starve the others.

        DLedger lets a second's whole quota go at once and then waits out the second; here
        a token bucket refills continuously and holds one batch's worth at most, and a
        batch goes once it is full, so the pushes are spread evenly over the second instead
        of arriving as one burst that stalls every process on the host meanwhile.  Only
        paced pushes spend tokens; the lag is measured only when they have run out."""
        to_learner = self._to_learner(log_)
        cfg = self.config
        self._rate = quota = cfg.learner_push_quota if to_learner else cfg.peer_push_quota
        self._refill(now_ms, quota)
        self._paced = True
        self._held = False
        if self._tokens >= self.config.max_batch_push_bytes:
            return True
        if not to_learner:
            lag = log_.get_pos(end) - log_.get_pos(self._write_index)
            if lag <= cfg.peer_push_throttle_point:
                self._paced = False
                return True
        self._held = True
        self._event(DEBUG, "append.paced", self._write_index, tokens=self._tokens)
        return False

    def _pace_due_ms(self) -> int | None:
        """When the bucket is full again for the push it holds back (None: it holds none
        back).  The bucket refills only as pushes are built, so a bucket left short by the
        last paced push, with nothing more to send, must not set a wake-up: it would be in
        the past for good, and the dispatcher woke every millisecond on an idle group."""
        short = self.config.max_batch_push_bytes - self._tokens
        if not self._held or short <= 0 or self._tokens_ms == _NEVER:
            return None
        return self._tokens_ms + math.ceil(short * 1000 / max(1, self._rate))

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When :meth:`next_requests` may next have something to send without a new event
        (a resend, a COMMIT, a COMPARE again, the end of a backoff); None when inactive."""
        if not self.active:
            return None
        cfg = self.config
        if self._backoff_until > now_ms:
            return self._backoff_until
        if self._state is DispatcherState.APPEND:
            due = self._last_push_ms + cfg.commit_push_interval_ms
            if self._commit_rose_ms != _NEVER:
                due = min(due, self._commit_rose_ms + COMMIT_LINGER_MS)
            oldest = self._inflight.oldest()
            if oldest is not None:
                due = min(due, oldest.sent_ms + cfg.max_push_timeout_ms + 1)
            paced = self._pace_due_ms()
            if paced is not None:
                due = min(due, paced)
            if self._wanted >= 0 and self._wanted_after > now_ms:
                due = min(due, self._wanted_after)
        elif self._ctrl is not None:
            due = self._ctrl_sent_ms + cfg.compare_timeout_ms + 1
        else:
            # nothing in flight: a COMPARE is due, or there is nothing to compare yet
            due = self._last_push_ms + cfg.commit_push_interval_ms
        return max(now_ms + 1, due)

    def _rewind(self) -> None:
        """Push again from the follower's water mark (pushes in flight were lost with their
        transport): the follower answers a push it already holds from its log."""
        if self.active and self._state is DispatcherState.APPEND:
            self._change_state(DispatcherState.APPEND, self._water_mark)

    # -- answers --------------------------------------------------------------------------
    def _on_response(
        self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int
    ) -> None:
        """Feed the follower's answer to ``req`` (``None``: the call failed or timed out)."""
        if not self.active or req.term != self.term:
            return
        if resp is not None:
            self._note_wanted(resp)
        if req.type is PushType.APPEND:
            self._on_append_response(req, resp, now_ms)
        elif req.type in (PushType.COMPARE, PushType.TRUNCATE, PushType.INSTALL):
            ctrl = self._ctrl
            if (
                ctrl is None
                or ctrl.type is not req.type
                or ctrl.first_index != req.first_index
                or ctrl.snapshot != req.snapshot
            ):
                return  # an answer to a control push we no longer wait for
            self._ctrl = None
            if req.type is PushType.COMPARE:
                self._on_compare_response(req, resp, now_ms)
            elif req.type is PushType.TRUNCATE:
                self._on_truncate_response(req, resp, now_ms)
            else:
                self._on_install_response(req, resp, now_ms)
        elif (
            resp is not None
            and resp.code == ResponseCode.INCONSISTENT_STATE
            and self._state is DispatcherState.APPEND
        ):
            # the follower does not hold the entry the COMMIT named: find where we match
            self._event(WARNING, "commit.unheld", req.first_index, span=_span(resp))
            self._change_state(DispatcherState.COMPARE, -1)

    def _note_wanted(self, resp: PushEntryResponse) -> None:
        """What the follower's machine needs, as its latest answer says: nothing, or a
        snapshot at or past an index.  (Not an index compared with what it sealed: a
        restart may find that snapshot damaged again.)"""
        wanted = resp.snapshot_wanted
        if wanted >= 0 and self._wanted < 0:
            self._event(INFO, "install.asked", wanted, span=_span(resp))
        self._wanted = wanted

    def _on_append_response(
        self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int
    ) -> None:
        if resp is None:
            # the call failed (the follower is down or restarting, the link is cut): after a
            # pause, push again from the water mark instead of resending each push in flight
            # one timeout after another
            if self._state is DispatcherState.APPEND and req.first_index in self._inflight:
                self._event(INFO, "append.no_answer", req.first_index, last=req.last_index)
                self._change_state(DispatcherState.APPEND, self._water_mark)
                self._backoff_until = now_ms + self.config.error_backoff_ms
            return
        code = resp.code
        if code == ResponseCode.SUCCESS:
            self._inflight.ack(req.first_index, req.last_index)
            index = min(resp.index, req.last_index)
            if index > self._water_mark:
                self._water_mark = index
        elif code == ResponseCode.INCONSISTENT_STATE:
            if self._state is DispatcherState.APPEND and req.first_index in self._inflight:
                self._event(INFO, "append.inconsistent", req.first_index, span=_span(resp))
                self._change_state(DispatcherState.COMPARE, -1)
        elif code != ResponseCode.REPEATED_PUSH and code != ResponseCode.UNKNOWN:
            # UNKNOWN: the follower dropped the push for a COMPARE/TRUNCATE; nothing to do
            self._event(WARNING, "append.refused", req.first_index, code=ResponseCode(code).name)

    def _on_compare_response(
        self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int
    ) -> None:
        if resp is None or resp.code not in (ResponseCode.SUCCESS, ResponseCode.INCONSISTENT_STATE):
            self._backoff(req, resp, now_ms)
            return
        compare_index = req.first_index
        self._compare_index = compare_index
        begin = self._leader_begin
        truncate_index = -1
        reset = False
        if resp.code == ResponseCode.SUCCESS:
            if compare_index == resp.end_index:
                self._change_state(DispatcherState.APPEND, compare_index)
                return
            truncate_index = compare_index  # the follower has more: cut after the match
        elif resp.end_index < begin:
            truncate_index, reset = begin, True  # follower entirely below our log
        elif compare_index < resp.begin_index:
            truncate_index, reset = begin, True  # follower's log starts above what we compare
        elif compare_index > resp.end_index:
            self._compare_index = resp.end_index  # jump to the follower's end
        else:
            self._compare_index = compare_index - 1  # step back
        if truncate_index == -1 and self._compare_index < begin:
            truncate_index, reset = begin, True
        elif truncate_index == -1 and resp.conflict_term >= 0:
            # the follower's hint: applied when the next COMPARE is built (it reads our log)
            if resp.begin_index <= resp.conflict_index <= min(compare_index, resp.end_index):
                self._hint = (resp.conflict_term, resp.conflict_index)
        code = ResponseCode(resp.code).name
        self._event(INFO, "compare", compare_index, code=code, span=_span(resp), hint=self._hint)
        if truncate_index != -1:
            self._change_state(DispatcherState.TRUNCATE, truncate_index)
            self._truncate_index = truncate_index
            self._truncate_reset = reset

    def _on_truncate_response(
        self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int
    ) -> None:
        if resp is None or resp.code != ResponseCode.SUCCESS:
            self._backoff(req, resp, now_ms)
            self._change_state(DispatcherState.COMPARE, -1, force=True)
            return
        index = min(resp.end_index, req.first_index)
        self._change_state(DispatcherState.APPEND, index)

    def _on_install_response(
        self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int
    ) -> None:
        """The follower holds ``resp.index`` bytes of the snapshot: send from there, or,
        all of it sealed, reset its log to our begin -- or, when its machine asked for it,
        push again from its water mark (its log matches ours).  A follower that takes no
        snapshots (UNSUPPORTED: it runs no machine) gets the plain reset; any other failure
        goes back to TRUNCATE after a pause, which fetches the newest snapshot again (a
        machine's install: to APPEND, and it is tried again while the follower asks)."""
        chunk = req.snapshot
        resets = self._install_resets
        if resp is not None and resp.code == ResponseCode.SUCCESS:
            if resp.index >= chunk.total:
                self._installed = chunk.index
                # answers to pushes sent before the seal may still ask: heard after a while
                self._wanted, self._wanted_commit = -1, -1
                self._wanted_after = now_ms + self.config.compare_timeout_ms
                self.installs += 1
                self.last_install = (chunk.index, chunk.total, now_ms - self._install_started_ms)
                self._event(INFO, "install.done", chunk.index, bytes=chunk.total, reset=resets)
                if resets:
                    self._change_state(DispatcherState.TRUNCATE, self._truncate_index)
                else:
                    self._install = None
                    self._change_state(DispatcherState.APPEND, self._water_mark)
            else:
                self._install_offset = max(0, resp.index)
            return
        if resp is not None and resp.code == ResponseCode.UNSUPPORTED:
            self._event(WARNING, "install.unsupported", chunk.index)
            if resets:
                self._installed = self._truncate_index - 1
            else:
                self._wanted_after = now_ms + self.config.commit_push_interval_ms
        else:
            self._backoff(req, resp, now_ms)
        self._install = None
        if resets:
            self._change_state(DispatcherState.TRUNCATE, self._truncate_index)
        else:
            self._change_state(DispatcherState.APPEND, self._water_mark)

    def _backoff(self, req: PushEntryRequest, resp: PushEntryResponse | None, now_ms: int) -> None:
        code = "no answer" if resp is None else ResponseCode(resp.code).name
        self._event(WARNING, "ctrl.backoff", req.first_index, push=req.type.value, code=code)
        self._backoff_until = now_ms + self.config.error_backoff_ms
