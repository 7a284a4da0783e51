"""LedgerClient: appends and committed reads against whichever member leads.

A client is thread-safe, and one client shared by many threads (or coroutines,
through :meth:`LedgerClient.append_async`) coalesces their appends, like a Kafka
producer: an append joins a queue, and a sender thread sends everything queued
as one call to the leader as soon as one of its ``max_in_flight`` call slots is
free (no linger when the client is idle).  Every append still gets its own
result or its own error.

It follows ``NOT_LEADER`` answers (and asks every member who leads when it has
no hint) until the append's deadline.  It retries an append only when the
append certainly did not happen (the member refused it before storing
anything); when a call's outcome is unknown -- the member died or the quorum
wait failed mid-call -- every append of that call raises
:class:`OutcomeUnknownError` instead of risking a silent duplicate.  A call
refused for bad input (a too-large entry, say) is split, so only the appends
that are wrong get the error.

An idempotent client (the default; ``idempotent=False`` opts out) gives every append an identity:
its session's client id and the sequence numbers of its entries, assigned when the append is first
sent, in the order calls reach Ray.  A leader writes them into the entries and answers a retry of
entries already in its log with where they are.  So such a client retries an unknown outcome -- a
member died, a term ended, a quorum wait timed out -- under the same identity, against whichever
member leads, until the append's deadline; ``OutcomeUnknownError`` is left when the deadline runs
out, or when a leader's refusal shows that no retry of that identity can be answered any more.  An
append that ends without an answer (its deadline, a refusal for good) may leave a hole in its
session's sequences, which a leader would refuse (OUT_OF_ORDER_SEQUENCE) for every later one: the
client then leaves the session behind, and its appends that cannot be stored anywhere go on in a new
one, while those that may be stored keep their identity (never sent under another).  Those decisions
are made in :mod:`rayledger.actors.core.client_session` (sans-I/O, shared with the simulation's
clients).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from rayledger.actors.core.client_session import (
    RETRY_BEFORE_STORE,
    Action,
    Answered,
    GaveUp,
    Outcome,
    Sending,
    SessionLanes,
    SessionOut,
    outcome_of,
)
from rayledger.actors.core.reads import Consistency
from rayledger.actors.core.rounds import Spread
from rayledger.actors.naming import NAMESPACE, group_members, member_handle
from rayledger.actors.types import AppendResult, AppendResults
from rayledger.election import Role
from rayledger.replication.sessions import NONCE_BITS, new_client_id
from rayledger.storage import (
    Entry,
    InvalidRequestError,
    LedgerError,
    NotLeaderError,
    OutcomeUnknownError,
    ResponseCode,
)

log = logging.getLogger("rayledger.actors")

_RETRY_BEFORE_STORE = RETRY_BEFORE_STORE
_BYTES = (bytes, bytearray, memoryview)


@dataclass(eq=False)
class _Pending:
    """One caller's append: its bodies, its deadline and the future it waits on."""

    bodies: list
    deadline: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    sent: bool = False  # a call carrying it reached Ray: from then on its outcome may be unknown
    alone: bool = False  # send it in a call of its own (its batch was refused as bad input)
    last_error: Exception | None = None
    # an idempotent client's (client id, first sequence) of the call carrying it last, as
    # its session core (``LedgerClient._sessions``) numbered it
    ident: tuple[int, int] | None = None


def _random_id() -> int:
    """A new session's client id: when it begins, and random bits."""
    return new_client_id(int(time.time() * 1000), secrets.randbits(NONCE_BITS))


def _settle(p: _Pending, result: list | None = None, exc: BaseException | None = None) -> bool:
    """Give ``p`` its outcome unless it already has one; True when this one did.

    The call's answer, the caller's deadline (:meth:`LedgerClient._expire`) and an
    ``append_future`` caller's ``cancel()`` race from different threads, so checking
    ``done()`` first is not enough: the future itself decides, and the loser's
    ``InvalidStateError`` is swallowed so it never stops the other appends of a call
    from being settled.
    """
    try:
        if exc is not None:
            p.future.set_exception(exc)
        else:
            p.future.set_result(result)
    except concurrent.futures.InvalidStateError:
        return False
    return True


