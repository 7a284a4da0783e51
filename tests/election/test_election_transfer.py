"""Leadership transfer, preferred leader, role-change handlers, and a pre-vote scenario."""

from __future__ import annotations

import pytest
from rayledger.election import (
    ElectionConfig,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    Role,
    RoleChange,
    Send,
    TransferOutcome,
    VoteResult,
)
from rayledger.election.messages import (
    ElectionAnswer,
    ElectionRequest,
    HandOverOrder,
    PeerProgress,
    Tick,
    TransferOrder,
)
from rayledger.storage.errors import ResponseCode

C = ResponseCode


def _leader(h, **kw):
    el = h.make(**kw)
    now = h.become_leader(el)
    return el, now


def _take_order(sends):
    (send,) = [s for s in sends if isinstance(s.message, LeadershipTransferRequest)]
    return send


# ------------------------------------------------------------------ leader leg


def test_transfer_blocks_appends_and_orders_the_caught_up_transferee(h) -> None:
    el, now = _leader(h, term=0, ledger=(-1, -1))
    h.set_log_end(el.state, 50, el.term)
    el.step(PeerProgress("n2", el.term, 50), now)
    resp, actions = el.step(TransferOrder("n2"), now)
    assert isinstance(resp, LeadershipTransferResponse) and resp.code is C.SUCCESS
    assert el.transferring and el.state.transferee == "n2"
    order = _take_order(h.sends(actions))
    assert order.to == "n2"
    req = order.message
    assert (req.transfer_id, req.transferee_id, req.term, req.take_leadership_ledger_index) == (
        "n0",
        "n2",
        el.term,
        50,
    )
    assert req.wait_timeout_ms == 1000


def test_transfer_waits_for_the_transferee_to_come_within_wait_index(h) -> None:
    cfg = ElectionConfig(max_leadership_transfer_wait_index=10)
    el, now = _leader(h, term=0, config=cfg)
    h.set_log_end(el.state, 100, el.term)
    el.step(PeerProgress("n1", el.term, 80), now)
    resp, actions = el.step(TransferOrder("n1"), now)
    assert resp.code is C.SUCCESS and h.sends(actions) == []
    assert el.step(PeerProgress("n1", el.term, 90), now + 10).actions == []  # 10 behind: not yet
    order = _take_order(el.step(PeerProgress("n1", el.term, 91), now + 20).actions)
    assert order.message.take_leadership_ledger_index == 100
    assert order.message.wait_timeout_ms == 1000 - 20


def test_transfer_is_abandoned_at_its_deadline(h) -> None:
    cfg = ElectionConfig(max_leadership_transfer_wait_index=10)
    el, now = _leader(h, term=0, config=cfg)
    h.set_log_end(el.state, 100, el.term)
    el.step(TransferOrder("n1"), now)
    assert [a for a in el.step(Tick(), now + 1000).actions if isinstance(a, TransferOutcome)] == []
    actions = el.step(Tick(), now + 1001).actions
    assert [a for a in actions if isinstance(a, TransferOutcome)] == [
        TransferOutcome(el.term, "n1", C.TIMEOUT)
    ]
    assert not el.transferring and el.role is Role.LEADER


def test_transfer_is_abandoned_when_the_transferee_refuses_or_is_unreachable(h) -> None:
    el, now = _leader(h, term=0)
    _, actions = el.step(TransferOrder("n1"), now)
    order = _take_order(h.sends(actions))
    refusal = LeadershipTransferResponse(C.INCONSISTENT_TERM, el.term)
    out = el.step(ElectionAnswer("n1", order.message, refusal), now + 5).actions
    assert out == [TransferOutcome(el.term, "n1", C.INCONSISTENT_TERM)] and not el.transferring

    _, actions = el.step(TransferOrder("n2"), now + 10)
    order = _take_order(h.sends(actions))
    out = el.step(ElectionAnswer("n2", order.message, None), now + 20).actions
    assert out == [TransferOutcome(el.term, "n2", C.TAKE_LEADERSHIP_FAILED)]


def test_transfer_succeeds_when_the_leader_sees_the_new_term(h) -> None:
    el, now = _leader(h, term=0)
    _, actions = el.step(TransferOrder("n1"), now)
    order = _take_order(h.sends(actions))
    ok = LeadershipTransferResponse(C.SUCCESS, el.term)
    assert el.step(ElectionAnswer("n1", order.message, ok), now + 5).actions == []
    assert el.transferring
    vote = h.vote_req(el, "n1", term=el.term + 1)
    _, actions = el.step(ElectionRequest(vote), now + 50)
    assert TransferOutcome(el.term, "n1", C.SUCCESS) in actions
    assert el.role is Role.CANDIDATE and not el.transferring


