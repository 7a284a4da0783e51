"""The state-machine API: the Ray-free Applier, the KV example machine, and a
real group running it on every member."""

from __future__ import annotations

import dataclasses
import time

import pytest
import ray
from groupcheck import TEST_CONFIG
from machinecheck import apply
from rayledger.actors import LedgerConfig
from rayledger.actors.machine import Applier, MachineContext, StateMachine, load_machine
from rayledger.integration.kv import KvMachine, delete_command, set_command
from rayledger.storage import Entry, LedgerError, ResponseCode

KV = "rayledger.integration.kv:KvMachine"


class Recorder(StateMachine):
    def __init__(self, start: int = -1):
        self.start, self.seen, self.roles = start, [], []

    def open(self, ctx):
        return self.start

    def apply(self, entries):
        self.seen += [e.index for e in entries]

    def on_role_change(self, role, term):
        self.roles.append((role, term))


def entries(a: int, b: int) -> list[Entry]:
    return [Entry(i, 1, i * 10, b"x") for i in range(a, b)]


def ctx(tmp_path=None) -> MachineContext:
    return MachineContext("g", "n0", str(tmp_path) if tmp_path else None, {})


def test_applier_feeds_committed_entries_in_order_from_where_the_machine_stands():
    m = Recorder(start=4)
    a = Applier(m, ctx(), max_batch=3)
    assert a.core.due(4) is None
    assert a.core.due(10) == (5, 8)  # at most max_batch
    apply(a, entries(5, 8))
    assert a.core.due(10) == (8, 11)
    with pytest.raises(LedgerError) as e:
        apply(a, entries(9, 10))  # a gap: never skip
    assert e.value.code == ResponseCode.INCONSISTENT_STATE
    apply(a, entries(8, 11))
    assert m.seen == list(range(5, 11)) and a.core.due(10) is None


@pytest.mark.parametrize("path", ["nope", "no.such.module:X", "json:nothing", 3])
def test_a_bad_machine_path_is_refused(path):
    with pytest.raises(LedgerError) as e:
        load_machine(path)
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


@pytest.mark.parametrize("path", ["nope", 3, "a:b:c"])
def test_a_config_with_a_malformed_machine_path_is_refused(path):
    with pytest.raises(LedgerError) as e:
        LedgerConfig(state_machine=path)
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_kv_machine_stamps_revisions_and_restarts_from_its_snapshot(tmp_path):
    kv = KvMachine()
    assert kv.open(ctx(tmp_path)) == -1
    body = bytearray(set_command("a", {"n": 1}))
    kv.pre_append(7, 700, body)
    assert len(body) == len(set_command("a", {"n": 1}))  # same length, in place
    kv.apply([Entry(6, 1, 0, b""), Entry(7, 1, 700, bytes(body)), Entry(8, 1, 0, b"junk")])
    assert kv.query({"get": "a"}) == [{"n": 1}, 7]
    assert not list(tmp_path.iterdir())  # applying writes nothing: its snapshots are its state
    kv.snapshot()(str(tmp_path))
    again = KvMachine()
    assert again.open(ctx(tmp_path)) == -1
    again.load_snapshot(str(tmp_path), 8)  # the member replays only what came after
    assert again.query({"get": "a"}) == [{"n": 1}, 7] and again.applied == 8
    with pytest.raises(LedgerError):
        again.query("what")


def test_a_kv_snapshot_cut_after_configuration_entries_loads_at_their_index(tmp_path):
    """A cut right after a configuration entry is at that entry's index, which the machine
    never applied: its snapshot loads there; one holding a later state never does."""
    kv = KvMachine()
    kv.apply([Entry(3, 1, 30, set_command("a", 1))])
    kv.snapshot()(str(tmp_path))  # the runner cuts at 5: entries 4 and 5 were the group's
    again = KvMachine()
    again.load_snapshot(str(tmp_path), 5)
    assert again.applied == 3 and again.query({"get": "a"})[0] == 1  # as a replay leaves it
    with pytest.raises(LedgerError) as e:
        KvMachine().load_snapshot(str(tmp_path), 2)
    assert e.value.code == ResponseCode.INCONSISTENT_STATE


@pytest.mark.ray
def test_a_group_runs_the_machine_on_every_member(make_group):
    config = dataclasses.replace(TEST_CONFIG, state_machine=KV)
    g = make_group(members=3, config=config)
    leader = g.wait_for_leader()
    c = g.client(timeout_s=30)
    r = c.append(set_command("color", "red"))
    c.append_batch([set_command("size", 3), set_command("color", "blue")])
    last = c.append(delete_command("size"))
    assert c.query({"get": "color"})[0] == "blue"
    for m in g.members:  # every member applied the same, with the leader's stamped revision
        assert c.query({"keys": True}, member=m) == ["color"]
        value, rev = c.query({"get": "color"}, member=m)
        assert value == "blue" and r.index < rev < last.index
    # a follower restarted from disk replays only what it had not applied, then catches up
    follower = next(m for m in g.members if m != leader)
    g.kill(follower)
    after = c.append(set_command("after", True))
    h = g.handle(follower)
    deadline = time.monotonic() + 60
    while True:  # asked of the restarted member itself
        try:
            got = ray.get(h.query.remote({"get": "after"}, "linearizable"), timeout=30)
            if got == [True, after.index]:
                break
        except (LedgerError, ray.exceptions.RayError):
            pass
        assert time.monotonic() < deadline, "the restarted member did not catch up"
        time.sleep(0.2)


@pytest.mark.ray
def test_a_group_without_a_machine_answers_no_queries(make_group):
    g = make_group(members=1, store=False)
    g.wait_for_leader()
    with pytest.raises(LedgerError) as e:
        g.client(timeout_s=10).query({"get": "x"})
    assert e.value.code == ResponseCode.UNSUPPORTED


@pytest.mark.ray
def test_every_member_snapshots_its_machine_and_keeps_the_newest(make_group):
    """Every ``snapshot_every_entries`` applied entries each member writes a checksummed
    snapshot of its KV machine off the machine's thread and keeps the newest
    ``snapshot_keep``."""
    from rayledger.actors.core.snapshot_policy import SnapshotPolicy
    from rayledger.integration.kv.machine import read_snapshot
    from rayledger.storage.snapshots import SnapshotStore

    config = dataclasses.replace(
        TEST_CONFIG, state_machine=KV, snapshot_every_entries=20, snapshot_keep=2
    )
    g = make_group(members=3, config=config)
    g.wait_for_leader()
    c = g.client(timeout_s=30)
    for k in range(10):
        c.append_batch([set_command(f"k{k}-{j}", j) for j in range(10)])
    last = c.append(set_command("last", True))
    deadline = time.monotonic() + 60
    for m in g.members:
        snaps = SnapshotStore(f"{ray.get(g.handle(m).store_dir.remote())}/snapshots", owner=False)
        while True:
            have = snaps.list()
            if have and have[-1].index >= last.index - 20 and len(have) <= 2:
                break
            assert time.monotonic() < deadline, (m, [s.index for s in have])
            time.sleep(0.2)
        newest = SnapshotPolicy.start_from(have, snaps.verify)
        assert newest is have[-1]  # whole
        data, applied, _cas = read_snapshot(f"{newest.path}/kv.arrow")
        assert applied == newest.index and "k0-0" in data