def _check_bodies(bodies) -> list:
    if isinstance(bodies, (*_BYTES, str)) or not isinstance(bodies, Sequence):
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"bodies must be a list of bytes, not {type(bodies).__name__}",
        )
    bodies = list(bodies)
    if not bodies:
        raise LedgerError.of(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "the batch has no entries")
    for i, b in enumerate(bodies):
        if not isinstance(b, _BYTES):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"body {i} must be bytes, not {type(b).__name__}"
            )
    return bodies


class LedgerClient:
    def __init__(
        self,
        group: str,
        members: Sequence[str],
        timeout_s: float = 30.0,
        *,
        max_in_flight: int = 4,
        max_batch_entries: int = 20_000,
        max_batch_bytes: int = 4 << 20,
        discover: bool = True,
        idempotent: bool = True,
    ):
        self.group = group
        self.members = list(members)
        # look the group's members up again when none of these leads (members are added
        # and removed while a group runs); False keeps the client to ``members``
        self.discover = discover
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.max_batch_entries = max_batch_entries
        self.max_batch_bytes = max_batch_bytes
        self._handles: dict[str, object] = {}
        self._leader: str | None = None
        self._probe = 0
        self._cv = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._in_flight = 0
        self._sender: threading.Thread | None = None
        self._closed = False
        self._backoff_until = 0.0
        # exactly-once appends: which identity each append carries, decided by the sans-I/O
        # core (used under ``_cv``), one session per call in flight (its lanes: Ray may start
        # a member's calls in any order, and a leader takes a session's sequences only in
        # order); the send lock keeps numbering and handing to Ray in one order
        self.idempotent = idempotent
        self._send_lock = threading.Lock()
        self._sessions = SessionLanes(_random_id, max_in_flight) if idempotent else None
        self.retried = 0  # entries sent again after an unknown outcome

    @property
    def client_id(self) -> int:
        """The id of the session new appends go in (0 for a plain client)."""
        return self._sessions.client_id if self._sessions is not None else 0

    @property
    def sessions_started(self) -> int:
        """Sessions this client started: one, plus one per session it left behind."""
        return self._sessions.sessions_started if self._sessions is not None else 0

    def _session_step(self, event) -> SessionOut:
        """One event into the session core (called with ``_cv`` held); logs a session left."""
        out = self._sessions.step(event)
        self._log_left(out)
        return out

    def _answered(self, batch: list[_Pending], outcome: Outcome) -> SessionOut:
        """A numbered call ended (called with ``_cv`` held): its outcome into the session
        core, which frees its lane for the next call."""
        return self._session_step(Answered(tuple(batch), outcome))

    def _log_left(self, out: SessionOut) -> None:
        if out.left_behind is not None:
            log.info("client of %s: session %d left behind (%s); appends stored nowhere go on "
                     "in session %d", self.group, out.left_behind, out.why.value, out.started)  # fmt: skip

    def _number(self, batch: list[_Pending]) -> SessionOut | None:
        """The identity of a call carrying ``batch`` (called with the send lock and ``_cv``
        held): an append that may be stored, or whose sequences are in line, keeps its own
        (and goes alone); the others take the current session's next sequences."""
        if not self.idempotent or self._sessions is None:
            return None
        out = self._session_step(Sending(tuple(batch), tuple(len(p.bodies) for p in batch)))
        for p, ident in zip(batch, out.idents, strict=True):
            p.ident = ident
        return out

    def _sendable(self) -> bool:
        """Whether the queue's head may go now (called with ``_cv`` held): a call slot is
        free and so is the head's session lane."""
        return (
            bool(self._queue)
            and self._in_flight < self.max_in_flight
            and (self._sessions is None or self._sessions.sendable(self._queue[0]))
        )

    def _pinned(self, p: _Pending) -> bool:
        """``p`` goes in a call of its own under its identity (called with ``_cv`` held)."""
        return self.idempotent and self._sessions is not None and self._sessions.pinned(p)

    def _maybe_stored(self, p: _Pending) -> bool:
        """A call carrying ``p`` ended with an unknown outcome (called with ``_cv`` held)."""
        return self._sessions is not None and self._sessions.maybe_stored(p)

    def _ended(self, p: _Pending, f: concurrent.futures.Future) -> None:
        """``p``'s future was settled (on the settling thread): when not with its results,
        its session core hears it was given up (a deadline, a cancel, a close)."""
        if f.cancelled() or f.exception() is not None:
            with self._cv:
                self._session_step(GaveUp(p))

    @classmethod
    def connect(cls, group: str, timeout_s: float = 30.0, idempotent: bool = True) -> LedgerClient:
        """A client for a running group, from any driver or Ray job (``idempotent``: see
        the module's docstring)."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        members = group_members(group)
        if not members:
            raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no group named {group!r} is running")
        return cls(group, members, timeout_s=timeout_s, idempotent=idempotent)

    def _handle(self, member: str):
        return member_handle(self._handles, self.group, member)

    def _refresh_members(self) -> None:
        """The group's members as its named actors say now (members are added and removed
        while the group runs); kept as they were when none is found."""
        if not self.discover:
            return
        try:
            found = group_members(self.group)
        except Exception:  # the GCS is unreachable for a moment
            return
        if found and found != self.members:
            log.info("client of %s: members %s -> %s", self.group, self.members, found)
            self.members = found
            self._handles = {m: h for m, h in self._handles.items() if m in found}

    def _find_leader(self, timeout_s: float = 1.0) -> str | None:
        """Ask every member at once; the highest-term member that says it leads (the
        member list is looked up again when none does, or one follows a member unknown
        here)."""
        leader = self._ask_leader(timeout_s)
        if leader is None or leader not in self.members:
            self._refresh_members()
            if leader is None:
                leader = self._ask_leader(timeout_s)
        return leader if leader in self.members else None

    def _ask_leader(self, timeout_s: float) -> str | None:
        refs = {}
        for m in self.members:
            try:
                refs[m] = self._handle(m).status.remote()
            except ValueError:
                self._handles.pop(m, None)
        best = hint = None
        pending = list(refs.values())
        by_ref = {r: m for m, r in refs.items()}
        deadline = time.monotonic() + timeout_s
        while pending:
            ready, pending = ray.wait(
                pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                break
            try:
                s = ray.get(ready[0])
            except Exception:
                continue
            if s.role == Role.LEADER and (best is None or s.term > best[0]):
                best = (s.term, by_ref[ready[0]])
            elif s.leader_id is not None and (hint is None or s.term > hint[0]):
                hint = (s.term, s.leader_id)  # who a follower follows
            if len(refs) - len(pending) > len(refs) // 2:
                # a majority answered: a higher-term leader would be known to it, and with
                # none yet, asking again soon beats waiting for a dead member's answer
                break
        if hint is not None and (best is None or hint[0] > best[0]):
            best = hint  # a member that still says it leads an older term is stale
        return best[1] if best else None

    def _target(self) -> str:
        if self._leader is None:
            self._leader = self._find_leader()
        if self._leader is None:
            self._probe += 1
            return self.members[self._probe % len(self.members)]
        return self._leader

    # -- appends ------------------------------------------------------------------------------
    def append(self, body: bytes, timeout_s: float | None = None) -> AppendResult:
        """Append one entry; returns where it landed once it is committed."""
        if not isinstance(body, _BYTES):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"body must be bytes, not {type(body).__name__}"
            )
        return self.append_batch([body], timeout_s)[0]

    def append_batch(
        self, bodies: Sequence[bytes], timeout_s: float | None = None
    ) -> AppendResults:
        """Append a batch as one unit; returns once the whole batch is committed, where each
        entry landed (a sequence of :class:`AppendResult`, kept as columns)."""
        p = self._submit(bodies, timeout_s)
        try:
            return p.future.result(timeout=max(0.0, p.deadline - time.monotonic()) + 0.05)
        except concurrent.futures.TimeoutError:
            exc = self._expire(p)
        if exc is None:
            return p.future.result()
        raise exc

    async def append_async(self, body: bytes, timeout_s: float | None = None) -> AppendResult:
        """``append`` for async drivers and Ray actors: awaits without blocking the loop."""
        if not isinstance(body, _BYTES):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"body must be bytes, not {type(body).__name__}"
            )
        return (await self.append_batch_async([body], timeout_s))[0]

    async def append_batch_async(
        self, bodies: Sequence[bytes], timeout_s: float | None = None
    ) -> AppendResults:
        p = self._submit(bodies, timeout_s)
        fut = asyncio.wrap_future(p.future)
        try:
            return await asyncio.wait_for(
                asyncio.shield(fut), max(0.0, p.deadline - time.monotonic()) + 0.05
            )
        except asyncio.TimeoutError:
            exc = self._expire(p)
        if exc is None:
            return p.future.result()
        raise exc

    def append_future(
        self, bodies: Sequence[bytes], timeout_s: float | None = None
    ) -> concurrent.futures.Future:
        """Queue a batch and return at once; the future gives :class:`AppendResults` or raises.

        Use it to keep many appends in flight from one thread.
        """
        return self._submit(bodies, timeout_s).future

    def _submit(self, bodies, timeout_s: float | None) -> _Pending:
        bodies = _check_bodies(bodies)
        p = _Pending(bodies, time.monotonic() + (timeout_s or self.timeout_s))
        if self._sessions is not None:
            p.future.add_done_callback(functools.partial(self._ended, p))
        with self._cv:
            if self._closed:
                raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "the client is closed")
            if (
                not self._queue
                and self._in_flight < self.max_in_flight
                and self._leader is not None
                and time.monotonic() >= self._backoff_until
            ):
                # nothing to coalesce with: send from this thread, no hand-off
                self._in_flight += 1
                direct = True
            else:
                direct = False
        if direct:
            self._send([p])
            return p
        with self._cv:
            self._queue.append(p)
            self._ensure_sender()
            self._cv.notify_all()
        return p

    def _ensure_sender(self) -> None:
        """A sender thread runs while anything is queued (called with the lock held)."""
        if self._sender is None or not self._sender.is_alive():
            self._sender = threading.Thread(
                target=self._send_loop, name=f"rayledger-client-{self.group}", daemon=True
            )
            self._sender.start()

    def _expire(self, p: _Pending) -> BaseException | None:
        """The caller's deadline passed: queued means never stored, sent means unknown.

        Returns the append's error, or None when its call's answer won the race (then
        ``p.future`` holds the result).
        """
        with self._cv:
            # queued, or taken by the sender but not sent: settled under the lock, so the
            # sender (which skips appends that are done) cannot send it meanwhile
            if p in self._queue or not p.sent:
                if p in self._queue:
                    self._queue.remove(p)
                exc = self._gave_up(p)
                return exc if _settle(p, exc=exc) else p.future.exception()
        exc = self._unknown_at_deadline(p)
        self._leader = None  # no answer in time: look the leader up again for what follows
        # the call's answer may land at any moment: whichever settles first is the answer
        return exc if _settle(p, exc=exc) else p.future.exception()

    def _unknown_at_deadline(self, p: _Pending) -> OutcomeUnknownError:
        """The deadline passed on an append that may be in a log; the code of the unknown
        outcome that made it retry, if a member gave one (e.g. WAIT_QUORUM_ACK_TIMEOUT)."""
        last = p.last_error
        code = last.code if isinstance(last, OutcomeUnknownError) else None
        exc = OutcomeUnknownError(
            code or ResponseCode.APPEND_OUTCOME_UNKNOWN,
            f"append to {self.group!r} did not finish before the deadline; it may still commit"
            + (f" (last: {last})" if last is not None else ""),
        )
        exc.__cause__ = last
        return exc

    def _gave_up(self, p: _Pending) -> LedgerError:
        """The error of an append whose deadline passed while it waited in the queue (called
        with ``_cv`` held)."""
        return self._unknown_at_deadline(p) if self._maybe_stored(p) else self._not_taken(p)

    def _not_taken(self, p: _Pending) -> LedgerError:
        """TIMEOUT for an append no leader took before its deadline (nothing stored); the
        last refusal, such as LEADER_PENDING_FULL, is its ``__cause__``."""
        exc = LedgerError.of(
            ResponseCode.TIMEOUT,
            f"no leader of {self.group!r} took the append before the deadline: {p.last_error}",
        )
        exc.__cause__ = p.last_error
        return exc

    def close(self) -> None:
        """Stop the sender thread; queued appends fail with TIMEOUT (never sent)."""
        with self._cv:
            self._closed = True
            while self._queue:
                p = self._queue.popleft()
                if self._maybe_stored(p):  # an earlier try may have stored it
                    exc = self._unknown_at_deadline(p)
                else:
                    exc = LedgerError.of(ResponseCode.TIMEOUT, "the client was closed")
                _settle(p, exc=exc)
            self._cv.notify_all()

    # -- the sender -----------------------------------------------------------------------------
    def _take(self) -> list[_Pending]:
        """Everything queued that fits one call (called with the lock held)."""
        q = self._queue
        now = time.monotonic()
        while q and (q[0].future.done() or q[0].deadline < now):
            p = q.popleft()
            _settle(p, exc=self._gave_up(p))
        if not q:
            return []
        if q[0].alone or self._pinned(q[0]):  # a retry keeps its identity: alone
            return [q.popleft()]
        lanes = self._sessions
        lane = None if lanes is None else lanes.lane_of(q[0])
        out, n, size = [], 0, 0
        while q and not q[0].alone and not self._pinned(q[0]):
            p = q[0]
            if lanes is not None and lanes.lane_of(p) not in (None, lane):
                break  # numbered in another lane: a call of its own

            k = len(p.bodies)
            if out and (n + k > self.max_batch_entries or size > self.max_batch_bytes):
                break
            out.append(q.popleft())
            n += k
            size += sum(map(len, p.bodies))
        return out

    def _send_loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closed:
                        self._sender = None
                        return
                    if self._sendable():
                        break
                    if not self._queue and self._in_flight == 0:
                        self._cv.wait(1.0)
                        if not self._queue and self._in_flight == 0:
                            self._sender = None  # idle: a new append starts another
                            return
                        continue
                    self._cv.wait(0.5)
                batch = self._take()
                if not batch:
                    continue
                self._in_flight += 1
                pause = self._backoff_until - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self._send(batch)

    def _send(self, batch: list[_Pending]) -> None:
        """Send one call; its answer is handled by :meth:`_done` on a Ray thread."""
        target = self._leader
        if target is None:
            target = self._leader = self._find_leader()
        if target is None:
            self._requeue(batch, LedgerError.of(ResponseCode.NOT_LEADER, "no leader known"), 0.05)
            return
        try:
            handle = self._handle(target)
        except ValueError as exc:  # actor not found (gone): nothing numbered, nothing sent
            self._leader = None
            self._handles.pop(target, None)
            self._requeue(batch, exc, 0.01)
            return
        with self._send_lock:  # numbered and handed to Ray in one order
            with self._cv:  # an append whose caller gave up meanwhile is not sent
                batch = [p for p in batch if not p.future.done()]
                lane_busy = (
                    bool(batch)
                    and self._sessions is not None
                    and not self._sessions.sendable(batch[0])
                )
                if lane_busy:  # a direct send took its lane meanwhile: it waits its turn
                    self._requeue(batch, None)
                    return
                for p in batch:
                    p.sent = True  # from here on its outcome may be unknown
                if not batch:
                    self._in_flight -= 1
                    self._cv.notify_all()
                    return
                numbered = self._number(batch)
                ident = None if numbered is None else numbered.ident
            bodies = batch[0].bodies if len(batch) == 1 else [b for p in batch for b in p.bodies]
            try:
                if ident is None:
                    ref = handle.append.remote(bodies, self.group, target)
                else:
                    ref = handle.append.remote(bodies, self.group, target, ident,
                                               numbered.maybe_stored)  # fmt: skip
            except ValueError as exc:  # the actor is gone: the call never left
                failed = exc
            else:
                failed = None
        if failed is not None:
            self._leader = None
            self._handles.pop(target, None)
            if ident is not None:
                with self._cv:
                    self._answered(batch, Outcome.REFUSED)
            self._requeue(batch, failed, 0.01)
            return
        ref.future().add_done_callback(lambda f: self._done(batch, target, f))

    def _requeue(
        self, batch: list[_Pending], why: Exception | None, backoff_s: float = 0.0
    ) -> None:
        """Put appends that were certainly not stored back at the head of the queue."""
        with self._cv:
            self._in_flight -= 1
            if backoff_s:
                self._backoff_until = time.monotonic() + backoff_s
            for p in reversed(batch):
                if why is not None:
                    p.last_error = why
                p.sent = False
                self._queue.appendleft(p)
            if self.idempotent:  # the retries in sequence order: a later one first is a gap
                head = []
                while self._queue and self._queue[0].ident is not None:
                    head.append(self._queue.popleft())
                head.sort(key=lambda p: p.ident)
                self._queue.extendleft(reversed(head))
            self._ensure_sender()  # an append sent directly has no sender thread behind it
            self._cv.notify_all()

    def _done(self, batch: list[_Pending], target: str, f: concurrent.futures.Future) -> None:
        """A call ended: hand every append its own result or error (on a Ray thread)."""
        try:
            out = f.result()
        except Exception as exc:
            self._call_failed(batch, target, exc)
            return
        with self._cv:
            self._in_flight -= 1
            if self.idempotent and batch[0].ident is not None and self._sessions is not None:
                self._answered(batch, Outcome.STORED)
            self._cv.notify_all()
        if isinstance(out, Spread):  # a retry answered from the log: entry by entry
            results = AppendResults(
                np.frombuffer(out.indexes, dtype=np.int64),
                np.frombuffer(out.terms, dtype=np.int64),
                np.frombuffer(out.positions, dtype=np.int64),
            )
        else:
            first, term, positions, *receipts = out
            pos = np.frombuffer(positions, dtype=np.int64)
            rc = receipts[0] if receipts else None
            results = AppendResults(range(first, first + len(pos)), term, pos, rc)
        if len(batch) == 1:
            _settle(batch[0], results)
            return
        k = 0
        for p in batch:  # one already settled (its deadline won) never stops the others
            n = len(p.bodies)
            _settle(p, [results[k]] if n == 1 else results[k : k + n])  # one: a plain list
            k += n

    def _call_failed(self, batch: list[_Pending], target: str, exc: Exception) -> None:
        """Retry what was refused before anything was stored; everything else fails, as an
        unknown outcome unless the member said nothing was stored (an idempotent client
        retries an unknown outcome under the same identity until the deadline)."""
        if self.idempotent and batch[0].ident is not None:
            if self._session_failed(batch, target, exc):
                return
        if isinstance(exc, OutcomeUnknownError):
            # stored by the leader but not acknowledged by a quorum: never retry it
            if self._leader == target:
                self._leader = None
            self._fail(batch, lambda e=exc: OutcomeUnknownError(e.code, e.message, leader_id=None))
        elif isinstance(exc, LedgerError):
            self._refused(batch, target, exc)
        else:
            if self._leader == target:  # a dead, restarting or unschedulable member
                self._leader = None
            self._fail(
                batch,
                lambda e=exc: OutcomeUnknownError(
                    ResponseCode.APPEND_OUTCOME_UNKNOWN,
                    f"append to {target} failed ({type(e).__name__}); it may still commit",
                ),
            )

    def _session_failed(self, batch: list[_Pending], target: str, exc: Exception) -> bool:
        """An idempotent call that failed, as its session core decides: tried again (under
        the identity :meth:`_pinned` says), or failed -- as an unknown outcome whenever an
        earlier try may have stored it.  True when handled here."""
        if self._sessions is None:
            return False
        unknown = isinstance(exc, OutcomeUnknownError) or not isinstance(exc, LedgerError)
        if unknown:
            outcome = Outcome.UNKNOWN
        elif isinstance(exc, InvalidRequestError) and len(batch) > 1:
            outcome = Outcome.REFUSED  # split below: one call each finds the wrong one
        else:
            outcome = outcome_of(exc.code)
        with self._cv:
            action = self._answered(batch, outcome).action
        if action is Action.RETRY:
            if outcome is Outcome.UNKNOWN:  # it may be in a log: the same identity again
                if self._leader == target:
                    self._leader = None
                for p in batch:
                    p.alone = True
                self.retried += sum(len(p.bodies) for p in batch)
                self._requeue(batch, exc, 0.01)
            elif outcome is Outcome.GAP:  # an earlier append is on its way, or it moves on
                self._requeue(batch, exc, 0.005)
            else:
                self._refused(batch, target, exc)  # follows NOT_LEADER, splits bad batches
            return True
        if action is Action.FAIL_UNKNOWN:
            if unknown and self._leader == target:
                self._leader = None
            self._fail(batch, lambda e=exc: OutcomeUnknownError(
                e.code if isinstance(e, LedgerError) else ResponseCode.APPEND_OUTCOME_UNKNOWN,
                f"a retry was refused ({e}) after an unknown outcome; the append may still "
                "commit"))  # fmt: skip
            return True
        if action is Action.FAIL:
            self._fail(
                batch, lambda e=exc: LedgerError.of(e.code, e.message, leader_id=e.leader_id)
            )
            return True
        self._fail(batch, lambda e=exc: e)  # DONE: every append of the call ended meanwhile
        return True

    def _refused(self, batch: list[_Pending], target: str, exc: LedgerError) -> None:
        if exc.code in _RETRY_BEFORE_STORE:
            if isinstance(exc, NotLeaderError) and exc.leader_id and exc.leader_id != target:
                self._leader = exc.leader_id
            elif exc.code == ResponseCode.NOT_LEADER:
                self._leader = None
            hinted = exc.code == ResponseCode.NOT_LEADER and exc.leader_id
            self._requeue(batch, exc, 0.0 if hinted else 0.01)
        elif isinstance(exc, InvalidRequestError) and len(batch) > 1:
            for p in batch:  # find out which appends are wrong: one call each
                p.alone = True
            self._requeue(batch, exc)
        else:
            self._fail(
                batch, lambda e=exc: LedgerError.of(e.code, e.message, leader_id=e.leader_id)
            )

    def _fail(self, batch: list[_Pending], make) -> None:
        with self._cv:
            self._in_flight -= 1
            self._cv.notify_all()
        for p in batch:  # one already settled (its deadline won) never stops the others
            _settle(p, exc=make())

    # -- reads --------------------------------------------------------------------------------
    # a read changes nothing, so unlike an append it is safe to try again elsewhere
    _READ_RETRY = frozenset(
        {ResponseCode.NOT_LEADER, ResponseCode.LEADER_NOT_READY, ResponseCode.TIMEOUT}
    )

    def _read_call(self, method: str, *args, consistency: str, member: str | None):
        """Call ``method`` on the leader (or on ``member``; ``"any"`` spreads reads round
        robin over the members), following NOT_LEADER, until the client's deadline."""
        c = Consistency.of(consistency).value
        if member is not None and member != "any" and member not in self.members:
            self._refresh_members()  # added since this client looked (a replacement, say)
            if member not in self.members:
                raise LedgerError.of(
                    ResponseCode.UNKNOWN_MEMBER, f"{member!r} is not a member of {self.group!r}"
                )
        deadline = time.monotonic() + self.timeout_s
        last: Exception | None = None
        tried = 0
        while time.monotonic() < deadline:
            target = self._read_target(member, tried)
            try:
                return ray.get(
                    getattr(self._handle(target), method).remote(*args, consistency=c),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
            except LedgerError as exc:
                if exc.code not in self._READ_RETRY:
                    raise
                last = exc
                hint = exc.leader_id if exc.code == ResponseCode.NOT_LEADER else None
                self._leader = hint if hint in self.members and hint != target else None
            except (ray.exceptions.RayError, ValueError) as exc:
                last = exc
                self._leader = None
                self._handles.pop(target, None)
            tried += 1
            if member is not None and member != "any":
                member = None  # the chosen member could not answer: let the leader
            if tried % len(self.members) == 0:
                time.sleep(0.05)
        raise LedgerError.of(
            ResponseCode.TIMEOUT, f"no member of {self.group!r} answered {method}: {last}"
        )

    def _read_target(self, member: str | None, tried: int) -> str:
        if member == "any":
            self._probe += 1
            return self.members[self._probe % len(self.members)]
        return member if member is not None else self._target()

    def get(
        self, index: int, consistency: str = "linearizable", member: str | None = None
    ) -> Entry:
        """The committed entry at ``index``.  ``consistency``: ``"linearizable"`` (read index,
        the default), ``"lease"`` or ``"committed"`` (see actors/core/reads.py); ``member`` serves
        the read from that member (or ``"any"``) instead of the leader.

        Every entry of the log comes back, as the log holds it: a term's first entry has an
        empty body, and a configuration entry (a membership change, written by the
        group) has ``channel == CONFIG_CHANNEL``
        (:mod:`rayledger.election.configuration`) and its JSON as body; a client's entry
        has ``channel == 0``, so ``[e for e in entries if not e.channel]`` keeps those."""
        return self._read_call("get", index, consistency=consistency, member=member)

    def read(
        self, start: int, stop: int, consistency: str = "linearizable", member: str | None = None
    ) -> list[Entry]:
        """Committed entries with ``start <= index < stop`` (as :meth:`get`: configuration
        entries included, told by their ``channel``)."""
        return self._read_call("read", start, stop, consistency=consistency, member=member)

    def committed_index(self, consistency: str = "linearizable", member: str | None = None) -> int:
        """The group's committed index, -1 when nothing is committed (as :meth:`get`)."""
        return self._read_call("committed_index", consistency=consistency, member=member)

    def query(
        self, request: Any, consistency: str = "linearizable", member: str | None = None
    ) -> Any:
        """Ask the group's state machine (see actors/machine.py) once it has applied what
        ``consistency`` requires; ``member`` as for :meth:`get`."""
        return self._read_call("query", request, consistency=consistency, member=member)