@pytest.mark.parametrize(
    ("setup", "kw", "code"),
    [
        ("leader", {"transferee_id": "stranger"}, C.UNKNOWN_MEMBER),
        ("leader", {"term": 99}, C.INCONSISTENT_TERM),
        ("candidate", {}, C.NOT_LEADER),
        ("transferring", {}, C.LEADER_TRANSFERRING),
        ("leader", {"remote_id": "n1"}, C.UNKNOWN_MEMBER),
        ("leader", {"group": "x"}, C.UNKNOWN_GROUP),
        ("leader", {"transfer_id": "n1", "transferee_id": "n2"}, C.UNEXPECTED_ARGUMENT),
    ],
)
def test_transfer_request_checks(h, setup, kw, code) -> None:
    if setup == "candidate":
        el, now = h.make(term=0), 0
    else:
        el, now = _leader(h, term=0)
    if setup == "transferring":
        el.step(TransferOrder("n2"), now)
    fields = dict(
        group="g",
        local_id="admin",
        remote_id="n0",
        term=el.term,
        transfer_id="n0",
        transferee_id="n1",
    )
    fields.update(kw)
    resp, actions = el.step(ElectionRequest(LeadershipTransferRequest(**fields)), now)
    assert resp.code is code
    assert h.sends(actions) == []


def test_transfer_to_itself_is_a_no_op(h) -> None:
    el, now = _leader(h, term=0)
    resp, actions = el.step(TransferOrder("n0"), now)
    assert resp.code is C.SUCCESS and actions == [] and not el.transferring


# ------------------------------------------------------------- transferee leg


def _order(el, leader="n1", index=-1, term=None, wait=1000):
    return LeadershipTransferRequest(
        group="g",
        local_id=leader,
        remote_id=el.self_id,
        term=el.term if term is None else term,
        transfer_id=leader,
        transferee_id=el.self_id,
        leader_id=leader,
        take_leadership_ledger_index=index,
        wait_timeout_ms=wait,
    )


def test_transferee_votes_at_once_for_the_next_term(h) -> None:
    el = h.make(term=4, ledger=(30, 4))
    h.become_follower(el, "n1")
    resp, actions = el.step(ElectionRequest(_order(el, index=30)), 100)
    assert resp.code is C.SUCCESS
    assert el.role is Role.CANDIDATE and el.snapshot()["need_increase_term_immediately"]
    assert el.state.term_to_take_leadership == 5
    assert [(rc.term, rc.role) for rc in h.role_changes(actions)] == [(5, Role.CANDIDATE)]
    assert el.step(Tick(), 110).actions == [] and el.term == 5 and el.is_taking_leadership
    assert 110 + 30 <= el.next_time_to_request_vote < 110 + 100
    sends = h.sends(el.step(Tick(), el.next_time_to_request_vote).actions)
    assert sends and all(s.message.term == 5 and s.message.take_leadership for s in sends)
    assert not sends[0].message.pre_vote
    # a repeated order (duplicated message) is answered the same way
    assert el.step(ElectionRequest(_order(el, index=30, term=4)), 120)[0].code is C.SUCCESS
    h.answer_votes(el, sends, VoteResult.ACCEPT, 200)
    assert el.role is Role.LEADER and el.state.term_to_take_leadership == -1


def test_transferee_waits_to_catch_up_then_votes(h) -> None:
    el = h.make(term=4, ledger=(20, 4))
    h.become_follower(el, "n1")
    resp, actions = el.step(ElectionRequest(_order(el, index=30)), 100)
    assert resp.code is C.SUCCESS and el.role is Role.FOLLOWER and actions == []
    el.step(Tick(), 150)
    assert el.role is Role.FOLLOWER
    h.set_log_end(el.state, 30, 4)
    actions = el.step(Tick(), 160).actions
    assert el.role is Role.CANDIDATE and el.state.term_to_take_leadership == 5


def test_transferee_gives_up_when_it_cannot_catch_up_in_time(h) -> None:
    el = h.make(term=4, ledger=(20, 4))
    h.become_follower(el, "n1")
    el.step(ElectionRequest(_order(el, index=30, wait=300)), 100)
    el.step(ElectionRequest(h.hb_req(el, "n1")), 401)
    el.step(Tick(), 401)
    h.set_log_end(el.state, 30, 4)
    el.step(Tick(), 410)
    assert el.role is Role.FOLLOWER and el.state.term_to_take_leadership == -1


