"""CommitLogMachine: the seeds' DLedgerCommitLog as a state machine every member runs.

* **Put (leader).** Each message is one entry whose body is a commit-log record (message.py).
  Before the write, ``pre_append`` stamps the store timestamp, the queue offset from the
  topic-queue table (advanced only for normal and COMMIT messages) and the physical offset
  (entry position + 48, the entry header).  The table is rebuilt from the consume queues when
  the member becomes ready to lead: its ledger end equals its committed index and dispatch has
  applied everything (RocketMQ's master waits the same way), so offsets continue after a
  failover with no gap and no duplicate.  A write that fails after its stamp is detected by
  the next stamp at the same index, and the offsets it took are given back.
* **Dispatch (every member).** Committed records are appended to their consume queue and
  indexed by key (keyindex.py); a consumer group's committed offset is an entry too
  (``offset_command``), so offsets survive failovers.  After each applied batch the queues
  and the key index are flushed and a checkpoint (applied index, units per queue and of the
  key index, consumer offsets) is replaced atomically; on restart units past the
  checkpoint are cut and the member replays from the checkpoint's index.
* **Delay levels.** A delivery of a parked delayed message (schedule.py) is one entry: the
  real record, marked with its level and schedule offset.  The leader stamps it like any
  message when it is its level's next one, and as rolled back (no queue offset, queued by
  no member) when the level has passed it; applying it moves the level on.  So a delivery
  sent twice is queued once, and the level offsets (RocketMQ's delayOffset.json) are in
  the checkpoint and the snapshots, on every member.
* **Snapshots.** A snapshot is the topic-queue table, the consumer offsets, the delay
  levels' offsets and the applied index.  A member whose log is reset past its queues (it
  was away, or joined, while the group compacted) loads the leader's and continues every
  queue at the group's next offset: it may lead at once, stamping offsets that follow the
  group's.
* **Reads.** Queries only see dispatched, hence committed, messages.  A pull below what the
  log still holds (the cleaner deleted it, or the member continued after a snapshot past
  it) is answered ``OFFSET_TOO_SMALL`` with the queue's lowest
  readable offset as the next one, as RocketMQ's broker does; the client moves on to it.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import shutil
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rayledger.actors.machine import MachineContext, StateMachine
from rayledger.election import Role
from rayledger.storage import Entry, LedgerError, ResponseCode
from rayledger.storage.codec import HEADER, HEADER_SIZE, SESSION_FLAG, body_skip

from .consumequeue import ConsumeQueue, tag_hash
from .keyindex import KeyIndex, split_keys
from .message import (
    MAGIC_CODE,
    PHYS_OFFSET_POS,
    QUEUE_OFFSET_POS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageError,
    decode,
    string_to_properties,
    valid_topic,
)
from .schedule import (
    DEFAULT_DELAY_LEVELS,
    DELAY_OFFSET,
    SCHEDULE_TOPIC,
    LevelOffsets,
    parse_delay_levels,
    parse_mark,
    parse_skip,
)

logger = logging.getLogger("rayledger.integration.rocketmq")

_SYSFLAG_POS, _STORE_TS_POS, _TOPIC_AFTER_BODY = 36, 56, 84
_ROUTE_HEAD = struct.Struct(">iiii")  # TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID
_unpack_i, _unpack_h = struct.Struct(">i").unpack_from, struct.Struct(">h").unpack_from
_OFFSET_MAGIC = b"\x00RLMQ-OFFSET\x00"
_QUEUED = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
_SNAPSHOT_FILE = "table.json"
_MARK = DELAY_OFFSET.encode() + b"\x01"  # a delivery's property, as stored


def offset_command(group: str, topic: str, queue_id: int, offset: int) -> bytes:
    """The entry body that commits a consumer group's offset in a queue."""
    doc = {"group": group, "topic": topic, "queue": queue_id, "offset": offset}
    return _OFFSET_MAGIC + json.dumps(doc).encode()


def _is_record(body: bytes | bytearray) -> bool:
    """Whether ``body`` claims to be a record (its magic code); see ``_route`` for whether
    it is one."""
    return len(body) >= 92 and _unpack_i(body, 4)[0] == MAGIC_CODE


