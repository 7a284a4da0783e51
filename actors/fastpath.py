"""The compiled steady-state path: one Ray Compiled Graph per leader term.

A plain Ray actor call costs 1-4 ms a hop on a small machine, and an append
crosses six of them (leader -> dispatcher -> follower -> dispatcher -> checker
-> leader).  While every follower keeps up, a leader runs that round as a Ray
Compiled Graph instead -- the same actors and the same methods, with arguments
and answers passed through shared-memory channels (about 1 ms for the whole
round here)::

    round --> dispatcher_p.cg_push --> follower_p.cg_push --> dispatcher_p.cg_ack
          --> checker.cg_report  (one chain per follower p; outputs back to the leader)

A graph moves at the pace of its slowest participant, so it never commits on a
majority by itself.  The leader watches every execution: when one is not fully
answered within ``stall_ms`` (half a heartbeat interval), or a participant
dies, it falls back to plain actor calls (dispatchers rewind to their
followers' water marks, the checker gets the waiting rounds again), tears the
graph down in the background, and compiles a new one after a backoff, once
every follower answers again.  Elections, COMPARE/TRUNCATE, catch-up and
resends always travel as plain calls.

Ray lets an actor run one compiled graph at a time, and a graph whose driver
died keeps its participants' loops waiting.  Members record the loops they run
(:func:`.ray_compat.install_loop_registry`), and a new leader asks each follower to drop
its old loops (:meth:`MemberActor.cg_reset`) before it compiles.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from .ray_compat import compile_options

log = logging.getLogger("rayledger.actors")

MAX_INFLIGHT = 8  # graph executions in flight (Ray's channels hold a bounded number)
MAX_ROUND_BYTES = 6 << 20  # larger rounds travel as plain calls
BUFFER_BYTES = 8 << 20  # per channel


# -- what travels through the graph -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GraphRound:
    """The graph's input: an announcement and the rounds it covers, for one generation."""

    gen: int
    announcement: Any  # logic.Announcement with an EntryBatch payload
    rounds: tuple[tuple[int, int, Any], ...]  # (first, last, token) per round


@dataclass(slots=True)
class _Execution:
    started: float
    announcement: Any
    rounds: tuple
    outputs: list = field(default_factory=list)
    waiting: int = 0


