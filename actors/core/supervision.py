"""Taking and leaving office, and the supervision of a leader's helpers (sans-I/O).

Every decision of a role change lives here: what stopping a term does and in which order,
how long each helper call may take, when a new leader's helpers count as hung and are
replaced, how long it waits for helpers that are still booting, when it hands leadership
on instead of holding it with heartbeats while no append can commit, and how a helper Ray
restarted is set up again.  No Ray, no asyncio, no clock.

Each of these is a *process*: a generator that yields one action at a time and is resumed
with its answer (:class:`Answer`: the time, and the action's result -- a timeout is an
answer too).  The transport only performs actions: the Ray member
(:mod:`rayledger.actors.member.leadership`) with actor calls, executors and tasks, a test or the
simulation with whatever it models.  Processes that change the helpers' setup
(:meth:`Supervisor.role_changes`, :meth:`Supervisor.helper_started`) hold the role lock:
they run one at a time, in order (:attr:`Process.exclusive`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import Any

from rayledger.actors.core.member_logic import MemberLogic, StartLeading, StopLeading
from rayledger.actors.core.rounds import RoundBook
from rayledger.replication.messages import LeaderInfo
from rayledger.storage import ResponseCode

log = logging.getLogger("rayledger.actors")

HELPER_START_MS = 30_000  # how long a new leader waits for helpers that are still starting
RETRY_MS = (50, 500)  # between tries to set the helpers up: first, largest

HelperKey = tuple[str, str | None]  # ("checker", None) or ("dispatcher", peer)
CHECKER: HelperKey = ("checker", None)


class Failed:
    """An action's call failed or timed out (``why`` says how)."""

    __slots__ = ("why", "timeout")

    def __init__(self, why: str, timeout: bool = False):
        self.why, self.timeout = why, timeout

    def __repr__(self) -> str:
        return f"Failed({self.why!r})"


@dataclass(frozen=True, slots=True)
class Answer:
    now_ms: int
    value: Any = None


# -- actions (each is answered; effects are answered with None) ----------------------------
@dataclass(frozen=True, slots=True)
class MachineRole:
    """Tell the state-machine runner the role and term (before it is asked to be ready)."""

    term: int


@dataclass(frozen=True, slots=True)
class FailReaders:
    """Reads waiting on this leader fail NOT_LEADER."""


@dataclass(frozen=True, slots=True)
class FastStop:
    """Leave the compiled path."""


@dataclass(frozen=True, slots=True)
class CheckerStepDown:
    """``checker.step_down(new_term)`` within ``timeout_ms``; answered with its outcomes
    (a list) or :class:`Failed`."""

    new_term: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Finish:
    """Rounds ended with these outcomes ((token, code) pairs)."""

    outcomes: list


@dataclass(frozen=True, slots=True)
class DeactivateDispatchers:
    """``deactivate(term)`` on every dispatcher, waiting ``timeout_ms`` at most; answered
    with how many did not answer in time."""

    term: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Flush:
    """Flush the store (off the loop); answered None or :class:`Failed`."""


@dataclass(frozen=True, slots=True)
class SetUpHelpers:
    """Set the helpers up for ``term`` (all, or ``only`` the checker or one dispatcher):
    the checker's dispatchers, ``become_leader``, the rounds of the term again, then the
    dispatchers' faults and ``activate``; answered None or :class:`Failed`."""

    term: int
    start: int
    info: LeaderInfo
    timeout_ms: int
    only: str | None = None


@dataclass(frozen=True, slots=True)
class Ping:
    """Ask each helper of ``keys`` for its pid within ``timeout_ms``; answered with a dict
    key -> "ok" | "error" (dead: Ray restarts it) | "timeout" (no answer: hung)."""

    keys: tuple[HelperKey, ...]
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Replace:
    """Kill these helpers' processes (by pid where known) so that Ray starts them again."""

    term: int
    keys: tuple[HelperKey, ...]
    pids: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class HandOver:
    """Leave leadership of ``term`` to ``target`` (the elector steps down when the
    transfer cannot start or is given up); ``target`` None: step down at once."""

    term: int
    target: str | None
    why: str


@dataclass(frozen=True, slots=True)
class GiveUpLeadership:
    why: str


@dataclass(frozen=True, slots=True)
class Sleep:
    ms: int


