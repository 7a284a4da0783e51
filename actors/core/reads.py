"""Read consistencies (Raft thesis 6.4): read index, leases, and waiting for a commit.

Ray-free logic the member's shell drives (:mod:`rayledger.actors.member.reads`), so a test
can step it without a cluster.

* ``linearizable`` (default): the leader records its committed index as the *read index*,
  confirms with a heartbeat round answered by a quorum that it still leads its term, then
  serves at or above that index.  A follower asks the leader for a read index and waits until
  it has committed that far itself, which spreads reads over members.
* ``lease``: the leader skips the round while a lease from its last confirmed round holds.
  A round sent at ``t`` (leader's clock) and answered by a quorum means a quorum heard from
  this leader at or after ``t``; such a member refuses pre-votes for ``heartbeat_timeout_ms``
  after it last heard from its leader, and a candidate needs a granted pre-vote from a quorum
  before it raises its term.  So no other leader can exist before ``t + heartbeat_timeout``
  in real time.  The lease ends earlier, at ``t + heartbeat_timeout / (1 + max_clock_drift)``,
  which assumes clocks run at rates differing by at most ``max_clock_drift`` (10 % by
  default) and holds only with pre-vote on and no leadership transfer under way (a transferee
  skips pre-vote).  Once a take-leadership order has gone out in a term, no lease holds for
  the rest of that term, even after the transfer is given up
  (:meth:`~rayledger.election.Elector.lease_allowed`); the leader falls back to a read-index
  round otherwise.
* ``committed``: this member's own committed index, no round at all; may be stale.

Before either of the first two, a new leader must have committed an entry of its own term
(its empty first entry), or its committed index may lag the group's (Raft section 6.4).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rayledger.election.messages import HeartbeatRequest
from rayledger.storage import LedgerError, ResponseCode


class Consistency(str, enum.Enum):
    LINEARIZABLE = "linearizable"
    LEASE = "lease"
    COMMITTED = "committed"

    @classmethod
    def of(cls, value: object) -> Consistency:
        """Parse a user's choice; anything else is UNEXPECTED_ARGUMENT."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(repr(c.value) for c in cls)
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"consistency must be one of {names}, got {value!r}",
            ) from None


@dataclass
class ReadRound:
    """One confirmation round: a heartbeat to every peer, answered by a quorum or not."""

    round_id: int
    term: int
    sent_ms: int
    acks: set[str] = field(default_factory=set)
    tickets: list[tuple[Any, int]] = field(default_factory=list)  # (token, read index)


