"""A heartbeat handled / maintainAsFollower and sendHeartbeats / maintainAsLeader."""

from __future__ import annotations

import pytest
from rayledger.election import ElectionConfig, HeartbeatRequest, HeartbeatResponse, Role
from rayledger.election.messages import ElectionAnswer, ElectionRequest, Tick
from rayledger.storage.errors import ResponseCode

C = ResponseCode


# ------------------------------------------------------------- follower side


def test_heartbeat_makes_a_candidate_follow(h) -> None:
    el = h.make(term=4)
    resp, actions = el.step(ElectionRequest(h.hb_req(el, "n1")), 50)
    assert resp.code is C.SUCCESS and resp.term == 4
    assert (el.role, el.leader_id) == (Role.FOLLOWER, "n1")
    assert [(rc.term, rc.role, rc.leader_id) for rc in h.role_changes(actions)] == [
        (4, Role.FOLLOWER, "n1")
    ]


def test_heartbeat_from_the_known_leader_refreshes_the_timer(h) -> None:
    el = h.make(term=4)
    h.become_follower(el, "n1", now=0)
    assert el.step(ElectionRequest(h.hb_req(el, "n1")), 5000)[0].code is C.SUCCESS
    assert el.step(Tick(), 5000 + 6000).actions == [] and el.role is Role.FOLLOWER
    actions = el.step(Tick(), 5000 + 6001).actions
    assert el.role is Role.CANDIDATE and el.term == 4
    assert [(rc.term, rc.role) for rc in h.role_changes(actions)] == [(4, Role.CANDIDATE)]


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"leader_id": "", "local_id": ""}, C.UNKNOWN_MEMBER),
        ({"leader_id": "n0", "local_id": "n0"}, C.UNEXPECTED_MEMBER),
        ({"remote_id": "n2"}, C.UNKNOWN_MEMBER),
        ({"group": "other"}, C.UNKNOWN_GROUP),
    ],
)
def test_heartbeat_from_a_non_member_is_refused(h, kw, code) -> None:
    el = h.make(term=4)
    resp, actions = el.step(ElectionRequest(h.hb_req(el, "n1", **kw)), 0)
    assert resp.code is code and resp.term == 4
    assert actions == [] and el.role is Role.CANDIDATE


def test_a_leader_outside_the_configuration_is_followed(h) -> None:
    """Raft §4.2.1: this member's newest configuration may be an uncommitted one
    that the leader is about to cut, or this member the one being added."""
    el = h.make(term=4)
    resp, _ = el.step(
        ElectionRequest(h.hb_req(el, "n1", leader_id="stranger", local_id="stranger")), 0
    )
    assert resp.code is C.SUCCESS and el.role is Role.FOLLOWER and el.state.leader_id == "stranger"
    assert el.state.vote_for == "stranger"  # following spends the vote of the term


def test_expired_term(h) -> None:
    el = h.make(term=4)
    resp, _ = el.step(ElectionRequest(h.hb_req(el, "n1", term=3)), 0)
    assert resp.code is C.EXPIRED_TERM and resp.term == 4
    assert el.role is Role.CANDIDATE


def test_inconsistent_leader(h) -> None:
    el = h.make(term=4)
    h.become_follower(el, "n1")
    resp, _ = el.step(ElectionRequest(h.hb_req(el, "n2")), 10)
    assert resp.code is C.INCONSISTENT_LEADER
    assert el.leader_id == "n1"


def test_term_not_ready_steps_down_and_catches_up(h) -> None:
    el = h.make(term=4)
    h.become_follower(el, "n1")
    resp, actions = el.step(ElectionRequest(h.hb_req(el, "n2", term=6)), 10)
    assert resp.code is C.TERM_NOT_READY
    assert (
        el.role is Role.CANDIDATE
        and el.snapshot()["need_increase_term_immediately"]
        and el.term == 4
    )
    assert [(rc.term, rc.role) for rc in h.role_changes(actions)] == [(6, Role.CANDIDATE)]
    el.step(Tick(), 20)
    assert el.term == 6
    # the leader's next heartbeat now makes it follow
    assert el.step(ElectionRequest(h.hb_req(el, "n2", term=6)), 30)[0].code is C.SUCCESS
    assert (el.role, el.leader_id) == (Role.FOLLOWER, "n2")