MACHINE_STRANDED = "stranded"
"""``WaitMachine``'s answer when the machine stands below the log's begin: it needs a
snapshot that only another member's leader sends it."""


@dataclass(frozen=True, slots=True)
class WaitMachine:
    """Wait until the state machine has applied what this leader committed before; answered
    True, False when the term ended meanwhile, or :data:`MACHINE_STRANDED`."""

    term: int


@dataclass(frozen=True, slots=True)
class Watch:
    """Start watching the term's helpers (:meth:`Supervisor.watch`) before the term is
    ready (a leader that first waits for its state machine)."""

    term: int


@dataclass(frozen=True, slots=True)
class Beside:
    """Start ``process`` beside this one, outside the role lock (answered None at once)."""

    process: Process


@dataclass(frozen=True, slots=True)
class Queue:
    """Queue ``process`` for the role lock behind what waits there (answered None at once)."""

    process: Process


@dataclass(frozen=True, slots=True)
class Ready:
    """The term's helpers work: appends are taken; start the compiled path (``fast``) and,
    unless ``watching`` already (:class:`Watch`), watch the helpers
    (:meth:`Supervisor.watch`)."""

    term: int
    fast: bool
    watching: bool = False


@dataclass(frozen=True, slots=True)
class Helpers:
    """The members of the configuration changed: keep exactly one dispatcher per
    member in ``peers`` other than this one -- create those added, stop and drop those gone --
    and tell the checker the dispatchers.  ``start``: helpers not started yet (a promoted
    learner's, see :meth:`Supervisor.runs_helpers`) start now.  ``background``: a learner,
    which catches up on CPU the voters leave (priority.py).  Answered None."""

    peers: tuple[str, ...]
    start: bool = True
    background: bool = False


@dataclass(frozen=True, slots=True)
class CheckerConfigure:
    """The checker of ``term`` counts the voters of ``info.configs``' latest from now on;
    answered None or :class:`Failed`."""

    term: int
    info: LeaderInfo
    timeout_ms: int


Action = (
    MachineRole | FailReaders | FastStop | CheckerStepDown | Finish | DeactivateDispatchers | Flush
    | SetUpHelpers | Ping | Replace | HandOver | GiveUpLeadership | Sleep | Watch | Beside | Queue
    | WaitMachine | Ready | Helpers | CheckerConfigure
)  # fmt: skip


@dataclass(eq=False)
class Process:
    """A running decision: resume it with :meth:`send`; ``exclusive`` ones hold the role
    lock."""

    name: str
    gen: Generator[Action, Answer, None]
    exclusive: bool

    def start(self) -> Action | None:
        return self.send(None)

    def send(self, answer: Answer | None) -> Action | None:
        """The next action, or None when the process ended."""
        try:
            return self.gen.send(answer)  # type: ignore[arg-type]
        except StopIteration:
            return None


