"""Script-style protocol tests, in the manner of etcd's rafttest ``InteractionEnv``.

Each member runs the shipped cores exactly as the simulation (tests/simulation) does:
:class:`MemberLogic`, the appends' :class:`RoundBook` and :class:`RoundPath`, the
:class:`Supervisor`'s role changes, a :class:`DispatcherDriver` per follower and a
:class:`CheckerDriver`.  This file only *delivers*: messages between members, the
node-local calls between a member and its helpers, the actions of the supervisor's and
the round path's processes, and a :class:`ScriptLoop` for the drivers.  Nothing moves on
its own: a script advances the clock, delivers the messages in flight and cuts links,
and every step prints what happened.  A test is a text file of commands, each followed
by the exact output expected; ``pytest --rewrite`` writes the output the code gives
instead (then read the diff).

Node-local work is deterministic: a call between a member and its helpers, and a
driver's ``call_soon``, runs in order right after the event that caused it (a message
delivered, a tick, a command); a driver's or process's timer runs when the script moves
the clock past it with ``tick``/``run`` on that member.

Commands (one per block; ``#`` lines are comments)::

    add-nodes N [pre-vote=false] [preferred=ID] [sync-flush] [voters=A,B,...]
                                     members n0..nN-1, empty memory stores; sync-flush:
                                     every acknowledgement waits for a flush; voters: the
                                     first configuration (the others start outside it)
    tick MS [NODE ...]               advance the clock MS ms in 10 ms steps, ticking NODEs
                                     and running their timers (all live members by
                                     default); prints what they sent
    run MS [pushes]                  let MS ms pass, every message delivered at once;
                                     prints only events (roles, terms, appends, transfers)
                                     and with ``pushes`` the replication messages sent
    campaign NODE                    tick only NODE once: a candidate asks for votes
    elect NODE                       campaign, stabilize, one heartbeat round, stabilize
                                     (prints only events)
    deliver [NODE ...]               deliver the messages now in flight (to NODEs only),
                                     printing each and what it caused
    stabilize                        deliver until nothing is in flight
    propose NODE BODY ...            a client appends BODYs on NODE (it must lead): stored
                                     as a round at once, or queued while rounds wait
    propose-n NODE N                 a client appends N generated bodies on NODE
    transfer NODE TARGET             ask the leader NODE to hand leadership to TARGET
    change NODE OP MEMBER [OLD]      a configuration change on the leader NODE (add,
                                     add_learner, promote, replace OLD, remove)
    partition A,B C,...              only members of the same side reach each other
    cut-pushes NODE ...              replication to NODEs is lost (votes still pass)
    heal                             every link works again
    crash NODE / restart NODE        stop a member (its store and term survive) / start it
    restart-checker NODE             NODE's checker process dies and starts again empty
    status                           role, term, leader, end and committed index of each
    log NODE                         NODE's entries: index, term, body

Messages to a crashed member or across a cut link are dropped when delivered; the sender
gets no answer (``None``), as an actor call that times out.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from rayledger.actors.core import member as mc
from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.member import MemberCore
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.pump import CheckerDriver, DispatcherDriver
from rayledger.actors.core.round_path import RoundPath
from rayledger.actors.core.rounds import RoundBook
from rayledger.election import ElectionConfig
from rayledger.election.member_state import MemoryTermStore
from rayledger.election.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    RoleChange,
    VoteRequest,
    VoteResponse,
)
from rayledger.replication import ReplicationConfig
from rayledger.replication import checker as ck
from rayledger.replication import dispatcher as dl
from rayledger.replication.checker import CheckerLogic, Resolution
from rayledger.replication.dispatcher import CachedBatch, DispatcherLogic, Fetch
from rayledger.replication.messages import Inline, PushEntryRequest, PushEntryResponse, PushType
from rayledger.storage import LedgerError, MemoryStore, StoreConfig

GROUP = "g"
STEP_MS = 10
RPC_MS = 1_000  # LedgerConfig's rpc_timeout_ms for these timers: the supervisor's call budget
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


@dataclass(eq=False)
class Node:
    """One incarnation of a member: its cores and the helpers' drivers (a crash drops it)."""

    id: str
    logic: MemberLogic
    dispatchers: dict[str, DispatcherLogic]
    checker: CheckerLogic
    core: MemberCore
    drivers: dict[str, DispatcherDriver] = field(default_factory=dict)
    checker_driver: CheckerDriver | None = None
    dead: bool = False
    checker_pid: int = 0

    @property
    def book(self) -> RoundBook:
        return self.core.book

    @property
    def round_path(self) -> RoundPath:
        return self.core.round_path

    @property
    def supervisor(self) -> sv.Supervisor:
        return self.core.supervisor


