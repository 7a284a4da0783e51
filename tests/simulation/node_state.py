"""What the whole-group simulation keeps per member: the durable parts that survive a crash
(:class:`SimMember`) and, per incarnation, the node (:class:`Node`) with the transport state
of its actors -- dispatcher and checker shells and the compiled fast path's graph."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rayledger.actors.logic import Announcement, CheckerLogic, DispatcherLogic, MemberLogic
from rayledger.actors.rounds import RoundBook
from rayledger.election import TermStore
from rayledger.storage import LogStore

from .sim_config import FAST_PATH_RETRY_MS


@dataclass(frozen=True)
class CgToken:
    """The token a follower's handler gets for a push that came through a graph
    (``("cg", key)`` in ``MemberActor.cg_push``)."""

    key: Any
    origin: tuple[str, int] = ("", -1)  # (leader, term) of the push: instrumentation only


@dataclass
class DispatcherShell:
    """What ``EntryDispatcherActor`` keeps beside its DispatcherLogic."""

    loop: bool = False  # activated once (the actor's ``_loop``)
    scheduled: bool = False
    timer: list | None = None
    fetching: bool = False
    reporting: bool = False
    reporting_term: int = -1
    last_need: tuple | None = None  # the last need fetched and answered: since when, how often
    same_need: int = 0
    same_need_since: int = 0
    last_progress: int = -(1 << 62)
    cg_gen: int | None = None
    cg_sent: dict = field(default_factory=dict)
    cg_keys: Iterator[int] = field(default_factory=itertools.count)


@dataclass
class CheckerShell:
    """What ``QuorumAckCheckerActor`` keeps beside its CheckerLogic."""

    loop: bool = False
    scheduled: bool = False
    timer: list | None = None
    committed_sent: int = -1
    out: list = field(default_factory=list)  # (term, Resolved) answered at the next check
    cg_gen: int | None = None
    notice: tuple[int, int] | None = None  # (term, committed) for the dispatchers
    notice_timer: list | None = None


@dataclass
class GraphRound:
    gen: int
    announcement: Announcement
    rounds: tuple[tuple[int, int, Any], ...]


@dataclass
class Execution:
    started: int
    announcement: Announcement
    rounds: tuple
    gen: int
    waiting: int


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

    __slots__ = ("peer", "gen", "follower_inc", "edges")

    def __init__(self, leader: str, peer: str, gen: int, follower_inc: int):
        self.peer = peer
        self.gen = gen
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


class FastPathState:
    """What ``FastPath`` (actors/fastpath.py) keeps for one member."""

    def __init__(self) -> None:
        self.term = -1
        self.gen = 0
        self.active = False
        self.building: int | None = None
        self.build_ids = itertools.count(1)
        self.queue: deque[GraphRound] = deque()
        self.inflight: deque[Execution] = deque()
        self.watchdog: list | None = None
        self.retry: list | None = None
        self.backoff = FAST_PATH_RETRY_MS[0]
        self.chains: dict[str, Chain] = {}
        self.compiles = 0
        self.fallbacks = 0

    def __repr__(self) -> str:
        return (
            f"FastPath(term={self.term} gen={self.gen} active={self.active} "
            f"building={self.building} queue={len(self.queue)} inflight={len(self.inflight)} "
            f"compiles={self.compiles} fallbacks={self.fallbacks})"
        )


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
    dsh: dict[str, DispatcherShell] = field(init=False)  # one shell per dispatcher
    csh: CheckerShell = field(default_factory=CheckerShell)
    fast: FastPathState | None = None
    # MemberActor: queued appends and rounds (the shipped RoundBook), role changes
    book: RoundBook = field(init=False)
    round_born: dict[int, int] = field(default_factory=dict)  # when each round was written
    role_busy: bool = False
    role_again: bool = False
    late: list = field(default_factory=list)  # answers to graph pushes given outside cg_push
    lanes: dict[str, int] = field(default_factory=dict)  # call_soon_threadsafe lanes: in order

    def __post_init__(self) -> None:
        self.book = RoundBook(self.logic)
        self.dsh = {p: DispatcherShell() for p in self.dispatchers}


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
