"""An append stored on the leader but not sent on: the caller gets an
unknown outcome at once, never a raw Ray error that invites a duplicating retry, and
the stored entry may still commit."""

from __future__ import annotations

import time

import pytest
import ray
from rayledger.storage import OutcomeUnknownError, ResponseCode

pytestmark = pytest.mark.ray


def test_a_round_stored_but_not_sent_on_is_an_unknown_outcome(make_group):
    def _fail_the_next_send(self) -> None:
        """Runs inside the leader: the next round, already in the store, fails before it is
        sent on, as when ``ray.put`` of its batch raises (nested: pickled by value)."""
        appends = self.appends

        def fail_once(*args):
            del appends._announce_plain  # the class's again
            raise ray.exceptions.ObjectStoreFullError("injected: ray.put of the batch failed")

        appends._announce_plain = fail_once

    g = make_group(members=3)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30, idempotent=False)  # a plain client: the outcome is its own
    first = c.append(b"before")
    ray.get(g.handle(leader).__ray_call__.remote(_fail_the_next_send))
    t0 = time.monotonic()
    with pytest.raises(OutcomeUnknownError) as e:
        c.append(b"unknown")
    assert time.monotonic() - t0 < 10, "answered at once, not at the client's timeout"
    assert e.value.code in (ResponseCode.APPEND_OUTCOME_UNKNOWN, ResponseCode.INTERNAL_ERROR)
    assert "stored" in e.value.message and "outcome is unknown" in e.value.message
    # the group goes on, and the stored entry commits with the next round
    after = c.append(b"after")
    assert after.index == first.index + 2
    bodies = [c.get(i).body for i in range(first.index, after.index + 1)]
    assert bodies == [b"before", b"unknown", b"after"]
