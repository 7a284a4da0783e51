"""CommitLogMachine driven like a member drives it, on a real FileStore (no Ray): the
leader's stamps, dispatch into consume queues, restart safety, queries."""

from __future__ import annotations

import struct

import pytest
from machinecheck import apply
from rayledger.actors.core import machine as mcore
from rayledger.actors.machine import Applier, MachineContext
from rayledger.election import Role
from rayledger.integration.rocketmq.commitlog import CommitLogMachine, offset_command
from rayledger.integration.rocketmq.message import (
    PHYS_OFFSET_POS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    decode,
    encode,
)
from rayledger.storage import LedgerError, ResponseCode, StoreConfig, open_store
from rayledger.storage.codec import HEADER_SIZE


class Member:
    """A store plus a machine, wired as MemberActor wires them (a checkpoint after every
    applied batch unless ``interval_ms`` says otherwise)."""

    def __init__(self, path, interval_ms: int = 0, segment_size: int = 1 << 30):
        self.path = path
        self.store = open_store(StoreConfig(data_dir=str(path), data_segment_size=segment_size))
        self.machine = CommitLogMachine()
        args = {"checkpoint_interval_ms": interval_ms}
        self.applier = Applier(self.machine, MachineContext("g", "n0", str(path), args, self.store))
        self.store.add_append_hook(self.machine.pre_append)

    def lead(self) -> None:
        self.machine.on_role_change(Role.LEADER, 1)
        self.commit()
        assert self.machine.ready_to_lead()

    def put(self, *msgs: Message) -> list[int]:
        a = self.store.append_as_leader([encode(m) for m in msgs], 1)
        return list(range(a.first_index, a.first_index + len(msgs)))

    def commit(self) -> None:
        self.store.update_committed_index(self.store.ledger_end_index)
        while (due := self.applier.core.due(self.store.committed_index)) is not None:
            apply(self.applier, self.store.get_range(*due))

    def close(self) -> None:
        self.machine.close()
        self.store.close()


def records(pulled: dict) -> list[bytes]:
    """The records of a pull answer (one buffer and each record's bounds in it)."""
    return [pulled["data"][a:b] for a, b in pulled["bounds"].tolist()]


@pytest.fixture
def member(tmp_path):
    m = Member(tmp_path / "n0")
    yield m
    m.close()


def msg(topic="T", q=0, body=b"x", **kw) -> Message:
    return Message(topic, body, queue_id=q, **kw)


def test_the_leader_stamps_queue_and_physical_offsets_before_the_write(member):
    member.lead()
    idx = member.put(msg(q=0), msg(q=1), msg(q=0), msg("U", 0))
    stored = [decode(member.store.get(i).body) for i in idx]
    assert [m.queue_offset for m in stored] == [0, 0, 1, 0]
    for i, m in zip(idx, stored, strict=True):
        assert m.phys_offset == member.store.get_pos(i) + HEADER_SIZE
        assert m.store_timestamp > 0
    member.commit()
    r = member.machine.query(("pull", "T", 0, 0, 10))
    assert [decode(x).queue_offset for x in records(r)] == [0, 1] and r["next_offset"] == 2
    assert member.machine.query(("topics",)) == {"T": {0: 2, 1: 1}, "U": {0: 1}}
    phys = stored[1].phys_offset
    assert member.machine.query(("get_message", phys)).queue_id == 1
    assert member.machine.query(("get_message", phys + 1)) is None


def test_prepared_messages_take_no_queue_offset_and_are_not_consumable(member):
    member.lead()
    member.put(msg(), msg(sys_flag=TRANSACTION_PREPARED_TYPE), msg())
    member.commit()
    r = member.machine.query(("pull", "T", 0, 0, 10))
    assert [decode(x).queue_offset for x in records(r)] == [0, 1]


