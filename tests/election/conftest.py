"""Builders for driving one elector core by hand (exposed as the ``h`` fixture)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from rayledger.election import (
    ElectionConfig,
    Elector,
    HeartbeatRequest,
    HeartbeatResponse,
    MemberState,
    MemoryTermStore,
    ParseResult,
    Role,
    RoleChange,
    Send,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from rayledger.election.messages import ElectionAnswer, ElectionRequest, Tick
from rayledger.storage.errors import ResponseCode

PEERS = ("n0", "n1", "n2")


def set_log_end(state: MemberState, index: int, term: int) -> None:
    """The log end the state's store would report (a state reads it through ``attach_log``)."""
    state.attach_log(SimpleNamespace(ledger_end_index=index, ledger_end_term=term))


def make(
    self_id: str = "n0",
    peers: tuple[str, ...] = PEERS,
    *,
    term: int = 0,
    vote: str | None = None,
    ledger: tuple[int, int] = (-1, -1),
    config: ElectionConfig | None = None,
    seed: int = 0,
    store: MemoryTermStore | None = None,
    midlife: bool = False,
) -> Elector:
    """An elector over a member state holding ``term`` and ``vote``: as just restarted
    from them, or (``midlife``) as one that has been running in that term all along."""
    store = store if store is not None else MemoryTermStore(term, vote)
    state = MemberState("g", self_id, peers, store)
    set_log_end(state, *ledger)
    el = Elector(state, config or ElectionConfig(), random.Random(seed))
    if midlife:
        el.shared.restarted, el.voting.restart_term = False, -1
        el.shared.last_parse_result = ParseResult.WAIT_TO_REVOTE
    return el


def vote_req(el: Elector, candidate: str = "n1", **kw) -> VoteRequest:
    st = el.state
    fields = dict(
        group="g",
        local_id=candidate,
        remote_id=st.self_id,
        leader_id=candidate,
        term=st.current_term,
        ledger_end_index=st.ledger_end_index,
        ledger_end_term=st.ledger_end_term,
    )
    fields.update(kw)
    return VoteRequest(**fields)


def hb_req(el: Elector, leader: str = "n1", **kw) -> HeartbeatRequest:
    fields = dict(group="g", local_id=leader, remote_id=el.self_id, leader_id=leader, term=el.term)
    fields.update(kw)
    return HeartbeatRequest(**fields)


def sends(actions) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def role_changes(actions) -> list[RoleChange]:
    return [a for a in actions if isinstance(a, RoleChange)]


def answer_votes(el: Elector, actions, result: VoteResult, now: int, term: int | None = None):
    """Answer every vote request in ``actions`` with ``result``; returns the new actions."""
    out = []
    for s in sends(actions):
        req = s.message
        assert isinstance(req, VoteRequest)
        resp = VoteResponse(result, req.term if term is None else term, local_id=s.to)
        out.extend(el.step(ElectionAnswer(s.to, req, resp), now).actions)
    return out


def become_leader(el: Elector, now: int = 0) -> int:
    """Drive a fresh candidate to leadership; returns the time it happened."""
    acts = el.step(Tick(), now).actions
    for _ in range(10):
        if el.role is Role.LEADER:
            return now
        if sends(acts):
            acts = answer_votes(el, acts, VoteResult.ACCEPT, now)
            continue
        now = max(now + 10, el.next_time_to_request_vote)
        acts = el.step(Tick(), now).actions
    assert el.role is Role.LEADER, el.snapshot()
    return now


def become_follower(el: Elector, leader: str = "n1", now: int = 0) -> None:
    """Make ``el`` a follower of ``leader`` in its current term."""
    resp, _ = el.step(ElectionRequest(hb_req(el, leader)), now)
    assert resp.code == ResponseCode.SUCCESS, resp
    assert el.role is Role.FOLLOWER


def answer_heartbeats(
    el: Elector, actions, code: ResponseCode, now: int, term: int | None = None, only=None
):
    out = []
    for s in sends(actions):
        if only is not None and s.to not in only:
            continue
        req = s.message
        assert isinstance(req, HeartbeatRequest)
        resp = HeartbeatResponse(code, req.term if term is None else term, local_id=s.to)
        out.extend(el.step(ElectionAnswer(s.to, req, resp), now).actions)
    return out


@pytest.fixture
def h() -> SimpleNamespace:
    return SimpleNamespace(
        make=make,
        set_log_end=set_log_end,
        vote_req=vote_req,
        hb_req=hb_req,
        sends=sends,
        role_changes=role_changes,
        answer_votes=answer_votes,
        answer_heartbeats=answer_heartbeats,
        become_leader=become_leader,
        become_follower=become_follower,
        PEERS=PEERS,
    )
