"""MemberState: quorum, durable term/vote, role transitions."""

from __future__ import annotations

import json
import pickle

import pytest
from rayledger.election import (
    FileTermStore,
    HeartbeatRequest,
    LeadershipTransferRequest,
    MemberState,
    MemoryTermStore,
    Role,
    RoleChange,
    Send,
    TermStore,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from rayledger.storage.errors import LedgerError, ResponseCode


@pytest.mark.parametrize(
    ("size", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)]
)
def test_is_quorum_counts_self(size: int, quorum: int) -> None:
    peers = [f"n{i}" for i in range(size)]
    st = MemberState("g", "n0", peers)
    assert st.is_quorum(quorum)
    assert not st.is_quorum(quorum - 1)


def test_starts_as_candidate_with_empty_ledger() -> None:
    st = MemberState("g", "n0", ["n0", "n1", "n2"])
    assert st.role is Role.CANDIDATE
    assert (st.current_term, st.vote_for, st.leader_id) == (0, None, None)
    assert (st.ledger_end_index, st.ledger_end_term) == (-1, -1)
    assert st.transferee is None
    assert isinstance(st.term_store, MemoryTermStore)


@pytest.mark.parametrize(
    ("self_id", "peers"),
    [("n9", ["n0", "n1"]), ("n0", ["n0", "n0"]), ("n0", []), ("n0", ["n0", ""])],
)
def test_bad_membership_is_rejected(self_id, peers) -> None:
    with pytest.raises(LedgerError) as err:
        MemberState("g", self_id, peers)
    assert err.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_file_store_survives_restart(tmp_path) -> None:
    st = MemberState("g", "n0", ["n0", "n1", "n2"], data_dir=tmp_path)
    assert isinstance(st.term_store, FileTermStore)
    assert isinstance(st.term_store, TermStore)
    assert st.next_term() == 1
    st.set_vote_for("n2")
    data = json.loads((tmp_path / "currterm.json").read_text())
    assert data == {"currTerm": 1, "voteFor": "n2"}
    again = MemberState("g", "n0", ["n0", "n1", "n2"], data_dir=tmp_path)
    assert (again.current_term, again.vote_for) == (1, "n2")
    assert again.role is Role.CANDIDATE  # volatile state is not restored


def test_corrupt_term_file_is_reported(tmp_path) -> None:
    (tmp_path / "currterm.json").write_text("{not json")
    with pytest.raises(LedgerError) as err:
        MemberState("g", "n0", ["n0"], data_dir=tmp_path)
    assert err.value.code == ResponseCode.CORRUPT_LOG
    (tmp_path / "currterm.json").write_text(json.dumps({"voteFor": "n0"}))
    with pytest.raises(LedgerError):
        MemberState("g", "n0", ["n0"], data_dir=tmp_path)


class FailingStore(MemoryTermStore):
    def save(self, term, vote_for):
        raise LedgerError.of(ResponseCode.DISK_FULL, "full")


def test_nothing_changes_when_the_term_cannot_be_persisted() -> None:
    st = MemberState("g", "n0", ["n0", "n1", "n2"], FailingStore(3, None))
    with pytest.raises(LedgerError):
        st.next_term()
    with pytest.raises(LedgerError):
        st.set_vote_for("n1")
    assert (st.current_term, st.vote_for) == (3, None)


def test_next_term_jumps_to_the_largest_known_term() -> None:
    st = MemberState("g", "n0", ["n0", "n1", "n2"], MemoryTermStore(2, "n1"))
    assert st.next_term() == 3 and st.vote_for is None
    st.change_to_candidate(7)
    assert st.current_term == 3  # only known, not yet current
    assert st.next_term() == 7
    assert st.term_store.load() == (7, None)


def test_role_transitions_check_the_term() -> None:
    st = MemberState("g", "n0", ["n0", "n1", "n2"], MemoryTermStore(4, None))
    with pytest.raises(LedgerError) as err:
        st.change_to_leader(3)
    assert err.value.code == ResponseCode.ILLEGAL_MEMBER_STATE
    with pytest.raises(LedgerError):
        st.change_to_candidate(3)
    st.change_to_follower(4, "n1")
    assert (st.role, st.leader_id) == (Role.FOLLOWER, "n1")
    with pytest.raises(LedgerError):
        st.next_term()  # only a candidate raises its term
    with pytest.raises(LedgerError):
        st.set_transferee("n2")  # only a leader transfers
    st.change_to_candidate(4)
    st.change_to_leader(4)
    st.set_transferee("n2")
    st.change_to_candidate(5)
    assert (st.role, st.leader_id, st.transferee) == (Role.CANDIDATE, None, None)


def test_messages_pickle() -> None:
    msgs = [
        VoteRequest(
            group="g",
            local_id="a",
            remote_id="b",
            leader_id="a",
            term=1,
            ledger_end_index=2,
            ledger_end_term=1,
        ),
        VoteResponse(VoteResult.ACCEPT, 1, local_id="b"),
        HeartbeatRequest(group="g", local_id="a", remote_id="b", leader_id="a", term=1),
        LeadershipTransferRequest(
            group="g", local_id="a", remote_id="a", term=1, transfer_id="a", transferee_id="b"
        ),
        Send("b", VoteResponse(VoteResult.REJECT_ALREADY_VOTED, 3)),
        RoleChange(2, Role.LEADER, "a"),
    ]
    for msg in msgs:
        assert pickle.loads(pickle.dumps(msg)) == msg
