"""The client library on real Ray: coalescing, per-append results and errors, async appends."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import ray
from groupcheck import TEST_CONFIG, assert_consistent, wait_until
from rayledger.actors import LedgerClient, LedgerError, OutcomeUnknownError, ResponseCode
from rayledger.storage import StoreConfig

pytestmark = pytest.mark.ray


def test_threads_sharing_one_client_each_get_their_own_result(make_group):
    g = make_group()
    g.wait_for_leader()
    c = g.client()
    results: dict[bytes, object] = {}

    def worker(k: int) -> None:
        for i in range(25):
            body = f"t{k}-{i}".encode()
            results[body] = c.append(body)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 400
    indexes = [r.index for r in results.values()]
    assert len(set(indexes)) == 400, "two appends acknowledged at one index"
    acked = {r.index: body for body, r in results.items()}
    for index, body in list(acked.items())[:50]:
        assert c.get(index).body == body
    assert_consistent(g, acked)


def test_a_bad_append_in_a_coalesced_call_fails_alone(make_group):
    cfg = TEST_CONFIG.__class__(**{**TEST_CONFIG.__dict__, "store": StoreConfig(max_entry_size=64)})
    g = make_group(config=cfg)
    g.wait_for_leader()
    c = g.client()
    c.max_in_flight = 1  # everything queued behind the first call goes out as one call
    slow = c.append_future([b"first"])
    futs = [c.append_future([f"ok{i}".encode()]) for i in range(5)]
    bad = c.append_future([b"x" * 100])  # too large: refused by the leader for the batch
    futs += [c.append_future([f"ok{i}".encode()]) for i in range(5, 10)]
    slow.result(timeout=30)
    with pytest.raises(LedgerError) as err:
        bad.result(timeout=30)
    assert err.value.code == ResponseCode.ENTRY_TOO_LARGE
    acked = {}
    for k, f in enumerate(futs):
        (r,) = f.result(timeout=30)
        acked[r.index] = f"ok{k}".encode()
    assert_consistent(g, acked)
    # bad input never reaches the leader at all
    for bad_input, code in (
        ("text", ResponseCode.UNEXPECTED_ARGUMENT),
        ([], ResponseCode.REQUEST_WITH_EMPTY_BODYS),
        ([b"ok", 3], ResponseCode.UNEXPECTED_ARGUMENT),
    ):
        with pytest.raises(LedgerError) as err:
            c.append_batch(bad_input)
        assert err.value.code == code


def test_append_async_from_a_coroutine_and_from_a_ray_actor(make_group):
    g = make_group()
    g.wait_for_leader()
    c = g.client()

    async def many() -> list:
        return await asyncio.gather(*(c.append_async(f"a{i}".encode()) for i in range(200)))

    rs = asyncio.run(many())
    assert len({r.index for r in rs}) == 200
    with pytest.raises(LedgerError) as err:
        asyncio.run(c.append_async("not bytes"))  # type: ignore[arg-type]
    assert err.value.code == ResponseCode.UNEXPECTED_ARGUMENT

    @ray.remote(num_cpus=0)
    class Producer:
        async def produce(self, group: str, n: int) -> list[int]:
            client = LedgerClient.connect(group)
            out = await asyncio.gather(*(client.append_async(b"p%d" % i) for i in range(n)))
            return [r.index for r in out]

    p = Producer.remote()
    try:
        idx = ray.get(p.produce.remote(g.name, 50), timeout=60)
    finally:
        ray.kill(p)
    assert len(set(idx)) == 50 and not set(idx) & {r.index for r in rs}


def test_coalesced_appends_in_flight_when_the_leader_dies_are_unknown_never_retried(make_group):
    g = make_group()
    leader = g.wait_for_leader()
    c = g.client(timeout_s=20, idempotent=False)  # a plain client's outcomes
    c.append(b"before")
    acked, unknown, errors = {}, [], []
    stop = threading.Event()

    def worker(k: int) -> None:
        i = 0
        while not stop.is_set():
            body = f"w{k}-{i}".encode()
            i += 1
            try:
                acked[c.append(body).index] = body
            except OutcomeUnknownError:
                unknown.append(body)
            except LedgerError as exc:
                errors.append(exc)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    wait_until(lambda: len(acked) >= 20, 30, "acks before the kill")
    g.kill(leader)
    g.wait_for_leader(timeout_s=30)
    after = len(acked)
    wait_until(lambda: len(acked) >= after + 20, 60, "acks from the new leader")
    stop.set()
    for t in ts:
        t.join(timeout=60)
    assert acked, "nothing was acknowledged"
    assert_consistent(g, acked, wait_s=40)
    # every body is acknowledged at most once (an unknown outcome is never retried) and
    # none both acknowledged and reported unknown
    assert len(set(acked.values())) == len(acked)
    assert not set(unknown) & set(acked.values())
    assert all(e.code == ResponseCode.TIMEOUT for e in errors), errors[:3]


def test_no_leader_times_out_without_storing(make_group):
    g = make_group()
    g.wait_for_leader()
    # a client of a group that does not run (its member list cannot be looked up again)
    c = LedgerClient(g.name + "-gone", ["nobody-here"], timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(LedgerError) as err:
        c.append(b"x")
    assert err.value.code == ResponseCode.TIMEOUT
    assert time.monotonic() - t0 < 10


def test_an_append_sent_directly_to_a_stale_leader_follows_the_hint(make_group):
    """The first append after a failover goes straight to the old leader (no sender thread
    behind it); refused with NOT_LEADER it must be sent again, not wait for its deadline."""
    g = make_group(store=False)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=20)
    c.append(b"warm")
    deadline = time.monotonic() + 10
    while c._sender is not None and c._sender.is_alive():  # the idle sender thread exits
        assert time.monotonic() < deadline
        time.sleep(0.1)
    c._leader = next(m for m in g.members if m != leader)  # what a failover leaves behind
    t0 = time.monotonic()
    r = c.append(b"x", timeout_s=15)
    assert time.monotonic() - t0 < 5 and c.get(r.index).body == b"x"
