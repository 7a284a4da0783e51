"""The member's core: one way in, one way out (sans-I/O: no Ray, no asyncio, no clock).

Like etcd-io/raft's ``RawNode``, a member is stepped with events and answers with what to do.
:meth:`MemberCore.step` takes one event and the time and returns a :class:`MemberOut`: the call's
direct answer (``reply``, as ``Step`` returns its error), the messages to send, the push answers
(after a flush when ``flush_first``), the actions of its processes to carry out, the rounds that
ended, and when to tick next.  The Ray member (:mod:`rayledger.actors.member.actor`), the
whole-group simulation and the script tests deliver events and carry outs out; nothing else.

Inside, the member's decisions live in the pieces it is built from:
:class:`~.member_logic.MemberLogic` (the elector, the entry handler, leadership, admission),
:class:`~.rounds.RoundBook` (group commit), :class:`~.round_path.RoundPath` (a round from
the store to its quorum) and :class:`~.supervision.Supervisor` (taking and leaving office,
the helpers' supervision).  What used to be glue in each transport is decided here once:

* which process runs next under the role lock (:class:`~.supervision.RoleQueue`: a
  coalesced role change before the helper restores waiting) -- the election events find
  the role changes themselves;
* the actions a process needs no transport for: a step-down or a hand-over (the elector),
  the rounds a process finishes (the round book), the helper watch a new term starts;
* when the queued appends are due as a round, and when the answers to pushes wait for the
  disk (sync_flush).

A process's action goes out as a :class:`Run` (its id, its kind, the action); the
transport carries it out and steps :class:`ProcessAnswered` with the value (a timeout is an
answer too, :class:`~.supervision.Failed`).  A process has one action out at a time.
The Out of a step is taken as it is handed out; what the member persists (its store) is
written by the core, and a flush the transport does is reported back as an answer, the
``persisted up to`` of a sans-I/O store -- so there is no separate ``advance``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.member_logic import EntriesRead, MemberLogic
from rayledger.actors.core.read_path import Confirm, ReadPath, WaitCommitted
from rayledger.actors.core.reads import Consistency, ReadIndexLogic
from rayledger.actors.core.rounds import MAX_ROUNDS, Finished, RoundBook, Written
from rayledger.election import Role, RoleChange, Send, TransferOutcome
from rayledger.election.membership import Membership, Spawn, Transfer
from rayledger.election.messages import (
    ElectionAnswer,
    ElectionRequest,
    HandOverOrder,
    HeartbeatRequest,
    PeerProgress,
    QuitLeadership,
    Tick,
    TransferOrder,
)
from rayledger.replication.admission import not_leader
from rayledger.replication.checker import Resolution
from rayledger.replication.dispatcher import Fetch
from rayledger.replication.messages import Push
from rayledger.storage import LedgerError, ResponseCode

log = logging.getLogger("rayledger.actors")


# ====================================================================== events in


@dataclass(frozen=True, slots=True)
class ClientAppend:
    """A client's append on this member: DLedger's checks (the step raises the coded
    :class:`~rayledger.storage.LedgerError`, nothing queued), then it waits for the next round."""

    bodies: Sequence[bytes]
    group: str
    target: str | None
    token: Any
    ident: tuple[int, int] | None = None  # an idempotent client's (client id, first seq)
    maybe_stored: bool = True  # a call with that identity ended unknown (or not told)


@dataclass(frozen=True, slots=True)
class WriteRound:
    """The turn in which appends were queued ends: write them as one round (``fast``: the
    compiled path takes rounds now -- live, or parked and woken by this one)."""

    fast: bool = False
    wall_ms: int = 0  # the leader's wall clock: the stamp of idempotent clients' entries


@dataclass(frozen=True, slots=True)
class RoundsResolved:
    """From the checker or the compiled graph: the committed index moved, rounds ended."""

    resolution: Resolution


@dataclass(frozen=True, slots=True)
class ProcessAnswered:
    """The answer to process ``pid``'s action (``value``: its result, or ``Failed``)."""

    pid: int
    value: Any = None


@dataclass(frozen=True, slots=True)
class HelperStarted:
    """A helper's process started (``restarted``: by Ray, after its process died)."""

    kind: str
    peer: str | None
    pid: int
    restarted: bool = False