class Supervisor:
    """The member's side of its helpers: role changes carried out, helpers watched.

    ``logic`` and ``book`` are the member's cores (read under the member's lock, which the
    transport holds while it resumes a process).  ``sync`` is the store's sync_flush: a new
    leader flushes its term's first entry before its checker may count it.
    """

    def __init__(
        self,
        logic: MemberLogic,
        book: RoundBook,
        peers: list[str],
        rpc_timeout_ms: int,
        heartbeat_timeout_ms: int,
        sync: bool = False,
        machine: bool = False,
        fast_path: bool = False,
    ):
        self.logic = logic
        self.book = book
        self.self_id = logic.self_id
        self.peers = list(peers)
        self.rpc_ms = rpc_timeout_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.sync = sync
        self.machine = machine
        self.fast_path = fast_path and len(self.peers) > 1
        self.pids: dict[HelperKey, int] = {}
        # helpers that answered a call: started, whether or not their "I started" is in yet
        self.heard: set[HelperKey] = set()
        self.watches = 0  # watches begun: a newer one ends the older (see _watch)
        self.has_led = False  # helpers start with this member's first term (runs_helpers)
        # where its sessions were unknown when it last handed over for lacking them: it
        # does so once, then leads anyway (the others may lack them too, :meth:`_lacks`)
        self.lacking_handed = -1
        self.peers = [self.self_id, *self.dispatcher_peers()]  # those it keeps helpers for

    # -- helpers and their timing ------------------------------------------------------------
    def keys(self) -> tuple[HelperKey, ...]:
        return (CHECKER, *(("dispatcher", p) for p in self.peers if p != self.self_id))

    def helper_wait_ms(self) -> int:
        """How long a leader waits for a helper before it hands leadership on: one election
        timeout (at least two RPC timeouts, so one slow call is not a lost helper), or
        ``HELPER_START_MS`` while a helper has never started (at a member's start its
        helpers' processes may still be coming up: not dead, just new).  A helper has
        started once it said so (:meth:`helper_started`) or answered a call: on Ray its "I
        started" is unordered with the member's calls to it and may come later (CI, stop
        33), and a helper that hangs meanwhile must not be waited for as if it booted."""
        return max(self.wait_for(k) for k in self.keys())

    def wait_for(self, key: HelperKey) -> int:
        """How long helper ``key`` may stay silent: the steady wait once it has started."""
        return self.steady_wait_ms() if self.started(key) else HELPER_START_MS

    def started(self, key: HelperKey) -> bool:
        """Whether helper ``key`` has started: it said so, or answered a call."""
        return key in self.pids or key in self.heard

    def steady_wait_ms(self) -> int:
        """The helper wait once every helper has started (:meth:`helper_wait_ms`)."""
        return max(self.heartbeat_timeout_ms, 2 * self.rpc_ms)

    def hand_over(self, term: int, why: str) -> HandOver:
        """To whom a leader that cannot replicate leaves ``term`` (a fixed choice per term,
        so members do not all pick the same peer; a voter: a learner cannot lead)."""
        others = [p for p in self.logic.state.voters if p != self.self_id]
        return HandOver(term, others[term % len(others)] if others else None, why)

    # -- processes ---------------------------------------------------------------------------
    def role_changes(self) -> Process:
        """Bring the helpers in line with the role (``MemberLogic.leadership``)."""
        return Process("role", self._role_changes(), exclusive=True)

    def _role_changes(self) -> Generator[Action, Answer, None]:
        try:
            changes = self.logic.leadership()
        except Exception as exc:  # the term's empty entry was not written (LedgerError, OSError)
            yield GiveUpLeadership(f"its term's first entry could not be written: {exc}")
            return
        if self.machine:  # before it is asked whether it is ready
            yield MachineRole(self.logic.state.current_term)
        for change in changes:
            if isinstance(change, StopLeading):
                yield from self._stop_leading(change)
            else:
                yield from self._start_leading(change)

    def _stop_leading(self, change: StopLeading) -> Generator[Action, Answer, None]:
        """Stop the helpers of ``change.term``.  Each call waits one RPC timeout at most: a
        hung helper (a SIGSTOPped process Ray does not restart) must not hold the role lock,
        or this member could never take office again.  A helper that did
        not answer is harmless: it serves an old term, and every answer to it is fenced."""
        yield FailReaders()
        yield FastStop()
        answer = yield CheckerStepDown(change.new_term, self.rpc_ms)
        if isinstance(answer.value, Failed):
            log.warning("[%s] term=%d: checker step_down failed: %s", self.self_id,
                        change.new_term, answer.value.why)  # fmt: skip
        else:
            yield Finish(answer.value)
        # whatever the checker did not answer ends here: the outcome is unknown
        yield Finish(
            [(rid, ResponseCode.TERM_CHANGED) for rid, _ in self.book.of_term(change.term)]
        )
        late = (yield DeactivateDispatchers(change.term, self.rpc_ms)).value
        if late:
            log.warning("[%s] term=%d: %d dispatcher(s) did not stop within %d ms",
                        self.self_id, change.new_term, late, self.rpc_ms)  # fmt: skip

    def _start_leading(self, change: StartLeading) -> Generator[Action, Answer, None]:
        """Set the helpers up for the new term, trying again while they restart.  After a
        try that fails, a helper that has started before (:meth:`started`) and answers no
        ping is hung: it is replaced at once (once) and gets one more steady helper wait.  A
        leader that cannot get its helpers working hands leadership on, after the helper
        wait (``HELPER_START_MS`` while a helper has never started: at a member's first term
        they may still be booting).  Each try waits one RPC timeout, or -- while no helper
        has started yet -- the whole wait: a hung helper that started must not be waited
        for as if it were booting (a checker hung before its member's first term, with new
        dispatchers still booting)."""
        term, info = change.term, change.info
        if self.sync:  # the term's first entry is on disk before we count ourselves
            flushed = yield Flush()
            if isinstance(flushed.value, Failed):
                yield GiveUpLeadership(
                    f"its term's first entry could not be flushed: {flushed.value.why}"
                )
                return
            info = replace(info, water_mark=self.logic.water_mark())  # now it may count
        if not self.has_led:  # its first term: its helpers start now (runs_helpers)
            self.has_led = True
            self.peers = [self.self_id, *self.dispatcher_peers()]
        now = (yield Sleep(0)).now_ms
        give_up = now + self.helper_wait_ms()
        replaced: set[HelperKey] = set()
        delay = RETRY_MS[0]
        while True:
            booting = not any(self.started(k) for k in self.keys())
            budget = max(give_up - now, self.rpc_ms) if booting else self.rpc_ms
            done = yield SetUpHelpers(term, change.term_start_index, info, budget)
            now = done.now_ms
            if not isinstance(done.value, Failed):
                self.heard.update(self.keys())
                self._checker_counts(term, info)
                break
            log.error("[%s] term=%d: helpers did not start: %s", self.self_id, term,
                      done.value.why)  # fmt: skip
            if not self.logic.leads(term):
                return
            pinged = yield Ping(self.keys(), self.rpc_ms)
            now = pinged.now_ms
            self._hear(pinged.value)
            # silent and started: hung (a dead one, an error, is being restarted by Ray)
            hung = tuple(k for k, how in pinged.value.items()
                         if how == "timeout" and self.started(k) and k not in replaced)  # fmt: skip
            if hung:
                replaced.update(hung)
                yield self._replace(term, hung)
                give_up = max(give_up, now + self.steady_wait_ms())
            if now > give_up:
                if self.logic.leads(term):
                    yield self.hand_over(term, "its helpers did not start")
                return
            now = (yield Sleep(delay)).now_ms
            delay = min(delay * 2, RETRY_MS[1])
        if self.machine:
            # the machine catches up through commits, which need the helpers: watch them
            # meanwhile, or one that hangs now keeps this leader waiting (never ready, its
            # heartbeats holding the others off) for good -- the simulation found it.  The
            # wait leaves the role lock: a helper Ray restarted meanwhile is set up again
            # under it (:meth:`helper_started`), and the commits wait for that helper
            yield Watch(term)
            yield Beside(Process("machine-wait", self._wait_machine(term), exclusive=False))
            return
        yield from self._ready(term)

    def _wait_machine(self, term: int) -> Generator[Action, Answer, None]:
        """A new leader waits for its machine, then takes appends -- for as long as it holds
        the term's office (a moment as a candidate, elected again in the same term, runs
        no role change: given up then, it would lead that term never ready, its heartbeats
        holding the others off; the all-features simulation found it)."""
        while self.logic.holds_office(term):
            ready = (yield WaitMachine(term)).value
            if ready == MACHINE_STRANDED and self.logic.leads(term):
                # it can never catch up as leader: hand over, and the next leader sends it
                # the snapshot it asks for
                yield self.hand_over(term, "its state machine waits for a snapshot")
                return
            if self._lacks_sessions() and self.logic.leads(term):
                yield self.hand_over(term, "it lacks the client sessions of a snapshot")
                return
            if ready is True and self.logic.mark_ready(term):
                log.info("[%s] term=%d: ready to take appends", self.self_id, term)
                yield Ready(term, self.fast_path, watching=self.machine)
                return
            yield Sleep(RETRY_MS[0])

    def _lacks_sessions(self) -> bool:
        """Whether a new leader hands over for lacking client sessions: the ones of entries
        below its log's begin (its snapshot there was damaged), with no stamp in its log
        after them, so that it would refuse every idempotent append
        (``SessionTable.bounded``).  Only once for the same lack: when the others lack
        them too, handing over again and again would leave the group with no leader; it
        leads then, refusing only the new sessions it cannot tell from the lacked ones."""
        sessions = self.logic.sessions
        if sessions.unknown_upto < 0 or sessions.unknown_bound is not None:
            return False
        if self.lacking_handed == sessions.unknown_upto:
            return False
        self.lacking_handed = sessions.unknown_upto
        return True

    def _ready(self, term: int) -> Generator[Action, Answer, None]:
        if self.logic.mark_ready(term):
            log.info("[%s] term=%d: ready to take appends", self.self_id, term)
            yield Ready(term, self.fast_path, watching=self.machine)

    def runs_helpers(self) -> bool:
        """Whether this member keeps a checker and a dispatcher per member.

        A voter does from the first time it takes office (:meth:`_start_leading` starts
        them), and keeps them while it follows, ready for its next term.  Until then it runs
        none: in a steady group only the leader's helpers do any work, and a follower's
        three idle processes doubled the group's processes, memory and idle CPU.
        The price is paid once per member, in its first election: about a second of process
        start before its first round.  A learner runs none either (it cannot lead; its
        catch-up should cost the voters' rounds as little as possible), nor a member its
        latest configuration leaves out (a learner whose reset carried the configuration
        from before it was added, until its own entry arrives).  A promoted learner starts
        them when it first takes office."""
        return self.has_led and self.is_voter()

    def is_voter(self) -> bool:
        return self.logic.config_log.latest().is_voter(self.self_id)

    def dispatcher_peers(self) -> tuple[str, ...]:
        """The members this one keeps a dispatcher for: none on a learner (see
        :meth:`runs_helpers`), the other voters on a follower -- ready for when it leads --
        and every other member on a leader.  A follower keeps none for a learner: it would
        be one more process starting on each follower's host as the learner joins, for a
        term that may never come; a follower that takes office starts them after it is
        ready (:meth:`MemberCore` queues a reconfiguration behind the role change)."""
        if not self.runs_helpers():
            return ()
        config = self.logic.config_log.latest()
        leads = self.logic.leads(self.logic.leading_term)
        return tuple(p for p in config.members
                     if p != self.self_id and (leads or not config.is_learner(p)))  # fmt: skip

    def reconfigure(self) -> Process:
        """Bring the helpers in line with the latest configuration (under the role lock)."""
        return Process("reconfigure", self._reconfigure(), exclusive=True)

    def _reconfigure(self) -> Generator[Action, Answer, None]:
        """Dispatchers for the members added, none for those gone, on any member (a
        follower's are ready for when it leads); a leader's checker counts the new voters,
        and the dispatchers added are set up for its term (waiting for them to boot, like a
        new term's).  A leader on the compiled path leaves it (its graph has the old
        followers) and starts it again."""
        peers = list(self.dispatcher_peers())
        added = [p for p in peers if p not in self.peers]
        for gone in [p for p in self.peers if p not in peers and p != self.self_id]:
            self.pids.pop(("dispatcher", gone), None)
            self.heard.discard(("dispatcher", gone))
        self.peers = [self.self_id, *peers]
        term = self.logic.leading_term
        leads = self.logic.leads(term)
        ready = leads and self.logic.ready_term == term
        if ready and self.fast_path:
            yield FastStop()  # before a dispatcher in its graph stops
        yield Helpers(tuple(peers), self.runs_helpers(), background=not self.is_voter())
        if not leads or not self.logic.leads(term):
            return
        info = self.logic.leader_info()
        answer = yield CheckerConfigure(term, info, self.rpc_ms)
        if isinstance(answer.value, Failed):  # a restarted checker is set up again whole
            log.warning("[%s] term=%d: checker not reconfigured: %s", self.self_id, term,
                        answer.value.why)  # fmt: skip
        elif answer.value is not False:
            self._checker_counts(term, info)
        give_up = (yield Sleep(0)).now_ms + HELPER_START_MS
        yield from self._set_up_added(term, tuple(added), give_up)
        if ready and self.fast_path and self.logic.leads(term):
            yield Ready(term, self.fast_path, watching=True)

    def _set_up_added(
        self, term: int, peers: tuple[str, ...], give_up: int
    ) -> Generator[Action, Answer, None]:
        """Set the dispatchers added for ``peers`` up for ``term``, one try each (under the
        role lock).  Those still booting -- seconds on Ray -- are tried again later, each
        time queued for the lock anew: a helper restored, or a role change, must not wait
        behind a boot (the all-features simulation: a restarted checker left unset behind
        a booting dispatcher, the term's rounds unanswered)."""
        left = []
        for peer in peers:
            if not self.logic.holds_office(term) or peer not in self.peers:
                continue
            if not self.logic.leads(term):  # a candidate for a moment: tried once it leads
                left.append(peer)
                continue
            done = yield SetUpHelpers(term, self.logic.term_start_index, self.logic.leader_info(),
                                 self.rpc_ms, peer)  # fmt: skip
            if not isinstance(done.value, Failed):
                self.heard.add(("dispatcher", peer))
            elif done.now_ms > give_up:  # the watch replaces it, or hands leadership on
                log.error("[%s] term=%d: dispatcher for %s did not start: %s",
                          self.self_id, term, peer, done.value.why)  # fmt: skip
            else:
                left.append(peer)
        if left and self.logic.holds_office(term):
            later = self._set_up_later(term, tuple(left), give_up)
            yield Beside(Process("dispatcher-boot", later, exclusive=False))

    def _set_up_later(
        self, term: int, peers: tuple[str, ...], give_up: int
    ) -> Generator[Action, Answer, None]:
        """Queue the set-up again after a pause, once this member leads: a moment as a
        candidate, elected again in the same term, runs no role change to set them up (the
        all-features simulation: a learner's dispatcher never set up, the learner never
        caught up)."""
        yield Sleep(RETRY_MS[1])
        while self.logic.holds_office(term):
            if self.logic.leads(term):
                setup = self._set_up_added(term, peers, give_up)
                yield Queue(Process("dispatcher-setup", setup, exclusive=True))
                return
            yield Sleep(RETRY_MS[0])

    def _checker_counts(self, term: int, info: LeaderInfo) -> None:
        """The checker of ``term`` was set up or configured from ``info``: it counts the
        voters of the latest configuration ``info`` holds."""
        self.logic.checker_counts(term, info.configs[-1][0])

    def _hear(self, pings: dict[HelperKey, str]) -> None:
        self.heard.update(k for k, how in pings.items() if how == "ok")

    def _replace(self, term: int, keys: tuple[HelperKey, ...]) -> Replace:
        for kind, peer in keys:
            log.error("[%s] term=%d: replaces its hung %s helper %s (pid %s)", self.self_id,
                      term, kind, peer or "", self.pids.get((kind, peer)))  # fmt: skip
        return Replace(term, keys, tuple(self.pids.get(k) for k in keys))

    def _may_replace(self, term: int) -> bool:
        """Whether the watch of ``term`` replaces its silent helpers now: while the term's
        office is this member's, also as a candidate for a moment in it -- waiting for a
        ping to end while it leads again cost a ping's whole wait each time, seconds of
        rounds unanswered behind a hung checker while its heartbeats came and went."""
        return self.logic.holds_office(term)

    def watch(self, term: int) -> Process:
        """While this member leads ``term``, ask each helper for its pid every quarter of
        the steady helper wait (:meth:`steady_wait_ms`).  A killed helper is restarted by
        Ray and set up again (:meth:`helper_started`); one that answers nothing for its
        whole wait (:meth:`wait_for`: a hung process, or one Ray could not restart) is
        replaced and costs the leadership, which the leader hands on rather than holding it
        with heartbeats while no append can commit."""
        self.watches += 1
        return Process("watch", self._watch(term, self.watches), exclusive=False)

    def _watch(self, term: int, gen: int) -> Generator[Action, Answer, None]:
        """Runs while ``term``'s leadership lasts (``leading_term``), not only while this
        member is leader: a leader that steps down and is elected again in the same term
        before its role change runs keeps the term's helpers and gets no new watch -- the
        simulation found such a leader behind a hung checker, its rounds unanswered for
        good (so a hand-over does not end it either).  Each helper's
        silence counts from when it was first asked (a dispatcher added meanwhile) and
        ends with it (one removed)."""
        now = (yield Sleep(0)).now_ms
        answered = {k: now for k in self.keys()}
        while self.logic.leading_term == term and gen == self.watches:
            # a ping may take up to the steady wait: a helper slow on a loaded machine answers
            # late, and only one that answers nothing for the whole wait is lost.  A helper
            # that has not started yet (a dispatcher just added) may take HELPER_START_MS,
            # counted for it alone: the ping does not wait that long for the others (in the
            # simulation a checker hung during such a ping went unnoticed for 30 s), and the
            # others' wait is asked again each time (a helper's "I started" may arrive after
            # its term's setup answered)
            wait_ms = self.steady_wait_ms()
            keys = self.keys()
            pinged = yield Ping(keys, wait_ms)
            now = pinged.now_ms
            self._hear(pinged.value)
            for k, how in pinged.value.items():
                if how == "ok":
                    answered[k] = now
            silent = tuple(k for k in keys if now - answered.setdefault(k, now) >= self.wait_for(k))
            if silent and self._may_replace(term):
                kind, peer = silent[0]
                yield self._replace(term, silent)
                if self.logic.leads(term):
                    yield self.hand_over(term, f"its {kind} {peer or ''} answered nothing "
                                               f"for {now - answered[silent[0]]} ms")  # fmt: skip
                # the hand-over ends the term (transferred, or stepped down) -- unless this
                # member is elected again in it: then watch on, the new processes afresh
                answered.update(dict.fromkeys(silent, now))
            yield Sleep(wait_ms // 4)

    def helper_started(
        self, kind: str, peer: str | None, pid: int, restarted: bool = False
    ) -> Process | None:
        """Every helper says so when its process starts, and whether Ray ``restarted`` it
        after its process died: then it is set up again for the term this member leads (a
        restarted checker also needs the rounds in flight, which
        :meth:`RoundPath.reregister` gives it again, and every follower's water mark, which
        each dispatcher set up again in the same term reports at once).  The helper says
        which, rather than the member telling by a second pid: a first process's report
        may arrive after its restart's, or never -- the simulation saw a restart taken for
        a first start, and that dispatcher served no term again."""
        key = (kind, peer)
        known = self.pids.get(key)
        if not restarted:  # a first process: nothing to set up again
            self.pids.setdefault(key, pid)  # (known: its restart's report came first)
            return None
        self.pids[key] = pid
        if known == pid:
            return None
        log.warning("[%s] %s helper restarted (%s), pid %d", self.self_id, kind, peer or "", pid)
        return Process("restore", self._restore(kind, peer), exclusive=True)

    def _restore(self, kind: str, peer: str | None) -> Generator[Action, Answer, None]:
        term = self.logic.leading_term
        if not self.logic.leads(term) or (kind != "checker" and peer not in self.peers):
            return  # (a dispatcher for a member removed meanwhile: nothing to set up)
        start, info = self.logic.term_start_index, self.logic.leader_info()
        yield FastStop()
        # the helper is up (it called us): within an election timeout, or hand over
        now = (yield Sleep(0)).now_ms
        give_up = now + self.helper_wait_ms()
        only = kind if kind == "checker" else peer
        while self.logic.leads(term):
            done = yield SetUpHelpers(term, start, info, self.rpc_ms, only)
            if not isinstance(done.value, Failed):
                if only == "checker":
                    self._checker_counts(term, info)
                return
            log.error("[%s] term=%d: helper not restored: %s", self.self_id, term,
                      done.value.why)  # fmt: skip
            if done.now_ms > give_up:
                if self.logic.leads(term):
                    yield self.hand_over(term, f"its {kind} helper could not be restored")
                return
            yield Sleep(100)


class RoleQueue:
    """The role lock's queue (kept by :class:`~.member.MemberCore`): the exclusive
    processes run one at a time; a role change -- coalesced, since
    one pass of :meth:`Supervisor.role_changes` brings the helpers in line with the latest
    role -- goes before the helper restores and set-ups waiting, which run in order, and
    those before a reconfiguration (coalesced too)."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.busy = False
        self._again = False
        self._reconfigure = False
        self._waiting: list[Process] = []

    def role_changed(self) -> bool:
        """The role may have changed; True when the caller must start running (:meth:`next`)."""
        self._again = True
        return self._claim()

    def reconfigured(self) -> bool:
        """The configuration changed (coalesced: one pass follows the latest); True when
        the caller must start running."""
        self._reconfigure = True
        return self._claim()

    def restore(self, proc: Process) -> bool:
        """A helper restore waits its turn; True when the caller must start running."""
        self._waiting.append(proc)
        return self._claim()

    def _claim(self) -> bool:
        if self.busy:
            return False
        self.busy = True
        return True

    def next(self) -> Process | None:
        """The next process to run under the lock, or None (the lock is free again).  A
        restarted helper's restore goes before a reconfiguration: the term's commits wait
        for it."""
        if self._again:
            self._again = False
            return self.supervisor.role_changes()
        if self._waiting:
            return self._waiting.pop(0)
        if self._reconfigure:
            self._reconfigure = False
            return self.supervisor.reconfigure()
        self.busy = False
        return None
