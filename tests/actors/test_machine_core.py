"""The state-machine runner's core (actors/core/machine.py), stepped by hand (no Ray): what
to apply next, when queries are answered or fail, readiness for a term, failures."""

from __future__ import annotations

import pytest
from rayledger.actors.core import machine as mcore
from rayledger.actors.core.machine import READY_POLL_MS, AskReady, Batch, MachineCore, QueryVerdict
from rayledger.actors.core.read_path import run_to_end
from rayledger.actors.core.supervision import Answer, Failed, Sleep
from rayledger.actors.machine import Applier, MachineContext, StateMachine
from rayledger.election import Role
from rayledger.storage import Entry, LedgerError, ResponseCode


def entries(a: int, b: int) -> list[Entry]:
    return [Entry(i, 1, i * 10, b"x") for i in range(a, b)]


def test_batches_apply_one_at_a_time_from_where_the_machine_stands():
    c = MachineCore("n0", applied=4, max_batch=3)
    assert c.step(mcore.NextJob(4), 0) is None  # nothing committed past it
    b = c.step(mcore.NextJob(10), 0)
    assert b == Batch(5, 8)
    assert c.step(mcore.NextJob(10), 0) is None  # one batch in flight at a time
    c.step(mcore.BatchRead(b, entries(5, 8)), 0)
    assert c.step(mcore.BatchApplied(7), 0) == [] and c.applied == 7
    assert c.step(mcore.NextJob(10), 0) == Batch(8, 11)


def test_a_batch_read_with_a_gap_or_short_is_refused():
    c = MachineCore("n0", applied=-1)
    b = c.step(mcore.NextJob(5), 0)
    for got in (entries(0, 3), entries(1, 6), []):
        with pytest.raises(LedgerError) as e:
            c.step(mcore.BatchRead(b, got), 0)
        assert e.value.code == ResponseCode.INCONSISTENT_STATE
    c.step(mcore.BatchRead(b, entries(0, 6)), 0)
    with pytest.raises(LedgerError):
        c.step(mcore.Continues(3), 0)  # never skip, never twice
    c.step(mcore.Continues(0), 0)


def test_a_machine_restarted_ahead_of_the_committed_index_waits_for_it():
    c = MachineCore("n0", applied=20)  # it saved more than the store recovered as committed
    assert c.step(mcore.NextJob(15), 0) is None
    assert c.step(mcore.NextJob(21), 0) == Batch(21, 22)


def test_a_machine_ahead_of_its_log_answers_once_the_log_holds_what_it_applied():
    """A power loss kept the machine's own state at 48 and the log only to 47: a query
    (which may read message bodies from the log) waits until a batch is applied past 48,
    which the log then holds; a machine level with its log answers at once."""
    c = MachineCore("n0", applied=48, log_end=47)
    assert c.step(mcore.Query(-1, "q", 100), 0) == QueryVerdict.WAIT
    assert c.step(mcore.NextJob(48), 0) is None  # the member's committed index is back below 48
    assert c.step(mcore.NextJob(49), 0) == Batch(49, 50)
    assert c.step(mcore.BatchApplied(49), 0) == ["q"]
    assert c.step(mcore.Query(-1, "later", 100), 0) == QueryVerdict.ANSWER
    assert (
        MachineCore("n0", applied=48, log_end=48).step(mcore.Query(5, "q", 100), 0)
        == QueryVerdict.ANSWER
    )


def test_queries_wait_for_the_index_then_are_answered():
    c = MachineCore("n0", applied=2, max_batch=2)
    assert c.step(mcore.Query(2, "now", 100), 0) == QueryVerdict.ANSWER
    assert c.step(mcore.Query(5, "q5", 100), 0) == QueryVerdict.WAIT
    assert c.step(mcore.Query(3, "q3", 100), 0) == QueryVerdict.WAIT
    c.step(mcore.NextJob(9), 0)
    assert c.step(mcore.BatchApplied(4), 0) == ["q3"]
    c.step(mcore.NextJob(9), 0)
    assert c.step(mcore.BatchApplied(6), 0) == ["q5"]
    assert c.step(mcore.ExpireQueries(), 1 << 40) == []  # none waits any more


def test_a_waiting_query_times_out_at_its_deadline():
    c = MachineCore("n0", applied=0)
    c.step(mcore.Query(5, "a", 100), 0)
    c.step(mcore.Query(5, "b", 100), 50)
    assert c.step(mcore.ExpireQueries(), 99) == []
    ((token, err),) = c.step(mcore.ExpireQueries(), 100)
    assert token == "a" and err.code == ResponseCode.TIMEOUT
    c.step(mcore.QueryGone("b"), 0)
    assert c.step(mcore.ExpireQueries(), 1 << 40) == []  # b gave up: it never times out


