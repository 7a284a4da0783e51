"""RocketMQ's commit-log record: round trips, RocketMQ's offsets and ids, malformed input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rayledger.integration.rocketmq.message import (
    MAGIC_CODE,
    PHYS_OFFSET_POS,
    QUEUE_OFFSET_POS,
    Message,
    MessageError,
    PutMessageStatus,
    body_crc,
    decode,
    encode,
    msg_id,
    valid_topic,
)

names = st.text(
    st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)
topics = st.from_regex(r"[%|a-zA-Z0-9_-]{1,20}", fullmatch=True)
hosts = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535))
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)

messages = st.builds(
    Message,
    topic=topics,
    body=st.binary(max_size=300),
    queue_id=st.integers(0, 2**31 - 1),
    flag=i32,
    properties=st.dictionaries(names, st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20), max_size=5),
    sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1, 0x2]),
    born_timestamp=i64,
    born_host=hosts,
    store_timestamp=i64,
    store_host=hosts,
    reconsume_times=i32,
    prepared_transaction_offset=i64,
    queue_offset=i64,
    phys_offset=i64,
)  # fmt: skip


@given(messages)
def test_a_record_round_trips(m):
    raw = encode(m)
    assert decode(raw) == m
    assert struct.unpack_from(">i", raw, 0)[0] == len(raw)
    assert struct.unpack_from(">i", raw, 4)[0] == MAGIC_CODE
    assert struct.unpack_from(">q", raw, QUEUE_OFFSET_POS)[0] == m.queue_offset
    assert struct.unpack_from(">q", raw, PHYS_OFFSET_POS)[0] == m.phys_offset


def test_known_layout_and_ids():
    m = Message("TopicA", b"hi", queue_id=3, properties={"TAGS": "t", "KEYS": "k1"},
                store_host=("10.0.0.1", 10911), phys_offset=48)  # fmt: skip
    raw = encode(m)
    assert struct.unpack_from(">i", raw, 8)[0] == body_crc(b"hi")
    assert raw.endswith(b"TAGS\x01t\x02KEYS\x01k1\x02")
    assert m.tags == "t" and m.keys == "k1"
    assert m.msg_id == "0A00000100002A9F0000000000000030" == msg_id(("10.0.0.1", 10911), 48)


@pytest.mark.parametrize(
    "m, status",
    [
        (Message("", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t" * 128, b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t", "text"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t", b"x", properties={"a\x01": "b"}), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t", b"x", properties={"a": "b" * 40000}), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED),
        (Message("t", b"x" * (4 << 20)), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t", b"x", queue_id=2**31), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t", b"x", queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("a/b", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),  # a path under cq/
        (Message(".", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("..", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),  # cq/.. is the store
        (Message("a\x00b", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),  # no path at all
        (Message("T\n", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("tópico", b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message(None, b"x"), PutMessageStatus.MESSAGE_ILLEGAL),
        (Message("t", b"x", store_host=("::1", 1)), PutMessageStatus.MESSAGE_ILLEGAL),
    ],
)  # fmt: skip
def test_messages_rocketmq_refuses_get_its_status(m, status):
    with pytest.raises(MessageError) as e:
        encode(m)
    assert e.value.status is status


@pytest.mark.parametrize("topic", ["T", "%RETRY%cg-1", "a|b", "A_b-9", "t" * 127])
def test_topics_rocketmq_accepts_encode(topic):
    assert valid_topic(topic) and decode(encode(Message(topic, b"x"))).topic == topic


def test_malformed_records_are_clear_errors():
    good = encode(Message("t", b"body", properties={"a": "b"}))
    bad = [
        good[:10],  # shorter than a header
        good[:-1],  # torn
        good + b"x",  # TOTALSIZE disagrees
        good[:4] + b"\x00\x00\x00\x00" + good[8:],  # bad magic
        good[:8] + struct.pack(">i", 7) + good[12:],  # body CRC
        good[:-9] + struct.pack(">h", 5) + good[-7:],  # properties length
        b"",
    ]
    for raw in bad:
        with pytest.raises(MessageError) as e:
            decode(raw)
        assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL, raw


def test_a_pulled_message_decodes_on_first_use_and_equals_the_eager_one():
    import pickle

    from rayledger.integration.rocketmq.message import PulledMessage

    m = Message("T", b"body", queue_id=3, properties={"TAGS": "a", "KEYS": "k"}, phys_offset=96)
    p = PulledMessage(encode(m), 0)
    assert p.body == b"body" and "topic" not in p.__dict__  # the body alone: no decode
    assert (p.topic, p.queue_id, p.tags, p.keys, p.msg_id) == ("T", 3, "a", "k", m.msg_id)
    assert PulledMessage(encode(m), 0).phys_offset == 96  # not the dataclass default, 0
    assert p == m and m == p and pickle.loads(pickle.dumps(p)) == m
    assert PulledMessage(encode(m), 5).queue_offset == 5  # the consume queue's offset stays
    assert PulledMessage(encode(m), 5) != m


def test_the_messages_of_a_pull_come_from_one_buffer_and_pickle_small():
    import pickle

    import numpy as np
    from rayledger.integration.rocketmq.message import pulled_messages

    recs = [encode(Message("T", b"x" * k, queue_id=1)) for k in (1, 50, 300)]
    data = b"junk" + b"".join(recs)
    ends = 4 + np.cumsum([len(r) for r in recs])
    got = pulled_messages(data, np.stack([ends - [len(r) for r in recs], ends], axis=1), 7)
    assert [m.body for m in got] == [b"x", b"x" * 50, b"x" * 300]
    assert [m.queue_offset for m in got] == [7, 8, 9] and got[2].topic == "T"
    assert [m.record for m in got] == recs
    again = pickle.loads(pickle.dumps(got[0]))
    assert again == got[0] and len(pickle.dumps(got[0])) < 2 * len(recs[0])  # not the buffer