def test_a_pull_reads_a_queue_whose_messages_lie_close_together_or_far_apart(member):
    member.lead()
    member.put(msg(body=b"a"), *[msg("U", body=b"u%d" % k) for k in range(20)], msg(body=b"b"))
    member.put(msg(body=b"c"), msg("U"), msg(body=b"d"))
    member.commit()
    far = member.machine.query(("pull", "T", 0, 0, 2))  # 2 messages over 22 entries
    assert [decode(x).body for x in records(far)] == [b"a", b"b"]
    near = member.machine.query(("pull", "T", 0, 1, 10))  # 3 messages over 4 entries
    assert [decode(x).body for x in records(near)] == [b"b", b"c", b"d"]
    assert (near["first_offset"], near["next_offset"], near["max_offset"]) == (1, 4, 4)


def test_a_pull_across_segment_ends_finds_every_record(tmp_path):
    """Segments end in padding that a batch read leaves out: the records' offsets in the
    answer are then found by their headers, not by their positions."""
    m = Member(tmp_path / "n0", segment_size=4096)
    try:
        m.lead()
        bodies = [b"%03d" % k * 40 for k in range(60)]  # 120 B bodies, ~250 B records
        for k in range(0, 60, 6):
            m.put(*[msg(body=b) for b in bodies[k : k + 6]], msg("U"))
        m.commit()
        assert m.store.get_pos(m.store.ledger_end_index) > 3 * 4096  # several segments
        r = m.machine.query(("pull", "T", 0, 0, 100))
        assert [decode(x).body for x in records(r)] == bodies
        assert [decode(x).queue_offset for x in records(r)] == list(range(60))
    finally:
        m.close()


def test_a_failed_write_gives_its_offsets_back(member):
    member.lead()
    member.put(msg())
    next_index = member.store.ledger_end_index + 1
    body = bytearray(encode(msg()))
    member.machine.pre_append(next_index, 999, body)  # stamped, then the write failed
    (i,) = member.put(msg())  # the same index again
    assert i == next_index and decode(member.store.get(i).body).queue_offset == 1


def test_restart_cuts_units_past_the_checkpoint_and_replays(tmp_path):
    a = Member(tmp_path / "n0")
    a.lead()
    a.put(msg(), msg(), msg(q=1))
    a.commit()
    a.store.append_as_leader([encode(msg()), offset_command("g1", "T", 0, 2)], 1)
    a.store.update_committed_index(a.store.ledger_end_index)
    a.machine.queues[("T", 0)].append(0, 1, 0, 99)  # a unit written, checkpoint not yet
    a.close()
    b = Member(tmp_path / "n0")
    try:
        assert b.applier.core.applied == 2 and b.machine.query(("max_offset", "T", 0)) == 2
        b.commit()  # replays the entries after the checkpoint
        assert b.machine.query(("max_offset", "T", 0)) == 3
        assert b.machine.query(("consumer_offset", "g1", "T", 0)) == 2
        assert b.machine.query(("consumer_offset", "g2", "T", 0)) == -1
        b.lead()  # the table continues the queues
        (i,) = b.put(msg())
        assert decode(b.store.get(i).body).queue_offset == 3
    finally:
        b.close()


def test_not_ready_while_the_log_has_an_uncommitted_tail(member):
    member.put(msg())
    assert not member.machine.ready_to_lead()
    member.commit()
    assert member.machine.ready_to_lead()


def test_records_keep_their_physical_offset_at_byte_28(member):
    member.lead()
    (i,) = member.put(msg())
    raw = member.store.get(i).body
    assert struct.unpack_from(">q", raw, PHYS_OFFSET_POS)[0] == member.store.get_pos(i) + 48


def test_bad_queries_are_refused(member):
    from rayledger.storage import LedgerError

    for q in ("pull", ("nope",), ()):
        with pytest.raises(LedgerError):
            member.machine.query(q)