@dataclass(frozen=True, slots=True)
class CheckerSetUp:
    """The leader's checker answered its set-up for ``term``: the rounds of the term still
    waiting were lost with a dead checker and are registered again (``MemberOut.register``)."""

    term: int


@dataclass(frozen=True, slots=True)
class GraphFallback:
    """Rounds of an abandoned compiled graph: those still waiting travel as plain calls."""

    items: Sequence


@dataclass(frozen=True, slots=True)
class StepDown:
    """Stop leading at once (``why`` is logged): a failed flush, an operator."""

    why: str


@dataclass(frozen=True, slots=True)
class ReadIndex:
    """A reader wants an index it may read at with ``consistency``: on the leader its read
    index, on a follower the leader's, once this member committed that far
    (``leader_only``: this member must lead).  ProcessAnswered in :attr:`MemberOut.reads_done`."""

    consistency: Consistency
    token: Any
    leader_only: bool = False


@dataclass(frozen=True, slots=True)
class ReadRoundAnswer:
    """A peer's answer (None: none in time) to a confirmation round's heartbeat ``req``."""

    peer: str
    req: HeartbeatRequest
    resp: Any


@dataclass(frozen=True, slots=True)
class ExpireReads:
    """The time a confirmation round sent earlier may take has passed (``expire_at_ms``)."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """Process ``pid``'s wait asked for in :attr:`MemberOut.deadlines` ran out."""

    pid: int


@dataclass(frozen=True, slots=True)
class ChangeMembers:
    """An operator's change of the configuration on this leader (an :class:`~.membership.Op`
    on ``member``; ``replaces`` for a replacement).  The step raises the coded error of a
    refused change (nothing changes; LEADER_TRANSFERRING when this leader is to leave: it
    hands over first).  Otherwise the configuration entry waits for the next round and
    ``token`` is answered like an append's when it commits."""

    op: str
    member: str
    token: Any
    replaces: str = ""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What Ray says of the nodes (on the leader, for ``replace_lost_after_s``): the live
    nodes and each member's node as last known."""

    alive_nodes: tuple[str, ...]
    member_nodes: dict


@dataclass(frozen=True, slots=True)
class SpawnDone:
    """The transport started the member of a :class:`~.membership.Spawn` and it was added
    (``ok``), or either failed (``code``: how its change ended; None: never asked).  The
    core says whether to stop it (``MemberOut.stop_spawned``)."""

    member: str
    ok: bool
    code: ResponseCode | None = None


@dataclass(frozen=True, slots=True)
class FetchAsked:
    """A dispatcher of ``fetch.term`` asks for what its cache lacks: entries, the newest
    snapshot or an entry's (term, pos), fenced by its term.  The reply is the answer
    (:meth:`~.member_logic.MemberLogic.answer_fetch`); for entries an
    :class:`~.member_logic.EntriesRead` to read outside the member's lock
    (:func:`answer_fetch`).  ``read_failed``: that read failed, the log was compacted
    meanwhile."""

    fetch: Fetch
    read_failed: bool = False


@dataclass(frozen=True, slots=True)
class ChunkAsked:
    """A dispatcher of ``term`` asks where a chunk of snapshot ``index`` (of ``snap_term``)
    is; the reply is the snapshot, read outside the lock, or the coded error
    (:meth:`~.member_logic.MemberLogic.snapshot_chunk`)."""

    term: int
    index: int
    snap_term: int


@dataclass(frozen=True, slots=True)
class MemberClosed:
    """The member closes: its processes end where they are."""


MemberEvent = (
    Tick | ElectionRequest | ElectionAnswer | PeerProgress | TransferOrder | Push
    | ClientAppend | WriteRound | RoundsResolved | ProcessAnswered | HelperStarted | CheckerSetUp
    | GraphFallback | StepDown
    | ReadIndex | ReadRoundAnswer | ExpireReads | Deadline | ChangeMembers | ClusterView
    | SpawnDone | FetchAsked | ChunkAsked | MemberClosed
)  # fmt: skip


# ===================================================================== actions out


