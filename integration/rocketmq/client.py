"""CommitLog: produce and consume RocketMQ-format messages on a group running CommitLogMachine.

DLedger's codes map to RocketMQ's PutMessageStatus (``put_status``): NOT_LEADER,
LEADER_NOT_READY, DISK_FULL and no leader before the deadline -> SERVICE_NOT_AVAILABLE; a
quorum timeout or a leader whose pending queue stayed full -> OS_PAGECACHE_BUSY; a message
RocketMQ refuses -> MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED with nothing stored; any
other unknown outcome -> UNKNOWN_ERROR.  Nothing whose outcome is unknown is retried.

Delayed messages (``delay_level``) are parked in ``SCHEDULE_TOPIC_XXXX`` and delivered to
their real queue, exactly once, by the group's schedule service once their level's delay
has passed (schedule.py, schedule_service.py); the levels' delays are the group's
``delay_levels`` (RocketMQ's messageDelayLevel).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rayledger.actors import LedgerConfig, LedgerError, LedgerGroup, OutcomeUnknownError
from rayledger.storage import ResponseCode
from rayledger.storage.codec import HEADER_SIZE

from .commitlog import offset_command
from .message import (
    TRANSACTION_NOT_TYPE,
    Message,
    MessageError,
    PulledMessage,
    PutMessageStatus,
    check_topic,
    decode,
    encode,
    msg_id,
    pulled_messages,
)
from .schedule import (
    DEFAULT_DELAY_LEVELS,
    DELAY_OFFSET,
    PARKING,
    SCHEDULE_TOPIC,
    parse_delay_levels,
)
from .schedule_service import ensure_service, stop_service

MACHINE = "rayledger.integration.rocketmq.commitlog:CommitLogMachine"

_STATUS = {
    ResponseCode.NOT_LEADER: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.LEADER_NOT_READY: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.DISK_FULL: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT: PutMessageStatus.OS_PAGECACHE_BUSY,
    ResponseCode.LEADER_PENDING_FULL: PutMessageStatus.OS_PAGECACHE_BUSY,
    ResponseCode.TIMEOUT: PutMessageStatus.SERVICE_NOT_AVAILABLE,
}


def put_status(exc: LedgerError) -> PutMessageStatus:
    """RocketMQ's status for an append the LedgerClient failed.

    A quorum timeout (OutcomeUnknownError with WAIT_QUORUM_ACK_TIMEOUT) is
    OS_PAGECACHE_BUSY, RocketMQ's answer when the store is too slow; like its
    FLUSH_SLAVE_TIMEOUT, the message may still have been stored (the leader wrote it and
    a later leader may commit it), so ``PutMessageResult.outcome_unknown`` is set.  A
    leader whose pending queue stayed full until the deadline is OS_PAGECACHE_BUSY too
    (nothing stored).  Other unknown outcomes (a member died mid-call, the deadline
    passed in flight) are UNKNOWN_ERROR."""
    if _maybe_stored(exc) and exc.code is not ResponseCode.WAIT_QUORUM_ACK_TIMEOUT:
        return PutMessageStatus.UNKNOWN_ERROR
    cause = exc.__cause__  # the LedgerClient retries a full queue, then says TIMEOUT
    if exc.code is ResponseCode.TIMEOUT and isinstance(cause, LedgerError):
        return _STATUS.get(cause.code, PutMessageStatus.SERVICE_NOT_AVAILABLE)
    return _STATUS.get(exc.code, PutMessageStatus.UNKNOWN_ERROR)


def _maybe_stored(exc: LedgerError) -> bool:
    """The member may have stored the append (the LedgerClient keeps a member's code, such
    as WAIT_QUORUM_ACK_TIMEOUT, on the OutcomeUnknownError it raises)."""
    return isinstance(exc, OutcomeUnknownError) or exc.code is ResponseCode.WAIT_QUORUM_ACK_TIMEOUT


@dataclass(frozen=True)
class PutMessageResult:
    """A put's answer.  ``outcome_unknown``: not acknowledged, yet it may have been stored
    (UNKNOWN_ERROR, or OS_PAGECACHE_BUSY after a quorum timeout); check before putting it
    again, or accept a duplicate."""

    status: PutMessageStatus
    msg_id: str | None = None
    wrote_offset: int = -1
    queue_offset: int = -1
    index: int = -1  # the ledger entry
    error: str = ""
    outcome_unknown: bool = False

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@dataclass(frozen=True)
class PullResult:
    """A pull's messages and where to go on.  ``status`` is RocketMQ's: FOUND,
    NO_NEW_MSG, OFFSET_TOO_SMALL (the offset asked is gone -- the log was compacted or the
    member rebuilt its queues from a reset log --: ``next_offset`` is the lowest one still
    readable) or OFFSET_OVERFLOW_BADLY (past the queue's end)."""

    messages: list[Message]
    next_offset: int
    max_offset: int
    status: str = "FOUND"
    min_offset: int = 0


logger = logging.getLogger("rayledger.integration.rocketmq")

OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"


def _moved(topic: str, queue_id: int, r: PullResult) -> None:
    logger.warning("%s/%d: the messages before offset %d are gone (the log was compacted): "
                   "consuming on from there", topic, queue_id, r.next_offset)  # fmt: skip


def _host() -> tuple[str, int]:
    try:
        return socket.gethostbyname(socket.gethostname()), 0
    except OSError:
        return "127.0.0.1", 0


class CommitLog:
    def __init__(self, group: LedgerGroup, timeout_s: float = 30.0):
        self.group = group
        self.client = group.client(timeout_s=timeout_s)
        self.host = _host()
        args = getattr(getattr(group, "config", None), "state_machine_args", None) or {}
        #: each delay level's delay in ms (level L is ``delays[L - 1]``)
        self.delays = parse_delay_levels(args.get("delay_levels", DEFAULT_DELAY_LEVELS))

    @classmethod
    def create(
        cls, name: str, members=3, store_dir=None, config: LedgerConfig | None = None,
        delay_levels: str | None = None,
    ) -> CommitLog:  # fmt: skip
        """Start a group running the commit log, and its schedule service.
        ``delay_levels``: RocketMQ's messageDelayLevel ("1s 5s 10s ... 2h", the default;
        units ms/s/m/h/d), LedgerError(UNEXPECTED_ARGUMENT) when malformed."""
        config = replace(config or LedgerConfig(), state_machine=MACHINE)
        if delay_levels is not None:
            parse_delay_levels(delay_levels)  # before any actor starts
            args = {**config.state_machine_args, "delay_levels": delay_levels}
            config = replace(config, state_machine_args=args)
        group = LedgerGroup.create(name, members, store_dir=store_dir, config=config)
        group.wait_for_leader(timeout_s=60)
        ensure_service(name)
        return cls(group)

    @classmethod
    def connect(cls, name: str) -> CommitLog:
        """Attach to a running commit log (and start its schedule service unless it runs)."""
        log = cls(LedgerGroup.get(name))
        ensure_service(name)
        return log

    def shutdown(self, delete_data: bool = False) -> None:
        """Stop the schedule service, then the group."""
        stop_service(self.group.name)
        self.group.shutdown(delete_data=delete_data)

    def schedule_offsets(self) -> dict[int, tuple[int, int]]:
        """Per delay level: (the next parked message to deliver, how many were parked),
        i.e. RocketMQ's delayOffset.json and the schedule queue's max offset."""
        state = self.client.query(("schedule",))
        return {lvl: (off, hi) for lvl, (off, hi, _lo) in state["levels"].items()}

    # -- producing -------------------------------------------------------------------------
    def _message(self, topic, queue_id, body, tags, keys, properties, flag, delay_level):
        """The Message to store; MessageError(MESSAGE_ILLEGAL) for a topic, queue id or
        delay level RocketMQ refuses (before the delay redirects it to the schedule topic,
        which would hide the real ones), and for the properties the schedule service owns."""
        check_topic(topic)
        if topic == SCHEDULE_TOPIC:
            raise MessageError(PutMessageStatus.MESSAGE_ILLEGAL, f"{topic} is a system topic")
        if type(queue_id) is not int or queue_id < 0:
            raise MessageError(PutMessageStatus.MESSAGE_ILLEGAL, f"bad queue id {queue_id!r}")
        levels = len(self.delays)
        if type(delay_level) is not int or not 0 <= delay_level <= levels:
            raise MessageError(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"delay level {delay_level!r} is not 0 (none) or 1..{levels}",
            )
        props = dict(properties or {})
        reserved = {DELAY_OFFSET, *PARKING} & set(props)
        if reserved:
            raise MessageError(PutMessageStatus.MESSAGE_ILLEGAL,
                               f"properties {sorted(reserved)} are the schedule service's")  # fmt: skip
        if tags is not None:
            props["TAGS"] = tags
        if keys is not None:
            props["KEYS"] = keys
        if delay_level:  # RocketMQ parks delayed messages in the schedule topic
            props.update(REAL_TOPIC=topic, REAL_QID=str(queue_id), DELAY=str(delay_level))
            topic, queue_id = SCHEDULE_TOPIC, delay_level - 1
        now = int(time.time() * 1000)
        return Message(
            topic, body, queue_id=queue_id, flag=flag, properties=props,
            born_timestamp=now, born_host=self.host, store_host=self.host,
        )  # fmt: skip

    def put_message(
        self, topic: str, queue_id: int, body: bytes, tags: str | None = None,
        keys: str | None = None, properties: dict | None = None, flag: int = 0,
        delay_level: int = 0,
    ) -> PutMessageResult:  # fmt: skip
        try:
            m = self._message(topic, queue_id, body, tags, keys, properties, flag, delay_level)
        except MessageError as exc:
            return PutMessageResult(exc.status, error=exc.message)
        return self._put([m])[0]

    def put_messages(self, messages: list[dict]) -> list[PutMessageResult]:
        """A batch: one entry per message and one commit wait.  Delayed and transactional
        messages are refused in a batch, as DLedger does."""
        ms = []
        for kw in messages:
            if kw.get("delay_level") or kw.get("sys_flag", 0) & 0xC:
                r = PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, error="no delayed or "
                                     "transactional messages in a batch")  # fmt: skip
                return [r] * len(messages)
            try:
                ms.append(
                    self._message(
                        kw["topic"],
                        kw.get("queue_id", 0),
                        kw["body"],
                        kw.get("tags"),
                        kw.get("keys"),
                        kw.get("properties"),
                        kw.get("flag", 0),
                        0,
                    )  # fmt: skip
                )
            except MessageError as exc:  # one bad message refuses the batch
                return [PutMessageResult(exc.status, error=exc.message)] * len(messages)
        return self._put(ms)

    def _put(self, ms: list[Message]) -> list[PutMessageResult]:
        try:
            bodies = [encode(m) for m in ms]
        except MessageError as exc:
            return [PutMessageResult(exc.status, error=exc.message)] * len(ms)
        try:
            results = self.client.append_batch(bodies)
        except LedgerError as exc:
            r = PutMessageResult(
                put_status(exc), error=str(exc), outcome_unknown=_maybe_stored(exc)
            )
            return [r] * len(ms)
        # the leader stamped the queue offsets: its receipts say which (read them back when
        # a receipt is missing, e.g. the machine failed to give one)
        offsets = [r.receipt for r in results]
        if None in offsets:
            stored = self.client.read(results[0].index, results[-1].index + 1, "committed")
            # only the entries of these results: a large batch goes in several calls, so a
            # configuration entry or another client's append may sit between them
            mine = {e.index: e for e in stored if not e.channel}
            offsets = [decode(mine[r.index].body, verify=False).queue_offset for r in results]
        out = []
        for r, m, offset in zip(results, ms, offsets, strict=True):
            wrote = r.pos + HEADER_SIZE
            out.append(PutMessageResult(PutMessageStatus.PUT_OK, msg_id(m.store_host, wrote),
                                        wrote, offset, r.index))  # fmt: skip
        return out

    # -- consuming -------------------------------------------------------------------------
    def pull(
        self, topic: str, queue_id: int, offset: int, max_msgs: int = 32, member: str | None = None
    ) -> PullResult:
        """Committed messages of a queue from ``offset`` (any member: ``member="any"``)."""
        r = self.client.query(("pull", topic, queue_id, offset, max_msgs), "committed", member)
        # decoded on first use; the queue offset is the consume queue's
        msgs = pulled_messages(r["data"], r["bounds"], r["first_offset"])
        return PullResult(msgs, r["next_offset"], r["max_offset"], r.get("status", "FOUND"),
                          r.get("min_offset", 0))  # fmt: skip

    def consume(
        self, topic: str, queue_id: int, offset: int = 0, batch: int = 4000,
        member: str | None = None, stop_at: int | None = None,
    ) -> Iterator[PulledMessage]:  # fmt: skip
        """The queue's committed messages from ``offset`` up to ``stop_at`` (default: its max
        offset when called), with the next pull always in flight while the caller works on
        the last one (as RocketMQ's pull service prefetches into the process queue)."""
        if stop_at is None:
            stop_at = self.max_offset(topic, queue_id)
        with ThreadPoolExecutor(1, thread_name_prefix="rayledger-pull") as pool:

            def pull(at: int):
                return pool.submit(self.pull, topic, queue_id, at, min(batch, stop_at - at), member)

            nxt = pull(offset) if offset < stop_at else None
            while nxt is not None:
                r = nxt.result()
                if r.status == OFFSET_TOO_SMALL:  # gone: go on from the lowest one left
                    _moved(topic, queue_id, r)
                    nxt = pull(r.next_offset) if r.next_offset < stop_at else None
                    continue
                if not r.messages:
                    return
                nxt = pull(r.next_offset) if r.next_offset < stop_at else None
                yield from r.messages

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.client.query(("max_offset", topic, queue_id))

    def topics(self) -> dict[str, dict[int, int]]:
        return self.client.query(("topics",))

    def query_message(self, topic: str, key: str, max_msgs: int = 32) -> list[Message]:
        """The latest committed messages of ``topic`` carrying ``key`` (RocketMQ's
        queryMessage by key), oldest first."""
        return self.client.query(("by_key", topic, key, max_msgs))

    def get_message(self, phys_offset: int) -> Message | None:
        """The committed message at ``phys_offset`` (RocketMQ's viewMessage by the offset a
        put's receipt or a message carries), or None when there is none there."""
        return self.client.query(("get_message", phys_offset))

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A consumer group's offset, committed through the ledger (it survives failovers)."""
        self.client.append(offset_command(group, topic, queue_id, offset))

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self.client.query(("consumer_offset", group, topic, queue_id))

    def follow(
        self, topic: str, group: str | None = None, poll_s: float = 0.05
    ) -> Iterator[Message]:
        """Yield the topic's messages as they commit, queue by queue (with ``group``, from
        and committing its offsets)."""
        nxt: dict[int, int] = {}
        while True:
            queues = self.topics().get(topic, {})
            got = False
            for qid in sorted(queues):
                if qid not in nxt:
                    nxt[qid] = max(0, self.fetch_offset(group, topic, qid)) if group else 0
                r = self.pull(topic, qid, nxt[qid])
                yield from r.messages
                if r.status == OFFSET_TOO_SMALL:
                    _moved(topic, qid, r)
                if r.messages or r.status == OFFSET_TOO_SMALL:
                    got = True
                    nxt[qid] = r.next_offset
                    if group:
                        self.commit_offset(group, topic, qid, nxt[qid])
            if not got:
                time.sleep(poll_s)


__all__ = ["CommitLog", "PullResult", "PutMessageResult", "TRANSACTION_NOT_TYPE", "put_status"]