def test_a_failed_machine_applies_no_more_and_fails_every_query():
    c = MachineCore("n0", applied=0)
    c.step(mcore.Query(3, "w", 1000), 0)
    c.step(mcore.NextJob(5), 0)
    (failed,) = c.step(mcore.MachineFailed("ValueError('bad entry')"), 0)
    assert failed[0] == "w" and failed[1].code == ResponseCode.INTERNAL_ERROR
    assert c.step(mcore.NextJob(5), 0) is None and c.applying is None
    with pytest.raises(LedgerError) as e:
        c.step(mcore.Query(0, "late", 1000), 0)  # even an index it applied: its state is unknown
    assert e.value.code == ResponseCode.INTERNAL_ERROR
    assert not c.step(mcore.RoleNews(Role.LEADER, 3), 0)


def test_role_news_once_per_distinct_role_and_term():
    c = MachineCore("n0", applied=-1)
    assert c.step(mcore.RoleNews(Role.FOLLOWER, 1), 0)
    assert not c.step(mcore.RoleNews(Role.FOLLOWER, 1), 0)
    assert c.step(mcore.RoleNews(Role.LEADER, 2), 0)
    assert c.step(mcore.RoleNews(Role.FOLLOWER, 2), 0)


def _drive(proc, answers):
    """Run a wait_ready process, answering AskReady from ``answers``; the actions seen and
    the result."""
    seen, answer = [], None
    while True:
        action, result = run_to_end(proc, answer)
        if action is None:
            return seen, result
        seen.append(action)
        answer = Answer(0, answers.pop(0) if isinstance(action, AskReady) else None)


def test_ready_once_the_machine_says_so_asked_every_poll():
    c = MachineCore("n0", applied=-1)
    seen, ready = _drive(c.step(mcore.WaitReady(lambda: True), 0), [False, Failed("boom"), True])
    assert ready is True
    assert seen == [AskReady(), Sleep(READY_POLL_MS), AskReady(), Sleep(READY_POLL_MS), AskReady()]


def test_not_ready_once_the_term_ended():
    c = MachineCore("n0", applied=-1)
    leads = iter([True, False])
    seen, ready = _drive(c.step(mcore.WaitReady(lambda: next(leads, False)), 0), [False])
    assert ready is False and seen == [AskReady()]


def test_a_failed_machine_is_never_asked_and_never_ready():
    c = MachineCore("n0", applied=-1)
    c.step(mcore.MachineFailed("boom"), 0)
    polls = iter([True, True, False])
    seen, ready = _drive(c.step(mcore.WaitReady(lambda: next(polls)), 0), [])
    assert ready is False and seen == [Sleep(READY_POLL_MS), Sleep(READY_POLL_MS)]


class Counter(StateMachine):
    def __init__(self):
        self.seen: list[int] = []

    def apply(self, es):
        self.seen += [e.index for e in es]


def test_the_applier_runs_the_machine_and_the_core_records_it():
    m = Counter()
    a = Applier(m, MachineContext("g", "n0", None, {}), max_batch=4)
    b = a.core.step(mcore.NextJob(9), 0)
    a.run(entries(b.start, b.stop))  # the machine's thread
    assert m.seen == [0, 1, 2, 3] and a.core.applied == -1  # the core hears it on its own thread
    a.core.step(mcore.BatchApplied(b.stop - 1), 0)
    assert a.core.applied == 3 and a.core.due(9) == (4, 8)


def _new_leader_actions(machine_answer, sup=None) -> list:
    """The actions of a machine-running member's role change into leading term 3 (or of
    ``sup``'s), then of the processes it starts beside it (``Beside``), every
    ``WaitMachine`` answered ``machine_answer`` (the rest None)."""
    from rayledger.actors.core.supervision import Beside, WaitMachine
    from test_role_lock import elected

    sup = sup or elected(machine=True)
    actions, procs = [], [sup.role_changes()]
    while procs:
        proc = procs.pop(0)
        action = proc.start()
        while action is not None:
            actions.append(action)
            if isinstance(action, Beside):
                procs.append(action.process)
            value = machine_answer if isinstance(action, WaitMachine) else None
            action = proc.send(Answer(0, value))
    return actions


def test_a_leader_with_a_machine_watches_its_helpers_while_it_waits_for_it():
    """A new leader whose machine is not yet ready waits (WaitMachine) with its helpers
    already watched: a checker that hangs meanwhile would otherwise keep it waiting for good,
    never ready, while its heartbeats hold the others off (the simulation's seed 305 of
    tests/simulation/test_group_sim.py::test_machine_leader_wait_watches_helpers).  It waits
    outside the role lock (a process ``Beside`` the role change): a helper Ray restarts
    meanwhile is set up again under the lock, and the commits the machine waits for need
    it (the all-features simulation: a leader never ready, its restarted dispatchers never
    set up for its term)."""
    from rayledger.actors.core.supervision import (
        Beside,
        MachineRole,
        Ready,
        SetUpHelpers,
        WaitMachine,
        Watch,
    )

    actions = _new_leader_actions(True)
    kinds = [type(a) for a in actions]
    assert kinds.index(MachineRole) < kinds.index(SetUpHelpers) < kinds.index(Watch)
    assert kinds.index(Watch) < kinds.index(Beside) < kinds.index(WaitMachine)
    assert kinds.index(WaitMachine) < kinds.index(Ready)
    role = actions[: kinds.index(Beside) + 1]  # the role process ends with it
    assert actions[kinds.index(Beside)].process.exclusive is False
    assert not any(isinstance(a, WaitMachine) for a in role)
    assert kinds.count(Watch) == 1
    assert actions[-1].watching  # Ready starts no second watch


