"""What the parts of one member actor share, and the rules for sharing it.

The member shell (:mod:`.actor`) is built from parts, each owning its own state and
talking to the others through a few named calls:

* :class:`~.election.ElectionPart` -- the elector's clock and election RPCs;
* :class:`~.leadership.LeadershipPart` -- taking and leaving office, the helpers'
  supervision;
* :class:`~.appends.AppendPart` -- the leader's appends, rounds and the compiled path;
* :class:`~.reads.ReadPart` -- read index rounds, leases and the read RPCs.

They share only this context, and step the member's sans-I/O core
(:class:`~rayledger.actors.core.member.MemberCore`) through it: an event in
(:meth:`MemberContext.step`), its :class:`~rayledger.actors.core.member.MemberOut` carried out by
the shell (``carry``).  Concurrency (one model per member, see docs/ARCHITECTURE.md): ``logic`` --
the member's sans-I/O core, and the store under it -- is touched only while holding ``lock`` and
never across an ``await`` or a wait; the lock is an RLock because the store's append hooks (a
state machine's ``pre_append``) call back in.  Ray's threads take it for the hot path (appends,
pushes, the checker's resolutions and the helpers' reports: :meth:`MemberContext.step_carry` keeps
it from the step through the carried-out Out), and so do the actor's two loops -- the main loop
(``loop``: reads, role changes, the core's processes) and the election loop (ticks, votes,
heartbeats, transfers) -- and the compiled graph's threads (``cg_push``, ``cg_report``); blocking
work (an fsync with sync_flush, the state machine) runs in executors and hands its result back to
the main loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.member import MemberCore, MemberEvent, MemberOut
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.faults import LinkFaults
from rayledger.actors.metrics import MemberMetrics
from rayledger.actors.naming import member_handle, now_ms

if TYPE_CHECKING:
    from rayledger.storage import LogStore


@dataclass(eq=False)
class MemberContext:
    group: str
    self_id: str
    peers: list[str]
    config: LedgerConfig
    logic: MemberLogic
    lock: threading.RLock
    metrics: MemberMetrics
    sync: bool  # sync_flush: the store defers its fsync to the member (never under the lock)
    core: MemberCore  # the member's one way in (its parts' decisions all go through it)
    carry: Callable[[MemberOut], None] = lambda out: None  # set by the shell: carries an Out
    faults: LinkFaults = field(default_factory=LinkFaults)
    loop: asyncio.AbstractEventLoop | None = None  # the main loop, set at boot
    machine: Any = None  # the MachineRunner (machine.py), set when the group runs a machine
    checker: Any = None  # the QuorumAckCheckerActor handle, set at boot (see ensure_helpers)
    ensure_helpers: Callable[[], None] = lambda: None  # set by the shell: create them now
    new_dispatcher: Callable[[str], Any] = lambda peer: None  # set by the shell
    dispatchers: dict[str, Any] = field(default_factory=dict)  # peer -> EntryDispatcherActor
    closed: bool = False
    _handles: dict[str, Any] = field(default_factory=dict)

    def step(self, ev: MemberEvent) -> MemberOut:
        """Step the member's core with ``ev`` now, under the lock (any thread)."""
        with self.lock:
            return self.core.step(ev, now_ms())

    def step_carry(self, ev: MemberEvent) -> MemberOut:
        """Step the core with ``ev`` and carry out its Out under one hold of the lock, so
        what steps on several threads goes out in the order it was stepped (rounds)."""
        with self.lock:
            out = self.core.step(ev, now_ms())
            self.carry(out)
            return out

    def step_all(self, events: Iterable[MemberEvent]) -> list[MemberOut]:
        """Step the core with each of ``events`` in turn at one moment, under one hold of
        the lock (a compiled graph's pushes of one round)."""
        with self.lock:
            now = now_ms()
            return [self.core.step(ev, now) for ev in events]

    @property
    def store(self) -> LogStore:
        return self.logic.store

    def peer(self, peer: str):
        """The actor handle of another member (looked up once, forgotten when it died)."""
        return member_handle(self._handles, self.group, peer)

    def forget_peer(self, peer: str) -> None:
        self._handles.pop(peer, None)


class Part:
    """A part of a member: the context, and its fixed pieces under short names."""

    def __init__(self, ctx: MemberContext):
        self.ctx = ctx
        self.core = ctx.core
        self.logic, self.store, self.config = ctx.logic, ctx.logic.store, ctx.config
        self.group, self.self_id, self.peers = ctx.group, ctx.self_id, ctx.peers
        self._lock, self._metrics = ctx.lock, ctx.metrics
