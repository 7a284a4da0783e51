"""An idempotent LedgerClient's retries, without Ray: a scripted member answers
each call in turn, and the client must send unknown outcomes again under the same
identity, number anew only what was never possibly stored, and never turn a possibly
stored append into a plain refusal."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import numpy as np
import pytest
from rayledger.actors.client import LedgerClient
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

C = ResponseCode


class Scripted:
    """A member whose calls get ``script``'s answers in order (an exception, or the first
    index of a success); every call's (bodies, identity) is kept, and whether the client
    said it may be stored already."""

    def __init__(self, script: list):
        self.script, self.calls, self.maybe = list(script), [], []
        self.append = self

    def remote(self, bodies, group, target, ident=None, maybe_stored=True):
        self.calls.append((list(bodies), ident))
        self.maybe.append(maybe_stored)
        f: concurrent.futures.Future = concurrent.futures.Future()
        what = self.script.pop(0)
        if isinstance(what, BaseException):
            f.set_exception(what)
        else:
            pos = np.arange(what, what + len(bodies), dtype=np.int64) * 100
            f.set_result((what, 1, pos.tobytes()))
        return SimpleNamespace(future=lambda: f)


class Client(LedgerClient):
    def __init__(self, member: Scripted, timeout_s: float = 5.0):
        super().__init__("g", ["n0"], timeout_s)
        self.member, self._leader = member, "n0"

    def _handle(self, name: str) -> Scripted:
        return self.member

    def _find_leader(self, timeout_s: float = 1.0) -> str:
        return "n0"


def unknown() -> OutcomeUnknownError:
    return OutcomeUnknownError(C.TERM_CHANGED, "the term ended")


def test_an_unknown_outcome_is_sent_again_under_its_identity():
    m = Scripted([unknown(), RuntimeError("the actor died"), 7, 9])
    c = Client(m)
    r = c.append_batch([b"a", b"b"])
    assert [x.index for x in r] == [7, 8]
    assert [ident for _, ident in m.calls] == [(c.client_id, 0)] * 3
    assert m.maybe == [False, True, True]  # a first call cannot be stored already
    assert c.retried == 4 and c.append(b"c") is not None
    assert m.calls[-1][1] == (c.client_id, 2)  # the next entry, in sequence


def test_a_retry_refused_for_good_is_still_an_unknown_outcome():
    for refusal in (LedgerError.of(C.SESSION_EXPIRED, "gone"),
                    LedgerError.of(C.ENTRY_TOO_LARGE, "big")):  # fmt: skip
        c = Client(Scripted([unknown(), refusal]))
        with pytest.raises(OutcomeUnknownError) as e:
            c.append(b"x")
        assert e.value.code == refusal.code


def test_an_expired_session_takes_a_fresh_one_for_what_was_never_stored():
    m = Scripted([LedgerError.of(C.SESSION_EXPIRED, "gone"), 3])
    c = Client(m)
    old = c.client_id
    assert c.append(b"x").index == 3
    (_, first), (_, again) = m.calls
    assert first == (old, 0) and again == (c.client_id, 0) and c.client_id != old


def test_a_refusal_leaves_a_hole_so_what_follows_starts_a_new_session():
    m = Scripted([LedgerError.of(C.ENTRY_TOO_LARGE, "big"), 4])
    c = Client(m)
    old = c.client_id
    with pytest.raises(LedgerError) as e:
        c.append(b"too large")
    assert e.value.code == C.ENTRY_TOO_LARGE and not isinstance(e.value, OutcomeUnknownError)
    c.append(b"next")
    assert m.calls[-1][1] == (c.client_id, 0) and c.client_id != old


def test_a_plain_client_sends_no_identity_and_never_retries_the_unknown():
    m = Scripted([unknown()])
    c = Client(m)
    c.idempotent = False
    with pytest.raises(OutcomeUnknownError):
        c.append(b"x")
    assert m.calls == [([b"x"], None)]
