"""Reads on Ray: read index rounds, leases, waiting for a commit, and the read RPCs.

A part of :class:`~.actor.MemberActor` (see :mod:`.context`); :mod:`rayledger.actors.core.reads` and
:mod:`rayledger.actors.core.read_path` hold the Ray-free decisions it performs and say what each
consistency promises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import ray
from rayledger.actors.core import member as mc
from rayledger.actors.core.read_path import AskLeader, WaitCommitted, not_committed_here
from rayledger.actors.core.reads import Consistency
from rayledger.actors.core.supervision import Failed
from rayledger.actors.faults import LinkDown
from rayledger.actors.futures import settle_threadsafe
from rayledger.actors.member.context import MemberContext, Part
from rayledger.actors.naming import now_ms
from rayledger.storage import Entry, LedgerError, ResponseCode


class CommitWaiters:
    """Readers waiting for this member's committed index to reach an index."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, Any]] = []

    def add(self, index: int, token: Any) -> None:
        self._waiting.append((index, token))

    def reached(self, committed: int) -> list[Any]:
        """Tokens whose index is now committed (they leave the list)."""
        if not self._waiting:
            return []
        done = [t for i, t in self._waiting if i <= committed]
        if done:
            self._waiting = [(i, t) for i, t in self._waiting if i > committed]
        return done

    def discard(self, token: Any) -> None:
        self._waiting = [(i, t) for i, t in self._waiting if t is not token]

    async def wait(
        self,
        index: int,
        deadline: float,
        kick: Callable[[], None],
        too_late: Callable[[], LedgerError],
        lock: AbstractContextManager | None = None,
    ) -> None:
        """Wait on the running loop until :meth:`reached` passes ``index``; ``kick`` runs
        once the waiter is listed (to check at once), ``too_late()`` is raised at
        ``deadline`` (``time.monotonic()``).  ``lock`` guards the list when other threads
        touch it."""
        guard = lock if lock is not None else nullcontext()
        fut = asyncio.get_running_loop().create_future()
        with guard:
            self.add(index, fut)
        kick()
        try:
            await asyncio.wait_for(fut, max(0.001, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            with guard:
                self.discard(fut)
            raise too_late() from None


class ReadPart(Part):
    """The read path on Ray: reads stepped into the member's core (which decides what a
    read waits for, when a lease answers alone, which error a reader gets), and the
    actions it hands out -- waiting for a commit, asking the leader, the confirmation
    rounds' heartbeats.  ``ask_peer`` sends an election message through this member's
    link faults."""

    def __init__(self, ctx: MemberContext, ask_peer: Callable[..., Awaitable]):
        super().__init__(ctx)
        self._ask_peer = ask_peer
        self._commit_waiters = CommitWaiters()

    # -- reads (see reads.py for what each consistency promises) -------------------------
    async def read_index(self, consistency: str = "linearizable") -> int:
        """On the leader: an index every read that starts now may be served at (a follower
        serving a linearizable read asks this, then waits until it has committed that far)."""
        return await self._read(Consistency.of(consistency), leader_only=True)

    async def _read(self, c: Consistency, leader_only: bool = False) -> int:
        """The core's read (:mod:`rayledger.actors.core.read_path`): its index, or the caller's
        LedgerError (answered in the very step when nothing is to wait for: a lease, committed)."""
        fut = self.ctx.loop.create_future()
        out = self.ctx.step(mc.ReadIndex(c, fut, leader_only))
        mine = [r for t, r in out.reads_done if t is fut]
        if mine:
            out.reads_done = [(t, r) for t, r in out.reads_done if t is not fut]
        self.ctx.carry(out)
        if not mine:
            return await fut
        if isinstance(mine[0], BaseException):
            raise mine[0]
        return mine[0]

    def carry(self, out: mc.MemberOut) -> None:
        """The read part of a :class:`~rayledger.actors.core.member.MemberOut`: readers answered,
        confirmation rounds sent, their expiry and the readers' deadlines as timers."""
        for fut, result in out.reads_done:
            settle_threadsafe(fut, result)
        for peer, req in out.read_pings:
            asyncio.ensure_future(self._read_ping(peer, req))
        timers = [(at, mc.Deadline(pid)) for pid, at in out.deadlines]
        if out.expire_at_ms is not None:
            timers.append((out.expire_at_ms, mc.ExpireReads()))
        loop = self.ctx.loop
        for at, ev in timers:  # on the main loop, whichever thread stepped the core
            if asyncio.get_running_loop() is loop:
                self._at(at, ev)
            else:
                loop.call_soon_threadsafe(self._at, at, ev)

    def _at(self, at_ms: int, ev) -> None:
        self.ctx.loop.call_later(max(0, at_ms - now_ms()) / 1000, self._step_later, ev)

    def _step_later(self, ev) -> None:
        self.ctx.carry(self.ctx.step(ev))

    async def perform(self, a):
        """An action of a read process: wait for a commit, or ask the leader."""
        left_s = max(0.001, (a.deadline_ms - now_ms()) / 1000)
        if isinstance(a, WaitCommitted):
            if self.store.committed_index >= a.index:
                return True
            try:
                await self._commit_waiters.wait(
                    a.index, time.monotonic() + left_s, self.commits_moved,
                    lambda: LedgerError.of(ResponseCode.TIMEOUT, "not committed"), self._lock,
                )  # fmt: skip
            except LedgerError:
                return Failed("not committed in time", timeout=True)
            return True
        if isinstance(a, AskLeader):
            try:
                if self.ctx.faults.active:
                    await self.ctx.faults.before_send(a.leader)
                ref = self.ctx.peer(a.leader).read_index.remote(a.consistency.value)
                return await asyncio.wait_for(ref, left_s)
            except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError) as exc:
                if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(
                    exc.cause, LedgerError
                ):
                    return exc.cause
                return Failed(type(exc).__name__, isinstance(exc, asyncio.TimeoutError))
        raise TypeError(f"unknown read action {a!r}")

    async def _read_ping(self, peer: str, req) -> None:
        """One heartbeat of a confirmation round; it counts if ``peer`` follows us in the
        round's term."""
        resp = None
        try:
            resp = await self._ask_peer(peer, req, self.core.reads.round_timeout_ms / 1000)
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError):
            pass
        self.ctx.carry(self.ctx.step(mc.ReadRoundAnswer(peer, req, resp)))

    def commits_moved(self) -> None:
        """Release the readers waiting for the committed index, and let the state machine
        apply what committed (callable from any thread)."""
        if self.ctx.machine is not None:
            self.ctx.machine.kick()
        with self._lock:
            done = self._commit_waiters.reached(self.store.committed_index)
        for fut in done:
            settle_threadsafe(fut, None)

    async def _read_limit(self, consistency: str) -> int:
        """The highest index a read with ``consistency`` may return from this member."""
        await self._read(Consistency.of(consistency))  # the core decides what it waits for
        with self._lock:
            return self.store.committed_index

    def _not_committed_here(self, index: int, c: Consistency) -> LedgerError:
        with self._lock:
            return not_committed_here(self.logic, index, c)

    async def get(
        self, index: int, committed_only: bool = True, consistency: str = "committed"
    ) -> Entry:
        self._metrics.read(Consistency.of(consistency).value if committed_only else "uncommitted")
        if type(index) is not int:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "index must be an int")
        if committed_only:
            limit = await self._read_limit(consistency)
            if index > limit:
                raise self._not_committed_here(index, Consistency.of(consistency))
        with self._lock:
            return self.store.get(index)

    async def read(
        self, start: int, stop: int, committed_only: bool = True, consistency: str = "committed"
    ) -> list[Entry]:
        if type(start) is not int or type(stop) is not int:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "start and stop must be ints")
        self._metrics.read(Consistency.of(consistency).value if committed_only else "uncommitted")
        limit = self.store.ledger_end_index
        if committed_only:
            limit = await self._read_limit(consistency)
            err = self._not_committed_here(stop - 1, Consistency.of(consistency))
            if stop - 1 > limit and err.code == ResponseCode.NOT_LEADER:
                raise err
        with self._lock:
            if start >= min(stop, limit + 1):
                return []
            return self.store.get_range(start, min(stop, limit + 1))

    async def read_batch(self, start: int, stop: int, committed_only: bool = True):
        """Encoded entries in [start, stop) (clipped to the committed index) as one EntryBatch."""
        with self._lock:
            limit = (
                self.store.committed_index + 1
                if committed_only
                else self.store.ledger_end_index + 1
            )
            stop = min(stop, limit)
            if start >= stop:
                return None
            return self.store.read_batch(start, max_count=stop - start)

    async def committed_index(self, consistency: str = "committed") -> int:
        return await self._read_limit(consistency)

    async def query(self, request, consistency: str = "committed"):
        """Ask the state machine, once it has applied what ``consistency`` requires."""
        if self.ctx.machine is None:
            raise LedgerError.of(
                ResponseCode.UNSUPPORTED, f"group {self.group!r} runs no state machine"
            )
        limit = await self._read_limit(consistency)
        return await self.ctx.machine.query(request, limit)
