"""The floor of the append path: the card's message pattern on bare Ray, with nothing of
rayledger in it, measured the way ``bench group`` measures a group.

rayledger's figures alone cannot say how much of an append's cost is rayledger's and how
much is Ray's on this machine, at this moment: the machine's speed drifts by up to 2x over
minutes.  So every ``bench group`` run also drives this chain, in the same window and through
the same load, timing and CPU code (:mod:`.group`), and reports each figure as a ratio to it.

The chain, each actor with ``num_cpus=0`` (``followers`` followers, 2 for a 3-member group)::

  client --append--> leader --push--> dispatcher_i --append--> follower_i
                       |                   |  <---- water mark ----'
                       +--register--> checker <--report-- dispatcher_i
  leader <--committed-- checker;  the leader answers the client's call

Nine actor calls per round.  The leader and every follower write each round to an
in-memory buffer (nothing on disk); payloads travel inline, one joined blob per round.  At
most one round waits for its quorum (the leader counts itself, as a stored leader does);
appends arriving meanwhile join the next round.  The client coalesces as ``LedgerClient``
does: threads enqueue, one call carries everything queued, at most 4 calls in flight, and an
append goes out from its caller's thread when nothing is queued.

Concurrency models (``actors``), per actor: ``threaded`` (the default, as rayledger runs its
actors) makes every actor a threaded (sync) one: the leader's calls block a thread each and a
lock owns its state, a follower runs one call at a time (which keeps its rounds in order), a
dispatcher waits for its follower's answer and the checker's, the checker's state is under a
lock.  ``mixed`` makes the leader and the followers asyncio actors (the leader starts a round
at the end of its loop turn, so calls that land together share it), ``asyncio`` every
actor.

The actor classes are built inside a function, so Ray ships them by value and the actors'
processes never import rayledger (:meth:`FloorChain.processes` shows what they loaded).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from .loads import batch_phase, concurrent_phase, pct

#: What each leader and follower keeps of its log before starting its buffer over.
BUFFER_CAP = 64 << 20
#: The rayledger figures, as ``bench group`` names them, and the floor's figure each is set
#: against: ``<ratio>`` = rayledger's figure / the floor's.
RATIOS = {
    "single_p50_over_floor": ("single_p50_ms", "floor_single_p50_ms"),
    "concurrent_over_floor": ("concurrent_entries_per_s", "floor_concurrent_entries_per_s"),
    "cpu_over_floor": ("concurrent_cpu_ms_per_append", "floor_cpu_ms_per_append"),
    "batch_over_floor": ("batch_entries_per_s", "floor_batch_entries_per_s"),
}


class FloorError(Exception):
    """An append of the floor failed or got no answer in time."""


#: The floor's concurrency models: which of (leader, dispatcher, follower, checker) run as
#: threaded actors; the others are asyncio actors.
ACTOR_MODELS = {
    "mixed": (False, True, False, True),
    "asyncio": (False, False, False, False),
    "threaded": (True, True, True, True),
}


def _actor_classes(actors: str, cap: int = BUFFER_CAP) -> tuple[Any, Any, Any, Any]:
    """The leader, dispatcher, follower and checker classes for the model ``actors`` (one
    of :data:`ACTOR_MODELS`; local classes: Ray pickles them by value, so nothing here may
    call a module-level function of this file)."""
    if actors not in ACTOR_MODELS:
        raise ValueError(f"floor actors {actors!r}: one of {', '.join(ACTOR_MODELS)}")
    threaded = ACTOR_MODELS[actors]

    class FloorLeaderLog:
        """The leader's side of rounds: the next round gathers, one round waits."""

        def __init__(self) -> None:
            self.end = 0  # the last index stored
            self.log = bytearray()
            self.next: list = []  # (bodies, future) joining the next round
            self.waiting: tuple | None = None  # (last index, [(future, first index)])
            self.dispatchers: list = []
            self.checker = None

        def setup(self, dispatchers: list, checker) -> None:
            self.dispatchers, self.checker = dispatchers, checker

        def start_round(self) -> None:
            """Store everything gathered as one round and send it out (nothing waits)."""
            if self.waiting is not None or not self.next:
                return
            calls, self.next = self.next, []
            first = self.end + 1
            owners, parts, at = [], [], first
            for bodies, fut in calls:
                owners.append((fut, at))
                at += len(bodies)
                parts += bodies
            payload = b"".join(parts)
            self.end = at - 1
            if len(self.log) > cap:
                del self.log[:]
            self.log += payload
            self.waiting = (self.end, owners)
            self.checker.register.remote(self.end)
            for d in self.dispatchers:
                d.push.remote(first, self.end, payload)

        def resolve(self, index: int) -> None:
            """The checker says ``index`` is on a quorum: answer the waiting round's calls."""
            if self.waiting is None or index < self.waiting[0]:
                return
            _, owners = self.waiting
            self.waiting = None
            for fut, first in owners:
                if not fut.done():
                    fut.set_result(first)
            self.start_round()

    class FollowerLog:
        def __init__(self) -> None:
            self.end = 0
            self.log = bytearray()

        def store(self, first: int, last: int, payload: bytes) -> int:
            if first != self.end + 1:
                raise RuntimeError(f"round {first}..{last} after {self.end}")
            if len(self.log) > cap:
                del self.log[:]
            self.log += payload
            self.end = last
            return last

    class Quorum:
        """The checker's count: rounds registered, followers' water marks."""

        def __init__(self, leader, followers: int, quorum: int) -> None:
            self.leader = leader
            self.rank = quorum - 2  # the leader counts itself: quorum - 1 followers needed
            self.marks = [0] * followers
            self.rounds: collections.deque = collections.deque()

        def add(self, last: int) -> None:
            self.rounds.append(last)
            self.check()

        def mark(self, peer: int, wm: int) -> None:
            self.marks[peer] = max(self.marks[peer], wm)
            self.check()

        def check(self) -> None:
            at = sorted(self.marks, reverse=True)[self.rank]
            done = None
            while self.rounds and self.rounds[0] <= at:
                done = self.rounds.popleft()
            if done is not None:
                self.leader.committed.remote(done)

    def _process(self) -> tuple[int, list[str]]:
        """This actor's pid and the rayledger modules its process has loaded."""
        return os.getpid(), sorted(m for m in sys.modules if m.startswith("rayledger"))

    # appends block a thread each until their round commits: the checker's answer has
    # threads of its own, so no number of callers can starve it
    @ray.remote(num_cpus=0, max_concurrency=256, concurrency_groups={"commit": 1})
    class Leader(FloorLeaderLog):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()

        def append(self, bodies: list[bytes]) -> int:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            with self.lock:  # the round goes out under the lock: rounds stay in order
                self.next.append((bodies, fut))
                self.start_round()
            return fut.result()

        @ray.method(concurrency_group="commit")
        def committed(self, index: int) -> None:
            with self.lock:
                self.resolve(index)

        process = _process

    @ray.remote(num_cpus=0, max_concurrency=1)
    class Dispatcher:
        def __init__(self, peer: int, follower, checker) -> None:
            self.peer, self.follower, self.checker = peer, follower, checker

        def push(self, first: int, last: int, payload: bytes) -> None:
            wm = ray.get(self.follower.append.remote(first, last, payload))
            ray.get(self.checker.report.remote(self.peer, wm))

        process = _process

    @ray.remote(num_cpus=0, max_concurrency=1)
    class Follower(FollowerLog):
        def append(self, first: int, last: int, payload: bytes) -> int:
            return self.store(first, last, payload)

        process = _process

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Checker(Quorum):
        def __init__(self, leader, followers: int, quorum: int) -> None:
            super().__init__(leader, followers, quorum)
            self.lock = threading.Lock()

        def register(self, last: int) -> None:
            with self.lock:
                self.add(last)

        def report(self, peer: int, wm: int) -> None:
            with self.lock:
                self.mark(peer, wm)

        process = _process

    @ray.remote(num_cpus=0)
    class AsyncLeader(FloorLeaderLog):
        def __init__(self) -> None:
            super().__init__()
            self.scheduled = False

        def start_soon(self) -> None:
            self.scheduled = False
            self.start_round()

        async def append(self, bodies: list[bytes]) -> int:
            fut = asyncio.get_running_loop().create_future()
            self.next.append((bodies, fut))
            if self.waiting is None and not self.scheduled:  # the round leaves at turn's end
                self.scheduled = True
                asyncio.get_running_loop().call_soon(self.start_soon)
            return await fut

        async def committed(self, index: int) -> None:
            self.resolve(index)

        async def process(self) -> tuple[int, list[str]]:
            return _process(self)

    @ray.remote(num_cpus=0)
    class AsyncDispatcher:
        def __init__(self, peer: int, follower, checker) -> None:
            self.peer, self.follower, self.checker = peer, follower, checker

        async def push(self, first: int, last: int, payload: bytes) -> None:
            wm = await self.follower.append.remote(first, last, payload)
            await self.checker.report.remote(self.peer, wm)

        async def process(self) -> tuple[int, list[str]]:
            return _process(self)

    @ray.remote(num_cpus=0)
    class AsyncFollower(FollowerLog):
        async def append(self, first: int, last: int, payload: bytes) -> int:
            return self.store(first, last, payload)

        async def process(self) -> tuple[int, list[str]]:
            return _process(self)

    @ray.remote(num_cpus=0)
    class AsyncChecker(Quorum):
        async def register(self, last: int) -> None:
            self.add(last)

        async def report(self, peer: int, wm: int) -> None:
            self.mark(peer, wm)

        async def process(self) -> tuple[int, list[str]]:
            return _process(self)

    lt, dt, ft, ct = threaded
    return (
        Leader if lt else AsyncLeader,
        Dispatcher if dt else AsyncDispatcher,
        Follower if ft else AsyncFollower,
        Checker if ct else AsyncChecker,
    )


