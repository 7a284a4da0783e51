"""Deterministic simulation of whole groups: elect, append, replicate, commit, crash, recover.

Every member runs the logic the Ray actors ship (:mod:`rayledger.actors.logic`):
one :class:`~rayledger.actors.logic.MemberLogic` (store, MemberState, elector,
entry handler, admission, rounds), one
:class:`~rayledger.actors.logic.DispatcherLogic` per peer and one
:class:`~rayledger.actors.logic.CheckerLogic`, over a real store (a
:class:`~rayledger.storage.MemoryStore` that survives crashes as a disk would,
or a :class:`~rayledger.storage.FileStore` in a temp dir that is closed on a
crash and reopened from its files).  The simulation is only their transport,
and it carries the events the way ``actors/member.py``, ``actors/dispatcher.py``,
``actors/checker.py`` and ``actors/fastpath.py`` do:

* between nodes, the seeded network of :mod:`.network`: votes, heartbeats,
  pushes and their answers;
* on one node, the actor calls between a member and its helpers (round
  announcements, water-mark reports, resolutions, fenced fetches, role changes):
  a seeded local queue with 0-2 ms per hop and no order between calls (Ray does
  not order the calls of an async actor), so they interleave with the network;
* optionally the compiled steady-state path of ``fastpath.py``: per leader term a
  "graph" of in-order, low-delay channels (leader -> dispatcher -> follower ->
  dispatcher -> checker -> leader, one chain per follower) that a seeded fault
  can stall; a stalled graph falls back to plain calls (dispatchers rewind to
  their water marks, the rounds still waiting are registered again with the
  checker) and what was in flight on it arrives late or never.

A crash is never a clean close.  A process crash keeps what the store wrote (the
page cache survives) but not its last checkpoint; a power loss (seeded, FileStore
members) keeps only what fdatasync made durable (``flushed_pos`` /
``flushed_index``) plus a seeded prefix of the rest (writeback order is not
ours: torn tails), and the restarted member recovers from its files.  The
term/vote store is rebuilt on every restart from its persisted form
(:class:`~rayledger.election.member_state.FileTermStore` in the member's data
dir; memory members keep a MemoryTermStore's saved state, which like the file's
is durable once ``save`` returns).  A MemoryStore member's power loss is a
process crash (the in-memory store stands for an always-synced disk).

Clients append unique bodies through whichever member they believe leads.
Safety is checked after every step:

* Log Matching: every entry ever written at (index, term), on any member, has
  the same body and chain CRC (the chain CRC covers the whole prefix);
* Election Safety: one leader per term;
* Leader Completeness: a leader of term T holds every entry committed before T;
* no index ever holds two different committed entries, across all members and all
  time (entries later lost included), and a member's
  committed index never decreases (within one incarnation; a restart may
  recover a lower one, never a different entry);
* an append acknowledged to a client sits at the acknowledged index with the
  same body; no index is acknowledged twice;
* a leader answers every round it wrote within ``max_wait_ack_time_ms`` (plus
  transport slack) while its term lasts.

At the end of a run the faults stop, the network heals, and every member must
converge to the same fully committed log within a bounded simulated time; then
every acknowledged append is in every member's committed log and no body is
committed twice.

Durability assumption: an acknowledged (or committed) entry survives only while a
majority holding it never loses its unflushed suffix.  Without ``sync_flush`` DLedger
acknowledges before fsync, so a power loss that drops an entry some member had seen
committed voids that guarantee for the run (``GroupSim.durability_void``; the two
checks then count instead of failing, Log Matching and Election Safety still fail).
With ``sync_flush=True`` every append is durable before it counts, so acknowledged
appends survive any power loss, even of the whole group at once, and a power loss
that drops a committed entry is itself a failure.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import os
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from rayledger.actors.logic import (
    Announcement,
    CachedBatch,
    CheckerLogic,
    DispatcherLogic,
    MemberLogic,
    StopLeading,
)
from rayledger.election import (
    ElectionConfig,
    FileTermStore,
    MemoryTermStore,
    RoleChange,
    TermStore,
    TransferOutcome,
)
from rayledger.replication import (
    PushEntryRequest,
    PushType,
    ReplicationConfig,
    Resolved,
)
from rayledger.storage import (
    EntryBatch,
    FileStore,
    LedgerError,
    LogStore,
    MemoryStore,
    ResponseCode,
    StoreConfig,
)
from rayledger.storage.codec import INDEX_UNIT

from .network import (
    FakeClock,
    FaultConfig,
    FaultInjector,
    NetworkConfig,
    RpcLayer,
    RpcRequest,
    RpcResponse,
    SimNetwork,
    SimulationFailure,
)

SIM_ELECTION = ElectionConfig(
    heartbeat_interval_ms=100,
    max_heartbeat_leak=3,
    min_vote_interval_ms=100,
    max_vote_interval_ms=300,
    vote_wait_base_ms=300,
)
"""DLedger's election timing scaled down about tenfold, so a seed covers many terms."""

SIM_REPLICATION = ReplicationConfig(
    max_push_timeout_ms=300,
    max_wait_ack_time_ms=2500,
    max_batch_push_bytes=2048,  # a few entries per push: batching boundaries get exercised
    max_pending_pushes=8,
    compare_timeout_ms=1000,
    commit_push_interval_ms=200,
    error_backoff_ms=100,
    abnormal_check_ms=300,
    push_wait_timeout_ms=300,
)

SIM_FAULTS = FaultConfig(
    mean_interval_ms=700,
    weights=(
        ("partition", 3.0),
        ("one_way", 1.5),
        ("isolate", 2.5),
        ("crash", 2.5),
        ("restart", 2.5),
        ("heal", 1.5),
        ("flaky", 1.0),
    ),
)
"""Frequent faults that mostly separate or kill members; heals are rarer than breaks."""

SIM_STORE = dict(data_segment_size=16 * 1024, index_segment_size=32 * 256)
"""Small segments so entries roll over segment ends (and leave padding) often."""

SIM_TMP = os.environ.get("RAYLEDGER_SIM_TMP") or (
    "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
)
"""Where FileStore members keep their files: a RAM disk when there is one (power loss is
modelled from ``flushed_pos``, so a real disk's fsync would only cost time)."""

LOCAL_HOP_MS = (0, 2)
"""One actor call between a member and its helpers (same node)."""

FAST_PATH_STALL_MS = SIM_ELECTION.heartbeat_interval_ms // 2
"""``LedgerConfig.stall_ms()``: an execution unanswered this long abandons the graph."""

FAST_PATH_MAX_INFLIGHT = 8  # fastpath.MAX_INFLIGHT
FAST_PATH_RETRY_MS = (100, 1500)  # fastpath retry_s, scaled like the election timing
FAST_PATH_COMPILE_MS = (20, 80)  # cg_reset on the followers + compiling
FAST_PATH_SWITCH_MEAN_MS = 900
ROUND_SLACK_MS = 1000  # how much later than max_wait_ack_time_ms a round may be answered

MAX_ROUNDS = 1  # member.MAX_ROUNDS: rounds waiting for a quorum before appends queue up
COMMIT_NOTICE_MS = 5  # checker.COMMIT_NOTICE_S: the committed index stands still, then notice
MAINTAIN_MAX_SLEEP_MS = 1000  # MemberActor._maintain sleeps at most this long
FETCH_LOOP = 20  # one need fetched and answered this often in a row: a hot loop (counted)
FETCH_LIVELOCK_MS = 20_000  # ... and for this long: a livelock (a failure)

FLUSH_TICK_MS = (20, 200)
"""The file store's flush service, run in simulated time: a FileStore member fsyncs what it
wrote this often (its own thread is parked), so what a power loss keeps is seeded."""

PARKED_MS = 1 << 40  # flush/checkpoint intervals of the store's own thread: never on its own


@dataclass(frozen=True)
class ClientAppend:
    client: str
    req_id: int
    target: str
    bodies: tuple[bytes, ...]


@dataclass(frozen=True)
class ClientReply:
    req_id: int
    code: ResponseCode
    first_index: int = -1
    last_index: int = -1
    term: int = -1
    leader_id: str | None = None


@dataclass
class Client:
    id: str
    believed: str
    next_at: int = 0
    outstanding: tuple[int, tuple[bytes, ...], int] | None = None  # (req id, bodies, sent at)
    seq: int = 0


# ============================================================ the transport's state


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


class Node:
    """One incarnation of a member's process: its MemberLogic and helpers, and the
    transport state of their actors.  A crash drops the whole node."""

    def __init__(
        self,
        mid: str,
        incarnation: int,
        logic: MemberLogic,
        dispatchers: dict[str, DispatcherLogic],
        checker: CheckerLogic,
    ):
        self.id = mid
        self.incarnation = incarnation
        self.dead = False
        self.logic = logic
        self.dispatchers = dispatchers
        self.checker = checker
        self.dsh = {p: DispatcherShell() for p in dispatchers}
        self.csh = CheckerShell()
        self.fast: FastPathState | None = None
        # MemberActor: queued appends, rounds waiting for the checker, role changes
        self.queue: list[tuple[tuple[str, int], list[bytes]]] = []
        self.round_scheduled = False
        self.round_ids = itertools.count()
        self.rounds: dict[int, tuple[Any, list[tuple[str, int]], int]] = {}
        self.outstanding = 0
        self.role_busy = False
        self.role_again = False
        self.late: list = []  # answers to graph pushes given outside cg_push
        self.lanes: dict[str, int] = {}  # call_soon_threadsafe lanes: in order


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


@dataclass
class SimResult:
    seed: int
    steps: int
    sim_ms: int
    acked_entries: int
    committed_entries: int
    terms: int
    converge_ms: int
    faults: int
    fast_path_compiles: int = 0
    fast_path_fallbacks: int = 0


