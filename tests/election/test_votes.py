"""The vote tally, table-driven (as etcd's quorum.VoteResult tests): answers in, decision out."""

from __future__ import annotations

import pytest
from rayledger.election.messages import ParseResult, VoteResponse, VoteResult
from rayledger.election.votes import Decision, VoteTally, Wait, quorum

R, P = VoteResult, ParseResult
A, LEADER, SMALL_LEDGER = R.ACCEPT, R.REJECT_ALREADY_HAS_LEADER, R.REJECT_SMALL_LEDGER_END_INDEX
EXPIRED, NOT_READY, OLD_TERM = (
    R.REJECT_EXPIRED_LEDGER_TERM,
    R.REJECT_TERM_NOT_READY,
    R.REJECT_EXPIRED_VOTE_TERM,
)
FAILED = None  # the call failed


def tally(answers, term: int = 5, members: int | None = None) -> VoteTally:
    t = VoteTally(1, term, False, 0, 100, known_max_term_in_group=term)
    for a in answers:
        if a is None:
            t.count(None)
        elif isinstance(a, tuple):  # (result, the voter's term)
            t.count(VoteResponse(a[0], a[1]))
        else:
            t.count(VoteResponse(a, term))
    return t


@pytest.mark.parametrize(
    ("answers", "members", "decision"),
    [
        # a quorum of accepts wins
        ([A, A, A], 3, Decision(P.PASSED, Wait.NONE)),
        ([A, A, FAILED], 3, Decision(P.PASSED, Wait.NONE)),
        ([A, A, A, FAILED, FAILED], 5, Decision(P.PASSED, Wait.NONE)),
        # too few answered at all: try again after the vote interval
        ([A, FAILED, FAILED], 3, Decision(P.WAIT_TO_REVOTE, Wait.INTERVAL)),
        ([A, A, FAILED, FAILED, FAILED], 5, Decision(P.WAIT_TO_REVOTE, Wait.INTERVAL)),
        # a voter knows a leader: give it a heartbeat timeout
        ([A, LEADER, A], 3, Decision(P.WAIT_TO_REVOTE, Wait.PLUS_HEARTBEAT_TIMEOUT)),
        # a voter knows a larger term: become candidate there first
        ([A, (OLD_TERM, 9), A], 3, Decision(P.WAIT_TO_VOTE_NEXT, Wait.INTERVAL, 9)),
        ([A, (R.REJECT_TERM_SMALL_THAN_LEDGER, 7)], 3, Decision(P.WAIT_TO_VOTE_NEXT, Wait.INTERVAL, 7)),
        # a larger term outranks a known leader (first match wins)
        ([A, LEADER, (OLD_TERM, 9)], 3, Decision(P.WAIT_TO_VOTE_NEXT, Wait.INTERVAL, 9)),
        # a quorum of voters hold longer logs: wait longer, someone else should win
        ([A, SMALL_LEDGER, EXPIRED], 3, Decision(P.WAIT_TO_REVOTE, Wait.PLUS_MAX_VOTE_INTERVAL)),
        ([A, A, SMALL_LEDGER, SMALL_LEDGER, SMALL_LEDGER], 5,
         Decision(P.WAIT_TO_REVOTE, Wait.PLUS_MAX_VOTE_INTERVAL)),
        # voters not yet in the term would accept: vote again at once
        ([A, NOT_READY, NOT_READY], 3, Decision(P.REVOTE_IMMEDIATELY, Wait.NONE)),
        ([A, A, NOT_READY, R.REJECT_ALREADY_VOTED, FAILED], 5, Decision(P.REVOTE_IMMEDIATELY, Wait.NONE)),
        # valid answers but no quorum either way: next term
        ([A, R.REJECT_ALREADY_VOTED, R.REJECT_ALREADY_VOTED], 3, Decision(P.WAIT_TO_VOTE_NEXT, Wait.INTERVAL)),
        # UNKNOWN answers are not valid votes
        ([A, R.UNKNOWN, R.UNKNOWN], 3, Decision(P.WAIT_TO_REVOTE, Wait.INTERVAL)),
    ],
)  # fmt: skip
def test_decisions(answers, members, decision) -> None:
    assert tally(answers).decide(members) == decision


@pytest.mark.parametrize(
    ("answers", "members", "done"),
    [
        ([A], 3, False),
        ([A, A], 3, True),  # a quorum accepted: the rest cannot change it
        ([A, NOT_READY], 3, True),  # would accept once in the term
        ([A, LEADER], 3, True),
        ([A, R.REJECT_ALREADY_VOTED], 3, False),
        ([A, R.REJECT_ALREADY_VOTED, FAILED], 3, True),  # everyone answered
        ([A, A], 5, False),
    ],
)
def test_a_round_ends_once_its_outcome_is_settled(answers, members, done) -> None:
    assert tally(answers).done(members) is done


def test_quorum() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5, 7)] == [1, 2, 2, 3, 3, 4]
