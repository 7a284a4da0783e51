"""MemberLogic.write_round on a real FileStore whose disk fails mid-append (issue 10 §5):
a failure after the bytes were written is an unknown outcome, never a plain error to retry."""

from __future__ import annotations

import random

import pytest
from rayledger.actors.logic import MemberLogic, StartLeading
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.replication import ReplicationConfig
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
