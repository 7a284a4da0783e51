"""The elector on a configuration with learners: only voters are asked for votes, only
voters' answers make a majority, and a learner (or a member removed) never campaigns."""

from __future__ import annotations

import random

from rayledger.election import (
    ElectionConfig,
    Elector,
    HeartbeatRequest,
    MemberState,
    MemoryTermStore,
    Role,
    VoteRequest,
    VoteResult,
)
from rayledger.election.configuration import ConfigLog, Configuration
from rayledger.election.messages import ElectionRequest, Tick
from rayledger.replication.checker import CountVoters, LeadTerm, MarkStored
from rayledger.storage.errors import ResponseCode

CONFIG = Configuration.of(["n0", "n1", "n2"], ["n3", "n4"])


def _make(self_id: str, config: Configuration = CONFIG) -> Elector:
    state = MemberState("g", self_id, config.voters, MemoryTermStore(), config=ConfigLog(config))
    return Elector(state, ElectionConfig(), random.Random(0))


def test_a_candidate_asks_only_the_voters_and_needs_a_majority_of_them(h) -> None:
    el = _make("n0")
    assert el.state.peers == ("n0", "n1", "n2", "n3", "n4") and el.state.voter_size == 3
    now = 0
    for _ in range(20):  # pre-vote first, then the real vote
        acts = el.step(Tick(), now).actions
        asked = sorted(s.to for s in h.sends(acts) if isinstance(s.message, VoteRequest))
        if asked:
            assert asked == ["n1", "n2"]  # never the learners
            acts = h.answer_votes(el, [s for s in h.sends(acts) if s.to == "n1"],
                                  VoteResult.ACCEPT, now)  # fmt: skip
        if el.role is Role.LEADER:
            break
        now = max(now + 10, el.next_time_to_request_vote)
    assert el.role is Role.LEADER  # itself and n1: two of three voters


def test_heartbeat_answers_of_learners_make_no_majority(h) -> None:
    el = _make("n0")
    h.become_leader(el)
    st = el.state
    assert st.is_quorum(2) and not st.is_quorum(1)
    acts = el.step(Tick(), 10_000).actions
    to = sorted(s.to for s in h.sends(acts) if isinstance(s.message, HeartbeatRequest))
    assert to == ["n1", "n2", "n3", "n4"]  # every member hears the leader
    before = el.shared.timers.last_succ_heartbeat_ms
    h.answer_heartbeats(el, acts, ResponseCode.SUCCESS, 10_001, only={"n3", "n4"})
    assert el.shared.timers.last_succ_heartbeat_ms == before  # the learners alone: no majority
    h.answer_heartbeats(el, acts, ResponseCode.SUCCESS, 10_002, only={"n1"})
    assert el.shared.timers.last_succ_heartbeat_ms == 10_002


def test_a_learner_never_campaigns_and_a_voter_behind_its_promotion_votes_for_it(h) -> None:
    learner = _make("n3")
    for now in range(0, 30_000, 500):
        assert not h.sends(learner.step(Tick(), now).actions)
    assert learner.state.current_term == 0  # it never even raised its term
    # a candidate the voter still knows as a learner (its promotion is later in the
    # candidate's log than the voter's): judged by the logs, as Raft's votes are
    voter = _make("n1")
    req = VoteRequest(group="g", local_id="n3", remote_id="n1", leader_id="n3", term=1,
                      ledger_end_index=5, ledger_end_term=1)  # fmt: skip
    resp, _ = voter.step(ElectionRequest(req), 0)
    assert resp.result is not VoteResult.REJECT_UNKNOWN_LEADER  # (DLedger: term first)


def test_a_member_removed_from_its_latest_configuration_stops_campaigning(h) -> None:
    log = ConfigLog(Configuration.of(["n0", "n1", "n2"]))
    state = MemberState("g", "n2", ("n0", "n1", "n2"), MemoryTermStore(), config=log)
    el = Elector(state, ElectionConfig(), random.Random(0))
    log.appended(3, Configuration.of(["n0", "n1"]))  # its log holds its removal
    for now in range(0, 30_000, 500):
        assert not h.sends(el.step(Tick(), now).actions)


def test_the_checker_commits_what_a_majority_of_the_voters_stores() -> None:
    """Learners' water marks make no majority; a configuration change moves the majority."""
    from rayledger.replication import QuorumAckChecker, ReplicationConfig

    c = QuorumAckChecker("g", "n0", ["n0", "n1", "n2"], ReplicationConfig())
    c.step(CountVoters(["n0", "n1", "n2"], ["n3", "n4"]), 0)
    c.step(LeadTerm(1, 0, 10), 0)
    for learner in ("n3", "n4"):
        c.step(MarkStored(1, learner, 10), 0)
    assert c.quorum_index() == -1  # the leader alone among the voters
    c.step(MarkStored(1, "n1", 7), 0)
    assert c.quorum_index() == 7
    c.step(CountVoters(["n0", "n1", "n2", "n3"], ["n4"]), 0)  # n3 promoted: 3 of 4 needed
    assert c.quorum_index() == 7
    c.step(MarkStored(1, "n2", 4), 0)
    assert c.quorum_index() == 7  # n0 10, n3 10, n1 7
    c.step(CountVoters(["n0", "n3"]), 0)  # n1, n2 gone (two steps, shown at once here)
    assert c.quorum_index() == 10 and "n1" not in c.water_marks()


def test_a_candidate_whose_voters_changed_in_its_term_campaigns_in_the_next(h) -> None:
    """DLedger campaigns again in its current term after a lost vote.  Once the voters
    changed in that term, votes granted in it to this member before (a minority of the
    old voters) could make a majority of the new ones and a second leader of the term:
    the member enters the next term instead."""
    log = ConfigLog(Configuration.of(["n0", "n1", "n2", "n3", "n4"]))
    state = MemberState("g", "n1", ("n0", "n1", "n2", "n3", "n4"), MemoryTermStore(term=1),
                        config=log)  # fmt: skip
    assert not state.voters_changed_in_term()
    log.appended(3, Configuration.of(["n0", "n1", "n2", "n3"]))
    log.appended(4, Configuration.of(["n0", "n1", "n2"]))
    assert state.voters_changed_in_term()
    el = Elector(state, ElectionConfig(enable_pre_vote=False), random.Random(0))
    votes = []
    for now in range(0, 30_000, 50):
        votes = [s.message for s in h.sends(el.step(Tick(), now).actions) if not s.message.pre_vote]
        if votes:
            break
    assert votes and {v.term for v in votes} == {2} and state.current_term == 2
    assert not state.voters_changed_in_term()  # a new term begins with the new voters
