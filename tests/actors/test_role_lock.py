"""The role lock (actors/core/supervision.py, sans-I/O): what waits for it, and in which order.

A dispatcher added by a configuration change boots for seconds on Ray; its set-up must not
hold the lock meanwhile, and a helper Ray restarted must be set up again before a
reconfiguration: the term's commits wait for it."""

from __future__ import annotations

from collections.abc import Iterator

from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.rounds import RoundBook
from rayledger.actors.core.supervision import (
    Answer,
    Beside,
    CheckerConfigure,
    Failed,
    Helpers,
    Process,
    Queue,
    RoleQueue,
    SetUpHelpers,
    Sleep,
    Supervisor,
)
from rayledger.election import MemoryTermStore
from rayledger.election.configuration import Configuration
from rayledger.replication import ReplicationConfig
from rayledger.storage import MemoryStore, StoreConfig


def elected(machine: bool = False) -> Supervisor:
    """The supervisor of n0, just elected leader of term 3 of {n0, n1, n2} (its role change
    not run yet); ``machine``: it runs a state machine."""
    cfg = LedgerConfig.fast()
    peers = ["n0", "n1", "n2"]
    store = MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 << 10))
    logic = MemberLogic("g", "n0", peers, store, cfg.election, ReplicationConfig(),
                        MemoryTermStore(term=3))  # fmt: skip
    sup = Supervisor(logic, RoundBook(logic), peers, cfg.rpc_timeout_ms,
                     cfg.election.heartbeat_timeout_ms, machine=machine)  # fmt: skip
    logic.state.change_to_leader(3)
    return sup


def _leader() -> Supervisor:
    """n0 leads term 3 of {n0, n1, n2}, its helpers set up; then n3 is added."""
    sup = elected()
    logic = sup.logic
    proc = sup.role_changes()
    action = proc.start()
    while action is not None:
        action = proc.send(Answer(0, None))
    added = Configuration(voters=("n0", "n1", "n2"), learners=("n3",), next_id=4)
    logic.config_log.appended(logic.store.ledger_end_index + 1, added)  # its entry, written
    return sup


def _run(proc: Process, answer) -> list:
    """Every action of ``proc``, each answered by ``answer(action)``."""
    actions, action = [], proc.start()
    while action is not None:
        actions.append(action)
        action = proc.send(answer(action))
    return actions


def test_a_booting_dispatcher_is_set_up_later_outside_the_lock() -> None:
    sup = _leader()
    booting = True
    clock = iter(range(100, 1 << 30, 100))  # each answer 100 ms later: every wait ends

    def answer(a):
        if isinstance(a, SetUpHelpers) and a.only == "n3" and booting:
            return Answer(next(clock), Failed("no answer in time", timeout=True))
        return Answer(next(clock), None)

    actions = _run(sup.reconfigure(), answer)
    assert any(isinstance(a, Helpers) and "n3" in a.peers for a in actions)
    assert any(isinstance(a, CheckerConfigure) for a in actions)
    installs = [a for a in actions if isinstance(a, SetUpHelpers)]
    assert [a.only for a in installs] == ["n3"]  # one try under the lock, no wait
    later = actions[-1]
    assert isinstance(later, Beside) and not later.process.exclusive
    # beside the lock: a pause, then the set-up queued for the lock anew
    waits = _run(later.process, lambda a: Answer(700, None))
    assert isinstance(waits[0], Sleep) and isinstance(waits[-1], Queue)
    again = waits[-1].process
    assert again.exclusive
    booting = False
    tried = _run(again, answer)
    assert [a.only for a in tried if isinstance(a, SetUpHelpers)] == ["n3"]
    assert not any(isinstance(a, Beside) for a in tried)  # set up: nothing more
    assert ("dispatcher", "n3") in sup.heard


def test_a_restarted_helpers_restore_goes_before_a_reconfiguration() -> None:
    sup = _leader()
    queue = RoleQueue(sup)
    assert queue.reconfigured()  # the caller runs: the lock was free
    first = queue.next()
    assert first.name == "reconfigure"
    queue.reconfigured()  # another change while it runs
    restore = sup.helper_started("checker", None, 7, restarted=True)
    assert restore is not None and not queue.restore(restore)  # waits its turn
    assert queue.next() is restore
    assert queue.next().name == "reconfigure"
    assert queue.next() is None and not queue.busy


def test_a_leader_elected_again_in_its_term_goes_on_waiting_for_its_machine() -> None:
    """A moment as a candidate, elected again in the same term, runs no role change: the
    wait for the machine must go on, or the member leads that term never ready, its
    heartbeats holding the others off."""
    from rayledger.actors.core.supervision import Ready, WaitMachine

    sup = _leader()
    sup.machine = True
    logic = sup.logic
    logic.ready_term = -1
    state = logic.state
    answers = iter([False, True])

    def answer(a):
        if isinstance(a, WaitMachine):
            got = next(answers)
            if not got:  # the blip: a candidate while the machine was asked
                state.change_to_candidate(3)
            else:
                state.change_to_leader(3)
            return Answer(100, got)
        return Answer(100, None)

    actions = _run(Process("machine-wait", sup._wait_machine(3), exclusive=False), answer)
    assert [type(a) for a in actions].count(WaitMachine) == 2
    assert isinstance(actions[-1], Ready) and logic.ready_term == 3


def _booting_n3(sup: Supervisor) -> tuple[Beside, Iterator[int]]:
    """Reconfigure ``sup`` while n3's dispatcher is still booting: the process beside the
    lock that sets it up later, and the clock its answers read on."""
    clock = iter(range(100, 1 << 30, 100))

    def booting(a):
        if isinstance(a, SetUpHelpers) and a.only == "n3":
            return Answer(next(clock), Failed("no answer in time", timeout=True))
        return Answer(next(clock), None)

    later = _run(sup.reconfigure(), booting)[-1]
    assert isinstance(later, Beside)
    return later, clock


def test_a_dispatcher_booting_through_a_moment_as_candidate_is_still_set_up() -> None:
    """The leader is a candidate for a moment when its booting dispatcher's retry comes up,
    then elected again in the same term (no role change runs): the set-up waits for it
    and goes on, or the learner would never get a push."""
    sup = _leader()
    state = sup.logic.state
    later, clock = _booting_n3(sup)
    state.change_to_candidate(3)  # the blip, as the pause ends
    blips = 0

    def pause(a):
        nonlocal blips
        if isinstance(a, Sleep) and a.ms < 500:
            blips += 1
            if blips == 3:  # elected again in term 3
                state.change_to_leader(3)
        return Answer(next(clock), None)

    waits = _run(later.process, pause)
    assert blips == 3 and isinstance(waits[-1], Queue)
    tried = _run(waits[-1].process, lambda a: Answer(next(clock), None))
    assert [a.only for a in tried if isinstance(a, SetUpHelpers)] == ["n3"]
    assert ("dispatcher", "n3") in sup.heard


def test_a_booting_dispatcher_is_not_set_up_for_a_term_left() -> None:
    sup = _leader()
    later, clock = _booting_n3(sup)
    sup.logic.state.change_to_candidate(3)
    assert sup.logic.state.next_term() == 4  # a newer term: its own role change sets up
    waits = _run(later.process, lambda a: Answer(next(clock), None))
    assert not any(isinstance(a, Queue) for a in waits)