def _prefixed(data, heads: np.ndarray) -> bool:
    """Whether any entry starting at ``heads`` in ``data`` has a session prefix (an
    idempotent producer's): its channel, 32 bytes into its header, says."""
    buf = np.frombuffer(data, dtype=np.uint8)
    channels = buf[(heads + 32)[:, None] + np.arange(4)].copy().view(">i4").reshape(-1)
    return bool((channels & SESSION_FLAG).any())


def _route(body: bytes | bytearray) -> tuple[str, int, int] | None:
    """(topic, queue id, sys flag) of a record that dispatch queues, read from its fixed
    layout; None for a body ``decode`` refuses (the CRC aside) or whose topic or queue id
    a put refuses.  The leader's stamp and every member's dispatch both ask here, so an
    entry takes a queue offset exactly when it gets a consume-queue unit: a malformed
    record appended through a plain LedgerClient leaves no gap, and no member trips on it."""
    n = len(body)
    if n < 92:
        return None
    total, magic, _crc, qid = _ROUTE_HEAD.unpack_from(body, 0)
    (body_len,) = _unpack_i(body, _TOPIC_AFTER_BODY)
    at = 88 + body_len
    if magic != MAGIC_CODE or total != n or qid < 0 or body_len < 0 or at + 3 > n:
        return None
    end = at + 1 + body[at]
    if end + 2 > n or end + 2 + _unpack_h(body, end)[0] != n:
        return None
    try:
        topic = bytes(body[at + 1 : end]).decode()
        string_to_properties(bytes(body[end + 2 :]).decode())
    except (UnicodeDecodeError, MessageError):
        return None
    if not valid_topic(topic):
        return None
    return topic, qid, _unpack_i(body, _SYSFLAG_POS)[0]


def _delivery(body: bytes | bytearray) -> tuple[int, int] | None:
    """(level, schedule offset) of a record ``_route`` accepted that is a delayed message's
    delivery (its ``DELAY_OFFSET`` property), else None.  Only a record holding the
    property's name is parsed: the leader asks for every message it stamps."""
    (body_len,) = _unpack_i(body, _TOPIC_AFTER_BODY)
    at = 88 + body_len
    props = at + 1 + body[at] + 2
    if body.find(_MARK, props) < 0:
        return None
    value = string_to_properties(bytes(body[props:]).decode()).get(DELAY_OFFSET)
    return parse_mark(value) if value is not None else None