@dataclass(frozen=True, slots=True)
class Run:
    """Carry out ``action`` of process ``pid`` (a ``kind`` of process: role, restore,
    watch, round, fallback) and step :class:`ProcessAnswered` with its result."""

    pid: int
    kind: str
    action: Any


@dataclass(slots=True)
class MemberOut:
    reply: Any = None
    sends: list[Send] = field(default_factory=list)  # election messages to peers
    notes: list[Any] = field(default_factory=list)  # RoleChange, TransferOutcome
    answers: list[tuple[Any, Any]] = field(default_factory=list)  # (push token, response)
    flush_first: bool = False  # the answers go out only once the store is flushed
    run: list[Run] = field(default_factory=list)
    register: list[rp.Register] = field(default_factory=list)  # rounds for a set-up checker
    written: Written | None = None  # the round written by this step
    finished: list[Finished] = field(default_factory=list)  # rounds that ended
    # append calls answered outside a round (a retry answered from the log, or
    # its unknown outcome): (token, Spread | LedgerError)
    settled: list[tuple[Any, Any]] = field(default_factory=list)
    write_due: bool = False  # step WriteRound at the end of this turn
    commits_moved: bool = False  # the committed index may have moved: wake what waits
    elector_moved: bool = False  # the elector's next deadline may have moved: re-arm
    reads_done: list[tuple[Any, Any]] = field(default_factory=list)  # (token, index | error)
    read_pings: list[tuple[str, HeartbeatRequest]] = field(default_factory=list)  # to peers
    expire_at_ms: int | None = None  # step ExpireReads then
    deadlines: list[tuple[int, int]] = field(default_factory=list)  # (pid, at): step Deadline
    installed: list[Any] = field(default_factory=list)  # snapshots sealed from the leader
    spawns: list[Spawn] = field(default_factory=list)  # members to start for a lost one
    stop_spawned: list[str] = field(default_factory=list)  # started, not added: stop them
    # close the loops of the compiled graph this member served: its leader is not this
    # member's leader any more (a dead leader's loops would spin until the next one compiles).
    # Ray closes every loop the actor runs: a newer leader's graph built before this member
    # heard of its term falls back to plain calls and is built again
    leave_graphs: bool = False


class OutPorts(Protocol):
    """How a transport carries out each part of a :class:`MemberOut` (:func:`carry_out`)."""

    def rounds(self, out: MemberOut) -> None:
        """The append calls' results: ``finished``, ``settled``, ``written``."""

    def answers(self, answers: list[tuple[Any, Any]], flush_first: bool) -> None: ...
    def notes(self, notes: list[Any]) -> None: ...
    def sends(self, sends: list[Send]) -> None: ...
    def run(self, runs: list[Run]) -> Any: ...
    def register(self, rounds: list[rp.Register]) -> None:
        """Each round to the checker at once, as a round's ``Register`` action."""

    def write_due(self) -> None: ...
    def installed(self, sealed: list[Any]) -> None: ...
    def spawns(self, spawns: list[Spawn]) -> None: ...
    def reads(self, out: MemberOut) -> None:
        """``reads_done``, ``read_pings``, ``deadlines``, ``expire_at_ms``."""

    def leave_graphs(self) -> None: ...
    def commits_moved(self) -> None: ...
    def elector_moved(self) -> None: ...


def carry_out(out: MemberOut, ports: OutPorts) -> Any:
    """Carry out ``out`` in the one order every transport keeps -- the Ray member, the
    simulation and the script tests: the append calls' results first, then the answers to
    pushes, notes, election messages, the processes' actions, rounds for a checker set up
    again, a round due, snapshots
    installed, members to spawn, reads, graphs left, and the wake-ups.  Returns what
    ``ports.run`` returned (the Ray member's next action of the process it follows)."""
    if out.finished or out.settled or out.written is not None:
        ports.rounds(out)
    if out.answers:
        ports.answers(out.answers, out.flush_first)
    if out.notes:
        ports.notes(out.notes)
    if out.sends:
        ports.sends(out.sends)
    nxt = ports.run(out.run) if out.run else None
    if out.register:
        ports.register(out.register)
    if out.write_due:
        ports.write_due()
    if out.installed:
        ports.installed(out.installed)
    if out.spawns:
        ports.spawns(out.spawns)
    if out.reads_done or out.read_pings or out.deadlines or out.expire_at_ms is not None:
        ports.reads(out)
    if out.leave_graphs:
        ports.leave_graphs()
    if out.commits_moved:
        ports.commits_moved()
    if out.elector_moved:
        ports.elector_moved()
    return nxt


