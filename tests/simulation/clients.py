"""The clients of the whole-group simulation: unique bodies appended through whichever
member they believe leads, over delayed actor calls, and the checks on every answer.

An idempotent client (``Client.session``) gives its appends identities as LedgerClient does,
by the same sans-I/O decisions (:class:`~rayledger.actors.core.client_session.ClientSessions`):
it retries an unknown outcome under the same identity, gives an append up at its deadline
(``Client.deadline_ms``, else the simulation's ``client_deadline_ms``; None: never) and then
leaves the session behind, and keeps up to ``Client.pipeline`` appends in flight.  A gap
refusal (OUT_OF_ORDER_SEQUENCE, SESSION_EXPIRED) is the client's to handle; a body
committed twice, or a refusal that says the client sent two bodies under one identity,
fails the run."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace

from rayledger.actors.core.client_session import (
    GAP_CODES,
    RETRY_BEFORE_STORE,
    Action,
    Answered,
    ClientSessions,
    GaveUp,
    Outcome,
    Sending,
)
from rayledger.replication.sessions import new_client_id
from rayledger.storage import ResponseCode

_BAD_IDENTITY = frozenset({ResponseCode.DUPLICATE_SEQUENCE, ResponseCode.SEQUENCE_MISMATCH})
SESSION_ID_STRIDE = 1000  # a client's sessions: its ``session``, then + 1000, + 2000, ...


# A simulated answer carries a code, not the error's class: NOT_LEADER is also the code of a
# round written and then ended by a step-down (on Ray an OutcomeUnknownError), so here it
# may have stored; the other refusals come only before anything is written.
_SIM_REFUSED = RETRY_BEFORE_STORE - {ResponseCode.NOT_LEADER}


def sim_outcome(code: ResponseCode) -> Outcome:
    """A failed call's outcome from the code a member answered: a refusal before storing,
    a gap, else possibly stored."""
    if code in GAP_CODES:
        return Outcome.GAP
    if code in _SIM_REFUSED:
        return Outcome.REFUSED
    return Outcome.UNKNOWN  # NOT_LEADER, WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED, a store's ...


@dataclass(frozen=True)
class ClientAppend:
    client: str
    req_id: int
    target: str
    bodies: tuple[bytes, ...]
    ident: tuple[int, int] | None = None  # an idempotent client's (session, first seq)
    maybe_stored: bool = True  # a call with that identity ended with an unknown outcome


@dataclass(frozen=True)
class ClientReply:
    req_id: int
    code: ResponseCode
    first_index: int = -1
    last_index: int = -1
    term: int = -1
    leader_id: str | None = None
    # a retry answered from the log: each entry's index and term
    spread: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class ClientRead:
    client: str
    req_id: int
    consistency: str  # "linearizable" | "lease" | "committed"
    anywhere: bool = False  # a follower may serve it (its own path), not only the leader


@dataclass(frozen=True)
class LeaderReadIndex:
    """A follower asks the leader for a read index (``MemberActor.read_index``); answered
    with the index or the leader's LedgerError (None: no answer in time)."""

    consistency: str
    slot: list  # where the answer lands (the asking member's wait polls it)


@dataclass(frozen=True)
class ClientReadReply:
    req_id: int
    code: ResponseCode
    index: int = -1
    leader_id: str | None = None


@dataclass
class Reader:
    """A client that reads a read index from whichever member it believes leads; every
    answer must cover every append acknowledged before the read was sent."""

    id: str
    believed: str
    next_at: int = 0
    # (req id, acked floor, sent at, consistency)
    outstanding: tuple[int, int, int, str] | None = None


@dataclass
class SessionAppend:
    """An idempotent client's append: in a call (``req_id``) until answered or given up."""

    key: int  # the request id of its first call
    bodies: tuple[bytes, ...]
    born: int  # first sent at: its deadline counts from here
    req_id: int = 0  # the call carrying it now (0: none)
    sent_at: int = 0
    ident: tuple[int, int] | None = None


@dataclass
class Client:
    id: str
    believed: str
    next_at: int = 0
    # (req id, bodies, sent at); an idempotent client's: of its oldest append in flight
    outstanding: tuple[int, tuple[bytes, ...], int] | None = None
    seq: int = 0
    session: int = 0  # the client id of its first session (0: not idempotent)
    ident: tuple[int, int] | None = None  # of the append sent last
    retries: int = 0  # calls sent again
    pipeline: int = 1  # an idempotent client's appends in flight at once
    deadline_ms: int | None = None  # an idempotent client gives an append up after this
    sessions: ClientSessions | None = None  # its identity decisions (made on first use)
    appends: dict[int, SessionAppend] = field(default_factory=dict)  # live, by key
    acks: int = 0  # bodies acknowledged to it


