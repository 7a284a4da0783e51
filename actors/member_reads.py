"""Reads on Ray: read index rounds, leases, waiting for a commit, and the read RPCs.

A part of :class:`~.member.MemberActor` (see :mod:`.member_context`); :mod:`.reads` and
:mod:`.read_path` hold the Ray-free decisions it performs and say what each consistency
promises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import ray
from rayledger.replication.admission import not_leader
from rayledger.storage import Entry, LedgerError, ResponseCode

from .faults import LinkDown
from .futures import set_exception, set_result
from .member_context import MemberContext, Part
from .naming import now_ms
from .read_path import AskLeader, Confirm, ReadPath, WaitCommitted, run_to_end
from .reads import CommitWaiters, Consistency, ReadIndexLogic
from .supervision import Answer, Failed


class ReadPart(Part):
    """The read path.  ``ask_peer`` sends an election message (a confirmation round's
    heartbeat) through this member's link faults."""

    def __init__(self, ctx: MemberContext, ask_peer: Callable[..., Awaitable]):
        super().__init__(ctx)
        self._ask_peer = ask_peer
        self.reads = ReadIndexLogic(
            self.self_id, self.peers, self.config.lease_ms(), self.config.rpc_timeout_ms
        )
        self._commit_waiters = CommitWaiters()
        self.read_path = ReadPath(self.logic, self.reads, self.config.rpc_timeout_ms)

    # -- reads (see reads.py for what each consistency promises) -------------------------
    async def read_index(self, consistency: str = "linearizable") -> int:
        """On the leader: an index every read that starts now may be served at (a follower
        serving a linearizable read asks this, then waits until it has committed that far)."""
        return await self._leader_read_index(Consistency.of(consistency))

    async def _leader_read_index(self, c: Consistency) -> int:
        return await self._run_read(self.read_path.leader_read(c, now_ms()))

    async def _run_read(self, proc) -> int:
        """Resume a read (:mod:`.read_path`) with each action's answer until it returns its
        index or raises the caller's LedgerError."""
        with self._lock:
            action, index = run_to_end(proc, None)
        while action is not None:
            value = await self._perform_read(action)
            with self._lock:
                action, index = run_to_end(proc, Answer(now_ms(), value))
        return index

    async def _perform_read(self, a):
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
        if isinstance(a, Confirm):
            fut = self.ctx.loop.create_future()
            with self._lock:
                sends, confirmed = self.reads.request(a.term, a.index, fut, now_ms())
            self._reads_out(sends, confirmed)
            try:
                return await asyncio.wait_for(fut, left_s)
            except asyncio.TimeoutError:
                return Failed("no quorum in time", timeout=True)
            except LedgerError as exc:  # leadership ended (FailReaders)
                return Failed(exc.message)
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

    def _reads_out(self, sends: list, confirmed: list) -> None:
        for token, index in confirmed:
            if not token.done():
                token.get_loop().call_soon_threadsafe(set_result, token, index)
        for rnd in sends:
            for peer in self.reads.others:
                asyncio.ensure_future(self._read_ping(peer, rnd))
            self.ctx.loop.call_later(self.reads.round_timeout_ms / 1000 + 0.001, self._expire_reads)

    async def _read_ping(self, peer: str, rnd) -> None:
        """One heartbeat of a confirmation round; it counts if ``peer`` follows us in the
        round's term."""
        req = self.reads.heartbeat(self.group, rnd, peer)
        resp = None
        try:
            resp = await self._ask_peer(peer, req, self.reads.round_timeout_ms / 1000)
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError):
            pass
        with self._lock:
            sends, confirmed = self.reads.on_heartbeat_answer(
                rnd.round_id, peer, rnd.term, resp, now_ms()
            )
        self._reads_out(sends, confirmed)

    def _expire_reads(self) -> None:
        with self._lock:
            sends, expired = self.reads.expire(now_ms())
        for token in expired:
            if not token.done():
                set_exception(token, asyncio.TimeoutError())
        self._reads_out(sends, [])

    def fail_readers(self) -> None:
        """Leadership ended: readers waiting on this leader fail NOT_LEADER."""
        with self._lock:
            readers = self.reads.step_down()
            err = not_leader(self.logic.state, f"{self.self_id} no longer leads {self.group!r}")
        for token in readers:
            if not token.done():
                set_exception(token, LedgerError(err.code, err.message, leader_id=err.leader_id))

    async def _follower_read_index(self, c: Consistency) -> int:
        return await self._run_read(self.read_path.follower_read(c, now_ms()))

    def commits_moved(self) -> None:
        """Release the readers waiting for the committed index, and let the state machine
        apply what committed (callable from any thread)."""
        if self.ctx.machine is not None:
            self.ctx.machine.kick()
        with self._lock:
            done = self._commit_waiters.reached(self.store.committed_index)
        for fut in done:
            if not fut.done():
                fut.get_loop().call_soon_threadsafe(set_result, fut, None)

    async def _read_limit(self, consistency: str) -> int:
        """The highest index a read with ``consistency`` may return from this member."""
        c = Consistency.of(consistency)
        if c is not Consistency.COMMITTED:
            with self._lock:
                leads = self.logic.state.is_leader
            await (self._leader_read_index(c) if leads else self._follower_read_index(c))
        with self._lock:
            return self.store.committed_index

    def _not_committed_here(self, index: int, c: Consistency) -> LedgerError:
        """An index past the read's limit.  Past a leader's committed index or a read index
        the entry is not committed in the group (INDEX_OUT_OF_BOUNDS); a follower's own
        committed index may lag, so a ``committed`` read there is pointed at the leader
        (NOT_LEADER, with its id when known) and never refused as out of bounds."""
        committed = self.store.committed_index
        st = self.logic.state
        if c is Consistency.COMMITTED and not st.is_leader:
            return not_leader(
                st,
                f"entry {index} is not committed on {self.self_id} (committed index "
                f"{committed}); ask the leader",
            )
        return LedgerError.of(
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            f"entry {index} is not committed (committed index {committed})",
        )

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