@pytest.mark.parametrize(
    ("leader", "term", "code"),
    [("n2", None, C.INCONSISTENT_LEADER), ("n1", 3, C.INCONSISTENT_TERM)],
)
def test_transferee_checks_leader_and_term(h, leader, term, code) -> None:
    el = h.make(term=4)
    h.become_follower(el, "n1")
    resp, actions = el.step(ElectionRequest(_order(el, leader=leader, term=term)), 0)
    assert resp.code is code and actions == [] and el.role is Role.FOLLOWER


# ------------------------------------------------------------ preferred leader


def test_leader_hands_over_to_a_live_preferred_member(h) -> None:
    cfg = ElectionConfig(preferred_leader_ids="n2")
    el, now = _leader(h, term=0, config=cfg)
    sends = h.sends(el.step(Tick(), now).actions)
    h.answer_heartbeats(el, sends, C.SUCCESS, now + 1)
    assert el.peers_live()["n2"]
    actions = []
    t = now + 10
    while not el.transferring:
        actions = el.step(Tick(), t).actions
        t += 10
        assert t < now + 1100
    assert t - now >= 1000  # checked once a second
    assert _take_order(h.sends(actions)).to == "n2"


def test_preferred_leader_check_skips_dead_or_lagging_members(h) -> None:
    cfg = ElectionConfig(preferred_leader_ids=("n1", "n2"), max_leadership_transfer_wait_index=10)
    el, now = _leader(h, term=0, config=cfg)
    sends = h.sends(el.step(Tick(), now).actions)
    h.answer_heartbeats(el, sends, C.SUCCESS, now + 1, only={"n1"})
    h.set_log_end(el.state, 100, el.term)
    el.step(PeerProgress("n1", el.term, 50), now)
    el.step(Tick(), now + 1000)
    assert not el.transferring  # n2 dead, n1 too far behind
    el.step(PeerProgress("n1", el.term, 95), now + 1001)
    el.step(Tick(), now + 2000)
    assert el.state.transferee == "n1"


def test_preferred_leader_itself_never_transfers(h) -> None:
    el, now = _leader(h, term=0, config=ElectionConfig(preferred_leader_ids=("n0", "n1")))
    h.answer_heartbeats(el, h.sends(el.step(Tick(), now).actions), C.SUCCESS, now + 1)
    el.step(Tick(), now + 1500)
    assert not el.transferring


# -------------------------------------------------------------- role changes


def test_every_role_change_is_announced_once(h) -> None:
    el = h.make(term=0)
    seen = []
    now = h.become_leader(el)
    seen += [(0, Role.LEADER)] if el.role is Role.LEADER else []
    for _resp, actions in (
        el.step(ElectionRequest(h.vote_req(el, "n1", term=el.term + 3)), now),
        el.step(ElectionRequest(h.vote_req(el, "n2", term=el.term + 3)), now),  # same (term, role)
        ([], el.step(Tick(), now + 10).actions),
        el.step(ElectionRequest(h.hb_req(el, "n1")), now + 20),
    ):
        seen += [(rc.term, rc.role) for rc in h.role_changes(actions)]
    assert seen == [(0, Role.LEADER), (3, Role.CANDIDATE), (3, Role.FOLLOWER)]


# ------------------------------------------------- pre-vote, end to end (3 cores)


class _Group:
    """Three cores with synchronous delivery and cut links."""

    def __init__(self, h, config, votes):
        self.h = h
        self.els = {
            i: h.make(i, term=1, vote=votes[i], config=config, seed=k)
            for k, i in enumerate(h.PEERS)
        }
        self.cut: set[tuple[str, str]] = set()
        self.now = 0

    def run(self, sender, actions):
        for a in actions:
            if not isinstance(a, Send) or (sender, a.to) in self.cut:
                continue
            resp, more = self.els[a.to].step(ElectionRequest(a.message), self.now)
            self.run(a.to, more)
            if (a.to, sender) in self.cut:
                resp = None
            self.run(
                sender,
                self.els[sender].step(ElectionAnswer(a.to, a.message, resp), self.now).actions,
            )

    def advance(self, ms):
        end = self.now + ms
        while self.now < end:
            self.now += 10
            for i, el in self.els.items():
                self.run(i, el.step(Tick(), self.now).actions)

    def roles(self):
        return {i: (el.role, el.term) for i, el in self.els.items()}


