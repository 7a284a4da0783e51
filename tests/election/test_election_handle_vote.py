"""A vote request handled: one test per branch of DLedger's handleVote, plus pre-vote."""

from __future__ import annotations

import pytest
from rayledger.election import ElectionConfig, MemoryTermStore, ParseResult, Role, VoteResult
from rayledger.election.messages import ElectionRequest, Tick
from rayledger.storage.errors import ResponseCode

R = VoteResult


def test_accept_persists_the_vote_before_answering(h) -> None:
    store = MemoryTermStore(3, None)
    el = h.make(store=store, ledger=(10, 2))
    resp, actions = el.step(ElectionRequest(h.vote_req(el, "n1")), 0)
    assert resp.result is R.ACCEPT and resp.term == 3 and resp.code == ResponseCode.SUCCESS
    assert (resp.local_id, resp.remote_id) == ("n0", "n1")
    assert store.load() == (3, "n1") and el.state.vote_for == "n1"
    assert actions == []
    # asking again (a duplicate) is answered the same way
    assert el.step(ElectionRequest(h.vote_req(el, "n1")), 0)[0].result is R.ACCEPT
    assert store.saves == 2


def test_wrong_receiver_and_group_are_not_judged(h) -> None:
    el = h.make(term=1)
    resp, _ = el.step(ElectionRequest(h.vote_req(el, "n1", remote_id="n2")), 0)
    assert (resp.result, resp.code) == (R.UNKNOWN, ResponseCode.UNKNOWN_MEMBER)
    resp, _ = el.step(ElectionRequest(h.vote_req(el, "n1", group="other")), 0)
    assert (resp.result, resp.code) == (R.UNKNOWN, ResponseCode.UNKNOWN_GROUP)
    assert el.state.vote_for is None


def test_a_candidate_outside_the_voters_configuration_is_judged_by_its_log(h) -> None:
    """The voter's configuration may be stale (it restarted empty, or missed a change):
    a candidate it does not know gets its vote when its log is up to date, and not
    otherwise -- never refused for being unknown."""
    el = h.make(term=1)
    resp, _ = el.step(ElectionRequest(h.vote_req(el, "stranger")), 0)
    assert resp.result is not R.REJECT_UNKNOWN_LEADER


def test_reject_unexpected_leader(h) -> None:
    el = h.make(term=1)
    resp, _ = el.step(ElectionRequest(h.vote_req(el, "n0", local_id="n1")), 0)
    assert resp.result is R.REJECT_UNEXPECTED_LEADER


def test_reject_expired_ledger_term(h) -> None:
    el = h.make(term=5, ledger=(10, 4))
    resp, _ = el.step(
        ElectionRequest(h.vote_req(el, term=6, ledger_end_index=50, ledger_end_term=3)), 0
    )
    assert resp.result is R.REJECT_EXPIRED_LEDGER_TERM and resp.term == 5
    assert (
        el.term == 5
        and el.role is Role.CANDIDATE
        and not el.snapshot()["need_increase_term_immediately"]
    )


def test_reject_small_ledger_end_index(h) -> None:
    el = h.make(term=5, ledger=(10, 4))
    resp, _ = el.step(ElectionRequest(h.vote_req(el, ledger_end_index=9, ledger_end_term=4)), 0)
    assert resp.result is R.REJECT_SMALL_LEDGER_END_INDEX


def test_reject_expired_vote_term(h) -> None:
    el = h.make(term=5)
    resp, _ = el.step(ElectionRequest(h.vote_req(el, term=4)), 0)
    assert resp.result is R.REJECT_EXPIRED_VOTE_TERM and resp.term == 5


def test_reject_already_voted(h) -> None:
    el = h.make(term=5, vote="n2")
    resp, _ = el.step(ElectionRequest(h.vote_req(el, "n1")), 0)
    assert resp.result is R.REJECT_ALREADY_VOTED
    assert el.state.vote_for == "n2"


def test_reject_already_has_leader(h) -> None:
    el = h.make(term=5, vote="n2")
    h.become_follower(el, "n2")
    resp, _ = el.step(ElectionRequest(h.vote_req(el, "n1")), 0)
    assert resp.result is R.REJECT_ALREADY_HAS_LEADER and resp.leader_id == "n2"


def test_reject_term_not_ready_steps_down_and_raises_the_term_at_the_next_tick(h) -> None:
    el = h.make(term=5, vote="n2")
    h.become_follower(el, "n2")
    resp, actions = el.step(ElectionRequest(h.vote_req(el, "n1", term=7)), 100)
    assert resp.result is R.REJECT_TERM_NOT_READY and resp.term == 5
    assert (
        el.role is Role.CANDIDATE
        and el.term == 5
        and el.snapshot()["need_increase_term_immediately"]
    )
    assert [(rc.term, rc.role) for rc in h.role_changes(actions)] == [(7, Role.CANDIDATE)]
    # DLedger's maintainer: jump to the known term, no vote this tick, new timer
    assert el.step(Tick(), 110).actions == []
    assert (
        el.term == 7
        and el.state.vote_for is None
        and not el.snapshot()["need_increase_term_immediately"]
    )
    assert el.state.term_store.load() == (7, None)
    assert 110 + 300 <= el.next_time_to_request_vote < 110 + 1000
    # now the candidate's retry is accepted
    assert el.step(ElectionRequest(h.vote_req(el, "n1", term=7)), 120)[0].result is R.ACCEPT


def test_reject_term_small_than_ledger(h) -> None:
    el = h.make(term=3, ledger=(10, 4))  # an entry of term 4 on disk, current term 3
    resp, _ = el.step(
        ElectionRequest(h.vote_req(el, term=3, ledger_end_index=10, ledger_end_term=4)), 0
    )
    assert resp.result is R.REJECT_TERM_SMALL_THAN_LEDGER and resp.term == 4