class Clients:
    """Clients and their appends (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _any_member(self) -> str:
        """A member to ask when the one asked gave no leader: any id the group ever had,
        or, once the faults are over (:meth:`~.group_sim.GroupSim.clients_again`), one of
        the configuration's members, as a LedgerClient that looks its members up again
        asks (one asking lost nodes loses a deadline on each)."""
        return self.rng.choice(self.members_known or self.ids)

    def _clients_step(self, now: int) -> None:
        for c in self.clients:
            if c.session:
                self._session_client_step(c, now)
                continue
            if c.outstanding is not None:
                if now - c.outstanding[2] > self.client_timeout_ms:
                    self._inflight_clients.pop(c.outstanding[0], None)
                    c.believed = self._any_member()
                    c.outstanding = None
                    self.unknown_outcomes += 1
                    c.next_at = now
                continue
            if not self.clients_on or now < c.next_at:
                continue
            req_id, bodies = self._new_bodies(c)
            c.outstanding = (req_id, bodies, now)
            self._inflight_clients[req_id] = c
            msg = ClientAppend(c.id, req_id, c.believed, bodies)
            self._to_client(c.id, c.believed, msg)

    def _new_bodies(self, c: Client) -> tuple[int, tuple[bytes, ...]]:
        """A new append's request id and bodies (unique: the client's id and the request's)."""
        if c.id == "c0" and self._next_transfer_ms is not None and self._wander_rng.random() < 0.5:
            c.believed = self._wander_rng.choice(self.ids)  # a roaming writer: finds a new leader
        req_id = next(self._req_ids)
        k = self.rng.randint(1, self.max_bodies)
        if self.machine is not None:  # commands the group's state machine takes
            return req_id, self._machine_bodies(c.id, req_id, k)
        return req_id, tuple(
            f"{c.id}:{req_id}:{j}:".encode() + b"x" * self.rng.randint(0, 120) for j in range(k)
        )

    # -- idempotent clients --------------------------------------------------------------------
    def _sessions_of(self, c: Client) -> ClientSessions:
        if c.sessions is None:
            ids = itertools.count(c.session, SESSION_ID_STRIDE)
            # begun at the simulation's clock, as a client on Ray stamps its ids
            c.sessions = ClientSessions(lambda: new_client_id(self.clock.now_ms, next(ids)))
        return c.sessions

    def _append_deadline(self, c: Client) -> int | None:
        if c.deadline_ms is not None:
            return c.deadline_ms
        return getattr(self, "client_deadline_ms", None)

    def _session_client_step(self, c: Client, now: int) -> None:
        """Deadlines, then calls with no answer (unknown: the same identity again), then a
        new append while fewer than ``c.pipeline`` are in flight."""
        sessions = self._sessions_of(c)
        deadline = self._append_deadline(c)
        for a in list(c.appends.values()):
            if deadline is not None and now - a.born > deadline:
                self._give_up(c, a, now)
            elif now - a.sent_at > self.client_timeout_ms:
                self._inflight_clients.pop(a.req_id, None)
                a.req_id = 0
                c.believed = self._any_member()
                self._note(sessions.step(Answered((a.key,), Outcome.UNKNOWN)))
                self._send_append(c, a, now)
        if len(c.appends) >= c.pipeline or not self.clients_on or now < c.next_at:
            return
        req_id, bodies = self._new_bodies(c)
        a = SessionAppend(req_id, bodies, now)
        c.appends[req_id] = a
        if c.pipeline > 1:  # (a lone append's next one waits for its answer instead)
            c.next_at = now + self.rng.randint(*self.client_interval_ms)
        self._send_append(c, a, now)

    def _send_append(self, c: Client, a: SessionAppend, now: int) -> None:
        """One call carrying ``a``, under the identity the client's sessions give it."""
        first = a.req_id == 0 and a.ident is None
        req_id = a.key if first else next(self._req_ids)
        out = self._sessions_of(c).step(Sending((a.key,), (len(a.bodies),)))
        if not first:
            c.retries += 1
            self.stats["idempotent_retries"] += 1
            if out.ident != a.ident:
                self.stats["client_renumbered"] += 1
        a.ident, a.req_id, a.sent_at = out.ident, req_id, now
        c.ident = out.ident
        self._inflight_clients[req_id] = c
        self._sync_outstanding(c)
        self._to_client(c.id, c.believed, ClientAppend(c.id, req_id, c.believed, a.bodies, a.ident,
                                                     out.maybe_stored))  # fmt: skip

    def _sync_outstanding(self, c: Client) -> None:
        live = [a for a in c.appends.values() if a.req_id]
        a = min(live, key=lambda a: a.born, default=None)
        c.outstanding = None if a is None else (a.req_id, a.bodies, a.sent_at)

    def _give_up(self, c: Client, a: SessionAppend, now: int) -> None:
        """``a``'s deadline ran out: its outcome is unknown (a call carrying it is out, or
        one ended unknown) or, never possibly stored, it just timed out."""
        sessions = self._sessions_of(c)
        maybe = bool(a.req_id) or sessions.maybe_stored(a.key)
        self._inflight_clients.pop(a.req_id, None)
        self._note(sessions.step(GaveUp(a.key)))
        del c.appends[a.key]
        self._sync_outstanding(c)
        if maybe:
            self.unknown_outcomes += 1
            self.stats["client_unknown_at_deadline"] += 1
        else:
            self.stats["client_timed_out"] += 1
        c.next_at = min(c.next_at, now)

    def _note(self, out) -> None:
        if out.left_behind is not None:
            self.stats[f"client_sessions_left_{out.why.name.lower()}"] += 1

    def _session_reply(self, c: Client, reply: ClientReply) -> None:
        a = next((a for a in c.appends.values() if a.req_id == reply.req_id), None)
        if a is None:
            return
        a.req_id = 0
        self.reply_codes[reply.code] += 1
        self._inflight_clients.pop(reply.req_id, None)
        now = self.clock.now_ms
        if c.pipeline == 1:
            lo, hi = self.client_interval_ms
            c.next_at = now + self.rng.randint(lo, hi)
        sessions = self._sessions_of(c)
        if reply.code == ResponseCode.SUCCESS:
            sessions.step(Answered((a.key,), Outcome.STORED))
            del c.appends[a.key]
            self._sync_outstanding(c)
            self._acked(c, reply, a.bodies)
            return
        if reply.code in _BAD_IDENTITY:  # the client sent one identity with two bodies
            if not self.durability_void:  # (a power loss may drop a session's entries)
                self.fail(f"{c.id}'s append {reply.req_id} {a.ident} refused: {reply.code.name}")
            self.stats["session_refusals_after_power_loss"] += 1
            outcome = Outcome.FINAL
        else:
            outcome = sim_outcome(reply.code)
        out = sessions.step(Answered((a.key,), outcome))
        self._note(out)
        if outcome is Outcome.GAP:  # (a deposed leader lacks what the new one committed)
            self.stats["client_gap_refusals"] += 1
        if reply.leader_id is not None and reply.leader_id in self.members:
            c.believed = reply.leader_id
        elif reply.code != ResponseCode.LEADER_PENDING_FULL:
            c.believed = self._any_member()
        if out.action is Action.RETRY:
            self._send_append(c, a, now)
            return
        del c.appends[a.key]  # refused for good, or unknown for good
        self._sync_outstanding(c)
        if out.action is Action.FAIL_UNKNOWN:
            self.unknown_outcomes += 1
            self.stats["client_unknown_after_gap"] += 1
        else:
            self.stats["client_appends_refused"] += 1

    def _readers_step(self, now: int) -> None:
        rng = self._read_rng
        for r in self.readers:
            if r.outstanding is not None:
                if now - r.outstanding[2] > self.reader_timeout_ms:  # lost, or too slow
                    self._inflight_reads.pop(r.outstanding[0], None)
                    r.outstanding = None
                    if not self.readers_stay:
                        r.believed = rng.choice(self.ids)
                continue
            if not self.clients_on or now < r.next_at:
                continue
            req_id = next(self._req_ids)
            consistency = rng.choice(("linearizable", "lease", "lease"))
            to, anywhere = r.believed, rng.random() < self.follower_reads
            if anywhere:  # any member serves it: the follower's path, or the committed index
                to = rng.choice(self.ids)
                consistency = rng.choice(("linearizable", "committed"))
                self.stats[f"reads_anywhere_{consistency}"] += 1
            elif consistency == "lease" and self._leads_below(to, self._acked_term()):
                self.stats["lease_reads_to_old_leader"] += 1
            r.outstanding = (req_id, self.max_acked, now, consistency)
            self._inflight_reads[req_id] = r
            self._send_held(r.id, to, ClientRead(r.id, req_id, consistency, anywhere),
                            rng.randint(1, 15))  # fmt: skip

    def _reader_reply(self, r: Reader, reply: ClientReadReply) -> None:
        if r.outstanding is None or r.outstanding[0] != reply.req_id:
            return
        _, floor, _, consistency = r.outstanding
        r.outstanding = None
        self._inflight_reads.pop(reply.req_id, None)
        rng = self._read_rng
        r.next_at = self.clock.now_ms + rng.randint(5, 60)
        self.read_codes[reply.code] += 1
        if reply.code == ResponseCode.SUCCESS:
            if consistency == "committed":  # may lag the group, never run ahead of it
                if reply.index > self.max_committed:
                    self.fail(
                        f"phantom read: {r.id}'s committed read {reply.req_id} got index "
                        f"{reply.index} from {reply.leader_id}, but the group committed only "
                        f"up to {self.max_committed}"
                    )
                return
            if reply.index < floor and not self.durability_void:
                self.fail(
                    f"stale read: {r.id}'s read {reply.req_id} got read index {reply.index} "
                    f"from {reply.leader_id}, but index {floor} was acknowledged before it "
                    f"was sent"
                )
            return
        if reply.leader_id is not None and reply.leader_id in self.members:
            r.believed = reply.leader_id
        else:
            r.believed = rng.choice(self.ids)

    def _acked_term(self) -> int:
        """The term of the highest append acknowledged so far (-1: none)."""
        return self.acked_terms.get(self.max_acked, -1)

    def _leads_below(self, mid: str, term: int) -> bool:
        """Whether ``mid`` is up and still leads a term older than ``term``."""
        m = self.members[mid]
        return m.alive and m.state.is_leader and m.state.current_term < term

    def _send_held(self, src: str, dst: str, msg: object, delay: int) -> None:
        if self.net.is_down(src) or self.net.is_down(dst):
            return
        heapq.heappush(self._held, (self.clock.now_ms + delay, next(self._held_seq), src, dst, msg))

    def _to_client(self, src: str, dst: str, msg: object) -> None:
        """Client calls are Ray actor calls: delayed, lost with a crashed member, never duplicated."""
        if self.net.is_down(src) or self.net.is_down(dst):
            return
        delay = self._client_rng.randint(1, 15)
        heapq.heappush(self._held, (self.clock.now_ms + delay, next(self._held_seq), src, dst, msg))

    def _client_reply(self, c: Client, reply: ClientReply) -> None:
        if c.session:
            self._session_reply(c, reply)
            return
        if c.outstanding is None or c.outstanding[0] != reply.req_id:
            return
        bodies = c.outstanding[1]
        c.outstanding = None
        self.reply_codes[reply.code] += 1
        self._inflight_clients.pop(reply.req_id, None)
        now = self.clock.now_ms
        lo, hi = self.client_interval_ms
        c.next_at = now + self.rng.randint(lo, hi)
        if reply.code == ResponseCode.SUCCESS:
            self._acked(c, reply, bodies)
            return
        if reply.code in (
            ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
            ResponseCode.TERM_CHANGED,
            ResponseCode.NOT_LEADER,
        ):
            self.unknown_outcomes += reply.code != ResponseCode.NOT_LEADER
        if reply.leader_id is not None and reply.leader_id in self.members:
            c.believed = reply.leader_id
        elif reply.code != ResponseCode.LEADER_PENDING_FULL:
            c.believed = self._any_member()

    def _acked(self, c: Client, reply: ClientReply, bodies: tuple[bytes, ...]) -> None:
        """The checks on an acknowledgement, and what they remember of it."""
        if self._next_transfer_ms is not None and self._wander_rng.random() < 0.2:
            c.believed = self._wander_rng.choice(self.ids)  # finds a new leader sooner
        where = reply.spread or [
            (reply.first_index + k, reply.term)
            for k in range(reply.last_index - reply.first_index + 1)
        ]
        if len(where) != len(bodies):
            self.fail(f"append {reply.req_id} acknowledged {where} for {len(bodies)} bodies")
        if reply.spread is not None:
            self.stats["retries_answered_from_the_log"] += 1
        if any(self._leads_below(mid, reply.term) for mid in self.ids):
            self.stats["acked_beside_old_leader"] += 1
        for k, body in enumerate(bodies):
            index, term = where[k]
            reply = replace(reply, term=term)
            if index in self.acked and not self.durability_void:
                self.fail(f"index {index} acknowledged twice ({self.acked[index]!r} and {body!r})")
            self.acked[index] = body
            c.acks += 1
            self.max_acked = max(self.max_acked, index)
            self.acked_terms[index] = reply.term
            got = self.committed.get(index)
            if got is None:
                self.acked_unseen[index] = (reply.term, reply.req_id)
            elif got[0] != reply.term and not self.durability_void:
                self.fail(
                    f"append {reply.req_id} acknowledged at {index} (term {reply.term}) but "
                    f"committed {got}"
                )