@dataclass(eq=False)
class _FloorPending:
    bodies: Sequence[bytes]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class FloorClient:
    """``LedgerClient``'s coalescing and nothing else: an append joins a queue, a sender
    thread sends everything queued as one call once one of ``max_in_flight`` slots is free,
    and an append goes out from its caller's thread when nothing is queued."""

    def __init__(
        self,
        leader,
        max_in_flight: int = 4,
        max_batch_entries: int = 20_000,
        max_batch_bytes: int = 4 << 20,
        timeout_s: float = 30.0,
    ) -> None:
        self.leader, self.max_in_flight, self.timeout_s = leader, max_in_flight, timeout_s
        self.max_batch_entries, self.max_batch_bytes = max_batch_entries, max_batch_bytes
        self._cv = threading.Condition()
        self._queue: collections.deque[_FloorPending] = collections.deque()
        self._in_flight = 0
        self._sender: threading.Thread | None = None
        self._closed = False

    def append(self, body: bytes) -> int:
        """Append one entry; its index once a quorum stored it."""
        return self._wait(self._submit([body]))

    def append_batch(self, bodies: Sequence[bytes]) -> int:
        """Append entries in one call; the index of the first once a quorum stored them."""
        return self._wait(self._submit(bodies))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            while self._queue:
                self._queue.popleft().future.set_exception(FloorError("the client was closed"))
            self._cv.notify_all()

    def _wait(self, p: _FloorPending) -> int:
        try:
            return p.future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise FloorError(f"no answer in {self.timeout_s:g} s") from None
        except FloorError:
            raise
        except Exception as exc:
            raise FloorError(repr(exc)) from exc

    def _submit(self, bodies: Sequence[bytes]) -> _FloorPending:
        p = _FloorPending(bodies)
        with self._cv:
            if self._closed:
                raise FloorError("the client is closed")
            direct = not self._queue and self._in_flight < self.max_in_flight
            if direct:
                self._in_flight += 1
            else:
                self._queue.append(p)
                if self._sender is None:
                    self._sender = threading.Thread(target=self._send_loop, daemon=True)
                    self._sender.start()
                self._cv.notify_all()
        if direct:
            self._send([p])
        return p

    def _take(self) -> list[_FloorPending]:
        """Everything queued that fits one call (called with the lock held)."""
        out, n, size = [], 0, 0
        while self._queue:
            k = len(self._queue[0].bodies)
            if out and (n + k > self.max_batch_entries or size > self.max_batch_bytes):
                break
            p = self._queue.popleft()
            out.append(p)
            n += k
            size += sum(map(len, p.bodies))
        return out

    def _send_loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not (
                    self._queue and self._in_flight < self.max_in_flight
                ):
                    if not self._queue and self._in_flight == 0:
                        self._cv.wait(1.0)
                        if not self._queue and self._in_flight == 0:
                            self._sender = None  # idle: the next queued append starts another
                            return
                    else:
                        self._cv.wait(0.5)
                if self._closed:
                    self._sender = None
                    return
                batch = self._take()
                self._in_flight += 1
            self._send(batch)

    def _send(self, batch: list[_FloorPending]) -> None:
        bodies = batch[0].bodies if len(batch) == 1 else [b for p in batch for b in p.bodies]
        try:
            ref = self.leader.append.remote(list(bodies))
        except Exception as exc:
            self._answered(batch, exc=exc)
            return
        ref.future().add_done_callback(lambda f: self._done(batch, f))

    def _done(self, batch: list[_FloorPending], f: concurrent.futures.Future) -> None:
        try:
            first = f.result()
        except Exception as exc:
            self._answered(batch, exc=exc)
        else:
            self._answered(batch, first=first)

    def _answered(self, batch: list[_FloorPending], first: int = 0, exc: Exception | None = None):
        with self._cv:
            self._in_flight -= 1
            self._cv.notify_all()
        for p in batch:
            if exc is not None:
                p.future.set_exception(FloorError(repr(exc)))
            else:
                p.future.set_result(first)
                first += len(p.bodies)