def test_a_leader_whose_machine_is_stranded_hands_leadership_on():
    """A machine below its log's begin (its only snapshot that far found damaged) can catch
    up only from a snapshot another leader sends it: elected, its member hands leadership
    on instead of holding the term unready (the all-features simulation's seed 111005 led
    that way, never ready, for good)."""
    from rayledger.actors.core.supervision import MACHINE_STRANDED, HandOver, Ready

    c = MachineCore("n0", applied=-1)
    c.stranded = True
    assert _drive(c.step(mcore.WaitReady(lambda: True), 0), []) == ([], MACHINE_STRANDED)
    actions = _new_leader_actions(MACHINE_STRANDED)
    assert isinstance(actions[-1], HandOver) and actions[-1].target in ("n1", "n2")
    assert not any(isinstance(a, Ready) for a in actions)


def test_a_leader_lacking_sessions_hands_over_once_and_then_leads():
    """Elected while it lacks the client sessions below its log's begin, with no stamp
    after them to tell a new session from one of those, a leader hands over: another
    member may know them.  When the office comes back with the same lack, the others lack
    them too (the all-features simulation's group left with only such voters passed it
    round for good): it leads, and refuses only the sessions it cannot tell apart.  With a
    bound it leads at once."""
    from rayledger.actors.core.supervision import HandOver, Ready
    from test_role_lock import elected

    sup = elected(machine=True)
    sup.logic.sessions.reset(40)
    actions = _new_leader_actions(True, sup)
    assert isinstance(actions[-1], HandOver), actions
    assert not any(isinstance(a, Ready) for a in actions)
    wait = sup._wait_machine(3)  # its next term's wait, the lack the same
    assert type(next(wait)).__name__ == "WaitMachine"
    assert isinstance(wait.send(Answer(0, True)), Ready)
    sup = elected(machine=True)
    sup.logic.sessions.reset(40)
    sup.logic.sessions.unknown_bound = (42, 1_000)
    assert isinstance(_new_leader_actions(True, sup)[-1], Ready)


def test_a_leader_stranded_before_its_first_batch_is_not_ready():
    """Restarted with its only snapshot found damaged, the machine stands at -1 below a log
    that begins at 290; elected before a batch was due, it is stranded all the same (it
    was ready, its machine never applied again, and a new member waited for a snapshot
    this leader did not have)."""
    from rayledger.actors.core.snapshot_policy import SnapshotConfig, SnapshotPolicy
    from rayledger.actors.core.supervision import MACHINE_STRANDED

    c = MachineCore("n0", applied=-1, snapshots=SnapshotPolicy(SnapshotConfig(), -1, []))
    assert _drive(c.step(mcore.WaitReady(lambda: True, lambda: 290), 0), []) == (
        [],
        MACHINE_STRANDED,
    )
    c.step(
        mcore.SnapshotOffered(300, "/300"), 0
    )  # a snapshot that far is coming: it waits for it as usual
    seen, ready = _drive(c.step(mcore.WaitReady(lambda: True, lambda: 290), 0), [True])
    assert ready is True and seen == [AskReady()]
    plain = MachineCore("n0", applied=-1)  # takes no snapshots: it rebases, never stranded
    assert _drive(plain.step(mcore.WaitReady(lambda: True, lambda: 290), 0), [True])[1] is True


def test_no_snapshot_is_cut_where_the_log_was_reset_past_the_machine():
    """A follower's log was reset past its machine while a batch was applied: the cut's
    term is gone from the log (the snapshot could not be sealed), and the machine goes on
    from the leader's snapshot instead."""
    from rayledger.actors.core.snapshot_policy import SnapshotConfig, SnapshotPolicy

    c = MachineCore(
        "n0", applied=40, snapshots=SnapshotPolicy(SnapshotConfig(every_entries=10), -1, [])
    )
    c.step(mcore.NextJob(61), 0)
    c.step(mcore.BatchApplied(61), 0)
    assert c.step(mcore.SnapshotDue(entries(41, 62), begin=96), 0) is None
    assert c.step(mcore.SnapshotDue(entries(41, 62), begin=50), 0) == 61