class _Timer:
    """A :class:`ScriptLoop` timer: ``[due, seq, node, fn, args, live]``."""

    __slots__ = ("entry",)

    def __init__(self, entry: list):
        self.entry = entry

    def cancel(self) -> None:
        self.entry[5] = False


class ScriptLoop:
    """A helper's :class:`~rayledger.actors.core.pump.Loop` in the script: the script's clock,
    ``call_soon`` onto the node-local queue, timers the script's clock fires."""

    __slots__ = ("env", "node")

    def __init__(self, env: Env, node: Node):
        self.env, self.node = env, node

    def now_ms(self) -> int:
        return self.env.now

    def call_soon(self, fn: Callable, *args: Any) -> None:
        self.env._soon(self.node, fn, *args)

    def call_later_ms(self, delay_ms: int, fn: Callable, *args: Any) -> _Timer:
        return self.env._later(self.node, delay_ms, fn, *args)

    def call_threadsafe(self, fn: Callable, *args: Any) -> None:
        self.env._soon(self.node, fn, *args)


class _DispatcherPorts:
    """A dispatcher's pushes go over the network; fetches, reports and progress are
    node-local calls, their answers node-local calls back."""

    __slots__ = ("env", "node", "peer")

    def __init__(self, env: Env, node: Node, peer: str):
        self.env, self.node, self.peer = env, node, peer

    def push(self, req: PushEntryRequest) -> None:
        if isinstance(req.batch, CachedBatch):
            req = replace(req, batch=req.batch.payload.batch)  # always Inline here
        self.env._send(Msg(self.node.id, self.peer, req))

    def fetch(self, f: Fetch) -> None:
        self.env._soon(self.node, self.env._fetch, self.node, self.peer, f)

    def report(self, term: int, wm: int) -> None:
        self.env._soon(self.node, self.env._report, self.node, self.peer, term, wm)

    def progress(self, term: int, wm: int) -> None:
        node, peer = self.node, self.peer
        self.env._soon(node, self.env._peer_progress, node, peer, term, wm)

    def priority(self, background: bool) -> None:
        pass  # no processes to schedule here


