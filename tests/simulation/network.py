"""A deterministic simulated network for driving sans-I/O protocol cores.

Nothing here knows about elections or replication: it moves arbitrary payload
objects between named nodes under a fake clock, with every random choice drawn
from one seeded ``random.Random`` so a run is reproduced exactly by its seed.

* :class:`SimNetwork` -- delayed delivery with drops, duplicates and reordering
  (independent random delays, occasional long delays), one-way link cuts,
  partitions and node outages.  A message is delivered only if its link is up
  both when it is sent and when it arrives.
* :class:`RpcLayer` -- request/response on top of it: correlation ids, the first
  answer wins, and a caller whose call got no answer in ``timeout_ms`` is told
  ``None`` (what a failed Ray call looks like to a shell).
* :class:`FaultInjector` -- a seeded schedule of partitions, one-way cuts,
  isolations, crashes, restarts and heals; crash/restart are callbacks so the
  driver decides what survives a crash.
* :func:`sim_seeds` -- the seeds a test runs (``RAYLEDGER_SIM_SEED`` for one,
  ``RAYLEDGER_SIM_SEEDS`` for how many or which).
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class SimulationFailure(AssertionError):
    """A safety or liveness property failed; the message carries the seed and a trace."""


class FakeClock:
    """Simulated milliseconds; only the driver advances it."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms

    def advance_to(self, t_ms: int) -> None:
        if t_ms < self.now_ms:
            raise ValueError(f"time cannot go back: {t_ms} < {self.now_ms}")
        self.now_ms = t_ms

    def __repr__(self) -> str:
        return f"FakeClock({self.now_ms})"


@dataclass(frozen=True)
class NetworkConfig:
    """Per-message behaviour of the links (all probabilities in [0, 1])."""

    min_delay_ms: int = 1
    max_delay_ms: int = 20
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    # A message occasionally arrives very late, well after later ones.
    long_delay_rate: float = 0.0
    long_delay_ms: int = 800

    def __post_init__(self) -> None:
        if not 0 <= self.min_delay_ms <= self.max_delay_ms:
            raise ValueError(f"bad delays {self.min_delay_ms}..{self.max_delay_ms}")
        for name in ("drop_rate", "duplicate_rate", "long_delay_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")

    @classmethod
    def lossy(cls, level: float = 1.0) -> NetworkConfig:
        """A hostile but still useful network, scaled by ``level``."""
        return cls(
            min_delay_ms=1,
            max_delay_ms=int(10 + 60 * level),
            drop_rate=0.08 * level,
            duplicate_rate=0.05 * level,
            long_delay_rate=0.02 * level,
        )


@dataclass(order=True)
class _InFlight:
    deliver_at: int
    seq: int
    src: str = field(compare=False)
    dst: str = field(compare=False)
    payload: Any = field(compare=False)


@dataclass(frozen=True)
class Delivery:
    src: str
    dst: str
    payload: Any


@dataclass
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped_random: int = 0
    dropped_link: int = 0
    duplicated: int = 0