class FloorChain:
    """A running chain: its actors, and clients of its leader; :meth:`shutdown` kills them."""

    def __init__(self, followers: int = 2, actors: str = "threaded") -> None:
        self.actors: list = []
        self.clients: list[FloorClient] = []
        try:
            leader_cls, dispatcher_cls, follower_cls, checker_cls = _actor_classes(actors)
            quorum = (followers + 1) // 2 + 1
            self.leader = leader_cls.remote()
            self.actors.append(self.leader)
            self.checker = checker_cls.remote(self.leader, followers, quorum)
            self.actors.append(self.checker)
            self.followers = [follower_cls.remote() for _ in range(followers)]
            self.actors += self.followers
            self.dispatchers = [
                dispatcher_cls.remote(i, f, self.checker) for i, f in enumerate(self.followers)
            ]
            self.actors += self.dispatchers
            ray.get(self.leader.setup.remote(self.dispatchers, self.checker), timeout=120)
            self._processes = ray.get([a.process.remote() for a in self.actors], timeout=120)
        except BaseException:
            self.shutdown()
            raise

    def client(self, idempotent: bool = False) -> FloorClient:
        """A new client of the leader (``idempotent`` is accepted and ignored: the floor's
        clients are plain, and ``bench group``'s loads ask for plain ones)."""
        c = FloorClient(self.leader)
        self.clients.append(c)
        return c

    def pids(self) -> list[int]:
        """The chain's processes (not the client's)."""
        return [pid for pid, _ in self._processes]

    def shutdown(self) -> None:
        for c in self.clients:
            c.close()
        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
        self.actors = []

    def __enter__(self) -> FloorChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