def test_old_leader_is_not_followed_once_a_newer_term_is_known(h) -> None:
    el = h.make(term=4)
    h.become_follower(el, "n1")
    el.step(ElectionRequest(h.vote_req(el, "n2", term=5)), 10)  # steps down; term 5 pending
    assert el.term == 4 and el.snapshot()["need_increase_term_immediately"]
    resp, actions = el.step(ElectionRequest(h.hb_req(el, "n1", term=4)), 12)
    assert resp.code is C.EXPIRED_TERM and resp.term == 5
    assert el.role is Role.CANDIDATE and actions == []


def test_follower_times_out_after_max_heartbeat_leak(h) -> None:
    cfg = ElectionConfig(heartbeat_interval_ms=100, max_heartbeat_leak=2)
    el = h.make(term=1, config=cfg)
    h.become_follower(el, "n1", now=1000)
    assert el.step(Tick(), 1200).actions == [] and el.role is Role.FOLLOWER
    el.step(Tick(), 1201)
    assert el.role is Role.CANDIDATE


# --------------------------------------------------------------- leader side


def _leader(h, **kw):
    el = h.make(**kw)
    now = h.become_leader(el)
    return el, now


def test_leader_sends_heartbeats_every_interval(h) -> None:
    el, now = _leader(h, term=0)
    sends = h.sends(el.step(Tick(), now).actions)
    assert sorted(s.to for s in sends) == ["n1", "n2"]
    req = sends[0].message
    assert isinstance(req, HeartbeatRequest)
    assert (req.group, req.local_id, req.leader_id, req.term) == ("g", "n0", "n0", el.term)
    h.answer_heartbeats(el, sends, C.SUCCESS, now + 3)
    assert el.step(Tick(), now + 2000).actions == []  # DLedger: strictly more than the interval
    assert len(h.sends(el.step(Tick(), now + 2001).actions)) == 2
    assert el.peers_live() == {"n1": True, "n2": True}


def test_leader_waits_for_its_round_before_the_next(h) -> None:
    el, now = _leader(h, term=0)
    el.step(Tick(), now)  # nobody answers
    assert h.sends(el.step(Tick(), now + 1999).actions) == []
    el.step(Tick(), now + 2000)  # round deadline: parsed, still within the leak budget
    assert el.role is Role.LEADER
    assert len(h.sends(el.step(Tick(), now + 2010).actions)) == 2


def test_leader_steps_down_after_max_heartbeat_leak_without_quorum(h) -> None:
    el, now = _leader(h, term=0)
    t = now
    rounds = 0
    while el.role is Role.LEADER:
        sends = h.sends(el.step(Tick(), t).actions)
        if sends:
            rounds += 1
            h.answer_heartbeats(el, [s for s in sends if s.to == "n1"], C.NETWORK_ERROR, t + 1)
            for s in sends:
                if s.to == "n2":
                    el.step(ElectionAnswer("n2", s.message, None), t + 5)
        t += 10
        assert t < now + 20_000
    assert el.role is Role.CANDIDATE and el.term == 0
    assert 6000 < t - now <= 8100 and rounds in (3, 4)
    assert el.peers_live() == {"n1": False, "n2": False}


def test_leader_steps_down_on_a_larger_term(h) -> None:
    el, now = _leader(h, term=0)
    sends = h.sends(el.step(Tick(), now).actions)
    actions = h.answer_heartbeats(el, sends, C.EXPIRED_TERM, now + 1, term=5)
    assert el.role is Role.CANDIDATE
    assert el.state.known_max_term_in_group == 5
    assert [(rc.term, rc.role) for rc in h.role_changes(actions)] == [(5, Role.CANDIDATE)]


