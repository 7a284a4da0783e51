"""Appends on the leader: group commit into rounds, and their answers.

A part of :class:`~.actor.MemberActor` (see :mod:`.context`).  An append call blocks its Ray thread
until its round ends.  The appends queued while a round waits for its quorum join one store batch
and one replication round, written on the thread whose step made it due (the member core's
:class:`~rayledger.actors.core.rounds.RoundBook` decides,
:class:`~rayledger.actors.core.round_path.RoundPath` sends it on).  A round is announced to the
member's :class:`~rayledger.actors.dispatcher.EntryDispatcherActor` s (one per peer), or through the
compiled graph of the fast path, and registered with its
:class:`~rayledger.actors.checker.QuorumAckCheckerActor`, which answers with
:meth:`AppendPart.on_resolved` once a quorum stores it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np
import ray
from rayledger.actors import wire
from rayledger.actors.core import member as mc
from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.rounds import Finished, Written
from rayledger.actors.fastpath import FastPath
from rayledger.actors.futures import set_exception, set_result
from rayledger.actors.member.context import MemberContext, Part
from rayledger.replication.checker import Resolution
from rayledger.replication.messages import Announcement, Inline, Payload, Ref

log = logging.getLogger("rayledger.actors")

INLINE_BYTES = 64 * 1024  # rounds up to this size travel inside the call, larger ones via ray.put


def to_wire(payload: Payload) -> Payload:
    """A round's bytes as Ray carries them: inline up to ``INLINE_BYTES``, else one object
    in the store (:class:`Ref`) that each follower's push resolves as its argument."""
    if isinstance(payload, Inline) and len(payload.batch.data) > INLINE_BYTES:
        return Ref(ray.put(wire.out_of_band(payload.batch)))
    return payload


class AppendPart(Part):
    """The leader's append path on Ray: the calls that carry appends into the member's
    core, the actions of its rounds (announcements, registrations, the compiled path) and
    the answers to the append calls."""

    def __init__(self, ctx: MemberContext):
        super().__init__(ctx)
        self.fast: FastPath | None = None
        self.fast_on = True  # LedgerGroup.set_fast_path: the group's compiled path switched on

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
                park_ms=self.config.fast_path_park_ms,
            )
        return self.fast

    def _on_graph_fallback(self, items: list) -> None:
        """Rounds of an abandoned graph that still wait travel again as plain calls."""
        self.ctx.carry(self.ctx.step(mc.GraphFallback(items)))

    def _announce_plain(self, a: Announcement) -> None:
        packed = wire.pack_announcement(replace(a, payload=to_wire(a.payload)))
        for d in self.ctx.dispatchers.values():
            d.on_announcement.remote(packed)

    def fast_start(self, term: int) -> None:
        self._fast_path().start(term)

    def switch_fast(self, enabled: bool) -> None:
        """The operator's switch (the group runs with ``fast_path``): a graph built falls
        back or builds again; a leader that never built one builds it now."""
        self.fast_on = enabled
        if self.fast is not None:
            self.fast.set_enabled(enabled)
            return
        with self._lock:
            term = self.logic.ready_leading_term()
        if enabled and term >= 0:
            self.fast_start(term)

    def fast_stop(self) -> None:
        if self.fast is not None:
            self.fast.stop()

    # -- leader: appends ----------------------------------------------------------------------
    def append(
        self,
        bodies: list,
        group: str | None = None,
        target: str | None = None,
        ident: tuple[int, int] | None = None,
        maybe_stored: bool = True,
    ):
        """Append a batch as leader; once a quorum stores it, returns ``(first index, term,
        positions)`` with the positions as little-endian int64 bytes (compact to send back), or a
        :class:`~rayledger.actors.core.rounds.Spread` for an idempotent retry answered from the log.

        On Ray's thread, which waits here for the answer: the batch starts a round at once
        when none waits for its quorum, else joins the next one.
        """
        fut: Future = Future()
        g = group if group is not None else self.group
        self.ctx.step_carry(mc.ClientAppend(bodies, g, target, fut, ident, maybe_stored))
        return fut.result()

    def write_round(self) -> None:
        """A round is due: the queued appends become one store batch and one round."""
        fast = self.fast is not None and self.fast.logic.offered  # live or parked
        self.ctx.step_carry(mc.WriteRound(fast, int(time.time() * 1000)))

    def settle(self, settled: list) -> None:
        """Append calls answered outside a round: a retry's entries found in the log, or
        its unknown outcome."""
        for fut, value in settled:
            if isinstance(value, BaseException):
                set_exception(fut, value)
            else:
                set_result(fut, value)

    def perform(self, action) -> Any:
        """An action of a round (see :mod:`rayledger.actors.core.round_path`), carried out at
        once."""
        if isinstance(action, rp.Register):
            config = None if action.config is None else list(action.config)
            self.ctx.checker.add_round.remote([action.term, action.first, action.last,
                                            action.rid, action.leader_mark, config])  # fmt: skip
            return None
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

    def on_resolved(self, r: Resolution) -> None:
        """From the checker or the compiled graph: the committed index moved and/or
        rounds ended (SUCCESS moves this member's committed index: read-your-writes)."""
        self.ctx.step_carry(mc.RoundsResolved(r))

    def written(self, w: Written) -> None:
        """The core wrote a round (metrics), or the store refused it (every call fails)."""
        if w.error is not None:
            exc = w.error
            for fut in w.tokens:
                set_exception(fut, type(exc)(exc.code, exc.message, leader_id=exc.leader_id))
            return
        rnd = w.round
        self._metrics.round_started(w.rid, rnd.last_index - rnd.first_index + 1,
                                    len(rnd.appended.data))  # fmt: skip

    def answer(self, fin: Finished) -> None:
        """Each append call of a round that ended gets its span, or its unknown outcome."""
        self._metrics.round_done(fin.rid, fin.ok)
        rnd = fin.round
        if fin.ok:
            positions = np.asarray(rnd.appended.positions, dtype=np.int64)
            base = rnd.first_index
            runner = self.ctx.machine
            for fut, first, last in fin.calls:
                # compact: [first index, term, positions as int64 bytes(, receipts)], expanded
                # by the client (a list: Ray packs it with msgpack, a tuple with pickle)
                out = [first, rnd.term, positions[first - base : last - base + 1].tobytes()]
                if runner is not None:
                    receipts = runner.receipt(first, last)
                    if receipts is not None:
                        out.append(receipts)
                set_result(fut, out)
            return
        leader = self.logic.state.leader_id
        for fut, first, last in fin.calls:
            set_exception(fut, fin.unknown(first, last, self.self_id, leader))
