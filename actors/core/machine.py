"""The state-machine runner's decisions, once (sans-I/O: no Ray, no asyncio, no clock).

The runner around a member's state machine (machine.py) only delivers events to this core and does
what it answers; the Ray member (:mod:`rayledger.actors.member.machine`) with a one-thread pool and
futures, the seeded simulation with simulated time.  Its one way in is
:meth:`MachineCore.step` (an event and the time; it returns the event's direct answer), as
for the checker's and the dispatchers' cores; what only reads its state (``snapshot_wanted``,
``keep_from``, ``due``) is asked by method.  The core decides:

* **what to apply next**: from where the machine stands, at most ``max_batch`` committed
  entries, one batch at a time (:class:`NextJob`), and that each batch
  continues exactly where the machine stands (:class:`Continues`);
* **when a query may be answered or must fail**: at once once the machine has applied
  the index the read consistency requires, else it waits until a batch reaches it
  (:class:`BatchApplied`), TIMEOUT at its deadline (:class:`ExpireQueries`),
  INTERNAL_ERROR once the machine failed;
* **when the machine counts as ready for a new leader's term** (:class:`WaitReady`):
  once ``ready_to_lead()`` says so while the term lasts, asked again every
  ``READY_POLL_MS``; a failed machine is never ready;
* **what a failure does** (:class:`MachineFailed`): a machine whose ``apply`` or
  ``on_role_change`` raised applies no more (its state is unknown), and every waiting and
  later query fails INTERNAL_ERROR;
* **role news**: the machine hears each distinct (role, term) once;
* **installs**: a snapshot sealed from the leader (:class:`SnapshotOffered`) is
  loaded next, between batches, only when it is ahead of where the machine stands (never
  applied twice, never skipped: the machine then stands exactly at its index); a machine
  that stands below its log's begin (the log was reset to the leader's after a long
  absence, or the snapshot that bridged the gap was found damaged at a restart) applies
  nothing and asks the leader for one (:meth:`MachineCore.snapshot_wanted`), instead of
  failing; one that takes no snapshots rebases to the log's begin (it keeps what it can
  rebuild from the log);
* **a machine ahead of its log** (its own state saved past the entries its log kept
  through a power loss, in async flush mode): it answers no query until the log holds
  what it applied again -- a machine such as RocketMQ's reads message bodies from the log,
  and those entries come back from the leader (they were committed);
* **how far the log may be compacted** (:meth:`MachineCore.keep_from`): past the oldest
  snapshot kept, or past what the machine says it made durable itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from rayledger.actors.core.snapshot_policy import SnapshotPolicy
from rayledger.actors.core.supervision import MACHINE_STRANDED, Answer, Failed, Process, Sleep
from rayledger.election import Role
from rayledger.storage import LedgerError, ResponseCode

log = logging.getLogger("rayledger.actors")

READY_POLL_MS = 10
"""How often a new leader asks its machine again whether it is ready to lead."""

CATCH_UP = 8
"""A machine more than this many batches behind applies batches this many times larger."""


@dataclass(frozen=True, slots=True)
class AskReady:
    """Call ``machine.ready_to_lead()`` on the machine's thread; answered with its result,
    or :class:`~.supervision.Failed` when it raised."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Read committed entries ``[start, stop)`` and apply them on the machine's thread."""

    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class Rebase:
    """The machine's next entry is gone from its log (reset to the leader's begin) and it
    takes no snapshots: on its thread, it continues after ``index`` with what it can
    rebuild from the log (``StateMachine.rebase``)."""

    index: int


@dataclass(frozen=True, slots=True)
class Install:
    """Load the sealed snapshot at ``index`` (in ``path``) on the machine's thread: its
    state becomes the state after entry ``index``."""

    index: int
    path: str


# ====================================================================== events in
# Each event's answer is what :meth:`MachineCore.step` returns for it.


@dataclass(frozen=True, slots=True)
class NextJob:
    """What the machine does next with ``committed`` entries and its log beginning at
    ``begin``: answers a :class:`Batch`, :class:`Install` or :class:`Rebase` now in flight,
    or None."""

    committed: int
    begin: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotOffered:
    """A snapshot at ``index`` (in ``path``) was sealed from the leader; answers whether the
    machine will load it."""

    index: int
    path: str


@dataclass(frozen=True, slots=True)
class Rebased:
    """The machine continues after ``index``; answers the query tokens it may answer now."""

    index: int


