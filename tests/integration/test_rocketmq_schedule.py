"""Delay levels without Ray: the schedule core's decisions (schedule.py), the commit-log
machine's exactly-once rule for deliveries (the leader voids a duplicate, every member moves
the level on), the level offsets through checkpoints and snapshots, and the service's runner
driving a member in this process."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from machinecheck import apply
from rayledger.actors.core import machine as mcore
from rayledger.actors.machine import Applier, MachineContext
from rayledger.election import Role
from rayledger.integration.rocketmq.commitlog import CommitLogMachine
from rayledger.integration.rocketmq.message import (
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    decode,
    encode,
)
from rayledger.integration.rocketmq.schedule import (
    DEFAULT_DELAY_LEVELS,
    DELAY_OFFSET,
    SCHEDULE_TOPIC,
    Delivery,
    LevelOffsets,
    Skip,
    due_at,
    mark,
    parse_delay_levels,
    parse_mark,
    parse_skip,
    plan_level,
    real_message,
    skip_command,
)
from rayledger.integration.rocketmq.schedule_service import ScheduleRunner
from rayledger.storage import LedgerError, ResponseCode, StoreConfig, open_store

LEVELS = "1s 3s 10s"


def parked(level: int, body: bytes = b"x", store_ts: int = 1_000, topic: str = "T", q: int = 0,
           **props: str) -> Message:  # fmt: skip
    p = {"TAGS": "tg", "KEYS": "k1 k2", "custom": "v", **props,
         "REAL_TOPIC": topic, "REAL_QID": str(q), "DELAY": str(level)}  # fmt: skip
    return Message(SCHEDULE_TOPIC, body, queue_id=level - 1, properties=p,
                   store_timestamp=store_ts, born_timestamp=store_ts - 5)  # fmt: skip


# -- the core ------------------------------------------------------------------------------
def test_the_default_table_is_rocketmqs_and_bad_tables_are_coded_errors():
    delays = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert len(delays) == 18 and delays[:4] == (1000, 5000, 10000, 30000)
    assert delays[-1] == 2 * 3_600_000 and parse_delay_levels("250ms 1d") == (250, 86_400_000)
    for bad in ("", "1", "1x", "0s", "-1s", "1.5s", "1 s", None, 3, "1s " * 65):
        with pytest.raises(LedgerError) as err:
            parse_delay_levels(bad)
        assert err.value.code is ResponseCode.UNEXPECTED_ARGUMENT


def test_a_delivered_message_loses_the_parking_properties_and_keeps_the_rest():
    m = parked(2, b"body", topic="Real", q=3)
    real = real_message(m)
    assert (real.topic, real.queue_id, real.body, real.tags, real.keys) == (
        "Real", 3, b"body", "tg", "k1 k2"
    )  # fmt: skip
    assert real.properties == {"TAGS": "tg", "KEYS": "k1 k2", "custom": "v"}
    assert real.born_timestamp == m.born_timestamp and real.store_timestamp == 0
    for props in ({"REAL_TOPIC": "a/b"}, {"REAL_QID": "-1"}, {"REAL_TOPIC": SCHEDULE_TOPIC}):
        assert real_message(_with(props)) is None


def _with(props: dict) -> Message:
    m = parked(1)
    m.properties.update(props)
    return m


def test_marks_and_skip_commands_read_back_and_malformed_ones_are_none():
    assert parse_mark(mark(3, 17)) == (3, 17)
    for bad in ("", "3", "3:", ":1", "a:1", "3:-1", "3:1:2", "٣:1"):
        assert parse_mark(bad) is None
    assert parse_skip(skip_command(2, 5, 9)) == (2, 5, 9)
    body = skip_command(2, 5, 9)
    for bad in (body[:-3], body.replace(b"9", b"4"), body.replace(b"5", b'"5"'), b"other"):
        assert parse_skip(bad) is None


_parked = st.lists(
    st.tuples(st.integers(0, 50), st.booleans()),  # (store time step, deliverable)
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(_parked, st.integers(0, 40), st.integers(0, 2000), st.integers(1, 500),
       st.one_of(st.none(), st.integers(0, 60)))  # fmt: skip
def test_a_plan_delivers_the_due_prefix_in_order_and_wakes_at_the_next(
    steps, offset, now, delay, gone
):
    ts, msgs = 0, []
    for k, (step, ok) in enumerate(steps):
        ts += step
        m = parked(1, b"%d" % k, store_ts=ts)
        if not ok:
            m.properties["REAL_QID"] = "x"
        msgs.append((offset + k, m))
    plan = plan_level(1, delay, offset, msgs, now, gone)
    covered = []
    for p in plan.puts:
        if isinstance(p, Delivery):
            covered.append(p.offset)
            original = dict(msgs)[p.offset]
            assert due_at(original, delay) <= now, "delivered before its time"
            assert p.message.properties[DELAY_OFFSET] == mark(1, p.offset)
            assert p.message.topic == "T" and p.message.body == original.body
        else:
            assert isinstance(p, Skip)
            covered.extend(range(p.start, p.stop))
    assert covered == list(range(offset, plan.next_offset)), "a hole or a repeat"
    rest = [(k, m) for k, m in msgs if k >= plan.next_offset]
    if rest and rest[0][0] == plan.next_offset:  # stopped at a message not due yet
        assert plan.wake_at_ms == due_at(rest[0][1], delay) > now
    else:
        assert plan.wake_at_ms is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 8)), max_size=60))
def test_level_offsets_take_each_parked_message_once_and_in_order(attempts):
    levels = LevelOffsets()
    taken: dict[int, list[int]] = {}
    for level, offset in attempts:  # retries, duplicates, reorders
        if levels.deliver(level, offset):
            taken.setdefault(level, []).append(offset)
    for level, offsets in taken.items():
        assert offsets == list(range(len(offsets))) and levels.get(level) == len(offsets)
    assert LevelOffsets.from_json(levels.snapshot()).offsets == levels.offsets


# -- the machine -----------------------------------------------------------------------------
class Member:
    """A store plus a commit-log machine with a short delay table, wired as a member wires
    them (as test_rocketmq_commitlog's)."""

    def __init__(self, path):
        self.store = open_store(StoreConfig(data_dir=str(path)))
        self.machine = CommitLogMachine()
        args = {"checkpoint_interval_ms": 0, "delay_levels": LEVELS}
        self.applier = Applier(self.machine, MachineContext("g", "n0", str(path), args, self.store))
        self.store.add_append_hook(self.machine.pre_append)

    def lead(self) -> None:
        self.machine.on_role_change(Role.LEADER, 1)
        self.commit()
        assert self.machine.ready_to_lead()

    def append(self, bodies: list[bytes], commit: bool = True) -> list[int]:
        a = self.store.append_as_leader(bodies, 1)
        if commit:
            self.commit()
        return list(range(a.first_index, a.first_index + len(bodies)))

    def commit(self) -> None:
        self.store.update_committed_index(self.store.ledger_end_index)
        while (due := self.applier.core.due(self.store.committed_index)) is not None:
            apply(self.applier, self.store.get_range(*due))

    def queue(self, topic: str = "T", q: int = 0) -> list[Message]:
        r = self.machine.query(("pull", topic, q, 0, 100))
        return [decode(r["data"][a:b]) for a, b in r["bounds"].tolist()]

    def close(self) -> None:
        self.machine.close()
        self.store.close()


@pytest.fixture
def member(tmp_path):
    m = Member(tmp_path / "n0")
    m.lead()
    yield m
    m.close()


def delivery(level: int, offset: int, body: bytes = b"x") -> bytes:
    real = real_message(parked(level, body))
    real.properties[DELAY_OFFSET] = mark(level, offset)
    return encode(real)


def test_a_delivery_sent_twice_is_queued_once_and_the_second_is_void(member):
    member.append([encode(parked(1, b"a")), encode(parked(1, b"b"))])
    # the second copy of 1:0 sits in the same write as the first, and once more later
    idx = member.append([delivery(1, 0, b"a"), delivery(1, 0, b"a"), delivery(1, 1, b"b")])
    idx += member.append([delivery(1, 0, b"a"), delivery(1, 5, b"?")])  # again; out of order
    stored = [decode(member.store.get(i).body) for i in idx]
    assert [m.transaction_type == TRANSACTION_ROLLBACK_TYPE for m in stored] == [
        False, True, False, True, True
    ]  # fmt: skip
    assert [m.body for m in member.queue()] == [b"a", b"b"]
    assert [m.queue_offset for m in member.queue()] == [0, 1]
    assert member.machine.query(("schedule",))["levels"][1] == (2, 2, 0)
    assert member.append([encode(Message("T", b"c"))]) and member.queue()[-1].queue_offset == 2


def test_a_failed_write_gives_its_level_advance_back(member):
    member.append([encode(parked(2))])
    nxt = member.store.ledger_end_index + 1
    member.machine.pre_append(nxt, 999, bytearray(delivery(2, 0)))  # stamped, write failed
    member.machine.pre_append(nxt + 1, 999, bytearray(skip_command(2, 1, 3)))
    (i,) = member.append([delivery(2, 0)])  # the same index again: still the level's next
    assert i == nxt and decode(member.store.get(i).body).transaction_type == 0
    assert [m.queue_offset for m in member.queue()] == [0]


def test_skips_move_a_level_on_only_from_where_it_stands(member):
    member.append([encode(parked(1)) for _ in range(4)])
    member.append([skip_command(1, 1, 3), skip_command(1, 0, 2), delivery(1, 2)])
    # 1..3 from 0 is ignored; 0..2 moves it to 2; the delivery of 2 is its next
    assert member.machine.query(("schedule",))["levels"][1][0] == 3
    assert len(member.queue()) == 1


def test_level_offsets_survive_a_restart_and_a_snapshot(tmp_path):
    a = Member(tmp_path / "a")
    a.lead()
    a.append([encode(parked(1)), encode(parked(1)), encode(parked(3))])
    a.append([delivery(1, 0), delivery(1, 1), skip_command(3, 0, 1)])
    want = {1: (2, 2, 0), 2: (0, 0, 0), 3: (1, 1, 0)}
    assert a.machine.query(("schedule",))["levels"] == want
    snap = tmp_path / "snap"
    snap.mkdir()
    a.machine.snapshot()(str(snap))
    at = a.store.ledger_end_index
    a.close()
    a = Member(tmp_path / "a")  # from its checkpoint
    assert a.machine.query(("schedule",))["levels"] == want
    a.close()

    b = Member(tmp_path / "b")  # reset past the log: from the snapshot
    b.store.append_as_leader([b"filler"] * (at + 1), 1)
    b.store.update_committed_index(at)
    b.machine.load_snapshot(str(snap), at)
    b.applier.core.step(mcore.Installed(at, [], -1), 0)
    try:
        assert {k: v[0] for k, v in b.machine.query(("schedule",))["levels"].items()} == {
            1: 2, 2: 0, 3: 1
        }  # fmt: skip
        b.lead()
        (i,) = b.append([delivery(1, 1)])  # delivered before the snapshot: void
        assert decode(b.store.get(i).body).transaction_type == TRANSACTION_ROLLBACK_TYPE
    finally:
        b.close()


# -- the runner ------------------------------------------------------------------------------
class LocalClient:
    """The service's client on a member in this process; ``stale`` answers the level
    offsets as they were (a lagging read), so the runner sends deliveries again."""

    def __init__(self, member: Member):
        self.member, self.stale = member, None

    def query(self, request, consistency="committed", member=None):
        answer = self.member.machine.query(request)
        if request == ("schedule",) and self.stale is not None:
            return self.stale
        return answer

    def append_batch(self, bodies):
        return self.member.append(list(bodies))


def test_the_runner_delivers_when_due_once_even_from_a_stale_read(member):
    for k in range(3):
        member.append([encode(parked(1, b"a%d" % k)), encode(parked(2, b"b%d" % k, q=1))])
        time.sleep(0.005)
    stamped = [m.store_timestamp for m in member.queue(SCHEDULE_TOPIC, 0)]  # the leader's
    t0 = stamped[0]
    client = LocalClient(member)
    runner = ScheduleRunner(client)
    runner.tick(t0 + 999)
    assert member.queue() == []  # nothing due
    before = member.machine.query(("schedule",))
    runner.tick(stamped[1] + 1000)  # level 1: the first two are due
    assert [m.body for m in member.queue()] == [b"a0", b"a1"]
    client.stale = before  # a read that lags: the runner sends them again
    runner._wait.clear()
    runner.tick(t0 + 5000)
    client.stale = None
    runner.tick(t0 + 5000)
    assert [m.body for m in member.queue()] == [b"a0", b"a1", b"a2"]
    assert [m.body for m in member.queue("T", 1)] == [b"b0", b"b1", b"b2"]
    assert member.machine.query(("schedule",))["levels"][2][0] == 3
    assert [m.properties[DELAY_OFFSET] for m in member.queue()] == ["1:0", "1:1", "1:2"]


def test_the_runner_passes_over_undeliverable_parked_messages(member):
    bad = parked(1)
    del bad.properties["REAL_TOPIC"]
    member.append([encode(parked(1, b"a")), encode(bad), encode(parked(1, b"c"))])
    ScheduleRunner(LocalClient(member)).tick(10**13)
    assert [m.body for m in member.queue()] == [b"a", b"c"]
    assert member.machine.query(("schedule",))["levels"][1][0] == 3