def test_messages_are_found_by_key_after_commit_and_restart(tmp_path):
    a = Member(tmp_path / "n0")
    a.lead()
    a.put(
        msg(body=b"1", properties={"KEYS": "order-1 user-7"}),
        msg("U", body=b"2", properties={"KEYS": "order-1"}),  # same key, other topic
        msg(body=b"3", properties={"KEYS": "order-2"}),
    )
    assert a.machine.query(("by_key", "T", "order-1", 10)) == []  # not committed yet
    a.commit()
    bodies = lambda m, t, k, n=10: [x.body for x in m.machine.query(("by_key", t, k, n))]  # noqa: E731
    assert bodies(a, "T", "order-1") == [b"1"] and bodies(a, "U", "order-1") == [b"2"]
    assert bodies(a, "T", "user-7") == [b"1"] and bodies(a, "T", "order-3") == []
    a.put(msg(body=b"4", properties={"KEYS": "order-1"}))
    a.commit()
    assert bodies(a, "T", "order-1") == [b"1", b"4"] and bodies(a, "T", "order-1", 1) == [b"4"]
    a.machine.keys.add("T", "order-1", 99)  # a unit written, checkpoint not yet
    a.close()
    b = Member(tmp_path / "n0")
    try:
        assert len(b.machine.keys) == 5  # the unit past the checkpoint was cut
        assert bodies(b, "T", "order-1") == [b"1", b"4"]
    finally:
        b.close()


def test_the_key_index_drops_hash_collisions(member, monkeypatch):
    from rayledger.integration.rocketmq import keyindex

    member.lead()
    monkeypatch.setattr(keyindex, "key_hash", lambda topic, key: 7)  # every key collides
    member.put(msg(body=b"a", properties={"KEYS": "k1"}), msg(body=b"b", properties={"KEYS": "k2"}))
    member.commit()
    assert [m.body for m in member.machine.query(("by_key", "T", "k2", 10))] == [b"b"]


def test_the_leader_gives_the_stamped_queue_offsets_as_receipts(member):
    member.lead()
    idx = member.put(msg(q=0), msg(q=0), msg(q=1), msg(sys_flag=TRANSACTION_PREPARED_TYPE))
    member.store.append_as_leader([b"not a message"], 1)
    assert member.machine.receipt(idx[0], idx[-1] + 1) == [0, 1, 0, 0, None]
    assert member.machine.receipt(idx[0], idx[-1]) == [None] * 4  # each is given once


def test_a_restart_replays_what_was_dispatched_after_the_last_checkpoint(tmp_path):
    a = Member(tmp_path / "n0", interval_ms=60_000)  # one checkpoint: the first batch's
    a.lead()
    for k in range(5):
        a.put(msg(body=b"%d" % k, properties={"KEYS": "k"}), msg("U"))
        a.commit()
    a.close()  # as after a crash: the later batches were dispatched, not checkpointed
    b = Member(tmp_path / "n0")
    try:
        assert b.applier.core.applied < b.store.committed_index  # it must replay
        b.commit()
        r = b.machine.query(("pull", "T", 0, 0, 100))
        assert [decode(x).body for x in records(r)] == [b"%d" % k for k in range(5)]
        assert [m.body for m in b.machine.query(("by_key", "T", "k", 100))] == [
            b"%d" % k for k in range(5)
        ]
        assert b.machine.query(("topics",)) == {"T": {0: 5}, "U": {0: 5}}
    finally:
        b.close()


def with_topic(raw_topic: bytes, q: int = 0, body: bytes = b"x") -> bytes:
    """A record whose topic bytes no put would write (encode refuses them)."""
    placeholder = b"Q" * len(raw_topic)
    raw = encode(msg(placeholder.decode(), q, body))
    return raw.replace(placeholder, raw_topic)


