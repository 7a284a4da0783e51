"""RocketMQ's commit-log record (v1), as the seeds' DLedgerCommitLog stores it in an entry body.

Fields in order (big-endian): TOTALSIZE i32, MAGICCODE i32, BODYCRC i32, QUEUEID i32, FLAG i32,
QUEUEOFFSET i64 (byte 20), PHYSICALOFFSET i64 (byte 28), SYSFLAG i32, BORNTIMESTAMP i64,
BORNHOST (IPv4 4 + port 4), STORETIMESTAMP i64, STOREHOST (IPv4 4 + port 4),
RECONSUMETIMES i32, PREPARED_TRANSACTION_OFFSET i64, BODY (i32 length + bytes),
TOPIC (i8 length + bytes), PROPERTIES (i16 length + ``name\\x01value\\x02`` ...).
"""

from __future__ import annotations

import enum
import functools
import gc
import ipaddress
import re
import socket
import struct
import zlib
from dataclasses import dataclass, field, fields

MAGIC_CODE = -626843481  # RocketMQ's MESSAGE_MAGIC_CODE (v1, 0xDAA320A7)
QUEUE_OFFSET_POS = 20
PHYS_OFFSET_POS = 28
MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # RocketMQ's maxMessageSize default
MAX_TOPIC_BYTES = 127
MAX_DELAY_LEVEL = 18  # RocketMQ's default messageDelayLevel has 18 levels (1s .. 2h)
MAX_PROPERTIES_BYTES = 32767
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# MessageSysFlag
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
_TRANSACTION_MASK = 0xC
_V6_FLAGS = 0x10 | 0x20  # BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG: not supported here

_HEAD = struct.Struct(">iiiiiqqiq8sq8siqi")  # TOTALSIZE .. BODY length
_PROPS_LEN = struct.Struct(">h")
_BODY_LEN = struct.Struct(">i")
_HOST = struct.Struct(">4si")


class PutMessageStatus(str, enum.Enum):
    """RocketMQ's PutMessageStatus (the ones this layer produces)."""

    PUT_OK = "PUT_OK"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class MessageError(ValueError):
    """A message that cannot be encoded, or bytes that are not a record."""

    def __init__(self, status: PutMessageStatus, message: str):
        super().__init__(f"[{status.value}] {message}")
        self.status = status
        self.message = message


def _illegal(msg: str) -> MessageError:
    return MessageError(PutMessageStatus.MESSAGE_ILLEGAL, msg)


_TOPIC = re.compile(rf"[%|a-zA-Z0-9_-]{{1,{MAX_TOPIC_BYTES}}}", re.ASCII)


@functools.lru_cache(maxsize=4096)  # the leader checks every record it stamps
def valid_topic(topic: str) -> bool:
    """RocketMQ's topic rule (``^[%|a-zA-Z0-9_-]+$``, at most 127 characters).  The consume
    queues live in a directory per topic: "a/b", "..", or a NUL byte must never get there."""
    return _TOPIC.fullmatch(topic) is not None