def test_reject_taking_leadership(h) -> None:
    el = h.make(term=5, ledger=(10, 5))
    el.state.term_to_take_leadership = 5
    assert el.is_taking_leadership
    resp, _ = el.step(ElectionRequest(h.vote_req(el, ledger_end_index=10, ledger_end_term=5)), 0)
    assert resp.result is R.REJECT_TAKING_LEADERSHIP
    # a candidate with a longer log is still accepted
    resp, _ = el.step(ElectionRequest(h.vote_req(el, ledger_end_index=11, ledger_end_term=5)), 0)
    assert resp.result is R.ACCEPT


def test_vote_survives_restart(h) -> None:
    store = MemoryTermStore(2, None)
    el = h.make(store=store)
    assert el.step(ElectionRequest(h.vote_req(el, "n1")), 0)[0].result is R.ACCEPT
    again = h.make(store=store)  # crash + restart: only the store survives
    assert (again.term, again.state.vote_for) == (2, "n1")
    assert (
        again.step(ElectionRequest(h.vote_req(again, "n2")), 0).reply.result
        is R.REJECT_ALREADY_VOTED
    )


# -------------------------------------------------------------- pre-vote


def test_pre_vote_changes_no_state(h) -> None:
    store = MemoryTermStore(5, None)
    el = h.make(store=store)
    el.step(Tick(), 0)
    later = el.config.heartbeat_timeout_ms + 1  # past a restarted member's quiet time
    resp, actions = el.step(ElectionRequest(h.vote_req(el, "n1", term=6, pre_vote=True)), later)
    assert resp.result is R.ACCEPT and resp.pre_vote
    assert actions == [] and store.saves == 0
    assert (el.term, el.state.vote_for, el.role) == (5, None, Role.CANDIDATE)
    assert not el.snapshot()["need_increase_term_immediately"]


def test_pre_vote_refused_while_the_leader_is_alive(h) -> None:
    el = h.make(term=5)
    h.become_follower(el, "n2", now=1000)
    req = h.vote_req(el, "n1", term=6, pre_vote=True)
    assert el.step(ElectionRequest(req), 1000 + 6000)[0].result is R.REJECT_ALREADY_HAS_LEADER
    assert (
        el.step(ElectionRequest(req), 1000 + 6001)[0].result is R.ACCEPT
    )  # leader silent too long
    assert el.role is Role.FOLLOWER


def test_a_restarted_member_grants_no_pre_vote_for_one_heartbeat_timeout(h) -> None:
    """It has forgotten when it last heard from its leader, who may still hold a read lease
    confirmed with its help: it answers as if it had just heard from one."""
    el = h.make(store=MemoryTermStore(5, None))
    timeout = el.config.heartbeat_timeout_ms
    el.step(Tick(), 1000)  # its first event
    req = h.vote_req(el, "n1", term=6, pre_vote=True)
    assert el.step(ElectionRequest(req), 1000 + timeout)[0].result is R.REJECT_ALREADY_HAS_LEADER
    assert el.step(ElectionRequest(req), 1000 + timeout + 1)[0].result is R.ACCEPT


def test_a_new_member_grants_pre_votes_at_once(h) -> None:
    """A member with nothing persisted never acknowledged a leader: no quiet time."""
    el = h.make(term=0)
    req = h.vote_req(el, "n1", term=1, pre_vote=True)
    assert el.step(ElectionRequest(req), 0)[0].result is R.ACCEPT


def test_pre_vote_refused_by_a_healthy_leader(h) -> None:
    el = h.make(term=0)
    now = h.become_leader(el)
    resp, _ = el.step(
        ElectionRequest(h.vote_req(el, "n1", term=el.term + 1, pre_vote=True)), now + 10
    )
    assert resp.result is R.REJECT_ALREADY_HAS_LEADER
    assert el.role is Role.LEADER


@pytest.mark.parametrize(
    ("kw", "result"),
    [
        ({"term": 4}, R.REJECT_EXPIRED_VOTE_TERM),
        ({"ledger_end_term": 1}, R.REJECT_EXPIRED_LEDGER_TERM),
        ({"ledger_end_index": 5}, R.REJECT_SMALL_LEDGER_END_INDEX),
    ],
)
def test_pre_vote_applies_the_log_and_term_checks(h, kw, result) -> None:
    el = h.make(term=5, ledger=(10, 2))
    fields = {"term": 6, "ledger_end_index": 10, "ledger_end_term": 2, "pre_vote": True}
    fields.update(kw)
    assert el.step(ElectionRequest(h.vote_req(el, "n1", **fields)), 0)[0].result is result


def test_pre_vote_term_small_than_ledger(h) -> None:
    el = h.make(term=3, ledger=(10, 5))
    req = h.vote_req(el, "n1", term=4, ledger_end_index=10, ledger_end_term=5, pre_vote=True)
    resp, _ = el.step(ElectionRequest(req), 0)
    assert resp.result is R.REJECT_TERM_SMALL_THAN_LEDGER and resp.term == 5


def test_pre_vote_disabled_candidate_raises_term_directly(h) -> None:
    el = h.make(term=1, config=ElectionConfig(enable_pre_vote=False))
    el.shared.last_parse_result = ParseResult.WAIT_TO_VOTE_NEXT
    actions = el.step(Tick(), 10_000).actions
    reqs = [s.message for s in h.sends(actions)]
    assert el.term == 2 and reqs and all(not r.pre_vote and r.term == 2 for r in reqs)