class GroupSim:
    """N members, clients, a simulated network and the safety checks of the module doc."""

    def __init__(
        self,
        n: int = 3,
        seed: int = 0,
        *,
        store_kind: str = "memory",
        election: ElectionConfig = SIM_ELECTION,
        replication: ReplicationConfig = SIM_REPLICATION,
        network: NetworkConfig | None = None,
        faults: FaultConfig | bool | None = None,
        clients: int = 2,
        client_interval_ms: tuple[int, int] = (5, 60),
        max_bodies: int = 4,
        slow_followers: bool = True,
        tick_ms: int = 10,
        rpc_timeout_ms: int = 1000,
        fast_path: bool | None = None,
        fast_path_switches: bool | None = None,
        dispatcher_cache_bytes: int | None = None,
        power_loss: float | None = None,
        sync_flush: bool = False,
        group: str = "g",
        label: str = "",
        test_name: str = "",
    ) -> None:
        """``fast_path``: members start with the compiled path on (None: seeded when there
        are faults, else off); ``fast_path_switches``: seeded faults switch it on and off
        and stall its channels (None: when there are faults); ``power_loss``: the share of
        crashes that are power losses (None: half for FileStore members); ``sync_flush``:
        the stores' ``StoreConfig.sync_flush``."""
        self.seed = seed
        self.n = n
        self.label = label or f"group-sim n={n} {store_kind}"
        self.test_name = test_name  # for the reproduce hint in failures
        self.rng = random.Random(seed)
        self.group = group
        self.store_kind = store_kind
        self.election = election
        self.replication = replication
        self.tick_ms = tick_ms
        self.sync_flush = sync_flush
        self.power_loss = (
            (0.5 if store_kind == "file" else 0.0) if power_loss is None else power_loss
        )
        # its own stream, so the other streams of a seed stay as they were
        self._power_rng = random.Random(seed * 7919 + 23)
        self.durability_void = False  # a power loss dropped an entry seen committed
        self._next_flush_ms: dict[str, int] = {}
        self.ids = [f"n{i}" for i in range(n)]
        self.clock = FakeClock(0)
        self.net = SimNetwork(
            self.ids, random.Random(self.rng.getrandbits(64)), network, self.clock
        )
        self.rpc = RpcLayer(self.net, rpc_timeout_ms)
        self._tmp = (
            tempfile.mkdtemp(prefix="rayledger-sim-", dir=SIM_TMP) if store_kind == "file" else None
        )
        self._next_tick_ms = 0  # the clients' clock
        self.steps = 0

        # what the checks remember
        self.entries: dict[
            tuple[int, int], tuple[int, int]
        ] = {}  # (index, term) -> (chain, body crc)
        self.committed: dict[int, tuple[int, int, int]] = {}  # index -> (term, chain, body crc)
        self.max_committed = -1
        # lowest term of a member seen holding an index committed: it was committed in
        # that term or an earlier one (a member only learns commits of its own term)
        self.commit_terms: dict[int, int] = {}  # term seen -> highest index seen committed
        self.acked: dict[int, bytes] = {}  # index -> body acknowledged to a client
        self.acked_terms: dict[int, int] = {}
        # acknowledged before any store shows it committed (the leader stepped down right
        # after its checker resolved the round): checked when a member commits the index
        self.acked_unseen: dict[int, tuple[int, int]] = {}  # index -> (term, req id)
        self.leaders_by_term: dict[int, str] = {}
        self.leader_incarnation: dict[int, int] = {}  # term -> incarnation of its leader
        self.unknown_outcomes = 0
        self.reply_codes: collections.Counter[ResponseCode] = collections.Counter()
        self.stats: collections.Counter[str] = collections.Counter()
        self.touched: dict[str, int] = {}  # lowest end a truncate/reset left since the last check

        # the node-local transport: actor calls between a member and its helpers
        self._local: list[list] = []
        self._local_seq = itertools.count()
        self._local_rng = random.Random(self.rng.getrandbits(64))
        self._chains: list[tuple[Node, Chain]] = []
        self._fp_rng = random.Random(self.rng.getrandbits(64))
        self.cache_bytes = (
            dispatcher_cache_bytes
            if dispatcher_cache_bytes is not None
            else self._fp_rng.choice((1 << 10, 16 << 10, 64 << 20))
        )

        self.members: dict[str, SimMember] = {}
        for mid in self.ids:
            m = SimMember(mid, MemoryTermStore())  # a file member's is replaced in _start
            if self._tmp is not None:
                m.data_dir = os.path.join(self._tmp, mid)
            self.members[mid] = m
        if fast_path is None:
            for m in self.members.values():
                m.fast_enabled = faults is not False and self._fp_rng.random() < 0.5
        else:
            for m in self.members.values():
                m.fast_enabled = fast_path
        if fast_path_switches is None:
            fast_path_switches = faults is not False
        self._next_switch_ms: int | None = (
            int(self._fp_rng.expovariate(1 / FAST_PATH_SWITCH_MEAN_MS)) + 200
            if fast_path_switches
            else None
        )
        for mid in self.ids:
            self._start(mid)

        self.clients = [
            Client(f"c{k}", self.rng.choice(self.ids), next_at=self.rng.randint(0, 50))
            for k in range(clients)
        ]
        self.client_interval_ms = client_interval_ms
        self.max_bodies = max_bodies
        self.clients_on = True
        self._req_ids = itertools.count(1)
        self._inflight_clients: dict[int, Client] = {}

        self.injector: FaultInjector | None = None
        faults = SIM_FAULTS if faults is None else faults
        if faults is not False:
            self.injector = FaultInjector(
                self.net,
                random.Random(self.rng.getrandbits(64)),
                faults,
                crash=self._crash,
                restart=self._start,
                base_network=self.net.config,
            )
        # slow follower: deliveries to it are held back by an extra delay
        self._slow_rng = random.Random(self.rng.getrandbits(64))
        self.slow: dict[str, int] = {}
        self._next_slow_ms: int | None = 1500 if slow_followers else None
        self._held: list[tuple[int, int, str, str, object]] = []
        self._held_seq = itertools.count()
        self._client_rng = random.Random(self.rng.getrandbits(64))

    # ================================================================ failures

    def fail(self, message: str) -> None:
        trace = "\n".join(list(self.net.trace)[-150:])
        raise SimulationFailure(
            f"[{self.label}] seed={self.seed} n={self.n} t={self.clock.now_ms}ms: {message}\n"
            f"reproduce with: RAYLEDGER_SIM_SEED={self.seed} "
            f"pytest tests/simulation/test_group_sim.py -k {self.test_name or 'group_sim'}\n"
            f"--- members ---\n{self.describe()}\n--- last events ---\n{trace}"
        )

    def describe(self) -> str:
        lines = []
        for m in self.members.values():
            if not m.alive:
                lines.append(f"{m.id}: DOWN term={m.term_store.load()} store={m.store!r}")
                continue
            node = m.node
            lg = node.logic
            st = lg.state
            line = (
                f"{m.id}: {st.role.value} term={st.current_term} leader={st.leader_id} "
                f"leading={lg.leading_term} ready={lg.ready_term} store={m.store!r} "
                f"handler(matched={lg.handler.matched_index}, queued={lg.handler.queued}) "
                f"rounds={len(node.rounds)} fast_enabled={m.fast_enabled}"
            )
            for p, d in node.dispatchers.items():
                if d.term == -1:
                    continue
                sh = node.dsh[p]
                v = d.view
                line += (
                    f"\n    {d.core!r} view(end={v.ledger_end_index} committed={v.committed_index} "
                    f"batches={len(v.batches)}) reported={d.reported} fetching={sh.fetching} "
                    f"reporting={sh.reporting} cg_gen={sh.cg_gen}"
                )
            if node.checker.term != -1:
                line += f"\n    {node.checker.core!r} out={len(node.csh.out)}"
            if node.fast is not None:
                line += f"\n    {node.fast!r}"
            lines.append(line)
        lines.append(f"cut links: {sorted(self.net.cut_links())} slow={self.slow}")
        return "\n".join(lines)

    # ================================================================ members

    def _open_store(self, m: SimMember) -> LogStore:
        if m.data_dir is None:
            return MemoryStore(StoreConfig(**SIM_STORE))
        return FileStore(
            StoreConfig(
                data_dir=m.data_dir,
                sync_flush=self.sync_flush,
                flush_interval_ms=PARKED_MS,
                checkpoint_interval_ms=PARKED_MS,
                **SIM_STORE,
            )
        )

    def _start(self, mid: str) -> None:
        m = self.members[mid]
        if m.store is None:
            m.store = self._open_store(m)
        # the term store as persisted, never what the dead incarnation held in memory
        if m.data_dir is not None:
            m.term_store = FileTermStore(m.data_dir)
        else:
            m.term_store = MemoryTermStore(*m.term_store.load())
        self._watch_truncates(m)
        logic = MemberLogic(
            self.group,
            mid,
            self.ids,
            m.store,
            self.election,
            self.replication,
            m.term_store,
            rng=random.Random(self.rng.getrandbits(64)),
        )
        dispatchers = {
            p: DispatcherLogic(self.group, mid, p, self.replication, self.cache_bytes)
            for p in self.ids
            if p != mid
        }
        checker = CheckerLogic(self.group, mid, self.ids, self.replication)
        m.incarnation += 1
        m.node = Node(mid, m.incarnation, logic, dispatchers, checker)
        self._at(m.node, self.clock.now_ms, self._maintain, m.node)
        # a restart may recover a lower committed index (the checkpoint lags); never other entries
        m.committed_seen = min(m.committed_seen, m.store.committed_index)
        m.verified_end = min(m.verified_end, m.store.ledger_end_index)
        self.net.set_down(mid, False)
        if m.incarnation > 1:
            self.net.note(
                f"{mid} RESTART term={logic.state.current_term} end={m.store.ledger_end_index} "
                f"committed={m.store.committed_index}"
            )

    def _watch_truncates(self, m: SimMember) -> None:
        """Record how far truncates and resets cut the log, for the Log Matching scan."""
        store = m.store
        mid = m.id
        truncate, reset = store.truncate, store.reset

        def watched_truncate(end_index: int) -> int:
            out = truncate(end_index)
            self.touched[mid] = min(self.touched.get(mid, 1 << 62), store.ledger_end_index)
            self.net.note(f"{mid} truncated to {store.ledger_end_index}")
            return out

        def watched_reset(begin_index: int, begin_pos: int) -> None:
            reset(begin_index, begin_pos)
            self.touched[mid] = min(self.touched.get(mid, 1 << 62), store.ledger_end_index)
            self.net.note(f"{mid} reset to begin at {begin_index}")

        store.truncate = watched_truncate  # type: ignore[method-assign]
        store.reset = watched_reset  # type: ignore[method-assign]

    def _crash(self, mid: str, power: bool | None = None) -> None:
        """Kill ``mid``: a process crash, or (``power``; None: seeded) a power loss."""
        m = self.members[mid]
        if power is None:
            power = m.data_dir is not None and self._power_rng.random() < self.power_loss
        if m.alive:
            self._check_member(m)  # what it committed this step counts
            m.node.dead = True
        m.node = None
        kind = "CRASH"
        if m.data_dir is not None and m.store is not None:
            kind = self._kill_store(m, power)
            m.store = None
        self.net.set_down(mid, True)
        self.rpc.forget_caller(mid)
        self.net.note(f"{mid} {kind}")
        # a graph with a participant that died fails; what was in flight to it is lost
        for node, chain in self._chains:
            if chain.peer == mid and not node.dead:
                for e in chain.edges[1:3]:
                    e.items.clear()
                fp = node.fast
                if fp is not None and fp.active and fp.chains.get(mid) is chain:
                    self._hop(node, self._fp_fallback, node, f"participant {mid} died")

    def _kill_store(self, m: SimMember, power: bool) -> str:
        """Abandon a FileStore without close(): no final flush, no checkpoint.  A power loss
        then cuts each file to what fdatasync made durable plus a seeded prefix of the rest."""
        store = m.store
        with store._lock:
            store._closed = True  # parks the flush thread for good, without its final flush
            store._flush_cv.notify_all()
            durable = (store.flushed_pos, (store.flushed_index + 1) * INDEX_UNIT)
            written = (store._data.write_pos, store._index.write_pos)
            lists = (store._data, store._index)
        store._flusher.join(timeout=10)
        for sl in lists:
            sl.close()
        if not power:
            return "CRASH"
        rng = self._power_rng
        keeps = []
        for sl, d, w in zip(lists, durable, written, strict=True):
            keep = w if d >= w else rng.choice((d, d, rng.randint(d, w)))
            keeps.append(keep)
            for seg in sl.segments:
                if seg.start >= keep and seg.start > 0:
                    seg.path.unlink(missing_ok=True)  # created after the last durable point
                elif seg.start + seg.length > keep:
                    os.truncate(seg.path, max(0, keep - seg.start))
        lost_from = store.flushed_index + 1
        kept = lost_from if keeps[0] == durable[0] else None
        seen = min(self.max_committed, store.ledger_end_index)  # committed anywhere
        if lost_from <= seen and self.sync_flush:
            self.fail(
                f"{m.id} lost committed entries {lost_from}..{seen} to a power loss "
                f"with sync_flush (flushed_index={store.flushed_index})"
            )
        if lost_from <= store.ledger_end_index:
            # whatever it lost it may have acknowledged to a leader, which may count it
            # towards a quorum later (seed 20196: acked at 196 twice); without sync_flush
            # that voids the durability checks for the rest of the run
            self.durability_void = True
            self.stats["power_lost_entries"] += 1
        self.stats["power_losses"] += 1
        return (
            f"POWER LOSS (durable data {durable[0]}/{written[0]}, kept {keeps[0]}; "
            f"index units {durable[1]}/{written[1]}, kept {keeps[1]}; from index {kept})"
        )

    def _flush_step(self, now: int) -> None:
        """The flush service of every live FileStore member, in simulated time."""
        if self._tmp is None or self.sync_flush:
            return
        for m in self.members.values():
            if m.store is None or not m.alive:
                continue
            due = self._next_flush_ms.get(m.id)
            if due is None or now >= due:
                if due is not None:
                    m.store.flush()
                self._next_flush_ms[m.id] = now + self._power_rng.randint(*FLUSH_TICK_MS)

    def crash(self, mid: str, power: bool | None = None) -> None:
        if self.injector is not None:
            self.injector.crashed.add(mid)
        self._crash(mid, power)

    def restart(self, mid: str) -> None:
        if self.injector is not None:
            self.injector.crashed.discard(mid)
        self._start(mid)

    def close(self) -> None:
        for m in self.members.values():
            if m.store is not None:
                m.store.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # ================================================================ the node-local transport

    def _at(self, node: Node, due: int, fn: Callable, *args) -> list:
        """Run ``fn(*args)`` on ``node`` at ``due`` unless the node died; returns a handle
        whose cancellation (``handle[5] = False``) is a timer's cancel."""
        entry = [due, next(self._local_seq), node, fn, args, True]
        heapq.heappush(self._local, entry)
        return entry

    def _hop(self, node: Node, fn: Callable, *args) -> list:
        """An actor call on the same node."""
        lo, hi = LOCAL_HOP_MS
        return self._at(node, self.clock.now_ms + self._local_rng.randint(lo, hi), fn, *args)

    def _lane(self, node: Node, lane: str, fn: Callable, *args) -> list:
        """``call_soon_threadsafe`` onto another loop of the node: a hop, in order."""
        lo, hi = LOCAL_HOP_MS
        due = max(self.clock.now_ms + self._local_rng.randint(lo, hi), node.lanes.get(lane, 0))
        node.lanes[lane] = due
        return self._at(node, due, fn, *args)

    def _soon(self, node: Node, fn: Callable, *args) -> list:
        """``loop.call_soon``: later in this loop turn."""
        return self._at(node, self.clock.now_ms, fn, *args)

    @staticmethod
    def _cancel(entry: list | None) -> None:
        if entry is not None:
            entry[5] = False

    def _spawn(self, node: Node, task: Iterator) -> None:
        """Run an actor coroutine, written as a generator: ``yield None`` is one hop,
        ``yield ms`` a sleep, ``yield [calls]`` awaits calls to other actors of the
        node (each a hop there and a hop back) and resumes with their results."""
        self._resume(node, task, None)

    def _resume(self, node: Node, task: Iterator, value: Any) -> None:
        if node.dead:
            return
        try:
            want = task.send(value)
        except StopIteration:
            return
        if want is None:
            self._hop(node, self._resume, node, task, None)
        elif isinstance(want, int):
            self._at(node, self.clock.now_ms + want, self._resume, node, task, None)
        else:
            calls = list(want)
            results: list = [None] * len(calls)
            left = [len(calls)]
            if not calls:
                self._hop(node, self._resume, node, task, results)
            for i, fn in enumerate(calls):
                self._hop(node, self._call_there, node, task, fn, i, results, left)

    def _call_there(self, node: Node, task, fn, i: int, results: list, left: list) -> None:
        results[i] = fn()
        self._hop(node, self._call_back, node, task, results, left)

    def _call_back(self, node: Node, task, results: list, left: list) -> None:
        left[0] -= 1
        if left[0] == 0:
            self._resume(node, task, results)

    def _run_local(self, now: int) -> bool:
        q = self._local
        ran = False
        while q and q[0][0] <= now:
            entry = heapq.heappop(q)
            if entry[5] and not entry[2].dead:
                ran = True
                entry[3](*entry[4])
        return ran

    def _next_local_ms(self) -> int | None:
        q = self._local
        while q and (not q[0][5] or q[0][2].dead):
            heapq.heappop(q)
        return q[0][0] if q else None

    # ================================================================ MemberActor

    def _maintain(self, node: Node) -> None:
        """``MemberActor._maintain``: tick, then sleep until the elector's next deadline
        (at least the maintain interval, at most a second)."""
        now = self.clock.now_ms
        actions, answers = node.logic.tick(now)
        self._answer(node, answers)
        self._apply(node, actions)
        if node.dead:
            return
        interval = self.tick_ms
        delay = node.logic.next_tick_ms(now, interval) - now
        self._at(node, now + min(MAINTAIN_MAX_SLEEP_MS, max(interval, delay)), self._maintain, node)

    def _apply(self, node: Node, actions: list) -> None:
        if not actions:
            return
        sends, role_changed = MemberLogic.split(actions)
        for action in actions:
            if isinstance(action, RoleChange):
                self.net.note(
                    f"{node.id} -> {action.role.value} term={action.term} leader={action.leader_id}"
                )
            elif isinstance(action, TransferOutcome):
                self.net.note(f"{node.id} transfer to {action.transferee}: {action.code.name}")
        for s in sends:
            self.rpc.call(node.id, s.to, s.message)
        if role_changed:
            self._sync_role(node)

    def _answer(self, node: Node, answers: list) -> None:
        """Answers of the entry handler: a plain push's go back over the network, a graph
        push's wait for the next ``cg_push`` (``MemberActor._late``)."""
        for tok, resp in answers:
            if type(tok) is CgToken:
                node.late.append((tok.key, resp, tok.origin))
            else:
                caller, call_id = tok
                self.rpc.reply(node.id, caller, call_id, resp)

    def _sync_role(self, node: Node) -> None:
        """``_sync_role``: changes are carried out one at a time, in order (a role lock)."""
        if node.role_busy:
            node.role_again = True
            return
        node.role_busy = True
        self._spawn(node, self._role_task(node))

    def _role_task(self, node: Node):
        while True:
            node.role_again = False
            for change in node.logic.leadership():
                if isinstance(change, StopLeading):
                    yield from self._stop_leading(node, change)
                else:
                    yield from self._start_leading(node, change)
            if not node.role_again:
                break
        node.role_busy = False

    def _stop_leading(self, node: Node, change: StopLeading):
        self.net.note(f"{node.id} stops leading term {change.term} (now {change.new_term})")
        if node.fast is not None:
            self._fp_stop(node)
        (resolved,) = yield [lambda: self._c_step_down(node, change.new_term)]
        self._finish(node, resolved)
        # whatever the checker did not answer ends here: the outcome is unknown
        for rid in [r for r, (rnd, _, _) in node.rounds.items() if rnd.term == change.term]:
            self._finish_round(node, rid, ResponseCode.TERM_CHANGED)
        yield [(lambda p=p: self._d_deactivate(node, p, change.term)) for p in node.dispatchers]

    def _start_leading(self, node: Node, change):
        term = change.term
        self.net.note(
            f"{node.id} LEADS term={term} from index {change.term_start_index} "
            f"(committed {change.info.committed})"
        )
        yield [lambda: self._c_become_leader(node, term, change.term_start_index, change.info)]
        yield [(lambda p=p: self._d_activate(node, p, change.info)) for p in node.dispatchers]
        if node.logic.mark_ready(term):
            self.net.note(f"{node.id} ready for appends in term {term}")
            if self.members[node.id].fast_enabled and len(self.ids) > 1:
                self._fp_start(node, term)

    def _client_append(self, node: Node, msg: ClientAppend) -> None:
        """``MemberActor.append``: admit, queue, one round per loop turn."""
        try:
            _, bodies = node.logic.admit(list(msg.bodies), self.group, msg.target, node.outstanding)
        except LedgerError as exc:
            self._to_client(
                node.id, msg.client, ClientReply(msg.req_id, exc.code, leader_id=exc.leader_id)
            )
            return
        node.queue.append(((msg.client, msg.req_id), bodies))
        node.outstanding += 1
        self._schedule_round(node)

    def _schedule_round(self, node: Node) -> None:
        """Write the queue as a round in this loop turn, unless ``MAX_ROUNDS`` rounds wait
        for their quorum: then the queue grows until one ends and goes out as one round."""
        if not node.round_scheduled and node.queue and len(node.rounds) < MAX_ROUNDS:
            node.round_scheduled = True
            self._soon(node, self._write_round, node)

    def _write_round(self, node: Node) -> None:
        """Group commit: the queued appends become one store batch and one round."""
        node.round_scheduled = False
        queue, node.queue = node.queue, []
        if not queue:
            return
        rid = next(node.round_ids)
        lg = node.logic
        term = lg.ready_term
        try:
            rnd = lg.write_round([(None, b) for _, b in queue], term)
        except LedgerError as exc:
            node.outstanding -= len(queue)
            for (client, req_id), _ in queue:
                self._to_client(
                    node.id, client, ClientReply(req_id, exc.code, leader_id=exc.leader_id)
                )
            return
        a = lg.announcement(rnd, rnd.appended.batch())
        node.rounds[rid] = (rnd, [tok for tok, _ in queue], self.clock.now_ms)
        fast = node.fast
        if (
            fast is not None
            and fast.active
            and self._fp_submit(node, a, [(rnd.first_index, rnd.last_index, rid)])
        ):
            return
        self._announce_plain(node, a)
        self._hop(node, self._c_add_round, node, term, rnd.first_index, rnd.last_index, rid)

    def _announce_plain(self, node: Node, a: Announcement) -> None:
        for p in node.dispatchers:
            self._hop(node, self._d_on_announcement, node, p, a)

    def _m_on_resolved(self, node: Node, term: int, committed: int | None, resolved) -> None:
        if committed is not None:
            node.logic.on_committed(term, committed)
        self._finish(node, resolved)

    def _finish(self, node: Node, resolved) -> None:
        for token, code in resolved:
            self._finish_round(node, token, code)

    def _finish_round(self, node: Node, rid: int, code: ResponseCode) -> None:
        item = node.rounds.pop(rid, None)
        if item is None:
            return
        self._schedule_round(node)
        rnd, clients, _ = item
        node.outstanding -= len(clients)
        if code == ResponseCode.SUCCESS:
            node.logic.on_committed(rnd.term, rnd.last_index)  # read-your-writes
            for (client, req_id), (_, first, last) in zip(clients, rnd.calls, strict=True):
                self._to_client(
                    node.id,
                    client,
                    ClientReply(req_id, code, first, last, rnd.term, node.id),
                )
            return
        # stored here, not acknowledged by a quorum: the outcome is unknown
        leader = node.logic.state.leader_id
        for client, req_id in clients:
            self._to_client(node.id, client, ClientReply(req_id, code, leader_id=leader))

    def _m_on_peer_progress(self, node: Node, peer: str, wm: int) -> None:
        self._apply(node, node.logic.on_peer_progress(peer, wm, self.clock.now_ms))

    def _m_cg_push(self, node: Node, pushed) -> tuple:
        """``MemberActor.cg_push``: a follower takes the pushes of a graph execution."""
        carry, wire = pushed
        answers = []
        now = self.clock.now_ms
        for key, req in wire:
            for tok, resp in node.logic.on_push(req, CgToken(key, (req.leader_id, req.term)), now):
                if type(tok) is CgToken:
                    answers.append((tok.key, resp, tok.origin))
                else:
                    self._answer(node, [(tok, resp)])
        if node.late:
            self.stats["late_answers"] += len(node.late)
            answers += node.late
            node.late = []
        return carry, answers

    def _m_on_graph_output(self, node: Node, term: int, committed, resolved) -> None:
        if committed is not None:
            node.logic.on_committed(term, committed)
        self._finish(node, resolved)

    def _m_on_graph_fallback(self, node: Node, items: list) -> None:
        """Rounds queued or in flight in an abandoned graph travel again as plain calls."""
        for a, rounds in items:
            waiting = [(f, la, rid) for f, la, rid in rounds if rid in node.rounds]
            if not waiting:
                continue
            self._announce_plain(node, a)
            for first, last, rid in waiting:
                self.stats["re_registered"] += 1
                self._hop(node, self._c_add_round, node, a.term, first, last, rid)

    # ================================================================ QuorumAckCheckerActor

    def _c_become_leader(self, node: Node, term: int, start: int, info) -> list:
        cs = node.csh
        cs.loop = True
        failed = node.checker.become_leader(term, start, info)
        cs.committed_sent = -1
        self._c_check(node)
        return [(r.token, r.code) for r in failed]

    def _c_step_down(self, node: Node, term: int) -> list:
        cs = node.csh
        failed = node.checker.step_down(term)
        failed += [r for _, r in cs.out]
        cs.out = []
        cs.cg_gen = None
        return [(r.token, r.code) for r in failed]

    def _c_add_round(self, node: Node, term: int, first: int, last: int, token) -> None:
        chk = node.checker
        if term != chk.term:
            node.csh.out.append(
                (term, Resolved(token, ResponseCode.TERM_CHANGED, first, last, term))
            )
        else:
            if token in chk._registered:
                self.stats["double_registered"] += 1
            chk.add_round(term, first, last, token, self.clock.now_ms)
        self._c_kick(node)

    def _c_report(self, node: Node, term: int, peer: str, wm: int) -> int | None:
        chk = node.checker
        if term != chk.term:
            return None
        chk.report(term, peer, wm)
        self._c_check(node)
        return chk.committed_index

    def _c_kick(self, node: Node) -> None:
        cs = node.csh
        if not cs.scheduled and cs.loop:
            cs.scheduled = True
            self._soon(node, self._c_check, node)

    def _c_check(self, node: Node) -> None:
        """Commit what a quorum stores; one message to the leader with what changed."""
        cs = node.csh
        cs.scheduled = False
        chk = node.checker
        now = self.clock.now_ms
        term = chk.term
        if term < 0:
            return
        committed, resolved = chk.check(now)
        resolved += [r for _, r in cs.out]
        cs.out = []
        deadline = chk.next_deadline_ms()
        if committed is not None and committed > cs.committed_sent:
            cs.committed_sent = committed
        else:
            committed = None
        if committed is not None or resolved:
            self._hop(
                node,
                self._m_on_resolved,
                node,
                term,
                committed,
                [(r.token, r.code) for r in resolved],
            )
        if committed is not None:
            self._c_tell_dispatchers(node, term, committed)
        self._cancel(cs.timer)
        cs.timer = None
        if deadline is not None:
            cs.timer = self._at(node, max(now + 1, deadline), self._c_check, node)

    def _c_arm(self, node: Node) -> None:
        cs = node.csh
        chk = node.checker
        deadline = chk.next_deadline_ms() if chk.term >= 0 else None
        self._cancel(cs.timer)
        cs.timer = None
        if deadline is not None:
            cs.timer = self._at(node, max(self.clock.now_ms + 1, deadline), self._c_check, node)

    def _c_cg_begin(self, node: Node, term: int, gen: int) -> bool:
        if term != node.checker.term:
            return False
        node.csh.cg_gen = gen
        return True

    def _c_cg_end(self, node: Node, gen: int) -> None:
        if node.csh.cg_gen == gen:
            node.csh.cg_gen = None

    def _c_cg_report(self, node: Node, ack) -> tuple | None:
        gen, term, peer, wm, rounds = ack
        cs = node.csh
        chk = node.checker
        now = self.clock.now_ms
        if gen != cs.cg_gen or term != chk.term:
            return None
        for first, last, token in rounds:
            if token in chk._registered:
                self.stats["double_registered"] += 1
            chk.add_round(term, first, last, token, now)
        if wm >= 0:
            chk.report(term, peer, wm)
        committed, resolved = chk.check(now)
        resolved += [r for _, r in cs.out]
        cs.out = []
        if committed is not None and committed > cs.committed_sent:
            cs.committed_sent = committed
        else:
            committed = None
        if committed is not None:
            self._c_tell_dispatchers(node, term, committed)
        self._hop(node, self._c_arm, node)
        return term, committed, [(r.token, r.code) for r in resolved]

    def _c_tell_dispatchers(self, node: Node, term: int, committed: int) -> None:
        """The dispatchers hear of the committed index once it stood still a moment."""
        node.csh.notice = (term, committed)
        if node.csh.loop:
            self._hop(node, self._c_arm_notice, node)

    def _c_arm_notice(self, node: Node) -> None:
        cs = node.csh
        self._cancel(cs.notice_timer)
        cs.notice_timer = self._at(
            node, self.clock.now_ms + COMMIT_NOTICE_MS, self._c_send_notice, node
        )

    def _c_send_notice(self, node: Node) -> None:
        cs = node.csh
        cs.notice_timer = None
        if cs.notice is None:
            return
        term, committed = cs.notice
        cs.notice = None
        for p in node.dispatchers:
            self._hop(node, self._d_on_committed, node, p, term, committed)

    # ================================================================ EntryDispatcherActor

    def _d_activate(self, node: Node, peer: str, info) -> None:
        node.dsh[peer].loop = True
        node.dispatchers[peer].activate(info)
        self._d_kick(node, peer)

    def _d_deactivate(self, node: Node, peer: str, term: int) -> None:
        sh = node.dsh[peer]
        node.dispatchers[peer].deactivate(term)
        sh.cg_gen = None
        sh.cg_sent.clear()
        self._cancel(sh.timer)
        sh.timer = None

    def _d_on_announcement(self, node: Node, peer: str, a: Announcement) -> None:
        if node.dispatchers[peer].on_announcement(a):
            self._d_pump(node, peer)
        else:
            self._d_kick(node, peer)

    def _d_on_committed(self, node: Node, peer: str, term: int, index: int) -> None:
        if node.dispatchers[peer].on_committed(term, index):
            self._d_kick(node, peer)

    def _d_kick(self, node: Node, peer: str) -> None:
        sh = node.dsh[peer]
        if not sh.scheduled and sh.loop:
            sh.scheduled = True
            self._soon(node, self._d_pump, node, peer)

    def _d_pump(self, node: Node, peer: str) -> None:
        sh = node.dsh[peer]
        sh.scheduled = False
        self._cancel(sh.timer)
        sh.timer = None
        d = node.dispatchers[peer]
        if not d.active:
            return
        now = self.clock.now_ms
        reqs = d.next_requests(now)
        need = d.need
        term = d.term
        wake = d.next_wakeup_ms(now)
        for req in reqs:
            self._d_send(node, peer, req)
        if need is not None and not sh.fetching:
            sh.fetching = True
            self._spawn(node, self._d_fetch(node, peer, term, need.kind, need.index, need.count))
        if wake is not None:
            sh.timer = self._at(node, max(now + 1, wake), self._d_pump, node, peer)

    def _d_fetch(
        self, node: Node, peer: str, term: int, kind: str, index: int, count: int | None = None
    ):
        """A batch the cache lacks, or an entry's (term, pos): the member's fenced answer."""
        cfg = self.replication
        lg = node.logic
        d = node.dispatchers[peer]
        self.stats[f"fetch_{kind}"] += 1
        if kind == "batch":
            (answer,) = yield [
                lambda: _call(
                    lg.read_for_push,
                    term,
                    index,
                    cfg.max_batch_push_bytes,
                    count or cfg.max_batch_push_count,
                )
            ]
            if isinstance(answer, LedgerError):
                yield 50
            else:
                if answer is None:
                    self.stats["fetch_fenced"] += 1
                else:
                    self._note_need(node, peer, (term, kind, index))
                    batch, info = answer
                    answer = (
                        CachedBatch(batch.first_index, batch.count, batch, len(batch.data)),
                        info,
                    )
                d.took_batch(term, answer)
        else:
            (answer,) = yield [lambda: _call(lg.entry_meta, term, index)]
            if isinstance(answer, LedgerError):
                yield 50
            else:
                if answer is None:
                    self.stats["fetch_fenced"] += 1
                else:
                    self._note_need(node, peer, (term, kind, index))
                d.took_meta(term, index, answer)
        node.dsh[peer].fetching = False
        self._d_kick(node, peer)

    def _note_need(self, node: Node, peer: str, need: tuple) -> None:
        """A dispatcher that fetches the same thing again and again, answered every time,
        never gets what it needs: a hot loop of actor calls, and a livelock when it lasts."""
        sh = node.dsh[peer]
        now = self.clock.now_ms
        if sh.last_need != need:
            sh.last_need, sh.same_need, sh.same_need_since = need, 1, now
            return
        sh.same_need += 1
        if sh.same_need == FETCH_LOOP:
            self.stats["fetch_loops"] += 1
        if sh.same_need >= FETCH_LOOP:
            lasted = now - sh.same_need_since
            self.stats["fetch_loop_max_ms"] = max(self.stats["fetch_loop_max_ms"], lasted)
            if lasted > FETCH_LIVELOCK_MS:
                d = node.dispatchers[peer]
                self.fail(
                    f"dispatcher {node.id}->{peer} has fetched {need[1]}@{need[2]} (term "
                    f"{need[0]}) {sh.same_need} times in {lasted} ms and the answer never "
                    f"served: {d.core!r} pending={d.core._pending} "
                    f"cached={ {k: b.count for k, b in d.view.batches.items()} }"
                )

    def _d_send(self, node: Node, peer: str, req: PushEntryRequest) -> None:
        batch = req.batch
        if isinstance(batch, CachedBatch):
            req = replace(req, batch=batch.payload)
        self.rpc.call(node.id, peer, req)

    def _d_on_response(self, node: Node, peer: str, req: PushEntryRequest, resp) -> None:
        sh = node.dsh[peer]
        wm = node.dispatchers[peer].on_response(req, resp, self.clock.now_ms)
        if wm is not None and sh.reporting and sh.reporting_term != req.term:
            self.stats["report_swallowed"] += 1  # a report loop of an older term still runs
        if wm is not None and not sh.reporting:
            sh.reporting = True
            sh.reporting_term = req.term
            self._spawn(node, self._d_report(node, peer, req.term))
        self._d_kick(node, peer)

    def _d_report(self, node: Node, peer: str, term: int, force: bool = False):
        """Report the follower's water mark (the latest, one report in flight at a time)."""
        d = node.dispatchers[peer]
        sh = node.dsh[peer]
        while True:
            if d.term != term or not d.active:
                break
            wm = d.water_mark
            (committed,) = yield [lambda wm=wm: self._c_report(node, term, peer, wm)]
            if committed is not None and d.on_committed(term, committed):
                self._d_kick(node, peer)
            now = self.clock.now_ms
            if now - sh.last_progress > 50:
                sh.last_progress = now
                self._hop(node, self._m_on_peer_progress, node, peer, wm)
            if d.water_mark <= wm and not force:
                break
            force = False
        sh.reporting = False

    def _d_cg_begin(self, node: Node, peer: str, term: int, gen: int) -> bool:
        sh = node.dsh[peer]
        if term != node.dispatchers[peer].term:
            return False
        sh.cg_gen = gen
        sh.cg_sent.clear()
        return True

    def _d_cg_end(self, node: Node, peer: str, gen: int) -> None:
        """The leader left graph ``gen``: its pushes in flight are lost, push again."""
        sh = node.dsh[peer]
        if sh.cg_gen != gen:
            return
        sh.cg_gen = None
        sh.cg_sent.clear()
        d = node.dispatchers[peer]
        if d.active:
            self.stats["rewinds"] += 1
        d.rewind()
        # water marks that went into the graph may never have reached the checker
        if not sh.reporting:
            sh.reporting = True
            sh.reporting_term = d.term
            self._spawn(node, self._d_report(node, peer, d.term, force=True))
        self._d_kick(node, peer)

    def _d_cg_push(self, node: Node, peer: str, g: GraphRound) -> tuple:
        a = g.announcement
        sh = node.dsh[peer]
        d = node.dispatchers[peer]
        wire, plain = [], []
        if g.gen != sh.cg_gen:
            return (g.gen, a.term, g.rounds), []
        d.on_announcement(a)
        for req in d.next_requests(self.clock.now_ms):
            batch = req.batch
            inline = batch is None or isinstance(batch.payload, EntryBatch)
            if inline and req.type in (PushType.APPEND, PushType.COMMIT):
                key = (g.gen, next(sh.cg_keys))
                sh.cg_sent[key] = req
                wire.append((key, replace(req, batch=batch.payload) if batch else req))
            else:
                plain.append(req)
        if (plain or d.need is not None) and sh.loop:
            self._hop(node, self._d_send_all, node, peer, plain)
        return (g.gen, a.term, g.rounds), wire

    def _d_send_all(self, node: Node, peer: str, reqs: list) -> None:
        for req in reqs:
            self._d_send(node, peer, req)
        self._d_kick(node, peer)

    def _d_cg_ack(self, node: Node, peer: str, answered) -> tuple:
        (gen, term, rounds), answers = answered
        sh = node.dsh[peer]
        d = node.dispatchers[peer]
        now = self.clock.now_ms
        for key, resp, origin in answers:
            req = sh.cg_sent.pop(key, None)
            if origin != (node.id, term):
                self.stats["late_answer_elsewhere"] += 1
                if req is not None:
                    # MemberActor._late is not kept per leader: an answer to another
                    # leader's push with the same (gen, n) key is folded into this one
                    self.stats["late_answer_misfolded"] += 1
                    self.net.note(
                        f"{node.id}->{peer} folds {origin}'s answer {resp} into {req.describe()}"
                    )
            if req is not None:
                d.on_response(req, resp, now)
        wm = d.water_mark if d.term == term else -1
        self._hop(node, self._d_after_ack, node, peer, wm)
        return gen, term, peer, wm, rounds

    def _d_after_ack(self, node: Node, peer: str, wm: int) -> None:
        sh = node.dsh[peer]
        now = self.clock.now_ms
        if wm >= 0 and now - sh.last_progress > 50:
            sh.last_progress = now
            self._hop(node, self._m_on_peer_progress, node, peer, wm)
        self._d_kick(node, peer)

    # ================================================================ FastPath

    def _fp(self, node: Node) -> FastPathState:
        if node.fast is None:
            node.fast = FastPathState()
        return node.fast

    def _fp_start(self, node: Node, term: int) -> None:
        self._lane(node, "to_fast", self._fp_do_start, node, term)

    def _fp_do_start(self, node: Node, term: int) -> None:
        fp = self._fp(node)
        self._fp_do_stop(node)
        fp.term = term
        fp.backoff = FAST_PATH_RETRY_MS[0]
        self._fp_schedule_build(node, 0)

    def _fp_stop(self, node: Node) -> None:
        """The term ended: leave the graph (the member fails the rounds of the term)."""
        node.fast.active = False
        self._lane(node, "to_fast", self._fp_do_stop, node)

    def _fp_do_stop(self, node: Node) -> None:
        fp = node.fast
        self._cancel(fp.retry)
        fp.retry = None
        fp.building = None
        self._fp_abandon(node)
        fp.term = -1

    def _fp_submit(self, node: Node, a: Announcement, rounds: list) -> bool:
        fp = node.fast
        if not fp.active:
            return False
        self.stats["graph_rounds"] += 1
        self._lane(node, "to_fast", self._fp_enqueue, node, a, rounds)
        return True

    def _fp_abandon(self, node: Node) -> list:
        fp = node.fast
        fp.active = False
        fp.gen += 1
        self._cancel(fp.watchdog)
        fp.watchdog = None
        items = [(e.announcement, e.rounds) for e in fp.inflight]
        items += [(g.announcement, g.rounds) for g in fp.queue]
        fp.inflight.clear()
        fp.queue.clear()
        for chain in fp.chains.values():
            # what is in flight on the torn-down graph arrives late, or never
            if self._fp_rng.random() < 0.5:
                for e in chain.edges:
                    e.items.clear()
            else:
                self.stats["late_channels"] += 1
        fp.chains = {}
        return items

    def _fp_schedule_build(self, node: Node, delay: int) -> None:
        fp = node.fast
        self._cancel(fp.retry)
        fp.retry = self._at(node, self.clock.now_ms + delay, self._fp_begin_build, node)

    def _fp_begin_build(self, node: Node) -> None:
        fp = node.fast
        fp.retry = None
        if fp.term < 0 or fp.active or fp.building is not None:
            return
        if not self.members[node.id].fast_enabled:  # switched off: stay on plain calls
            return
        fp.building = next(fp.build_ids)
        self._spawn(node, self._fp_build(node, fp, fp.building, fp.term))

    def _reachable(self, a: str, b: str) -> bool:
        return self.net.link_up(a, b) and self.net.link_up(b, a) and self.members[b].alive

    def _fp_build(self, node: Node, fp: FastPathState, build_id: int, term: int):
        lo, hi = FAST_PATH_COMPILE_MS
        yield self._fp_rng.randint(lo, hi)  # followers leave old loops; the graph compiles
        if fp.building != build_id:
            return  # cancelled while compiling
        fp.building = None
        peers = list(node.dispatchers)
        if not all(self._reachable(node.id, p) for p in peers):
            self.net.note(f"{node.id} term={term}: compiled path not built (a follower is away)")
            self._fp_retry_later(node)
            return
        if term != fp.term:
            return
        fp.gen += 1
        gen = fp.gen
        calls = [lambda: self._c_cg_begin(node, term, gen)]
        calls += [(lambda p=p: self._d_cg_begin(node, p, term, gen)) for p in peers]
        answers = yield calls
        if not all(answers):
            self._fp_retry_later(node)
            return
        if gen != fp.gen or term != fp.term:
            # left (or restarted for a new term) while the helpers were told: see the report
            self.stats["fast_build_raced"] += 1
            return
        fp.active = True
        fp.compiles += 1
        self.stats["fast_compiles"] += 1
        for p in peers:
            chain = Chain(node.id, p, gen, self.members[p].incarnation)
            fp.chains[p] = chain
            self._chains.append((node, chain))
        self.net.note(f"{node.id} term={term}: compiled path on (generation {gen})")

    def _fp_retry_later(self, node: Node) -> None:
        fp = node.fast
        if fp.term < 0:
            return
        delay = fp.backoff
        fp.backoff = min(fp.backoff * 2, FAST_PATH_RETRY_MS[1])
        self._fp_schedule_build(node, delay)

    def _fp_enqueue(self, node: Node, a: Announcement, rounds: list) -> None:
        fp = node.fast
        if not fp.active:
            self._lane(node, "to_main", self._m_on_graph_fallback, node, [(a, tuple(rounds))])
            return
        q = fp.queue
        if q:
            prev = q.pop()
            a = prev.announcement.followed_by(a)
            rounds = list(prev.rounds) + list(rounds)
        q.append(GraphRound(fp.gen, a, tuple(rounds)))
        self._fp_submit_some(node)

    def _fp_submit_some(self, node: Node) -> None:
        fp = node.fast
        now = self.clock.now_ms
        while fp.active and fp.queue and len(fp.inflight) < FAST_PATH_MAX_INFLIGHT:
            g = fp.queue.popleft()
            ex = Execution(now, g.announcement, g.rounds, fp.gen, len(fp.chains))
            fp.inflight.append(ex)
            for chain in fp.chains.values():
                self._put(chain, 0, (ex, g))
            if fp.watchdog is None:
                self._fp_arm_watchdog(node)

    def _fp_collect(self, node: Node, ex: Execution, out) -> None:
        fp = node.fast
        if ex.gen != fp.gen:
            if out is not None:
                self._lane(node, "to_main", self._m_on_graph_output, node, *out)
            return
        if out is not None:
            self._lane(node, "to_main", self._m_on_graph_output, node, *out)
        ex.waiting -= 1
        if ex.waiting == 0:
            while fp.inflight and fp.inflight[0].waiting == 0:
                fp.inflight.popleft()
            self._fp_submit_some(node)
            self._fp_arm_watchdog(node)

    def _fp_arm_watchdog(self, node: Node) -> None:
        fp = node.fast
        self._cancel(fp.watchdog)
        fp.watchdog = None
        if not fp.inflight:
            return
        due = fp.inflight[0].started + FAST_PATH_STALL_MS
        fp.watchdog = self._at(node, max(self.clock.now_ms, due), self._fp_check_stall, node)

    def _fp_check_stall(self, node: Node) -> None:
        fp = node.fast
        fp.watchdog = None
        if fp.inflight and self.clock.now_ms - fp.inflight[0].started >= FAST_PATH_STALL_MS:
            self._fp_fallback(node, f"an execution waited more than {FAST_PATH_STALL_MS} ms")
        else:
            self._fp_arm_watchdog(node)

    def _fp_fallback(self, node: Node, why: str) -> None:
        """Leave the graph: plain calls carry everything until a new graph is built."""
        fp = node.fast
        if fp is None or not fp.active:
            return
        fp.fallbacks += 1
        self.stats["fast_fallbacks"] += 1
        gen = fp.gen
        self.net.note(f"{node.id} term={fp.term}: compiled path off (generation {gen}): {why}")
        items = self._fp_abandon(node)
        for p in node.dispatchers:
            self._hop(node, self._d_cg_end, node, p, gen)
        self._hop(node, self._c_cg_end, node, gen)
        self._lane(node, "to_main", self._m_on_graph_fallback, node, items)
        self._fp_retry_later(node)

    # -- the graph's channels ----------------------------------------------------------------

    def _put(self, chain: Chain, edge: int, item: Any) -> None:
        ch = chain.edges[edge]
        now = self.clock.now_ms
        if ch.remote:
            delay = self._fp_rng.randint(0, 3)
            if chain.peer in self.slow and self.slow[chain.peer] > now:
                delay += self._fp_rng.randint(20, 250)
        else:
            delay = self._fp_rng.randint(*LOCAL_HOP_MS)
        ready = max(now + delay, ch.last)
        ch.last = ready
        ch.items.append((ready, item))

    def _deliverable(self, ch: Channel, now: int) -> bool:
        if not ch.items or ch.items[0][0] > now:
            return False
        if ch.remote:
            return ch.stall_until <= now and self.net.link_up(ch.src, ch.dst)
        return True

    def _run_chains(self, now: int) -> bool:
        ran = False
        keep = []
        for node, chain in self._chains:
            if node.dead:
                continue
            for k, ch in enumerate(chain.edges):
                while self._deliverable(ch, now):
                    _, item = ch.items.popleft()
                    ran = True
                    self._chain_stage(node, chain, k, item)
                    if node.dead:
                        break
            fp = node.fast
            if not chain.empty() or (fp is not None and fp.chains.get(chain.peer) is chain):
                keep.append((node, chain))
        self._chains = keep
        return ran

    def _chain_stage(self, node: Node, chain: Chain, k: int, item: Any) -> None:
        peer = chain.peer
        if k == 0:
            ex, g = item
            self._put(chain, 1, (ex, self._d_cg_push(node, peer, g)))
        elif k == 1:
            ex, pushed = item
            follower = self.members[peer].node
            if follower is None or follower.incarnation != chain.follower_inc:
                if node.fast is not None and node.fast.gen == chain.gen:
                    self._hop(node, self._fp_fallback, node, f"participant {peer} failed")
                return
            self._put(chain, 2, (ex, self._m_cg_push(follower, pushed)))
        elif k == 2:
            ex, answered = item
            self._put(chain, 3, (ex, self._d_cg_ack(node, peer, answered)))
        elif k == 3:
            ex, ack = item
            self._put(chain, 4, (ex, self._c_cg_report(node, ack)))
        else:
            ex, out = item
            self._fp_collect(node, ex, out)

    def _next_chain_ms(self) -> int | None:
        best = None
        for node, chain in self._chains:
            if node.dead:
                continue
            for ch in chain.edges:
                if not ch.items:
                    continue
                t = ch.items[0][0]
                if ch.remote:
                    if not self.net.link_up(ch.src, ch.dst):
                        continue
                    t = max(t, ch.stall_until)
                if best is None or t < best:
                    best = t
        return best

    # -- the switch faults --------------------------------------------------------------------

    def _switch_step(self, now: int) -> None:
        """Seeded fast-path faults: switch a member's compiled path on or off, or stall
        one channel of a leader's graph."""
        if self._next_switch_ms is None or now < self._next_switch_ms:
            return
        rng = self._fp_rng
        self._next_switch_ms = now + int(rng.expovariate(1 / FAST_PATH_SWITCH_MEAN_MS)) + 1
        kind = rng.choices(("on", "off", "stall"), (2.0, 1.0, 4.0))[0]
        if kind == "stall":
            graphs = [
                m.node
                for m in self.members.values()
                if m.alive and m.node.fast is not None and m.node.fast.active
            ]
            if not graphs:
                kind = "on"
            else:
                node = rng.choice(graphs)
                peer = rng.choice(sorted(node.fast.chains))
                edge = node.fast.chains[peer].edges[rng.choice((1, 2))]
                edge.stall_until = now + rng.randint(10, 400)
                self.net.note(
                    f"FAULT stall {edge.src}->{edge.dst} of {node.id}'s graph "
                    f"until {edge.stall_until}"
                )
                return
        m = self.members[rng.choice(self.ids)]
        if kind == "on":
            m.fast_enabled = True
            self.net.note(f"FAULT fast path on at {m.id}")
            if m.alive:
                node = m.node
                fp = node.fast
                lg = node.logic
                if lg.ready_term == lg.state.current_term and lg.leads(lg.ready_term):
                    if fp is None or (not fp.active and fp.building is None):
                        self._fp_start(node, lg.ready_term)
        else:
            m.fast_enabled = False
            self.net.note(f"FAULT fast path off at {m.id}")
            if m.alive and m.node.fast is not None:
                self._hop(m.node, self._fp_fallback, m.node, "switched off")

    # ================================================================ clients

    def _clients_step(self, now: int) -> None:
        for c in self.clients:
            if c.outstanding is not None:
                if now - c.outstanding[2] > 3000:  # longer than max_wait_ack_time_ms
                    self._inflight_clients.pop(c.outstanding[0], None)
                    c.outstanding = None
                    self.unknown_outcomes += 1
                    c.believed = self.rng.choice(self.ids)
                    c.next_at = now
                continue
            if not self.clients_on or now < c.next_at:
                continue
            req_id = next(self._req_ids)
            k = self.rng.randint(1, self.max_bodies)
            bodies = tuple(
                f"{c.id}:{req_id}:{j}:".encode() + b"x" * self.rng.randint(0, 120) for j in range(k)
            )
            c.outstanding = (req_id, bodies, now)
            self._inflight_clients[req_id] = c
            self._to_client(c.id, c.believed, ClientAppend(c.id, req_id, c.believed, bodies))

    def _to_client(self, src: str, dst: str, msg: object) -> None:
        """Client calls are Ray actor calls: delayed, lost with a crashed member, never duplicated."""
        if self.net.is_down(src) or self.net.is_down(dst):
            return
        delay = self._client_rng.randint(1, 15)
        heapq.heappush(self._held, (self.clock.now_ms + delay, next(self._held_seq), src, dst, msg))

    def _client_reply(self, c: Client, reply: ClientReply) -> None:
        if c.outstanding is None or c.outstanding[0] != reply.req_id:
            return
        bodies = c.outstanding[1]
        c.outstanding = None
        self.reply_codes[reply.code] += 1
        self._inflight_clients.pop(reply.req_id, None)
        now = self.clock.now_ms
        lo, hi = self.client_interval_ms
        c.next_at = now + self.rng.randint(lo, hi)
        if reply.code == ResponseCode.SUCCESS:
            if reply.last_index - reply.first_index + 1 != len(bodies):
                self.fail(
                    f"append {reply.req_id} acknowledged {reply.first_index}..{reply.last_index} for {len(bodies)} bodies"
                )
            for k, body in enumerate(bodies):
                index = reply.first_index + k
                if index in self.acked and not self.durability_void:
                    self.fail(
                        f"index {index} acknowledged twice ({self.acked[index]!r} and {body!r})"
                    )
                self.acked[index] = body
                self.acked_terms[index] = reply.term
                got = self.committed.get(index)
                if got is None:
                    self.acked_unseen[index] = (reply.term, reply.req_id)
                elif got[0] != reply.term and not self.durability_void:
                    self.fail(
                        f"append {reply.req_id} acknowledged at {index} (term {reply.term}) but committed {got}"
                    )
            return
        if reply.code in (
            ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
            ResponseCode.TERM_CHANGED,
            ResponseCode.NOT_LEADER,
        ):
            self.unknown_outcomes += reply.code != ResponseCode.NOT_LEADER
        if reply.leader_id is not None and reply.leader_id in self.members:
            c.believed = reply.leader_id
        elif reply.code != ResponseCode.LEADER_PENDING_FULL:
            c.believed = self.rng.choice(self.ids)

    # ================================================================ delivery

    def _deliver(self, src: str, dst: str, payload: object) -> None:
        if dst.startswith("c"):
            c = self._inflight_clients.get(getattr(payload, "req_id", -1))
            if c is not None and c.id == dst:
                self._client_reply(c, payload)
            return
        node = self.members[dst].node
        if node is None:
            return
        now = self.clock.now_ms
        if isinstance(payload, RpcRequest):
            body = payload.body
            if isinstance(body, PushEntryRequest):
                self._answer(node, node.logic.on_push(body, (src, payload.call_id), now))
            else:
                resp, actions = node.logic.handle_election(body, now)
                self.rpc.reply(dst, src, payload.call_id, resp)
                self._apply(node, actions)
        elif isinstance(payload, RpcResponse):
            pending = self.rpc.complete(dst, payload.call_id)
            if pending is not None:
                self._on_answer(node, pending[0], pending[1], payload.body)
        elif isinstance(payload, ClientAppend):
            self._client_append(node, payload)
        else:
            self.fail(f"unknown payload {payload!r}")

    def _on_answer(self, node: Node, callee: str, request: object, response: object) -> None:
        """The answer to a call (None: it failed or timed out)."""
        if isinstance(request, PushEntryRequest):
            self._d_on_response(node, callee, request, response)
        else:
            self._apply(
                node,
                node.logic.on_election_response(callee, request, response, self.clock.now_ms),
            )

    # ================================================================ invariants

    def _headers(self, store: LogStore, lo: int, hi: int) -> list[tuple]:
        """(index, term, chain crc, body crc) of entries lo..hi."""
        out = []
        start = lo
        while start <= hi:
            batch = store.read_batch(start, 1 << 20, hi - start + 1)
            for h in batch.headers():
                out.append((h[2], h[3], h[6], h[7]))
            start += batch.count
        return out

    def check_invariants(self) -> None:
        now = self.clock.now_ms
        stuck_after = self.replication.max_wait_ack_time_ms + ROUND_SLACK_MS
        for m in self.members.values():
            if not m.alive:
                continue
            lg = m.node.logic
            st = lg.state
            if st.is_leader:
                term = st.current_term
                holder = self.leaders_by_term.get(term)
                if holder is None:
                    self.leaders_by_term[term] = m.id
                    self.leader_incarnation[term] = m.incarnation
                    self._check_leader_completeness(m, term)
                elif holder == m.id and self.leader_incarnation[term] != m.incarnation:
                    # issue 10 §3a: it may have lost entries it acknowledged in that term
                    self.fail(f"{m.id} leads term {term} again after a restart")
                elif holder != m.id:
                    self.fail(f"Election Safety: {m.id} and {holder} both lead term {term}")
        for m in self.members.values():
            if not m.alive:
                continue
            self._check_member(m)
            lg = m.node.logic
            if m.node.rounds and lg.leads(lg.leading_term):
                for rid, (rnd, _, born) in m.node.rounds.items():
                    if rnd.term == lg.leading_term and now - born > stuck_after:
                        self.fail(
                            f"{m.id} leads term {rnd.term} but round {rid} "
                            f"({rnd.first_index}..{rnd.last_index}, written at {born}) "
                            f"is unanswered after {now - born} ms"
                        )

    def _check_member(self, m: SimMember) -> None:
        store = m.store
        end = store.ledger_end_index
        cut = self.touched.pop(m.id, None)
        if cut is not None and cut < m.verified_end:
            m.verified_end = cut
        if end > m.verified_end:
            lo = max(m.verified_end + 1, store.ledger_begin_index)
            for index, term, chain, bcrc in self._headers(store, lo, end):
                key = (index, term)
                seen = self.entries.get(key)
                if seen is None:
                    self.entries[key] = (chain, bcrc)
                elif seen != (chain, bcrc):
                    self.fail(
                        f"Log Matching: {m.id} holds a different entry at index {index} term {term}"
                    )
            m.verified_end = end
        elif end < m.verified_end:
            m.verified_end = end
        committed = store.committed_index
        if committed > end:
            self.fail(f"{m.id} committed {committed} beyond its end {end}")
        if committed < m.committed_seen:
            self.fail(f"{m.id} committed index went back from {m.committed_seen} to {committed}")
        if committed > m.committed_seen:
            lo = max(m.committed_seen + 1, store.ledger_begin_index)
            for index, term, chain, bcrc in self._headers(store, lo, committed):
                got = self.committed.get(index)
                if got is None:
                    self.committed[index] = (term, chain, bcrc)
                    unseen = self.acked_unseen.pop(index, None)
                    if unseen is not None and unseen[0] != term and not self.durability_void:
                        self.fail(
                            f"append {unseen[1]} acknowledged at {index} (term {unseen[0]}) "
                            f"but committed there in term {term}"
                        )
                elif got != (term, chain, bcrc):
                    if self.durability_void:
                        self.stats["committed_overwritten_after_power_loss"] += 1
                        self.committed[index] = (term, chain, bcrc)
                        continue
                    self.fail(
                        f"{m.id} committed index {index} as term {term}, "
                        f"another member committed term {got[0]} there"
                    )
            m.committed_seen = committed
            if committed > self.max_committed:
                self.max_committed = committed
            if m.alive:
                self._note_commit_term(m.node.logic.state.current_term, committed)

    def _note_commit_term(self, term: int, index: int) -> None:
        """Entries up to ``index`` were committed in ``term`` or before."""
        if index > self.commit_terms.get(term, -1):
            self.commit_terms[term] = index

    def _committed_before(self, term: int) -> int:
        """The highest index known committed in a term before ``term``."""
        return max((i for t, i in self.commit_terms.items() if t < term), default=-1)

    def _check_leader_completeness(self, m: SimMember, term: int) -> None:
        c = self._committed_before(term)
        if c < 0 or self.durability_void:
            return
        store = m.store
        if store.ledger_end_index < c:
            self.fail(
                f"Leader Completeness: leader {m.id} of term {term} ends at "
                f"{store.ledger_end_index}, {c} was committed before"
            )
        (h,) = self._headers(store, c, c)
        if (h[1], h[2], h[3]) != self.committed[c]:
            self.fail(
                f"Leader Completeness: leader {m.id} of term {term} holds another entry "
                f"at index {c}, committed before"
            )

    # ================================================================ the loop

    def _slow_step(self, now: int) -> None:
        if self._next_slow_ms is None or now < self._next_slow_ms:
            return
        rng = self._slow_rng
        self._next_slow_ms = now + int(rng.expovariate(1 / 2500)) + 1
        for mid, until in list(self.slow.items()):
            if until <= now:
                del self.slow[mid]
        if not self.slow:
            mid = rng.choice(self.ids)
            self.slow[mid] = now + rng.randint(300, 3000)
            self.net.note(f"FAULT slow {mid} until {self.slow[mid]}")

    def _next_event_ms(self, until: int) -> int:
        t = min(until, self._next_tick_ms)
        cands = [
            self.net.next_delivery_ms(),
            self.rpc.next_deadline_ms(),
            self._next_local_ms(),
            self._next_chain_ms(),
            self._next_slow_ms,
            self._next_switch_ms,
        ]
        if self.injector is not None:
            cands.append(self.injector.next_fault_ms)
        if self._held:
            cands.append(self._held[0][0])
        for cand in cands:
            if cand is not None and cand < t:
                t = cand
        return max(t, self.clock.now_ms)

    def _drain(self, now: int) -> None:
        """Everything on the nodes due by ``now``, until nothing more is."""
        for _ in range(100_000):
            ran = self._run_local(now)
            if self._chains:
                ran = self._run_chains(now) or ran
            if not ran:
                return
        self.fail("the node-local events never settle (a livelock)")

    def step(self, until: int) -> None:
        now = self._next_event_ms(until)
        self.clock.advance_to(now)
        self.steps += 1
        slow = self.slow
        for d in self.net.deliver_due(now):
            if d.dst in slow and slow[d.dst] > now:
                heapq.heappush(
                    self._held,
                    (
                        now + self._slow_rng.randint(20, 250),
                        next(self._held_seq),
                        d.src,
                        d.dst,
                        d.payload,
                    ),
                )
            else:
                self._deliver(d.src, d.dst, d.payload)
        held = self._held
        while held and held[0][0] <= now:
            _, _, src, dst, payload = heapq.heappop(held)
            if self.net.link_up(src, dst) or isinstance(payload, (ClientAppend, ClientReply)):
                self._deliver(src, dst, payload)
        for caller, callee, request in self.rpc.expired(now):
            node = self.members[caller].node
            if node is not None:
                self._on_answer(node, callee, request, None)
        if now >= self._next_tick_ms:
            self._next_tick_ms = now + self.tick_ms
            self._clients_step(now)
        self._drain(now)
        if self.injector is not None:
            self.injector.step(now)
        self._slow_step(now)
        self._switch_step(now)
        self._flush_step(now)
        self._drain(now)
        self.check_invariants()

    def run_until(self, t_ms: int, stop: Callable[[], bool] | None = None) -> bool:
        while self.clock.now_ms < t_ms:
            self.step(t_ms)
            if stop is not None and stop():
                return True
        return stop() if stop is not None else True

    def run_for(self, ms: int, stop: Callable[[], bool] | None = None) -> bool:
        return self.run_until(self.clock.now_ms + ms, stop)

    # ================================================================ convergence

    def converged(self) -> bool:
        """One leader followed by all; every log identical and fully committed; clients answered."""
        alive = [m for m in self.members.values() if m.alive]
        if len(alive) != self.n:
            return False
        leaders = [m for m in alive if m.state.is_leader]
        if len(leaders) != 1:
            return False
        leader = leaders[0]
        node = leader.node
        term = leader.state.current_term
        end = leader.store.ledger_end_index
        if leader.store.committed_index != end or node.logic.ready_term != term:
            return False
        if node.checker.core.pending_count or node.rounds:
            return False
        for m in alive:
            st = m.state
            if st.current_term != term or st.leader_id != leader.id:
                return False
            if m.store.ledger_end_index != end or m.store.committed_index != end:
                return False
        if any(c.outstanding is not None for c in self.clients):
            return False
        return True

    def heal(self) -> None:
        self.clients_on = False
        self.slow.clear()
        self._next_slow_ms = None
        self._next_switch_ms = None
        if self.injector is not None:
            self.injector.heal_all(NetworkConfig())
        else:
            self.net.heal()

    def final_check(self) -> None:
        """Identical logs everywhere; acknowledged appends committed where acknowledged; no body twice."""
        if self.acked_unseen and not self.durability_void:
            self.fail(f"acknowledged but never committed: {sorted(self.acked_unseen)[:10]}")
        logs = {}
        for m in self.members.values():
            store = m.store
            data = store.read_batch(store.ledger_begin_index).data if not store.is_empty else b""
            logs[m.id] = (store.ledger_begin_index, store.ledger_end_index, data)
        first = next(iter(logs.values()))
        for mid, got in logs.items():
            if got != first:
                self.fail(f"logs differ after convergence: {mid} {got[:2]} vs {first[:2]}")
        store = next(iter(self.members.values())).store
        bodies: dict[bytes, int] = {}
        for e in store.get_range(store.ledger_begin_index, store.committed_index + 1):
            if not e.body:
                continue
            if e.body in bodies:
                self.fail(
                    f"body {e.body[:24]!r} committed twice, at {bodies[e.body]} and {e.index}"
                )
            bodies[e.body] = e.index
        for index, body in self.acked.items():
            if bodies.get(body) != index:
                if self.durability_void:
                    self.stats["acked_lost_after_power_loss"] += 1
                    continue
                self.fail(
                    f"acknowledged append {body[:24]!r} at {index} is at {bodies.get(body)} in the committed log"
                )

    def run(self, chaos_ms: int = 8000, converge_within_ms: int = 20000) -> SimResult:
        """Chaos for ``chaos_ms``, then heal and require convergence within ``converge_within_ms``."""
        self.run_until(chaos_ms)
        self.heal()
        start = self.clock.now_ms
        if not self.run_for(converge_within_ms, self.converged):
            if self.durability_void:
                # followers that committed entries the new leader lost to a power loss refuse
                # to truncate below their committed index: without sync_flush the group can
                # wedge for good (counted, not failed: the loss voided the guarantee)
                self.stats["unconverged_after_power_loss"] += 1
                self.check_invariants()
                return self._result(self.clock.now_ms - start)
            self.fail(f"no convergence within {converge_within_ms} ms after healing")
        converge_ms = self.clock.now_ms - start
        self.check_invariants()
        self.final_check()
        return self._result(converge_ms)

    def _result(self, converge_ms: int) -> SimResult:
        return SimResult(
            seed=self.seed,
            steps=self.steps,
            sim_ms=self.clock.now_ms,
            acked_entries=len(self.acked),
            committed_entries=self.max_committed + 1,
            terms=len(self.leaders_by_term),
            converge_ms=converge_ms,
            faults=len(self.injector.log) if self.injector is not None else 0,
            fast_path_compiles=self.stats["fast_compiles"],
            fast_path_fallbacks=self.stats["fast_fallbacks"],
        )


def _call(fn: Callable, *args):
    """An actor call whose LedgerError comes back as a value (the caller's except)."""
    try:
        return fn(*args)
    except LedgerError as exc:
        return exc


def sim_config_for(seed: int) -> ReplicationConfig:
    """Vary the replication settings by seed: tiny pushes, small windows, a throttled follower."""
    rng = random.Random(seed * 7919 + 1)
    cfg = SIM_REPLICATION
    return replace(
        cfg,
        max_batch_push_bytes=rng.choice((200, 2048, 64 * 1024)),
        max_pending_pushes=rng.choice((1, 4, 8, 64)),
        peer_push_throttle_point=rng.choice((cfg.peer_push_throttle_point, 2048)),
        peer_push_quota=rng.choice((cfg.peer_push_quota, 40 * 1024)),
    )