class ReadIndexLogic:
    """Batches read-index requests into confirmation rounds, at most one in flight.

    A request joins the next round to be *sent*: a round sent before the request arrived
    cannot confirm that the leader still led when the request arrived.
    """

    def __init__(self, self_id: str, peers: list[str], lease_ms: int, round_timeout_ms: int):
        self.self_id = self_id
        self.lease_ms = lease_ms
        self.round_timeout_ms = round_timeout_ms
        self._ids = itertools.count(1)
        self.in_flight: ReadRound | None = None
        self._waiting: list[tuple[Any, int]] = []
        self._waiting_term = -1
        self._lease = (-1, -1)  # (term, lease end in ms)
        self.configure(peers)

    def configure(self, voters: Sequence[str], now_ms: int = 0) -> tuple[list, list]:
        """The configuration the member acts on: a round is confirmed by a majority of its
        voters (this leader counts when it votes); learners are not asked.  Returns
        ``(rounds to send, confirmed tickets)``.

        A lease or a round's answers gathered under the old voters say nothing about the new
        ones (a lease confirmed by {L, A} of {L, A, B} would survive two changes into
        {L, B, N}, whose majority {B, N} never confirmed it): the lease ends, and readers of
        a round in flight join a fresh round counted under the new voters -- which a group
        left with this leader as its only voter confirms at once."""
        self.others = [p for p in voters if p != self.self_id]
        self.quorum = len(voters) // 2 + 1
        self._own = 1 if self.self_id in voters else 0
        self._lease = (-1, -1)
        rnd = self.in_flight
        if rnd is None:
            return [], []
        self.in_flight = None
        self._waiting = rnd.tickets + self._waiting
        self._waiting_term = max(self._waiting_term, rnd.term)
        return self._next_round(now_ms)

    def lease_holds(self, term: int, now_ms: int) -> bool:
        lease_term, until = self._lease
        return lease_term == term and now_ms < until

    def request(self, term: int, read_index: int, token: Any, now_ms: int) -> tuple[list, list]:
        """Queue a read at ``read_index`` for ``term``; returns ``(rounds to send, confirmed
        tickets)`` — a group of one confirms at once."""
        self._waiting.append((token, read_index))
        self._waiting_term = term  # a round confirms the newest term it was asked for
        return self._next_round(now_ms)

    def _next_round(self, now_ms: int) -> tuple[list, list]:
        if self.in_flight is not None or not self._waiting:
            return [], []
        rnd = ReadRound(next(self._ids), self._waiting_term, now_ms, tickets=self._waiting)
        self._waiting = []
        if self.quorum <= self._own:
            return [], self._confirm(rnd)
        self.in_flight = rnd
        return [rnd], []

    def _confirm(self, rnd: ReadRound) -> list[tuple[Any, int]]:
        self._lease = (rnd.term, rnd.sent_ms + self.lease_ms)
        return rnd.tickets

    def on_answer(self, round_id: int, peer: str, ok: bool, now_ms: int) -> tuple[list, list]:
        """A peer's answer to round ``round_id``: ``ok`` when it follows us in the round's
        term.  Returns ``(rounds to send, confirmed tickets)``."""
        rnd = self.in_flight
        if rnd is None or rnd.round_id != round_id or not ok or peer not in self.others:
            return [], []
        rnd.acks.add(peer)
        if len(rnd.acks) + self._own < self.quorum:
            return [], []
        self.in_flight = None
        confirmed = self._confirm(rnd)
        sends, more = self._next_round(now_ms)
        return sends, confirmed + more

    def heartbeat(self, group: str, rnd: ReadRound, peer: str) -> HeartbeatRequest:
        """One heartbeat of a confirmation round (a negative round id marks it as one)."""
        return HeartbeatRequest(group=group, local_id=self.self_id, remote_id=peer,
                                leader_id=self.self_id, term=rnd.term,
                                round_id=-rnd.round_id)  # fmt: skip

    def on_heartbeat_answer(
        self, round_id: int, peer: str, term: int, resp: Any, now_ms: int
    ) -> tuple[list, list]:
        """``peer``'s answer (None: none in time) to the heartbeat of round ``round_id`` in
        ``term``: it counts when the peer follows us in that term."""
        code = getattr(resp, "code", None)
        ok = code == ResponseCode.SUCCESS and getattr(resp, "term", None) == term
        return self.on_answer(round_id, peer, ok, now_ms)

    def expire(self, now_ms: int) -> tuple[list, list, list]:
        """A round without a quorum after ``round_timeout_ms``: its readers give up (their
        shell answers TIMEOUT) and waiting readers get a fresh round -- confirmed at once
        when this leader is now its group's only voter.  Returns ``(rounds to send, expired
        tokens, confirmed tickets)``."""
        rnd = self.in_flight
        if rnd is None or now_ms - rnd.sent_ms < self.round_timeout_ms:
            return [], [], []
        self.in_flight = None
        sends, confirmed = self._next_round(now_ms)
        return sends, [t for t, _ in rnd.tickets], confirmed

    def step_down(self) -> list:
        """Leadership ended: every queued or in-flight reader gets nothing."""
        tokens = [t for t, _ in self._waiting]
        if self.in_flight is not None:
            tokens += [t for t, _ in self.in_flight.tickets]
        self.in_flight, self._waiting, self._lease = None, [], (-1, -1)
        return tokens