@dataclass(frozen=True, slots=True)
class Installed:
    """The machine loaded the snapshot at ``index`` (``have``: every snapshot now, ``saved``:
    what it made durable itself); answers (query tokens, snapshots to delete, the log's new
    compaction floor)."""

    index: int
    have: list
    saved: int


@dataclass(frozen=True, slots=True)
class Continues:
    """Entries from ``first`` are about to be applied; raises INCONSISTENT_STATE unless they
    continue exactly where the machine stands."""

    first: int


@dataclass(frozen=True, slots=True)
class BatchRead:
    """The store gave ``entries`` for ``batch``; raises INCONSISTENT_STATE unless exactly
    those."""

    batch: Batch
    entries: list


@dataclass(frozen=True, slots=True)
class BatchApplied:
    """The machine applied entries up to ``last``; answers the query tokens it may answer."""

    last: int


@dataclass(frozen=True, slots=True)
class MachineFailed:
    """The machine raised ``why``; answers ``(token, error)`` for every waiting query."""

    why: str


@dataclass(frozen=True, slots=True)
class SnapshotDue:
    """A batch of ``entries`` was applied (the log begins at ``begin``); answers the index
    to snapshot at now, or None."""

    entries: list
    begin: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotAsked:
    """A follower's machine waits for a snapshot at or past ``index`` (``have``: the newest
    that can be sent, -1: none); answers the index to snapshot at now, or None."""

    index: int
    begin: int
    have: int | None = None


@dataclass(frozen=True, slots=True)
class SnapshotSealed:
    """Snapshot ``index`` is sealed on disk; answers (snapshots to delete, compaction floor)."""

    index: int
    have: list
    saved: int


@dataclass(frozen=True, slots=True)
class SnapshotFailed:
    """Taking the snapshot at ``index`` failed with ``why``."""

    index: int
    why: str


@dataclass(frozen=True, slots=True)
class Query:
    """A query ``token`` needs the machine to have applied ``index``, for at most
    ``timeout_ms``; answers a :class:`QueryVerdict`, or raises INTERNAL_ERROR once the
    machine failed."""

    index: int
    token: Any
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class ExpireQueries:
    """Time passed: answers ``(token, TIMEOUT error)`` for every query past its deadline."""


@dataclass(frozen=True, slots=True)
class QueryGone:
    """A waiting query gave up on its own (its caller went away)."""

    token: Any


@dataclass(frozen=True, slots=True)
class RoleNews:
    """The member is ``role`` in ``term``; answers whether the machine must hear of it."""

    role: Role
    term: int


@dataclass(frozen=True, slots=True)
class WaitReady:
    """A new leader waits for its machine while ``leads()`` holds (its log begins at
    ``begin()``); answers the :class:`~.supervision.Process` that waits."""

    leads: Callable[[], bool]
    begin: Callable[[], int] = lambda: 0


MachineEvent = (
    NextJob | SnapshotOffered | Rebased | Installed | Continues | BatchRead | BatchApplied
    | MachineFailed | SnapshotDue | SnapshotAsked | SnapshotSealed | SnapshotFailed | Query
    | ExpireQueries | QueryGone | RoleNews | WaitReady
)  # fmt: skip


class QueryVerdict:
    """What :class:`Query` decided: answer now, or wait for a batch."""

    ANSWER = "answer"
    WAIT = "wait"