def check_topic(topic: object) -> None:
    """MessageError(MESSAGE_ILLEGAL) unless ``topic`` is a topic RocketMQ accepts."""
    if not isinstance(topic, str) or not topic:
        raise _illegal("the topic must be a non-empty string")
    if len(topic) > MAX_TOPIC_BYTES:
        raise _illegal(f"topic is {len(topic)} characters, at most {MAX_TOPIC_BYTES}")
    if not valid_topic(topic):
        raise _illegal(f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")


def body_crc(body: bytes) -> int:
    """RocketMQ's UtilAll.crc32: CRC32 masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def properties_to_string(props: dict[str, str]) -> str:
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise _illegal(f"property names and values must be strings, got {k!r}={v!r}")
        if any(s in k + v for s in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
            raise _illegal(f"property {k!r} contains a separator character")
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


def string_to_properties(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if item:
            name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
            if not sep:
                raise _illegal(f"malformed property {item!r}")
            out[name] = value
    return out


def _pack_host(host: tuple[str, int]) -> bytes:
    return _pack_host_tuple(tuple(host))


@functools.lru_cache(maxsize=1024)  # ipaddress costs more than the rest of an encode
def _pack_host_tuple(host: tuple[str, int]) -> bytes:
    ip, port = host
    try:
        raw = ipaddress.IPv4Address(ip).packed
    except ValueError:
        raise _illegal(f"only IPv4 hosts are supported, got {ip!r}") from None
    return _HOST.pack(raw, port)


@functools.lru_cache(maxsize=1024)
def _unpack_host(raw: bytes) -> tuple[str, int]:
    ip, port = _HOST.unpack(raw)
    return socket.inet_ntoa(ip), port


def msg_id(store_host: tuple[str, int], wrote_offset: int) -> str:
    """RocketMQ's offset message id: store host (ip, port) and physical offset, in hex."""
    return (_pack_host(store_host) + struct.pack(">q", wrote_offset)).hex().upper()


@dataclass
class Message:
    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    phys_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> str | None:
        return self.properties.get("KEYS")

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & _TRANSACTION_MASK

    @property
    def msg_id(self) -> str:
        return msg_id(self.store_host, self.phys_offset)


_FIELDS = tuple(f.name for f in fields(Message))


def encode(m: Message, max_size: int = MAX_MESSAGE_SIZE) -> bytes:
    """The record of ``m``; MessageError (MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED) for a
    message RocketMQ would refuse."""
    check_topic(m.topic)
    if not isinstance(m.queue_id, int) or m.queue_id < 0:
        raise _illegal(f"queue id {m.queue_id!r} must be a non-negative int")
    if not isinstance(m.body, (bytes, bytearray)):
        raise _illegal(f"the body must be bytes, not {type(m.body).__name__}")
    if m.sys_flag & _V6_FLAGS:
        raise _illegal("IPv6 host flags are not supported")
    topic = m.topic.encode()
    props = properties_to_string(m.properties).encode()
    if len(props) > MAX_PROPERTIES_BYTES:
        raise MessageError(
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            f"properties are {len(props)} bytes, at most {MAX_PROPERTIES_BYTES}",
        )
    total = _HEAD.size + len(m.body) + 1 + len(topic) + 2 + len(props)
    if total > max_size:
        raise _illegal(f"message is {total} bytes, at most {max_size}")
    try:
        head = _HEAD.pack(
            total, MAGIC_CODE, body_crc(bytes(m.body)), m.queue_id, m.flag, m.queue_offset,
            m.phys_offset, m.sys_flag, m.born_timestamp, _pack_host(m.born_host),
            m.store_timestamp, _pack_host(m.store_host), m.reconsume_times,
            m.prepared_transaction_offset, len(m.body),
        )  # fmt: skip
    except struct.error as exc:
        raise _illegal(f"a field is out of range: {exc}") from None
    return b"".join(
        (head, m.body, bytes((len(topic),)), topic, struct.pack(">h", len(props)), props)
    )


def decode(buf: bytes | memoryview, verify: bool = True) -> Message:
    """A record back into a Message; MessageError(MESSAGE_ILLEGAL) when it is not one.
    ``verify=False`` skips the body CRC (for records read back from the ledger, whose
    entries carry a CRC of their own that the store checks)."""
    try:
        return _decode(bytes(buf), verify)
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise _illegal(f"not a record: {exc}") from None


def _decode(buf: bytes, verify: bool) -> Message:
    n = len(buf)
    if n < _HEAD.size:
        raise _illegal(f"{n} bytes is shorter than a record header")
    f = _HEAD.unpack_from(buf, 0)
    total, magic, crc, body_len = f[0], f[1], f[2], f[14]
    if magic != MAGIC_CODE:
        raise _illegal(f"bad magic code {magic:#x}")
    if total != n:
        raise _illegal(f"TOTALSIZE says {total} bytes, the record has {n}")
    at = _HEAD.size
    if body_len < 0 or at + body_len + 3 > total:
        raise _illegal(f"body length {body_len} runs past the record")
    body = buf[at : at + body_len]
    if verify and body_crc(body) != crc:
        raise _illegal("body CRC mismatch")
    at += body_len
    topic_len = buf[at]
    topic = buf[at + 1 : at + 1 + topic_len].decode()
    at += 1 + topic_len
    (props_len,) = _PROPS_LEN.unpack_from(buf, at)
    if props_len < 0 or at + 2 + props_len != total:
        raise _illegal(f"properties length {props_len} does not end the record")
    props = string_to_properties(buf[at + 2 : at + 2 + props_len].decode())
    m = object.__new__(Message)  # the dataclass __init__ costs more than the rest of a decode
    m.__dict__.update(
        topic=topic, body=body, queue_id=f[3], flag=f[4], properties=props, sys_flag=f[7],
        born_timestamp=f[8], born_host=_unpack_host(f[9]), store_timestamp=f[10],
        store_host=_unpack_host(f[11]), reconsume_times=f[12],
        prepared_transaction_offset=f[13], queue_offset=f[5], phys_offset=f[6],
    )  # fmt: skip
    return m


class _Lazy:
    """A field of a PulledMessage: read from the record on first use (a class attribute of
    the dataclass, such as ``phys_offset = 0``, must not answer instead)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        d = obj.__dict__
        if self.name not in d:
            obj._decode_field(self.name)
        return d[self.name]

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value


class PulledMessage(Message):
    """A message a consumer pulled.  It keeps its record's place in the pull's buffer: the
    body (what most consumers read) is sliced as the pull arrives, any other field costs one
    full decode on first use (the store has checked the record's CRC).  It compares equal
    to the same message decoded eagerly, and pickles as its record alone."""

    def __init__(self, record: bytes, queue_offset: int):  # not the dataclass __init__
        self.__dict__ = _pulled(record, 0, len(record), queue_offset)

    def _decode_field(self, name: str) -> None:
        d = self.__dict__
        for k, v in _decode(self.record, False).__dict__.items():
            d.setdefault(k, v)  # the puller's queue offset stays

    @property
    def record(self) -> bytes:
        """The message's encoded record, as the commit log holds it."""
        d = self.__dict__
        return d["_data"][d["_at"] : d["_end"]]

    def __reduce__(self):
        return PulledMessage, (self.record, self.queue_offset)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    __hash__ = None  # type: ignore[assignment]


def _pulled(data: bytes, at: int, end: int, queue_offset: int) -> dict:
    """A PulledMessage's ``__dict__``: its place in ``data``, its queue offset and its body."""
    body_at = at + _HEAD.size
    (n,) = _BODY_LEN.unpack_from(data, body_at - 4)
    return {"_data": data, "_at": at, "_end": end, "queue_offset": queue_offset,
            "body": data[body_at : body_at + n]}  # fmt: skip


def pulled_messages(data: bytes, bounds, first_offset: int) -> list[PulledMessage]:
    """The messages of one pull: ``bounds`` holds each record's ``(start, end)`` in ``data``
    (an array, as the member answers), the first has queue offset ``first_offset``.

    Thousands of small objects at once set off Python's cycle collector again and again
    (half the time of a pull here); these hold no cycles, so it waits until they exist."""
    new, cls, out = object.__new__, PulledMessage, []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for k, (at, end) in enumerate(bounds.tolist(), first_offset):
            m = new(cls)
            m.__dict__ = _pulled(data, at, end, k)
            out.append(m)
    finally:
        if was_enabled:
            gc.enable()
    return out


for _name in _FIELDS:
    setattr(PulledMessage, _name, _Lazy())
    PulledMessage.__dict__[_name].__set_name__(PulledMessage, _name)