class CommitLogMachine(StateMachine):
    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.keys = KeyIndex(None)
        self.offsets: dict[str, dict[str, int]] = {}  # group -> "topic\0qid" -> offset
        self.levels = LevelOffsets()  # delay level -> next schedule offset to deliver
        self.delays = parse_delay_levels(DEFAULT_DELAY_LEVELS)
        self.applied = -1
        self.root: Path | None = None
        self.log = None
        self._lock = threading.Lock()  # the table: stamped on the loop, rebuilt on the machine
        self._table: dict[tuple[str, int], int] | None = None  # next offsets, when leading
        self._taken: dict[int, tuple[str, int]] = {}  # index -> queue that advanced for it
        self._levels: LevelOffsets | None = None  # the level offsets as stamped, when leading
        self._level_undo: dict[int, tuple[int, int]] = {}  # index -> (level, offset before)
        self._interval_s, self._last_checkpoint = 0.2, 0.0
        self._stamped: dict[int, int] = {}  # index -> queue offset, until its receipt
        self._high = -1  # the last index stamped: a write at or below it failed before
        self._saved = -1  # the applied index of the last checkpoint

    # -- lifecycle -------------------------------------------------------------------------
    def open(self, ctx: MachineContext) -> int:
        self.log = ctx.log
        # a checkpoint costs an fsync of every queue file: at most one per interval (a
        # restart replays what was dispatched since, after cutting its units)
        self._interval_s = float(ctx.args.get("checkpoint_interval_ms", 200)) / 1000
        self.delays = parse_delay_levels(ctx.args.get("delay_levels", DEFAULT_DELAY_LEVELS))
        if ctx.data_dir is None:
            return -1
        self.root = Path(ctx.data_dir) / "mq"
        self.root.mkdir(parents=True, exist_ok=True)
        cp = {"applied": -1, "units": {}, "offsets": {}}
        if (self.root / "checkpoint.json").exists():
            cp = json.loads((self.root / "checkpoint.json").read_text())
        self.applied, self.offsets = cp["applied"], cp["offsets"]
        self.levels = LevelOffsets.from_json(cp.get("levels", {}))
        self._saved = self.applied
        self.keys = KeyIndex(self.root / "keys")
        self.keys.truncate(cp.get("keys", 0))  # past the checkpoint
        bases = cp.get("bases", {})
        cq_root = self.root / "cq"
        for topic_dir in cq_root.iterdir() if cq_root.exists() else ():
            for qdir in topic_dir.iterdir() if topic_dir.is_dir() else ():
                name = qdir.name
                if not (valid_topic(topic_dir.name) and name.isascii() and name.isdigit()):
                    logger.warning("%s is no consume queue dispatch writes: ignored", qdir)
                    continue
                key = (topic_dir.name, int(qdir.name))
                slot = f"{key[0]}\0{key[1]}"
                q = self.queues[key] = ConsumeQueue(qdir, bases.get(slot, 0))
                q.truncate(cp["units"].get(slot, q.base) - q.base)  # past the checkpoint
        return self.applied

    def saved_index(self) -> int:
        """The last checkpoint's applied index: the log before it is no longer needed."""
        return self._saved

    def snapshot(self):
        """The topic-queue table (each queue's next offset), the consumer offsets, the delay
        levels' offsets and the applied index: what a member whose log is reset past its
        queues needs to continue every queue where the group stands, and to lead
        (``pre_append`` stamps from the table).  The queue units are not in it: they point into log entries such a member
        no longer holds.  A checkpoint is made first, so a restart never finds a snapshot
        newer than its own queues."""
        self._checkpoint()
        table = {f"{t}\0{q}": cq.max_offset for (t, q), cq in self.queues.items()}
        offsets = {g: dict(slots) for g, slots in self.offsets.items()}
        doc = {"applied": self.applied, "next": table, "offsets": offsets,
               "levels": self.levels.snapshot()}  # fmt: skip

        def write(directory: str) -> None:
            with open(os.path.join(directory, _SNAPSHOT_FILE), "w") as f:
                json.dump(doc, f)

        return write

    def load_snapshot(self, path: str, index: int) -> None:
        """Continue after a snapshot of the group's table (the member's log was reset past
        where dispatch stands): every queue starts over empty at its next offset, so pulls
        below it answer OFFSET_TOO_SMALL and the next message dispatched follows on; the
        key index starts over; consumer offsets and delay levels are the snapshot's."""
        try:
            with open(os.path.join(path, _SNAPSHOT_FILE)) as f:
                doc = json.load(f)
            applied, table, offsets = int(doc["applied"]), doc["next"], doc["offsets"]
            levels = LevelOffsets.from_json(doc.get("levels", {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError.of(
                ResponseCode.CORRUPT_SNAPSHOT, f"commit-log snapshot {path}: {exc!r}"
            ) from exc
        if applied > index:
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"snapshot {path} holds the table at {applied}, past {index}",
            )
        logger.warning("commit log continues its consume queues after snapshot %d", index)
        for q in self.queues.values():
            q.close()
        self.keys.close()
        if self.root is not None:
            shutil.rmtree(self.root / "cq", ignore_errors=True)
            (self.root / "keys").unlink(missing_ok=True)
        self.keys = KeyIndex(self.root / "keys" if self.root is not None else None)
        self.queues = {}
        for slot, nxt in table.items():
            topic, qid = slot.split("\0")
            key = (topic, int(qid))
            where = self.root / "cq" / topic / qid if self.root else None
            self.queues[key] = ConsumeQueue(where, int(nxt))
        self.offsets, self.applied, self.levels = offsets, applied, levels
        self._checkpoint()

    def close(self) -> None:
        for q in self.queues.values():
            q.close()
        self.keys.close()

    def _queue(self, key: tuple[str, int]) -> ConsumeQueue:
        q = self.queues.get(key)
        if q is None:
            where = self.root / "cq" / key[0] / str(key[1]) if self.root else None
            q = self.queues[key] = ConsumeQueue(where)
        return q

    # -- the leader's put path -------------------------------------------------------------
    def on_role_change(self, role: Role, term: int) -> None:
        if role is not Role.LEADER:
            with self._lock:
                self._table, self._taken, self._stamped, self._high = None, {}, {}, -1
                self._levels, self._level_undo = None, {}

    def ready_to_lead(self) -> bool:
        """Master only once the ledger end is committed and dispatched: then the consume
        queues hold every message, and the table continues them."""
        log = self.log
        if log is None or not (log.ledger_end_index == log.committed_index == self.applied):
            return False
        with self._lock:
            self._table = {k: q.max_offset for k, q in self.queues.items()}
            self._taken, self._stamped, self._high = {}, {}, -1
            self._levels, self._level_undo = LevelOffsets(self.levels.offsets), {}
        return True

    def pre_append(self, index: int, pos: int, body: bytearray) -> None:
        route = _route(body)
        if route is None:
            if _is_record(body):
                logger.warning("entry %d is a malformed record: not stamped, not queued", index)
            elif (skip := parse_skip(body)) is not None:
                self._stamp_skip(index, *skip)
            return
        topic, qid, sys_flag = route
        key = (topic, qid)
        delivery = _delivery(body) if sys_flag & 0xC in _QUEUED else None
        with self._lock:
            table, levels = self._table, self._levels
            if table is None or levels is None:  # not a ready leader: appends are refused
                return
            if index <= self._high:  # a failed write's entries come again
                self._give_back(index)
            self._high = index
            offset = 0
            if delivery is not None:
                level, before = delivery[0], levels.get(delivery[0])
                if levels.deliver(*delivery):
                    self._level_undo[index] = (level, before)
                else:  # its level is past it: delivered already, void it on every member
                    logger.info("entry %d: delivery %s:%d again, voided", index, *delivery)
                    sys_flag = (sys_flag & ~0xC) | TRANSACTION_ROLLBACK_TYPE
                    struct.pack_into(">i", body, _SYSFLAG_POS, sys_flag)
                    offset = -1
            if sys_flag & 0xC in _QUEUED:
                offset = table.get(key, 0)
                table[key] = offset + 1
                self._taken[index] = key
            self._stamped[index] = offset
        struct.pack_into(">q", body, QUEUE_OFFSET_POS, offset)
        struct.pack_into(">q", body, PHYS_OFFSET_POS, pos + HEADER_SIZE)
        struct.pack_into(">q", body, _STORE_TS_POS, int(time.time() * 1000))

    def _stamp_skip(self, index: int, level: int, start: int, stop: int) -> None:
        """The leader foresees a skip command as every member will apply it."""
        with self._lock:
            levels = self._levels
            if levels is None:
                return
            if index <= self._high:
                self._give_back(index)
            self._high = index
            before = levels.get(level)
            if levels.skip(level, start, stop):
                self._level_undo[index] = (level, before)

    def _give_back(self, index: int) -> None:
        """Undo the stamps of entries ``index..`` (a write that failed): their queue
        offsets are taken again by whatever is written there next, their deliveries and
        skips are the levels' next ones again."""
        for i in [i for i in self._taken if i >= index]:
            self._table[self._taken.pop(i)] -= 1
        for i in sorted((i for i in self._level_undo if i >= index), reverse=True):
            level, before = self._level_undo.pop(i)
            self._levels.offsets[level] = before
        for i in [i for i in self._stamped if i >= index]:
            del self._stamped[i]

    def receipt(self, first: int, last: int) -> list[int | None]:
        """The queue offsets the leader stamped into entries ``first..last`` (None for an
        entry that is no message), so a producer need not read its messages back."""
        with self._lock:
            return [self._stamped.pop(i, None) for i in range(first, last + 1)]

    # -- dispatch ------------------------------------------------------------------------
    def apply(self, entries: list[Entry]) -> None:
        for e in entries:
            body = e.body
            if body.startswith(_OFFSET_MAGIC):
                self._commit_offset(e)
            elif _is_record(body):
                self._dispatch(e)
            elif (skip := parse_skip(body)) is not None:
                if not self.levels.skip(*skip):
                    logger.info("entry %d: skip %s of a level past it: ignored", e.index, skip)
            self.applied = e.index
        with self._lock:  # committed: never given back (stamped in index order)
            for stamps in (self._taken, self._level_undo):
                while stamps and (i := next(iter(stamps))) <= self.applied:
                    del stamps[i]
        if time.monotonic() - self._last_checkpoint >= self._interval_s:
            self._checkpoint()

    def _commit_offset(self, e: Entry) -> None:
        """A consumer group's offset.  A malformed command (a plain LedgerClient can append
        anything) is skipped, alike on every member: raising would stop dispatch for good."""
        try:
            doc = json.loads(e.body[len(_OFFSET_MAGIC) :])
            group, slot = str(doc["group"]), f"{doc['topic']}\0{int(doc['queue'])}"
            offset = int(doc["offset"])
        except (ValueError, KeyError, TypeError) as exc:  # JSON and UTF-8 errors are ValueErrors
            logger.warning("entry %d: malformed consumer-offset command skipped: %r", e.index, exc)
            return
        self.offsets.setdefault(group, {})[slot] = offset

    def _dispatch(self, e: Entry) -> None:
        if _route(e.body) is None:  # as the leader judged it: it took no queue offset
            logger.warning("entry %d: malformed record skipped by dispatch", e.index)
            return
        try:
            m = decode(e.body, verify=False)  # the entry's own CRC was checked
        except MessageError as exc:  # _route checked what decode checks: not expected
            logger.warning("entry %d: undecodable record skipped: %s", e.index, exc)
            return
        if m.transaction_type not in _QUEUED:
            return  # prepared and rolled-back messages are not consumable
        value = m.properties.get(DELAY_OFFSET)
        if value is not None and (delivery := parse_mark(value)) is not None:
            level, offset = delivery  # the leader took it as its level's next (or voided it)
            self.levels.offsets[level] = max(self.levels.get(level), offset + 1)
        q = self._queue((m.topic, m.queue_id))
        if not len(q):  # an empty queue continues at its first message's offset
            q.base = m.queue_offset
        q.append(e.pos + HEADER_SIZE, len(e.body), tag_hash(m.tags), e.index)
        self.keys.add(m.topic, m.keys, e.index)

    def _checkpoint(self) -> None:
        self._last_checkpoint = time.monotonic()
        if self.root is None:
            return
        for q in self.queues.values():
            q.flush()
        self.keys.flush()
        cp = {
            "applied": self.applied,
            "units": {f"{t}\0{q}": cq.max_offset for (t, q), cq in self.queues.items()},
            "bases": {f"{t}\0{q}": cq.base for (t, q), cq in self.queues.items() if cq.base},
            "keys": len(self.keys),
            "offsets": self.offsets,
            "levels": self.levels.snapshot(),
        }
        tmp = self.root / "checkpoint.json.tmp"
        with open(tmp, "w") as f:
            json.dump(cp, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / "checkpoint.json")
        self._saved = self.applied

    # -- reads -----------------------------------------------------------------------------
    def query(self, request: Any) -> Any:
        if not isinstance(request, tuple) or not request:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"bad query {request!r}")
        kind, args = request[0], request[1:]
        handler = {
            "pull": self._pull,
            "max_offset": lambda t, q: self._queue_if((t, q)).max_offset,
            "topics": self._topics,
            "consumer_offset": self._consumer_offset,
            "get_message": self._get_message,
            "by_key": self._by_key,
            "consumer_groups": lambda: {g: dict(s) for g, s in self.offsets.items()},
            "schedule": self._schedule,
        }.get(kind)
        if handler is None:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"unknown query {kind!r}")
        return handler(*args)

    def _queue_if(self, key: tuple[str, int]) -> ConsumeQueue:
        q = self.queues.get(key)  # an empty queue is falsy: it may stand past offset 0
        return q if q is not None else ConsumeQueue(None)

    def _pull(self, topic: str, queue_id: int, offset: int, max_msgs: int) -> dict:
        """Up to ``max_msgs`` records of a queue from ``offset`` as one buffer, ``data``, and
        each record's ``(start, end)`` in it, ``bounds`` (the consumer decodes them).  Two
        objects cross Ray, not thousands: a list of 4,000 records spent more time in Ray's
        serialisation than the member spent finding them."""
        q = self._queue_if((topic, queue_id))
        offset = max(0, offset)
        low = q.min_offset(self.log.ledger_begin_index if self.log is not None else 0)
        out = {"first_offset": offset, "min_offset": low, "max_offset": q.max_offset}
        if offset < low:  # RocketMQ's OFFSET_TOO_SMALL: the consumer moves on to ``low``
            return {**out, "data": b"", "bounds": np.empty((0, 2), np.int64),
                    "next_offset": low, "status": "OFFSET_TOO_SMALL"}  # fmt: skip
        units, indexes = q.units(offset, max_msgs)
        data, bounds = self._records(units, indexes)
        status = "FOUND" if len(indexes) else (
            "NO_NEW_MSG" if offset == q.max_offset else "OFFSET_OVERFLOW_BADLY")  # fmt: skip
        return {**out, "data": data, "bounds": bounds, "next_offset": offset + len(indexes),
                "status": status}  # fmt: skip

    def _records(self, units: np.ndarray, indexes: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The entry bodies at ``indexes`` (ascending) and their bounds.  Close together (a
        queue of a busy topic) they are one batch read, whose offsets are the units'
        positions unless the span crosses a segment end; far apart, one read each."""
        n = len(indexes)
        if not n:
            return b"", np.empty((0, 2), np.int64)
        sizes = units["size"].astype(np.int64)
        first, last = int(indexes[0]), int(indexes[-1])
        if last - first + 1 > 4 * n:
            data = b"".join(self.log.get(i).body for i in indexes.tolist())
            ends = np.cumsum(sizes)
            return data, np.stack([ends - sizes, ends], axis=1)
        data = self.log.read_batch(first, max_count=last - first + 1).data
        phys = units["phys"].astype(np.int64)
        base = int(phys[0]) - HEADER_SIZE  # the first entry's position
        if len(data) == int(phys[-1] + sizes[-1]) - base:  # one run: no segment padding
            starts = phys - base
            if not _prefixed(data, starts - HEADER_SIZE):  # else each body is further in
                return data, np.stack([starts, starts + sizes], axis=1)
        wanted, at, out = set(indexes.tolist()), 0, []
        unpack = HEADER.unpack_from
        while at < len(data):  # an idempotent producer's entry starts with its session prefix
            _magic, size, index, _term, _pos, channel = unpack(data, at)[:6]
            if index in wanted:
                out.append((at + HEADER_SIZE + body_skip(channel), at + size))
            at += size
        return data, np.array(out, np.int64).reshape(-1, 2)

    def _by_key(self, topic: str, key: str, max_msgs: int = 32) -> list:
        """The latest committed messages of ``topic`` with ``key`` among their keys (RocketMQ's
        queryMessage by key), oldest first."""
        out = []
        for index in self.keys.lookup(topic, key, max_msgs):
            if index < self.log.ledger_begin_index:
                continue  # compacted away
            m = decode(self.log.get(index).body)
            if m.topic == topic and key in split_keys(m.keys):  # not a hash collision
                out.append(m)
        return out

    def _topics(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for (t, q), cq in sorted(self.queues.items()):
            out.setdefault(t, {})[q] = cq.max_offset
        return out

    def _schedule(self) -> dict:
        """The delay table and, per level, its delivered offset and its schedule queue's
        max offset (what the schedule service needs to know whether to read it)."""
        begin = self.log.ledger_begin_index if self.log is not None else 0
        levels = {}
        for level in range(1, len(self.delays) + 1):
            q = self._queue_if((SCHEDULE_TOPIC, level - 1))
            levels[level] = (self.levels.get(level), q.max_offset, q.min_offset(begin))
        return {"delays": list(self.delays), "levels": levels}

    def _consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.get(group, {}).get(f"{topic}\0{queue_id}", -1)

    def _get_message(self, phys: int):
        """The committed message whose record starts at ``phys`` (None when there is none)."""
        log = self.log
        lo, hi = log.ledger_begin_index, min(log.committed_index, self.applied) + 1
        i = bisect.bisect_left(range(lo, hi), phys - HEADER_SIZE, key=log.get_pos) + lo
        if i >= hi or log.get_pos(i) != phys - HEADER_SIZE:
            return None
        body = log.get(i).body
        return decode(body) if _route(body) is not None else None
