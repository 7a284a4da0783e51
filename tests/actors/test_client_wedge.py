"""An idempotent client never wedges on a hole in its session, without Ray.

A leader takes a session's sequences only in order, so an append left unknown at its
deadline whose entry is not in the leader's log would get every later sequence of its
session refused OUT_OF_ORDER_SEQUENCE.  The client must leave such a session behind: its
later appends flow again at once, the unknown one is still reported unknown, and no body
that may be stored under one identity is ever sent under another (it could commit twice).

The member here is a scripted leader over the shipped SessionTable and refusal codes
(``actors/core/rounds.py``); the client is the shipped LedgerClient; the decisions are
``actors/core/client_session.py``'s, also tested on their own below.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
from rayledger.actors import client as client_module
from rayledger.actors.client import LedgerClient
from rayledger.actors.core.client_session import (
    Action,
    Answered,
    ClientSessions,
    GaveUp,
    Outcome,
    Sending,
    SessionLanes,
    Why,
    outcome_of,
)
from rayledger.actors.core.rounds import _REFUSED, Spread
from rayledger.replication.sessions import SessionTable, Verdict
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

C = ResponseCode


# -- the decisions on their own ---------------------------------------------------------------
def _core() -> ClientSessions:
    ids = iter(range(100, 1000))
    return ClientSessions(lambda: next(ids))


def test_sequences_in_order_and_a_call_numbers_its_appends_back_to_back():
    s = _core()
    assert s.client_id == 100
    out = s.step(Sending(("a", "b"), (2, 3)))
    assert out.ident == (100, 0) and out.idents == ((100, 0), (100, 2))
    assert s.step(Sending(("c",), (1,))).ident == (100, 5)
    assert s.step(Answered(("a", "b"), Outcome.STORED)).action is Action.DONE
    assert len(s) == 1 and s.next_seq == 6


def test_an_unknown_outcome_pins_the_identity_and_a_give_up_leaves_the_session():
    s = _core()
    s.step(Sending(("a",), (1,)))
    assert s.step(Answered(("a",), Outcome.UNKNOWN)).action is Action.RETRY
    assert s.pinned("a") and s.maybe_stored("a")
    assert s.step(Sending(("a",), (1,))).ident == (100, 0)  # the same identity again
    s.step(Sending(("b",), (1,)))  # numbered behind it: (100, 1)
    assert s.step(Answered(("b",), Outcome.GAP)).action is Action.RETRY  # "a" may fill it
    out = s.step(GaveUp("a"))  # its deadline ran out, its call still out
    assert (out.left_behind, out.started, out.why) == (100, 101, Why.GAVE_UP)
    assert not s.pinned("b")  # stored nowhere: it takes the new session
    assert s.step(Sending(("b", "c"), (1, 1))).idents == ((101, 0), (101, 1))


def test_an_append_that_may_be_stored_never_changes_identity():
    s = _core()
    s.step(Sending(("a", "b"), (1, 1)))
    s.step(Answered(("a", "b"), Outcome.UNKNOWN))
    s.step(Sending(("a",), (1,)))
    s.step(GaveUp("a"))  # the session is left behind ...
    assert s.client_id == 101
    assert s.pinned("b") and s.step(Sending(("b",), (1,))).ident == (100, 1)  # ... not by "b"
    # a gap no live append can fill: "b" can never be answered otherwise -> unknown now
    out = s.step(Answered(("b",), Outcome.GAP))
    assert out.action is Action.FAIL_UNKNOWN and len(s) == 0
    with pytest.raises(ValueError):  # a pinned append never rides in a shared call
        s.step(Sending(("x",), (1,)))
        s.step(Answered(("x",), Outcome.UNKNOWN))
        s.step(Sending(("x", "y"), (1, 1)))


def test_a_gap_nothing_can_fill_moves_what_was_never_stored_to_a_new_session():
    s = _core()
    s.step(Sending(("a",), (1,)))
    out = s.step(Answered(("a",), Outcome.GAP))  # e.g. the session expired at the leader
    assert out.action is Action.RETRY and out.why is Why.LEADER_GAP and out.started == 101
    assert s.step(Sending(("a",), (1,))).ident == (101, 0)


def test_refusals_for_good():
    s = _core()
    s.step(Sending(("a",), (1,)))
    out = s.step(Answered(("a",), Outcome.FINAL))
    assert out.action is Action.FAIL and out.why is Why.REFUSED and s.client_id == 101
    s.step(Sending(("b",), (1,)))
    s.step(Answered(("b",), Outcome.UNKNOWN))
    s.step(Sending(("b",), (1,)))
    assert s.step(Answered(("b",), Outcome.FINAL)).action is Action.FAIL_UNKNOWN
    with pytest.raises(ValueError):
        s.step(Sending(("c",), (1,)))
        s.step(Sending(("c",), (1,)))  # already in a call


def test_outcome_of_codes():
    assert outcome_of(C.NOT_LEADER) is Outcome.REFUSED
    assert outcome_of(C.OUT_OF_ORDER_SEQUENCE) is Outcome.GAP
    assert outcome_of(C.SESSION_EXPIRED) is Outcome.GAP
    assert outcome_of(C.ENTRY_TOO_LARGE) is Outcome.FINAL
    assert outcome_of(C.TERM_CHANGED, unknown=True) is Outcome.UNKNOWN


# -- a scripted leader ----------------------------------------------------------------------
@dataclass
class Call:
    bodies: list[bytes]
    ident: tuple[int, int]
    verdict: str = ""  # "stored" (or answered from the log), "unknown", "held", "refused"

    def idents(self) -> list[tuple[int, int]]:
        c, s = self.ident
        return [(c, s + k) for k in range(len(self.bodies))]


@dataclass
class Leader:
    """Whoever leads, as the client sees it: a log followed by the shipped SessionTable.
    A call's entries are stored, then acknowledged (committed), left unknown, or held until
    a leader change drops or keeps them; ``black_hole`` identities are answered unknown and
    never stored (the entry an old leader took and lost); ``faults`` adds all that at
    random."""

    faults: float = 0.0
    seed: int = 0
    hold: bool = False
    black_hole: set[tuple[int, int]] = field(default_factory=set)
    log: list[tuple[bytes, tuple[int, int]]] = field(default_factory=list)
    committed: int = -1
    calls: list[Call] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.table = SessionTable(ttl_ms=3_600_000)
        self.lock = threading.Lock()
        self.rng = random.Random(self.seed)
        self.held: list[tuple[concurrent.futures.Future, int, int]] = []
        self.term = 1
        self.append = self  # handle.append.remote(...)
        # answers land on another thread, as Ray's do (never inside the call to ``remote``)
        self.answers = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="leader")

    # the member's append
    def remote(self, bodies, group, target, ident=None, maybe_stored=True):
        f: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            call = Call(list(bodies), ident)
            self.calls.append(call)
            what = self._admit(call)
            if isinstance(what, list):  # stored, the answer held back
                self.held.append((f, what[0], what[-1]))
        if isinstance(what, BaseException):
            self.answers.submit(f.set_exception, what)
        elif not isinstance(what, list):
            self.answers.submit(f.set_result, what)
        return SimpleNamespace(future=lambda: f)

    def _admit(self, call: Call):
        rng, f = self.rng, self.faults
        client, seq = call.ident
        if call.ident in self.black_hole:
            call.verdict = "unknown"
            return OutcomeUnknownError(C.TERM_CHANGED, "the leader's term ended")
        if f and rng.random() < f / 4:
            call.verdict = "refused"
            return LedgerError.of(C.NOT_LEADER, "not the leader")
        c = self.table.check(client, seq, len(call.bodies), now=self.table.last_stamp)
        if c.verdict in (Verdict.DUPLICATE, Verdict.PARTIAL):
            got = [self.log[i][0] for first, n in c.spans for i in range(first, first + n)]
            if got != call.bodies[: c.known]:
                self.mismatches.append(f"{call.ident}: {got} != {call.bodies[: c.known]}")
                call.verdict = "refused"
                return LedgerError.of(C.SEQUENCE_MISMATCH, "another body under this identity")
            where = [i for first, n in c.spans for i in range(first, first + n)]
            if c.verdict is Verdict.PARTIAL:
                where += self._store(call.bodies[c.known :], client, seq + c.known)
            call.verdict = "stored"
            self._commit(max(where))
            return Spread(*(np.array(x, dtype=np.int64).tobytes()
                            for x in (where, [self.term] * len(where), [i * 100 for i in where])))  # fmt: skip
        if c.verdict is not Verdict.NEW:
            call.verdict = "refused"
            code, why = _REFUSED[c.verdict]
            return LedgerError.of(code, why.format(next=c.next_seq))
        where = self._store(call.bodies, client, seq)
        if self.hold or (f and rng.random() < f / 3):
            call.verdict = "held"
            return where
        if f and rng.random() < f / 3:
            call.verdict = "unknown"  # stored, not acknowledged: a leader change decides
            return OutcomeUnknownError(C.WAIT_QUORUM_ACK_TIMEOUT, "no quorum in time")
        call.verdict = "stored"
        self._commit(where[-1])
        return (where[0], self.term, np.array([i * 100 for i in where], np.int64).tobytes())

    def _store(self, bodies: list[bytes], client: int, seq: int) -> list[int]:
        first = len(self.log)
        self.log += [(b, (client, seq + k)) for k, b in enumerate(bodies)]
        where = list(range(first, len(self.log)))
        self.table.appended(where, [(client, seq + k, 1000, 0) for k in range(len(bodies))])
        return where

    def _commit(self, index: int) -> None:
        self.committed = max(self.committed, index)

    def change(self, keep: int | None = None) -> None:
        """A new leader: it has ``keep`` (default: a random number) of the uncommitted
        entries and commits them; the rest are gone, and every call waiting ends unknown."""
        with self.lock:
            spare = len(self.log) - 1 - self.committed
            keep = self.rng.randint(0, spare) if keep is None else keep
            end = self.committed + keep
            del self.log[end + 1 :]
            self.table.truncated(end)
            self.committed = end
            self.term += 1
            held, self.held = self.held, []
        for f, _, _ in held:
            f.set_exception(OutcomeUnknownError(C.TERM_CHANGED, "the leader's term ended"))

    def release(self) -> None:
        """Acknowledge every held call (its entries commit)."""
        with self.lock:
            held, self.held = self.held, []
            for _, _, last in held:
                self._commit(last)
        for f, first, last in held:
            where = range(first, last + 1)
            f.set_result((first, self.term, np.array([i * 100 for i in where], np.int64).tobytes()))

    # the checks
    def committed_bodies(self) -> list[bytes]:
        return [b for b, _ in self.log[: self.committed + 1]]

    def check_identities(self) -> None:
        """No identity carried two bodies, and no body that may be stored under one
        identity was ever sent under another."""
        assert not self.mismatches, self.mismatches[:3]
        body_of: dict[tuple[int, int], bytes] = {}
        fixed: dict[bytes, tuple[int, int]] = {}  # a body that may be stored -> its identity
        for call in self.calls:
            for body, ident in zip(call.bodies, call.idents(), strict=True):
                assert body_of.setdefault(ident, body) == body, f"{ident} carried two bodies"
                if body in fixed:
                    assert fixed[body] == ident, (
                        f"{body!r} may be stored under {fixed[body]} yet was sent under {ident}"
                    )
                if call.verdict != "refused":
                    fixed[body] = ident


class Client(LedgerClient):
    def __init__(self, member: Leader, timeout_s: float = 5.0, max_in_flight: int = 4):
        super().__init__("g", ["n0"], timeout_s, max_in_flight=max_in_flight)
        self.member, self._leader = member, "n0"

    def close(self) -> None:
        super().close()
        self.member.answers.shutdown(wait=True)

    def _handle(self, name: str) -> Leader:
        return self.member

    def _find_leader(self, timeout_s: float = 1.0) -> str:
        return "n0"


def _wait(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_lanes_carry_one_call_each_and_keep_an_append_in_its_lane():
    ids = iter(range(500, 600))
    lanes = SessionLanes(lambda: next(ids), 2)
    out_a = lanes.step(Sending(("a",), (1,)))
    out_b = lanes.step(Sending(("b", "c"), (1, 2)))
    assert (out_a.lane, out_b.lane) == (0, 1) and out_a.ident[0] != out_b.ident[0]
    assert out_b.idents == ((out_b.ident[0], 0), (out_b.ident[0], 1))
    assert not lanes.sendable("d")  # both lanes carry a call
    with pytest.raises(ValueError):
        lanes.step(Sending(("d",), (1,)))
    lanes.step(Answered(("a",), Outcome.REFUSED))  # lane 0 is free; "a" keeps its identity
    assert lanes.pinned("a") and lanes.lane_of("a") == 0 and not lanes.sendable("b")
    with pytest.raises(ValueError):  # one call carries appends of one lane
        lanes.step(Sending(("a", "b"), (1, 1)))
    again = lanes.step(Sending(("a",), (1,)))
    assert again.lane == 0 and again.ident == out_a.ident  # the same identity, in its lane
    lanes.step(GaveUp("a"))  # given up while out: forgotten, and its call still frees lane 0
    assert lanes.lane_of("a") is None and not lanes.sendable("d")
    assert lanes.step(Answered(("a",), Outcome.UNKNOWN)).action is Action.DONE
    assert lanes.sendable("d") and lanes.step(Sending(("d",), (1,))).lane == 0
    assert lanes.sessions_started == 2  # lane 0 left the session "a" ended unanswered in
    with pytest.raises(ValueError):
        SessionLanes(lambda: next(ids), 0)


# -- the wedge, reproduced --------------------------------------------------------------------
def test_appends_after_an_unknown_outcome_flow_in_a_new_session():
    """Append 1's entry was taken by a leader that lost it, and it is never answered: it
    ends unknown at its deadline; appends 2..4 then commit at once (before: each was refused
    OUT_OF_ORDER_SEQUENCE until its deadline, for as long as the session lived)."""
    m = Leader()
    c = Client(m, timeout_s=0.5)
    try:
        assert c.append(b"zero").index == 0
        first = c.client_id
        m.black_hole.add((first, 1))
        with pytest.raises(OutcomeUnknownError):
            c.append(b"first")
        assert {call.ident for call in m.calls[1:]} == {(first, 1)}  # tried under it only
        for k in range(2, 5):
            t = time.monotonic()
            r = c.append(b"next %d" % k)
            assert time.monotonic() - t < 0.3, "answered at once, not at the deadline"
            assert m.log[r.index][0] == b"next %d" % k
        assert c.client_id != first and c.sessions_started == 2
        assert m.committed_bodies() == [b"zero", b"next 2", b"next 3", b"next 4"]
        assert (first, 1) not in {call.ident for call in m.calls if call.bodies != [b"first"]}
        m.check_identities()
    finally:
        c.close()


@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_appends_sent_while_the_unknown_one_retries_are_never_numbered_behind_it(max_in_flight):
    """Appends sent while the unknown one still retries never take sequences behind it (a
    gap its leader would refuse until it ended): a session carries one call at a time, so
    they wait for its lane, or go in another lane's session.  Once it ends unknown its
    session is left behind, and every append commits."""
    m = Leader()
    c = Client(m, timeout_s=0.6, max_in_flight=max_in_flight)
    try:
        c.append(b"zero")
        first = c.client_id
        m.black_hole.add((first, 1))
        f1 = c.append_future([b"one"])
        _wait(lambda: any(call.ident == (first, 1) for call in m.calls))
        later = [c.append_future([b"later %d" % k], timeout_s=5.0) for k in range(6)]
        with pytest.raises(OutcomeUnknownError):
            f1.result(timeout=5)
        results = [f.result(timeout=5)[0] for f in later]
        gaps = [call for call in m.calls if call.ident[0] == first and call.ident[1] > 1]
        assert not gaps
        bodies = m.committed_bodies()
        assert sorted(bodies[1:]) == sorted(b"later %d" % k for k in range(6))
        assert all(m.log[r.index][1][0] != first for r in results)  # the new session's
        m.check_identities()
    finally:
        c.close()


@dataclass
class _Reordering(Leader):
    """A leader whose calls wait until :meth:`admit_reversed` takes them last first (Ray
    starts a member's calls in no fixed order, even one caller's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.waiting: list = []

    def remote(self, *args, **kwargs):
        f: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            self.waiting.append((f, args, kwargs))
        return SimpleNamespace(future=lambda: f)

    def admit_reversed(self) -> None:
        with self.lock:
            todo, self.waiting = self.waiting, []
        for f, args, kwargs in reversed(todo):
            Leader.remote(self, *args, **kwargs).future().add_done_callback(
                lambda g, f=f: (
                    f.set_exception(g.exception()) if g.exception() else f.set_result(g.result())
                )
            )


def test_calls_in_flight_at_once_carry_sessions_of_their_own():
    """Calls out at once are each in a session (lane) of their own, so a leader that
    starts them last first refuses none; the next calls wait for a free lane."""
    m = _Reordering()
    c = Client(m, max_in_flight=4)
    try:
        futures = []
        for k in range(4):  # each goes out at once: nothing queued to coalesce with
            futures.append(c.append_future([b"a%d" % k]))
            _wait(lambda k=k: len(m.waiting) == k + 1)
        futures += [c.append_future([b"a%d" % k]) for k in range(4, 12)]  # wait for lanes
        while not all(f.done() for f in futures):
            _wait(lambda: m.waiting or all(f.done() for f in futures))
            m.admit_reversed()
        for f in futures:
            assert f.result(timeout=5)
        assert [call.verdict for call in m.calls] == ["stored"] * len(m.calls)
        assert len({call.ident[0] for call in m.calls[:4]}) == 4  # one session each
        assert c.sessions_started == 1  # lanes are not sessions left behind
        assert sorted(m.committed_bodies()) == sorted(b"a%d" % k for k in range(12))
        m.check_identities()
    finally:
        c.close()


@pytest.mark.parametrize("max_in_flight", [1, 2, 4])
def test_appends_in_flight_when_the_gap_appears(max_in_flight):
    """Several calls out when their leader loses them all: the one whose retry is never
    answered ends unknown at its deadline; the others, which may be stored, keep their
    identity and end unknown too (a gap nothing fills); those that were still queued, and
    every later append, commit in a new session.  With several lanes the calls out are
    each in a session of its own: those not behind the lost one commit under the identity
    they were sent with (the new leader lacks their sessions, which start at them)."""
    m = Leader(hold=True)
    c = Client(m, timeout_s=0.8, max_in_flight=max_in_flight)
    try:
        c.append_future([b"zero"])
        _wait(lambda: m.held)
        m.release()
        m.hold = True
        first = c.client_id
        futures = [c.append_future([b"x%d" % k], timeout_s=0.8 if k == 0 else 5.0)
                   for k in range(6)]  # fmt: skip
        _wait(lambda: len(m.held) == max_in_flight)
        m.black_hole.add((first, 1))  # x0's identity: never answered again
        m.hold = False
        m.change(keep=0)  # the new leader has none of them
        outcomes: dict[bytes, object] = {}
        for k, f in enumerate(futures):
            try:
                outcomes[b"x%d" % k] = f.result(timeout=10)[0]
            except LedgerError as exc:
                outcomes[b"x%d" % k] = exc
        assert isinstance(outcomes[b"x0"], OutcomeUnknownError)
        sent = {b for call in m.calls[1:] if call.verdict == "held" for b in call.bodies}
        for body, got in outcomes.items():
            if body in sent and max_in_flight == 1:  # it may be stored: unknown
                assert isinstance(got, OutcomeUnknownError), (body, got)
            elif body in sent:  # unknown, or committed once (never renumbered: below)
                assert isinstance(got, OutcomeUnknownError) or m.log[got.index][0] == body
            else:
                assert not isinstance(got, LedgerError), (body, got)
                assert m.log[got.index][0] == body
        r = c.append(b"after", timeout_s=1.0)
        assert m.log[r.index][0] == b"after" and c.client_id != first
        bodies = m.committed_bodies()
        assert len(bodies) == len(set(bodies))
        m.check_identities()
    finally:
        c.close()


@pytest.mark.parametrize("seed", range(4))
def test_no_body_is_committed_twice_or_sent_under_two_identities(seed):
    """Writers on one client through random refusals, unknown outcomes, held calls, leader
    changes that keep or drop unacknowledged entries, and identities never answered (their
    deadlines run out): every ack is where it says, nothing is committed twice, nothing
    refused is committed, no body that may be stored moves to another identity -- and once
    the faults stop, the same client's appends all commit."""
    m = Leader(faults=0.3, seed=seed)
    c = Client(m, timeout_s=0.3)
    rng = random.Random(seed)
    acked: dict[int, bytes] = {}
    unknown: list[bytes] = []
    failed: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        for i in range(10_000):
            if stop.is_set():
                return
            body = b"w%d-%d" % (w, i)
            try:
                r = c.append(body)
            except OutcomeUnknownError:
                with lock:
                    unknown.append(body)
            except LedgerError:
                with lock:
                    failed.append(body)
            else:
                with lock:
                    assert acked.setdefault(r.index, body) == body
            time.sleep(rng.random() * 0.004)

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    try:
        # faults for 2 s, and on until one outcome is unknown (a loaded machine may
        # need longer for its first deadline to run out)
        t_end, t_max = time.monotonic() + 2.0, time.monotonic() + 30.0
        while time.monotonic() < t_end or (not unknown and time.monotonic() < t_max):
            time.sleep(rng.uniform(0.02, 0.15))
            if rng.random() < 0.5:
                m.change()
            if rng.random() < 0.3:  # an identity of a call now out is never answered again
                with m.lock:
                    out = [call.ident for call in m.calls[-8:]]
                m.black_hole.add(rng.choice(out))
        stop.set()
        for t in threads:
            t.join(10)
        m.faults = 0.0
        m.black_hole.clear()
        m.change()
        m.release()
        assert unknown, "the faults left no outcome unknown"
        for k in range(10):  # the same client is not wedged
            r = c.append(b"after %d" % k, timeout_s=1.0)
            acked[r.index] = b"after %d" % k
    finally:
        stop.set()
        c.close()
    bodies = m.committed_bodies()
    twice = [b for b in set(bodies) if bodies.count(b) > 1]
    assert not twice, f"committed twice: {twice[:5]}"
    for index, body in acked.items():
        assert bodies[index] == body, f"ack of {body!r} at {index}: {bodies[index]!r} there"
    assert not set(failed) & set(bodies), "a refused append was committed"
    m.check_identities()


# -- a member the client has not heard of ------------------------------------------------------
class _Reads:
    """A member's read methods, answered at once (``ray.get`` is patched to pass through)."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def __getattr__(self, method: str):
        def remote(*args, **kw):
            self.calls.append((self.name, method))
            return [("p/1", {"b64": "dg=="}, 3)] if method == "query" else 7

        return SimpleNamespace(remote=remote)


@pytest.fixture
def replaced(monkeypatch):
    """A client made when the group was n0, n1, n2; n2 has been replaced by n3 since."""
    calls: list = []
    monkeypatch.setattr(client_module, "group_members", lambda group: ["n0", "n1", "n3"])
    monkeypatch.setattr(client_module.ray, "get", lambda ref, timeout=None: ref)
    c = LedgerClient("kv-1", ["n0", "n1", "n2"])
    monkeypatch.setattr(c, "_handle", lambda m: _Reads(m, calls))
    return c, calls


def test_a_member_added_since_the_client_looked_is_found(replaced):
    c, calls = replaced
    assert c.committed_index(consistency="committed", member="n3") == 7
    assert calls == [("n3", "committed_index")] and c.members == ["n0", "n1", "n3"]
    with pytest.raises(LedgerError) as e:
        c.committed_index(member="n9")
    assert e.value.code == C.UNKNOWN_MEMBER


def test_the_kv_client_finds_it_too(replaced):
    from rayledger.integration.kv.client import KVClient

    c, calls = replaced
    kv = KVClient.__new__(KVClient)
    kv.client = c
    assert kv.scan(prefix="p", consistency="committed", member="n3") == [("p/1", b"v")]
    assert calls == [("n3", "query")]


def test_a_client_kept_to_its_members_does_not_look(replaced):
    c, _ = replaced
    c.discover = False
    with pytest.raises(LedgerError) as e:
        c.committed_index(member="n3")
    assert e.value.code == C.UNKNOWN_MEMBER


def test_identity_check_sees_a_body_moved_after_it_may_be_stored():
    """The check above bites: a body that may be stored, then sent under a new identity."""
    m = Leader()
    m.calls = [Call([b"a"], (1, 0), "unknown"), Call([b"a"], (2, 0), "stored")]
    with pytest.raises(AssertionError, match="may be stored"):
        m.check_identities()
    m.calls = [Call([b"a"], (1, 0), "refused"), Call([b"a"], (2, 0), "stored")]
    m.check_identities()
