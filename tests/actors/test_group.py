"""End-to-end tests of a group on real Ray: elections, failover, partitions, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import ray
from groupcheck import (
    TEST_CONFIG,
    Outcomes,
    Writer,
    append_acked,
    assert_consistent,
    check_history,
    committed_log,
    stop_writers,
    wait_until,
)
from rayledger.actors import LedgerClient, LedgerError, LedgerGroup, ResponseCode
from rayledger.election import Role

pytestmark = pytest.mark.ray


def test_elect_append_and_read_back_everywhere(make_group):
    g = make_group()
    leader = g.wait_for_leader(timeout_s=30)
    assert leader in g.members
    c = g.client()
    acked = {}
    for i in range(20):
        r = c.append(f"e{i}".encode())
        acked[r.index] = f"e{i}".encode()
        assert c.get(r.index).body == f"e{i}".encode()
    rs = c.append_batch([b"b0", b"b1", b"b2"])
    assert [r.index for r in rs] == list(range(rs[0].index, rs[0].index + 3))
    acked.update({r.index: b for r, b in zip(rs, [b"b0", b"b1", b"b2"], strict=True)})
    assert c.committed_index() >= rs[-1].index
    got = c.read(rs[0].index, rs[-1].index + 1)
    assert [e.body for e in got] == [b"b0", b"b1", b"b2"]
    assert_consistent(g, acked)
    st = g.status()
    assert sum(s.role == Role.LEADER for s in st.values()) == 1


def test_leader_killed_mid_stream_loses_nothing(make_group):
    g = make_group()
    old = g.wait_for_leader()
    out = Outcomes()
    w = Writer(g.client(), "k", out, timeout_s=20)
    w.start()
    try:
        wait_until(lambda: len(out.acked) >= 20, 30, "appends before the kill")
        old_pid = ray.get(g.handle(old).info.remote())["pid"]
        g.kill(old)

        def restarted() -> bool:
            try:
                return ray.get(g.handle(old).info.remote(), timeout=5)["pid"] != old_pid
            except (ray.exceptions.RayError, TimeoutError):
                return False

        # Ray restarts the member from disk (a new process); a leader serves again, possibly
        # the restarted member itself, re-elected in a newer term (its log is complete)
        wait_until(restarted, 60, "the killed member to come back")
        g.wait_for_leader(timeout_s=30)
        before = len(out.acked)
        wait_until(lambda: len(out.acked) >= before + 20, 30, "writes under the new leader")
    finally:
        stop_writers([w])
    # the killed member restarts from disk and must hold every acknowledged append too
    check_history(g, out, g.client())


@pytest.mark.chaos  # long run; in CI: test_chaos kills followers too
def test_follower_killed_restarts_and_catches_up(make_group):
    g = make_group()
    leader = g.wait_for_leader()
    follower = next(m for m in g.members if m != leader)
    c = g.client()
    out = Outcomes()  # leadership may move on a loaded machine: an outcome may be unknown
    for i in range(10):
        out.append(c, b"a%d" % i)
    g.kill(follower)
    for i in range(30):
        out.append(c, b"b%d" % i)
    assert len(out.acked) >= 20, out
    check_history(g, out, c)
    assert wait_until(lambda: g.status()[follower].alive, 30, "the follower to restart")


def test_minority_leader_cannot_commit_and_is_truncated_after_heal(make_group):
    g = make_group()
    old = g.wait_for_leader()
    others = [m for m in g.members if m != old]
    c = g.client()
    out = Outcomes()
    assert out.append(c, b"before") is not None, out
    g.partition({old}, set(others))
    # the isolated leader takes the append into its log but cannot commit it
    stuck = LedgerClient(g.name, [old], timeout_s=5, discover=False)
    assert out.append(stuck, b"never-committed", timeout_s=5) is None, "a minority committed"
    new = g.wait_for_leader(timeout_s=30, exclude=old)
    assert new in others
    c2 = LedgerClient(g.name, others)
    for i in range(5):
        out.append(c2, f"maj{i}".encode())
    assert len(out.acked) >= 3, out  # the majority commits (an outcome may be unknown)
    g.heal()
    bodies = check_history(g, out, c2, wait_s=30)

    def old_follows_and_caught_up() -> bool:
        st = g.status()[old]
        return st.role == Role.FOLLOWER and st.committed_index >= max(out.acked)

    wait_until(old_follows_and_caught_up, 30, f"{old} to follow and catch up")
    assert b"never-committed" not in bodies
    assert b"never-committed" not in [b for _i, _t, b in committed_log(g, old)]


def test_leadership_transfer_moves_the_leader(make_group):
    g = make_group()
    leader = g.wait_for_leader()
    c = g.client()
    c.append(b"x")
    target = next(m for m in g.members if m != leader)
    assert g.transfer_leadership(target) == target
    r = c.append(b"after-transfer")
    assert c.get(r.index).body == b"after-transfer"


def test_a_transfer_answers_with_its_outcome(make_group):
    """The leader answers a transfer request when the transfer has ended, with how it
    ended: a target it cannot reach fails it (no polling by the caller)."""
    g = make_group()
    leader = g.wait_for_leader()
    target = next(m for m in g.members if m != leader)
    g.partition({target}, set(g.members) - {target})
    try:
        t0 = time.monotonic()
        with pytest.raises(LedgerError) as e:
            ray.get(g.handle(leader).transfer_leadership.remote(target), timeout=30)
        assert e.value.code in (ResponseCode.TAKE_LEADERSHIP_FAILED, ResponseCode.TIMEOUT), e.value
        assert time.monotonic() - t0 < 10
        assert g.leader_id() in (leader, None)  # it kept leading (or an election runs)
    finally:
        g.heal()


@pytest.mark.chaos  # 16 s: the CI budget (five voters losing two run in the simulation too)
def test_five_members_survive_two_failures(make_group):
    g = make_group(members=5)
    leader = g.wait_for_leader()
    victims = [m for m in g.members if m != leader][:2]
    g.partition(set(victims), set(m for m in g.members if m not in victims))
    c = g.client()
    out = Outcomes()
    for i in range(10):
        out.append(c, f"f{i}".encode())
    assert len(out.acked) >= 5, out  # three of five commit (an outcome may be unknown)
    g.heal()
    check_history(g, out, c)


def test_memory_group_and_second_driver(make_group):
    g = make_group(store=False)
    g.wait_for_leader()
    r = g.client().append(b"from-driver-1")
    address = ray.get_runtime_context().gcs_address
    script = textwrap.dedent(
        f"""
        import ray
        from rayledger.actors import LedgerClient
        ray.init(address={address!r}, namespace="rayledger", log_to_driver=False)
        c = LedgerClient.connect({g.name!r})
        assert c.get({r.index}).body == b"from-driver-1"
        r2 = c.append(b"from-driver-2")
        print("INDEX", r2.index)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    index = int(out.stdout.split("INDEX")[1].split()[0])
    assert g.client().get(index).body == b"from-driver-2"
    attached = LedgerGroup.get(g.name)
    assert attached.members == g.members