@pytest.mark.parametrize("pre_vote", [True, False])
def test_member_cut_from_the_leader_only(h, pre_vote) -> None:
    """n2 loses the leader but still reaches n1, which follows without having voted
    in this term.  Without pre-vote n2 raises the term and deposes the healthy
    leader; with pre-vote n1 refuses because it still hears the leader."""
    # n0 leads term 1 with n2's vote; n1 follows without having voted in term 1.
    g = _Group(h, ElectionConfig(enable_pre_vote=pre_vote), {"n0": "n0", "n1": None, "n2": "n0"})
    g.els["n0"].change_role_to_leader(1, 0)
    g.els["n1"].step(ElectionRequest(h.hb_req(g.els["n1"], "n0")), 0)
    g.els["n2"].step(ElectionRequest(h.hb_req(g.els["n2"], "n0")), 0)
    g.advance(3000)
    assert g.roles()["n0"] == (Role.LEADER, 1)
    g.cut |= {("n0", "n2"), ("n2", "n0")}
    g.advance(30_000)
    if pre_vote:
        assert g.roles()["n0"] == (Role.LEADER, 1)
        assert g.roles()["n1"] == (Role.FOLLOWER, 1)
        assert g.els["n2"].term == 1
    else:
        assert g.els["n0"].role is not Role.LEADER or g.els["n0"].term > 1
        assert max(el.term for el in g.els.values()) > 1


def test_role_change_action_carries_the_leader(h) -> None:
    el = h.make(term=2)
    _, actions = el.step(ElectionRequest(h.hb_req(el, "n2")), 0)
    assert actions == [RoleChange(2, Role.FOLLOWER, "n2")]


def test_a_progress_report_of_an_older_term_is_dropped(h) -> None:
    """A dispatcher's report of term T landing after the leader was deposed and re-elected
    in T+2 must not refill ``peer_match_index``, or a take order goes at once to a
    transferee that may lag by any amount."""
    cfg = ElectionConfig(max_leadership_transfer_wait_index=10)
    el, now = _leader(h, term=0, midlife=True, config=cfg)
    h.set_log_end(el.state, 1000, 0)
    old = el.term
    el.step(PeerProgress("n1", old, 995), now + 10)
    el.change_role_to_candidate(old + 1, now + 20)
    while el.term < old + 2:
        el.state.next_term()
    el.change_role_to_leader(old + 2, now + 30)
    assert el.shared.timers.peer_match_index == {}
    assert (
        el.step(PeerProgress("n1", old, 995), now + 31).actions == []
    )  # the old dispatcher's report
    assert el.shared.timers.peer_match_index == {}
    resp, actions = el.step(TransferOrder("n1"), now + 40)
    assert resp.code is C.SUCCESS
    assert [s for s in h.sends(actions) if isinstance(s.message, LeadershipTransferRequest)] == []
    el.step(PeerProgress("n1", el.term, 995), now + 41)  # the new term's report counts
    assert el.shared.timers.peer_match_index == {"n1": 995}


def test_a_hand_over_that_is_given_up_ends_in_a_step_down(h) -> None:
    """A wedged leader's second path (found by the Ray test): a leader re-elected with a hung
    checker never activates its dispatchers, so the transferee of its hand-over cannot catch
    up, the transfer times out, and on 24eedd2 nothing ended the term.  A hand-over that is
    given up steps the leader down; a plain transfer that is given up does not."""
    cfg = ElectionConfig(max_leadership_transfer_wait_index=10)
    el, now = _leader(h, term=0, config=cfg)
    h.set_log_end(el.state, 100, el.term)
    code, actions = el.step(HandOverOrder("n1"), now)  # n1 lags: no take order yet
    assert code is C.SUCCESS and el.role is Role.LEADER
    el.step(Tick(), now + cfg.leadership_transfer_wait_timeout_ms + 1)
    assert el.role is Role.CANDIDATE and not el.transferring
    plain, now = _leader(h, term=0, config=cfg)
    h.set_log_end(plain.state, 100, plain.term)
    plain.step(TransferOrder("n1"), now)
    plain.step(Tick(), now + cfg.leadership_transfer_wait_timeout_ms + 1)
    assert plain.role is Role.LEADER and not plain.transferring


def test_a_hand_over_that_cannot_start_steps_down_at_once(h) -> None:
    el, now = _leader(h, term=0)
    code, _ = el.step(HandOverOrder("nobody"), now)
    assert code is C.UNKNOWN_MEMBER and el.role is Role.CANDIDATE