class _CheckerPorts:
    """The checker's messages to its member and the dispatchers: node-local calls."""

    __slots__ = ("env", "node")

    def __init__(self, env: Env, node: Node):
        self.env, self.node = env, node

    def resolved(self, r: Resolution) -> None:
        self.env._soon(self.node, self.env._on_resolved, self.node, r)

    def notice(self, term: int, committed: int) -> None:
        for d in self.node.drivers.values():
            self.env._soon(self.node, d.deliver, dl.Committed(term, committed))


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
    """The members, the clock, the messages in flight and the node-local queue of one
    script."""

    def __init__(self) -> None:
        self.now = 1_000
        self.nodes: dict[str, Node] = {}
        self.down: set[str] = set()
        self.sides: list[set[str]] | None = None
        self.no_pushes: set[str] = set()  # members no replication reaches
        self.flight: list[Msg] = []
        self.out: list[str] = []
        self.disks: dict[str, tuple[MemoryStore, MemoryTermStore]] = {}
        self.ids: list[str] = []
        self.voters: list[str] = []  # the first configuration's (the others start outside)
        self.election = ElectionConfig(**TIMERS)
        self.replication = ReplicationConfig()
        self.sync = False
        self.tokens = 0
        self.quiet = False
        self.show_pushes = False
        self.header: str | None = None  # printed before the first line of a tick or timer
        self.nest = 1  # indent of what an event caused (0 for a command's own result)
        self.soon: deque[tuple[Node, Callable, tuple]] = deque()
        self.timers: list[list] = []
        self.seq = 0

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
            return
        if self.header is not None:
            self.out.append(self.header)
            self.header = None
        self.out.append("  " * indent + text)

    # -- the node-local queue (the actors' loops and the calls between them) ---------------
    def _soon(self, node: Node, fn: Callable, *args: Any) -> None:
        self.soon.append((node, fn, args))

    def _later(self, node: Node, delay_ms: int, fn: Callable, *args: Any) -> _Timer:
        self.seq += 1
        entry = [self.now + delay_ms, self.seq, node, fn, args, True]
        self.timers.append(entry)
        return _Timer(entry)

    def _settle(self) -> None:
        """Run the node-local calls due now, in order, until none is left."""
        for _ in range(100_000):
            if not self.soon:
                return
            node, fn, args = self.soon.popleft()
            if not node.dead:
                fn(*args)
        raise AssertionError("node-local calls keep coming")

    def _next_timer(self, until: int, of: Collection[str]) -> list | None:
        self.timers = [e for e in self.timers if e[5] and not e[2].dead]
        due = [e for e in self.timers if e[0] <= until and e[2].id in of]
        return min(due, key=lambda e: (e[0], e[1])) if due else None

    def _fire_timers(self, until: int, of: Collection[str], deliver: bool) -> None:
        """The timers of members ``of`` due by ``until``, at their time: those due at the
        same moment all run before the messages they sent are delivered."""
        for _ in range(10_000):
            entry = self._next_timer(until, of)
            if entry is None:
                return
            self.now = max(self.now, entry[0])
            while entry is not None:
                entry[5] = False
                self.header = f"t={self.now} {entry[2].id}:"
                entry[3](*entry[4])
                self._settle()
                self.header = None
                entry = self._next_timer(self.now, of)
            if deliver:
                self._deliver_all()
        raise AssertionError("timers keep firing")

    # -- members -------------------------------------------------------------------------
    def cmd_add_nodes(self, n: str, *opts: str) -> None:
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "pre-vote":
                self.election = replace(self.election, enable_pre_vote=value != "false")
            elif key == "preferred":
                self.election = replace(self.election, preferred_leader_ids=value)
            elif key == "sync-flush":
                self.sync = True
            elif key == "voters":
                self.voters = value.split(",")
            else:
                raise ValueError(f"unknown option {opt!r}")
        self.ids = [f"n{i}" for i in range(int(n))]
        self.voters = self.voters or list(self.ids)
        for mid in self.ids:
            self.disks[mid] = (MemoryStore(StoreConfig()), MemoryTermStore())
            self._start(mid)

    def _start(self, mid: str) -> None:
        """A member's process and its helpers, wired as the simulation's ``_start``."""
        store, terms = self.disks[mid]
        store.defer_sync = self.sync  # flushes are the cores' to ask for
        rng = random.Random(int(mid[1:]))  # each member's timers, the same every run
        logic = MemberLogic(
            GROUP, mid, self.voters, store, self.election, self.replication, terms, rng=rng
        )
        members = list(logic.config_log.latest().members)
        checker = CheckerLogic(GROUP, mid, members, self.replication)
        core = MemberCore(logic, rpc_timeout_ms=RPC_MS, sync=self.sync, tick_ms=STEP_MS)
        node = Node(mid, logic, {}, checker, core)
        supervisor = core.supervisor
        supervisor.pids.update({k: 0 for k in supervisor.keys()})  # every helper has started
        self._install_checker(node, checker)
        self.nodes[mid] = node

    def _ensure_dispatchers(self, node: Node, peers) -> None:
        """The Ray member's ``_create_helpers``/``_helpers``: one dispatcher per peer (a
        member's first term starts them: ``Supervisor.runs_helpers``), none for members gone;
        in the script a helper is up at once."""
        for gone in [p for p in node.drivers if p not in peers]:
            del node.drivers[gone], node.dispatchers[gone]
        for p in peers:
            if p not in node.drivers:
                d = node.dispatchers[p] = DispatcherLogic(GROUP, node.id, p, self.replication)
                node.drivers[p] = DispatcherDriver(d, _DispatcherPorts(self, node, p))
                node.drivers[p].attach(ScriptLoop(self, node))
                node.supervisor.pids[("dispatcher", p)] = 0

    def _install_checker(self, node: Node, checker: CheckerLogic) -> None:
        node.checker = checker
        node.checker_driver = CheckerDriver(checker, _CheckerPorts(self, node))
        node.checker_driver.attach(ScriptLoop(self, node))

    def cmd_crash(self, mid: str) -> None:
        self.down.add(mid)
        self.nodes.pop(mid).dead = True

    def cmd_restart(self, mid: str) -> None:
        self.down.discard(mid)
        self._start(mid)
        st = self.nodes[mid].logic.state
        self.say(f"{mid} restarted: term={st.current_term} vote={st.vote_for}")

    def cmd_restart_checker(self, mid: str) -> None:
        """The checker's process dies: Ray starts a fresh one, which tells its member
        (``helper_started``); what the member then does is the supervisor's."""
        node = self.nodes[mid]
        self._install_checker(node, CheckerLogic(GROUP, mid, self.ids, self.replication))
        node.checker_pid += 1
        self.say(f"{mid}'s checker restarted empty")
        self._step(node, mc.HelperStarted("checker", None, node.checker_pid, restarted=True))
        self._settle()

    # -- time ----------------------------------------------------------------------------
    def cmd_tick(self, ms: str, *only: str) -> None:
        self._advance(int(ms), only or list(self.nodes), deliver=False)

    def _advance(self, ms: int, only: Collection[str], deliver: bool) -> None:
        """``ms`` in steps of 10: the timers of ``only`` at their time, then their ticks."""
        for _ in range(max(1, ms // STEP_MS)):
            target = self.now + STEP_MS
            self._fire_timers(target - 1, only, deliver)
            self.now = target
            for mid in only:
                if mid in self.nodes:
                    self._tick(self.nodes[mid])
            self._fire_timers(target, only, deliver)
            if deliver:
                self._deliver_all()

    def cmd_run(self, ms: str, show: str = "") -> None:
        """Let ``ms`` pass with every message delivered at once, printing only events (and
        with ``pushes`` the replication messages too)."""
        self.quiet, self.show_pushes = True, show == "pushes"
        try:
            self._advance(int(ms), list(self.nodes), deliver=True)
        finally:
            self.quiet = self.show_pushes = False

    def _deliver_all(self) -> None:
        for _ in range(50):
            if not self.flight:
                break
            self.cmd_deliver()

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
        """``MemberActor._maintain``: the elector's and the entry handler's tick."""
        self.header = f"t={self.now} {node.id}:"
        self._step(node, mc.Tick())
        self._settle()
        self.header = None

    # -- the network ---------------------------------------------------------------------
    def _reaches(self, a: str, b: str) -> bool:
        if a in self.down or b in self.down:
            return False
        return self.sides is None or any(a in s and b in s for s in self.sides)

    def cmd_partition(self, *sides: str) -> None:
        self.sides = [set(s.split(",")) for s in sides]

    def cmd_heal(self) -> None:
        self.sides = None
        self.no_pushes = set()

    def cmd_cut_pushes(self, *to: str) -> None:
        """Replication to (and answers from) members ``to`` is lost, elections still pass:
        a member that votes but learns no entry (``heal`` ends it)."""
        self.no_pushes = set(to)

    def _send(self, msg: Msg) -> None:
        self.flight.append(msg)
        push = isinstance(msg.payload, (PushEntryRequest, PushEntryResponse))
        self.say(f"{msg.src}->{msg.dst} {describe(msg.payload)}", 1, self.show_pushes and push)

    def cmd_deliver(self, *only: str) -> None:
        batch = [m for m in self.flight if not only or m.dst in only]
        self.flight = [m for m in self.flight if m not in batch]
        for m in batch:
            self._deliver(m)
            self._settle()

    def cmd_stabilize(self) -> None:
        for _ in range(100):
            if not self.flight:
                return
            self.cmd_deliver()
        raise AssertionError("messages still in flight after 100 rounds")

    def _deliver(self, m: Msg) -> None:
        push = isinstance(m.payload, PushEntryRequest) or isinstance(m.request, PushEntryRequest)
        if not self._reaches(m.src, m.dst) or (push and m.dst in self.no_pushes):
            self.say(f"{m.src}->{m.dst} {describe(m.payload)} DROPPED")
            caller, callee, req = (m.src, m.dst, m.payload) if m.request is None else (
                m.dst, m.src, m.request)  # fmt: skip
            if caller in self.nodes:  # the caller's call times out: no answer
                self._answered(self.nodes[caller], callee, req, None)
            return
        self.say(f"{m.src}->{m.dst} {describe(m.payload)}")
        node = self.nodes[m.dst]
        if m.request is not None:
            self._answered(node, m.src, m.request, m.payload)
        elif isinstance(m.payload, PushEntryRequest):
            self._step(node, mc.Push(m.payload, (m.src, m.payload)))
        else:
            out = node.core.step(mc.ElectionRequest(m.payload), self.now)
            self._carry(node, out)
            self._send(Msg(m.dst, m.src, out.reply, m.payload))

    def _answered(self, node: Node, peer: str, req: Any, resp: Any) -> None:
        if isinstance(req, PushEntryRequest):
            d = node.drivers.get(peer)
            if d is not None:
                d.deliver(dl.FollowerAnswer(req, resp))
        else:
            self._step(node, mc.ElectionAnswer(peer, req, resp))

    # -- the member: its core's events and what they ask for ---------------------------------
    def _step(self, node: Node, ev: Any) -> mc.MemberOut:
        out = node.core.step(ev, self.now)
        self._carry(node, out)
        return out

    def _carry(self, node: Node, out: mc.MemberOut, pid: int | None = None) -> None:
        """``MemberActor``'s carrying out of a :class:`MemberOut` (the core's one order).
        The next action of the process ``pid`` (just answered) and a round's go on at once;
        another process starts as a task: after the event that started it."""
        mc.carry_out(out, _ScriptPorts(self, node, pid))

    def _run_action(self, node: Node, run: mc.Run) -> None:
        """An action of the core's processes; a sleep is a timer, a flush runs off the
        loop (what is queued goes on meanwhile)."""
        if node.dead:
            return
        a = run.action
        if isinstance(a, sv.Sleep) and a.ms:
            self._later(node, a.ms, self._answer_action, node, run.pid, None)
        elif isinstance(a, sv.Flush):
            self._soon(node, self._answer_action, node, run.pid, self._flush)
        else:
            self._answer_action(node, run.pid, lambda node: self._perform(node, a))

    def _answer_action(self, node: Node, pid: int, call: Callable | None) -> None:
        value = call(node) if call is not None else None
        if not node.dead:
            self._carry(node, node.core.step(mc.ProcessAnswered(pid, value), self.now), pid)

    def _perform(self, node: Node, a: Any) -> Any:
        """An action carried out at once: the helpers are on this node and answer (only
        ``restart-checker`` takes one away, and Ray brings it back)."""
        if isinstance(a, rp.Announce):
            for d in node.drivers.values():
                self._soon(node, d.deliver, dl.RoundAnnounced(a.a))
            return None
        if isinstance(a, rp.Register):
            args = (a.term, a.first, a.last, a.rid, a.leader_mark, a.config)
            self._soon(node, node.checker_driver.deliver, ck.AddRound(*args))
            return None
        if isinstance(a, sv.Sleep | sv.FastStop | sv.Ready):
            return None  # no wait, no readers, no compiled path in the script
        if isinstance(a, sv.CheckerStepDown):
            return node.checker_driver.deliver(ck.LeadershipEnded(a.new_term))
        if isinstance(a, sv.DeactivateDispatchers):
            for d in node.drivers.values():
                d.deliver(dl.Deactivate(a.term))
            return 0
        if isinstance(a, sv.SetUpHelpers):
            if not node.dispatchers:  # its first term: its helpers start now
                self._ensure_dispatchers(node, node.supervisor.dispatcher_peers())
            if a.only is None:
                text = f"{node.id} leads term {a.term} from index {a.start}"
            else:
                text = f"{node.id} sets its {a.only} up again for term {a.term}"
            self.say(text, 1, event=True)
            if a.only in (None, "checker"):
                # what it fails is ignored, as by both shells: the step-down before failed it
                node.checker_driver.deliver(ck.BecomeLeader(a.term, a.start, a.info))
                self._carry(node, node.core.step(mc.CheckerSetUp(a.term), self.now))
            for p, d in node.drivers.items():
                if a.only in (None, "checker", p):
                    d.deliver(dl.Activate(a.info))
            return None
        if isinstance(a, sv.Ping):
            return {k: "ok" for k in a.keys}
        if isinstance(a, sv.Helpers):  # the Ray member's _helpers: one dispatcher per member
            self._ensure_dispatchers(node, a.peers)
            return None
        if isinstance(a, sv.CheckerConfigure):
            return node.checker_driver.deliver(ck.Configure(a.term, a.info))
        raise TypeError(f"{a!r} has no transport in the script environment")

    def _flush(self, node: Node) -> sv.Failed | None:
        self.say(f"{node.id} flushes", 1)
        try:
            node.logic.store.flush()
        except (LedgerError, OSError) as exc:
            return sv.Failed(str(exc))
        return None

    # -- the member: its helpers' calls ----------------------------------------------------
    def _fetch(self, node: Node, peer: str, f: Fetch) -> None:
        """A dispatcher asks its member (fenced by term) for what its cache lacks."""
        d = node.drivers[peer]
        try:
            answer = mc.answer_fetch(partial(self._step, node), node.logic.store, f)
        except LedgerError:
            self._soon(node, d.deliver, dl.Fetched(f, failed=True))
            return
        if f.kind == "batch" and answer is not None:
            batch, info = answer
            answer = (CachedBatch(batch.first_index, batch.count, Inline(batch), len(batch.data)),
                      info)  # fmt: skip
        self._soon(node, d.deliver, dl.Fetched(f, answer))

    def _report(self, node: Node, peer: str, term: int, wm: int) -> None:
        committed = node.checker_driver.deliver(ck.Report(term, peer, wm))
        self._soon(node, node.drivers[peer].deliver, dl.Reported(term, wm, committed))

    def _peer_progress(self, node: Node, peer: str, term: int, wm: int) -> None:
        self._step(node, mc.PeerProgress(peer, term, wm))

    def _on_resolved(self, node: Node, r: Resolution) -> None:
        self._step(node, mc.RoundsResolved(r))

    # -- the member: appends ---------------------------------------------------------------
    def cmd_propose(self, mid: str, *bodies: str) -> None:
        node = self.nodes[mid]
        self.tokens += 1
        try:
            self._step(node, mc.ClientAppend([b.encode() for b in bodies], GROUP, None,
                                             self.tokens))  # fmt: skip
        except LedgerError as exc:
            self.say(f"{mid} refuses: {exc.code.name}")
            return
        self.nest = 0
        try:
            self._settle()
        finally:
            self.nest = 1
        if any(token == self.tokens for token, *_ in node.book.queue):
            self.say(f"{mid} queues {' '.join(bodies)}")

    def cmd_propose_n(self, mid: str, n: str) -> None:
        """``n`` generated bodies (e0, e1, ...) in one append."""
        self.cmd_propose(mid, *(f"e{k}" for k in range(int(n))))

    def _write_round(self, node: Node) -> None:
        """Group commit: the queued appends become one round, sent on by the round path."""
        self._step(node, mc.WriteRound())

    def cmd_change(self, mid: str, op: str, member: str, replaces: str = "") -> None:
        """An operator's configuration change on the leader ``mid`` (``Op``: add,
        add_learner, promote, replace, remove)."""
        node = self.nodes[mid]
        self.tokens += 1
        try:
            self._step(node, mc.ChangeMembers(op, member, self.tokens, replaces))
        except LedgerError as exc:
            self.say(f"{mid} refuses: {exc.code.name}")
            return
        self.say(f"{mid} takes {op} {member}")
        self._settle()

    def cmd_transfer(self, mid: str, target: str) -> None:
        node = self.nodes[mid]
        out = node.core.step(mc.TransferOrder(target), self.now)
        self.say(f"{mid} transfer to {target}: {out.reply[0].code.name}")
        self._carry(node, out)
        self._settle()

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


class _ScriptPorts:
    """What the script environment does with each part of a member's :class:`MemberOut`:
    it prints what happened; what it does not model (machines, lost nodes, reads in the
    member's output, compiled graphs) it leaves."""

    def __init__(self, env: Env, node: Node, pid: int | None) -> None:
        self.env, self.node, self.pid = env, node, pid

    def register(self, rounds: list) -> None:
        for r in rounds:  # what a dead checker held
            self.env._perform(self.node, r)

    def rounds(self, out: mc.MemberOut) -> None:
        env, node = self.env, self.node
        for fin in out.finished:
            first, last = fin.round.first_index, fin.round.last_index
            env.say(f"{node.id} append {first}..{last}: {fin.code.name}", 1, event=True)
        w = out.written
        if w is not None and w.error is not None:
            env.say(f"{node.id} refuses: {w.error.code.name}", env.nest)
        elif w is not None:
            rnd = w.round
            env.say(f"{node.id} stores {rnd.first_index}..{rnd.last_index} in term {rnd.term}",
                    env.nest)  # fmt: skip

    def answers(self, answers: list, flush_first: bool) -> None:
        # a follower's, after a flush when the core says so
        if not flush_first or self.env._flush(self.node) is None:
            for (leader, req), resp in answers:
                self.env._send(Msg(self.node.id, leader, resp, req))

    def notes(self, notes: list) -> None:
        env, node = self.env, self.node
        for a in notes:
            if isinstance(a, RoleChange):
                leader = f" leader={a.leader_id}" if a.leader_id else ""
                env.say(f"{node.id} is {a.role.value} term={a.term}{leader}", 1, event=True)
            else:
                text = f"{node.id} transfer of term {a.term} to {a.transferee}: {a.code.name}"
                env.say(text, 1, event=True)

    def sends(self, sends: list) -> None:
        for snd in sends:
            self.env._send(Msg(self.node.id, snd.to, snd.message))

    def run(self, runs: list) -> None:
        env, node = self.env, self.node
        for run in runs:
            if run.pid == self.pid or run.kind in ("round", "fallback"):
                env._run_action(node, run)
            else:
                env._soon(node, env._run_action, node, run)

    def write_due(self) -> None:
        self.env._soon(self.node, self.env._write_round, self.node)

    def installed(self, sealed: list) -> None: ...
    def spawns(self, spawns: list) -> None: ...
    def reads(self, out: mc.MemberOut) -> None: ...
    def leave_graphs(self) -> None: ...
    def commits_moved(self) -> None: ...
    def elector_moved(self) -> None: ...
