"""Read consistencies on a real group: linearizable, lease and follower reads."""

from __future__ import annotations

import threading
import time

import pytest
import ray
from groupcheck import append_acked, wait_until
from rayledger.actors import LedgerConfig
from rayledger.storage import LedgerError, ResponseCode

pytestmark = pytest.mark.ray


def _other(group, leader):
    return [m for m in group.members if m != leader]


def test_every_consistency_reads_an_acknowledged_append(make_group):
    g = make_group(store=False)
    g.wait_for_leader()
    c = g.client(timeout_s=20)
    r = c.append(b"x")
    for consistency in ("linearizable", "lease", "committed"):
        assert c.get(r.index, consistency=consistency).body == b"x"
        assert c.committed_index(consistency=consistency) >= r.index
        assert [e.body for e in c.read(r.index, r.index + 1, consistency=consistency)] == [b"x"]
    with pytest.raises(LedgerError) as e:
        c.get(r.index, consistency="strong")
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    with pytest.raises(LedgerError) as e:
        c.get(r.index, member="nope")
    assert e.value.code == ResponseCode.UNKNOWN_MEMBER


def test_a_partitioned_old_leader_never_answers_a_linearizable_read(make_group):
    """The old leader, cut off, still believes it leads for a while and its committed index
    is stale; a committed-consistency read there shows the stale prefix (the check can fail),
    a linearizable one refuses.  A lease taken before the cut lets it answer lease reads with
    no round, but only until the lease ends, and no other leader exists before then; once
    one does, the old leader refuses them too, and after the heal it answers them with the
    new leader's writes."""
    # a clock drift bound of 50 % ends the lease well before the old leader gives up its
    # term (a heartbeat timeout after its last answered heartbeat): in between it still
    # leads and must refuse lease reads because the lease, not the leadership, has ended
    config = LedgerConfig.fast(
        heartbeat_interval_ms=150, max_heartbeat_leak=14, max_clock_drift=0.5
    )
    lease_s = config.lease_ms() / 1000
    g = make_group(store=False, config=config)
    old = g.wait_for_leader()
    c = g.client(timeout_s=20)
    c.append(b"before")
    h = g.handle(old)
    # take the lease: a lease read's confirmation round, sent after leased_at
    leased_at = time.monotonic()
    leased = ray.get(h.committed_index.remote(consistency="lease"), timeout=30)
    lease_end = time.monotonic() + lease_s  # the round was sent before this returned
    g.partition({old}, set(_other(g, old)))

    served: list[tuple[float, int]] = []  # (sent at, answer) of lease reads answered
    refused: list[ResponseCode] = []
    stop = threading.Event()

    def poll_lease_reads():  # no round can be confirmed across the cut: only the lease serves
        while not stop.is_set():
            sent = time.monotonic()
            try:
                served.append((sent, ray.get(h.committed_index.remote(consistency="lease"))))
            except LedgerError as exc:
                refused.append(exc.code)
            time.sleep(0.005)

    poller = threading.Thread(target=poll_lease_reads, daemon=True)
    poller.start()
    try:
        new = g.wait_for_leader(timeout_s=30, exclude=old)
        # the lease's premise: the quorum that confirmed the round refuses pre-votes for a
        # heartbeat timeout after it, longer than the lease
        assert time.monotonic() - leased_at > lease_s, "a new leader inside the old one's lease"
        acked, _ = append_acked(c, b"after")  # committed by the majority side
    finally:
        stop.set()
        poller.join(timeout=30)
    assert not poller.is_alive()
    assert served, f"no lease read answered inside the lease (refused: {refused})"
    assert {v for _, v in served} == {leased}, served  # from the lease, at the stale index
    late = [(round(t - lease_end, 3), v) for t, v in served if t >= lease_end]
    assert not late, f"{len(late)} lease reads answered after the lease ended: {late[:5]}"
    assert set(refused) <= {ResponseCode.TIMEOUT, ResponseCode.NOT_LEADER}, refused
    stale = ray.get(h.committed_index.remote(consistency="committed"))
    assert stale == leased < acked.index, "the old leader already knew the new commit"
    for consistency in ("linearizable", "lease"):
        with pytest.raises(LedgerError) as e:
            ray.get(h.get.remote(acked.index, consistency=consistency), timeout=30)
        assert e.value.code in (ResponseCode.TIMEOUT, ResponseCode.NOT_LEADER)
        with pytest.raises(LedgerError) as e:
            ray.get(h.committed_index.remote(consistency=consistency), timeout=30)
        assert e.value.code in (ResponseCode.TIMEOUT, ResponseCode.NOT_LEADER)
    # a client finds the new leader and reads the acknowledged entry
    assert c.get(acked.index).body == b"after"
    assert g.leader_id() == new  # the cut-off member cannot have taken it back
    g.heal()

    # healed, the old leader follows: a lease read there asks the leader for a read index
    # and so answers with the new leader's write, never with its own stale prefix
    def lease_read_on_old():
        try:
            return ray.get(h.get.remote(acked.index, consistency="lease"), timeout=30)
        except LedgerError as exc:
            assert exc.code in (ResponseCode.NOT_LEADER, ResponseCode.TIMEOUT), exc
            return None

    assert wait_until(lease_read_on_old, 30, f"{old} to follow {new} again").body == b"after"


def test_a_lagging_follower_waits_for_the_read_index_instead_of_refusing(make_group):
    g = make_group(store=False)
    leader = g.wait_for_leader()
    lagging, other = _other(g, leader)
    c = g.client(timeout_s=20)
    c.append(b"warm")
    g.partition({leader}, {lagging}, one_way=True)  # the leader's pushes do not reach it
    acked = c.append(b"late")
    h = g.handle(lagging)
    assert ray.get(h.committed_index.remote(consistency="committed")) < acked.index
    # a committed read there is pointed at the leader (which it may have stopped hearing
    # from: then without a hint), never refused with INDEX_OUT_OF_BOUNDS
    with pytest.raises(LedgerError) as e:
        ray.get(h.get.remote(acked.index, consistency="committed"))
    assert e.value.code == ResponseCode.NOT_LEADER and e.value.leader_id in (leader, None)
    threading.Timer(0.2, g.heal).start()
    t0 = time.monotonic()
    while True:  # it waits for the heal, or (cut off so long it lost its leader) redirects
        try:
            entry = ray.get(h.get.remote(acked.index, consistency="linearizable"), timeout=30)
            break
        except LedgerError as exc:
            assert exc.code == ResponseCode.NOT_LEADER and time.monotonic() - t0 < 30, exc
            time.sleep(0.1)
    assert entry.body == b"late" and time.monotonic() - t0 >= 0.15  # never before the heal
    # through the client, from any member
    for m in g.members:
        assert c.get(acked.index, member=m).body == b"late"
    assert c.committed_index(member="any") >= acked.index


def test_follower_reads_spread_over_members_and_see_every_ack(make_group):
    g = make_group(store=False)
    g.wait_for_leader()
    c = g.client(timeout_s=20)
    for i in range(20):
        r = c.append(b"%d" % i)
        assert c.get(r.index, member="any").body == b"%d" % i  # read-your-writes anywhere
