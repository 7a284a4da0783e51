"""Deterministic simulation of N election cores over :mod:`.network`.

The simulation owns everything the Ray shell will own -- the clock, the
transport, the term stores -- and checks the protocol's safety properties after
every step:

* Election Safety: at most one member is ever leader of a given term;
* terms never decrease, in memory or in the persisted store, across restarts;
* a persisted vote is never contradicted (no member votes for two candidates in
  one term, even after a crash);
* a transfer is over (completed or abandoned) by its deadline.

Liveness (a leader within a bound, steps-down, pre-vote, preferred leader) is
checked by the scenarios in ``test_election_sim.py`` with the helpers here.

Replication is modelled only as far as elections care: a leader "appends" a
few entries now and then (unless it is transferring), and periodically pushes
its ledger end (index, term) to followers of its term, who adopt it and report
their match index back (``on_peer_progress``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from rayledger.election import (
    ElectionConfig,
    Elector,
    MemberState,
    MemoryTermStore,
    Role,
    RoleChange,
    Send,
    TransferOutcome,
)
from rayledger.election.messages import (
    ElectionAnswer,
    ElectionRequest,
    PeerProgress,
    Tick,
    TransferOrder,
)

from .driver import SimDriver
from .network import (
    FaultConfig,
    FaultInjector,
    NetworkConfig,
    RpcRequest,
    RpcResponse,
    SimulationFailure,
)

__all__ = [
    "ElectionSim",
    "RecordingTermStore",
    "SimMember",
    "SimulationFailure",
    "SyncAck",
    "SyncLog",
]


def _set_log_end(state: MemberState, ledger: tuple[int, int]) -> None:
    """The member's log end as (index, term): this simulation keeps no store."""
    state.attach_log(SimpleNamespace(ledger_end_index=ledger[0], ledger_end_term=ledger[1]))


@dataclass(frozen=True)
class SyncLog:
    """Model of replication: leader ``leader_id`` of ``term`` says its log ends here."""

    term: int
    leader_id: str
    end_index: int
    end_term: int


@dataclass(frozen=True)
class SyncAck:
    term: int
    end_index: int


class RecordingTermStore(MemoryTermStore):
    """A memory term store that survives crashes and checks every save."""

    def __init__(self, member: str, on_save: Callable[[str, int, str | None], None]) -> None:
        super().__init__()
        self.member = member
        self._on_save = on_save

    def save(self, term: int, vote_for: str | None) -> None:
        self._on_save(self.member, term, vote_for)
        super().save(term, vote_for)


class SimMember:
    """One member: durable parts (store, ledger) and the volatile elector."""

    def __init__(self, member_id: str, store: RecordingTermStore) -> None:
        self.id = member_id
        self.store = store
        self.ledger: tuple[int, int] = (-1, -1)
        self.elector: Elector | None = None
        self.incarnation = 0

    @property
    def alive(self) -> bool:
        return self.elector is not None


