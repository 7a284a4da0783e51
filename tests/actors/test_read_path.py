"""The read path's decisions (actors/core/read_path.py), stepped by hand: what a read waits for,
when a lease answers alone, and which error a reader gets."""

from __future__ import annotations

import pytest
from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.read_path import Confirm, ReadPath, WaitCommitted, run_to_end
from rayledger.actors.core.reads import Consistency, ReadIndexLogic
from rayledger.actors.core.supervision import Answer, Failed
from rayledger.election import MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.storage import LedgerError, MemoryStore, ResponseCode, StoreConfig

PEERS = ["n0", "n1", "n2"]
CFG = LedgerConfig.fast()


def _leader() -> tuple[MemberLogic, ReadPath]:
    store = MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 << 10))
    m = MemberLogic("g", "n0", PEERS, store, CFG.election, ReplicationConfig(),
                    MemoryTermStore(term=3))  # fmt: skip
    m.state.change_to_leader(3)
    (start,) = m.leadership()
    assert m.mark_ready(3)
    store.update_committed_index(start.term_start_index)  # the term's first entry committed
    reads = ReadIndexLogic("n0", PEERS, CFG.lease_ms(), CFG.rpc_timeout_ms)
    return m, ReadPath(m, reads, CFG.rpc_timeout_ms)


def _run(proc, answers: dict) -> object:
    """Answer each action by its type (a value, or a callable of the action)."""
    action, result = run_to_end(proc, None)
    while action is not None:
        value = answers[type(action)]
        value = value(action) if callable(value) else value
        action, result = run_to_end(proc, Answer(0, value))
    return result


def test_a_linearizable_read_confirms_its_index_with_a_quorum() -> None:
    m, rp = _leader()
    asked = []
    got = _run(rp.leader_read(Consistency.LINEARIZABLE, 0),
               {WaitCommitted: True, Confirm: lambda a: asked.append(a) or a.index})  # fmt: skip
    assert got == m.store.committed_index and asked and asked[0].term == 3


def test_a_lease_read_skips_the_round_only_while_the_lease_holds() -> None:
    m, rp = _leader()
    rp.reads._lease = (3, 10**9)  # a round of term 3 was confirmed just now
    assert _run(rp.leader_read(Consistency.LEASE, 0), {WaitCommitted: True}) == 0
    m.elector.transfer.take_order_term = 3  # a take order went out in term 3: no lease any more
    with pytest.raises(KeyError):  # it asks for a confirmation round instead
        _run(rp.leader_read(Consistency.LEASE, 0), {WaitCommitted: True})


@pytest.mark.parametrize(
    "answer, code",
    [(Failed("no quorum", timeout=True), ResponseCode.TIMEOUT),
     (Failed("leadership ended"), ResponseCode.NOT_LEADER)],
)  # fmt: skip
def test_a_read_that_cannot_confirm_fails_with_the_right_code(answer, code) -> None:
    _, rp = _leader()
    with pytest.raises(LedgerError) as e:
        _run(rp.leader_read(Consistency.LINEARIZABLE, 0), {WaitCommitted: True, Confirm: answer})
    assert e.value.code == code


def test_a_follower_is_refused_at_once() -> None:
    store = MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 << 10))
    m = MemberLogic("g", "n1", PEERS, store, CFG.election, ReplicationConfig(), MemoryTermStore())
    rp = ReadPath(m, ReadIndexLogic("n1", PEERS, 100, 100), 100)
    with pytest.raises(LedgerError) as e:
        _run(rp.leader_read(Consistency.LINEARIZABLE, 0), {})
    assert e.value.code == ResponseCode.NOT_LEADER


def test_the_read_index_is_the_leaders_end_once_committed_here() -> None:
    """Followers may hear of a commit (from the checker, through the dispatchers) before
    the leader's member does, and serve it: a read on the leader waits for its whole log
    to be committed here, not just what it counts as committed now (with the committed
    index, a lease read missed a write a follower's reader had seen)."""
    m, rp = _leader()
    m.store.append_as_leader([b"a", b"b"], 3)  # written, committed in the group, not here
    end = m.store.ledger_end_index
    assert m.store.committed_index < end
    waited = []
    rp.reads._lease = (3, 10**9)
    got = _run(rp.leader_read(Consistency.LEASE, 0),
               {WaitCommitted: lambda a: waited.append(a.index) or True})  # fmt: skip
    assert got == end and end in waited
