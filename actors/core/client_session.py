"""Which identity each append of an idempotent client carries, and when its session is left
behind for a new one.

An idempotent client numbers its entries 0, 1, 2, ... in a session (its client id), and a
leader takes a session's sequences only in order: a later one while an earlier one is
missing from its log is refused OUT_OF_ORDER_SEQUENCE (``replication/sessions.py``).  So an
append whose outcome stayed unknown and that the client stops sending (its deadline ran
out) leaves its session with a hole whenever its entry is not in the leader's log: every
later sequence of that session would be refused for good.  As Kafka's idempotent producer
does since KIP-360, the client then leaves the session behind: the appends that cannot be
in any log move to a new session (a new client id, sequences from 0), and the identity of
the one left unknown is never sent again.

The rules, decided here once (the client on Ray and the simulation's clients act on them):

* An append keeps one identity for as long as it may be stored: while a call carrying it is
  out, and for good once a call carrying it ended with an unknown outcome.  It is never
  sent under another identity, so it can never be written twice.
* An append that cannot be stored anywhere (never sent, or every call carrying it was
  refused before storing: NOT_LEADER, a gap, ...) keeps its sequences while its session is
  the current one, and takes the current session's next sequences once it is not.
* A session is left behind when one of its appends ends without an acknowledgement (given
  up at its deadline, cancelled, refused for good), and when a leader refuses a gap that no
  live append of the client can fill.
* A gap refusal is retried while an earlier append of the session is live (it may fill the
  gap), or when one was acknowledged while the refused call was out (the leader may have
  looked before writing it: calls and answers are not ordered).  Otherwise the gap is
  there for good (the session expired, or the member is a deposed leader that lacks it): an
  append that may be stored is reported unknown at once (no retry of that identity can be
  answered otherwise), one that cannot be takes a new session.

A leader takes a session's calls in the order they reach it, and Ray starts an asyncio
actor's calls in no fixed order, even those of one caller: two calls of one session in
flight at once may reach the leader's admission swapped, and the later one is refused as a
gap.  So a client that keeps several calls in flight keeps one session per call in flight,
its lanes (:class:`SessionLanes`): a lane carries one call at a time, and an append stays in
the lane that numbered it until it ends.

Sans-I/O: :meth:`ClientSessions.step` takes an event (a call about to be sent, a call's
outcome, an append given up) and returns a :class:`SessionOut`; no clock, no threads, no
Ray.  New client ids come from the ``new_id`` the shell hands in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from rayledger.storage import ResponseCode

Ident = tuple[int, int]  # (client id, first sequence)

# refused before anything was stored: the same append may be sent again
RETRY_BEFORE_STORE = frozenset(
    {
        ResponseCode.NOT_LEADER,
        ResponseCode.LEADER_NOT_READY,
        ResponseCode.LEADER_TRANSFERRING,
        ResponseCode.LEADER_PENDING_FULL,
        ResponseCode.DISK_FULL,
    }
)
# refused because the leader lacks an earlier sequence of the session (nothing stored)
GAP_CODES = frozenset({ResponseCode.OUT_OF_ORDER_SEQUENCE, ResponseCode.SESSION_EXPIRED})


class Outcome(enum.Enum):
    """How one call carrying appends ended."""

    STORED = "stored"  # acknowledged
    REFUSED = "refused"  # refused before storing anything; worth sending again
    GAP = "gap"  # OUT_OF_ORDER_SEQUENCE / SESSION_EXPIRED: nothing stored by this call
    UNKNOWN = "unknown"  # may be stored (a member died, a term ended, a quorum wait ran out)
    FINAL = "final"  # refused for good (bad input, ...): nothing stored by this call


def outcome_of(code: ResponseCode, unknown: bool = False) -> Outcome:
    """The outcome of a call that failed with ``code`` (``unknown``: the member said the
    entries may be stored, or no member answered)."""
    if unknown:
        return Outcome.UNKNOWN
    if code in GAP_CODES:
        return Outcome.GAP
    if code in RETRY_BEFORE_STORE:
        return Outcome.REFUSED
    return Outcome.FINAL


class Action(enum.Enum):
    """What the shell does with the appends of a call that ended."""

    DONE = "done"  # acknowledged (or nothing of the call is live any more)
    RETRY = "retry"  # send again; :meth:`ClientSessions.pinned` says under which identity
    FAIL = "fail"  # the refusal is the caller's answer (nothing was stored)
    FAIL_UNKNOWN = "fail_unknown"  # the caller's answer is an unknown outcome


class Why(enum.Enum):
    """Why a session was left behind."""

    GAVE_UP = "an append of it ended unanswered"
    REFUSED = "an append of it was refused for good"
    LEADER_GAP = "a leader lacks an earlier sequence no live append can fill"


@dataclass(frozen=True, slots=True)
class Sending:
    """One call is about to carry ``keys`` (the shell's appends, in order) of ``sizes``
    entries each: more than one only when none keeps an identity (:meth:`pinned`)."""

    keys: tuple[Hashable, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Answered:
    """The call carrying ``keys`` ended with ``outcome``."""

    keys: tuple[Hashable, ...]
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class GaveUp:
    """``key`` ended without an acknowledgement outside a call's answer: its deadline ran
    out, its caller cancelled it, the client closed."""

    key: Hashable


@dataclass(frozen=True, slots=True)
class SessionOut:
    """What one event decided."""

    action: Action | None = None  # Answered: what to do with the call's appends
    ident: Ident | None = None  # Sending: the identity the call carries
    idents: tuple[Ident, ...] = ()  # Sending: each append's
    renumbered: int = 0  # Sending: appends of a session left behind that took new sequences
    # Sending: a call carrying this identity ended with an unknown outcome, so it may be
    # stored (a leader that lacks some sessions takes a new one only when it cannot be)
    maybe_stored: bool = False
    left_behind: int | None = None  # a session left behind ...
    started: int | None = None  # ... for this new one
    why: Why | None = None
    lane: int | None = None  # SessionLanes, Sending: the lane (session) the call goes in


@dataclass(slots=True)
class _Append:
    ident: Ident
    maybe: bool = False  # a call carrying it ended with an unknown outcome
    in_flight: bool = False  # a call carrying it is out
    acks_at_send: int = 0  # its session's acknowledgements when its last call went out


class ClientSessions:
    """The session decisions of one idempotent client (see the module's docstring).

    Keys are the shell's appends (anything hashable, compared as the shell compares them);
    an append is known here from its first :class:`Sending` until it is acknowledged, fails
    or is given up."""

    def __init__(self, new_id: Callable[[], int]):
        self._new_id = new_id
        self.client_id = self._fresh_id(None)
        self.next_seq = 0
        self.sessions_started = 1
        self._appends: dict[Hashable, _Append] = {}
        self._acks: dict[int, int] = {}  # calls acknowledged, per session with live appends

    def _fresh_id(self, old: int | None) -> int:
        new = self._new_id()
        if not isinstance(new, int) or new <= 0 or new == old:
            raise ValueError(f"a session needs a new positive client id, got {new!r}")
        return new

    def __len__(self) -> int:
        """Appends known here (live)."""
        return len(self._appends)

    # -- questions the shell asks ----------------------------------------------------------
    def pinned(self, key: Hashable) -> bool:
        """Whether ``key`` must go under the identity it has, in a call of its own: it may
        be stored under it, or its sequences are still in line in the current session."""
        a = self._appends.get(key)
        return a is not None and (a.maybe or a.in_flight or a.ident[0] == self.client_id)

    def maybe_stored(self, key: Hashable) -> bool:
        """Whether a call carrying ``key`` ended with an unknown outcome."""
        a = self._appends.get(key)
        return a is not None and a.maybe

    def ident(self, key: Hashable) -> Ident | None:
        a = self._appends.get(key)
        return None if a is None else a.ident

    # -- events ----------------------------------------------------------------------------
    def step(self, event: Sending | Answered | GaveUp) -> SessionOut:
        if isinstance(event, Sending):
            return self._sending(event)
        if isinstance(event, Answered):
            return self._answered(event)
        if isinstance(event, GaveUp):
            a = self._appends.pop(event.key, None)
            return SessionOut() if a is None else self._ended(a, Why.GAVE_UP)
        raise TypeError(f"not a client session event: {event!r}")

    def _sending(self, ev: Sending) -> SessionOut:
        keys = ev.keys
        if not keys or len(keys) != len(ev.sizes) or min(ev.sizes) <= 0:
            raise ValueError(f"a call carries appends of one entry or more, got {ev!r}")
        for k in keys:
            a = self._appends.get(k)
            if a is not None and a.in_flight:
                raise ValueError(f"append {k!r} is already in a call")
        if len(keys) == 1 and self.pinned(keys[0]):
            a = self._appends[keys[0]]
            a.in_flight = True
            a.acks_at_send = self._acks.get(a.ident[0], 0)
            return SessionOut(ident=a.ident, idents=(a.ident,), maybe_stored=a.maybe)
        if any(self.pinned(k) for k in keys):
            raise ValueError("an append that keeps its identity goes in a call of its own")
        seq, idents, renumbered = self.next_seq, [], 0
        for k, n in zip(keys, ev.sizes, strict=True):
            renumbered += k in self._appends  # numbered in a session left behind
            ident = (self.client_id, seq)
            self._appends[k] = _Append(ident, in_flight=True,
                                       acks_at_send=self._acks.get(self.client_id, 0))  # fmt: skip
            idents.append(ident)
            seq += n
        self.next_seq = seq
        return SessionOut(ident=idents[0], idents=tuple(idents), renumbered=renumbered)

    def _answered(self, ev: Answered) -> SessionOut:
        live = [(k, self._appends[k]) for k in ev.keys if k in self._appends]
        for _, a in live:
            a.in_flight = False
        if not live:  # every append of the call ended meanwhile (given up)
            return SessionOut(action=Action.DONE)
        o = ev.outcome
        if o is Outcome.STORED:
            for k, _ in live:
                del self._appends[k]
            sid = live[0][1].ident[0]
            self._acks[sid] = self._acks.get(sid, 0) + 1
            return SessionOut(action=Action.DONE)
        if o is Outcome.UNKNOWN:
            for _, a in live:
                a.maybe = True
            return SessionOut(action=Action.RETRY)
        if o is Outcome.REFUSED:
            return SessionOut(action=Action.RETRY)
        maybe = any(a.maybe for _, a in live)
        if o is Outcome.FINAL:
            for k, _ in live:
                del self._appends[k]
            out = self._ended(live[0][1], Why.REFUSED)  # one call: one session
            return replace(out, action=Action.FAIL_UNKNOWN if maybe else Action.FAIL)
        return self._gap(live, maybe)

    def _gap(self, live: list[tuple[Hashable, _Append]], maybe: bool) -> SessionOut:
        sid, seq = min(a.ident for _, a in live)
        mine = {k for k, _ in live}
        if any(
            b.ident[0] == sid and b.ident[1] < seq
            for k, b in self._appends.items()
            if k not in mine
        ):
            return SessionOut(action=Action.RETRY)  # an earlier append may fill the gap
        if any(a.acks_at_send != self._acks.get(sid, 0) for _, a in live):
            return SessionOut(action=Action.RETRY)  # one filled it while the call was out
        out = self._leave(Why.LEADER_GAP) if sid == self.client_id else SessionOut()
        if maybe:  # its identity can never be answered otherwise: unknown, for good
            for k, _ in live:
                del self._appends[k]
            return replace(out, action=Action.FAIL_UNKNOWN)
        return replace(out, action=Action.RETRY)  # it takes the current session

    def _ended(self, a: _Append, why: Why) -> SessionOut:
        """``a`` ended unacknowledged: its sequences may be a hole in its session."""
        if a.ident[0] != self.client_id:
            return SessionOut()
        return self._leave(why)

    def _leave(self, why: Why) -> SessionOut:
        old = self.client_id
        live = {a.ident[0] for a in self._appends.values()} | {old}
        self._acks = {sid: n for sid, n in self._acks.items() if sid in live}
        self.client_id = self._fresh_id(old)
        self.next_seq = 0
        self.sessions_started += 1
        return SessionOut(left_behind=old, started=self.client_id, why=why)


class SessionLanes:
    """An idempotent client's sessions, one per call it keeps in flight (its lanes): the
    lane a call goes in, and which lanes are busy.  Lane 0 is the client's first session;
    more start as calls overlap, up to ``lanes``.  Events about appends go to the lane that
    numbered them; a call's lane is busy from its :class:`Sending` to its
    :class:`Answered` (the shell steps exactly one for every call it numbered)."""

    def __init__(self, new_id: Callable[[], int], lanes: int):
        if lanes < 1:
            raise ValueError(f"a client needs at least one lane, got {lanes}")
        self._new_id = new_id
        self.max_lanes = lanes
        self.lanes: list[ClientSessions] = [ClientSessions(new_id)]
        self._calls: dict[tuple[Hashable, ...], int] = {}  # a call out -> its lane
        self._lane_of: dict[Hashable, int] = {}  # an append -> the lane that knows it

    # -- questions the shell asks ----------------------------------------------------------
    @property
    def client_id(self) -> int:
        """The first lane's current session (a client with one call at a time has only it)."""
        return self.lanes[0].client_id

    @property
    def sessions_started(self) -> int:
        """One, plus one per session a lane left behind."""
        return 1 + sum(s.sessions_started - 1 for s in self.lanes)

    def lane_of(self, key: Hashable) -> int | None:
        return self._lane_of.get(key)

    def pinned(self, key: Hashable) -> bool:
        lane = self._lane_of.get(key)
        return lane is not None and self.lanes[lane].pinned(key)

    def maybe_stored(self, key: Hashable) -> bool:
        lane = self._lane_of.get(key)
        return lane is not None and self.lanes[lane].maybe_stored(key)

    def sendable(self, key: Hashable) -> bool:
        """Whether a call carrying ``key`` may go now: its lane (if it has one) is free, or
        any lane is free or may start."""
        busy = set(self._calls.values())
        lane = self._lane_of.get(key)
        if lane is not None:
            return lane not in busy
        return len(busy) < self.max_lanes

    # -- events ----------------------------------------------------------------------------
    def step(self, event: Sending | Answered | GaveUp) -> SessionOut:
        """A call about to be sent (numbered in the lane of its first key, else the first
        free one; ``SessionOut.lane``), a call's outcome (its lane is free again) or an
        append given up, in the lane that numbered it.  Raises ValueError for a call no
        lane may take now, or whose appends are in different lanes."""
        if isinstance(event, Sending):
            return self._sending(event)
        if isinstance(event, Answered):
            lane = self._calls.pop(event.keys, None)
            keys = event.keys
        elif isinstance(event, GaveUp):
            lane, keys = self._lane_of.get(event.key), (event.key,)
        else:
            raise TypeError(f"not a client session event: {event!r}")
        if lane is None:  # no lane knows them: nothing to decide
            return SessionOut(action=Action.DONE) if isinstance(event, Answered) else SessionOut()
        sessions = self.lanes[lane]
        out = sessions.step(event)
        for k in keys:  # forgotten by the lane once they ended
            if sessions.ident(k) is None and self._lane_of.get(k) == lane:
                del self._lane_of[k]
        return out

    def _sending(self, ev: Sending) -> SessionOut:
        lanes = {self._lane_of[k] for k in ev.keys if k in self._lane_of}
        if len(lanes) > 1:
            raise ValueError("a call carries appends of one lane")
        busy = set(self._calls.values())
        if lanes:
            (lane,) = lanes
        else:
            free = [i for i in range(len(self.lanes)) if i not in busy]
            if free:
                lane = free[0]
            elif len(self.lanes) < self.max_lanes:
                self.lanes.append(ClientSessions(self._new_id))
                lane = len(self.lanes) - 1
            else:
                raise ValueError("every lane carries a call")
        if lane in busy:
            raise ValueError(f"lane {lane} carries a call")
        out = self.lanes[lane].step(ev)
        self._calls[ev.keys] = lane
        for k in ev.keys:
            self._lane_of[k] = lane
        return replace(out, lane=lane)


__all__ = [
    "GAP_CODES",
    "RETRY_BEFORE_STORE",
    "Action",
    "Answered",
    "ClientSessions",
    "GaveUp",
    "Ident",
    "Outcome",
    "SessionLanes",
    "SessionOut",
    "Sending",
    "Why",
    "outcome_of",
]
