"""The compiled path's core and its driver (sans-I/O: no Ray, no asyncio, no clock).

:class:`FastPathLogic` decides everything about a leader's compiled graph
(:mod:`rayledger.actors.fastpath` says what the graph is): when to build one and how long to back
off after a failure, when a built graph may go live (the term and generation still hold), which
rounds go through it (size cap; rounds waiting for a slot merge, within the cap), how many
executions are in flight, when an execution waited too long (the watchdog), and what a fallback
hands back to plain calls and to whom.  Its one way in and out is :meth:`FastPathLogic.step`:
an event's answer, and for :class:`~rayledger.replication.messages.TurnEnd` its Ready, a
:class:`FastPathReady`.

:class:`FastPathDriver` runs it on the fast path's own loop; the member's thread reaches it
through :meth:`FastPathDriver.start`, :meth:`FastPathDriver.stop` and
:meth:`FastPathDriver.submit`.  The graph itself is opaque here: the Ray transport
compiles a Ray Compiled Graph, the simulation a set of in-order channels.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from rayledger.actors.core.pump import Driver
from rayledger.replication.checker import Resolution
from rayledger.replication.messages import TURN_END, TurnEnd

MAX_INFLIGHT = 8  # graph executions in flight (Ray's channels hold a bounded number)
PARK_MS = 2000  # a graph that carried no round this long is torn down (parked)
MAX_ROUND_BYTES = 6 << 20  # larger rounds travel as plain calls
RETRY_MS = (1000, 15000)  # backoff before building again: first, largest


class Route(Enum):
    """How a round offered to the compiled path travels (the answer to :class:`Admits`)."""

    GRAPH = "graph"
    PLAIN = "plain"
    RESUME = "resume"  # plain calls, and the parked path builds its graph again now


@dataclass(frozen=True, slots=True)
class GraphRound:
    """The graph's input: an announcement and the rounds it covers, for one generation."""

    gen: int
    announcement: Any  # logic.Announcement with an EntryBatch payload
    rounds: tuple[tuple[int, int, Any], ...]  # (first, last, token) per round


@dataclass(eq=False, slots=True)
class Execution:
    """One graph execution in flight: answered once every chain's output came back."""

    started: int
    item: GraphRound
    waiting: int

    @property
    def gen(self) -> int:
        return self.item.gen


@dataclass(slots=True)
class FastPathReady:
    build: tuple[int, int] | None = None  # (build id, term): reset the followers, compile
    begin: tuple[int, int] | None = None  # (term, gen): the helpers serve the built graph
    executions: list[tuple[Any, Execution]] = field(default_factory=list)  # (graph, ...)
    ended: int | None = None  # generation left: the helpers stop serving it (cg_end)
    fallback: list[tuple[Any, tuple]] = field(default_factory=list)  # (announcement, rounds)
    outputs: list[tuple] = field(default_factory=list)  # (term, committed, outcomes)
    teardown: list[Any] = field(default_factory=list)  # graphs nobody executes any more
    wake_at_ms: int | None = None


# ====================================================================== events in


@dataclass(frozen=True, slots=True)
class Start:
    """Lead ``term``: build its graph (plain calls meanwhile)."""

    term: int


@dataclass(frozen=True, slots=True)
class Stop:
    """The term ended: leave the graph; the member fails the rounds of the term."""


@dataclass(frozen=True, slots=True)
class Leave:
    """The member's side of a stop, on its own thread: no round goes to the graph now."""


@dataclass(frozen=True, slots=True)
class Admits:
    """How a round travels: through the graph or as plain calls (answered a :class:`Route`)."""

    announcement: Any


@dataclass(frozen=True, slots=True)
class Enqueue:
    """A round the member sent to the graph (it looked active then)."""

    announcement: Any
    rounds: Sequence


@dataclass(frozen=True, slots=True)
class SetEnabled:
    """Switch the compiled path on or off while leading."""

    enabled: bool


@dataclass(frozen=True, slots=True)
class Built:
    """A build ended: ``graph`` compiled for ``term``, or ``error``."""

    build_id: int
    term: int
    graph: Any
    error: str | None


@dataclass(frozen=True, slots=True)
class Began:
    """The helpers answered ``cg_begin`` for (``term``, ``gen``): all of them (``ok``)."""

    term: int
    gen: int
    ok: bool


@dataclass(frozen=True, slots=True)
class Collected:
    """One chain of ``ex`` answered (``out``: its checker's answer, or None)."""

    ex: Execution
    out: tuple | None


