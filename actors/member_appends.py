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
import itertools
import logging
from dataclasses import replace

import numpy as np
import ray
from rayledger.storage import EntryBatch, LedgerError, OutcomeUnknownError, ResponseCode

from .fastpath import FastPath
from .futures import set_exception, set_result
from .logic import Round

log = logging.getLogger("rayledger.actors")

MAX_ROUNDS = 1  # rounds waiting for a quorum before new appends wait to join one round
INLINE_BYTES = 64 * 1024  # rounds up to this size travel inside the call, larger ones via ray.put


class AppendsMixin:
    """The leader's append path (uses the shell's ``_checker``, ``_dispatchers``, ``_lock``,
    ``_loop``, ``_metrics`` and ``_machine_runner``)."""

    def _init_appends(self) -> None:
        self._queue: list[tuple[asyncio.Future, list]] = []
        self._round_scheduled = False
        self._rounds: dict[int, tuple[Round, list[asyncio.Future]]] = {}
        self._round_ids = itertools.count()
        self._outstanding = 0
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
            waiting = [(f, la, rid) for f, la, rid in rounds if rid in self._rounds]
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
        with self._lock:
            _, bodies = self.logic.admit(
                bodies, group if group is not None else self.group, target, self._outstanding
            )
        fut = self._loop.create_future()
        self._queue.append((fut, bodies))
        self._outstanding += 1
        self._schedule_round()
        try:
            return await fut
        finally:
            self._outstanding -= 1

    def _schedule_round(self) -> None:
        """Write the queue as a round in this loop turn, unless ``MAX_ROUNDS`` rounds already
        wait for their quorum: then the queue grows until one of them ends, and goes out as
        one larger round (every round costs a dozen actor calls, whatever its size)."""
        if not self._round_scheduled and self._queue and len(self._rounds) < MAX_ROUNDS:
            self._round_scheduled = True
            self._loop.call_soon(self._write_round)

    def _write_round(self) -> None:
        """Group commit: the queued appends become one store batch and one round."""
        self._round_scheduled = False
        queue, self._queue = self._queue, []
        if not queue:
            return
        rid = next(self._round_ids)
        with self._lock:
            term = self.logic.ready_term
            try:
                rnd = self.logic.write_round([(None, b) for _, b in queue], term)
            except LedgerError as exc:
                for fut, _ in queue:
                    set_exception(fut, type(exc)(exc.code, exc.message, leader_id=exc.leader_id))
                return
            a = self.logic.announcement(rnd, None)
        self._rounds[rid] = (rnd, [f for f, _ in queue])
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
        item = self._rounds.pop(rid, None)
        if item is None:
            return
        self._metrics.round_done(rid, code == ResponseCode.SUCCESS)
        self._schedule_round()
        rnd, futs = item
        if code == ResponseCode.SUCCESS:
            with self._lock:  # read-your-writes, even before the checker's index arrives
                self.logic.on_committed(rnd.term, rnd.last_index)
            positions = np.asarray(rnd.appended.positions, dtype=np.int64)
            base = rnd.first_index
            runner = self._machine_runner
            for fut, (_, first, last) in zip(futs, rnd.calls, strict=True):
                # compact: (first index, term, positions as int64 bytes[, receipts]), expanded
                # by the client
                out = (first, rnd.term, positions[first - base : last - base + 1].tobytes())
                receipts = runner.receipt(first, last) if runner is not None else None
                set_result(fut, out if receipts is None else (*out, receipts))
            return
        for fut, (_, first, last) in zip(futs, rnd.calls, strict=True):
            # the entries are in this member's log and may still commit under a later
            # leader: the outcome is unknown, never a plain failure to retry
            set_exception(
                fut,
                OutcomeUnknownError(
                    code,
                    f"entries {first}..{last} (term {rnd.term}) were stored by {self.self_id} "
                    f"but not acknowledged by a quorum ({code.name}); the outcome is unknown, "
                    "check before retrying",
                    leader_id=self.logic.state.leader_id,
                ),
            )
