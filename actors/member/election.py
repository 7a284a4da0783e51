"""The member's elector on Ray: its clock, its messages to peers, and election RPCs.

A part of :class:`~.actor.MemberActor` (see :mod:`.context`).  The elector is ticked every
``maintain_interval_ms`` (DLedger's ``maintainState``) on the election concurrency group's
loop, beside the vote and heartbeat handlers, so a main loop busy with appends and pushes
never delays a heartbeat.  Every event goes into the member's core; the role changes it
starts are carried out on the main loop (``MemberActor._start_runs``).
"""

from __future__ import annotations

import asyncio
import logging
import time

import ray
from rayledger.actors.core import member as mc
from rayledger.actors.faults import LinkDown
from rayledger.actors.futures import settle_threadsafe
from rayledger.actors.member.context import MemberContext, Part
from rayledger.actors.naming import now_ms
from rayledger.election.messages import TransferOutcome
from rayledger.storage import LedgerError, ResponseCode

log = logging.getLogger("rayledger.actors")

MAINTAINER_STALL_S = 10.0  # a maintainer that has not ticked for this long is replaced


class ElectionPart(Part):
    """Runs the elector's clock and carries its messages: ticks, election requests and
    answers, and transfers stepped into the member's core, whose Out the shell carries
    out (``ctx.carry``: messages sent by :meth:`send` from the running loop, role changes
    performed on the main loop)."""

    def __init__(self, ctx: MemberContext):
        super().__init__(ctx)
        self._maintainer: asyncio.Task | None = None
        self._last_tick = time.monotonic()
        self.loop: asyncio.AbstractEventLoop | None = None  # the election loop, set at boot
        self._tick_wake: asyncio.Event | None = None
        self._sleep_until = 0
        self._transfers: dict[tuple[int, str], asyncio.Future] = {}  # (term, target) -> outcome

    def ensure_maintainer(self) -> None:
        """Start the elector's clock unless it is ticking (on the election loop, ``loop``).

        The member's boot starts it; every election message and status call
        checks again, so a clock whose start call was lost (seen once in CI after a
        restart: the member stayed a candidate of an old term for good, answering the
        leader's heartbeats TERM_NOT_READY) or whose task ended restarts within one
        heartbeat.  A clock that stopped ticking for ``MAINTAINER_STALL_S`` is replaced.
        """
        task = self._maintainer
        if self.ctx.closed:
            return
        if task is not None and not task.done():
            if time.monotonic() - self._last_tick < MAINTAINER_STALL_S:
                return
            log.error("[%s] the maintainer stalled; starting it again", self.self_id)
            task.cancel()
        elif task is not None:
            log.error("[%s] the maintainer had stopped; starting it again", self.self_id)
        self._tick_wake = asyncio.Event()
        self._last_tick = time.monotonic()
        self._maintainer = asyncio.ensure_future(self._maintain())

    def stop(self) -> None:
        if self._maintainer is not None:
            self._maintainer.cancel()

    async def _maintain(self) -> None:
        """DLedger's maintainState, event-timed: sleep until the elector's next deadline
        (at least ``maintain_interval_ms``, at most one second) instead of every 10 ms; an
        election message that brings the deadline forward wakes it (:meth:`rearm`)."""
        interval = self.config.maintain_interval_ms
        while True:
            delay = interval
            self._last_tick = time.monotonic()
            try:
                self.ctx.carry(self.ctx.step(mc.Tick()))
                with self._lock:
                    outstanding = self.core.book.outstanding
                    self._metrics.tick(self.logic.state, self.store, outstanding)
                    delay = self.core.next_tick_ms(now_ms()) - now_ms()
            except Exception:
                log.exception("[%s] maintain loop error", self.self_id)
            delay = min(1000, max(interval, delay))
            self._sleep_until = now_ms() + delay
            self._tick_wake.clear()
            try:
                await asyncio.wait_for(self._tick_wake.wait(), delay / 1000)
            except asyncio.TimeoutError:
                pass
            self._sleep_until = 0

    def rearm(self) -> None:
        """Wake the maintainer when the elector's next deadline moved before its wake-up
        (a leadership-transfer request, a new role); callable from any thread."""
        with self._lock:
            due = self.core.next_tick_ms(now_ms())
        if due < self._sleep_until and self.loop is not None:
            self.loop.call_soon_threadsafe(self._tick_wake.set)

    async def ask_peer(self, to: str, msg, timeout_s: float):
        """``msg`` to ``to``'s election handler, through this member's link faults; its
        answer within ``timeout_s``."""
        if self.ctx.faults.active:
            await self.ctx.faults.before_send(to)
        ref = self.ctx.peer(to).handle_election.remote(msg)
        return await asyncio.wait_for(ref, timeout_s)

    def send(self, to: str, msg) -> None:
        """An election message to a peer, from the running loop (the election loop for the
        elector's own, so they never wait behind the data path)."""
        asyncio.ensure_future(self._send(to, msg))

    async def _send(self, to: str, msg) -> None:
        resp = None
        try:
            resp = await self.ask_peer(to, msg, self.config.rpc_timeout_ms / 1000)
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError) as exc:
            log.debug("[%s] %s to %s failed: %s", self.self_id, type(msg).__name__, to, exc)
            resp = None
            if isinstance(exc, (ValueError, ray.exceptions.ActorDiedError)):
                self.ctx.forget_peer(to)
        self.ctx.carry(self.ctx.step(mc.ElectionAnswer(to, msg, resp)))

    # -- election RPCs (own concurrency group) ----------------------------------------------
    def handle(self, req):
        """A vote, pre-vote, heartbeat or leadership-transfer request from a peer."""
        self.ensure_maintainer()
        out = self.ctx.step(mc.ElectionRequest(req))
        self.ctx.carry(out)
        return out.reply

    async def transfer(self, target: str):
        """Ask this member (the leader) to hand leadership to ``target``."""
        if target not in self.peers:
            raise LedgerError.of(
                ResponseCode.UNKNOWN_MEMBER, f"{target!r} is not a member of {self.group!r}"
            )
        with self._lock:  # the term the order is stepped in (an RLock: ctx.step takes it too)
            term = self.logic.state.current_term
            out = self.ctx.step(mc.TransferOrder(target))
        resp, running = out.reply
        done = None
        if resp.code == ResponseCode.SUCCESS and running:
            done = asyncio.get_running_loop().create_future()
            self._transfers[(term, target)] = done
        self.ctx.carry(out)
        if resp.code != ResponseCode.SUCCESS:
            raise LedgerError.of(
                resp.code,
                f"{self.self_id} cannot transfer leadership to {target}",
                leader_id=self.logic.state.leader_id,
            )
        if done is not None:  # the transfer's outcome, as the elector decides it
            cfg = self.config
            wait_s = (
                cfg.election.leadership_transfer_wait_timeout_ms + 2 * cfg.rpc_timeout_ms
            ) / 1000
            try:
                code = await asyncio.wait_for(done, wait_s)
            except asyncio.TimeoutError:
                code = ResponseCode.TIMEOUT
            finally:
                self._transfers.pop((term, target), None)
            if code != ResponseCode.SUCCESS:
                raise LedgerError.of(
                    code,
                    f"{self.self_id}: the transfer of term {term} to {target} ended {code.name}",
                    leader_id=self.logic.state.leader_id,
                )
        return resp

    def transfer_done(self, outcome: TransferOutcome) -> None:
        """A transfer ended (from any loop): its caller learns how."""
        fut = self._transfers.get((outcome.term, outcome.transferee))
        if fut is not None and not fut.done():
            settle_threadsafe(fut, outcome.code)