@dataclass(frozen=True, slots=True)
class GraphFailed:
    """A participant of graph ``gen`` failed, or a submit did."""

    gen: int
    why: str


FastPathEvent = (
    Start
    | Stop
    | Leave
    | Admits
    | Enqueue
    | SetEnabled
    | Built
    | Began
    | Collected
    | GraphFailed
    | TurnEnd
)


class FastPathLogic:
    """A leader's compiled graph over ``followers`` followers: its life and its rounds.

    Parking: every participant of a live Ray Compiled Graph busy-waits on its input
    channel (Ray 2.60's ``ReadAcquire`` spins with ``sched_yield``), about a core each, load
    or not.  So a graph that carried no round for ``park_ms`` is torn down, and the first
    round offered to a parked path goes as plain calls while the graph is built again
    (about 0.2 s of compile here): an idle group costs no spinning, a loaded one keeps its
    graph."""

    def __init__(
        self,
        followers: int,
        stall_ms: int,
        retry_ms: tuple[int, int] = RETRY_MS,
        max_inflight: int = MAX_INFLIGHT,
        max_round_bytes: int = MAX_ROUND_BYTES,
        park_ms: int = PARK_MS,
    ):
        self.followers = followers
        self.stall_ms = stall_ms
        self.park_ms = park_ms
        self.parked = False
        self.parks = 0
        self._last_round_ms = 0
        self._live_since = 0  # when the live graph began
        self.retry_ms = retry_ms
        self.max_inflight = max_inflight
        self.max_round_bytes = max_round_bytes
        self.enabled = True
        self.term = -1
        self.gen = 0
        self.graph: Any = None  # the live graph (opaque), or None
        self.active = False
        self.building: int | None = None  # the build in progress
        self._build_ids = itertools.count(1)
        self._built: tuple[int, int, Any] | None = None  # (term, gen, graph) being begun
        self._backoff = retry_ms[0]
        self._build_at: int | None = None
        self.queue: deque[GraphRound] = deque()
        self.inflight: deque[Execution] = deque()
        self._out = FastPathReady()
        self.compiles = 0
        self.fallbacks = 0
        self.raced = 0  # graphs built for a term or generation that ended meanwhile
        self.last_fallback = ""

    def __repr__(self) -> str:
        return (
            f"FastPath(term={self.term} gen={self.gen} active={self.active} "
            f"building={self.building} queue={len(self.queue)} inflight={len(self.inflight)} "
            f"compiles={self.compiles} fallbacks={self.fallbacks})"
        )

    # -- the way in ----------------------------------------------------------------------
    def step(self, ev: FastPathEvent, now_ms: int) -> Any:  # noqa: C901 -- one case each
        """Deliver one event; returns the call's direct answer (``Admits``), the Ready
        (``TurnEnd``), else None."""
        match ev:
            case TurnEnd():
                return self._ready(now_ms)
            case Admits():
                return self._admits(ev.announcement, now_ms)
            case Enqueue():
                self._last_round_ms = now_ms
                self._enqueue(ev.announcement, ev.rounds)
            case Collected():
                self._collected(ev.ex, ev.out)
            case Leave():
                self.active = False
            case Start():
                self._start(ev.term, now_ms)
            case Stop():
                self._stop()
            case SetEnabled():
                self._set_enabled(ev.enabled, now_ms)
            case Built():
                self._on_built(ev.build_id, ev.term, ev.graph, ev.error, now_ms)
            case Began():
                self._on_began(ev.term, ev.gen, ev.ok, now_ms)
            case GraphFailed():
                if ev.gen == self.gen:
                    self._fallback(ev.why, now_ms)
            case _:
                raise TypeError(f"not a fast-path event: {ev!r}")
        return None

    # -- its cases -----------------------------------------------------------------------------
    @property
    def offered(self) -> bool:
        """Whether the member offers its rounds (``Admits``): while the graph is live, and
        while it is parked (the next round wakes it)."""
        return self.active or self.parked

    def _admits(self, announcement: Any, now_ms: int) -> Route:
        if self.active and announcement.nbytes <= self.max_round_bytes:
            self._last_round_ms = now_ms
            return Route.GRAPH
        if self.parked:
            self.parked = False
            self._last_round_ms = now_ms
            if self.term >= 0 and self.enabled and self.building is None:
                self._build_at = now_ms
                return Route.RESUME
        return Route.PLAIN

    def _park(self) -> None:
        """No round for ``park_ms``: tear the graph down (its participants stop spinning).
        It served until it idled: the next failure backs off from the shortest wait."""
        self.parks += 1
        self._backoff = self.retry_ms[0]
        self._out.ended = self.gen
        self._abandon()  # nothing in flight or queued: nothing falls back
        self.parked = True
        self._build_at = None

    def _start(self, term: int, now_ms: int) -> None:
        self._stop()
        self._last_round_ms = now_ms
        self.term = term
        self._backoff = self.retry_ms[0]
        self._build_at = now_ms

    def _stop(self) -> None:
        """Leave the graph.  Its rounds go back as plain calls: a stop within the term (a
        reconfiguration, a restored helper) leaves them waiting for an answer -- dropped,
        they would wait until the term ended; at a term's end the member fails them and
        finds none of them waiting."""
        self._build_at = None
        self.parked = False
        self.building = None
        self._out.fallback += self._abandon()
        self.term = -1

    def _set_enabled(self, enabled: bool, now_ms: int) -> None:
        """Off: fall back, build none; on: build when leading."""
        self.enabled = enabled
        if not enabled:
            self.parked = False
            self._fallback("switched off", now_ms)
        elif self.term >= 0 and not self.active and self.building is None:
            self._build_at = now_ms

    def _on_built(
        self, build_id: int, term: int, graph: Any, error: str | None, now_ms: int
    ) -> None:
        if build_id != self.building:
            if graph is not None:
                self._out.teardown.append(graph)  # stopped or restarted meanwhile
            return
        self.building = None
        if error is not None:
            self._retry_later(now_ms)
            return
        if term != self.term:
            self._out.teardown.append(graph)
            return
        self.gen += 1
        self._built = (term, self.gen, graph)
        self._out.begin = (term, self.gen)

    def _on_began(self, term: int, gen: int, ok: bool, now_ms: int) -> None:
        built, self._built = self._built, None
        if built is None or built[:2] != (term, gen):
            return
        graph = built[2]
        if not ok:
            self._out.teardown.append(graph)
            self._retry_later(now_ms)
            return
        if term != self.term or gen != self.gen or not self.enabled:
            # the term ended (or another build began) while the helpers were told: a graph
            # marked active now would be one nobody executes
            self.raced += 1
            self._out.teardown.append(graph)
            return
        self.graph = graph
        self.active = True
        self.compiles += 1
        self._live_since = now_ms
        self._last_round_ms = max(self._last_round_ms, now_ms)  # a full park_ms from now

    def _enqueue(self, announcement: Any, rounds: Sequence) -> None:
        if not self.active:  # left the graph since the member looked: plain calls
            self._out.fallback.append((announcement, tuple(rounds)))
            return
        q = self.queue
        if q and q[-1].announcement.nbytes + announcement.nbytes <= self.max_round_bytes:
            # still waiting for a slot: one execution carries both (contiguous entries)
            prev = q.pop()
            announcement = prev.announcement.followed_by(announcement)
            rounds = list(prev.rounds) + list(rounds)
        q.append(GraphRound(self.gen, announcement, tuple(rounds)))

    def _collected(self, ex: Execution, out: tuple | None) -> None:
        """``out`` is the checker's (term, committed, outcomes)."""
        if out is not None:
            # also from an abandoned generation: the checker serves it until its cg_end
            # arrives and may resolve there a round the fallback registered again
            self._out.outputs.append(out)
        if ex.gen != self.gen:
            return
        ex.waiting -= 1
        if ex.waiting == 0:
            while self.inflight and self.inflight[0].waiting == 0:
                self.inflight.popleft()

    def _fallback(self, why: str, now_ms: int) -> None:
        """Leave the graph: plain calls carry everything until a new graph is built."""
        if not self.active:
            return
        self.fallbacks += 1
        self.last_fallback = why
        if now_ms - self._live_since >= self.retry_ms[1]:
            # it served longer than the longest backoff: a stall now and then (a busy host)
            # must not keep the path off for good; the backoff grows only for graphs that
            # fail soon after they begin
            self._backoff = self.retry_ms[0]
        self._out.ended = self.gen
        self._out.fallback += self._abandon()
        self._retry_later(now_ms)

    # -- inside ------------------------------------------------------------------------------
    def _abandon(self) -> list[tuple[Any, tuple]]:
        self.active = False
        self.gen += 1
        items = [(e.item.announcement, e.item.rounds) for e in self.inflight]
        items += [(g.announcement, g.rounds) for g in self.queue]
        self.inflight.clear()
        self.queue.clear()
        if self.graph is not None:
            self._out.teardown.append(self.graph)
            self.graph = None
        return items

    def _retry_later(self, now_ms: int) -> None:
        if self.term < 0:
            return
        self._build_at = now_ms + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_ms[1])

    # -- the way out ---------------------------------------------------------------------------
    def _ready(self, now_ms: int) -> FastPathReady:
        if self.inflight and now_ms - self.inflight[0].started >= self.stall_ms:
            self._fallback(f"an execution waited more than {self.stall_ms} ms", now_ms)
        elif (self.active and not self.inflight and not self.queue
              and now_ms >= self._last_round_ms + self.park_ms):  # fmt: skip
            self._park()
        out, self._out = self._out, FastPathReady()
        wake = None
        if self._build_at is not None:
            if now_ms >= self._build_at:
                self._build_at = None
                if self.term >= 0 and self.enabled and not self.active and self.building is None:
                    self.building = next(self._build_ids)
                    out.build = (self.building, self.term)
            else:
                wake = self._build_at
        while self.active and self.queue and len(self.inflight) < self.max_inflight:
            ex = Execution(now_ms, self.queue.popleft(), self.followers)
            self.inflight.append(ex)
            out.executions.append((self.graph, ex))
        if self.inflight:
            due = self.inflight[0].started + self.stall_ms
            wake = due if wake is None else min(wake, due)
        elif self.active and not self.queue:  # idle: park then
            idle_until = self._last_round_ms + self.park_ms
            wake = idle_until if wake is None else min(wake, idle_until)
        out.wake_at_ms = wake
        return out


