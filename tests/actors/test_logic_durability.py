"""MemberLogic.write_round on a real FileStore whose disk fails mid-append: a failure after
the bytes were written is an unknown outcome, never a plain error to retry."""

from __future__ import annotations

import random

import pytest
from rayledger.actors.core.member_logic import MemberLogic, StartLeading
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.replication.messages import TURN_END, Push
from rayledger.storage import (
    LedgerError,
    OutcomeUnknownError,
    ResponseCode,
    StoreConfig,
    open_store,
)


@pytest.fixture
def leader(tmp_path):
    store = open_store(StoreConfig(data_dir=str(tmp_path), sync_flush=True))
    m = MemberLogic(
        "g",
        "n0",
        ["n0"],
        store,
        ElectionConfig(heartbeat_interval_ms=100),
        ReplicationConfig(),
        MemoryTermStore(),
        rng=random.Random(1),
    )
    now = 0
    while not m.state.is_leader:  # a group of one elects itself
        now += 10
        m.tick(now)
    (start,) = m.leadership()
    assert isinstance(start, StartLeading) and m.mark_ready(start.term)
    yield m
    store.close()


def _fail_flush(store):
    def broken():
        raise LedgerError.of(ResponseCode.DISK_ERROR, "fdatasync failed (injected)")

    store.after_append = broken


def test_a_sync_flush_failure_after_the_write_is_an_unknown_outcome(leader):
    term = leader.ready_term
    leader.write_round([(None, [b"ok"])], term)
    end = leader.store.ledger_end_index
    assert leader.store.flushed_index == end  # sync_flush: on disk before it is announced
    _fail_flush(leader.store)
    with pytest.raises(OutcomeUnknownError) as e:
        leader.write_round([(None, [b"a", b"b"])], term)
    assert e.value.code == ResponseCode.APPEND_OUTCOME_UNKNOWN
    assert leader.store.ledger_end_index == end + 2  # written: it may still commit
    assert leader.state.ledger_end_index == end + 2  # and the member knows it


def test_a_refusal_before_the_write_stays_a_plain_error(leader):
    term = leader.ready_term
    end = leader.store.ledger_end_index
    with pytest.raises(LedgerError) as e:
        leader.write_round([(None, ["not bytes"])], term)  # refused: nothing written
    assert not isinstance(e.value, OutcomeUnknownError)
    assert leader.store.ledger_end_index == end


def test_with_sync_flush_a_follower_acknowledges_only_what_is_on_disk(tmp_path):
    """With ``sync_flush`` an ack means fdatasync on the follower too (the leader's own
    round is flushed before it is announced, test above), so an acknowledged append is on
    disk on a quorum."""
    from rayledger.election import MemberState
    from rayledger.replication import EntryHandler, PushEntryRequest, PushType
    from rayledger.storage import MemoryStore

    source = MemoryStore(StoreConfig())
    source.append_as_leader([b"a", b"b", b"c"], 1)
    store = open_store(StoreConfig(data_dir=str(tmp_path / "f"), sync_flush=True))
    try:
        state = MemberState("g", "f", ["l", "f"], MemoryTermStore(term=1))
        state.change_to_follower(1, "l")
        handler = EntryHandler("g", "f", state, store, ReplicationConfig())
        batch = source.read_batch(0, max_count=3)
        req = PushEntryRequest(
            group="g",
            leader_id="l",
            remote_id="f",
            term=1,
            type=PushType.APPEND,
            first_index=0,
            count=3,
            batch=batch,
        )
        ((_, resp),) = handler.step(Push(req, "token"), 0)
        assert resp.code == ResponseCode.SUCCESS
        assert store.flushed_index >= 2  # on disk before the answer left
    finally:
        store.close()


def test_with_sync_flush_a_restarted_checker_counts_only_the_leaders_flushed_copy(tmp_path):
    """A round is stored and announced before the leader's own fdatasync (the followers
    write meanwhile).  A checker restarted during that flush starts from the leader's
    ``LeaderInfo`` and gets the rounds of the term again; on 24eedd2 it took the leader's
    mark from the log end, so the unflushed copy plus one follower made a quorum and the
    append was acknowledged before it was on a quorum's disk.  In sync mode the leader's
    mark is its flushed end, everywhere."""
    from rayledger.replication.checker import AddRound, BecomeLeader, CheckerLogic, Report

    cfg = StoreConfig(data_dir=str(tmp_path), sync_flush=True, flush_interval_ms=3_600_000)
    store = open_store(cfg)
    store.defer_sync = True  # as the member actor runs it: it flushes, unlocked, itself
    peers = ["n0", "n1", "n2"]
    m = MemberLogic("g", "n0", peers, store, ElectionConfig(), ReplicationConfig(),
                    MemoryTermStore(term=3))  # fmt: skip
    try:
        m.state.change_to_leader(3)
        (start,) = m.leadership()
        store.flush()  # the term's first entry is flushed before the helpers start
        assert m.mark_ready(3)
        rnd = m.write_round([(None, [b"a", b"b", b"c"])], 3)
        assert store.flushed_index < rnd.first_index  # stored and announced, not yet flushed
        chk = CheckerLogic("g", "n0", peers, ReplicationConfig())
        chk.step(
            BecomeLeader(3, start.term_start_index, m.leader_info()), 0
        )  # the restarted checker
        chk.step(Report(3, "n1", rnd.last_index), 0)  # one follower flushed and acknowledged
        assert chk.step(TURN_END, 1).committed_index < rnd.first_index
        chk.step(AddRound(3, rnd.first_index, rnd.last_index, "r", m.water_mark()), 1)  # re-sent
        ready = chk.step(TURN_END, 2)
        assert ready.resolution is None and ready.committed_index < rnd.first_index
        store.flush()  # the leader's own flush ends: its registration counts it now
        chk.step(AddRound(3, rnd.first_index, rnd.last_index, "r", m.water_mark()), 3)
        res = chk.step(TURN_END, 4).resolution
        assert res is not None and res.committed == rnd.last_index
        assert res.outcomes == [("r", ResponseCode.SUCCESS)]
    finally:
        store.close()