class MemberCore:
    """One member's decisions, stepped by its transport."""

    def __init__(
        self,
        logic: MemberLogic,
        *,
        rpc_timeout_ms: int,
        sync: bool = False,
        machine: bool = False,
        fast_path: bool = False,
        tick_ms: int = 10,
        lease_ms: int = 0,
        promote_lag: int = 1000,
        replace_lost_after_ms: int | None = None,
        max_rounds: int = MAX_ROUNDS,
    ):
        self.logic = logic
        self.membership = Membership(logic.self_id, promote_lag, replace_lost_after_ms)
        self._config = logic.config_log.latest()  # the configuration the helpers follow
        self._membership_of = -1  # the term whose followers' progress membership holds
        self.book = RoundBook(logic, max_rounds)
        self.round_path = rp.RoundPath(logic, self.book, sync)
        self.supervisor = sv.Supervisor(
            logic,
            self.book,
            list(self._config.members),
            rpc_timeout_ms,
            logic.elector.config.heartbeat_timeout_ms,
            sync=sync,
            machine=machine,
            fast_path=fast_path,
        )
        self.role_queue = sv.RoleQueue(self.supervisor)
        self.reads = ReadIndexLogic(logic.self_id, logic.peers, lease_ms, rpc_timeout_ms)
        self.reads.configure(self._config.voters)
        self.read_path = ReadPath(logic, self.reads, rpc_timeout_ms)
        self._readers: dict[int, Any] = {}  # a read process's pid -> its reader's token
        self._wake: list[tuple[int, Any]] = []  # processes to resume before the step ends
        self.tick_ms = tick_ms
        self._procs: dict[int, sv.Process] = {}
        self._out: dict[int, Any] = {}  # the action each process waits on
        self._pids = itertools.count(1)
        self._graph: tuple[int, str] | None = None  # (term, leader) of the graph it serves

    # -- the way in --------------------------------------------------------------------------
    def step(self, ev: MemberEvent, now_ms: int) -> MemberOut:  # noqa: C901 -- one case each
        out = MemberOut()
        lg = self.logic
        match ev:  # the helpers' fenced questions and the close change nothing else
            case FetchAsked():
                out.reply = lg.answer_fetch(ev.fetch, ev.read_failed)
                return out
            case ChunkAsked():
                out.reply = lg.snapshot_chunk(ev.term, ev.index, ev.snap_term)
                return out
            case MemberClosed():
                self._procs.clear()
                self._out.clear()
                self._readers.clear()
                return out
        match ev:
            case Push():
                if ev.graph:
                    self._graph = (ev.req.term, ev.req.leader_id)
                self._answers(lg.on_push(ev, now_ms), out)
                out.commits_moved = True
            case ClientAppend():
                self.book.admit(ev.bodies, ev.group, ev.target, ev.token, ev.ident,
                                ev.maybe_stored)  # fmt: skip
                out.write_due = self.book.write_due()
            case WriteRound():
                self._write(ev.fast, ev.wall_ms, now_ms, out)
            case RoundsResolved():
                self._resolve(ev.resolution, out)
            case ProcessAnswered():
                self._resume(ev.pid, ev.value, now_ms, out)
            case Tick():
                actions, answers = lg.tick(now_ms)
                self._answers(answers, out)
                self._elector(actions, now_ms, out, rearm=False)  # it is the clock
                self._plans(now_ms, out)
            case ElectionRequest():
                out.reply, actions = lg.handle_election(ev.req, now_ms)
                self._elector(actions, now_ms, out)
            case ElectionAnswer():
                self._elector(
                    lg.on_election_response(ev.peer, ev.req, ev.resp, now_ms), now_ms, out
                )
            case PeerProgress():
                actions = lg.on_peer_progress(ev.peer, ev.term, ev.match_index, now_ms)
                self._elector(actions, now_ms, out, rearm=False)
                if ev.term == lg.leading_term:
                    self._membership_term(ev.term)
                    self.membership.progress(ev.peer, ev.match_index)
                    self._plans(now_ms, out)
            case ChangeMembers():
                self._change(ev, now_ms, out)
            case ClusterView():
                self._cluster(ev, now_ms, out)
            case SpawnDone():
                if self.membership.spawn_done(ev.member, ev.ok, ev.code):
                    out.stop_spawned.append(ev.member)
            case TransferOrder():
                resp, actions = lg.elector.step(TransferOrder(ev.target), now_ms)
                out.reply = (resp, lg.elector.transferring)
                self._elector(actions, now_ms, out)
            case CheckerSetUp():
                out.register = self.round_path.reregister(ev.term)
            case HelperStarted():
                proc = self.supervisor.helper_started(ev.kind, ev.peer, ev.pid, ev.restarted)
                if proc is not None and self.role_queue.restore(proc):
                    self._next_exclusive(now_ms, out)
            case GraphFallback():
                actions = self.round_path.fallback(ev.items)
                if actions:
                    self._start(sv.Process("fallback", _each(actions), exclusive=False),
                                now_ms, out)  # fmt: skip
            case StepDown():
                self._step_down(ev.why, now_ms, out)
            case ReadIndex():
                self._read(ev, now_ms, out)
            case ReadRoundAnswer():
                r = ev.req
                sends, confirmed = self.reads.on_heartbeat_answer(-r.round_id, ev.peer, r.term,
                                                                  ev.resp, now_ms)  # fmt: skip
                self._wake += confirmed
                self._read_rounds(sends, now_ms, out)
            case ExpireReads():
                sends, expired, confirmed = self.reads.expire(now_ms)
                self._wake += [(pid, sv.Failed("no quorum in time", timeout=True))
                               for pid in expired]  # fmt: skip
                self._wake += confirmed
                self._read_rounds(sends, now_ms, out)
            case Deadline():
                if isinstance(self._out.get(ev.pid), Confirm):
                    self._wake.append((ev.pid, sv.Failed("no quorum in time", timeout=True)))
            case _:
                raise TypeError(f"not a member event: {ev!r}")
        latest = self.logic.config_log.latest()
        if latest is not self._config:
            if latest == self._config:
                self._config = latest  # the same one again (a reset names it): nothing to do
            else:
                self._reconfigure(now_ms, out)
        while self._wake:  # confirmations, expiries, readers failed on a step-down
            pid, value = self._wake.pop(0)
            if isinstance(self._out.get(pid), Confirm):
                self._resume(pid, value, now_ms, out)
        # retries waiting on entries in the log: answered once those commit, or failed once
        # the term is over, whichever event of this step did it (a resolution settles them
        # too; this catches the rest, at the cost of one empty-list check a step); appends
        # queued in a term that ended are refused, never written in a later one
        self.book.settle_term()
        self.book.settle_joins()
        if self.book.settled:
            out.settled += self.book.take_settled()
        return out

    def next_tick_ms(self, now_ms: int) -> int:
        """When :class:`Tick` is due next (the elector's next deadline; queued out-of-order
        pushes need the handler's periodic check)."""
        return self.logic.next_tick_ms(now_ms, self.tick_ms)

    # -- its cases ---------------------------------------------------------------------------
    def _answers(self, answers: list, out: MemberOut) -> None:
        if answers:
            out.answers += answers
            out.flush_first = out.flush_first or self.logic.must_flush(answers)
            out.commits_moved = True  # an answer may carry the leader's committed index
            installs = self.logic.handler.installs
            if installs is not None and installs.sealed:  # the machine hears of it next
                sealed = installs.take_sealed()
                self.logic.sealed(sealed)  # (sessions this member lacked come with it)
                out.installed += sealed

    def _elector(self, actions: list, now_ms: int, out: MemberOut, rearm: bool = True) -> None:
        """The elector's actions: messages out, role changes carried out under the role
        lock (one pass brings the helpers in line with the latest role)."""
        out.elector_moved = out.elector_moved or rearm
        if not actions:
            return
        sends, role_changed = MemberLogic.split(actions)
        out.sends += sends
        notes = [a for a in actions if isinstance(a, RoleChange | TransferOutcome)]
        out.notes += notes
        if self._graph is not None and any(self._left_graph(n) for n in notes):
            log.info("[%s] term=%d: leaves the compiled graph of %s (term %d)",
                     self.logic.self_id, self.logic.state.current_term, self._graph[1],
                     self._graph[0])  # fmt: skip
            self._graph = None
            out.leave_graphs = True
        if role_changed and self.role_queue.role_changed():
            self._next_exclusive(now_ms, out)
        if role_changed and self.logic.config_log.latest().learners:
            # a leader keeps dispatchers for the learners too, a follower none: bring them in
            # line after the role change (behind it: a learner's dispatcher starting must
            # not hold up the term's helpers)
            if self.role_queue.reconfigured():
                self._next_exclusive(now_ms, out)

    def _left_graph(self, note: Any) -> bool:
        """Whether a role change takes this member away from the leader whose graph it
        serves: any other role, term or leader (a candidate's, a new term's)."""
        return isinstance(note, RoleChange) and (
            note.role is not Role.FOLLOWER or (note.term, note.leader_id) != self._graph
        )

    def _write(self, fast: bool, wall_ms: int, now_ms: int, out: MemberOut) -> None:
        """Group commit: the queued appends become one store batch and one round."""
        w = self.book.write(wall_ms)
        if w is None:
            return
        out.written = w
        if w.error is None:
            self._start(self.round_path.send(w, fast), now_ms, out)

    def _resolve(self, r: Resolution, out: MemberOut) -> None:
        out.commits_moved = True  # a SUCCESS moves this member's committed index
        finished = self.book.resolve(r)
        if finished:
            out.finished += finished
            out.write_due = out.write_due or self.book.write_due()

    def _step_down(self, why: str, now_ms: int, out: MemberOut) -> None:
        term = self.logic.state.current_term
        actions = self.logic.elector.step(QuitLeadership(), now_ms).actions
        if actions:
            log.error("[%s] term=%d: steps down: %s", self.logic.self_id, term, why)
        self._elector(actions, now_ms, out)

    def _hand_over(self, a: sv.HandOver, now_ms: int, out: MemberOut) -> None:
        """Leave leadership of ``a.term`` to ``a.target``; the elector steps down when the
        transfer cannot start or is given up, so the term ends either way."""
        if a.target is None:
            self._step_down(a.why, now_ms, out)
            return
        log.error("[%s] term=%d: hands leadership to %s: %s", self.logic.self_id, a.term,
                  a.target, a.why)  # fmt: skip
        _, actions = self.logic.elector.step(HandOverOrder(a.target), now_ms)
        self._elector(actions, now_ms, out)

    # -- membership ----------------------------------------------------------------------------
    def _reconfigure(self, now_ms: int, out: MemberOut) -> None:
        """The latest configuration in the log changed (appended, truncated, reset): reads
        count its voters, and under the role lock the helpers follow it (dispatchers for
        the members added, none for those gone, the checker's majority)."""
        self._config = config = self.logic.config_log.latest()
        log.info("[%s] term=%d: acts on configuration voters=%s learners=%s", self.logic.self_id,
                 self.logic.state.current_term, config.voters, config.learners)  # fmt: skip
        sends, confirmed = self.reads.configure(config.voters, now_ms)
        self._wake += confirmed
        self._read_rounds(sends, now_ms, out)
        if self.role_queue.reconfigured():
            self._next_exclusive(now_ms, out)

    def _leads_ready(self) -> bool:
        lg = self.logic
        ready = lg.state.is_leader and lg.ready_term == lg.state.current_term
        if ready:
            self._membership_term(lg.ready_term)
        return ready

    def _membership_term(self, term: int) -> None:
        """Followers' progress is learned again in each term this member leads."""
        if term != self._membership_of:
            self._membership_of = term
            self.membership.reset()

    def _change(self, ev: ChangeMembers, now_ms: int, out: MemberOut) -> None:
        """An operator's change: refused with its code, a hand-over first when this leader
        is to leave, or a configuration entry queued for the next round."""
        lg = self.logic
        if not lg.state.is_leader:
            raise not_leader(lg.state, f"{lg.self_id} does not lead {lg.group!r}")
        current = lg.config_log.latest()
        proposed = self.membership.propose(current, ev.op, ev.member, ev.replaces)
        if not isinstance(proposed, Transfer):
            self.membership.check_live(current, proposed)
        if isinstance(proposed, Transfer):
            lg.admit_config(lg.config_log.latest(), queued=self.book.config_queued)  # in progress?
            resp, actions = lg.elector.step(TransferOrder(proposed.target), now_ms)
            self._elector(actions, now_ms, out)
            raise LedgerError.of(
                ResponseCode.LEADER_TRANSFERRING,
                f"{lg.self_id} is to leave: it hands leadership to {proposed.target} first "
                f"({resp.code.name}); ask the next leader",
                leader_id=proposed.target,
            )
        self.book.admit_config(proposed, ev.token)
        out.write_due = self.book.write_due()

    def _plans(self, now_ms: int, out: MemberOut) -> None:
        """The leader carries on the plans in its configuration (promote a learner that
        caught up, then remove the member it replaces) when no change is in flight."""
        lg = self.logic
        if not self._leads_ready() or self.book.config_queued:
            return
        if lg.config_log.pending(lg.store.committed_index):
            return
        step = self.membership.due(lg.config_log.latest(), lg.store.ledger_end_index)
        if step is None:
            return
        if isinstance(step, Transfer):
            if not lg.elector.transferring:
                _, actions = lg.elector.step(TransferOrder(step.target), now_ms)
                self._elector(actions, now_ms, out)
            return
        try:
            self.book.admit_config(step, None)
        except LedgerError as exc:  # not yet (its term's first entry is not committed)
            log.debug("[%s] membership step waits: %s", lg.self_id, exc)
            return
        out.write_due = out.write_due or self.book.write_due()

    def _cluster(self, ev: ClusterView, now_ms: int, out: MemberOut) -> None:
        """Ray's view of the nodes: members lost long enough get a replacement."""
        lg = self.logic
        if not self._leads_ready() or self.book.config_queued:
            return
        if lg.config_log.pending(lg.store.committed_index):
            return
        stopped = self.membership.stopped_spawns(lg.config_log.latest(), ev.member_nodes)
        if stopped is not None:
            try:
                self.book.admit_config(stopped, None)
            except LedgerError as exc:  # not yet: the next view tries again
                log.debug("[%s] removal of a stopped replacement waits: %s", lg.self_id, exc)
                return
            out.write_due = out.write_due or self.book.write_due()
            return
        spawn = self.membership.lost(lg.config_log.latest(), ev.alive_nodes, ev.member_nodes,
                                     now_ms)  # fmt: skip
        if spawn is not None:
            out.spawns.append(spawn)

    # -- reads -------------------------------------------------------------------------------
    def _read(self, ev: ReadIndex, now_ms: int, out: MemberOut) -> None:
        """A read process: the leader's read index, or a follower asks its leader; a
        ``committed`` read on any member is served at its own committed index."""
        if ev.consistency is Consistency.COMMITTED and not ev.leader_only:
            out.reads_done.append((ev.token, self.logic.store.committed_index))
            return
        path = self.read_path
        if ev.leader_only or self.logic.state.is_leader:
            proc = path.leader_read(ev.consistency, now_ms)
        else:
            proc = path.follower_read(ev.consistency, now_ms)
        pid = next(self._pids)
        self._readers[pid] = ev.token
        self._procs[pid] = proc
        self._advance(pid, proc, self._send(pid, proc, None, out), now_ms, out)

    def _read_rounds(self, sends: list, now_ms: int, out: MemberOut) -> None:
        """Confirmation rounds to send: one heartbeat to every peer, expired after the
        round's time-out."""
        reads = self.reads
        for rnd in sends:
            out.read_pings += [(p, reads.heartbeat(self.logic.group, rnd, p)) for p in reads.others]
            at = now_ms + reads.round_timeout_ms + 1
            out.expire_at_ms = at if out.expire_at_ms is None else min(out.expire_at_ms, at)

    def _send(self, pid: int, proc: sv.Process, answer: sv.Answer | None, out: MemberOut):
        """Resume ``proc``; a read's result (or error) goes to its reader when it ends."""
        if pid not in self._readers:
            return proc.send(answer)
        try:
            return proc.gen.send(answer)  # type: ignore[arg-type]
        except StopIteration as stop:
            result = stop.value
        except LedgerError as exc:
            result = exc
        out.reads_done.append((self._readers.pop(pid), result))
        return None

    # -- processes ---------------------------------------------------------------------------
    def _start(self, proc: sv.Process, now_ms: int, out: MemberOut) -> None:
        pid = next(self._pids)
        self._procs[pid] = proc
        self._advance(pid, proc, proc.start(), now_ms, out)

    def _resume(self, pid: int, value: Any, now_ms: int, out: MemberOut) -> None:
        proc = self._procs.get(pid)
        if proc is None:
            return  # ended meanwhile (the member closed)
        prev = self._out.pop(pid, None)
        if isinstance(prev, sv.Ready) and not prev.watching:  # appends are taken: watch
            self._start(self.supervisor.watch(prev.term), now_ms, out)  # the helpers
        self._advance(pid, proc, self._send(pid, proc, sv.Answer(now_ms, value), out), now_ms, out)

    def _advance(self, pid: int, proc: sv.Process, action, now_ms: int,
                 out: MemberOut) -> None:  # fmt: skip
        """Carry out the actions that need no transport, hand out the first that does."""
        while action is not None:
            value = None
            match action:
                case sv.Finish():
                    self._resolve(Resolution(-1, None, list(action.outcomes)), out)
                case sv.GiveUpLeadership():
                    self._step_down(action.why, now_ms, out)
                case sv.HandOver():
                    self._hand_over(action, now_ms, out)
                case sv.Watch():
                    self._start(self.supervisor.watch(action.term), now_ms, out)
                case sv.Beside():
                    self._start(action.process, now_ms, out)
                case sv.Queue():
                    if self.role_queue.restore(action.process):
                        self._next_exclusive(now_ms, out)
                case sv.FailReaders():  # leadership ended: readers waiting on it fail
                    self._wake += [
                        (p, sv.Failed("leadership ended")) for p in self.reads.step_down()
                    ]
                case WaitCommitted() if self.logic.store.committed_index >= action.index:
                    value = True  # already there: no wait
                case Confirm():  # join the next confirmation round (or the one that ends now)
                    sends, confirmed = self.reads.request(action.term, action.index, pid, now_ms)
                    self._out[pid] = action
                    self._wake += confirmed
                    self._read_rounds(sends, now_ms, out)
                    out.deadlines.append((pid, action.deadline_ms))
                    return
                case _:
                    self._out[pid] = action
                    out.run.append(Run(pid, proc.name, action))
                    return
            action = self._send(pid, proc, sv.Answer(now_ms, value), out)
        del self._procs[pid]
        if proc.exclusive:
            self._next_exclusive(now_ms, out)

    def _next_exclusive(self, now_ms: int, out: MemberOut) -> None:
        proc = self.role_queue.next()
        if proc is not None:
            self._start(proc, now_ms, out)


def answer_fetch(step: Callable[[MemberEvent], MemberOut], store: Any, f: Fetch) -> Any:
    """The member's whole answer to fetch ``f`` of one of its dispatchers, for every
    transport: the core's fenced answer (``step``, under the member's lock), and for
    entries the read outside it -- ``(batch, info)``, or ``(None, info)`` when they were
    compacted away meanwhile (the dispatcher learns our begin)."""
    answer = step(FetchAsked(f)).reply
    if not isinstance(answer, EntriesRead):
        return answer
    try:
        return store.read_batch(answer.start, answer.max_bytes, answer.max_count), answer.info
    except LedgerError:
        return step(FetchAsked(f, read_failed=True)).reply


def _each(actions: list) -> Generator[Any, Any, None]:
    """A process of one-way actions (their answers are sent in, so not ``yield from``)."""
    for a in actions:  # noqa: UP028
        yield a