class FastPathPorts(Protocol):
    """What the fast path's Ready turns into; answers come back through the driver."""

    def build(self, build_id: int, term: int) -> None: ...  # -> Built

    def begin(self, term: int, gen: int) -> None: ...  # -> Began

    def execute(self, graph: Any, ex: Execution) -> None: ...  # -> Collected / GraphFailed

    def end(self, gen: int) -> None: ...  # cg_end to the dispatchers and the checker

    def fallback(self, items: list) -> None: ...  # to the member: plain calls again

    def output(self, r: Resolution) -> None: ...

    def teardown(self, graph: Any) -> None: ...


class FastPathDriver(Driver[FastPathLogic, FastPathPorts]):
    """Delivers events to a :class:`FastPathLogic` on the fast path's loop and carries its
    Ready out.  The member's thread calls :meth:`start`, :meth:`stop` and :meth:`submit`;
    their events hop onto the fast path's loop in order (``Leave`` and ``Admits`` are
    answered on the member's thread, under the lock)."""

    # -- from the member's thread --------------------------------------------------------------
    def start(self, term: int) -> None:
        self._hop(Start(term))

    def stop(self) -> None:
        self.deliver(Leave())
        self._hop(Stop())

    def submit(self, announcement: Any, rounds: list) -> bool:
        """Send a round through the graph; False when it must go as plain calls."""
        route = self.deliver(Admits(announcement))
        if route is Route.GRAPH:
            self._hop(Enqueue(announcement, rounds))
            return True
        if route is Route.RESUME:  # the parked path builds its graph: run its Ready now
            self.pump.loop.call_threadsafe(self.pump.run)
        return False

    def set_enabled(self, enabled: bool) -> None:
        self._hop(SetEnabled(enabled))

    def _hop(self, ev: FastPathEvent) -> None:
        self.pump.loop.call_threadsafe(self.deliver, ev)

    def _after(self, ev: FastPathEvent, reply: Any) -> Any:
        if not isinstance(ev, Leave | Admits):  # on the fast path's loop: carry the Ready out
            self.pump.run()
        return reply

    def _run(self, now_ms: int) -> int | None:
        with self.lock:
            r = self.logic.step(TURN_END, now_ms)
        ports = self.ports
        for graph in r.teardown:
            ports.teardown(graph)
        if r.ended is not None:
            ports.end(r.ended)
        if r.fallback:
            ports.fallback(r.fallback)
        for out in r.outputs:
            ports.output(Resolution(*out))
        if r.build is not None:
            ports.build(*r.build)
        if r.begin is not None:
            ports.begin(*r.begin)
        for graph, ex in r.executions:
            ports.execute(graph, ex)
        return r.wake_at_ms
