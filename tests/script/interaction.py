"""Script-style protocol tests, in the manner of etcd's rafttest ``InteractionEnv``.

The members are the real cores -- :class:`MemberLogic` (store, MemberState, elector and
entry handler), one :class:`DispatcherLogic` per follower and a :class:`CheckerLogic` --
wired without Ray.  Nothing moves on its own: a script advances the clock, delivers the
messages in flight and cuts links, and every step prints what happened.  A test is a
text file of commands, each followed by the exact output expected; ``pytest --rewrite``
writes the output the code gives instead (then read the diff).

Commands (one per block; ``#`` lines are comments)::

    add-nodes N [pre-vote=false] [preferred=ID]
                                     members n0..nN-1, empty memory stores
    tick MS [NODE ...]               advance the clock MS ms in 10 ms steps, ticking NODEs
                                     (all live members by default); prints what they sent
    run MS [pushes]                  let MS ms pass, every message delivered at once;
                                     prints only events (roles, terms, appends, transfers)
                                     and with ``pushes`` the replication messages sent
    campaign NODE                    tick only NODE once: a candidate asks for votes
    elect NODE                       campaign, stabilize, one heartbeat round, stabilize
                                     (prints only events)
    deliver [NODE ...]               deliver the messages now in flight (to NODEs only),
                                     printing each and what it caused
    stabilize                        deliver until nothing is in flight
    propose NODE BODY ...            a client appends BODYs on NODE (it must lead)
    propose-n NODE N                 a client appends N generated bodies on NODE
    transfer NODE TARGET             ask the leader NODE to hand leadership to TARGET
    partition A,B C,...              only members of the same side reach each other
    heal                             every link works again
    crash NODE / restart NODE        stop a member (its store and term survive) / start it
    status                           role, term, leader, end and committed index of each
    log NODE                         NODE's entries: index, term, body

Messages to a crashed member or across a cut link are dropped when delivered; the sender
gets no answer (``None``), as an actor call that times out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from rayledger.actors.logic import (
    CachedBatch,
    CheckerLogic,
    DispatcherLogic,
    MemberLogic,
    StartLeading,
)
from rayledger.election import ElectionConfig
from rayledger.election.member_state import MemoryTermStore
from rayledger.election.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    RoleChange,
    Send,
    TransferOutcome,
    VoteRequest,
    VoteResponse,
)
from rayledger.replication import ReplicationConfig
from rayledger.replication.messages import PushEntryRequest, PushEntryResponse, PushType
from rayledger.storage import LedgerError, MemoryStore, StoreConfig

GROUP = "g"
STEP_MS = 10
TIMERS = dict(
    heartbeat_interval_ms=100,
    max_heartbeat_leak=3,
    min_vote_interval_ms=300,
    max_vote_interval_ms=600,
    vote_wait_base_ms=200,
    leadership_transfer_wait_timeout_ms=1000,
)


@dataclass
class Msg:
    src: str
    dst: str
    payload: Any
    request: Any = None  # for an answer: the request it answers


@dataclass
class Node:
    id: str
    logic: MemberLogic
    dispatchers: dict[str, DispatcherLogic]
    checker: CheckerLogic
    rounds: dict[int, tuple[int, int]] = field(default_factory=dict)  # token -> span


def describe(p: Any) -> str:
    """One message on one line: what a reader of the protocol needs, nothing else."""
    if isinstance(p, VoteRequest):
        kind = "PreVote" if p.pre_vote else "Vote"
        take = " take-leadership" if p.take_leadership else ""
        return f"{kind} term={p.term} last=({p.ledger_end_index},{p.ledger_end_term}){take}"
    if isinstance(p, VoteResponse):
        return f"VoteResponse {p.result.value} term={p.term}"
    if isinstance(p, HeartbeatRequest):
        return f"Heartbeat term={p.term}"
    if isinstance(p, HeartbeatResponse):
        return f"HeartbeatResponse {p.code.name} term={p.term}"
    if isinstance(p, LeadershipTransferRequest):
        return f"Transfer term={p.term} to={p.transferee_id} at={p.take_leadership_ledger_index}"
    if isinstance(p, LeadershipTransferResponse):
        return f"TransferResponse {p.code.name} term={p.term}"
    if isinstance(p, PushEntryRequest):
        what = p.type.value
        if p.type is PushType.APPEND:
            what += f"[{p.first_index}..{p.last_index}]"
        elif p.type in (PushType.COMPARE, PushType.TRUNCATE):
            what += f"@{p.first_index}(term {p.entry_term})" + (" reset" if p.reset else "")
        return f"{what} term={p.term} commit={p.commit_index}"
    if isinstance(p, PushEntryResponse):
        hint = f" hint=({p.conflict_index},{p.conflict_term})" if p.conflict_term >= 0 else ""
        return f"PushResponse {p.code.name} term={p.term} index={p.index} end={p.end_index}{hint}"
    return repr(p)


class Env:
    """The members, the clock and the messages in flight of one script."""

    def __init__(self) -> None:
        self.now = 1_000
        self.nodes: dict[str, Node] = {}
        self.down: set[str] = set()
        self.sides: list[set[str]] | None = None
        self.flight: list[Msg] = []
        self.out: list[str] = []
        self.disks: dict[str, tuple[MemoryStore, MemoryTermStore]] = {}
        self.ids: list[str] = []
        self.election = ElectionConfig(**TIMERS)
        self.replication = ReplicationConfig()
        self.tokens = 0
        self.quiet = False
        self.show_pushes = False

    # -- running a script ----------------------------------------------------------------
    def run(self, line: str) -> str:
        self.out = []
        cmd, *args = line.split()
        getattr(self, "cmd_" + cmd.replace("-", "_"))(*args)
        return "\n".join(self.out) if self.out else "ok"

    def say(self, text: str, indent: int = 0, event: bool = False) -> None:
        """A line of the trace; while ``run`` lets time pass, only events (role changes,
        terms taken, appends ended, transfers) are printed, with their time."""
        if self.quiet:
            if event:
                self.out.append(f"t={self.now} {text}")
        else:
            self.out.append("  " * indent + text)

    # -- members -------------------------------------------------------------------------
    def cmd_add_nodes(self, n: str, *opts: str) -> None:
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "pre-vote":
                self.election = replace(self.election, enable_pre_vote=value != "false")
            elif key == "preferred":
                self.election = replace(self.election, preferred_leader_ids=value)
        self.ids = [f"n{i}" for i in range(int(n))]
        for mid in self.ids:
            self.disks[mid] = (MemoryStore(StoreConfig()), MemoryTermStore())
            self._start(mid)

    def _start(self, mid: str) -> None:
        store, terms = self.disks[mid]
        rng = random.Random(int(mid[1:]))  # each member's timers, the same every run
        logic = MemberLogic(
            GROUP, mid, self.ids, store, self.election, self.replication, terms, rng=rng
        )
        peers = [p for p in self.ids if p != mid]
        dispatchers = {p: DispatcherLogic(GROUP, mid, p, self.replication) for p in peers}
        checker = CheckerLogic(GROUP, mid, self.ids, self.replication)
        self.nodes[mid] = Node(mid, logic, dispatchers, checker)

    def cmd_crash(self, mid: str) -> None:
        self.down.add(mid)
        del self.nodes[mid]

    def cmd_restart(self, mid: str) -> None:
        self.down.discard(mid)
        self._start(mid)
        st = self.nodes[mid].logic.state
        self.say(f"{mid} restarted: term={st.current_term} vote={st.vote_for}")

    # -- time ----------------------------------------------------------------------------
    def cmd_tick(self, ms: str, *only: str) -> None:
        for _ in range(max(1, int(ms) // STEP_MS)):
            self.now += STEP_MS
            for mid in only or list(self.nodes):
                if mid in self.nodes:
                    self._tick(self.nodes[mid])

    def cmd_run(self, ms: str, show: str = "") -> None:
        """Let ``ms`` pass with every message delivered at once, printing only events (and
        with ``pushes`` the replication messages too)."""
        self.quiet, self.show_pushes = True, show == "pushes"
        try:
            for _ in range(max(1, int(ms) // STEP_MS)):
                self.cmd_tick(str(STEP_MS))
                for _ in range(50):
                    if not self.flight:
                        break
                    self.cmd_deliver()
        finally:
            self.quiet = self.show_pushes = False

    def cmd_elect(self, mid: str) -> None:
        """``campaign``, ``stabilize``, one heartbeat round of the winner, ``stabilize``:
        printing only events (the short way to a settled group with a chosen leader)."""
        self.quiet = True
        try:
            self.cmd_campaign(mid)
            self.cmd_stabilize()
            self.cmd_tick(str(self.election.heartbeat_interval_ms), mid)
            self.cmd_stabilize()
        finally:
            self.quiet = False

    def cmd_campaign(self, mid: str) -> None:
        self.cmd_tick(str(STEP_MS), mid)

    def _tick(self, node: Node) -> None:
        election, answers = node.logic.tick(self.now)
        self._answer(node, answers)
        self._act(node, election, f"t={self.now}")
        if node.logic.leads(node.logic.state.current_term):
            for peer in node.dispatchers:
                self._pump(node, peer)
            self._check(node)

    # -- the network ---------------------------------------------------------------------
    def _reaches(self, a: str, b: str) -> bool:
        if a in self.down or b in self.down:
            return False
        return self.sides is None or any(a in s and b in s for s in self.sides)

    def cmd_partition(self, *sides: str) -> None:
        self.sides = [set(s.split(",")) for s in sides]

    def cmd_heal(self) -> None:
        self.sides = None

    def _send(self, msg: Msg, indent: int = 1) -> None:
        self.flight.append(msg)
        push = isinstance(msg.payload, (PushEntryRequest, PushEntryResponse))
        self.say(f"{msg.src}->{msg.dst} {describe(msg.payload)}", indent, self.show_pushes and push)

    def cmd_deliver(self, *only: str) -> None:
        batch = [m for m in self.flight if not only or m.dst in only]
        self.flight = [m for m in self.flight if m not in batch]
        for m in batch:
            self._deliver(m)

    def cmd_stabilize(self) -> None:
        for _ in range(100):
            if not self.flight:
                return
            self.cmd_deliver()
        raise AssertionError("messages still in flight after 100 rounds")

    def _deliver(self, m: Msg) -> None:
        if not self._reaches(m.src, m.dst):
            self.say(f"{m.src}->{m.dst} {describe(m.payload)} DROPPED")
            caller, callee, req = (m.src, m.dst, m.payload) if m.request is None else (
                m.dst, m.src, m.request)  # fmt: skip
            if caller in self.nodes:  # the caller's call times out: no answer
                self._answered(self.nodes[caller], callee, req, None, 1)
            return
        self.say(f"{m.src}->{m.dst} {describe(m.payload)}")
        node = self.nodes[m.dst]
        if m.request is not None:
            self._answered(node, m.src, m.request, m.payload, 1)
        elif isinstance(m.payload, PushEntryRequest):
            self._answer(node, node.logic.on_push(m.payload, (m.src, m.payload), self.now))
        else:
            resp, actions = node.logic.handle_election(m.payload, self.now)
            self._act(node, actions)
            self._send(Msg(m.dst, m.src, resp, m.payload))

    def _answer(self, node: Node, answers: list) -> None:
        """A follower's push answers go back to the dispatchers that asked."""
        for (leader, req), resp in answers:
            self._send(Msg(node.id, leader, resp, req))

    def _answered(self, node: Node, peer: str, req: Any, resp: Any, indent: int) -> None:
        if isinstance(req, PushEntryRequest):
            d = node.dispatchers.get(peer)
            if d is None:
                return
            d.on_response(req, resp, self.now)
            self._pump(node, peer)
        else:
            self._act(node, node.logic.on_election_response(peer, req, resp, self.now))

    # -- a member's actions ----------------------------------------------------------------
    def _act(self, node: Node, actions: list, when: str | None = None) -> None:
        if when is not None and actions and not self.quiet:
            self.say(f"{when} {node.id}:")
        for a in actions:
            if isinstance(a, Send):
                self._send(Msg(node.id, a.to, a.message))
            elif isinstance(a, RoleChange):
                leader = f" leader={a.leader_id}" if a.leader_id else ""
                self.say(f"{node.id} is {a.role.value} term={a.term}{leader}", 1, event=True)
            elif isinstance(a, TransferOutcome):
                text = f"{node.id} transfer of term {a.term} to {a.transferee}: {a.code.name}"
                self.say(text, 1, event=True)
        if any(isinstance(a, RoleChange) for a in actions):
            self._sync_role(node)

    def _sync_role(self, node: Node) -> None:
        """What the member actor does on a role change: start or stop its helpers."""
        for change in node.logic.leadership():
            if isinstance(change, StartLeading):
                node.checker.become_leader(change.term, change.term_start_index, change.info)
                for d in node.dispatchers.values():
                    d.activate(change.info)
                node.logic.mark_ready(change.term)
                text = f"{node.id} leads term {change.term} from index {change.term_start_index}"
                self.say(text, 1, event=True)
                for peer in node.dispatchers:
                    self._pump(node, peer)
            else:
                self._finished(node, node.checker.step_down(change.new_term))
                for d in node.dispatchers.values():
                    d.deactivate(change.term)

    def _pump(self, node: Node, peer: str) -> None:
        """The dispatcher sends what is due; what it lacks it reads from its member (fenced by
        term, as ``read_for_push`` / ``entry_meta`` on the actor)."""
        d = node.dispatchers[peer]
        for _ in range(10):
            r = d.ready(self.now)
            for req in r.pushes:
                batch = req.batch
                if isinstance(batch, CachedBatch):
                    req = replace(req, batch=batch.payload)
                self._send(Msg(node.id, peer, req))
            if r.report is not None:  # the checker answers at once
                term, wm = r.report
                served = node.checker.report(term, peer, wm)
                self._check(node)
                committed = node.checker.committed_index if served else None
                d.reported_to_checker(term, wm, committed, self.now)
            if r.progress is not None:  # the member's elector hears how far the peer is
                self._act(node, node.logic.on_peer_progress(peer, *r.progress, self.now))
            f = r.fetch
            if f is None:
                if r.report is None:
                    return
                continue
            if f.kind == "batch":
                answer = node.logic.read_for_push(f.term, f.index, f.max_bytes, f.max_count)
                if answer is not None:
                    batch, info = answer
                    answer = (
                        CachedBatch(batch.first_index, batch.count, batch, len(batch.data)),
                        info,
                    )
                d.took_batch(f.term, answer)
            else:
                d.took_meta(f.term, f.index, node.logic.entry_meta(f.term, f.index))

    def _check(self, node: Node) -> None:
        res = node.checker.ready(self.now).resolution
        if res is None:
            return
        if res.committed is not None:
            node.logic.on_committed(res.term, res.committed)
            for peer, d in node.dispatchers.items():
                if d.on_committed(res.term, res.committed):
                    self._pump(node, peer)
        self._finished(node, res.outcomes)

    def _finished(self, node: Node, outcomes: list) -> None:
        for token, code in outcomes:
            first, last = node.rounds.pop(token, (-1, -1))
            self.say(f"{node.id} append {first}..{last}: {code.name}", 1, event=True)

    # -- clients ---------------------------------------------------------------------------
    def cmd_propose(self, mid: str, *bodies: str) -> None:
        node = self.nodes[mid]
        lg = node.logic
        try:
            term, data = lg.admit([b.encode() for b in bodies], GROUP, None, 0)
            rnd = lg.write_round([(None, data)], term)
        except LedgerError as exc:
            self.say(f"{mid} refuses: {exc.code.name}")
            return
        self.tokens += 1
        node.rounds[self.tokens] = (rnd.first_index, rnd.last_index)
        self.say(f"{mid} stores {rnd.first_index}..{rnd.last_index} in term {term}")
        a = lg.announcement(rnd, rnd.appended.batch())
        node.checker.add_round(
            term, rnd.first_index, rnd.last_index, self.tokens, self.now, lg.water_mark()
        )
        for peer, d in node.dispatchers.items():
            d.on_announcement(a)
            self._pump(node, peer)
        self._check(node)

    def cmd_propose_n(self, mid: str, n: str) -> None:
        """``n`` generated bodies (e0, e1, ...) in one append."""
        self.cmd_propose(mid, *(f"e{k}" for k in range(int(n))))

    def cmd_transfer(self, mid: str, target: str) -> None:
        node = self.nodes[mid]
        resp, actions = node.logic.elector.transfer_leadership(target, self.now)
        self.say(f"{mid} transfer to {target}: {resp.code.name}")
        self._act(node, actions)

    # -- looking ---------------------------------------------------------------------------
    def cmd_status(self) -> None:
        for mid in self.ids:
            if mid not in self.nodes:
                self.say(f"{mid} down")
                continue
            st, s = self.nodes[mid].logic.state, self.nodes[mid].logic.store
            leader = st.leader_id or "-"
            self.say(
                f"{mid} {st.role.value:<9} term={st.current_term} leader={leader} "
                f"end={s.ledger_end_index} committed={s.committed_index}"
            )

    def cmd_log(self, mid: str) -> None:
        store = self.disks[mid][0]
        if store.ledger_end_index < store.ledger_begin_index:
            self.say("empty")
        for i in range(store.ledger_begin_index, store.ledger_end_index + 1):
            e = store.get(i)
            mark = "" if i <= store.committed_index else "  (uncommitted)"
            self.say(f"{i} term={e.term} {bytes(e.body).decode() or '<empty>'}{mark}")


# -- the file format (etcd's datadriven, simplified) ---------------------------------------


def parse(text: str) -> list[tuple[list[str], str, str]]:
    """Blocks of ``comment lines, command, ----, expected output`` split by blank lines."""
    blocks = []
    for chunk in text.strip("\n").split("\n\n"):
        lines = chunk.split("\n")
        comments = [ln for ln in lines if ln.startswith("#")]
        rest = [ln for ln in lines if not ln.startswith("#")]
        if not rest:
            blocks.append((comments, "", ""))
            continue
        assert rest[1:2] == ["----"], f"a command, then ----, then its output: {chunk!r}"
        blocks.append((comments, rest[0], "\n".join(rest[2:])))
    return blocks


def render(blocks: list[tuple[list[str], str, str]]) -> str:
    out = []
    for comments, cmd, output in blocks:
        out.append("\n".join(comments + ([cmd, "----", output] if cmd else [])))
    return "\n\n".join(out) + "\n"


def run_script(text: str) -> tuple[str, str]:
    """(the script as written, the script with the outputs the code gives)."""
    env = Env()
    blocks = parse(text)
    actual = [(c, cmd, env.run(cmd) if cmd else "") for c, cmd, _ in blocks]
    return render(blocks), render(actual)
