"""RoundPath (actors/core/round_path.py): what a written round does next, stepped by hand as the
Ray member and the simulation step it."""

from __future__ import annotations

import pytest
from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.member_logic import MemberLogic, StopLeading
from rayledger.actors.core.rounds import RoundBook
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.storage import FileStore, MemoryStore, ResponseCode, StoreConfig

C = ResponseCode
SEGMENTS = dict(data_segment_size=1 << 20, index_segment_size=32 << 10)


def _leader(store) -> MemberLogic:
    m = MemberLogic("g", "n0", ["n0", "n1", "n2"], store, ElectionConfig(), ReplicationConfig(),
                    MemoryTermStore(term=3))  # fmt: skip
    m.state.change_to_leader(3)
    m.leadership()
    assert m.mark_ready(3)
    return m


@pytest.fixture
def plain() -> rp.RoundPath:
    m = _leader(MemoryStore(StoreConfig(**SEGMENTS)))
    return rp.RoundPath(m, RoundBook(m), sync=False)


@pytest.fixture
def synced(tmp_path):
    store = FileStore(StoreConfig(data_dir=str(tmp_path), sync_flush=True, **SEGMENTS))
    store.defer_sync = True  # as the member sets it: flushes are the round path's
    m = _leader(store)
    store.flush()  # the term's first entry (the supervisor flushes it before taking appends)
    yield rp.RoundPath(m, RoundBook(m), sync=True)
    store.close()


def _written(path: rp.RoundPath, *bodies: bytes):
    path.book.admit(list(bodies), "g", None, "t")
    assert path.book.write_due()
    return path.book.write()


def _run(proc: sv.Process, answers: dict) -> list:
    """The actions of ``proc``, each answered from ``answers`` by its type (default None)."""
    out, action = [], proc.start()
    while action is not None:
        out.append(action)
        action = proc.send(sv.Answer(0, answers.get(type(action))))
    return out


def test_a_plain_round_is_announced_then_registered_with_the_leaders_end(plain) -> None:
    w = _written(plain, b"a", b"b")
    acts = _run(plain.send(w, fast=False), {})
    assert [type(a) for a in acts] == [rp.Announce, rp.Register]
    reg = acts[1]
    assert (reg.first, reg.last, reg.rid, reg.leader_mark) == (1, 2, w.rid, 2)
    assert acts[0].a.first == 1 and acts[0].a.count == 2


def test_a_round_the_graph_takes_is_not_registered_again(plain) -> None:
    w = _written(plain, b"a")
    acts = _run(plain.send(w, fast=True), {rp.Submit: True})
    assert [type(a) for a in acts] == [rp.Submit]  # the graph registers it


def test_a_round_the_graph_refuses_goes_plain(plain) -> None:
    w = _written(plain, b"a")
    acts = _run(plain.send(w, fast=True), {rp.Submit: False})
    assert [type(a) for a in acts] == [rp.Submit, rp.Announce, rp.Register]


def test_a_round_not_sent_on_is_an_unknown_outcome_at_once(plain) -> None:
    w = _written(plain, b"a")
    acts = _run(plain.send(w, fast=False), {rp.Announce: sv.Failed("ray.put failed")})
    assert [type(a) for a in acts] == [rp.Announce, sv.Finish]
    assert acts[1].outcomes == [(w.rid, C.INTERNAL_ERROR)]


def test_sync_flush_registers_only_after_the_flush_and_counts_only_the_flushed_copy(
    synced,
) -> None:
    w = _written(synced, b"a")
    proc = synced.send(w, fast=True)  # the compiled path is never used with sync_flush
    assert isinstance(proc.start(), rp.Announce)  # followers write meanwhile
    assert isinstance(proc.send(sv.Answer(0)), sv.Flush)
    store = synced.logic.store
    assert store.durable_end_index == 0 < store.ledger_end_index == 1  # not flushed yet
    assert synced.logic.water_mark() == 0  # no checker may count it yet
    store.flush()
    reg = proc.send(sv.Answer(0))
    assert isinstance(reg, rp.Register) and reg.leader_mark == 1
    assert proc.send(sv.Answer(0)) is None


def test_a_failed_flush_fails_the_round_and_costs_the_leadership(synced) -> None:
    w = _written(synced, b"a")
    acts = _run(synced.send(w, fast=False), {sv.Flush: sv.Failed("EIO")})
    assert [type(a) for a in acts] == [rp.Announce, sv.Flush, sv.Finish, sv.GiveUpLeadership]
    assert acts[2].outcomes == [(w.rid, C.DISK_ERROR)]  # stored: outcome unknown
    assert "EIO" in acts[3].why


def test_the_rounds_of_an_abandoned_graph_that_still_wait_go_plain(plain) -> None:
    w = _written(plain, b"a")
    a = plain.logic.announcement(w.round)
    gone = (5, 5, 999)  # a round that already ended
    acts = plain.fallback([(a, [(1, 1, w.rid), gone]), (a, [gone])])
    assert [type(x) for x in acts] == [rp.Announce, rp.Register]
    assert (acts[1].rid, acts[1].leader_mark) == (w.rid, 1)


def test_followers_answer_after_a_flush_only_when_the_store_defers_it(plain, synced) -> None:
    assert not plain.logic.must_flush([("tok", "resp")])
    assert synced.logic.must_flush([("tok", "resp")])
    assert not synced.logic.must_flush([])


def test_the_role_queue_runs_one_at_a_time_a_role_change_first(plain) -> None:
    """RoleQueue (actors/core/supervision.py): the simulation's and the script tests' role lock."""
    book = plain.book
    q = sv.RoleQueue(sv.Supervisor(plain.logic, book, ["n0", "n1", "n2"], 100, 300))
    restore = sv.Process("restore", iter(()), exclusive=True)
    assert q.restore(restore)  # the lock was free: the caller runs the queue
    assert not q.role_changed() and not q.role_changed()  # busy: both wait, coalesced
    first = q.next()
    assert first is not None and first.name != "restore"  # the role change goes first
    assert q.next() is restore
    assert q.next() is None and not q.busy  # free again
    assert q.role_changed()


def test_the_fallback_of_a_term_whose_office_is_over_is_left_to_its_end(plain) -> None:
    """A graph stopped at a term's end hands its rounds back too; the term's end fails
    them, so none is announced or registered again for a term the member left."""
    w = _written(plain, b"a")
    a = plain.logic.announcement(w.round)
    plain.logic.state.change_to_candidate(3)
    assert [type(x) for x in plain.logic.leadership()] == [StopLeading]
    assert plain.fallback([(a, [(1, 1, w.rid)])]) == []
