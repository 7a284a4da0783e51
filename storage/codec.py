"""DLedger's on-disk formats: the data-file entry and the 32-byte index unit.

Entry (big-endian): magic i32, size i32, index i64, term i64, pos i64,
channel i32, chainCrc i32, bodyCrc i32, bodySize i32, body.  ``size`` is the
whole entry (header + body).  ``chainCrc`` chains every body CRC before it, so a
modification anywhere earlier shows up in every later entry.

Index unit (big-endian, 32 bytes): magic i32, pos i64, size i32, index i64,
term i64.  Entry ``i`` sits at ``i * 32`` in the index file list.

Batches are encoded and decoded in one pass with precompiled structs; index
units go through numpy so a batch of a thousand costs one ``tobytes``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import LedgerError, ResponseCode

ENTRY_MAGIC = 0x0D1E_D6E5
BLANK_MAGIC = -1

HEADER = struct.Struct(">iiqqqiiii")
HEADER_SIZE = HEADER.size  # 48
INDEX = struct.Struct(">iqiqq")
INDEX_UNIT = INDEX.size  # 32


class Header(NamedTuple):
    """A data-file entry header, ``HEADER``'s fields in order."""

    magic: int
    size: int  # header and body
    index: int
    term: int
    pos: int  # where the entry starts in the data files
    channel: int
    chain_crc: int  # CRC over this body's CRC and the previous entry's chain CRC
    body_crc: int
    body_size: int


class IndexUnit(NamedTuple):
    """An index-file unit, ``INDEX``'s fields in order: where entry ``index`` lives."""

    magic: int
    pos: int
    size: int
    index: int
    term: int


