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
from collections import deque
from collections.abc import Callable
from typing import Any

import ray
from rayledger.actors.aioloop import AsyncioLoop
from rayledger.actors.core.fastpath import (
    PARK_MS,
    RETRY_MS,
    Began,
    Built,
    Collected,
    Execution,
    FastPathDriver,
    FastPathLogic,
    GraphFailed,
    GraphRound,
)
from rayledger.actors.ray_compat import compile_options
from rayledger.replication.checker import Resolution

log = logging.getLogger("rayledger.actors")

BUFFER_BYTES = 8 << 20  # per channel

__all__ = ["FastPath", "GraphRound"]


class FastPath:
    """The leader's side: the Ray transport of a
    :class:`~rayledger.actors.core.fastpath.FastPathLogic`.

    It runs on a thread and event loop of its own, so compiling a graph (about a second of CPU)
    never stalls the member's loop or its heartbeats.  ``on_output(r)`` (a
    :class:`~rayledger.replication.checker.Resolution`, as the checker sends) gets every answer of
    the checker nodes and ``on_fallback(items)`` the (announcement, rounds) that were queued or in
    flight when the graph was abandoned (they must travel again as plain calls); both are called on
    ``main_loop``.  The core decides; this class compiles, tells the helpers, submits in order and
    collects.
    """

    def __init__(
        self,
        self_id: str,
        followers: dict[str, Any],
        dispatchers: dict[str, Any],
        checker: Any,
        stall_ms: int,
        on_output: Callable[[Resolution], None],
        on_fallback: Callable[[list], None],
        main_loop: asyncio.AbstractEventLoop,
        retry_ms: tuple[int, int] = RETRY_MS,
        park_ms: int = PARK_MS,
    ):
        self._main = main_loop
        self.self_id = self_id
        self.followers = followers
        self.dispatchers = dispatchers
        self.checker = checker
        self.on_output = on_output
        self.on_fallback = on_fallback
        self._loop = asyncio.new_event_loop()
        self.driver = FastPathDriver(
            FastPathLogic(len(followers), stall_ms, retry_ms, park_ms=park_ms),
            self,
            lock=threading.Lock(),  # the graph's threads deliver too
        )
        self.driver.attach(AsyncioLoop(self._loop))
        self.logic = self.driver.logic
        self._to_submit: deque[tuple[Any, Execution]] = deque()
        self._submitting = False
        threading.Thread(
            target=self._loop.run_forever, name=f"rayledger-fastpath-{self_id}", daemon=True
        ).start()

    # -- called on the member's loop --------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.logic.active

    @property
    def compiles(self) -> int:
        return self.logic.compiles

    @property
    def fallbacks(self) -> int:
        return self.logic.fallbacks

    @property
    def parks(self) -> int:
        return self.logic.parks

    def start(self, term: int) -> None:
        """Lead ``term``: compile its graph in the background (plain calls meanwhile)."""
        self.driver.start(term)

    def stop(self) -> None:
        """The term ended: leave the graph (the member fails the rounds of the term)."""
        self.driver.stop()

    def set_enabled(self, enabled: bool) -> None:
        """Off: fall back to plain calls and build no graph; on: build one while leading."""
        self.driver.set_enabled(enabled)

    def submit(self, announcement: Any, rounds: list[tuple[int, int, Any]]) -> bool:
        """Send a round through the graph; False when it must go as plain calls."""
        return self.driver.submit(announcement, rounds)

    # -- the ports: on the fast path's own loop -----------------------------------------------
    def build(self, build_id: int, term: int) -> None:
        asyncio.ensure_future(self._build(build_id, term))

    async def _build(self, build_id: int, term: int) -> None:
        try:
            # followers drop loops of older graphs (a dead leader's keep waiting forever)
            await asyncio.wait_for(
                asyncio.gather(*(f.cg_reset.remote(term) for f in self.followers.values())),
                5.0,
            )
            graph = self._compile()  # blocks this thread's loop only
        except Exception as exc:
            log.info("[%s] term=%d: compiled path not built: %s", self.self_id, term, exc)
            self.driver.deliver(Built(build_id, term, None, repr(exc)))
            return
        self.driver.deliver(Built(build_id, term, graph, None))

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
        return dag.experimental_compile(
            **compile_options(self.logic.max_inflight + 2, BUFFER_BYTES)
        )

    def begin(self, term: int, gen: int) -> None:
        asyncio.ensure_future(self._begin(term, gen))

    async def _begin(self, term: int, gen: int) -> None:
        try:
            await asyncio.gather(
                self.checker.cg_begin.remote(term, gen),
                *(d.cg_begin.remote(term, gen) for d in self.dispatchers.values()),
            )
            ok = True
        except ray.exceptions.RayError as exc:
            log.info("[%s] term=%d: helpers refused the compiled path: %s", self.self_id, term, exc)
            ok = False
        self.driver.deliver(Began(term, gen, ok))
        if ok and self.logic.active and self.logic.gen == gen:
            log.info("[%s] term=%d: compiled path on (generation %d)", self.self_id, term, gen)

    def execute(self, graph: Any, ex: Execution) -> None:
        """Executions are submitted in order, one at a time."""
        self._to_submit.append((graph, ex))
        if not self._submitting:
            self._submitting = True
            asyncio.ensure_future(self._submit_all())

    async def _submit_all(self) -> None:
        try:
            while self._to_submit:
                graph, ex = self._to_submit.popleft()
                if graph is not self.logic.graph:
                    continue  # left while it waited: the fallback took its rounds
                try:
                    futs = await graph.execute_async(ex.item)
                except Exception as exc:
                    self.driver.deliver(GraphFailed(ex.gen, f"submit failed: {exc!r}"))
                    continue
                for f in futs:
                    asyncio.ensure_future(self._collect(ex, f))
        finally:
            self._submitting = False

    async def _collect(self, ex: Execution, fut) -> None:
        try:
            out = await fut
        except Exception as exc:
            self.driver.deliver(
                GraphFailed(ex.gen, f"a participant failed: {type(exc).__name__}: {exc}")
            )
            return
        self.driver.deliver(Collected(ex, out))

    def end(self, gen: int) -> None:
        if self.logic.parked:
            log.info("[%s] term=%d: compiled path parked (generation %d, idle %d ms)",
                     self.self_id, self.logic.term, gen, self.logic.park_ms)  # fmt: skip
        else:
            log.warning(
                "[%s] term=%d: compiled path off (generation %d): %s; plain calls take over",
                self.self_id,
                self.logic.term,
                gen,
                self.logic.last_fallback,
            )
        for d in self.dispatchers.values():
            d.cg_end.remote(gen)
        self.checker.cg_end.remote(gen)

    def fallback(self, items: list) -> None:
        self._main.call_soon_threadsafe(self.on_fallback, items)

    def output(self, r: Resolution) -> None:
        self._main.call_soon_threadsafe(self.on_output, r)

    def teardown(self, graph: Any) -> None:
        threading.Thread(target=_teardown, args=(graph,), daemon=True).start()


def _teardown(graph) -> None:
    try:
        graph.teardown()
    except Exception as exc:
        log.debug("compiled graph teardown: %s", exc)