def test_bad_inputs_get_their_codes_and_lose_nothing(make_group, tmp_path):
    g = make_group()
    leader = g.wait_for_leader()
    c = g.client()
    r = c.append(b"keep")

    def code_of(fn):
        with pytest.raises(LedgerError) as info:
            fn()
        return info.value.code

    assert code_of(lambda: c.append("text")) == ResponseCode.UNEXPECTED_ARGUMENT
    assert code_of(lambda: c.append_batch(b"raw")) == ResponseCode.UNEXPECTED_ARGUMENT
    assert code_of(lambda: c.append_batch([b"ok", 3])) == ResponseCode.UNEXPECTED_ARGUMENT
    assert code_of(lambda: c.append_batch([])) == ResponseCode.REQUEST_WITH_EMPTY_BODYS
    big = b"x" * (g.config.store.max_entry_size + 1)
    assert code_of(lambda: c.append(big)) == ResponseCode.ENTRY_TOO_LARGE
    assert code_of(lambda: c.get(10**9)) == ResponseCode.INDEX_OUT_OF_BOUNDS
    assert code_of(lambda: c.get("1")) == ResponseCode.UNEXPECTED_ARGUMENT
    leader = g.wait_for_leader()
    follower = next(m for m in g.members if m != leader)
    fh = g.handle(follower)
    with pytest.raises(LedgerError) as info:
        ray.get(fh.append.remote([b"x"], g.name, follower))
    assert info.value.code == ResponseCode.NOT_LEADER
    assert info.value.leader_id in g.members and info.value.leader_id != follower
    lh = g.handle(leader)
    with pytest.raises(LedgerError) as info:
        ray.get(lh.append.remote([b"x"], "other-group", leader))
    assert info.value.code == ResponseCode.UNKNOWN_GROUP
    with pytest.raises(LedgerError) as info:
        ray.get(lh.append.remote([b"x"], g.name, "nobody"))
    assert info.value.code == ResponseCode.UNKNOWN_MEMBER
    assert code_of(lambda: LedgerClient.connect("no-such-group")) == ResponseCode.UNKNOWN_GROUP
    assert code_of(lambda: LedgerGroup.get("no-such-group")) == ResponseCode.UNKNOWN_GROUP
    assert code_of(lambda: g.handle("nobody")) == ResponseCode.UNKNOWN_MEMBER
    assert code_of(lambda: LedgerGroup.create(g.name, 3)) == ResponseCode.UNEXPECTED_ARGUMENT
    assert code_of(lambda: LedgerGroup.create("x-" + g.name, 0)) == ResponseCode.UNEXPECTED_ARGUMENT
    assert (
        code_of(lambda: LedgerGroup.create("x-" + g.name, ["a", "a"]))
        == ResponseCode.UNEXPECTED_ARGUMENT
    )
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    if os.geteuid() != 0:  # root can write anywhere
        assert (
            code_of(lambda: LedgerGroup.create("x-" + g.name, 3, store_dir=str(ro)))
            == ResponseCode.DISK_ERROR
        )
    assert (
        code_of(lambda: LedgerGroup.create("x-" + g.name, 3, store_dir="/proc/nope"))
        == ResponseCode.DISK_ERROR
    )
    # nothing was lost and the group still works
    assert c.get(r.index).body == b"keep"
    r2 = c.append(b"still-works")
    assert c.get(r2.index).body == b"still-works"