class ElectionSim(SimDriver):
    """N election cores, a simulated network, a fake clock and the safety checks."""

    KIND = "election-sim"
    TRACE_LINES = 120

    def __init__(
        self,
        n: int = 3,
        seed: int = 0,
        *,
        config: ElectionConfig | None = None,
        network: NetworkConfig | None = None,
        faults: FaultConfig | None = None,
        tick_ms: int = 10,
        rpc_timeout_ms: int = 1000,
        down_fail_ms: int | None = 5,
        append_every_ms: int | None = 500,
        sync_every_ms: int = 100,
        group: str = "g",
        label: str = "",
    ) -> None:
        self.seed = seed
        self.n = n
        self.label = label
        self.rng = random.Random(seed)
        self.config = config or ElectionConfig()
        self.tick_ms = tick_ms
        self.group = group
        self.ids = [f"n{i}" for i in range(n)]
        self._init_network(network, rpc_timeout_ms, down_fail_ms)
        self.append_every_ms = append_every_ms
        self.sync_every_ms = sync_every_ms
        self._next_append_ms = append_every_ms or 0
        self._next_sync_ms = sync_every_ms
        self._next_tick_ms = 0
        self._tick_rotation = 0

        # What the checks remember.
        self.leaders_by_term: dict[int, str] = {}
        self.votes: dict[tuple[str, int], str] = {}
        self.saved_term: dict[str, int] = {}
        self.max_term: dict[str, int] = {}
        self.role_changes: list[tuple[int, str, RoleChange]] = []
        self.transfer_outcomes: list[tuple[int, str, TransferOutcome]] = []
        self.steps = 0

        self.members: dict[str, SimMember] = {}
        for mid in self.ids:
            self.members[mid] = SimMember(mid, RecordingTermStore(mid, self._check_save))
            self._start(mid)
        self.injector: FaultInjector | None = None
        if faults is not None:
            self.injector = self._make_injector(faults, self._crash)

    # ============================================================= failures

    def reproduce(self) -> str:
        return "tests/simulation/test_election_sim.py"

    def describe(self) -> str:
        lines = []
        for m in self.members.values():
            if m.elector is None:
                lines.append(f"{m.id}: DOWN store=(term={m.store.term}, vote={m.store.vote_for})")
            else:
                s = m.elector.snapshot()
                lines.append(
                    f"{m.id}: {s['role']} term={s['term']} vote={s['vote_for']} "
                    f"leader={s['leader_id']} ledger=({s['ledger_end_index']},{s['ledger_end_term']}) "
                    f"transferee={s['transferee']} parse={s['last_parse_result']}"
                )
        lines.append(f"cut links: {sorted(self.net.cut_links())}")
        return "\n".join(lines)

    # ========================================================== invariants

    def _check_save(self, member: str, term: int, vote: str | None) -> None:
        last = self.saved_term.get(member, 0)
        if term < last:
            self.fail(f"{member} persisted term {term} after term {last} (term decreased)")
        self.saved_term[member] = term
        prior = self.votes.get((member, term))
        if prior is not None and vote != prior:
            self.fail(f"{member} persisted vote {vote!r} in term {term} after voting {prior!r}")
        if vote is not None:
            if vote not in self.members:
                self.fail(f"{member} voted for non-member {vote!r}")
            self.votes[(member, term)] = vote

    def _record_leader(self, member: str, term: int) -> None:
        holder = self.leaders_by_term.setdefault(term, member)
        if holder != member:
            self.fail(f"Election Safety: {member} and {holder} both lead term {term}")

    def check_invariants(self) -> None:
        """Per-step safety scan (saves and role changes are also checked as they happen)."""
        now = self.clock.now_ms
        max_term = self.max_term
        for m in self.members.values():
            el = m.elector
            if el is None:
                continue
            st = el.state
            term = st.current_term
            if term != max_term.get(m.id, -1):
                if term < max_term.get(m.id, 0):
                    self.fail(f"{m.id} term went back to {term} from {max_term[m.id]}")
                max_term[m.id] = term
            if term != m.store.term:
                self.fail(f"{m.id} uses term {term} but persisted {m.store.term}")
            if st.role is Role.LEADER:
                self._record_leader(m.id, term)
                if st.transferee is not None:
                    deadline = el.snapshot()["transfer_deadline_ms"]
                    if deadline is None or now > deadline + self.tick_ms:
                        self.fail(f"{m.id} still transferring at {now}, deadline {deadline}")
            elif st.transferee is not None:
                self.fail(f"{m.id} is {st.role.value} with transferee {st.transferee}")

    # ============================================================ members

    def _start(self, mid: str) -> None:
        m = self.members[mid]
        state = MemberState(self.group, mid, self.ids, m.store)
        _set_log_end(state, m.ledger)
        m.incarnation += 1
        m.elector = Elector(state, self.config, random.Random(self.rng.getrandbits(64)))
        self.net.set_down(mid, False)
        if m.incarnation > 1:
            self.net.note(f"{mid} RESTART term={state.current_term} vote={state.vote_for}")

    def _crash(self, mid: str) -> None:
        m = self.members[mid]
        m.elector = None
        self.net.set_down(mid, True)
        self.rpc.forget_caller(mid)
        self.net.note(f"{mid} CRASH")

    def crash(self, mid: str) -> None:
        if self.injector is not None:
            self.injector.crashed.add(mid)
        self._crash(mid)

    def elector(self, mid: str) -> Elector:
        el = self.members[mid].elector
        assert el is not None, f"{mid} is down"
        return el

    # ============================================================ actions

    def _apply(self, mid: str, actions: list) -> None:
        now = self.clock.now_ms
        for action in actions:
            if isinstance(action, Send):
                self.rpc.call(mid, action.to, action.message)
            elif isinstance(action, RoleChange):
                self.role_changes.append((now, mid, action))
                self.net.note(
                    f"{mid} -> {action.role.value} term={action.term} leader={action.leader_id}"
                )
                if action.role is Role.LEADER:
                    self._record_leader(mid, action.term)
            elif isinstance(action, TransferOutcome):
                self.transfer_outcomes.append((now, mid, action))
                self.net.note(f"{mid} transfer to {action.transferee} ended: {action.code.name}")
            else:
                self.fail(f"{mid} returned unknown action {action!r}")

    def request_transfer(self, transferee: str) -> object | None:
        """Ask the current leader (if any) to hand over to ``transferee``."""
        leaders = self.leaders()
        if not leaders:
            return None
        leader = max(leaders, key=lambda mid: self.elector(mid).term)
        resp, actions = self.elector(leader).step(TransferOrder(transferee), self.clock.now_ms)
        self.net.note(f"{leader} asked to transfer to {transferee}: {resp.code.name}")
        self._apply(leader, actions)
        return resp

    # ========================================================== the loop

    def _deliver(self, src: str, dst: str, payload: object) -> None:
        now = self.clock.now_ms
        m = self.members[dst]
        el = m.elector
        if el is None:
            return
        if isinstance(payload, RpcRequest):
            resp, actions = el.step(ElectionRequest(payload.body), now)
            self.rpc.reply(dst, src, payload.call_id, resp)
            self._apply(dst, actions)
        elif isinstance(payload, RpcResponse):
            pending = self.rpc.complete(dst, payload.call_id)
            if pending is not None:
                callee, request = pending
                self._apply(
                    dst, el.step(ElectionAnswer(callee, request, payload.body), now).actions
                )
        elif isinstance(payload, SyncLog):
            st = el.state
            if (
                st.role is Role.FOLLOWER
                and st.leader_id == payload.leader_id
                and st.current_term == payload.term
            ):
                m.ledger = (payload.end_index, payload.end_term)
                _set_log_end(st, m.ledger)
                self.net.send(dst, src, SyncAck(payload.term, payload.end_index))
        elif isinstance(payload, SyncAck):
            if el.role is Role.LEADER and el.term == payload.term:
                self._apply(
                    dst, el.step(PeerProgress(src, payload.term, payload.end_index), now).actions
                )
        else:
            self.fail(f"unknown payload {payload!r}")

    def _append_and_sync(self, now: int) -> None:
        if self.append_every_ms and now >= self._next_append_ms:
            self._next_append_ms = now + self.rng.randint(
                self.append_every_ms // 2, self.append_every_ms * 3 // 2
            )
            for m in self.members.values():
                el = m.elector
                if el is None or el.role is not Role.LEADER:
                    continue
                if el.transferring:  # appends are refused while leadership moves
                    continue
                m.ledger = (m.ledger[0] + self.rng.randint(1, 30), el.term)
                _set_log_end(el.state, m.ledger)
        if now >= self._next_sync_ms:
            self._next_sync_ms = now + self.sync_every_ms
            for m in self.members.values():
                el = m.elector
                if el is None or el.role is not Role.LEADER:
                    continue
                msg = SyncLog(el.term, m.id, m.ledger[0], m.ledger[1])
                for peer in self.ids:
                    if peer != m.id:
                        self.net.send(m.id, peer, msg)

    def _next_event_ms(self, until: int) -> int:
        t = min(until, self._next_tick_ms)
        for cand in (
            self.net.next_delivery_ms(),
            self.rpc.next_deadline_ms(),
            self.injector.next_fault_ms if self.injector is not None else None,
            self._next_sync_ms,
            self._next_append_ms if self.append_every_ms else None,
        ):
            if cand is not None and cand < t:
                t = cand
        return max(t, self.clock.now_ms)

    def step(self, until: int) -> None:
        """Advance to the next event (at most ``until``) and process everything due."""
        now = self._next_event_ms(until)
        self.clock.advance_to(now)
        self.steps += 1
        for d in self.net.deliver_due(now):
            self._deliver(d.src, d.dst, d.payload)
        for caller, callee, request in self.rpc.expired(now):
            el = self.members[caller].elector
            if el is not None:
                self._apply(caller, el.step(ElectionAnswer(callee, request, None), now).actions)
        if now >= self._next_tick_ms:
            # Every member runs its maintainState step; the order rotates.
            self._next_tick_ms = now + self.tick_ms
            ids = self.ids
            k = self._tick_rotation = (self._tick_rotation + 1) % len(ids)
            for mid in ids[k:] + ids[:k]:
                el = self.members[mid].elector
                if el is not None:
                    self._apply(mid, el.step(Tick(), now).actions)
        self._append_and_sync(now)
        if self.injector is not None:
            self.injector.step(now)
        self.check_invariants()

    # ========================================================= observations

    def alive_ids(self) -> list[str]:
        return [mid for mid, m in self.members.items() if m.alive]

    def leaders(self) -> list[str]:
        return [
            mid
            for mid, m in self.members.items()
            if m.elector is not None and m.elector.role is Role.LEADER
        ]

    def followers_of(self, leader: str) -> list[str]:
        term = self.elector(leader).term
        return [
            mid
            for mid, m in self.members.items()
            if m.elector is not None
            and m.elector.role is Role.FOLLOWER
            and m.elector.leader_id == leader
            and m.elector.term == term
        ]

    def stable_leader(self, members: list[str] | None = None) -> str | None:
        """The leader every given (default: every alive) member follows, if there is one."""
        members = members if members is not None else self.alive_ids()
        leaders = [mid for mid in self.leaders() if mid in members]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        following = set(self.followers_of(leader)) | {leader}
        return leader if set(members) <= following else None

    def quorum_leader(self) -> str | None:
        """A leader followed by a majority of the group in its term."""
        for leader in self.leaders():
            if len(self.followers_of(leader)) + 1 > self.n // 2:
                return leader
        return None

    def terms(self) -> dict[str, int]:
        return {mid: m.elector.term for mid, m in self.members.items() if m.elector is not None}

    def wait_for(self, what: str, pred: Callable[[], bool], within_ms: int) -> None:
        if not self.run_for(within_ms, pred):
            self.fail(f"{what} did not happen within {within_ms} ms")