class MachineCore:
    """One machine's runner state: where it stands, the batch in flight, queries waiting."""

    def __init__(
        self,
        member: str,
        applied: int,
        max_batch: int = 1024,
        snapshots: SnapshotPolicy | None = None,
        log_end: int | None = None,
    ):
        self.member = member
        self.snapshots = snapshots  # None: the machine takes no snapshots
        self.applied = int(applied)  # the last index the machine applied (open() says first)
        self.max_batch = max_batch
        self.applying: Batch | Install | Rebase | None = None
        self.offered: Install | None = None  # a snapshot from the leader, loaded next
        self.stranded = False  # it stands below its log's begin: asks for a snapshot
        self.failed: str | None = None  # why the machine failed (it applies no more)
        # it stands past its log's end (``log_end``, at open): queries wait for a batch
        self.ahead_of_log = log_end is not None and self.applied > log_end
        self._role: tuple[Role, int] | None = None
        self._waiting: list[tuple[int, int, Any]] = []  # (index, deadline ms, token)

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: MachineEvent, now_ms: int) -> Any:  # noqa: C901 -- one case each
        """Deliver one event at ``now_ms``; returns the call's direct answer (see each
        event), as :meth:`~rayledger.replication.checker.CheckerLogic.step` does."""
        match ev:
            case NextJob():
                return self._next_batch(ev.committed, ev.begin)
            case BatchRead():
                return self._check_batch(ev.batch, ev.entries)
            case BatchApplied():
                return self._batch_done(ev.last)
            case Continues():
                return self._check_continues(ev.first)
            case SnapshotDue():
                return self._snapshot_due(ev.entries, ev.begin)
            case Query():
                return self._query(ev.index, ev.token, now_ms, ev.timeout_ms)
            case ExpireQueries():
                return self._expire(now_ms)
            case QueryGone():
                return self._discard(ev.token)
            case RoleNews():
                return self._role_news(ev.role, ev.term)
            case WaitReady():
                return self._wait_ready_process(ev.leads, ev.begin)
            case SnapshotOffered():
                return self._offer(ev.index, ev.path)
            case Rebased():
                return self._rebased(ev.index)
            case Installed():
                return self._installed(ev.index, ev.have, ev.saved)
            case MachineFailed():
                return self._fail(ev.why)
            case SnapshotAsked():
                return self._snapshot_asked(ev.index, ev.begin, ev.have)
            case SnapshotSealed():
                return self._snapshot_done(ev.index, ev.have, ev.saved)
            case SnapshotFailed():
                return self._snapshot_failed(ev.index, ev.why)
        raise TypeError(f"not a machine event: {ev!r}")

    # -- what to apply next ------------------------------------------------------------------
    def due(self, committed: int) -> tuple[int, int] | None:
        """The next ``[start, stop)`` after where the machine stands, at most ``max_batch``
        entries -- or, catching up (a restart replaying the log after its snapshot), up to
        ``CATCH_UP`` times that: each batch costs a read, a hop to the machine's thread and
        back, and a replay of 100,000 entries spent more on those than on applying --, or
        None when it has applied ``committed``."""
        if committed <= self.applied:
            return None
        start = self.applied + 1
        n = self.max_batch
        if committed - self.applied > CATCH_UP * n:
            n *= CATCH_UP
        return start, min(committed + 1, start + n)

    def _next_batch(self, committed: int, begin: int = 0) -> Batch | Install | Rebase | None:
        """The machine's next job: a snapshot offered by the leader, else the batch to
        apply now; None when nothing is due, a job is in flight (one at a time, in order),
        or the machine failed.  A machine that stands below its log's ``begin`` (the
        entries it needs are gone) waits for a snapshot from the leader (it asks for one:
        :meth:`snapshot_wanted`) -- or, taking none, rebases to ``begin - 1``
        (:class:`Rebase`)."""
        if self.applying is not None or self.failed is not None:
            return None
        if self.offered is not None:
            job, self.offered = self.offered, None
            if job.index > self.applied:  # a batch that ran meanwhile may have passed it
                self.applying = job
                return job
        due = self.due(committed)
        if due is None:
            return None
        if due[0] < begin and self.snapshots is None:
            log.warning("[%s] state machine stands at %d, below its log's begin %d, and takes "
                        "no snapshots: it rebases", self.member, self.applied, begin)  # fmt: skip
            self.applying = Rebase(begin - 1)
            return self.applying
        if due[0] < begin:
            if not self.stranded:
                self.stranded = True
                log.warning("[%s] state machine stands at %d, below its log's begin %d: "
                            "it asks the leader for a snapshot at %d or later", self.member,
                            self.applied, begin, begin - 1)  # fmt: skip
            return None
        self.applying = Batch(*due)
        return self.applying

    def snapshot_wanted(self, begin: int) -> int:
        """The snapshot index at or past which the machine must start again, or -1: it
        stands below its log's ``begin`` -- the entries it needs next are gone, and the
        snapshot that bridged them was lost (found damaged at a restart), or none came with
        the log's reset -- and no snapshot that far is offered or loading.  The member's
        push answers carry it, so the leader sends one though the logs match: its
        dispatcher sends a snapshot on its own only before resetting a log."""
        if self.snapshots is None or self.failed is not None or self.applied >= begin - 1:
            return -1
        pending = self.offered.index if self.offered is not None else -1
        if isinstance(self.applying, Install):
            pending = max(pending, self.applying.index)
        return -1 if pending >= begin - 1 else begin - 1

    def _offer(self, index: int, path: str) -> bool:
        """A snapshot at ``index`` was sealed from the leader: True when the machine will
        load it (it is ahead of where it stands and of any snapshot offered before)."""
        ahead = max(self.applied, self.offered.index if self.offered else -1)
        if isinstance(self.applying, Install):
            ahead = max(ahead, self.applying.index)
        elif isinstance(self.applying, Batch):
            ahead = max(ahead, self.applying.stop - 1)
        if self.failed is not None or index <= ahead:
            log.info("[%s] snapshot %d from the leader not loaded: the machine stands at %d",
                     self.member, index, ahead)  # fmt: skip
            return False
        self.offered = Install(index, path)
        return True

    def _rebased(self, index: int) -> list[Any]:
        """The machine continues after ``index``; returns the queries it may answer now."""
        self.applied = index
        self.applying = None
        self.stranded = self.ahead_of_log = False
        return self._reached()

    def _installed(self, index: int, have: list, saved: int) -> tuple[list, list, int | None]:
        """The machine loaded the snapshot at ``index`` (``have``: every snapshot now):
        returns the queries it may answer now, the snapshots to delete and the log's new
        compaction floor."""
        self.applied = index
        self.applying = None
        self.stranded = self.ahead_of_log = False
        log.info("[%s] state machine loaded the leader's snapshot at %d", self.member, index)
        gone = self.snapshots.installed(index, have) if self.snapshots is not None else []
        return self._reached(), gone, self.keep_from(saved)

    def _check_continues(self, first: int) -> None:
        """Entries from ``first`` must continue exactly where the machine stands: never
        skip, never apply twice (INCONSISTENT_STATE)."""
        if first != self.applied + 1:
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"apply from {first}, but the machine stands at {self.applied}",
            )

    def _check_batch(self, batch: Batch, entries: list) -> None:
        """The store gave exactly the batch's entries (INCONSISTENT_STATE otherwise: a
        machine never gets a gap, nor less than it was promised)."""
        want = list(range(batch.start, batch.stop))
        if [e.index for e in entries] != want:
            got = f"{entries[0].index}..{entries[-1].index}" if entries else "none"
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"batch {batch.start}..{batch.stop - 1} read as entries {got}",
            )

    def _batch_done(self, last: int) -> list[Any]:
        """The machine applied entries up to ``last`` (the batch in flight, or a batch
        applied by hand); returns the query tokens it may answer now."""
        if last < self.applied:
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"applied up to {last}, but the machine stood at {self.applied} already",
            )
        self.applied = last
        self.applying = None
        self.ahead_of_log = False
        return self._reached()

    def _fail(self, why: str) -> list[tuple[Any, LedgerError]]:
        """The machine raised: it applies no more (its state is unknown) and every waiting
        query fails; returns ``(token, error)`` for them."""
        if self.failed is None:
            self.failed = why
            log.error("[%s] state machine failed at %d: %s; it applies no more",
                      self.member, self.applied + 1, why)  # fmt: skip
        self.applying = None
        waiting, self._waiting = self._waiting, []
        return [(token, self._broken()) for _, _, token in waiting]

    def _broken(self) -> LedgerError:
        return LedgerError.of(
            ResponseCode.INTERNAL_ERROR,
            f"the state machine of {self.member} failed: {self.failed}",
        )

    # -- snapshots -------------------------------------------------------------------
    def _snapshot_due(self, entries: list, begin: int = 0) -> int | None:
        """After a batch of ``entries`` applied: the index to snapshot the machine at now
        (its consistent cut: where it stands), or None -- also when the log now begins
        past it (``begin``: reset while the batch was applied; the cut's term is gone, and
        the machine continues from a snapshot)."""
        p = self.snapshots
        if p is None or self.failed is not None or self.applied < begin:
            return None
        if p.config.every_bytes:
            p.applied(sum(len(e.body) for e in entries))
        if not p.due(self.applied):
            return None
        p.begin(self.applied)
        return self.applied

    def _snapshot_asked(self, index: int, begin: int, have: int | None = None) -> int | None:
        """A follower's machine waits for a snapshot at or past ``index`` and ours stop
        short of it (``have``: the newest that can be sent, -1: none): the index to
        snapshot at now (the machine is idle and stands that far), or None -- the snapshot
        follows the batch that reaches it."""
        if self.snapshots is None:
            return None
        self.snapshots.ask(index, have)
        if self.applying is not None:
            return None  # its end asks snapshot_due
        return self._snapshot_due([], begin)

    def _snapshot_done(self, index: int, have: list, saved: int) -> tuple[list, int | None]:
        """Snapshot ``index`` is sealed on disk (``have``: every snapshot now): returns the
        snapshots to delete (beyond the newest ``keep``) and the log's new compaction floor
        (``saved``: what the machine's ``open`` returned)."""
        gone = self.snapshots.taken(index, have)
        return gone, self.keep_from(saved)

    def _snapshot_failed(self, index: int, why: str) -> None:
        log.error("[%s] snapshot at %d failed: %s", self.member, index, why)
        self.snapshots.failed()

    def keep_from(self, saved: int) -> int | None:
        """The first index the member's log must keep for this machine (None: no floor,
        the machine needs no log to come back -- it keeps no state)."""
        if self.snapshots is None:
            return saved + 1 if saved >= 0 else 0
        return self.snapshots.compaction_floor()

    # -- queries -----------------------------------------------------------------------------
    def _query(self, index: int, token: Any, now_ms: int, timeout_ms: int) -> str:
        """A query needs the machine to have applied ``index``: :attr:`QueryVerdict.ANSWER` (ask
        the machine now) or :attr:`QueryVerdict.WAIT` (``token`` is listed until a batch reaches
        ``index``, :class:`ExpireQueries` at ``now_ms + timeout_ms``).  Raises INTERNAL_ERROR once
        the machine failed."""
        if self.failed is not None:
            raise self._broken()
        if self.ahead_of_log:  # a batch applied means the log holds what it had applied
            index = max(index, self.applied + 1)
        if self.applied >= index:
            return QueryVerdict.ANSWER
        self._waiting.append((index, now_ms + timeout_ms, token))
        return QueryVerdict.WAIT

    def _reached(self) -> list[Any]:
        if not self._waiting:
            return []
        done = [t for i, _, t in self._waiting if i <= self.applied]
        if done:
            self._waiting = [w for w in self._waiting if w[0] > self.applied]
        return done

    def _expire(self, now_ms: int) -> list[tuple[Any, LedgerError]]:
        """Queries whose deadline passed fail TIMEOUT; returns ``(token, error)``."""
        late = [(i, t) for i, d, t in self._waiting if d <= now_ms]
        if not late:
            return []
        self._waiting = [w for w in self._waiting if w[1] > now_ms]
        return [(t, self._too_late(i)) for i, t in late]

    def _discard(self, token: Any) -> None:
        """A waiting query gave up on its own (its caller went away)."""
        self._waiting = [w for w in self._waiting if w[2] is not token]

    def _too_late(self, index: int) -> LedgerError:
        return LedgerError.of(
            ResponseCode.TIMEOUT,
            f"{self.member} has applied up to {self.applied}, not yet {index}",
        )

    # -- roles and readiness -----------------------------------------------------------------
    def _role_news(self, role: Role, term: int) -> bool:
        """Whether the machine must hear of ``(role, term)``: once per distinct pair, and
        never once it failed."""
        if self.failed is not None or self._role == (role, term):
            return False
        self._role = (role, term)
        return True

    def _wait_ready_process(
        self, leads: Callable[[], bool], begin: Callable[[], int] = lambda: 0
    ) -> Process:
        """A new leader's wait for its machine (the supervisor's ``WaitMachine``): returns
        True once ``ready_to_lead()`` says so, False once ``leads()`` no longer holds (the
        term ended), ``MACHINE_STRANDED`` when it stands below the log's ``begin()`` and
        needs a snapshot -- also before its first batch was due (a restart that found its
        only snapshot damaged: such a leader was ready, and its machine never applied
        again).  A failed machine is never ready; one whose ``ready_to_lead`` raised is not
        ready this time and is asked again."""
        return Process("machine-ready", self._wait_ready(leads, begin), exclusive=False)

    def _wait_ready(
        self, leads: Callable[[], bool], begin: Callable[[], int]
    ) -> Generator[Any, Answer, bool | str]:
        while leads():
            # below the log's begin: only a snapshot from another leader helps
            if self.stranded or self.snapshot_wanted(begin()) >= 0:
                return MACHINE_STRANDED
            if self.failed is None:
                got = (yield AskReady()).value
                if isinstance(got, Failed):
                    log.warning("[%s] ready_to_lead raised: %s", self.member, got.why)
                elif got:
                    return True
                if not leads():
                    break
            yield Sleep(READY_POLL_MS)
        return False


__all__ = [
    "READY_POLL_MS",
    "AskReady",
    "Batch",
    "Install",
    "MachineCore",
    "MachineEvent",
    "QueryVerdict",
    "Rebase",
]
