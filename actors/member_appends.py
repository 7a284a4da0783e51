"""Appends on the leader: group commit into rounds, and their answers.

Mixed into :class:`~.member.MemberActor`.  Every append that arrives in one turn of the
event loop joins one store batch and one replication round.  A round is announced to the
member's :class:`~.dispatcher.EntryDispatcherActor` s (one per peer), or through the
compiled graph of the fast path, and registered with its
:class:`~.checker.QuorumAckCheckerActor`, which answers with :meth:`AppendsMixin.on_resolved`
once a quorum stores it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import numpy as np
import ray
from rayledger.storage import EntryBatch, LedgerError, ResponseCode

from .fastpath import FastPath
from .futures import set_exception, set_result
from .logic import Round
from .rounds import RoundBook

log = logging.getLogger("rayledger.actors")

INLINE_BYTES = 64 * 1024  # rounds up to this size travel inside the call, larger ones via ray.put


class AppendsMixin:
    """The leader's append path (uses the shell's ``_checker``, ``_dispatchers``, ``_lock``,
    ``_loop``, ``_metrics`` and ``_machine_runner``)."""

    def _init_appends(self) -> None:
        self._book = RoundBook(self.logic)  # queued appends and rounds (tokens: futures)
        self._fast: FastPath | None = None

    # -- sending rounds: the compiled graph, or plain calls to the dispatchers -------------
    def _fast_path(self) -> FastPath:
        if self._fast is None:
            followers = {p: self._peer(p) for p in self.peers if p != self.self_id}
            self._fast = FastPath(
                self.self_id,
                followers,
                self._dispatchers,
                self._checker,
                self.config.stall_ms(),
                self._on_graph_output,
                self._on_graph_fallback,
                self._loop,
            )
        return self._fast

    def _on_graph_output(self, term: int, committed: int | None, resolved: list) -> None:
        if committed is not None:
            with self._lock:
                self.logic.on_committed(term, committed)
        self._finish(resolved)  # also releases readers waiting for the commit

    def _on_graph_fallback(self, items: list) -> None:
        """Rounds that were queued or in flight in an abandoned graph travel again as plain
        calls (a follower answers a push it already holds from its log)."""
        for a, rounds in items:
            waiting = [(f, la, rid) for f, la, rid in rounds if self._book.waiting(rid)]
            if not waiting:
                continue
            self._announce_plain(a)
            mark = self.logic.water_mark()
            for first, last, rid in waiting:
                self._checker.add_round.remote(a.term, first, last, rid, mark)

    def _announce_plain(self, a) -> None:
        batch = a.payload
        if not isinstance(batch, EntryBatch) or len(batch.data) > INLINE_BYTES:
            a = replace(a, payload=ray.put(batch))
        for d in self._dispatchers.values():
            d.on_announcement.remote(a)

    # -- leader: appends ----------------------------------------------------------------------
    @ray.method(enable_task_events=False)
    async def append(
        self, bodies: list, group: str | None = None, target: str | None = None
    ) -> list[tuple]:
        """Append a batch as leader; once a quorum stores it, returns ``(first index, term,
        positions)`` with the positions as little-endian int64 bytes (compact to send back).

        The batch joins the round of everything appended in the same loop turn.
        """
        fut = self._loop.create_future()
        with self._lock:
            self._book.admit(bodies, group if group is not None else self.group, target, fut)
        self._schedule_round()
        return await fut

    def _schedule_round(self) -> None:
        """Write the queue as a round in this loop turn when the book says one is due (see
        :class:`~.rounds.RoundBook`)."""
        if self._book.write_due():
            self._loop.call_soon(self._write_round)

    def _write_round(self) -> None:
        """Group commit: the queued appends become one store batch and one round."""
        with self._lock:
            w = self._book.write()
            if w is None:
                return
            if w.error is not None:
                exc = w.error
                for fut in w.tokens:
                    set_exception(fut, type(exc)(exc.code, exc.message, leader_id=exc.leader_id))
                return
            rnd, rid, term = w.round, w.rid, w.round.term
            a = self.logic.announcement(rnd, None)
        try:
            batch = rnd.appended.batch()
            self._metrics.round_started(rid, rnd.last_index - rnd.first_index + 1, len(batch.data))
            if self._sync:  # followers write meanwhile; the quorum counts us once we flushed
                self._announce_plain(replace(a, payload=batch))
                asyncio.ensure_future(self._register_synced(term, rnd, rid))
                return
            fast = self._fast
            if fast is not None and fast.active:
                if fast.submit(replace(a, payload=batch), [(rnd.first_index, rnd.last_index, rid)]):
                    return
            self._announce_plain(replace(a, payload=batch))
            mark = self.logic.water_mark()
            self._checker.add_round.remote(term, rnd.first_index, rnd.last_index, rid, mark)
        except Exception as exc:  # stored, but not sent on (e.g. ray.put failed)
            log.error(
                "[%s] term=%d: round %d..%d not sent: %r",
                self.self_id,
                term,
                rnd.first_index,
                rnd.last_index,
                exc,
            )
            self._finish_round(rid, ResponseCode.INTERNAL_ERROR)

    async def _register_synced(self, term: int, rnd: Round, rid: int) -> None:
        """sync_flush: the round joins the quorum count once it is on this member's disk
        (until then the checker's mark for the leader is its flushed end, even a restarted
        checker's).  A failed flush fails the round's appends, unless the followers alone
        already made a quorum for it, and costs the leadership: a leader whose disk fails
        can count itself toward nothing."""
        try:
            await self._loop.run_in_executor(None, self.store.flush)
        except (LedgerError, OSError) as exc:
            log.error("[%s] term=%d: flush of %d..%d failed: %s", self.self_id, term,
                      rnd.first_index, rnd.last_index, exc)  # fmt: skip
            self._finish_round(rid, ResponseCode.DISK_ERROR)  # stored: outcome unknown
            self._step_down(f"the flush of entries {rnd.first_index}..{rnd.last_index} failed")
            return
        with self._lock:
            mark = self.logic.water_mark()
        self._checker.add_round.remote(term, rnd.first_index, rnd.last_index, rid, mark)

    @ray.method(enable_task_events=False)
    async def on_resolved(self, term: int, committed: int | None, resolved: list) -> None:
        """From the checker: the committed index moved and/or rounds ended."""
        if committed is not None:
            with self._lock:
                self.logic.on_committed(term, committed)
        self._finish(resolved)

    def _finish(self, resolved) -> None:
        for token, code in resolved:
            self._finish_round(token, code)
        self._commits_moved()

    def _finish_round(self, rid: int, code: ResponseCode) -> None:
        with self._lock:  # SUCCESS moves the committed index: read-your-writes
            fin = self._book.finish(rid, code)
        if fin is None:
            return
        self._metrics.round_done(rid, fin.ok)
        self._schedule_round()
        rnd = fin.round
        if fin.ok:
            positions = np.asarray(rnd.appended.positions, dtype=np.int64)
            base = rnd.first_index
            runner = self._machine_runner
            for fut, first, last in fin.calls:
                # compact: (first index, term, positions as int64 bytes[, receipts]), expanded
                # by the client
                out = (first, rnd.term, positions[first - base : last - base + 1].tobytes())
                receipts = runner.receipt(first, last) if runner is not None else None
                set_result(fut, out if receipts is None else (*out, receipts))
            return
        leader = self.logic.state.leader_id
        for fut, first, last in fin.calls:
            set_exception(fut, fin.unknown(first, last, self.self_id, leader))
