"""EntryDispatcherActor: the Ray transport of one leader -> follower :class:`~.logic.DispatcherLogic`.

The member announces every round it stores (the bytes inline, or one ObjectRef
for a large round); the logic decides what to push and the shell sends it,
pipelined: every request goes out at once and answers are folded back as they
arrive.  What the logic lacks (a batch evicted from its cache, the term of an
entry to COMPARE) it asks for as a need, and the shell fetches it from the
member with a term-fenced call.  Nothing polls: the shell runs when an
announcement, an answer or a fetched batch arrives, and otherwise sleeps until
the logic's next deadline (a resend, a COMMIT push).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from dataclasses import replace

import ray
from rayledger.replication import PushEntryRequest, PushType
from rayledger.storage import EntryBatch, LedgerError, ResponseCode

from .config import LedgerConfig
from .faults import LinkDown, LinkFaults
from .logic import Announcement, CachedBatch, DispatcherLogic, LeaderInfo
from .metrics import PeerMetrics
from .naming import NAMESPACE, actor_name, now_ms

log = logging.getLogger("rayledger.actors")

PROGRESS_S = 0.05  # how often a dispatcher tells its member a follower's progress


@ray.remote(num_cpus=0, max_concurrency=1000)
class EntryDispatcherActor:
    def __init__(
        self, group: str, self_id: str, peer_id: str, config: LedgerConfig, member, checker
    ):
        self.group, self.self_id, self.peer_id = group, self_id, peer_id
        self.config = config
        self.logic = DispatcherLogic(
            group, self_id, peer_id, config.replication, config.dispatcher_cache_bytes
        )
        self._lock = threading.Lock()
        self.member = member
        member.helper_started.remote("dispatcher", peer_id, os.getpid())  # restarted: set me up
        self.checker = checker
        self.faults = LinkFaults()
        self._follower = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._fetching = False
        self._reporting = False
        self._last_progress = 0.0
        self._progress_wm = -1
        self._progress_timer: asyncio.TimerHandle | None = None
        self._cg_gen: int | None = None  # the compiled-graph generation this dispatcher serves
        self._cg_sent: dict[tuple, PushEntryRequest] = {}
        self._cg_keys = itertools.count()
        self._metrics = PeerMetrics(group, self_id, peer_id)

    async def pid(self) -> int:
        return os.getpid()

    @ray.method(enable_task_events=False)
    async def progress(self) -> dict:
        """Where replication to this follower stands (like etcd's Progress), for operators
        and failure messages."""
        with self._lock:
            core = self.logic.core
            return {
                "term": self.logic.term,
                "state": core.state.name if core.active else "INACTIVE",
                "water_mark": core.water_mark,
                "write_index": core.write_index,
                "pending": core.pending_pushes,
                "need": repr(self.logic.need) if self.logic.need else None,
                "fetching": self._fetching,
                "reporting": self._reporting,
                "graph": self._cg_gen,
            }

    # -- from the member and the checker -------------------------------------------------
    async def activate(self, info: LeaderInfo) -> None:
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self.logic.activate(info)
            self._progress_wm = -1
        self._kick()

    async def deactivate(self, term: int) -> None:
        with self._lock:
            self.logic.deactivate(term)
            self._cg_gen = None
            self._cg_sent.clear()
            self._progress_wm = -1
        for timer in (self._timer, self._progress_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._progress_timer = None

    @ray.method(enable_task_events=False)
    async def on_announcement(self, a: Announcement) -> None:
        """The leader stored a round: push it now when it is next in line."""
        with self._lock:
            now = self.logic.on_announcement(a)
        if now:
            self._pump()
        else:
            self._kick()

    @ray.method(enable_task_events=False)
    async def on_committed(self, term: int, index: int) -> None:
        with self._lock:
            due = self.logic.on_committed(term, index)
        if due:
            self._kick()

    # -- the compiled path (see fastpath.py); cg_* run on the graph's thread -----------------
    async def cg_begin(self, term: int, gen: int) -> None:
        with self._lock:
            if term != self.logic.term:
                raise LedgerError.of(
                    ResponseCode.TERM_CHANGED, f"dispatcher serves term {self.logic.term}"
                )
            self._cg_gen = gen
            self._cg_sent.clear()

    async def cg_end(self, gen: int) -> None:
        """The leader left graph ``gen``: its pushes in flight are lost, push again."""
        with self._lock:
            if self._cg_gen != gen:
                return
            self._cg_gen = None
            self._cg_sent.clear()
            self.logic.rewind()
            term = self.logic.term
        # water marks that went into the graph may never have reached the checker
        if not self._reporting:
            self._reporting = True
            asyncio.ensure_future(self._report(term, force=True))
        self._kick()

    def cg_push(self, g):
        """A round through the graph: the pushes the logic wants now (others go plain)."""
        a = g.announcement
        wire, plain = [], []
        with self._lock:
            if g.gen != self._cg_gen:
                return (g.gen, a.term, g.rounds), []
            self.logic.on_announcement(a)
            for req in self.logic.next_requests(now_ms()):
                batch = req.batch
                inline = batch is None or isinstance(batch.payload, EntryBatch)
                if inline and req.type in (PushType.APPEND, PushType.COMMIT):
                    key = (
                        self.self_id,
                        a.term,
                        g.gen,
                        next(self._cg_keys),
                    )  # unique across leaders
                    self._cg_sent[key] = req
                    wire.append((key, replace(req, batch=batch.payload) if batch else req))
                else:
                    plain.append(req)
            need = self.logic.need is not None
        self._metrics.sent_first(wire)
        if (plain or need) and self._loop is not None:
            self._loop.call_soon_threadsafe(self._send_all, plain)
        return (g.gen, a.term, g.rounds), wire

    def cg_ack(self, answered):
        """The follower's answers: fold them in, report the water mark to the checker."""
        (gen, term, rounds), answers = answered
        now = now_ms()
        with self._lock:
            for key, resp in answers:
                req = self._cg_sent.pop(key, None)
                self._metrics.acked(key, self.logic)
                if req is not None:
                    self.logic.on_response(req, resp, now)
            wm = self.logic.water_mark if self.logic.term == term else -1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._after_ack, term, wm)
        return gen, term, self.peer_id, wm, rounds

    def _send_all(self, reqs: list) -> None:
        for req in reqs:
            asyncio.ensure_future(self._send(req))
        self._kick()

    def _after_ack(self, term: int, wm: int) -> None:
        if wm >= 0:
            self._progress(term, wm)
        self._kick()

    def _progress(self, term: int, wm: int) -> None:
        """Tell the member's elector how far the follower matches (leadership transfer waits
        for it): at most every PROGRESS_S, and the last water mark always gets through.  A
        water mark learned in another term than the one served now is dropped."""
        with self._lock:
            if term != self.logic.term:
                return
            self._progress_wm = max(self._progress_wm, wm)
        if self._progress_timer is not None:
            return
        due = self._last_progress + PROGRESS_S - time.monotonic()
        if due <= 0:
            self._send_progress()
        else:
            self._progress_timer = self._loop.call_later(due, self._send_progress)

    def _send_progress(self) -> None:
        """The report names the term it serves: the member drops one of another term."""
        self._progress_timer = None
        self._last_progress = time.monotonic()
        with self._lock:
            term, wm = self.logic.term, self._progress_wm
        if wm >= 0:
            self.member.on_peer_progress.remote(self.peer_id, term, wm)

    async def set_faults(self, cut: list[str], drop: dict, delay_ms: dict) -> None:
        self.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))

    # -- the pump --------------------------------------------------------------------------
    def _kick(self) -> None:
        """Run the pump once in this loop turn, however many events asked for it."""
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = now_ms()
        with self._lock:
            if not self.logic.active:
                return
            reqs = self.logic.next_requests(now)
            need = self.logic.need
            term = self.logic.term
            wake = self.logic.next_wakeup_ms(now)
        for req in reqs:
            asyncio.ensure_future(self._send(req))
        if need is not None and not self._fetching:
            self._fetching = True
            asyncio.ensure_future(self._fetch(term, need.kind, need.index, need.count))
        if wake is not None:
            self._timer = self._loop.call_later(max(0.001, (wake - now) / 1000), self._pump)

    async def _fetch(self, term: int, kind: str, index: int, count: int | None = None) -> None:
        cfg = self.config.replication
        try:
            if kind == "batch":
                answer = await self.member.read_for_push.remote(
                    term, index, cfg.max_batch_push_bytes, count or cfg.max_batch_push_count
                )
                if answer is not None:
                    (first, count, payload, nbytes), info = answer
                    answer = (CachedBatch(first, count, payload, nbytes), info)
                with self._lock:
                    self.logic.took_batch(term, answer)
            else:
                answer = await self.member.entry_meta.remote(term, index)
                with self._lock:
                    self.logic.took_meta(term, index, answer)
        except (ray.exceptions.RayError, LedgerError) as exc:
            log.debug(
                "[%s->%s] term=%d fetch %s@%d failed: %s",
                self.self_id,
                self.peer_id,
                term,
                kind,
                index,
                exc,
            )
            await asyncio.sleep(0.05)
        finally:
            self._fetching = False
        self._kick()

    async def _send(self, req: PushEntryRequest) -> None:
        resp, t0 = None, time.perf_counter()
        try:
            if self.faults.active:
                await self.faults.before_send(self.peer_id)
            if self._follower is None:
                self._follower = ray.get_actor(
                    actor_name(self.group, self.peer_id), namespace=NAMESPACE
                )
            batch = req.batch
            if isinstance(batch, CachedBatch):
                payload = batch.payload
                if isinstance(payload, EntryBatch):
                    ref = self._follower.push.remote(replace(req, batch=payload), None)
                else:
                    ref = self._follower.push.remote(replace(req, batch=None), payload)
            else:
                ref = self._follower.push.remote(req, None)
            resp = await asyncio.wait_for(ref, self.config.rpc_timeout_ms / 1000)
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError) as exc:
            log.debug(
                "[%s->%s] push %s@%d term=%d failed: %s",
                self.self_id,
                self.peer_id,
                req.type.value,
                req.first_index,
                req.term,
                exc,
            )
            if isinstance(exc, ValueError):
                self._follower = None
        with self._lock:
            wm = self.logic.on_response(req, resp, now_ms())
        self._metrics.answered(t0, resp, self.logic)
        if wm is not None and not self._reporting:
            self._reporting = True
            asyncio.ensure_future(self._report(req.term))
        self._kick()

    async def _report(self, term: int, force: bool = False) -> None:
        """Report the follower's water mark (the latest, one report in flight at a time).
        The loop follows the current term: a report of an older term still in flight when
        a new term starts must not swallow the new term's first report."""
        try:
            while True:
                with self._lock:
                    if not self.logic.active:
                        return
                    term, wm = self.logic.term, self.logic.water_mark
                committed = await self.checker.report.remote(term, self.peer_id, wm)
                if committed is not None:
                    with self._lock:
                        due = self.logic.on_committed(term, committed)
                    if due:
                        self._kick()
                self._progress(term, wm)
                with self._lock:
                    if self.logic.term == term and self.logic.water_mark <= wm and not force:
                        return
                force = False
        except ray.exceptions.RayError as exc:
            log.debug("[%s->%s] report failed: %s", self.self_id, self.peer_id, exc)
        finally:
            self._reporting = False