MALFORMED = [
    with_topic(b"a/b"),  # was dispatched to cq/a/b: the next open failed on int("b")
    with_topic(b".."),  # cq/../0: outside the consume queues
    with_topic(b"."),
    with_topic(b"a\x00b"),  # no such path: apply raised on every member
    with_topic(b"\xff\xfe"),  # not UTF-8
    encode(msg(q=1))[:-1],  # torn: TOTALSIZE disagrees
    encode(msg(properties={"a": "b"}))[:-3] + b"\x02\x02\x02",  # a property without \x01
    bytearray(encode(msg(q=2)))[:12] + struct.pack(">i", -1) + encode(msg(q=2))[16:],  # qid -1
    offset_command("g1", "T", 0, 5)[:-1],  # not JSON
    offset_command("g1", "T", 0, 5).replace(b'"offset": 5', b'"offset": "x"'),
    offset_command("g1", "T", 0, 5).replace(b'"group"', b'"grp"'),
    b"\x00RLMQ-OFFSET\x00[1, 2]",
    b"\x00RLMQ-OFFSET\x00\xff",
]


def test_malformed_entries_from_a_plain_ledger_client_are_skipped_by_every_member(tmp_path):
    """Raw appends (anyone may append to the group) take no queue offset on the leader and
    are skipped by dispatch; the queues stay contiguous and the member reopens."""
    a = Member(tmp_path / "n0")
    a.lead()
    a.put(msg(body=b"0"))
    for k, bad in enumerate(MALFORMED):
        a.store.append_as_leader([bytes(bad), encode(msg(body=b"%d" % (k + 1)))], 1)
    a.commit()  # raised, or stopped, before
    assert a.machine.applied == a.store.committed_index
    r = a.machine.query(("pull", "T", 0, 0, 100))
    got = [decode(x) for x in records(r)]
    assert [m.body for m in got] == [b"%d" % k for k in range(len(MALFORMED) + 1)]
    assert [m.queue_offset for m in got] == list(range(len(got)))  # byte 20: no gap
    assert a.machine.query(("topics",)) == {"T": {0: len(got)}}
    assert a.machine.query(("consumer_offset", "g1", "T", 0)) == -1
    assert sorted(p.name for p in (tmp_path / "n0" / "mq").iterdir()) == [
        "checkpoint.json", "cq", "keys"]  # fmt: skip
    a.close()
    (tmp_path / "n0" / "mq" / "cq" / "a" / "b").mkdir(parents=True)  # as an old version left
    b = Member(tmp_path / "n0")  # reopens: the old version failed here on int("b")
    try:
        b.lead()
        (i,) = b.put(msg(body=b"after"))
        b.commit()
        assert decode(b.store.get(i).body).queue_offset == len(got)
        assert b.machine.query(("max_offset", "T", 0)) == len(got) + 1
    finally:
        b.close()


def test_a_follower_skips_malformed_entries_it_never_stamped(tmp_path):
    """A follower's machine sees the entries as the leader wrote them: it skips the same."""
    m = Member(tmp_path / "n0")  # no leader hooks ran: not ready, nothing stamped
    try:
        m.store.append_as_leader([bytes(b) for b in MALFORMED] + [encode(msg())], 1)
        m.commit()
        assert m.machine.query(("topics",)) == {"T": {0: 1}}
    finally:
        m.close()


def test_commit_messages_advance_the_queue_offset_as_normal_ones_do(member):
    """Only normal and COMMIT messages take a queue offset and are consumable; prepared and
    rolled-back ones take none."""
    member.lead()
    idx = member.put(
        msg(body=b"n0"),
        msg(body=b"p", sys_flag=TRANSACTION_PREPARED_TYPE),
        msg(body=b"c1", sys_flag=TRANSACTION_COMMIT_TYPE),
        msg(body=b"r", sys_flag=TRANSACTION_ROLLBACK_TYPE),
        msg(body=b"n2"),
    )
    assert member.machine.receipt(idx[0], idx[-1]) == [0, 0, 1, 0, 2]
    member.commit()
    r = member.machine.query(("pull", "T", 0, 0, 10))
    got = [decode(x) for x in records(r)]
    assert [(m.body, m.queue_offset) for m in got] == [(b"n0", 0), (b"c1", 1), (b"n2", 2)]
    member.lead()  # a new master continues after the COMMIT message's offset
    (i,) = member.put(msg(body=b"n3"))
    assert decode(member.store.get(i).body).queue_offset == 3


