"""Deterministic simulation of whole groups: elect, append, replicate, commit, crash, recover.

Every member runs the logic the Ray actors ship (:mod:`rayledger.actors.core.member_logic`):
one :class:`~rayledger.actors.core.member_logic.MemberLogic` (store, MemberState, elector,
entry handler, admission, rounds), one
:class:`~rayledger.actors.core.member_logic.DispatcherLogic` per peer and one
:class:`~rayledger.actors.core.member_logic.CheckerLogic`, over a real store (a
:class:`~rayledger.storage.MemoryStore` that survives crashes as a disk would,
or a :class:`~rayledger.storage.FileStore` in a temp dir that is closed on a
crash and reopened from its files).  The simulation is only their transport,
and it carries the events the way ``actors/member/actor.py``, ``actors/dispatcher.py``,
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

Clients append unique bodies through whichever member they believe leads.  On the seeds
that run a state machine (``machine="kv"`` or ``"mq"``, :mod:`.machine_delivery`) every member
runs it through the shipped runner core, and the bodies are commands it takes.
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
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from rayledger.actors.core import member as mc
from rayledger.actors.core.reads import Consistency
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.election.messages import HeartbeatRequest, LeadershipTransferRequest
from rayledger.replication import PushEntryRequest, PushType, ReplicationConfig
from rayledger.storage import ResponseCode

from .checker_delivery import CheckerDelivery
from .clients import (
    Client,
    ClientAppend,
    ClientRead,
    ClientReadReply,
    ClientReply,
    Clients,
    LeaderReadIndex,
    Reader,
)
from .disk import SimDisk
from .dispatcher_delivery import DispatcherDelivery
from .driver import SimDriver
from .fastpath_delivery import FastPathDelivery
from .helper_faults import HelperFaults
from .invariants import Invariants
from .kv_history import KvGet, KvGetReply, KvHistory
from .lost_members import SPAWNER, LostMembers
from .machine_delivery import MachineDelivery
from .member_delivery import MemberDelivery
from .member_lifecycle import MemberLifecycle
from .membership_changes import MembershipChanges
from .network import (
    FakeClock,
    FaultConfig,
    FaultInjector,
    NetworkConfig,
    RpcRequest,
    RpcResponse,
    SimNetwork,
    SimulationFailure,
)
from .node_state import (
    CgToken,
    Chain,
    Channel,
    Node,
    SimMember,
)
from .node_transport import LocalTransport
from .sim_config import (
    FAST_PATH_COMPILE_MS,
    FAST_PATH_RETRY_MS,
    FAST_PATH_STALL_MS,
    FAST_PATH_SWITCH_MEAN_MS,
    FETCH_LIVELOCK_MS,
    FETCH_LOOP,
    FLUSH_TICK_MS,
    HANG_MEAN_MS,
    LEASE_PARTITION_TIMEOUTS,
    LOCAL_HOP_MS,
    MAINTAIN_MAX_SLEEP_MS,
    MAX_ROUNDS,
    PARKED_MS,
    ROUND_SLACK_MS,
    SIM_ELECTION,
    SIM_FAULTS,
    SIM_REPLICATION,
    SIM_STORE,
    SIM_TMP,
    TRANSFER_MEAN_MS,
    sim_config_for,
)

__all__ = [
    "FAST_PATH_COMPILE_MS",
    "FAST_PATH_RETRY_MS",
    "FAST_PATH_STALL_MS",
    "FAST_PATH_SWITCH_MEAN_MS",
    "FETCH_LIVELOCK_MS",
    "FETCH_LOOP",
    "FLUSH_TICK_MS",
    "HANG_MEAN_MS",
    "TRANSFER_MEAN_MS",
    "LOCAL_HOP_MS",
    "MAINTAIN_MAX_SLEEP_MS",
    "MAX_ROUNDS",
    "PARKED_MS",
    "ROUND_SLACK_MS",
    "SIM_ELECTION",
    "SIM_FAULTS",
    "SIM_REPLICATION",
    "SIM_STORE",
    "SIM_TMP",
    "CgToken",
    "Chain",
    "Channel",
    "Client",
    "ClientAppend",
    "ClientReply",
    "GroupSim",
    "Node",
    "SimMember",
    "SimResult",
    "SimulationFailure",
    "sim_config_for",
]


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


class GroupSim(
    MembershipChanges,
    LostMembers,
    MemberLifecycle,
    SimDisk,
    LocalTransport,
    MemberDelivery,
    CheckerDelivery,
    DispatcherDelivery,
    FastPathDelivery,
    HelperFaults,
    MachineDelivery,
    KvHistory,
    Clients,
    Invariants,
    SimDriver,
):
    """N members, clients, a simulated network and the safety checks of the module doc.

    The members' actors and the transport between them are the mixins: their processes
    and stores (:mod:`.member_lifecycle`), the node-local calls (:mod:`.node_transport`),
    the member, checker and dispatcher shells (:mod:`.member_delivery`, :mod:`.checker_delivery`,
    :mod:`.dispatcher_delivery`), the compiled path (:mod:`.fastpath_delivery`), the clients
    (:mod:`.clients`) and the checks (:mod:`.invariants`); this class seeds and drives them.
    """

    KIND = "group-sim"

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
        client_timeout_ms: int = 3000,
        max_bodies: int = 4,
        slow_followers: bool = True,
        tick_ms: int = 10,
        rpc_timeout_ms: int = 1000,
        fast_path: bool | None = None,
        fast_path_switches: bool | None = None,
        dispatcher_cache_bytes: int | None = None,
        power_loss: float | None = None,
        sync_flush: bool = False,
        hangs: bool = True,
        dispatcher_faults: bool = True,
        readers: int = 2,
        reader_timeout_ms: int = 1500,
        readers_stay: bool = False,
        follower_reads: float = 0.25,
        transfers: bool = True,
        late_take_orders: float = 0.3,
        lease_partitions: float = 0.0,
        wake_on_election: bool = False,
        machine: str | None = None,
        spares: int = 0,
        membership: bool = False,
        idempotent: bool = False,
        group: str = "g",
        label: str = "",
        test_name: str = "",
        max_rounds: int = MAX_ROUNDS,
        late_start_reports: tuple[int, int] | None = None,
        helper_delays: bool = False,
        slow_hops: bool = False,
        file_reads: bool = False,
        lost_members: bool = False,
        kv_getters: int = 0,
        client_deadline_ms: int | None = None,
        stamp_skew_ms: int = 0,
        cut_removals: bool = False,
        snapshot_keep: int = 2,
        segment_bytes: int | None = None,
        sessions_damage: float = 0.0,
        snapshot_cuts: bool = False,
        test_file: str = "tests/simulation/test_group_sim.py",
        clock: FakeClock | None = None,
        make_network: Callable[..., SimNetwork] | None = None,
        injector: FaultInjector | None = None,
    ) -> None:
        """``fast_path``: members start with the compiled path on (None: seeded when there are
        faults, else off); ``fast_path_switches``: seeded faults switch it on and off and stall its
        channels (None: when there are faults); ``power_loss``: the share of crashes that are power
        losses (None: half for FileStore members); ``sync_flush``: the stores'
        ``StoreConfig.sync_flush``.  Operator transfers (``transfers``): ``late_take_orders`` of
        their take orders are held up past the transfer's time-out, and ``lease_partitions`` of
        those part the old leader from the group as they land (:meth:`_take_order_lands`).
        ``wake_on_election``: an election event that brings a member's next deadline forward wakes
        its maintainer (``MemberDelivery._rearm``; off by default so that the seeds of the other
        tests run as they did).  ``max_rounds``: the rounds a leader lets wait for their quorum at
        once (``LedgerConfig.max_rounds``). A writer gives an append up after ``client_timeout_ms``
        and asks a random member; a reader gives a read up after ``reader_timeout_ms`` and asks a
        random member, or with ``readers_stay`` the same one again.  :data:`~.sim_config.LEASE_MIX`
        sets them all.  ``machine``: every member runs a state machine ("kv" or "mq", see
        :mod:`.machine_delivery`) and clients append its commands.  ``late_start_reports``: a
        helper's "I started" (``helper_started``) reaches its member after a seeded delay in this
        range, as on Ray, where it is unordered with the member's own calls to the helper (None: at
        once, so that the seeds of the other tests run as they did).

        The all-features mode (:data:`~.sim_config.ALL_FEATURES`) adds, each off by default:
        ``helper_delays``: a dispatcher added by a configuration boots for 0.5-3 s (its set-up
        tried again, each time under the role lock) and a leader's ``CheckerConfigure`` waits
        up to 1.5 s (the role lock held meanwhile);
        ``slow_hops``: now and then a node-local call takes 5-80 ms more; ``lost_members``:
        now and then a member's node is lost for good and the leader replaces it
        (:mod:`.lost_members`); ``kv_getters``: KV gets at every consistency on any member, and
        the clients' KV history checked for linearizability (:mod:`.kv_history`);
        ``client_deadline_ms``: an idempotent client's deadline for an append (for
        :mod:`.clients`).  ``stamp_skew_ms``: each member's wall clock, which stamps its
        clients' entries, is off the simulation's (the clients') by a seeded amount within
        this much either way.  ``cut_removals``: now and then the leader is cut off from a
        voter and the operator removes it (down to a single voter).  ``snapshot_keep``: the
        snapshots each machine keeps (one: its log compacted right up to its newest).
        ``segment_bytes``: the file stores' data segment size (a few entries each: a
        compaction then leaves a log beginning right after its snapshot point).
        ``sessions_damage``: the share of a restart's damaged snapshots damaged in the client
        sessions kept with them.  ``snapshot_cuts``: now and then a leader snapshotting at its
        committed index is cut off from its voters right then, and compacts its log there
        (:data:`~.sim_config.SNAPSHOT_CUTS_SHARE`).
        ``file_reads``: a dispatcher reads a batch of committed entries from its leader's
        files before asking the member, as on Ray (off by default so that the seeds of the
        other tests run as they did).
        ``test_file``: what the reproduce line names.

        ``clock``, ``make_network`` and ``injector`` put the group in a cluster shared with
        other groups (:mod:`.topic_sim`): its clock, its links (see
        :meth:`~.driver.SimDriver._init_network`), and the cluster's faults instead of its
        own (None: the group's own, so a lone group's seeds run as they did)."""
        self.seed = seed
        self.n = n
        self.label = label or f"group-sim n={n} {store_kind}"
        self.test_name = test_name  # for the reproduce hint in failures
        self.test_file = test_file
        self.helper_delays = helper_delays
        self.file_reads = file_reads
        self.client_deadline_ms = client_deadline_ms
        self.stamp_skew_ms = stamp_skew_ms
        self._skews: dict[str, int] = {}
        self._skew_rng = random.Random(seed * 7919 + 113)  # its own stream
        self._helper_rng = random.Random(seed * 7919 + 107)  # its own stream
        self._slow_hop_rng = random.Random(seed * 7919 + 109) if slow_hops else None
        self.rng = random.Random(seed)
        self.group = group
        self.store_kind = store_kind
        self.election = election
        self.replication = replication
        self.tick_ms = tick_ms
        self.sync_flush = sync_flush
        self.store_config = dict(SIM_STORE)
        if segment_bytes is not None:
            self.store_config["data_segment_size"] = segment_bytes
        self.max_rounds = max_rounds
        self.wake_on_election = wake_on_election
        self.late_start_reports = late_start_reports
        self._start_rng = random.Random(seed * 7919 + 31)  # its own stream, like _power_rng
        self.power_loss = (
            (0.5 if store_kind == "file" else 0.0) if power_loss is None else power_loss
        )
        # its own stream, so the other streams of a seed stay as they were
        self._power_rng = random.Random(seed * 7919 + 23)
        self.durability_void = False  # a power loss dropped an entry seen committed
        # member -> the lowest index it ever lost to a power loss (what explains a COMMIT
        # that names an entry the follower acknowledged but no longer holds)
        self.lost_from: dict[str, int] = {}
        self._next_flush_ms: dict[str, int] = {}
        self._durable_end: dict[str, int] = {}  # a crashed member's: what is on its disk
        # ``spares`` processes start outside the first configuration (of the
        # first ``n``); with ``membership`` an operator changes the configuration meanwhile
        self.ids = [f"n{i}" for i in range(n + spares)]
        self.voters0 = self.ids[:n]
        self.committed_configs: dict[int, object] = {}
        self._init_membership(seed, membership and faults is not False, cut_removals)
        self._init_lost(seed, lost_members and faults is not False)
        self._init_network(network, rpc_timeout_ms, clock=clock, make_network=make_network)
        self._tmp = (
            tempfile.mkdtemp(prefix="rayledger-sim-", dir=SIM_TMP) if store_kind == "file" else None
        )
        self._init_disks(seed, faults is not False)
        self._next_tick_ms = 0  # the clients' clock
        self.steps = 0
        self._init_history()
        self._init_local_transport(dispatcher_cache_bytes)
        self._init_machines(machine, snapshot_keep, sessions_damage, snapshot_cuts)  # own streams
        # the streams are drawn from self.rng in this order: a seed reruns the same run
        self._init_members(fast_path, fast_path_switches, faults is not False)
        self.client_timeout_ms = client_timeout_ms  # a writer then asks another member
        self.members_known: tuple[str, ...] | None = None  # whom clients ask (None: any id)
        self._init_clients(clients, client_interval_ms, max_bodies, idempotent)
        self.injector: FaultInjector | None = None
        faults = SIM_FAULTS if faults is None else faults
        if faults is not False:
            self.injector = injector or self._make_injector(faults, self._crash)
        # slow follower: deliveries to it are held back by an extra delay
        self._slow_rng = random.Random(self.rng.getrandbits(64))
        self.slow: dict[str, int] = {}
        self._next_slow_ms: int | None = 1500 if slow_followers else None
        self._held: list[tuple[int, int, str, str, object]] = []
        self._held_seq = itertools.count()
        self._client_rng = random.Random(self.rng.getrandbits(64))
        # readers: their own stream, so the other streams of a seed stay as they were
        self._read_rng = random.Random(seed * 7919 + 47)
        self.readers = [
            Reader(f"r{k}", self._read_rng.choice(self.ids), self._read_rng.randint(0, 50))
            for k in range(readers)
        ]
        self._inflight_reads: dict[int, Reader] = {}
        self.reader_timeout_ms = reader_timeout_ms  # a reader then asks another member...
        self.readers_stay = readers_stay  # ... or the same one again
        self.follower_reads = follower_reads  # reads any member may serve (its own path)
        self.read_codes: collections.Counter[ResponseCode] = collections.Counter()
        # operator transfers (some given up, some late): their own stream too
        self._transfer_rng = random.Random(seed * 7919 + 59)
        self.late_take_orders = late_take_orders
        self._next_transfer_ms: int | None = (
            int(self._transfer_rng.expovariate(1 / TRANSFER_MEAN_MS)) + 500
            if transfers and faults is not False
            else None
        )
        # the old leader cut off as a late take order lands: its own stream too
        self.lease_partitions = lease_partitions
        self._lease_rng = random.Random(seed * 7919 + 71)
        self._late_orders: set[tuple[str, str, int]] = set()  # (old leader, transferee, term)
        # transferee -> (old leader, until): part the old leader on the transferee's next request
        self._lease_cuts: dict[str, tuple[str, int]] = {}
        self._link_restores: list[tuple[int, str, str]] = []  # (when, src, dst) cut links end
        self._wander_rng = random.Random(seed * 7919 + 61)  # writers that try another member
        self._replay_rng = random.Random(seed * 7919 + 67) if faults is not False else None
        # hung checkers: their own stream, so the other streams of a seed stay as they were
        self._hang_rng = random.Random(seed * 7919 + 31)
        self._next_hang_ms: int | None = (
            int(self._hang_rng.expovariate(1 / HANG_MEAN_MS)) + 500 if hangs and faults is not False
            else None
        )  # fmt: skip
        self._init_helper_faults(seed, dispatcher_faults and faults is not False)
        self._init_kv(seed, kv_getters)

    def _init_history(self) -> None:
        """What the checks remember."""
        self.entries: dict[
            tuple[int, int], tuple[int, int]
        ] = {}  # (index, term) -> (chain, body crc)
        self.committed: dict[int, tuple[int, int, int]] = {}  # index -> (term, chain, body crc)
        self.committed_entries: dict[int, object] = {}  # index -> Entry, when machines run
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
        self.lack_checked: dict[str, tuple] = {}  # (begin, snapshots) last checked per member

    def _init_local_transport(self, dispatcher_cache_bytes: int | None) -> None:
        """The node-local transport: actor calls between a member and its helpers, the
        compiled path's channels, and the dispatchers' cache size (seeded unless given)."""
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

    def _init_members(
        self, fast_path: bool | None, fast_path_switches: bool | None, faulty: bool
    ) -> None:
        """The members, which of them start on the compiled path, and their first start."""
        self.members: dict[str, SimMember] = {}
        for mid in self.ids:
            m = SimMember(mid, MemoryTermStore())  # a file member's is replaced in _start
            if self._tmp is not None:
                m.data_dir = os.path.join(self._tmp, mid)
            self.members[mid] = m
        if fast_path is None:
            for m in self.members.values():
                m.fast_enabled = faulty and self._fp_rng.random() < 0.5
        else:
            for m in self.members.values():
                m.fast_enabled = fast_path
        if fast_path_switches is None:
            fast_path_switches = faulty
        self._next_switch_ms: int | None = (
            int(self._fp_rng.expovariate(1 / FAST_PATH_SWITCH_MEAN_MS)) + 200
            if fast_path_switches
            else None
        )
        for mid in self.ids:
            self._start(mid)

    def _init_clients(
        self,
        clients: int,
        client_interval_ms: tuple[int, int],
        max_bodies: int,
        idempotent: bool = False,
    ) -> None:
        self.clients = [
            Client(f"c{k}", self.rng.choice(self.ids), next_at=self.rng.randint(0, 50))
            for k in range(clients)
        ]
        # clients with sessions retry an unknown outcome under the same identity
        # until it is answered; the committed log must hold each of their bodies once
        self.idempotent = idempotent
        for k, c in enumerate(self.clients):
            c.session = k + 1 if idempotent else 0
        self.client_interval_ms = client_interval_ms
        self.max_bodies = max_bodies
        self.clients_on = True
        self._req_ids = itertools.count(1)
        self._inflight_clients: dict[int, Client] = {}
        self.max_acked = -1  # the highest index acknowledged to a client so far

    # ================================================================ failures

    def reproduce(self) -> str:
        return f"{self.test_file} -k {self.test_name or 'group_sim'}"

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
                f"rounds={len(node.book.rounds)} fast_enabled={m.fast_enabled}"
            )
            for d in node.dispatchers.values():
                if d.term == -1:
                    continue
                v = d.view
                line += (
                    f"\n    {d.core!r} view(end={v.ledger_end_index} committed={v.committed_index} "
                    f"batches={len(v.batches)}) reported={d.reported} fetching={d.fetching} "
                    f"reporting={d.reporting} cg_gen={d.graph_gen}"
                )
            if node.checker.term != -1:
                line += f"\n    {node.checker.core!r}"
            if node.fast is not None:
                line += f"\n    {node.fast.logic!r}"
            lines.append(line)
        lines.append(f"cut links: {sorted(self.net.cut_links())} slow={self.slow}")
        return "\n".join(lines)

    # ================================================================ delivery

    def _deliver(self, src: str, dst: str, payload: object) -> None:
        if dst == SPAWNER:
            self._spawn_reply(payload)
            return
        if isinstance(payload, KvGetReply):
            self._kv_reply(dst, payload)
            return
        if dst.startswith("c"):
            c = self._inflight_clients.get(getattr(payload, "req_id", -1))
            if c is not None and c.id == dst:
                self._client_reply(c, payload)
            return
        if dst.startswith("r"):
            r = self._inflight_reads.get(getattr(payload, "req_id", -1))
            if r is not None and r.id == dst:
                self._reader_reply(r, payload)
            return
        node = self.members[dst].node
        if node is None:
            return
        now = self.clock.now_ms
        if isinstance(payload, RpcRequest):
            if src in self._lease_cuts:
                self._part_on_request(src, dst)
            body = payload.body
            if isinstance(body, LeaderReadIndex):  # MemberActor.read_index, from a follower
                ev = mc.ReadIndex(Consistency(body.consistency), (src, payload.call_id), True)
                self._step(node, ev)
            elif isinstance(body, PushEntryRequest):
                self._step(node, mc.Push(body, (src, payload.call_id)))
            else:
                if isinstance(body, LeadershipTransferRequest):
                    self._take_order_lands(src, dst, body)
                out = node.core.step(mc.ElectionRequest(body), now)
                self.rpc.reply(dst, src, payload.call_id, out.reply)
                self._carry(node, out)
        elif isinstance(payload, RpcResponse):
            pending = self.rpc.complete(dst, payload.call_id)
            if pending is not None:
                self._on_answer(node, pending[0], pending[1], payload.body)
        elif isinstance(payload, ClientAppend):
            self._client_append(node, payload)
        elif isinstance(payload, ClientRead):
            self._read_task(node, payload)
        elif isinstance(payload, KvGet):
            self._kv_get_arrives(node, payload)
        else:
            self.fail(f"unknown payload {payload!r}")

    def _on_answer(self, node: Node, callee: str, request: object, response: object) -> None:
        """The answer to a call (None: it failed or timed out)."""
        if isinstance(request, LeaderReadIndex):
            request.slot.append(response)
        elif isinstance(request, HeartbeatRequest) and request.round_id < 0:  # a read round
            self._step(node, mc.ReadRoundAnswer(callee, request, response))
        elif isinstance(request, PushEntryRequest):
            self._d_on_response(node, callee, request, response)
        else:
            self._step(node, mc.ElectionAnswer(callee, request, response))

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

    def _transfer_step(self, now: int) -> None:
        """Seeded operator requests: the leader hands leadership to a random peer (the
        transfer may complete, be given up, or its take order arrive late)."""
        if self._next_transfer_ms is None or now < self._next_transfer_ms:
            return
        rng = self._transfer_rng
        self._next_transfer_ms = now + int(rng.expovariate(1 / TRANSFER_MEAN_MS)) + 1
        leaders = [m for m in self.ids if self.members[m].alive and self.members[m].state.is_leader]
        if not leaders:
            return
        node = self.members[rng.choice(leaders)].node
        target = rng.choice([p for p in self.ids if p != node.id])
        out = node.core.step(mc.TransferOrder(target), now)
        resp = out.reply[0]
        self.stats["transfers_asked"] += 1
        self.net.note(f"OPERATOR {node.id} transfer to {target}: {resp.code.name}")
        if rng.random() < 0.5:  # the old leader will not hear from the transferee for a while
            self.net.cut(target, node.id)
            until = now + rng.randint(800, 2500)
            self._link_restores.append((until, target, node.id))
            self.net.note(f"FAULT one-way cut {target}->{node.id} until {until}")
        self._carry(node, out)

    def _restore_links(self, now: int) -> None:
        keep = []
        for until, src, dst in self._link_restores:
            if until <= now:
                self.net.restore(src, dst)
            else:
                keep.append((until, src, dst))
        self._link_restores = keep

    def _late_copy_ms(self, req: PushEntryRequest) -> int | None:
        """A seeded share of TRUNCATE pushes gets a duplicate that arrives 0.3-1.5 s later
        (a late duplicate must never cut entries the follower matched since)."""
        if self._replay_rng is None or req.type is not PushType.TRUNCATE:
            return None
        if self._replay_rng.random() < 0.5:
            self.stats["late_truncates"] += 1
            return self._replay_rng.randint(300, 1500)
        return None

    def _late_take_order(self) -> bool:
        """Whether this take order is held up (seeded, its own stream; never on a run
        without operator transfers, so those runs stay as they were)."""
        return (
            self._next_transfer_ms is not None
            and self._transfer_rng.random() < self.late_take_orders
        )

    def _take_order_lands(self, src: str, dst: str, order: LeadershipTransferRequest) -> None:
        """A held-up take order reaches its transferee: ``lease_partitions`` of the time the
        network then parts the old leader from the group -- from the transferee at once,
        from the others as soon as a request of the transferee reaches one of them -- both
        ways, for 1.5-4 heartbeat timeouts (more than a lease).  Clients and readers still
        reach it.  The transferee may win a newer term with the others while the old leader
        hears nothing of it: what a lease read on the old leader must survive."""
        key = (src, dst, order.term)
        if key not in self._late_orders:
            return
        self._late_orders.discard(key)
        rng = self._lease_rng
        if self._next_transfer_ms is None:  # healed: no new faults
            return
        if not self.lease_partitions or rng.random() >= self.lease_partitions:
            return
        lo, hi = LEASE_PARTITION_TIMEOUTS
        timeout = self.election.heartbeat_timeout_ms
        until = self.clock.now_ms + rng.randint(int(lo * timeout), int(hi * timeout))
        self._cut_for(src, dst, until)
        self._lease_cuts[dst] = (src, until)
        self.stats["lease_partitions"] += 1
        self.net.note(f"FAULT {src} parted from {dst} until {until}, from the rest on "
                      f"{dst}'s next request (late take order)")  # fmt: skip

    def _cut_for(self, a: str, b: str, until: int) -> None:
        """Cut ``a`` <-> ``b`` now; both links come back at ``until``."""
        self.net.cut_both(a, b)
        self._link_restores += [(until, a, b), (until, b, a)]

    def _part_on_request(self, src: str, dst: str) -> None:
        """A request from a transferee whose old leader is to be parted (see
        :meth:`_take_order_lands`) reaches ``dst``: the old leader is cut off from the rest."""
        old, until = self._lease_cuts.pop(src)
        if until <= self.clock.now_ms or dst == old:
            return
        for other in self.ids:
            if other not in (old, src):
                self._cut_for(old, other, until)
        self.net.note(f"FAULT {old} parted from the group until {until}")

    def _hang_step(self, now: int) -> None:
        """Seeded hangs: a live member's checker stops answering (SIGSTOP) until the member
        kills it (its supervision) -- never on its own.  Only a member that has led has a
        checker process (``Supervisor.runs_helpers``)."""
        if self._next_hang_ms is None or now < self._next_hang_ms:
            return
        rng = self._hang_rng
        self._next_hang_ms = now + int(rng.expovariate(1 / HANG_MEAN_MS)) + 1
        alive = [m for m in self.ids if self.members[m].alive
                 and self.members[m].node.core.supervisor.has_led]  # fmt: skip
        if alive:
            self.hang_checker(rng.choice(alive))

    def _next_event_ms(self, until: int) -> int:
        t = min(until, self._next_tick_ms)
        cands = [
            self._next_hang_ms,
            self._next_dfault_ms,
            self._next_disk_ms,
            self._next_transfer_ms,
            min((u for u, _, _ in self._link_restores), default=None),
            self.net.next_delivery_ms(),
            self.rpc.next_deadline_ms(),
            self._next_local_ms(),
            self._next_chain_ms(),
            self._next_slow_ms,
            self._next_switch_ms,
            self._next_lost_ms,
            self._next_view_ms,
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
            client = (ClientAppend, ClientReply, ClientRead, ClientReadReply)
            if self.net.link_up(src, dst) or isinstance(payload, client):
                self._deliver(src, dst, payload)
        for caller, callee, request in self.rpc.expired(now):
            node = self.members[caller].node
            if node is not None:
                self._on_answer(node, callee, request, None)
        if now >= self._next_tick_ms:
            self._next_tick_ms = now + self.tick_ms
            self._clients_step(now)
            self._readers_step(now)
            if self.getters:
                self._kv_step(now)
        self._drain(now)
        if self.injector is not None:
            self.injector.step(now)
        self._slow_step(now)
        self._switch_step(now)
        self._hang_step(now)
        self._dispatcher_fault_step(now)
        self._disk_step(now)
        self._transfer_step(now)
        self._restore_links(now)
        self._flush_step(now)
        self._membership_step(now)
        self._lost_step(now)
        self._drain(now)
        if self.machine_path is not None:
            self._machines_step()
        self.check_invariants()
        if self.steps % 500 == 0 and len(self.ids) > self.n:
            self.check_configurations()

    def heal(self) -> None:
        self.clients_on = False
        self.slow.clear()
        self._next_slow_ms = None
        self._next_switch_ms = None
        self._next_hang_ms = None  # no new hangs; a hung checker stays hung until killed
        self._stop_helper_faults()
        self._next_transfer_ms = None
        self._next_change_ms = self._next_cut_removal_ms = None
        self._stop_losing()
        self._heal_disks()
        self._lease_cuts.clear()
        if self.injector is not None:
            self.injector.heal_all(NetworkConfig())
        else:
            self.net.heal()

    def run(self, chaos_ms: int = 8000, converge_within_ms: int = 20000) -> SimResult:
        """Chaos for ``chaos_ms``, then heal and require convergence within
        ``converge_within_ms``."""
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
                if self.machine_path is not None:
                    self.check_machines()
                return self._result(self.clock.now_ms - start)
            self.fail(f"no convergence within {converge_within_ms} ms after healing")
        converge_ms = self.clock.now_ms - start
        self.check_invariants()
        self.check_configurations()
        self.final_check()
        if self.machine_path is not None:
            self.check_machines()
            self.check_kv_history()
        return self._result(converge_ms)

    def clients_again(
        self, ms: int = 3000, wait_ms: int = 20_000, converge_within_ms: int = 20_000
    ) -> dict[str, int]:
        """Clients on again once the group healed and converged -- for ``ms``, and up to
        ``wait_ms`` more until each got an append acknowledged (one may first give up an
        append left from the faults) -- then every check again: returns how many appends
        each client got acknowledged meanwhile, none for a client wedged on its session (a
        hole no later append can fill)."""
        before = {c.id: c.acks for c in self.clients}
        leader = next(m.id for m in self.members.values() if m.alive and m.state.is_leader)
        for c in self.clients:  # as LedgerClient finds it
            c.believed = leader
        self.members_known = self.current_members()
        self.clients_on = True
        self.run_for(ms)
        self.run_for(wait_ms, lambda: all(c.acks > before[c.id] for c in self.clients))
        self.clients_on = False
        self.members_known = None
        if not self.run_for(converge_within_ms, self.converged):
            self.fail("no convergence after the clients' second run")
        self.check_invariants()
        self.final_check()
        if self.machine_path is not None:
            self.check_machines()
            self.check_kv_history()
        return {c.id: c.acks - before[c.id] for c in self.clients}

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