class SimNetwork:
    """Moves payloads between named nodes with seeded delays and faults."""

    def __init__(
        self,
        nodes: Iterable[str],
        rng: random.Random,
        config: NetworkConfig | None = None,
        clock: FakeClock | None = None,
        trace_len: int = 400,
    ) -> None:
        self.nodes: tuple[str, ...] = tuple(nodes)
        self.rng = rng
        self.config = config or NetworkConfig()
        self.clock = clock or FakeClock()
        self.stats = NetworkStats()
        self.trace: deque[str] = deque(maxlen=trace_len)
        self._queue: list[_InFlight] = []
        self._seq = itertools.count()
        self._cut: set[tuple[str, str]] = set()  # (src, dst) links that are down
        self._down: set[str] = set()  # nodes that are crashed

    # ------------------------------------------------------------ messages

    def note(self, text: str) -> None:
        """Add a line to the trace printed when a run fails."""
        self.trace.append(f"{self.clock.now_ms:>8} {text}")

    def link_up(self, src: str, dst: str) -> bool:
        return src not in self._down and dst not in self._down and (src, dst) not in self._cut

    def send(self, src: str, dst: str, payload: Any) -> None:
        """Schedule ``payload`` from ``src`` to ``dst`` (maybe dropped/duplicated/delayed)."""
        cfg = self.config
        rng = self.rng
        self.stats.sent += 1
        if not self.link_up(src, dst):
            self.stats.dropped_link += 1
            return
        if cfg.drop_rate and rng.random() < cfg.drop_rate:
            self.stats.dropped_random += 1
            return
        copies = 1
        if cfg.duplicate_rate and rng.random() < cfg.duplicate_rate:
            copies = 2
            self.stats.duplicated += 1
        now = self.clock.now_ms
        for _ in range(copies):
            delay = rng.randint(cfg.min_delay_ms, cfg.max_delay_ms)
            if cfg.long_delay_rate and rng.random() < cfg.long_delay_rate:
                delay += rng.randint(cfg.long_delay_ms // 2, cfg.long_delay_ms)
            heapq.heappush(self._queue, _InFlight(now + delay, next(self._seq), src, dst, payload))

    def send_late(self, src: str, dst: str, payload: Any, delay_ms: int) -> None:
        """A copy of ``payload`` that arrives ``delay_ms`` from now (a duplicate that took
        the long way), if its link is up then."""
        self.stats.duplicated += 1
        item = _InFlight(self.clock.now_ms + delay_ms, next(self._seq), src, dst, payload)
        heapq.heappush(self._queue, item)

    def next_delivery_ms(self) -> int | None:
        return self._queue[0].deliver_at if self._queue else None

    def deliver_due(self, now_ms: int | None = None) -> list[Delivery]:
        """Pop every message due by ``now_ms`` (time order); drop those whose link is down."""
        now = self.clock.now_ms if now_ms is None else now_ms
        out: list[Delivery] = []
        queue = self._queue
        while queue and queue[0].deliver_at <= now:
            item = heapq.heappop(queue)
            if not self.link_up(item.src, item.dst):
                self.stats.dropped_link += 1
                continue
            self.stats.delivered += 1
            out.append(Delivery(item.src, item.dst, item.payload))
        return out

    def in_flight(self) -> int:
        return len(self._queue)

    # --------------------------------------------------------------- faults

    def cut(self, src: str, dst: str) -> None:
        """Drop everything from ``src`` to ``dst`` (one way)."""
        self._cut.add((src, dst))
        self.note(f"NET cut {src}->{dst}")

    def cut_both(self, a: str, b: str) -> None:
        self._cut.add((a, b))
        self._cut.add((b, a))
        self.note(f"NET cut {a}<->{b}")

    def restore(self, src: str, dst: str) -> None:
        self._cut.discard((src, dst))

    def partition(self, *groups: Iterable[str]) -> None:
        """Only nodes in the same group can talk; nodes in no group are isolated."""
        member_of: dict[str, int] = {}
        for i, group in enumerate(groups):
            for node in group:
                member_of[node] = i
        self._cut = {
            (a, b)
            for a in self.nodes
            for b in self.nodes
            if a != b and (a not in member_of or member_of.get(a) != member_of.get(b))
        }
        self.note(f"NET partition {[sorted(g) for g in groups]}")

    def isolate(self, node: str) -> None:
        for other in self.nodes:
            if other != node:
                self._cut.add((node, other))
                self._cut.add((other, node))
        self.note(f"NET isolate {node}")

    def heal(self) -> None:
        """Bring every link back (crashed nodes stay down)."""
        self._cut.clear()
        self.note("NET heal")

    def set_down(self, node: str, down: bool) -> None:
        """A down node neither sends nor receives; what was in flight to it is lost."""
        if down:
            self._down.add(node)
        else:
            self._down.discard(node)

    def is_down(self, node: str) -> bool:
        return node in self._down

    def cut_links(self) -> set[tuple[str, str]]:
        return set(self._cut)

    def connected_majority(self) -> set[str] | None:
        """A largest set of up nodes that all reach each other both ways, if it is a majority."""
        up = [n for n in self.nodes if n not in self._down]
        best: set[str] = set()
        for size in range(len(up), 0, -1):
            for combo in itertools.combinations(up, size):
                if all(self.link_up(a, b) for a in combo for b in combo if a != b):
                    best = set(combo)
                    break
            if best:
                break
        return best if len(best) > len(self.nodes) // 2 else None


# ------------------------------------------------------------------------ RPC


@dataclass(frozen=True)
class RpcRequest:
    call_id: int
    body: Any


@dataclass(frozen=True)
class RpcResponse:
    call_id: int
    body: Any


@dataclass
class _Pending:
    caller: str
    callee: str
    request: Any
    deadline_ms: int


class RpcLayer:
    """Request/response over :class:`SimNetwork`; the first answer to a call wins."""

    def __init__(
        self, net: SimNetwork, timeout_ms: int = 1000, *, down_fail_ms: int | None = None
    ) -> None:
        """``down_fail_ms``: a call to a node that is down fails this soon (a refused
        connection or a dead actor) instead of after the full ``timeout_ms``."""
        self.net = net
        self.timeout_ms = timeout_ms
        self.down_fail_ms = down_fail_ms
        self._pending: dict[int, _Pending] = {}
        self._deadlines: list[tuple[int, int]] = []
        self._ids = itertools.count(1)

    def call(self, caller: str, callee: str, request: Any, late_copy_ms: int | None = None) -> int:
        """Send ``request``; ``late_copy_ms``: and a duplicate of it that arrives that much
        later (its answer is ignored: the call is settled by then)."""
        call_id = next(self._ids)
        wait = self.timeout_ms
        if self.down_fail_ms is not None and self.net.is_down(callee):
            wait = min(wait, self.down_fail_ms)
        deadline = self.net.clock.now_ms + wait
        self._pending[call_id] = _Pending(caller, callee, request, deadline)
        heapq.heappush(self._deadlines, (deadline, call_id))
        self.net.send(caller, callee, RpcRequest(call_id, request))
        if late_copy_ms is not None:
            self.net.send_late(caller, callee, RpcRequest(call_id, request), late_copy_ms)
        return call_id

    def reply(self, callee: str, caller: str, call_id: int, response: Any) -> None:
        self.net.send(callee, caller, RpcResponse(call_id, response))

    def complete(self, caller: str, call_id: int) -> tuple[str, Any] | None:
        """(callee, request) of a call answered now, or None if it is already settled."""
        pending = self._pending.get(call_id)
        if pending is None or pending.caller != caller:
            return None
        del self._pending[call_id]
        return pending.callee, pending.request

    def next_deadline_ms(self) -> int | None:
        while self._deadlines and self._deadlines[0][1] not in self._pending:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def expired(self, now_ms: int) -> list[tuple[str, str, Any]]:
        """(caller, callee, request) of calls that timed out by ``now_ms``; each reported once."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, call_id = heapq.heappop(self._deadlines)
            pending = self._pending.pop(call_id, None)
            if pending is not None:
                out.append((pending.caller, pending.callee, pending.request))
        return out

    def forget_caller(self, caller: str) -> None:
        """A crashed caller never hears about its outstanding calls."""
        for call_id in [c for c, p in self._pending.items() if p.caller == caller]:
            del self._pending[call_id]


# --------------------------------------------------------------------- faults


@dataclass(frozen=True)
class FaultConfig:
    """How often and which faults :class:`FaultInjector` injects."""

    mean_interval_ms: int = 2500
    max_crashed: int | None = None  # default: a minority of the nodes
    weights: tuple[tuple[str, float], ...] = (
        ("partition", 2.0),
        ("one_way", 1.5),
        ("isolate", 1.5),
        ("crash", 1.5),
        ("restart", 2.0),
        ("heal", 2.5),
        ("flaky", 1.0),
    )


class FaultInjector:
    """Seeded random faults; ``crash``/``restart`` callbacks let the driver rebuild nodes."""

    def __init__(
        self,
        net: SimNetwork,
        rng: random.Random,
        config: FaultConfig | None = None,
        *,
        crash: Callable[[str], None],
        restart: Callable[[str], None],
        base_network: NetworkConfig | None = None,
    ) -> None:
        self.net = net
        self.rng = rng
        self.config = config or FaultConfig()
        self._crash = crash
        self._restart = restart
        self.base_network = base_network or net.config
        self.crashed: set[str] = set()
        self.next_fault_ms: int | None = net.clock.now_ms + self._gap()
        self.log: list[tuple[int, str]] = []

    def _gap(self) -> int:
        mean = self.config.mean_interval_ms
        return max(1, int(self.rng.expovariate(1.0 / mean)))

    @property
    def max_crashed(self) -> int:
        if self.config.max_crashed is not None:
            return self.config.max_crashed
        return (len(self.net.nodes) - 1) // 2

    def step(self, now_ms: int) -> str | None:
        """Inject the fault due by ``now_ms``, if any; returns its description."""
        if self.next_fault_ms is None or now_ms < self.next_fault_ms:
            return None
        self.next_fault_ms = now_ms + self._gap()
        kinds, weights = zip(*self.config.weights, strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        text = getattr(self, f"_do_{kind}")()
        if text:
            self.log.append((now_ms, text))
            self.net.note(f"FAULT {text}")
        return text

    def _alive(self) -> list[str]:
        return [n for n in self.net.nodes if n not in self.crashed]

    def _do_partition(self) -> str:
        nodes = list(self.net.nodes)
        self.rng.shuffle(nodes)
        cut = self.rng.randint(1, len(nodes) - 1)
        self.net.partition(nodes[:cut], nodes[cut:])
        return f"partition {sorted(nodes[:cut])} | {sorted(nodes[cut:])}"

    def _do_one_way(self) -> str:
        a, b = self.rng.sample(list(self.net.nodes), 2)
        self.net.cut(a, b)
        return f"one-way cut {a}->{b}"

    def _do_isolate(self) -> str:
        node = self.rng.choice(list(self.net.nodes))
        self.net.isolate(node)
        return f"isolate {node}"

    def _do_crash(self) -> str | None:
        alive = self._alive()
        if len(self.crashed) >= self.max_crashed or not alive:
            return None
        node = self.rng.choice(alive)
        self.crashed.add(node)
        self.net.set_down(node, True)
        self._crash(node)
        return f"crash {node}"

    def _do_restart(self) -> str | None:
        if not self.crashed:
            return None
        node = self.rng.choice(sorted(self.crashed))
        self.restart(node)
        return f"restart {node}"

    def _do_heal(self) -> str:
        self.net.heal()
        self.net.config = self.base_network
        return "heal links"

    def _do_flaky(self) -> str:
        level = self.rng.choice((0.5, 1.0, 2.0))
        self.net.config = NetworkConfig.lossy(level)
        return f"flaky network level={level}"

    def restart(self, node: str) -> None:
        self.crashed.discard(node)
        self.net.set_down(node, False)
        self._restart(node)

    def stop(self) -> None:
        """Inject nothing more."""
        self.next_fault_ms = None

    def heal_all(self, network: NetworkConfig | None = None) -> None:
        """End the chaos: stop injecting, restart crashed nodes, heal links, calm the network."""
        self.stop()
        for node in sorted(self.crashed):
            self.restart(node)
        self.net.heal()
        self.net.config = network or self.base_network
        self.net.note("FAULT heal all")


# ---------------------------------------------------------------------- seeds


def sim_seeds(default_count: int, *, offset: int = 0) -> list[int]:
    """Seeds for a simulation test.

    ``RAYLEDGER_SIM_SEED=1234`` runs just that seed (reproduce a failure);
    ``RAYLEDGER_SIM_SEEDS`` is a count (``5000``), a range (``100:200``) or a
    comma list (``3,17,99``).  Otherwise ``default_count`` seeds from ``offset``.
    """
    one = os.environ.get("RAYLEDGER_SIM_SEED")
    if one:
        return [int(one)]
    spec = os.environ.get("RAYLEDGER_SIM_SEEDS", "").strip()
    if spec:
        if "," in spec:
            return [int(s) for s in spec.split(",") if s.strip()]
        if ":" in spec:
            lo, hi = spec.split(":", 1)
            return list(range(int(lo), int(hi)))
        return list(range(offset, offset + int(spec)))
    return list(range(offset, offset + default_count))


__all__ = [
    "Delivery",
    "FakeClock",
    "FaultConfig",
    "FaultInjector",
    "NetworkConfig",
    "NetworkStats",
    "RpcLayer",
    "RpcRequest",
    "RpcResponse",
    "SimNetwork",
    "sim_seeds",
]