def test_the_spark_rows_are_the_messages_the_consume_queues_hold(member):
    import pyarrow as pa
    from rayledger.integration.rocketmq.spark import decode_block

    member.lead()
    member.put(msg(body=b"n"), msg(body=b"p", sys_flag=TRANSACTION_PREPARED_TYPE))
    member.store.append_as_leader([with_topic(b"a/b"), b"not a message"], 1)
    member.put(msg(body=b"c", sys_flag=TRANSACTION_COMMIT_TYPE), msg("U", body=b"u"))
    member.put(msg(body=b"r", sys_flag=TRANSACTION_ROLLBACK_TYPE))
    member.commit()
    entries = member.store.get_range(0, member.store.ledger_end_index + 1)
    block = pa.table({"index": [e.index for e in entries], "term": [e.term for e in entries],
                      "pos": [e.pos for e in entries], "body": [e.body for e in entries]})  # fmt: skip
    rows = decode_block(block).to_pylist()
    assert [(r["topic"], r["body"], r["queue_offset"]) for r in rows] == [
        ("T", b"n", 0), ("T", b"c", 1), ("U", b"u", 0)]  # fmt: skip
    assert [r["body"] for r in decode_block(block, topic="T").to_pylist()] == [b"n", b"c"]
    for r in rows:
        assert r["phys_offset"] == member.store.get_pos(r["index"]) + HEADER_SIZE


def test_a_member_that_loads_the_leaders_table_continues_every_queue(tmp_path):
    """A member reset past its consume queues (away, or new, while the group compacted)
    loads the leader's snapshot -- the topic-queue table and the consumer offsets -- and
    continues each queue at the group's next offset: also a queue that gets no message
    after the snapshot, and also when that member leads (it stamps the next offsets)."""
    a = Member(tmp_path / "a")
    a.lead()
    a.put(msg(), msg(), msg(q=1), msg("U"), msg())
    a.store.append_as_leader([offset_command("g1", "T", 0, 2)], 1)
    a.commit()
    snap = tmp_path / "snap"
    snap.mkdir()
    a.machine.snapshot()(str(snap))
    at = a.store.ledger_end_index
    a.close()

    b = Member(tmp_path / "b")
    b.store.append_as_leader([b"filler"] * (at + 1), 1)  # its log, reset and refilled
    b.store.update_committed_index(at)
    b.machine.load_snapshot(str(snap), at)
    b.applier.core.step(mcore.Installed(at, [], -1), 0)
    try:
        for _ in range(2):  # as loaded, and after a restart
            assert b.machine.query(("topics",)) == {"T": {0: 3, 1: 1}, "U": {0: 1}}
            assert b.machine.query(("consumer_offset", "g1", "T", 0)) == 2
            r = b.machine.query(("pull", "T", 1, 0, 10))
            assert (r["status"], r["next_offset"]) == ("OFFSET_TOO_SMALL", 1)
            b.close()
            b = Member(tmp_path / "b")
            assert b.applier.core.applied == at
        b.lead()
        got = [decode(b.store.get(i).body).queue_offset for i in b.put(msg(q=1), msg("U"))]
        assert got == [1, 1]  # T/1 and U/0 had no message since the snapshot
        b.commit()
        assert [
            decode(x).queue_offset for x in records(b.machine.query(("pull", "T", 1, 1, 9)))
        ] == [1]
    finally:
        b.close()


def test_a_damaged_table_snapshot_is_a_coded_error(tmp_path, member):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "table.json").write_text("{not json")
    with pytest.raises(LedgerError) as e:
        member.machine.load_snapshot(str(tmp_path / "bad"), 3)
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT
