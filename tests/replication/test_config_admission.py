from __future__ import annotations

import pickle

import pytest
from rayledger.election import MemberState, MemoryTermStore
from rayledger.replication import (
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    ReplicationConfig,
    check_append,
)
from rayledger.storage import LedgerError, NotLeaderError, ResponseCode

from .helpers import GROUP, LEADER, PEERS, push, store_with


def test_defaults_are_dledgers() -> None:
    c = ReplicationConfig()
    assert c.max_pending_requests_num == 10000
    assert c.max_push_timeout_ms == 1000
    assert c.max_wait_ack_time_ms == 2500
    assert c.max_batch_push_bytes == 4 * 1024 * 1024
    assert c.max_pending_pushes == 1000
    assert c.peer_push_throttle_point == 300 * 1024 * 1024
    assert c.peer_push_quota == 20 * 1024 * 1024


@pytest.mark.parametrize(
    "field", ["max_push_timeout_ms", "max_pending_pushes", "max_batch_push_bytes"]
)
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_config_validation(field: str, value) -> None:
    with pytest.raises(LedgerError) as exc:
        ReplicationConfig(**{field: value})
    assert exc.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_messages_pickle() -> None:
    store = store_with([1, 1])
    req = push(PushType.APPEND, first_index=0, count=2, batch=store.read_batch(0), commit_index=0)
    back = pickle.loads(pickle.dumps(req))
    assert back == req and back.last_index == 1 and back.batch.data == req.batch.data
    r = PushEntryResponse(GROUP, "f", 2, ResponseCode.SUCCESS, index=1)
    assert pickle.loads(pickle.dumps(r)) == r
    assert isinstance(req, PushEntryRequest)


def leader_state(term: int = 3) -> MemberState:
    st = MemberState(GROUP, LEADER, PEERS, MemoryTermStore(term=term))
    st.change_to_leader(term)
    return st


def check(st, group=GROUP, target=LEADER, bodies=(b"a",), pending=0, **cfg):
    check_append(st, group, target, list(bodies), pending, ReplicationConfig(**cfg))


def code_of(fn) -> ResponseCode:
    with pytest.raises(LedgerError) as exc:
        fn()
    return exc.value.code


def test_admission_accepts_a_leader() -> None:
    check(leader_state())
    check(leader_state(), target=None)


def test_admission_codes() -> None:
    st = leader_state()
    assert code_of(lambda: check(st, group="other")) == ResponseCode.UNKNOWN_GROUP
    assert code_of(lambda: check(st, target="f")) == ResponseCode.UNKNOWN_MEMBER
    assert (
        code_of(lambda: check(st, pending=11, max_pending_requests_num=10))
        == ResponseCode.LEADER_PENDING_FULL
    )
    check(st, pending=10, max_pending_requests_num=10)  # DLedger: full only when size > max
    assert code_of(lambda: check(st, bodies=())) == ResponseCode.REQUEST_WITH_EMPTY_BODYS


def test_admission_transferee_set_means_transferring() -> None:
    st = leader_state()
    st.set_transferee("f")
    assert code_of(lambda: check(st)) == ResponseCode.LEADER_TRANSFERRING


def test_not_leader_names_the_leader() -> None:
    st = MemberState(GROUP, "f", PEERS, MemoryTermStore(term=3))
    st.change_to_follower(3, LEADER)
    with pytest.raises(NotLeaderError) as exc:
        check(st, target="f")
    assert exc.value.code == ResponseCode.NOT_LEADER and exc.value.leader_id == LEADER
    cand = MemberState(GROUP, "f", PEERS, MemoryTermStore(term=3))
    with pytest.raises(NotLeaderError) as exc:
        check(cand, target="f")
    assert exc.value.leader_id is None


def test_admission_order_group_before_leadership() -> None:
    cand = MemberState(GROUP, "f", PEERS, MemoryTermStore(term=3))
    assert code_of(lambda: check(cand, group="zzz", target="f")) == ResponseCode.UNKNOWN_GROUP
    assert code_of(lambda: check(cand, target="q")) == ResponseCode.UNKNOWN_MEMBER
