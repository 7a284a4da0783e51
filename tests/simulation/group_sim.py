"""Deterministic simulation of whole groups: elect, append, replicate, commit, crash, recover.

Every member is built from the real cores -- :class:`~rayledger.election.Elector`
and :class:`~rayledger.election.MemberState`, the replication
:class:`~rayledger.replication.EntryDispatcher` (one per peer),
:class:`~rayledger.replication.QuorumAckChecker` and
:class:`~rayledger.replication.EntryHandler` -- over a real store (a
:class:`~rayledger.storage.MemoryStore` that survives crashes as a disk would,
or a :class:`~rayledger.storage.FileStore` in a temp dir that is closed on a
crash and reopened from its files).  The simulation plays the Ray shell: it owns
the fake clock and the seeded network of :mod:`.network`, appends the empty
entry of a new leader, feeds water marks to the checker, and answers clients.

Clients append unique bodies through whichever member they believe leads.
Safety is checked after every step:

* Log Matching: every entry ever written at (index, term), on any member, has
  the same body and chain CRC (the chain CRC covers the whole prefix);
* Leader Completeness: a new leader holds every entry committed so far;
* no two members ever commit different entries at one index, and a member's
  committed index never decreases (within one incarnation; a restart may
  recover a lower one, never a different entry);
* an append acknowledged to a client sits at the acknowledged index with the
  same body; no index is acknowledged twice.

At the end of a run the faults stop, the network heals, and every member must
converge to the same fully committed log within a bounded simulated time; then
every acknowledged append is in every member's committed log and no body is
committed twice.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rayledger.election import (
    ElectionConfig,
    Elector,
    MemberState,
    MemoryTermStore,
    RoleChange,
    Send,
    TransferOutcome,
)
from rayledger.replication import (
    EntryDispatcher,
    EntryHandler,
    PushEntryRequest,
    PushEntryResponse,
    QuorumAckChecker,
    ReplicationConfig,
    Resolved,
    check_append,
)
from rayledger.storage import (
    FileStore,
    LedgerError,
    LogStore,
    MemoryStore,
    ResponseCode,
    StoreConfig,
)

from .network import (
    FakeClock,
    FaultConfig,
    FaultInjector,
    NetworkConfig,
    RpcLayer,
    RpcRequest,
    RpcResponse,
    SimNetwork,
)


class SimulationFailure(AssertionError):
    """A safety or liveness property failed; the message carries the seed and a trace."""


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


@dataclass
class SimMember:
    """Durable parts (store, term store, data dir) and the volatile cores."""

    id: str
    term_store: MemoryTermStore
    store: LogStore | None = None
    data_dir: str | None = None
    state: MemberState | None = None
    elector: Elector | None = None
    handler: EntryHandler | None = None
    dispatchers: dict[str, EntryDispatcher] = field(default_factory=dict)
    checker: QuorumAckChecker | None = None
    leading_term: int = -1
    incarnation: int = 0
    committed_seen: int = -1  # committed entries up to here were checked
    verified_end: int = -1  # entries up to here were checked against the Log Matching map

    @property
    def alive(self) -> bool:
        return self.elector is not None


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
        group: str = "g",
        label: str = "",
        test_name: str = "",
    ) -> None:
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
        self.ids = [f"n{i}" for i in range(n)]
        self.clock = FakeClock(0)
        self.net = SimNetwork(
            self.ids, random.Random(self.rng.getrandbits(64)), network, self.clock
        )
        self.rpc = RpcLayer(self.net, rpc_timeout_ms)
        self._tmp = tempfile.mkdtemp(prefix="rayledger-sim-") if store_kind == "file" else None
        self._next_tick_ms = 0
        self._rotation = 0
        self.steps = 0

        # what the checks remember
        self.entries: dict[
            tuple[int, int], tuple[int, int]
        ] = {}  # (index, term) -> (chain, body crc)
        self.committed: dict[int, tuple[int, int, int]] = {}  # index -> (term, chain, body crc)
        self.max_committed = -1
        self.acked: dict[int, bytes] = {}  # index -> body acknowledged to a client
        self.acked_terms: dict[int, int] = {}
        self.leaders_by_term: dict[int, str] = {}
        self.unknown_outcomes = 0
        self.reply_codes: collections.Counter[ResponseCode] = collections.Counter()
        self.touched: dict[str, int] = {}  # lowest end a truncate/reset left since the last check

        self.members: dict[str, SimMember] = {}
        for mid in self.ids:
            m = SimMember(mid, MemoryTermStore())
            if self._tmp is not None:
                m.data_dir = os.path.join(self._tmp, mid)
            self.members[mid] = m
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
                s = m.store
                lines.append(f"{m.id}: DOWN term={m.term_store.term} store={s!r}")
                continue
            st = m.state
            line = (
                f"{m.id}: {st.role.value} term={st.current_term} leader={st.leader_id} "
                f"store={m.store!r} handler(matched={m.handler.matched_index}, queued={m.handler.queued})"
            )
            if m.leading_term != -1:
                line += "\n    " + "\n    ".join(repr(d) for d in m.dispatchers.values())
                line += f"\n    {m.checker!r}"
            lines.append(line)
        lines.append(f"cut links: {sorted(self.net.cut_links())} slow={self.slow}")
        return "\n".join(lines)

    # ================================================================ members

    def _open_store(self, m: SimMember) -> LogStore:
        if m.data_dir is None:
            return MemoryStore(StoreConfig(**SIM_STORE))
        store = FileStore(StoreConfig(data_dir=m.data_dir, **SIM_STORE))
        return store

    def _start(self, mid: str) -> None:
        m = self.members[mid]
        if m.store is None:
            m.store = self._open_store(m)
        self._watch_truncates(m)
        st = MemberState(self.group, mid, self.ids, m.term_store)
        st.update_ledger(m.store.ledger_end_index, m.store.ledger_end_term)
        m.state = st
        m.elector = Elector(st, self.election, random.Random(self.rng.getrandbits(64)))
        m.handler = EntryHandler(self.group, mid, st, m.store, self.replication)
        m.dispatchers = {
            p: EntryDispatcher(self.group, mid, p, self.replication) for p in self.ids if p != mid
        }
        m.checker = QuorumAckChecker(self.group, mid, list(self.ids), self.replication)
        m.leading_term = -1
        m.incarnation += 1
        # a restart may recover a lower committed index (the checkpoint lags); never other entries
        m.committed_seen = min(m.committed_seen, m.store.committed_index)
        m.verified_end = min(m.verified_end, m.store.ledger_end_index)
        self.net.set_down(mid, False)
        if m.incarnation > 1:
            self.net.note(
                f"{mid} RESTART term={st.current_term} end={m.store.ledger_end_index} "
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

    def _crash(self, mid: str) -> None:
        m = self.members[mid]
        if m.alive:
            self._check_member(m)  # what it committed this step counts
        m.elector = m.state = m.handler = m.checker = None
        m.dispatchers = {}
        m.leading_term = -1
        if m.data_dir is not None:
            # the process dies: only what the store wrote to its files survives
            m.store.close()
            m.store = None
        self.net.set_down(mid, True)
        self.rpc.forget_caller(mid)
        self.net.note(f"{mid} CRASH")

    def crash(self, mid: str) -> None:
        if self.injector is not None:
            self.injector.crashed.add(mid)
        self._crash(mid)

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

    # ================================================================ the shell's duties

    def _apply(self, mid: str, actions: list) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.rpc.call(mid, action.to, action.message)
            elif isinstance(action, RoleChange):
                self.net.note(
                    f"{mid} -> {action.role.value} term={action.term} leader={action.leader_id}"
                )
            elif isinstance(action, TransferOutcome):
                self.net.note(f"{mid} transfer to {action.transferee}: {action.code.name}")

    def _sync_leadership(self, m: SimMember) -> None:
        """What the shell does on a role change: start or stop leading."""
        st = m.state
        if st.is_leader:
            term = st.current_term
            if m.leading_term == term:
                return
            if m.leading_term != -1:
                self._resolve(m, m.checker.step_down(term))
            holder = self.leaders_by_term.setdefault(term, m.id)
            if holder != m.id:
                self.fail(f"Election Safety: {m.id} and {holder} both lead term {term}")
            self._check_leader_completeness(m)
            # the new leader's empty entry lets earlier terms' entries commit (Raft 5.4.2)
            appended = m.store.append_as_leader([b""], term)
            st.update_ledger(m.store.ledger_end_index, m.store.ledger_end_term)
            self.net.note(f"{m.id} LEADS term={term} from index {appended.first_index}")
            self._resolve(
                m,
                m.checker.become_leader(
                    term, appended.first_index, m.store.ledger_end_index, m.store.committed_index
                ),
            )
            for d in m.dispatchers.values():
                d.check_and_fresh_state(term, m.id, True)
            m.leading_term = term
        elif m.leading_term != -1:
            self._resolve(m, m.checker.step_down(st.current_term))
            for d in m.dispatchers.values():
                d.check_and_fresh_state(st.current_term, st.leader_id, False)
            self.net.note(f"{m.id} stops leading term {m.leading_term}")
            m.leading_term = -1

    def _pump(self, m: SimMember) -> None:
        """A leader's dispatchers and checker: send what is due, commit, answer clients."""
        if m.leading_term == -1 or m.state.current_term != m.leading_term or not m.state.is_leader:
            return
        now = self.clock.now_ms
        store = m.store
        checker = m.checker
        term = m.leading_term
        for peer, d in m.dispatchers.items():
            for req in d.next_requests(now, store):
                self.rpc.call(m.id, peer, req)
            checker.update_water_mark(term, peer, d.water_mark)
        checker.update_water_mark(term, m.id, store.ledger_end_index)
        committed, resolved = checker.check(now)
        if committed is not None:
            store.update_committed_index(committed)
        if resolved:
            self._resolve(m, resolved)

    def _resolve(self, m: SimMember, resolved: list[Resolved]) -> None:
        for r in resolved:
            client, req_id = r.token
            if r.code == ResponseCode.SUCCESS:
                reply = ClientReply(req_id, r.code, r.first_index, r.last_index, r.term, m.id)
            else:
                reply = ClientReply(req_id, r.code, leader_id=None)
            self._to_client(m.id, client, reply)

    def _client_append(self, m: SimMember, msg: ClientAppend) -> None:
        st = m.state
        self._sync_leadership(m)
        try:
            check_append(
                st,
                self.group,
                msg.target,
                msg.bodies,
                m.checker.pending_count,
                self.replication,
                m.elector.transferring,
            )
            appended = m.store.append_as_leader(list(msg.bodies), st.current_term)
        except LedgerError as exc:
            self._to_client(
                m.id, msg.client, ClientReply(msg.req_id, exc.code, leader_id=exc.leader_id)
            )
            return
        st.update_ledger(m.store.ledger_end_index, m.store.ledger_end_term)
        m.checker.update_water_mark(st.current_term, m.id, m.store.ledger_end_index)
        m.checker.add_pending(
            st.current_term,
            appended.first_index,
            appended.last_index,
            (msg.client, msg.req_id),
            self.clock.now_ms,
        )

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
                if index in self.acked:
                    self.fail(
                        f"index {index} acknowledged twice ({self.acked[index]!r} and {body!r})"
                    )
                self.acked[index] = body
                self.acked_terms[index] = reply.term
                got = self.committed.get(index)
                if got is None or got[0] != reply.term:
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
        m = self.members[dst]
        if not m.alive:
            return
        now = self.clock.now_ms
        if isinstance(payload, RpcRequest):
            body = payload.body
            if isinstance(body, PushEntryRequest):
                answers = m.handler.handle_push(body, (src, payload.call_id), now)
                self._answer(m, answers)
            else:
                resp, actions = m.elector.handle(body, now)
                self.rpc.reply(dst, src, payload.call_id, resp)
                self._apply(dst, actions)
        elif isinstance(payload, RpcResponse):
            pending = self.rpc.complete(dst, payload.call_id)
            if pending is not None:
                self._on_response(m, pending[0], pending[1], payload.body)
        elif isinstance(payload, ClientAppend):
            self._client_append(m, payload)
        else:
            self.fail(f"unknown payload {payload!r}")

    def _answer(self, m: SimMember, answers: list[tuple[object, PushEntryResponse]]) -> None:
        for (caller, call_id), resp in answers:
            self.rpc.reply(m.id, caller, call_id, resp)

    def _on_response(
        self, m: SimMember, callee: str, request: object, response: object | None
    ) -> None:
        now = self.clock.now_ms
        if isinstance(request, PushEntryRequest):
            d = m.dispatchers[callee]
            before = d.water_mark
            d.on_response(request, response, now)
            if d.water_mark != before and d.active:
                self._apply(m.id, m.elector.on_peer_progress(callee, d.water_mark, now))
        else:
            self._apply(m.id, m.elector.on_response(callee, request, response, now))

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
        for m in self.members.values():
            if m.alive and m.store is not None:
                self._check_member(m)

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
                elif got != (term, chain, bcrc):
                    self.fail(
                        f"{m.id} committed index {index} as term {term}, "
                        f"another member committed term {got[0]} there"
                    )
            m.committed_seen = committed
            if committed > self.max_committed:
                self.max_committed = committed

    def _check_leader_completeness(self, m: SimMember) -> None:
        c = self.max_committed
        if c < 0:
            return
        store = m.store
        if store.ledger_end_index < c:
            self.fail(
                f"Leader Completeness: new leader {m.id} ends at {store.ledger_end_index}, {c} is committed"
            )
        (h,) = self._headers(store, c, c)
        if (h[1], h[2], h[3]) != self.committed[c]:
            self.fail(
                f"Leader Completeness: new leader {m.id} holds another entry at committed index {c}"
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
        cands = [self.net.next_delivery_ms(), self.rpc.next_deadline_ms()]
        if self.injector is not None:
            cands.append(self.injector.next_fault_ms)
        if self._held:
            cands.append(self._held[0][0])
        if self._next_slow_ms is not None:
            cands.append(self._next_slow_ms)
        for cand in cands:
            if cand is not None and cand < t:
                t = cand
        return max(t, self.clock.now_ms)

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
            m = self.members[caller]
            if m.alive:
                self._on_response(m, callee, request, None)
        if now >= self._next_tick_ms:
            self._next_tick_ms = now + self.tick_ms
            ids = self.ids
            k = self._rotation = (self._rotation + 1) % len(ids)
            for mid in ids[k:] + ids[:k]:
                m = self.members[mid]
                if m.alive:
                    self._apply(mid, m.elector.tick(now))
                    self._answer(m, m.handler.tick(now))
            self._clients_step(now)
        for m in self.members.values():
            if m.alive:
                self._sync_leadership(m)
                self._pump(m)
        if self.injector is not None:
            self.injector.step(now)
        self._slow_step(now)
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
        term = leader.state.current_term
        end = leader.store.ledger_end_index
        if leader.store.committed_index != end or leader.checker.pending_count:
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
        if self.injector is not None:
            self.injector.heal_all(NetworkConfig())
        else:
            self.net.heal()

    def final_check(self) -> None:
        """Identical logs everywhere; acknowledged appends committed where acknowledged; no body twice."""
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
                self.fail(
                    f"acknowledged append {body[:24]!r} at {index} is at {bodies.get(body)} in the committed log"
                )

    def run(self, chaos_ms: int = 8000, converge_within_ms: int = 20000) -> SimResult:
        """Chaos for ``chaos_ms``, then heal and require convergence within ``converge_within_ms``."""
        self.run_until(chaos_ms)
        self.heal()
        start = self.clock.now_ms
        if not self.run_for(converge_within_ms, self.converged):
            self.fail(f"no convergence within {converge_within_ms} ms after healing")
        converge_ms = self.clock.now_ms - start
        self.check_invariants()
        self.final_check()
        return SimResult(
            seed=self.seed,
            steps=self.steps,
            sim_ms=self.clock.now_ms,
            acked_entries=len(self.acked),
            committed_entries=self.max_committed + 1,
            terms=len(self.leaders_by_term),
            converge_ms=converge_ms,
            faults=len(self.injector.log) if self.injector is not None else 0,
        )


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
