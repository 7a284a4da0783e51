"""Exactly-once appends on Ray: a leader answers a retried identity with the
original result, refuses bad identities with a code and appends nothing, and an idempotent
client retries unknown outcomes -- a round lost on the way, a leader killed -- into exactly
one copy of each append."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import ray
from groupcheck import Outcomes, Writer, check_history, stop_writers, wait_until
from rayledger.actors.core.rounds import Spread
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode, SessionError

pytestmark = pytest.mark.ray
C = ResponseCode


def _spread(out) -> list[tuple[int, int, int]]:
    assert isinstance(out, Spread), out
    cols = [np.frombuffer(b, dtype=np.int64).tolist() for b in (out.indexes, out.terms,
                                                                 out.positions)]  # fmt: skip
    return list(zip(*cols, strict=True))


def test_a_retry_gets_the_original_and_bad_identities_append_nothing(make_group):
    g = make_group(members=3)
    g.client(idempotent=False).append(b"ready")  # the leader has taken office
    leader = g.wait_for_leader()
    h = g.handle(leader)
    first, term, pos = ray.get(h.append.remote([b"a", b"bb"], g.name, None, (77, 0)))
    want = [(first, term, p) for p in np.frombuffer(pos, dtype=np.int64).tolist()]
    want[1] = (first + 1, term, want[1][2])
    assert _spread(ray.get(h.append.remote([b"a", b"bb"], g.name, None, (77, 0)))) == want
    assert _spread(ray.get(h.append.remote([b"bb"], g.name, None, (77, 1)))) == want[1:]
    end = g.status()[leader].ledger_end_index
    refused = {
        ((77, 5), (b"x",)): C.OUT_OF_ORDER_SEQUENCE,  # 2..4 missing
        ((78, 3), (b"x",)): C.SESSION_EXPIRED,  # a session that never started at 0
        ((77, 1), (b"other",)): C.SEQUENCE_MISMATCH,  # not what sequence 1 stored
    }
    for (ident, bodies), code in refused.items():
        with pytest.raises(SessionError) as e:
            ray.get(h.append.remote(list(bodies), g.name, None, ident))
        assert e.value.code == code, e.value
    assert g.status()[leader].ledger_end_index == end  # nothing appended
    c = g.client(idempotent=True)
    r = c.append_batch([b"x", b"y"])
    got = c.read(first, r[-1].index + 1)
    assert [e.body for e in got if e.body] == [b"a", b"bb", b"x", b"y"]  # prefixes stripped
    assert all(e.channel == 0 for e in got)


def test_an_unknown_outcome_is_retried_into_one_copy(make_group):
    """The round of an append is stored but never sent on: a plain client gets an unknown
    outcome; an idempotent one retries, and the leader answers from its log once the
    entry commits -- sent on again as a round of its own, no other append needed."""

    def _fail_the_next_send(self) -> None:
        appends = self.appends

        def fail_once(*args):
            del appends._announce_plain
            raise ray.exceptions.ObjectStoreFullError("injected: ray.put of the batch failed")

        appends._announce_plain = fail_once

    g = make_group(members=3)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30, idempotent=True)
    before = c.append(b"before")
    ray.get(g.handle(leader).__ray_call__.remote(_fail_the_next_send))
    t0 = time.monotonic()
    r = c.append(b"once")
    assert time.monotonic() - t0 < 10, "answered by the retry, not at the deadline"
    assert r.index == before.index + 1 and c.get(r.index).body == b"once"
    after = c.append(b"after")
    bodies = [e.body for e in c.read(before.index, after.index + 1)]
    assert bodies == [b"before", b"once", b"after"]


def test_a_leader_killed_under_idempotent_writers_loses_and_repeats_nothing(make_group):
    g = make_group(members=3)
    g.wait_for_leader()
    out = Outcomes()
    writers = [Writer(g.client(timeout_s=60, idempotent=True), f"w{k}", out, timeout_s=60)
               for k in range(4)]  # fmt: skip
    for w in writers:
        w.start()
    try:
        since = 0.0
        for leg in range(3):  # each leader is killed once the writers went on through it
            wait_until(lambda t=since: out.acks_since(t) >= 20, 60,
                       lambda n=leg: f"acks under leader {n + 1}: {out}")  # fmt: skip
            if leg < 2:
                g.kill(g.wait_for_leader(timeout_s=30))
                since = time.monotonic()
    finally:
        stop_writers(writers)
    assert out.counts()["acked"] >= 60, out
    assert not out.unknown and not out.failed, out
    check_history(g, out, g.client(timeout_s=60))


def test_a_refused_append_starts_a_new_session_for_what_follows(make_group):
    g = make_group(members=3)
    g.wait_for_leader()
    c = g.client(idempotent=True)
    c.append(b"one")
    old = c.client_id
    with pytest.raises(LedgerError) as e:
        c.append(b"x" * (5 << 20))  # too large: refused, its sequence a hole
    assert e.value.code == C.ENTRY_TOO_LARGE and not isinstance(e.value, OutcomeUnknownError)
    r = c.append(b"two")
    assert c.client_id != old and c.get(r.index).body == b"two"


def test_concurrent_callers_of_one_client_commit_every_append_once(make_group):
    g = make_group(members=3)
    g.wait_for_leader()
    c = g.client(idempotent=True)
    errors: list[Exception] = []

    def work(k: int) -> None:
        try:
            for i in range(30):
                c.append(f"{k}-{i}".encode())
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    bodies = [e.body for e in c.read(0, c.committed_index() + 1) if e.body]
    assert sorted(bodies) == sorted(f"{k}-{i}".encode() for k in range(8) for i in range(30))
