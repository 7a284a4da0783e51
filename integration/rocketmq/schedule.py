"""RocketMQ's delay levels (ScheduleMessageService), decided without a clock, Ray or I/O.

A message put with delay level ``L`` is parked in ``SCHEDULE_TOPIC_XXXX`` queue ``L-1`` with
its real topic and queue as properties.  It is due once its store timestamp plus the level's
delay has passed; the schedule service then puts it to its real topic and queue.  Each level
delivers in queue order, and its progress (RocketMQ's delayOffset.json) is the offset of the
next parked message to deliver.

Here the progress lives in the ledger, not in a file: a delivery is ONE entry, the real
message's record carrying the property ``DELAY_OFFSET = "<level>:<schedule offset>"``, and
applying it both queues the message and moves its level on (:class:`LevelOffsets`).  The
leader stamps a delivery that its level has already passed as rolled back (so no member
queues it), hence a delivery retried after an unknown outcome, or sent again by a restarted
service, is queued once.  A parked message that cannot be delivered (no real topic, or gone
from the log) is passed over by a ``skip`` command entry, under the same rule.

:func:`plan_level` is the service's whole decision for one level: given its offset, the
parked messages read from there and the time, what to put and when to look again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rayledger.storage import LedgerError, ResponseCode

from .message import Message, check_topic

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ's default messageDelayLevel.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_LEVELS = 64  # each level is a queue the service reads
#: the property a delivered message carries: which parked message it is
DELAY_OFFSET = "DELAY_OFFSET"
#: the properties RocketMQ uses to park a delayed message (gone once it is delivered)
PARKING = ("REAL_TOPIC", "REAL_QID", "DELAY")
_SKIP_MAGIC = b"\x00RLMQ-DELAY-SKIP\x00"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DELAY = re.compile(r"([0-9]{1,9})(ms|s|m|h|d)", re.ASCII)


def parse_delay_levels(text: object) -> tuple[int, ...]:
    """Each level's delay in milliseconds from a messageDelayLevel string ("1s 5s 1m 2h":
    units ms, s, m, h, d); LedgerError(UNEXPECTED_ARGUMENT) for anything else, so a group is
    never started with a table its members would read differently."""
    if not isinstance(text, str):
        raise _bad(f"delay_levels must be a string like {DEFAULT_DELAY_LEVELS[:11]!r}...")
    out = []
    for word in text.split():
        m = _DELAY.fullmatch(word)
        if m is None or int(m[1]) <= 0:
            raise _bad(f"delay level {word!r} is not a positive number with a unit ms/s/m/h/d")
        out.append(int(m[1]) * _UNITS_MS[m[2]])
    if not 1 <= len(out) <= MAX_LEVELS:
        raise _bad(f"delay_levels has {len(out)} levels, not 1..{MAX_LEVELS}")
    return tuple(out)


def _bad(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, msg)


# -- the entries --------------------------------------------------------------------------
def mark(level: int, offset: int) -> str:
    return f"{level}:{offset}"


def parse_mark(value: str) -> tuple[int, int] | None:
    """(level, schedule offset) of a ``DELAY_OFFSET`` value; None for a malformed one."""
    level, sep, offset = value.partition(":")
    if not (sep and level.isascii() and level.isdigit() and offset.isascii() and offset.isdigit()):
        return None
    return int(level), int(offset)


def skip_command(level: int, start: int, stop: int) -> bytes:
    """The entry body that passes over parked messages ``start..stop-1`` of ``level``."""
    return _SKIP_MAGIC + json.dumps({"level": level, "start": start, "stop": stop}).encode()


def parse_skip(body: bytes | bytearray) -> tuple[int, int, int] | None:
    """(level, start, stop) of a skip command; None for any other body (or a malformed one:
    a plain LedgerClient can append anything, and every member must read it alike)."""
    if not body.startswith(_SKIP_MAGIC):
        return None
    try:
        doc = json.loads(bytes(body[len(_SKIP_MAGIC) :]))
        level, start, stop = doc["level"], doc["start"], doc["stop"]
    except (ValueError, KeyError, TypeError):
        return None
    if not all(type(v) is int for v in (level, start, stop)) or not 0 <= start < stop:
        return None
    return level, start, stop


# -- the rule every member applies and the leader foresees ---------------------------------
class LevelOffsets:
    """Each level's next schedule offset to deliver.  A delivery of (level, offset) is taken
    only at the level's offset; a skip only from it.  The machine applies committed entries
    through it; the leader runs a copy over the entries it stamps, so it knows before the
    write whether a delivery is new (then it takes a queue offset) or a duplicate (then it
    voids it)."""

    def __init__(self, offsets: dict[int, int] | None = None):
        self.offsets: dict[int, int] = dict(offsets or {})

    def get(self, level: int) -> int:
        return self.offsets.get(level, 0)

    def deliver(self, level: int, offset: int) -> bool:
        """Whether the delivery of parked message ``offset`` of ``level`` is the next one
        (the level moves on) or not (a duplicate, or out of order: nothing changes)."""
        if offset != self.get(level):
            return False
        self.offsets[level] = offset + 1
        return True

    def skip(self, level: int, start: int, stop: int) -> bool:
        if start != self.get(level) or stop <= start:
            return False
        self.offsets[level] = stop
        return True

    def snapshot(self) -> dict[str, int]:
        """JSON-ready: level (as text) -> offset."""
        return {str(k): v for k, v in sorted(self.offsets.items())}

    @classmethod
    def from_json(cls, doc: dict) -> LevelOffsets:
        return cls({int(k): int(v) for k, v in doc.items()})


# -- the service's decision ----------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """Put ``message`` (the parked one, made real) to its real topic and queue."""

    level: int
    offset: int
    message: Message


@dataclass(frozen=True)
class Skip:
    """Pass over parked messages ``start..stop-1`` (undeliverable, or gone)."""

    level: int
    start: int
    stop: int
    why: str


@dataclass(frozen=True)
class LevelPlan:
    """What to append for one level, in order, and when it is worth looking again
    (``wake_at_ms``: the next parked message's due time; None when none was read)."""

    level: int
    puts: tuple[Delivery | Skip, ...]
    next_offset: int
    wake_at_ms: int | None


def due_at(parked: Message, delay_ms: int) -> int:
    """When a parked message is due: its store timestamp (born, if never stamped) plus the
    level's delay, as RocketMQ's computeDeliverTimestamp."""
    return (parked.store_timestamp or parked.born_timestamp) + delay_ms


def real_message(parked: Message) -> Message | None:
    """The parked message as it is delivered: real topic and queue, the parking properties
    removed, the rest (body, keys, tags, other properties, flag, sys flag, born time and
    host, reconsume times) kept; None when it names no valid real topic and queue."""
    props = parked.properties
    topic, qid = props.get("REAL_TOPIC"), props.get("REAL_QID", "")
    try:
        check_topic(topic)
    except ValueError:
        return None
    if topic == SCHEDULE_TOPIC or not (qid.isascii() and qid.isdigit()):
        return None
    kept = {k: v for k, v in props.items() if k not in PARKING and k != DELAY_OFFSET}
    return replace(
        parked, topic=topic, queue_id=int(qid), properties=kept,
        queue_offset=0, phys_offset=0, store_timestamp=0,
    )  # fmt: skip


def plan_level(
    level: int,
    delay_ms: int,
    offset: int,
    parked: Sequence[tuple[int, Message]],
    now_ms: int,
    min_offset: int | None = None,
) -> LevelPlan:
    """The service's decision for ``level`` at ``now_ms`` (wall-clock milliseconds, the
    clock store timestamps are in).  ``offset`` is the level's committed offset; ``parked``
    the messages read from there as (schedule offset, message), in order; ``min_offset`` the
    lowest one the log still holds when the read found ``offset`` gone.

    Due messages are delivered in order up to the first that is not due yet (a level's
    messages share one delay, so later ones are due later too); an undeliverable one is
    skipped; each put names its schedule offset, so the ledger takes it at most once."""
    puts: list[Delivery | Skip] = []
    at = offset
    if min_offset is not None and min_offset > at:
        puts.append(Skip(level, at, min_offset, "gone from the log"))
        at = min_offset
    wake = None
    for k, m in parked:
        if k < at:
            continue  # read before the offset moved
        if k > at:
            break  # a hole in what was read: read again from ``at``
        real = real_message(m)
        if real is None:
            puts.append(Skip(level, at, at + 1, "no valid REAL_TOPIC/REAL_QID"))
        elif due_at(m, delay_ms) <= now_ms:
            props = {**real.properties, DELAY_OFFSET: mark(level, k)}
            puts.append(Delivery(level, k, replace(real, properties=props)))
        else:
            wake = due_at(m, delay_ms)
            break
        at += 1
    return LevelPlan(level, tuple(_merge(puts)), at, wake)


def _merge(puts: list[Delivery | Skip]) -> list[Delivery | Skip]:
    """Adjacent skips as one."""
    out: list[Delivery | Skip] = []
    for p in puts:
        last = out[-1] if out else None
        if isinstance(p, Skip) and isinstance(last, Skip) and last.stop == p.start:
            out[-1] = Skip(p.level, last.start, p.stop, last.why)
        else:
            out.append(p)
    return out
