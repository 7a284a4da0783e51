"""maintainAsCandidate: timers, the vote round, and every parse result."""

from __future__ import annotations

import pytest
from rayledger.election import (
    ElectionConfig,
    ParseResult,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from rayledger.election.messages import ElectionAnswer, QuitLeadership, Tick

R = VoteResult
P = ParseResult


def _round(h, el, now):
    actions = el.step(Tick(), now).actions
    sends = h.sends(actions)
    assert el.snapshot()["in_vote_round"], el.snapshot()
    return sends


def _answer(el, sends, results, now, terms=None):
    out = []
    for i, (s, result) in enumerate(zip(sends, results, strict=False)):
        if result is None:
            out.extend(el.step(ElectionAnswer(s.to, s.message, None), now).actions)
            continue
        term = s.message.term if terms is None else terms[i]
        out.extend(
            el.step(ElectionAnswer(s.to, s.message, VoteResponse(result, term)), now).actions
        )
    return out


def test_first_tick_votes_for_itself_and_asks_every_peer(h) -> None:
    el = h.make(term=0)
    sends = _round(h, el, 0)
    assert sorted(s.to for s in sends) == ["n1", "n2"]
    for s in sends:
        req = s.message
        assert isinstance(req, VoteRequest)
        assert (req.group, req.local_id, req.remote_id, req.leader_id) == ("g", "n0", s.to, "n0")
        assert (req.term, req.ledger_end_index, req.ledger_end_term, req.pre_vote) == (
            0,
            -1,
            -1,
            False,
        )
    assert el.state.vote_for == "n0"  # the self vote, persisted
    assert el.state.term_store.load() == (0, "n0")


def test_round_waits_until_its_deadline_then_parses(h) -> None:
    el = h.make(term=1)
    _round(h, el, 0)
    deadline = el.voting.round.deadline_ms
    assert 2000 <= deadline < 3000  # 2000 + random(maxVoteIntervalMs)
    assert el.step(Tick(), deadline - 1).actions == [] and el.snapshot()["in_vote_round"]
    el.step(Tick(), deadline)
    assert not el.snapshot()["in_vote_round"]
    # only its own vote was valid: no quorum -> WAIT_TO_REVOTE, same term
    assert el.last_parse_result is P.WAIT_TO_REVOTE and el.term == 1
    assert deadline + 300 <= el.next_time_to_request_vote < deadline + 1000


def test_timer_gates_the_next_round(h) -> None:
    el = h.make(term=1)
    _round(h, el, 0)
    el.step(Tick(), el.voting.round.deadline_ms)
    nxt = el.next_time_to_request_vote
    assert el.step(Tick(), nxt - 1).actions == [] and not el.snapshot()["in_vote_round"]
    assert h.sends(el.step(Tick(), nxt).actions)


def test_passed_becomes_leader_and_says_so_in_a_role_change(h) -> None:
    el = h.make(term=3, midlife=True)  # not just restarted (see below)
    sends = _round(h, el, 0)
    actions = _answer(el, sends[:1], [R.ACCEPT], 5)  # self + 1 = quorum of 3: no need to wait
    assert el.role is Role.LEADER and el.leader_id == "n0" and el.last_parse_result is P.PASSED
    assert [(rc.term, rc.role, rc.leader_id) for rc in h.role_changes(actions)] == [
        (3, Role.LEADER, "n0")
    ]
    # the late answer of the third member belongs to a finished round
    assert _answer(el, sends[1:], [R.ACCEPT], 6) == []


def test_larger_term_in_a_rejection_means_wait_to_vote_next_at_that_term(h) -> None:
    el = h.make(term=3)
    sends = _round(h, el, 0)
    actions = _answer(
        el, sends, [R.REJECT_EXPIRED_VOTE_TERM, R.REJECT_TERM_SMALL_THAN_LEDGER], 5, terms=[6, 8]
    )
    assert el.last_parse_result is P.WAIT_TO_VOTE_NEXT
    assert el.state.known_max_term_in_group == 8
    assert [(rc.term, rc.role) for rc in h.role_changes(actions)] == [(8, Role.CANDIDATE)]
    # catching up to a term the group already uses needs no pre-vote
    sends = h.sends(el.step(Tick(), el.next_time_to_request_vote).actions)
    assert el.term == 8 and sends and not sends[0].message.pre_vote and sends[0].message.term == 8


def test_already_has_leader_backs_off_for_the_heartbeat_timeout(h) -> None:
    el = h.make(term=3)
    sends = _round(h, el, 0)
    _answer(el, sends[:1], [R.REJECT_ALREADY_HAS_LEADER], 5)  # ends the round at once
    assert not el.snapshot()["in_vote_round"]
    assert el.last_parse_result is P.WAIT_TO_REVOTE and el.term == 3
    assert 5 + 300 + 6000 <= el.next_time_to_request_vote < 5 + 1000 + 6000


def test_no_valid_quorum_revotes_in_the_same_term(h) -> None:
    el = h.make(term=3, vote="n1")  # its own vote is a valid rejection
    sends = _round(h, el, 0)
    _answer(el, sends, [None, None], 5)  # both calls failed: counted, not valid
    assert el.last_parse_result is P.WAIT_TO_REVOTE and el.term == 3


def test_bigger_ledgers_add_max_vote_interval(h) -> None:
    el = h.make(term=3)
    sends = _round(h, el, 0)
    _answer(el, sends, [R.REJECT_EXPIRED_LEDGER_TERM, R.REJECT_SMALL_LEDGER_END_INDEX], 5)
    assert el.last_parse_result is P.WAIT_TO_REVOTE and el.term == 3
    assert 5 + 300 + 1000 <= el.next_time_to_request_vote < 5 + 1000 + 1000


def test_not_ready_voters_mean_revote_immediately(h) -> None:
    el = h.make(term=3, midlife=True)
    sends = _round(h, el, 0)
    nxt = el.next_time_to_request_vote
    _answer(el, sends[:1], [R.REJECT_TERM_NOT_READY], 5)  # 1 accept + 1 not ready = quorum
    assert el.last_parse_result is P.REVOTE_IMMEDIATELY
    assert el.next_time_to_request_vote == nxt  # timer untouched
    sends = h.sends(el.step(Tick(), 15).actions)
    assert sends and sends[0].message.term == 3  # same term, at the very next tick


def test_rejections_lead_to_a_pre_vote_for_the_next_term(h) -> None:
    el = h.make(term=3)
    sends = _round(h, el, 0)
    _answer(el, sends, [R.REJECT_ALREADY_VOTED, R.REJECT_TAKING_LEADERSHIP], 5)
    assert el.last_parse_result is P.WAIT_TO_VOTE_NEXT and el.term == 3
    sends = h.sends(el.step(Tick(), el.next_time_to_request_vote).actions)
    assert [s.message.pre_vote for s in sends] == [True, True]
    assert sends[0].message.term == 4 and el.term == 3  # asked, not raised
    actions = _answer(el, sends[:1], [R.ACCEPT], 1500)  # pre-vote passed
    real = h.sends(actions)
    assert el.term == 4 and el.state.vote_for == "n0"
    assert real and all(not s.message.pre_vote and s.message.term == 4 for s in real)


def test_failed_pre_vote_keeps_the_term(h) -> None:
    el = h.make(term=3)
    el.shared.last_parse_result = P.WAIT_TO_VOTE_NEXT
    sends = h.sends(el.step(Tick(), 0).actions)
    assert sends[0].message.pre_vote
    _answer(el, sends, [R.REJECT_ALREADY_HAS_LEADER, R.REJECT_ALREADY_HAS_LEADER], 5)
    assert el.term == 3 and el.state.term_store.load() == (3, None)
    assert el.last_parse_result is P.WAIT_TO_REVOTE


def test_stale_and_duplicate_answers_are_ignored(h) -> None:
    el = h.make(term=3)
    sends = _round(h, el, 0)
    first = sends[0]
    el.step(ElectionAnswer(first.to, first.message, VoteResponse(R.REJECT_ALREADY_VOTED, 3)), 1)
    # the same voter again (a duplicated message) does not count twice
    assert (
        el.step(ElectionAnswer(first.to, first.message, VoteResponse(R.ACCEPT, 3)), 2).actions == []
    )
    assert el.snapshot()["in_vote_round"] and el.role is Role.CANDIDATE
    # an answer to a request from another round is dropped
    other = VoteRequest(**{**first.message.__dict__, "round_id": first.message.round_id - 1})
    assert el.step(ElectionAnswer(sends[1].to, other, VoteResponse(R.ACCEPT, 3)), 3).actions == []
    assert el.role is Role.CANDIDATE


def test_single_member_group_elects_itself(h) -> None:
    el = h.make(peers=("n0",), term=0)
    actions = el.step(Tick(), 0).actions
    assert el.role is Role.LEADER and h.sends(actions) == []


def test_take_leadership_uses_its_short_vote_interval(h) -> None:
    el = h.make(term=5)
    el.state.term_to_take_leadership = 5
    assert el.voting.next_time_to_request_vote(0) in range(30, 100)
    el.state.term_to_take_leadership = -1
    assert el.voting.next_time_to_request_vote(0) in range(300, 1000)


def test_vote_wait_uses_configured_base(h) -> None:
    el = h.make(term=1, config=ElectionConfig(vote_wait_base_ms=50, max_vote_interval_ms=400))
    _round(h, el, 0)
    assert 50 <= el.voting.round.deadline_ms < 450


def test_a_restarted_member_never_campaigns_in_its_old_term(h) -> None:
    """After a restart (persisted term or vote) the first candidacy raises the term: a power
    loss may have dropped entries the member acknowledged in its old term, and leading that
    term again could write different ones at the same (index, term)."""
    for term, vote in ((3, None), (3, "n0"), (0, "n1")):
        el = h.make(term=term, vote=vote)
        now, vote_terms = 0, []
        for _ in range(400):
            for s in h.sends(el.step(Tick(), now).actions):
                if isinstance(s.message, VoteRequest) and not s.message.pre_vote:
                    vote_terms.append(s.message.term)
                elif isinstance(s.message, VoteRequest):  # grant the pre-vote
                    el.step(
                        ElectionAnswer(s.to, s.message, VoteResponse(R.ACCEPT, s.message.term)), now
                    )
            if vote_terms:
                break
            now += 10
        assert vote_terms and min(vote_terms) > term, (term, vote, vote_terms)


@pytest.mark.parametrize("answer", [R.REJECT_ALREADY_HAS_LEADER, None])
def test_a_restarted_member_whose_pre_votes_fail_never_votes_in_its_old_term(h, answer) -> None:
    """After a restart, the other path: pre-votes refused (a live leader is heard) or
    unanswered leave the candidate waiting to revote; its next real round must still not
    be in the term it held before the restart, where voters would grant it again."""
    el = h.make(term=3, vote="n0")
    now, vote_terms, pre_votes = 0, [], 0
    for _ in range(6000):
        for s in h.sends(el.step(Tick(), now).actions):
            msg = s.message
            if not isinstance(msg, VoteRequest):
                continue
            if not msg.pre_vote:
                vote_terms.append(msg.term)
                el.step(ElectionAnswer(s.to, msg, VoteResponse(R.ACCEPT, msg.term)), now)
            else:
                pre_votes += 1
                if answer is not None and pre_votes < 8:
                    el.step(ElectionAnswer(s.to, msg, VoteResponse(answer, 3)), now)
                elif pre_votes >= 8:  # the leader is gone at last: grant
                    el.step(ElectionAnswer(s.to, msg, VoteResponse(R.ACCEPT, msg.term)), now)
        now += 10
    assert vote_terms and min(vote_terms) > 3, vote_terms
    assert pre_votes >= 8, pre_votes
    assert not (el.state.is_leader and el.state.current_term == 3)


def test_a_fresh_member_campaigns_in_term_zero(h) -> None:
    el = h.make(term=0)
    sends = _round(h, el, 0)
    assert {s.message.term for s in sends} == {0}


def test_a_leader_that_steps_down_waits_an_election_timeout_before_it_campaigns(h) -> None:
    """A leader that cannot serve its term (its first entry cannot be written, its helpers
    are lost) leaves it at once, and campaigns only after one election timeout, so a peer
    that can serve is elected first."""
    el = h.make(term=3, midlife=True)
    h.become_leader(el, 0)
    assert el.role is Role.LEADER
    changes = h.role_changes(el.step(QuitLeadership(), 100).actions)
    assert el.role is Role.CANDIDATE and el.term == 3
    assert [c.role for c in changes] == [Role.CANDIDATE]
    timeout = el.config.heartbeat_timeout_ms
    votes = []
    now = 100
    while now < 100 + timeout:
        votes += [
            s for s in h.sends(el.step(Tick(), now).actions) if isinstance(s.message, VoteRequest)
        ]
        now += 10
    assert votes == [], "campaigned within an election timeout of stepping down"
    assert el.step(QuitLeadership(), now).actions == []  # only a leader steps down
