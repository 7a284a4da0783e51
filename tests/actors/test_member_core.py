"""MemberCore (actors/core/member.py): the member's one way in, stepped by hand as the Ray
member, the simulation and the script tests step it -- events in, a MemberOut back."""

from __future__ import annotations

import random

import pytest
from rayledger.actors.core import member as mc
from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.read_path import Confirm
from rayledger.actors.core.reads import Consistency
from rayledger.election import ElectionConfig, MemoryTermStore, Role, RoleChange
from rayledger.election.messages import (
    HeartbeatResponse,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from rayledger.replication import ReplicationConfig
from rayledger.replication.checker import Resolution
from rayledger.storage import LedgerError, MemoryStore, ResponseCode, StoreConfig

C = ResponseCode
RPC_MS, LEASE_MS = 1000, 500


class Host:
    """A transport that performs every action at once (helpers that always answer) and
    keeps what the core handed out."""

    def __init__(self, peers: list[str]):
        self.logic = MemberLogic("g", "n0", peers, MemoryStore(StoreConfig()), ElectionConfig(),
                                 ReplicationConfig(), MemoryTermStore(),
                                 rng=random.Random(1))  # fmt: skip
        self.core = mc.MemberCore(self.logic, rpc_timeout_ms=RPC_MS, lease_ms=LEASE_MS)
        self.now = 0
        self.outs: list[mc.MemberOut] = []
        self.performed: list = []
        self.watching: list[mc.Run] = []  # the helper watch's actions (it never ends)

    def step(self, ev) -> mc.MemberOut:
        out = self.core.step(ev, self.now)
        self.carry(out)
        return out

    def carry(self, out: mc.MemberOut) -> None:
        self.outs.append(out)
        for snd in out.sends:  # every peer votes for us and follows us
            m = snd.message
            if isinstance(m, VoteRequest):
                resp = VoteResponse(result=VoteResult.ACCEPT, term=m.term, pre_vote=m.pre_vote,
                                    remote_id=snd.to)  # fmt: skip
            else:
                resp = HeartbeatResponse(code=C.SUCCESS, term=m.term, remote_id=snd.to)
            self.step(mc.ElectionAnswer(snd.to, m, resp))
        for run in out.run:
            if run.kind == "watch":
                self.watching.append(run)
                continue
            self.performed.append(run.action)
            value = {sv.Ping: {}, sv.DeactivateDispatchers: 0, rp.Submit: False}.get(
                type(run.action)
            )
            if isinstance(run.action, sv.CheckerStepDown):
                value = []
            self.step(mc.ProcessAnswered(run.pid, value))

    def lead(self) -> None:
        """Tick until elected (every peer votes for us) and in office."""
        while not self.logic.leads(self.logic.state.current_term) or self.logic.ready_term < 0:
            self.now += 10
            self.step(mc.Tick())
            assert self.now < 10_000


def test_a_role_change_from_the_elector_runs_the_role_process_to_ready() -> None:
    h = Host(["n0"])
    h.lead()
    kinds = [type(a).__name__ for a in h.performed]
    assert kinds[:2] == ["Sleep", "SetUpHelpers"] and "Ready" in kinds
    notes = [n for o in h.outs for n in o.notes if isinstance(n, RoleChange)]
    assert notes and notes[-1].role is Role.LEADER
    assert h.watching, "once ready, the core watches the helpers itself"


def test_an_append_is_one_round_announced_registered_and_answered() -> None:
    h = Host(["n0"])
    h.lead()
    out = h.step(mc.ClientAppend([b"a", b"b"], "g", None, "tok"))
    assert out.write_due and not out.run  # written at the end of the turn
    h.performed.clear()
    out = h.step(mc.WriteRound())
    assert (
        out.written is not None
        and out.written.round.last_index - out.written.round.first_index == 1
    )
    assert [type(a) for a in h.performed] == [rp.Announce, rp.Register]
    rid = out.written.rid
    out = h.step(
        mc.RoundsResolved(Resolution(h.logic.state.current_term, None, [(rid, C.SUCCESS)]))
    )
    (fin,) = out.finished
    assert fin.ok and fin.calls[0][0] == "tok" and out.commits_moved


def test_a_refused_append_raises_and_queues_nothing() -> None:
    h = Host(["n0"])
    with pytest.raises(LedgerError) as e:
        h.step(mc.ClientAppend([b"a"], "g", None, "tok"))  # not the leader
    assert e.value.code == C.NOT_LEADER and not h.core.book.queue


def test_a_failed_flush_ends_the_round_unknown_and_the_leadership_inside_the_core() -> None:
    h = Host(["n0"])
    h.lead()
    h.core.round_path.sync = True  # as a sync_flush member: the round waits for its flush
    h.step(mc.ClientAppend([b"a"], "g", None, "tok"))
    h.carry = lambda out: h.outs.append(out)  # from now on, answer by hand
    out = h.step(mc.WriteRound())
    (announce,) = out.run
    out = h.step(mc.ProcessAnswered(announce.pid, None))
    (flush,) = out.run
    assert isinstance(flush.action, sv.Flush)
    out = h.step(mc.ProcessAnswered(flush.pid, sv.Failed("EIO")))
    assert [f.code for f in out.finished] == [C.DISK_ERROR]
    assert any(isinstance(n, RoleChange) and n.role is not Role.LEADER for n in out.notes)
    assert out.elector_moved and not h.logic.state.is_leader
    # the role change that follows runs under the role lock: the stop of the term
    assert out.run and out.run[0].kind == "role"


def test_role_changes_coalesce_behind_the_running_one() -> None:
    h = Host(["n0"])
    h.carry = lambda out: h.outs.append(out)
    for _ in range(100):
        h.now += 10
        out = h.step(mc.Tick())
        if out.run:
            break
    (first,) = out.run
    assert first.kind == "role" and h.core.role_queue.busy
    again = h.core.step(mc.StepDown("test"), h.now)  # another change while the first runs
    assert not again.run  # it waits for the lock, coalesced into one pass
    assert h.core.role_queue._again


def test_a_lease_read_answers_at_once_and_a_linearizable_one_needs_its_round() -> None:
    h = Host(["n0", "n1", "n2"])
    h.lead()
    h.carry = lambda out: h.outs.append(out)  # from now on, answer by hand
    term = h.logic.state.current_term
    h.logic.store.update_committed_index(h.logic.term_start_index)  # its first entry committed
    out = h.step(mc.ReadIndex(Consistency.LINEARIZABLE, "r1"))
    assert not out.reads_done and len(out.read_pings) == 2 and out.deadlines
    assert out.expire_at_ms is not None
    (pid, _), (peer, req) = out.deadlines[0], out.read_pings[0]
    assert isinstance(h.core._out[pid], Confirm)
    ok = HeartbeatResponse(group="g", remote_id=peer, term=term, code=C.SUCCESS)
    out = h.step(mc.ReadRoundAnswer(peer, req, ok))  # with our own vote: a quorum
    assert out.reads_done == [("r1", h.logic.store.committed_index)]
    out = h.step(mc.ReadIndex(Consistency.LEASE, "r2"))  # the round just confirmed: a lease
    assert out.reads_done == [("r2", h.logic.store.committed_index)] and not out.read_pings


def test_a_read_past_its_deadline_times_out_and_readers_fail_on_a_step_down() -> None:
    h = Host(["n0", "n1", "n2"])
    h.lead()
    h.carry = lambda out: h.outs.append(out)  # from now on, answer by hand
    h.logic.store.update_committed_index(h.logic.term_start_index)
    out = h.step(mc.ReadIndex(Consistency.LINEARIZABLE, "late"))
    pid, at = out.deadlines[0]
    h.now = at
    (done,) = h.step(mc.Deadline(pid)).reads_done
    assert done[0] == "late" and done[1].code == C.TIMEOUT
    h.step(mc.ReadIndex(Consistency.LINEARIZABLE, "waiting"))
    out = h.step(mc.StepDown("test"))  # the stop of the term fails it: the core's action
    assert [(t, e.code) for t, e in out.reads_done] == [("waiting", C.NOT_LEADER)]
    assert out.run[0].kind == "role" and isinstance(out.run[0].action, sv.FastStop)


def test_a_committed_read_is_answered_at_once_with_the_members_own_committed_index() -> None:
    h = Host(["n0", "n1", "n2"])  # a follower: no leader known, nothing to ask
    h.carry = lambda out: h.outs.append(out)
    out = h.step(mc.ReadIndex(Consistency.COMMITTED, "c"))
    assert out.reads_done == [("c", h.logic.store.committed_index)] and not out.run
    out = h.step(mc.ReadIndex(Consistency.LINEARIZABLE, "l"))  # it must ask a leader
    ((token, err),) = out.reads_done
    assert token == "l" and err.code == C.NOT_LEADER


def _follower_of_n1() -> Host:
    """n0 follows n1 in term 1 (n1's heartbeat made it so)."""
    from rayledger.election.messages import HeartbeatRequest

    h = Host(["n0", "n1", "n2"])
    hb = HeartbeatRequest(group="g", local_id="n1", remote_id="n0", leader_id="n1", term=1)
    h.step(mc.ElectionRequest(hb))  # a newer term: DLedger answers TERM_NOT_READY first
    h.core.step(mc.Tick(), h.now)  # the term catches up (its vote requests go nowhere)
    h.step(mc.ElectionRequest(hb))
    assert h.logic.state.role is Role.FOLLOWER and h.logic.state.leader_id == "n1"
    return h


def _graph_push(h: Host, graph: bool) -> None:
    from rayledger.replication import PushEntryRequest, PushType

    req = PushEntryRequest(group="g", leader_id="n1", remote_id="n0", term=1,
                           type=PushType.COMMIT, commit_index=-1)  # fmt: skip
    h.step(mc.Push(req, ("cg", 1), graph=graph))


@pytest.mark.parametrize("graph", [True, False])
def test_a_follower_leaves_its_leaders_compiled_graph_once_it_stops_following_it(graph) -> None:
    """A dead leader's graph loops spin until something closes them: the follower closes its
    own when it becomes a candidate (and never while it follows that leader, nor for a
    leader it served only by plain calls)."""
    h = _follower_of_n1()
    _graph_push(h, graph)
    h.now += 10
    h.step(mc.Tick())  # still following n1
    assert not any(o.leave_graphs for o in h.outs)
    while h.logic.state.role is Role.FOLLOWER:  # n1 falls silent: n0 campaigns
        h.now += 50
        out = h.core.step(mc.Tick(), h.now)
        assert h.now < 20_000
    assert out.leave_graphs is graph
    assert any(isinstance(n, RoleChange) and n.role is not Role.FOLLOWER for n in out.notes)
    out = h.core.step(mc.Tick(), h.now + 10)
    assert not out.leave_graphs  # once