def test_a_leader_deposed_by_a_larger_term_campaigns_in_it(h) -> None:
    """It takes the larger term before it asks for votes: asking again in its own term got
    it re-elected by the same voters, and a non-voter at the larger term (a learner)
    deposed it again, for good (the simulation's membership seed 93151)."""
    el, now = _leader(h, term=0)
    sends = h.sends(el.step(Tick(), now).actions)
    h.answer_heartbeats(el, sends, C.EXPIRED_TERM, now + 1, term=5)
    asked = []
    t = now + 2
    while not asked:
        asked = [
            s.message
            for s in h.sends(el.step(Tick(), t).actions)
            if hasattr(s.message, "ledger_end_index")
        ]
        t += 10
        assert t < now + 10_000
    assert el.term == 5 and all(m.term >= 5 for m in asked), asked


def test_leader_steps_down_when_another_leader_is_followed(h) -> None:
    el, now = _leader(h, term=0)
    sends = h.sends(el.step(Tick(), now).actions)
    h.answer_heartbeats(el, sends, C.INCONSISTENT_LEADER, now + 1)
    assert el.role is Role.CANDIDATE and el.term == 0


def test_not_ready_followers_get_an_immediate_heartbeat(h) -> None:
    el, now = _leader(h, term=0)
    sends = h.sends(el.step(Tick(), now).actions)
    h.answer_heartbeats(el, sends[:1], C.TERM_NOT_READY, now + 1)  # 1 + 1 not ready = quorum
    assert el.role is Role.LEADER
    assert len(h.sends(el.step(Tick(), now + 10).actions)) == 2


def test_one_success_is_a_quorum_of_three(h) -> None:
    el, now = _leader(h, term=0)
    sends = h.sends(el.step(Tick(), now).actions)
    h.answer_heartbeats(el, sends[:1], C.SUCCESS, now + 1)
    # round over: the straggler's answer is stale
    stale = HeartbeatResponse(C.EXPIRED_TERM, 9)
    assert el.step(ElectionAnswer(sends[1].to, sends[1].message, stale), now + 2).actions == []
    assert el.role is Role.LEADER


def test_leader_rejects_heartbeat_of_another_leader_in_its_term(h) -> None:
    el, now = _leader(h, term=0)
    resp, _ = el.step(ElectionRequest(h.hb_req(el, "n1")), now)
    assert resp.code is C.INCONSISTENT_LEADER and el.role is Role.LEADER


# ------------------------------------------------------------- when to tick next


def test_next_tick_follows_the_heartbeat_timers(h) -> None:
    el = h.make(term=4)
    assert el.next_tick_ms(0, 10) == 10  # a candidate keeps the fine granularity
    h.become_follower(el, "n1", now=0)
    el.step(ElectionRequest(h.hb_req(el, "n1")), 5000)
    timeout = el.config.heartbeat_timeout_ms
    nxt = el.next_tick_ms(5100, 10)
    assert nxt == 5000 + timeout + 1
    # sleeping until then is never late: one ms earlier the follower still follows
    assert el.step(Tick(), nxt - 1).actions == [] and el.role is Role.FOLLOWER
    assert el.step(Tick(), nxt).actions and el.role is Role.CANDIDATE


def test_next_tick_of_a_leader_is_its_next_heartbeat(h) -> None:
    el = h.make(term=4)
    now = h.become_leader(el, now=0)
    el.step(Tick(), now)  # sends the first heartbeats
    nxt = el.next_tick_ms(now, 10)
    assert now < nxt <= now + el.config.heartbeat_interval_ms + 1


def test_a_preferred_leader_sleeps_until_its_next_heartbeat(h) -> None:
    """Being the preferred leader leaves no check to make: no 10 ms ticks when idle."""
    el = h.make(term=4, config=ElectionConfig(preferred_leader_ids=("n0",)))
    now = h.become_leader(el, now=0)
    el.step(Tick(), now)
    assert el.next_tick_ms(now, 10) > now + 10


def test_another_leader_wakes_for_its_preferred_leader_check(h) -> None:
    interval = 300
    cfg = ElectionConfig(preferred_leader_ids=("n1",), check_preferred_leader_interval_ms=interval)
    el = h.make(term=4, config=cfg)
    now = h.become_leader(el, now=0)
    el.step(Tick(), now)  # the first check and heartbeats
    nxt = el.next_tick_ms(now, 10)
    assert nxt == now + interval <= now + el.config.heartbeat_interval_ms + 1
