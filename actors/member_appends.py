"""Appends on the leader: group commit into rounds, and their answers.

A part of :class:`~.member.MemberActor` (see :mod:`.member_context`).  Every append that arrives in one turn of the
event loop joins one store batch and one replication round.  A round is announced to the
member's :class:`~.dispatcher.EntryDispatcherActor` s (one per peer), or through the
compiled graph of the fast path, and registered with its
:class:`~.checker.QuorumAckCheckerActor`, which answers with :meth:`AppendPart.on_resolved`
once a quorum stores it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import ray
from rayledger.storage import LedgerError

from . import round_path as rp
from . import supervision as sv
from .checker_logic import Resolution
from .dispatcher_logic import Inline, Payload, Ref
from .fastpath import FastPath
from .futures import set_exception, set_result
from .logic import Announcement
from .member_context import MemberContext, Part
from .naming import now_ms
from .rounds import Finished, RoundBook

log = logging.getLogger("rayledger.actors")

INLINE_BYTES = 64 * 1024  # rounds up to this size travel inside the call, larger ones via ray.put


def to_wire(payload: Payload) -> Payload:
    """A round's bytes as Ray carries them: inline up to ``INLINE_BYTES``, else one object
    in the store (:class:`Ref`) that each follower's push resolves as its argument."""
    if isinstance(payload, Inline) and len(payload.batch.data) > INLINE_BYTES:
        return Ref(ray.put(payload.batch))
    return payload


class AppendPart(Part):
    """The leader's append path: the round book, the rounds' processes and the compiled
    path.  ``commits_moved`` releases what waits for the committed index (readers, the
    state machine); ``step_down`` ends the leadership (a failed flush)."""

    def __init__(
        self,
        ctx: MemberContext,
        commits_moved: Callable[[], None],
        step_down: Callable[[str], None],
    ):
        super().__init__(ctx)
        self._commits_moved, self._step_down = commits_moved, step_down
        self.book = RoundBook(self.logic)  # queued appends and rounds (tokens: futures)
        self.round_path = rp.RoundPath(self.logic, self.book, ctx.sync)
        self.fast: FastPath | None = None

    # -- sending rounds: the compiled graph, or plain calls to the dispatchers -------------
    def _fast_path(self) -> FastPath:
        if self.fast is None:
            followers = {p: self.ctx.peer(p) for p in self.peers if p != self.self_id}
            self.fast = FastPath(
                self.self_id,
                followers,
                self.ctx.dispatchers,
                self.ctx.checker,
                self.config.stall_ms(),
                self.on_resolved,
                self._on_graph_fallback,
                self.ctx.loop,
            )
        return self.fast

    def _on_graph_fallback(self, items: list) -> None:
        """Rounds of an abandoned graph that still wait travel again as plain calls."""
        with self._lock:
            actions = self.round_path.fallback(items)
        for action in actions:
            self._perform_round(action)

    def _announce_plain(self, a: Announcement) -> None:
        a = replace(a, payload=to_wire(a.payload))
        for d in self.ctx.dispatchers.values():
            d.on_announcement.remote(a)

    def fast_start(self, term: int) -> None:
        self._fast_path().start(term)

    def fast_stop(self) -> None:
        if self.fast is not None:
            self.fast.stop()

    # -- leader: appends ----------------------------------------------------------------------
    async def append(
        self, bodies: list, group: str | None = None, target: str | None = None
    ) -> list[tuple]:
        """Append a batch as leader; once a quorum stores it, returns ``(first index, term,
        positions)`` with the positions as little-endian int64 bytes (compact to send back).

        The batch joins the round of everything appended in the same loop turn.
        """
        fut = self.ctx.loop.create_future()
        with self._lock:
            self.book.admit(bodies, group if group is not None else self.group, target, fut)
        self._schedule_round()
        return await fut

    def _schedule_round(self) -> None:
        """Write the queue as a round in this loop turn when the book says one is due (see
        :class:`~.rounds.RoundBook`)."""
        with self._lock:
            due = self.book.write_due()
        if due:
            self.ctx.loop.call_soon(self._write_round)

    def _write_round(self) -> None:
        """Group commit: the queued appends become one store batch and one round, sent on
        by the round's process (:class:`~.round_path.RoundPath`)."""
        with self._lock:
            w = self.book.write()
            if w is None:
                return
            if w.error is not None:
                exc = w.error
                for fut in w.tokens:
                    set_exception(fut, type(exc)(exc.code, exc.message, leader_id=exc.leader_id))
                return
            fast = self.fast is not None and self.fast.active
            proc = self.round_path.send(w, fast)
            rnd = w.round
            self._metrics.round_started(w.rid, rnd.last_index - rnd.first_index + 1,
                                        len(rnd.appended.data))  # fmt: skip
            action = proc.start()
        self._drive_round(proc, action)

    def _drive_round(self, proc: sv.Process, action) -> None:
        """Perform the round's actions in this loop turn; a flush runs off the loop."""
        while action is not None:
            if isinstance(action, sv.Flush):
                asyncio.ensure_future(self._flush_round(proc))
                return
            value = self._perform_round(action)
            with self._lock:
                action = proc.send(sv.Answer(now_ms(), value))

    async def _flush_round(self, proc: sv.Process) -> None:
        try:
            await self.ctx.loop.run_in_executor(None, self.store.flush)
            value = None
        except (LedgerError, OSError) as exc:
            value = sv.Failed(str(exc))
        with self._lock:
            action = proc.send(sv.Answer(now_ms(), value))
        self._drive_round(proc, action)

    def _perform_round(self, action):
        """One action of a round's process (see :mod:`.round_path`)."""
        if isinstance(action, rp.Register):
            self.ctx.checker.add_round.remote(action.term, action.first, action.last,
                                           action.rid, action.leader_mark)  # fmt: skip
            return None
        if isinstance(action, rp.Announce | rp.Submit):
            a = action.a
            try:
                if isinstance(action, rp.Submit):
                    return self.fast.submit(a, list(action.spans))
                self._announce_plain(a)
            except Exception as exc:  # stored, but not sent on (e.g. ray.put failed)
                log.error("[%s] term=%d: round %d..%d not sent: %r", self.self_id, a.term,
                          a.first, a.first + a.count - 1, exc)  # fmt: skip
                return sv.Failed(repr(exc))
            return None
        if isinstance(action, sv.Finish):
            self.finish(action.outcomes)
            return None
        if isinstance(action, sv.StepDown):
            self._step_down(action.why)
            return None
        raise TypeError(f"unknown round action {action!r}")

    def on_resolved(self, r: Resolution) -> None:
        """From the checker or the compiled graph: the committed index moved and/or
        rounds ended (SUCCESS moves this member's committed index: read-your-writes)."""
        with self._lock:
            finished = self.book.resolve(r)
        for fin in finished:
            self._answer(fin)
        if finished:
            self._schedule_round()
        self._commits_moved()

    def finish(self, outcomes: list) -> None:
        """Rounds that ended here (a term that ended, a round not sent on)."""
        self.on_resolved(Resolution(-1, None, outcomes))

    def _answer(self, fin: Finished) -> None:
        """Each append call of a round that ended gets its span, or its unknown outcome."""
        self._metrics.round_done(fin.rid, fin.ok)
        rnd = fin.round
        if fin.ok:
            positions = np.asarray(rnd.appended.positions, dtype=np.int64)
            base = rnd.first_index
            runner = self.ctx.machine
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