@pytest.mark.chaos  # long run; in CI: test_chaos cuts and slows links too
def test_lossy_slow_links_and_one_way_cut_keep_the_log_safe(make_group):
    g = make_group(store=False)
    g.wait_for_leader()
    c = g.client()
    out = Outcomes()
    g.set_link_faults(drop=0.1, delay_ms=5)
    for i in range(15):
        out.append(c, f"lossy{i}".encode(), timeout_s=30)
    leader = g.wait_for_leader()
    # the leader can no longer reach the others, but still hears them
    g.partition({leader}, set(g.members) - {leader}, one_way=True)
    for i in range(5):
        out.append(c, f"oneway{i}".encode(), timeout_s=30)
    g.heal()
    g.wait_for_leader(timeout_s=30)
    tries = iter(range(1000))  # a distinct body each try: an unknown one may also commit
    wait_until(
        lambda: out.append(c, b"healed%d" % next(tries), timeout_s=30) is not None,
        90,
        "an ack after heal",
    )
    assert len(out.acked) >= 10, out
    check_history(g, out, c, wait_s=30)


@pytest.mark.chaos  # long run; in CI: test_leader_killed_mid_stream_loses_nothing kills a leader
def test_a_sync_flush_group_replicates_and_survives_a_leader_kill(make_group):
    """``sync_flush`` set on the group's store works for every member."""
    from dataclasses import replace

    from rayledger.storage import StoreConfig

    config = replace(TEST_CONFIG, store=StoreConfig(sync_flush=True))
    g = make_group(members=3, config=config)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30)
    acked = {r.index: b"s%d" % i for i, r in enumerate(c.append(b"s%d" % i) for i in range(20))}
    rs = c.append_batch([b"b%d" % i for i in range(50)])
    acked.update({r.index: b"b%d" % i for i, r in enumerate(rs)})
    g.kill(leader)
    # the restarted member may lead again (in a newer term): any leader, then more appends
    g.wait_for_leader(timeout_s=60)
    r, body = append_acked(c, b"after")
    acked[r.index] = body
    assert_consistent(g, acked, wait_s=60)
