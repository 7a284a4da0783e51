"""The clients of the whole-group simulation: unique bodies appended through whichever
member they believe leads, over delayed actor calls, and the checks on every answer."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from rayledger.storage import ResponseCode

_SESSION_CODES = frozenset({ResponseCode.SESSION_EXPIRED, ResponseCode.OUT_OF_ORDER_SEQUENCE,
                            ResponseCode.DUPLICATE_SEQUENCE, ResponseCode.SEQUENCE_MISMATCH})  # fmt: skip


@dataclass(frozen=True)
class ClientAppend:
    client: str
    req_id: int
    target: str
    bodies: tuple[bytes, ...]
    ident: tuple[int, int] | None = None  # an idempotent client's (session, first seq)


@dataclass(frozen=True)
class ClientReply:
    req_id: int
    code: ResponseCode
    first_index: int = -1
    last_index: int = -1
    term: int = -1
    leader_id: str | None = None
    # a retry answered from the log (issue 24): each entry's index and term
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
class Client:
    id: str
    believed: str
    next_at: int = 0
    outstanding: tuple[int, tuple[bytes, ...], int] | None = None  # (req id, bodies, sent at)
    seq: int = 0
    session: int = 0  # issue 24: its client id (0: not idempotent)
    next_seq: int = 0  # the sequence of its next new append
    ident: tuple[int, int] | None = None  # of the append outstanding
    retries: int = 0  # of the append outstanding


class Clients:
    """Clients and their appends (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _clients_step(self, now: int) -> None:
        for c in self.clients:
            if c.outstanding is not None:
                if now - c.outstanding[2] > self.client_timeout_ms:
                    self._inflight_clients.pop(c.outstanding[0], None)
                    c.believed = self.rng.choice(self.ids)
                    if c.session:  # the same append again, under the same identity
                        self._retry(c, c.outstanding[1], now)
                        continue
                    c.outstanding = None
                    self.unknown_outcomes += 1
                    c.next_at = now
                continue
            if not self.clients_on or now < c.next_at:
                continue
            if (
                c.id == "c0"
                and self._next_transfer_ms is not None
                and self._wander_rng.random() < 0.5
            ):
                c.believed = self._wander_rng.choice(
                    self.ids
                )  # a roaming writer: finds a new leader
            req_id = next(self._req_ids)
            k = self.rng.randint(1, self.max_bodies)
            if self.machine is not None:  # commands the group's state machine takes
                bodies = self._machine_bodies(c.id, req_id, k)
            else:
                bodies = tuple(
                    f"{c.id}:{req_id}:{j}:".encode() + b"x" * self.rng.randint(0, 120)
                    for j in range(k)
                )
            c.outstanding = (req_id, bodies, now)
            self._inflight_clients[req_id] = c
            c.ident, c.retries = None, 0
            if c.session:
                c.ident = (c.session, c.next_seq)
                c.next_seq += len(bodies)
            msg = ClientAppend(c.id, req_id, c.believed, bodies, c.ident)
            self._to_client(c.id, c.believed, msg)

    def _retry(self, c: Client, bodies: tuple[bytes, ...], now: int) -> None:
        """An idempotent client sends its append again (a new call, the same identity)."""
        req_id = next(self._req_ids)
        c.outstanding = (req_id, bodies, now)
        c.retries += 1
        self.stats["idempotent_retries"] += 1
        self._inflight_clients[req_id] = c
        self._to_client(c.id, c.believed, ClientAppend(c.id, req_id, c.believed, bodies, c.ident))

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
                    self.fail(
                        f"index {index} acknowledged twice ({self.acked[index]!r} and {body!r})"
                    )
                self.acked[index] = body
                self.max_acked = max(self.max_acked, index)
                self.acked_terms[index] = reply.term
                got = self.committed.get(index)
                if got is None:
                    self.acked_unseen[index] = (reply.term, reply.req_id)
                elif got[0] != reply.term and not self.durability_void:
                    self.fail(
                        f"append {reply.req_id} acknowledged at {index} (term {reply.term}) but committed {got}"
                    )
            return
        if reply.code in _SESSION_CODES:
            if not self.durability_void:  # (a power loss may drop a session's entries)
                self.fail(f"{c.id}'s append {reply.req_id} {c.ident} refused: {reply.code.name}")
            self.stats["session_refusals_after_power_loss"] += 1
        elif reply.code in (
            ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
            ResponseCode.TERM_CHANGED,
            ResponseCode.NOT_LEADER,
        ):
            self.unknown_outcomes += reply.code != ResponseCode.NOT_LEADER and not c.session
        if reply.leader_id is not None and reply.leader_id in self.members:
            c.believed = reply.leader_id
        elif reply.code != ResponseCode.LEADER_PENDING_FULL:
            c.believed = self.rng.choice(self.ids)
        if c.session and reply.code not in _SESSION_CODES:  # not written, or not known to be
            self._retry(c, bodies, now)
