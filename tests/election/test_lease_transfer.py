"""A lease must not survive an abandoned leadership transfer.  Three electors on a small
message bus with one-way link cuts; the leader's lease check is :meth:`Elector.lease_allowed`
with a :class:`ReadIndexLogic` lease, as the member's shell asks it
(``MemberLogic.lease_holds``).  The property: the old leader's lease never holds while
another member leads a later term."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import pytest
from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.reads import ReadIndexLogic
from rayledger.election import ElectionConfig, Elector, LeadershipTransferRequest, Role, Send
from rayledger.election.messages import (
    ElectionAnswer,
    ElectionRequest,
    PeerProgress,
    Tick,
    TransferOrder,
)

RPC_MS = 3000  # a request or answer on a cut link is lost: the caller learns None after this


@dataclass
class Bus:
    """Delivers election messages with 1 ms latency; ``cut`` holds (from, to) links that lose
    everything sent on them; ``held`` delays take orders until :meth:`release`."""

    members: dict[str, Elector]
    cut: set[tuple[str, str]] = field(default_factory=set)
    hold_take_orders: bool = False
    held: list = field(default_factory=list)
    q: list = field(default_factory=list)
    seq: itertools.count = field(default_factory=itertools.count)

    def emit(self, frm: str, actions, now: int) -> None:
        for a in actions:
            if isinstance(a, Send):
                heapq.heappush(self.q, (now + 1, next(self.seq), "req", frm, a.to, a.message, None))

    def release(self, now: int) -> None:
        for frm, to, msg in self.held:
            heapq.heappush(self.q, (now, next(self.seq), "req", frm, to, msg, None))
        self.held.clear()

    def deliver(self, now: int) -> None:
        while self.q and self.q[0][0] <= now:
            _, _, kind, frm, to, msg, resp = heapq.heappop(self.q)
            if kind == "resp":  # ``to`` asked ``frm``
                self.emit(
                    to, self.members[to].step(ElectionAnswer(frm, msg, resp), now).actions, now
                )
                continue
            if self.hold_take_orders and isinstance(msg, LeadershipTransferRequest):
                self.held.append((frm, to, msg))
                self.hold_take_orders = False
                continue
            if (frm, to) in self.cut:
                heapq.heappush(self.q, (now + RPC_MS, next(self.seq), "resp", to, frm, msg, None))
                continue
            resp, actions = self.members[to].step(ElectionRequest(msg), now)
            self.emit(to, actions, now)
            delay = RPC_MS if (to, frm) in self.cut else 1
            answer = None if (to, frm) in self.cut else resp
            heapq.heappush(self.q, (now + delay, next(self.seq), "resp", to, frm, msg, answer))


def _group(h, preferred: tuple[str, ...] = ()):
    cfg = ElectionConfig(preferred_leader_ids=preferred)
    members = {m: h.make(m, midlife=True, config=cfg) for m in ("n0", "n1", "n2")}
    h.become_leader(members["n0"], 0)
    for m in ("n1", "n2"):
        members[m].step(ElectionRequest(h.hb_req(members[m], "n0")), 0)
    return members


@pytest.mark.parametrize("variant", ["abandoned", "late_take", "renewed_in_transfer", "preferred"])
def test_no_lease_after_a_take_order_in_the_term(h, variant) -> None:
    """Leader n0 holds a lease (a read round confirmed at 100 ms, or, ``renewed_in_transfer``,
    one confirmed during the transfer); at 200 ms a transfer to n1 starts (by the operator, or
    by the preferred-leader check) and the n1 -> n0 link is cut.  n1 skips pre-vote as the
    transferee, n2 grants the real vote, n1 leads term T+1; n0 gives the transfer up at about
    1.2 s (``late_take``: the take order reaches n1 only after that).  On 24eedd2 n0's lease
    check was true again from the give-up until about 4 s."""
    members = _group(h, ("n1",) if variant == "preferred" else ())
    leader = members["n0"]
    term = leader.term
    bus = Bus(members, hold_take_orders=variant == "late_take")
    reads = ReadIndexLogic("n0", list(members), LedgerConfig().lease_ms(), RPC_MS)

    def lease(now: int) -> bool:
        return leader.lease_allowed(term) and reads.lease_holds(term, now)

    if variant != "renewed_in_transfer":
        (rnd,), _ = reads.request(term, 0, "r1", 100)
        reads.on_answer(rnd.round_id, "n2", True, 101)
        assert lease(150)
    stale: list[int] = []
    new_leader_at = None
    for now in range(10, 8000, 10):
        if now == 200:
            bus.cut.add(("n1", "n0"))
            leader.step(PeerProgress("n1", term, leader.state.ledger_end_index), now)
            if variant == "preferred":  # n1 is live (it answered heartbeats): the check hands over
                bus.emit(
                    "n0",
                    leader.step(
                        Tick(), now + leader.config.check_preferred_leader_interval_ms
                    ).actions,
                    now,
                )
            else:
                _, actions = leader.step(TransferOrder("n1"), now)
                bus.emit("n0", actions, now)
            assert leader.transferring and not lease(now)
        if variant == "renewed_in_transfer" and now == 250:
            (rnd,), _ = reads.request(term, 0, "r2", now)  # no lease: a round goes out
            reads.on_answer(rnd.round_id, "n2", True, now + 2)  # n2 still follows n0 in T
        if variant == "late_take" and now == 1500:
            bus.release(now)
        bus.deliver(now)
        for m, el in members.items():
            bus.emit(m, el.step(Tick(), now).actions, now)
        bus.deliver(now)
        others = [m for m, el in members.items() if m != "n0" and el.role is Role.LEADER]
        if others and new_leader_at is None:
            new_leader_at = now
            assert members[others[0]].term > term
        if others and lease(now):
            stale.append(now)
    assert new_leader_at is not None, "the transferee never led: the scenario did not happen"
    assert not stale, f"n0 held a lease of term {term} at {stale[0]}..{stale[-1]} ms"
    assert not leader.lease_allowed(term)