@dataclass(frozen=True)
class FloorSizes:
    """The floor's loads, the same as the rayledger run it stands beside."""

    singles: int = 500
    threads: int = 64
    seconds: float = 10.0
    clients: int = 4
    rounds: int = 40
    batch: int = 1000
    body: int = 128
    followers: int = 2
    actors: str = "threaded"


def run_floor(s: FloorSizes) -> dict[str, Any]:
    """The floor's figures (``floor_*``), phase by phase as ``bench group`` takes rayledger's:
    sequential single appends, ``threads`` threads sharing one client (with the CPU of the
    chain's processes and of this one), ``clients`` clients appending batches."""
    out: dict[str, Any] = {"floor_actors": s.actors}
    with FloorChain(s.followers, s.actors) as chain:
        c = chain.client()
        payload = os.urandom(s.body)
        for _ in range(20):  # the first calls pay for connections, as the group's warm-up does
            c.append(payload)
        lat = []
        for _ in range(s.singles):
            t0 = time.perf_counter()
            c.append(payload)
            lat.append((time.perf_counter() - t0) * 1000)
        out["floor_single_p50_ms"] = pct(lat, 0.5)
        out["floor_single_p99_ms"] = pct(lat, 0.99)
        conc = concurrent_phase(chain, s.threads, s.seconds, s.body, chain.pids(), FloorError)
        out["floor_cpu_ms_per_append"] = conc.pop("concurrent_cpu_ms_per_append")
        for k in ("concurrent_entries_per_s", "concurrent_p50_ms", "concurrent_p99_ms",
                  "concurrent_errors"):  # fmt: skip
            out[f"floor_{k}"] = conc[k]
        bat = batch_phase(chain, s.clients, s.rounds, s.batch, s.body, catch=FloorError)
        for k in ("batch_entries_per_s", "batch_p50_ms", "batch_p99_ms", "batch_errors"):
            out[f"floor_{k}"] = bat[k]
    return out


def over_floor(out: dict[str, Any]) -> dict[str, float | None]:
    """Each rayledger figure over the floor's (None where either is missing or zero), and
    the floor's single p50 over the plain round trip measured in the same run."""
    ratios: dict[str, float | None] = {}
    for name, (ours, floor) in RATIOS.items():
        a, b = out.get(ours), out.get(floor)
        ratios[name] = round(a / b, 2) if a and b else None
    rtt, single = out.get("ray_rtt_p50_ms"), out.get("floor_single_p50_ms")
    ratios["floor_single_p50_over_rtt"] = round(single / rtt, 2) if rtt and single else None
    return ratios