class FastPath:
    """The leader's side: compile, submit rounds, read answers, fall back, come back.

    It runs on a thread and event loop of its own, so compiling a graph (about a second
    of CPU) never stalls the member's loop or its heartbeats.  ``on_output(term,
    committed, resolved)`` gets every answer of the checker nodes and ``on_fallback(items)``
    the (announcement, rounds) that were queued or in flight when the graph was abandoned
    (they must travel again as plain calls); both are called on ``main_loop``.
    """

    def __init__(
        self,
        self_id: str,
        followers: dict[str, Any],
        dispatchers: dict[str, Any],
        checker: Any,
        stall_ms: int,
        on_output: Callable[[int, int | None, list], None],
        on_fallback: Callable[[list], None],
        main_loop: asyncio.AbstractEventLoop,
        retry_s: tuple[float, float] = (1.0, 15.0),
    ):
        self._main = main_loop
        self.self_id = self_id
        self.followers = followers
        self.dispatchers = dispatchers
        self.checker = checker
        self.stall_s = stall_ms / 1000
        self.on_output = on_output
        self.on_fallback = on_fallback
        self.retry_s = retry_s
        self.term = -1
        self.gen = 0
        self.graph = None
        self.active = False
        self._backoff = retry_s[0]
        self._building: asyncio.Task | None = None
        self._submitter: asyncio.Task | None = None
        self._queue: deque[GraphRound] = deque()
        self._inflight: deque[_Execution] = deque()
        self._watchdog: asyncio.TimerHandle | None = None
        self._retry: asyncio.TimerHandle | None = None
        self.fallbacks = 0
        self.compiles = 0
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        threading.Thread(
            target=self._loop.run_forever, name=f"rayledger-fastpath-{self_id}", daemon=True
        ).start()

    # -- called on the member's loop --------------------------------------------------------
    def start(self, term: int) -> None:
        """Lead ``term``: compile its graph in the background (plain calls meanwhile)."""
        self._loop.call_soon_threadsafe(self._start, term)

    def stop(self) -> None:
        """The term ended: leave the graph (the member fails the rounds of the term)."""
        self.active = False
        self._loop.call_soon_threadsafe(self._stop)

    def submit(self, announcement: Any, rounds: list[tuple[int, int, Any]]) -> bool:
        """Send a round through the graph; False when it must go as plain calls."""
        if not self.active or announcement.nbytes > MAX_ROUND_BYTES:
            return False
        self._loop.call_soon_threadsafe(self._enqueue, announcement, rounds)
        return True

    def _to_main(self, fn, *args) -> None:
        self._main.call_soon_threadsafe(fn, *args)

    # -- on the fast path's own loop --------------------------------------------------------
    def _start(self, term: int) -> None:
        self._stop()
        self.term = term
        self._backoff = self.retry_s[0]
        self._schedule_build(0.0)

    def _stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._building is not None:
            self._building.cancel()
            self._building = None
        self._abandon()
        self.term = -1

    def _abandon(self) -> list:
        self.active = False
        self.gen += 1
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._submitter is not None:
            self._submitter.cancel()
            self._submitter = None
        items = [(e.announcement, e.rounds) for e in self._inflight]
        items += [(g.announcement, g.rounds) for g in self._queue]
        self._inflight.clear()
        self._queue.clear()
        graph, self.graph = self.graph, None
        if graph is not None:
            threading.Thread(target=_teardown, args=(graph,), daemon=True).start()
        return items

    def _schedule_build(self, delay: float) -> None:
        if self._retry is not None:
            self._retry.cancel()
        self._retry = self._loop.call_later(delay, self._begin_build)

    def _begin_build(self) -> None:
        self._retry = None
        if self.term < 0 or self.active or self._building is not None:
            return
        self._building = asyncio.ensure_future(self._build(self.term))

    async def _build(self, term: int) -> None:
        try:
            # followers drop loops of older graphs (a dead leader's keep waiting forever)
            await asyncio.wait_for(
                asyncio.gather(*(f.cg_reset.remote(term) for f in self.followers.values())),
                5.0,
            )
            graph = self._compile()  # blocks this thread's loop only
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("[%s] term=%d: compiled path not built: %s", self.self_id, term, exc)
            self._building = None
            self._retry_later()
            return
        self._building = None
        if term != self.term:
            threading.Thread(target=_teardown, args=(graph,), daemon=True).start()
            return
        self.gen += 1
        gen = self.gen
        try:
            await asyncio.gather(
                self.checker.cg_begin.remote(term, gen),
                *(d.cg_begin.remote(term, gen) for d in self.dispatchers.values()),
            )
        except ray.exceptions.RayError as exc:
            log.info("[%s] term=%d: helpers refused the compiled path: %s", self.self_id, term, exc)
            threading.Thread(target=_teardown, args=(graph,), daemon=True).start()
            self._retry_later()
            return
        if term != self.term or gen != self.gen:
            # the term ended (or another build began) while the helpers were told: a graph
            # marked active now would be one nobody executes
            threading.Thread(target=_teardown, args=(graph,), daemon=True).start()
            return
        self.graph = graph
        self.active = True
        self.compiles += 1
        self._submitter = asyncio.ensure_future(self._submit_loop(gen))
        log.info("[%s] term=%d: compiled path on (generation %d)", self.self_id, term, gen)

    def _compile(self):
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as inp:
            outs = []
            for peer, f in self.followers.items():
                d = self.dispatchers[peer]
                reqs = d.cg_push.bind(inp)
                answers = f.cg_push.bind(reqs)
                ack = d.cg_ack.bind(answers)
                outs.append(self.checker.cg_report.bind(ack))
            dag = MultiOutputNode(outs)
        return dag.experimental_compile(**compile_options(MAX_INFLIGHT + 2, BUFFER_BYTES))

    def _retry_later(self) -> None:
        if self.term < 0:
            return
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self.retry_s[1])
        self._schedule_build(delay)

    # -- rounds ---------------------------------------------------------------------------
    def _enqueue(self, announcement: Any, rounds: list) -> None:
        if not self.active:  # left the graph since the member looked: plain calls
            self._to_main(self.on_fallback, [(announcement, tuple(rounds))])
            return
        q = self._queue
        if q and q[-1].announcement.nbytes + announcement.nbytes <= MAX_ROUND_BYTES:
            # still waiting for a slot: one execution carries both (contiguous entries)
            prev = q.pop()
            announcement = prev.announcement.followed_by(announcement)
            rounds = list(prev.rounds) + list(rounds)
        q.append(GraphRound(self.gen, announcement, tuple(rounds)))
        self._wake.set()

    async def _submit_loop(self, gen: int) -> None:
        g = self.graph
        try:
            while gen == self.gen:
                while not self._queue or len(self._inflight) >= MAX_INFLIGHT:
                    self._wake.clear()
                    await self._wake.wait()
                    if gen != self.gen:
                        return
                item = self._queue.popleft()
                ex = _Execution(time.monotonic(), item.announcement, item.rounds)
                futs = await g.execute_async(item)
                ex.waiting = len(futs)
                self._inflight.append(ex)
                self._arm_watchdog()
                for f in futs:
                    asyncio.ensure_future(self._collect(gen, ex, f))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if gen == self.gen:
                self.fallback(f"submit failed: {exc!r}")

    async def _collect(self, gen: int, ex: _Execution, fut) -> None:
        try:
            out = await fut
        except Exception as exc:
            if gen == self.gen:
                self.fallback(f"a participant failed: {type(exc).__name__}: {exc}")
            return
        if out is not None:
            # also from an abandoned generation: the checker serves it until its cg_end
            # arrives and may resolve there a round the fallback registered again
            self._to_main(self.on_output, *out)
        if gen != self.gen:
            return
        ex.waiting -= 1
        if ex.waiting == 0:
            while self._inflight and self._inflight[0].waiting == 0:
                self._inflight.popleft()
            self._wake.set()
            self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if not self._inflight:
            return
        due = self._inflight[0].started + self.stall_s - time.monotonic()
        self._watchdog = self._loop.call_later(max(0.0, due), self._check_stall)

    def _check_stall(self) -> None:
        self._watchdog = None
        if self._inflight and time.monotonic() - self._inflight[0].started >= self.stall_s:
            self.fallback(f"an execution waited more than {self.stall_s * 1000:.0f} ms")
        else:
            self._arm_watchdog()

    def fallback(self, why: str) -> None:
        """Leave the graph: plain calls carry everything until a new graph is built."""
        if not self.active:
            return
        self.fallbacks += 1
        gen = self.gen
        log.warning(
            "[%s] term=%d: compiled path off (generation %d): %s; plain calls take over",
            self.self_id,
            self.term,
            gen,
            why,
        )
        items = self._abandon()
        for d in self.dispatchers.values():
            d.cg_end.remote(gen)
        self.checker.cg_end.remote(gen)
        self._to_main(self.on_fallback, items)
        self._retry_later()


def _teardown(graph) -> None:
    try:
        graph.teardown()
    except Exception as exc:
        log.debug("compiled graph teardown: %s", exc)
