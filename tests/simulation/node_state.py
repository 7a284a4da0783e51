"""What the whole-group simulation keeps per member: the durable parts that survive a crash
(:class:`SimMember`) and, per incarnation, the node (:class:`Node`) with the transport state
of its actors -- the shipped helper drivers and the compiled fast path's graph."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rayledger.actors.core.fastpath import FastPathDriver
from rayledger.actors.core.member import MemberCore
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.pump import CheckerDriver, DispatcherDriver
from rayledger.actors.core.reads import ReadIndexLogic
from rayledger.actors.core.round_path import RoundPath
from rayledger.actors.core.rounds import RoundBook
from rayledger.actors.core.supervision import Supervisor
from rayledger.actors.machine import Applier
from rayledger.election import TermStore
from rayledger.election.configuration import MemoryConfigStore
from rayledger.replication.checker import CheckerLogic
from rayledger.replication.dispatcher import DispatcherLogic
from rayledger.storage import LogStore


@dataclass(frozen=True)
class CgToken:
    """The token a follower's handler gets for a push that came through a graph
    (``("cg", key)`` in ``MemberActor.cg_push``)."""

    key: Any
    origin: tuple[str, int] = ("", -1)  # (leader, term) of the push: instrumentation only


@dataclass
class NeedWatch:
    """The last need a dispatcher fetched and got answered: since when, how often in a row."""

    need: tuple | None = None
    times: int = 0
    since: int = 0


class Channel:
    """One edge of a compiled graph: in order and fast; a cross-node edge follows its
    link (a cut holds it) and a fault can stall it."""

    __slots__ = ("items", "remote", "src", "dst", "stall_until", "last")

    def __init__(self, src: str, dst: str, remote: bool):
        self.items: deque[tuple[int, Any]] = deque()
        self.src, self.dst, self.remote = src, dst, remote
        self.stall_until = 0
        self.last = 0


class Chain:
    """One follower's chain of a graph: fast path -> dispatcher -> follower ->
    dispatcher -> checker -> fast path."""

    __slots__ = ("peer", "follower_inc", "edges", "live", "left")

    def __init__(self, leader: str, peer: str, follower_inc: int):
        self.peer = peer
        self.live = False  # its graph went live (the helpers serve it)
        self.left = False  # the follower closed its loop (MemberOut.leave_graphs)
        self.follower_inc = follower_inc
        self.edges = [
            Channel(leader, leader, False),
            Channel(leader, peer, True),
            Channel(peer, leader, True),
            Channel(leader, leader, False),
            Channel(leader, leader, False),
        ]

    def empty(self) -> bool:
        return not any(e.items for e in self.edges)


@dataclass(eq=False, repr=False)
class Node:
    """One incarnation of a member's process: its MemberLogic and helpers, and the
    transport state of their actors.  A crash drops the whole node."""

    id: str
    incarnation: int
    logic: MemberLogic
    dispatchers: dict[str, DispatcherLogic]
    checker: CheckerLogic
    dead: bool = False
    dispatcher_drivers: dict[str, DispatcherDriver] = field(default_factory=dict)  # by _start
    need_watch: dict[str, NeedWatch] = field(init=False)  # per dispatcher: a fetch livelock
    checker_driver: CheckerDriver = field(init=False)  # the shipped driver, set by _start
    core: MemberCore = field(init=False)  # the shipped member core, set by _start
    fast: FastPathDriver | None = None  # the shipped compiled-path driver, once leading
    round_born: dict[int, int] = field(default_factory=dict)  # when each round was written
    late: list = field(default_factory=list)  # answers to graph pushes given outside cg_push
    lanes: dict[str, int] = field(default_factory=dict)  # call_soon_threadsafe lanes: in order
    # helper processes that hang: "checker", "dispatcher:<peer>" (dispatcher_delivery.dkey)
    hung: set[str] = field(default_factory=set)
    last_hang_ms: int = -1  # when a helper of this node last hung (began to, or was killed)
    hang_began_ms: int = -1  # when a helper of this node last began to hang
    helper_gen: dict[str, int] = field(default_factory=dict)  # helper processes started so far
    booting: dict[str, int] = field(default_factory=dict)  # helper key -> boots until then
    helpers_made: bool = False  # MemberActor._create_helpers ran (ctx.checker is set)
    parked: list = field(default_factory=list)  # calls waiting in a hung helper
    sent: dict[int, tuple] = field(default_factory=dict)  # id(push) -> (push, its dispatcher's gen)
    maintain_at: list | None = None  # the maintainer's next wake-up (a local-queue entry)
    # the state-machine runner (machine_delivery.py), on the seeds that run a machine
    applier: Applier | None = None
    machine_free_ms: int = 0  # when the machine's one thread is free again
    machine_next: int = 0  # the index its next apply call must start at (instrumentation)

    def __post_init__(self) -> None:
        self.need_watch = {p: NeedWatch() for p in self.dispatchers}

    # the member core's parts, for the invariants and the transport's questions
    @property
    def book(self) -> RoundBook:
        return self.core.book

    @property
    def round_path(self) -> RoundPath:
        return self.core.round_path

    @property
    def supervisor(self) -> Supervisor:
        return self.core.supervisor

    @property
    def reads(self) -> ReadIndexLogic:
        return self.core.reads


@dataclass
class SimMember:
    """Durable parts (store, term store, data dir) and the node of the current incarnation."""

    id: str
    term_store: TermStore
    store: LogStore | None = None
    data_dir: str | None = None
    node: Node | None = None
    incarnation: int = 0
    committed_seen: int = -1  # committed entries up to here were checked
    verified_end: int = -1  # entries up to here were checked against the Log Matching map
    fast_enabled: bool = False  # LedgerConfig.fast_path, switched by faults
    machine_high: int = -1  # the highest index its machine was ever given (across restarts)
    sealed_high: int = -1  # the highest snapshot sealed from a leader into its store
    # where its machine rebased or loaded a leader's snapshot, in order: (stood at,
    # continued after) -- equal for a snapshot, whose state the replay takes the same way
    rebases: list[tuple[int, int]] = field(default_factory=list)
    hooked: LogStore | None = None  # the store its machine's pre_append hook is on
    # its saved configurations (a file member's are its data dir's)
    config_store: MemoryConfigStore = field(default_factory=MemoryConfigStore)
    # a member started to replace a lost one (lost_members.py): the configuration it
    # starts from when its data holds none (MemberActor's ``initial``)
    initial: Any = None

    @property
    def alive(self) -> bool:
        return self.node is not None

    @property
    def logic(self) -> MemberLogic:
        return self.node.logic

    @property
    def state(self):
        return self.node.logic.state

    @property
    def elector(self):
        return self.node.logic.elector

    @property
    def handler(self):
        return self.node.logic.handler

    @property
    def dispatchers(self) -> dict[str, DispatcherLogic]:
        return self.node.dispatchers

    @property
    def checker(self) -> CheckerLogic:
        return self.node.checker

    @property
    def leading_term(self) -> int:
        return self.node.logic.leading_term if self.node is not None else -1