INDEX_DTYPE = np.dtype(
    [("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8")]
)
assert INDEX_DTYPE.itemsize == INDEX_UNIT
HEADER_DTYPE = np.dtype(
    [
        ("magic", ">i4"),
        ("size", ">i4"),
        ("index", ">i8"),
        ("term", ">i8"),
        ("pos", ">i8"),
        ("channel", ">i4"),
        ("chain", ">u4"),  # CRCs unsigned here (struct unpacks them signed)
        ("bcrc", ">u4"),
        ("body_size", ">i4"),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_SIZE
# Exactly-once appends.  An entry of an idempotent client has this bit set in
# its header's channel, and its stored body starts with SESSION: who appended it (the
# client's id and the entry's sequence number in that client's session), when its leader
# wrote it (wall-clock ms, never below the stamp before it) and the CRC-32 of the body as
# the client sent it (an append hook may stamp the stored body; a retry is checked
# against what the client sent).  Every member, and every later leader, reads the
# identities from its own log.  Readers strip both: a caller sees the client's channel
# and exactly the bytes the client appended.
SESSION_FLAG = 1 << 30
SESSION = struct.Struct(">qqqI")  # client id, sequence, leader stamp, CRC-32 as sent
SESSION_SIZE = SESSION.size  # 28


def logical_channel(channel: int) -> int:
    """The channel a caller sees: the header's, without the session bit."""
    return channel & ~SESSION_FLAG


SESSION_DTYPE = np.dtype([("client", ">i8"), ("seq", ">i8"), ("stamp", ">i8"), ("crc", ">u4")])


def session_ids(data, first_index: int, channels, sizes) -> tuple[np.ndarray, np.ndarray]:
    """``(indexes, records)`` of the entries with a session prefix in a batch's bytes
    (entries back to back; ``channels`` and ``sizes`` from their headers): one numpy gather,
    records of :data:`SESSION_DTYPE`."""
    flagged = np.flatnonzero(np.asarray(channels) & SESSION_FLAG)
    if not len(flagged):
        return flagged, np.zeros(0, SESSION_DTYPE)
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    buf = np.frombuffer(data, dtype=np.uint8)
    raw = buf[(starts[flagged] + HEADER_SIZE)[:, None] + np.arange(SESSION_SIZE)]
    return flagged + first_index, np.ascontiguousarray(raw).view(SESSION_DTYPE).reshape(-1)


def session_rows(data, first_index: int, channels, sizes) -> tuple[list, list]:
    """:func:`session_ids` for a few entries, in plain Python (numpy costs more per call
    than it saves there): ``(indexes, [(client, seq, stamp, crc), ...])``."""
    idx, rows, at = [], [], 0
    unpack = SESSION.unpack_from
    for k, (ch, size) in enumerate(zip(channels, sizes, strict=True)):
        if ch & SESSION_FLAG:
            idx.append(first_index + k)
            rows.append(unpack(data, at + HEADER_SIZE))
        at += size
    return idx, rows


def with_session(bodies: Sequence[bytes], client: int, first_seq: int, stamp: int) -> list:
    """``bodies`` each behind its session prefix (sequences from ``first_seq``): a batch
    of equal bodies is built as one numpy array and handed out as row views."""
    crcs = list(map(crc32, bodies))
    n = len(bodies)
    size = len(bodies[0])
    if n < _UNIFORM_MIN or any(len(b) != size for b in bodies):
        pack = SESSION.pack
        return [pack(client, first_seq + k, stamp, crcs[k]) + bytes(b)
                for k, b in enumerate(bodies)]  # fmt: skip
    width = SESSION_SIZE + size
    out = np.empty((n, width), dtype=np.uint8)
    head = out[:, :SESSION_SIZE].view(SESSION_DTYPE)[:, 0]
    head["client"] = client
    head["seq"] = np.arange(first_seq, first_seq + n, dtype=np.int64)
    head["stamp"] = stamp
    head["crc"] = crcs
    if size:
        out[:, SESSION_SIZE:] = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(n, size)
    flat = memoryview(out.reshape(-1))
    return [flat[k * width : (k + 1) * width] for k in range(n)]


def body_skip(channel: int) -> int:
    """Bytes of a stored body before the client's own: the session prefix, if any."""
    return SESSION_SIZE if channel & SESSION_FLAG else 0


_BLANK = struct.Struct(">ii")
_U32 = struct.Struct(">I")
crc32 = zlib.crc32


def _signed(v: int) -> int:
    return v - 0x1_0000_0000 if v & 0x8000_0000 else v


@dataclass(slots=True, frozen=True)
class Entry:
    """One log entry as callers see it.

    ``channel`` is DLedger's header field: 0 for a client's entry (a term's first entry,
    with an empty body, among them); a group's configuration entry is on
    ``rayledger.election.configuration.CONFIG_CHANNEL``, its body the configuration's
    JSON -- group data, not a client's, which readers of client data skip or mark.
    ``body`` is what the client appended: an idempotent client's session prefix
    (:data:`SESSION`) is not part of it, nor its bit part of ``channel``."""

    index: int
    term: int
    pos: int
    body: bytes
    channel: int = 0


@dataclass(slots=True, frozen=True)
class EntryBatch:
    """Consecutive entries as their exact data-file bytes (no segment padding).

    This is what a leader pushes to a follower: the follower verifies and writes
    the bytes as they are, so payloads are encoded once, on the leader.  ``crc`` is the
    CRC-32 of ``data`` as the leader encoded it (None when not known, e.g. read back from
    files): a follower that finds it intact takes each entry's body CRC from its header
    instead of computing it again (one CRC call per batch instead of one per entry).
    """

    first_index: int
    count: int
    data: bytes
    crc: int | None = None

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1

    @property
    def first_pos(self) -> int:
        """The data position of the first entry, as its header says (the leader's)."""
        return HEADER.unpack_from(self.data, 0)[4]

    def entries(self) -> list[Entry]:
        return list(iter_entries(self.data))

    def headers(self) -> list[tuple[int, int, int, int, int, int, int, int, int]]:
        """(magic, size, index, term, pos, channel, chain_crc, body_crc, body_size) each."""
        out = []
        off, data, n = 0, self.data, len(self.data)
        while off < n:
            h = HEADER.unpack_from(data, off)
            out.append(h)
            off += h[1]
        return out


def chain_crc(prev: int, body_crc: int) -> int:
    return crc32(_U32.pack(body_crc & 0xFFFF_FFFF), prev & 0xFFFF_FFFF)


def _crc_tables() -> np.ndarray:
    """zlib's CRC-32 table and its three slicing-by-4 successors, shape (4, 256)."""
    t = np.zeros((4, 256), dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB8_8320 if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 4):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


_T0, _T1, _T2, _T3 = _crc_tables()


def chain_crcs(prev, body_crcs) -> np.ndarray:
    """``chain_crc(prev[k], body_crcs[k])`` for every ``k``, vectorised (uint32).

    ``crc32(4 bytes, prev)`` is one slicing-by-4 step of zlib's CRC: the four
    body-CRC bytes (big-endian) are folded into the inverted previous CRC and
    looked up in four tables, so a whole batch costs a few numpy operations.
    """
    prev = np.asarray(prev, dtype=np.uint32)
    word = np.asarray(body_crcs, dtype=np.uint32).byteswap()  # the bytes read little-endian
    c = ~prev ^ word
    out = _T3[c & 0xFF] ^ _T2[(c >> 8) & 0xFF] ^ _T1[(c >> 16) & 0xFF] ^ _T0[c >> 24]
    return ~out


_UNIFORM_MIN = 16  # batches this long with equal small bodies get their headers from numpy
_UNIFORM_MAX_BODY = 2048  # above this the copies cost more than the per-entry packs


def encode_entries(
    bodies: Sequence[bytes],
    first_index: int,
    term: int,
    positions: Sequence[int],
    prev_chain_crc: int,
    channel: int | Sequence[int] = 0,
) -> tuple[bytes, int]:
    """Encode a batch into one buffer; returns (data, the last chain CRC).  ``channel``:
    every entry's, or one per entry (a round of several clients' appends)."""
    n = len(bodies)
    if len(positions) != n:
        raise ValueError(f"{n} bodies but {len(positions)} positions")
    channels = [channel] * n if isinstance(channel, int) else list(channel)
    if len(channels) != n:
        raise ValueError(f"{n} bodies but {len(channels)} channels")
    if n >= _UNIFORM_MIN:
        lens = set(map(len, bodies))
        body_len = max(lens)
        if len(lens) == 1 and body_len <= _UNIFORM_MAX_BODY:
            return _encode_uniform(
                bodies, body_len, first_index, term, positions, prev_chain_crc, channel
            )
    pack = HEADER.pack
    u32 = _U32.pack
    parts: list[bytes] = []
    append = parts.append
    chain = prev_chain_crc & 0xFFFF_FFFF
    index = first_index
    for body, pos, ch in zip(bodies, positions, channels, strict=True):
        bcrc = crc32(body)
        chain = crc32(u32(bcrc), chain)
        n = len(body)
        append(
            pack(
                ENTRY_MAGIC,
                HEADER_SIZE + n,
                index,
                term,
                pos,
                ch,
                _signed(chain),
                _signed(bcrc),
                n,
            )
        )
        append(body)
        index += 1
    return b"".join(parts), _signed(chain)


def _encode_uniform(
    bodies: Sequence[bytes],
    body_len: int,
    first_index: int,
    term: int,
    positions: Sequence[int],
    prev_chain_crc: int,
    channel: int | Sequence[int],
) -> tuple[bytes, int]:
    """encode_entries for bodies of one length: the CRCs in two tight loops, the
    headers as one numpy record array, interleaved with the bodies in one copy."""
    n = len(bodies)
    bcrcs = list(map(crc32, bodies))
    u32 = _U32.pack
    chain = prev_chain_crc & 0xFFFF_FFFF
    chains = [chain := crc32(u32(b), chain) for b in bcrcs]  # sequential by design
    size = HEADER_SIZE + body_len
    out = np.empty((n, size), dtype=np.uint8)
    h = out[:, :HEADER_SIZE].view(HEADER_DTYPE)[:, 0]
    h["magic"] = ENTRY_MAGIC
    h["size"] = size
    h["index"] = np.arange(first_index, first_index + n, dtype=np.int64)
    h["term"] = term
    h["pos"] = positions
    h["channel"] = channel
    h["chain"] = chains
    h["bcrc"] = bcrcs
    h["body_size"] = body_len
    if body_len:
        out[:, HEADER_SIZE:] = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(n, body_len)
    return out.tobytes(), _signed(chain)


def decode_entry(buf, offset: int = 0) -> Entry:
    magic, size, index, term, pos, channel, _chain, _bcrc, body_size = HEADER.unpack_from(
        buf, offset
    )
    if magic != ENTRY_MAGIC or size != HEADER_SIZE + body_size:
        raise LedgerError.of(ResponseCode.CORRUPT_LOG, f"bad entry header at offset {offset}")
    start = offset + HEADER_SIZE + body_skip(channel)
    end = offset + size
    return Entry(index, term, pos, bytes(buf[start:end]), logical_channel(channel))


def iter_entries(buf) -> Iterator[Entry]:
    off, n = 0, len(buf)
    while off < n:
        e = decode_entry(buf, off)
        off += HEADER.unpack_from(buf, off)[1]
        yield e


def check_entry(buf, offset: int, prev_chain_crc: int | None) -> Header | None:
    """Header of a well-formed entry at ``offset`` whose CRCs hold, else None.

    ``prev_chain_crc`` None skips the chain check (the first entry scanned).
    """
    if offset + HEADER_SIZE > len(buf):
        return None
    h = HEADER.unpack_from(buf, offset)
    magic, size, _index, _term, _pos, _channel, chain, bcrc, body_size = h
    if magic != ENTRY_MAGIC or size != HEADER_SIZE + body_size or body_size < 0:
        return None
    end = offset + size
    if end > len(buf):
        return None
    got = _signed(crc32(memoryview(buf)[offset + HEADER_SIZE : end]))
    if got != bcrc:
        return None
    if prev_chain_crc is not None and _signed(chain_crc(prev_chain_crc, got)) != chain:
        return None
    return Header._make(h)


def blank_record(length: int) -> bytes:
    """Padding that fills the end of a segment (or the hole at its start)."""
    if length <= 0:
        return b""
    if length < _BLANK.size:
        return b"\xff" * length
    return _BLANK.pack(BLANK_MAGIC, length) + bytes(length - _BLANK.size)


def blank_size(buf, offset: int) -> int | None:
    """Length of a blank record at ``offset``, or None when there is none."""
    if offset + _BLANK.size > len(buf):
        return None
    magic, length = _BLANK.unpack_from(buf, offset)
    if magic != BLANK_MAGIC or length < _BLANK.size:
        return None
    return length


def encode_index(positions, sizes, first_index: int, terms) -> bytes:
    n = len(positions)
    arr = np.empty(n, dtype=INDEX_DTYPE)
    arr["magic"] = ENTRY_MAGIC
    arr["pos"] = positions
    arr["size"] = sizes
    arr["index"] = np.arange(first_index, first_index + n, dtype=np.int64)
    arr["term"] = terms
    return arr.tobytes()


def decode_index(buf) -> np.ndarray:
    return np.frombuffer(buf, dtype=INDEX_DTYPE)
