"""Broker clusters: a topic's queues spread over several broker groups, as in RocketMQ.

With DLedger every RocketMQ broker group (a master and its slaves) is one DLedger group; here
each broker group is one commit-log group (:class:`~.client.CommitLog`), named
``NAME-b0`` ..., and a :class:`BrokerCluster` is N of them found by name from a layout kept
in Ray's GCS key-value store (:class:`~rayledger.integration.topic.layout.LayoutStore`), so
any driver attaches to it.  Broker ``i``'s preferred leader is its member ``i mod members``:
with members placed round robin over the nodes, the masters spread over the nodes.

Routing is RocketMQ's: a topic has ``queues_per_broker`` write queues on every broker group,
and a :class:`MessageQueue` is (topic, broker group, queue id).  A route lists them broker by
broker, queue by queue.  The :class:`Producer` (RocketMQ's DefaultMQProducer)

* sends round robin over the route, and when a broker group refuses a message with nothing
  stored (SERVICE_NOT_AVAILABLE, or OS_PAGECACHE_BUSY without an unknown outcome) sends it
  to a queue of another broker group, up to ``retry_times_when_send_failed`` more times
  (default 2), and keeps off the failed broker group for ``fault_isolation_s``
  (sendLatencyFaultEnable, simplified: a failure isolates, a success clears);
* never resends a message whose outcome is unknown (UNKNOWN_ERROR, or OS_PAGECACHE_BUSY
  after a quorum timeout): it may be stored, and a resend could store it twice;
* sends a message with a ``sharding_key`` to queue ``crc32(key bytes) mod len(route)`` of
  the route (a ``str`` key as UTF-8; :func:`rayledger.integration.topic.partition_of`), or
  where a ``selector`` says (RocketMQ's MessageQueueSelector), and never elsewhere: ordered
  messages fail rather than change queues.

Consumers (:class:`PullConsumer`) pull any message queue and consume every queue of every
broker group, with each queue's offset committed through its broker group's ledger.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import ray
from rayledger.actors import LedgerConfig, LedgerError, LedgerGroup, ResponseCode
from rayledger.actors.group import check_group_args, start_groups
from rayledger.actors.naming import NAMESPACE, group_members
from rayledger.integration.topic.layout import LayoutStore, now_ms
from rayledger.integration.topic.routing import partition_of

from .client import OFFSET_TOO_SMALL, CommitLog, PullResult, PutMessageResult
from .message import Message, MessageError, PutMessageStatus, check_topic

logger = logging.getLogger("rayledger.integration.rocketmq.brokers")

#: Ray's KV namespace of the broker clusters' layouts (one JSON document per cluster).
BROKERS_NAMESPACE = "rayledger-brokers"
#: the property carrying a producer's unique message id (RocketMQ's UNIQ_KEY).
UNIQ_KEY = "UNIQ_KEY"
DEFAULT_QUEUES_PER_BROKER = 4  # RocketMQ's defaultTopicQueueNums
# refused with nothing stored: another broker group may take the message
_RETRIABLE = {PutMessageStatus.SERVICE_NOT_AVAILABLE, PutMessageStatus.OS_PAGECACHE_BUSY}


def _bad(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, msg)


def _count(what: str, n: object) -> int:
    """``n`` when it is an int >= 1 (not a bool), else UNEXPECTED_ARGUMENT."""
    if type(n) is not int or n < 1:
        raise _bad(f"{what} must be an int >= 1, got {n!r}")
    return n


def broker_group(cluster: str, index: int) -> str:
    """The name of broker group ``index`` of ``cluster``."""
    return f"{cluster}-b{index}"


@dataclass(frozen=True)
class BrokerClusterLayout:
    """What a cluster is made of: ``broker_groups`` commit-log groups ``NAME-b0`` ..., each
    of ``members`` members under ``store_dir`` (None: memory stores); every topic has
    ``queues_per_broker`` queues per broker group unless ``topics`` names its own count."""

    name: str
    broker_groups: int
    members: list[str]
    store_dir: str | None
    queues_per_broker: int = DEFAULT_QUEUES_PER_BROKER
    topics: dict[str, int] = field(default_factory=dict)
    created_ms: int = 0
    hash: str = "crc32"  # the sharding key's hash (routing.partition_of)

    @property
    def brokers(self) -> list[str]:
        return [broker_group(self.name, i) for i in range(self.broker_groups)]

    def queues_of(self, topic: str) -> int:
        return self.topics.get(topic, self.queues_per_broker)


LAYOUTS: LayoutStore[BrokerClusterLayout] = LayoutStore(
    BrokerClusterLayout, BROKERS_NAMESPACE, "broker cluster"
)


@dataclass(frozen=True, order=True)
class MessageQueue:
    """RocketMQ's MessageQueue: one queue of a topic on one broker group."""

    topic: str
    broker: str
    queue_id: int


@dataclass(frozen=True)
class TopicRoute:
    """RocketMQ's TopicRouteData, reduced to what routes: the topic's broker groups, each
    with ``queues_per_broker`` queues (read = write queues)."""

    topic: str
    brokers: tuple[str, ...]
    queues_per_broker: int

    @property
    def queues(self) -> list[MessageQueue]:
        """Every message queue, broker by broker then queue by queue (the order the
        round robin and the sharding-key hash index)."""
        return [MessageQueue(self.topic, b, q) for b in self.brokers
                for q in range(self.queues_per_broker)]  # fmt: skip

    def check(self, mq: object) -> MessageQueue:
        """``mq`` when it is one of the route's queues, else UNEXPECTED_ARGUMENT."""
        if (
            not isinstance(mq, MessageQueue)
            or mq.topic != self.topic
            or mq.broker not in self.brokers
            or type(mq.queue_id) is not int
            or not 0 <= mq.queue_id < self.queues_per_broker
        ):
            raise _bad(
                f"{mq!r} is no message queue of topic {self.topic!r}: its broker groups are "
                f"{list(self.brokers)}, with queues 0..{self.queues_per_broker - 1}"
            )
        return mq


@dataclass(frozen=True)
class SendResult:
    """A send's answer (RocketMQ's SendResult).  ``msg_id`` is the producer's unique id (the
    message's UNIQ_KEY property), ``offset_msg_id`` the broker's (store host + offset).
    ``attempts``: the broker groups tried before, with what each answered.
    ``outcome_unknown``: not acknowledged, yet it may be stored; it was not sent again."""

    status: PutMessageStatus
    mq: MessageQueue | None = None
    queue_offset: int = -1
    msg_id: str | None = None
    offset_msg_id: str | None = None
    wrote_offset: int = -1
    error: str = ""
    outcome_unknown: bool = False
    attempts: tuple[tuple[str, PutMessageStatus], ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    @property
    def broker(self) -> str | None:
        return None if self.mq is None else self.mq.broker

    @property
    def queue_id(self) -> int:
        return -1 if self.mq is None else self.mq.queue_id


Selector = Callable[[list[MessageQueue], "str | bytes"], MessageQueue]


def select_by_hash(mqs: list[MessageQueue], key: str | bytes) -> MessageQueue:
    """RocketMQ's SelectMessageQueueByHash with a stable hash: ``crc32(key) % len(mqs)``."""
    return mqs[partition_of(key, len(mqs))]


class _Faults:
    """Broker groups to keep off until a time (sendLatencyFaultEnable, simplified)."""

    def __init__(self, isolation_s: float):
        self.isolation_s = isolation_s
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, broker: str) -> None:
        with self._lock:
            self._until[broker] = time.monotonic() + self.isolation_s

    def succeeded(self, broker: str) -> None:
        with self._lock:
            self._until.pop(broker, None)

    def available(self, broker: str) -> bool:
        with self._lock:
            until = self._until.get(broker)
            return until is None or time.monotonic() >= until

    def isolated(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return sorted(b for b, t in self._until.items() if t > now)


class BrokerCluster:
    """N broker groups (commit-log groups ``NAME-b0`` ...) serving topics together."""

    def __init__(self, layout: BrokerClusterLayout):
        self.layout = layout
        self._logs: dict[str, CommitLog] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def brokers(self) -> list[str]:
        """The broker groups' names, in order."""
        return self.layout.brokers

    # -- creating and finding -------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        broker_groups: int = 2,
        members: int | Sequence[str] = 3,
        store_dir: str | os.PathLike | None = None,
        config: LedgerConfig | None = None,
        *,
        queues_per_broker: int = DEFAULT_QUEUES_PER_BROKER,
        delay_levels: str | None = None,
    ) -> BrokerCluster:
        """Start ``broker_groups`` commit-log groups; every argument is checked before any
        actor starts, and a cluster whose groups did not all start is taken down again.
        UNEXPECTED_ARGUMENT for bad counts, a cluster of that name, or a group already
        running under a broker group's name."""
        _count("broker_groups", broker_groups)
        _count("queues_per_broker", queues_per_broker)
        ids, config, store_dir = check_group_args("cluster", name, members, store_dir, config)
        if LAYOUTS.load(name) is not None:
            raise _bad(f"a broker cluster named {name!r} already exists")
        layout = BrokerClusterLayout(name, broker_groups, ids, store_dir, queues_per_broker,
                                     created_ms=now_ms())  # fmt: skip
        taken = [g for g in layout.brokers if group_members(g)]
        if taken:
            raise _bad(f"groups {taken} already run under broker group names of {name!r}")
        LAYOUTS.save(layout)  # the broker groups' names are the cluster's from here on
        try:
            started = start_groups(
                layout.brokers,
                ids,
                config,
                lambda g, cfg: CommitLog.create(g, ids, store_dir, cfg, delay_levels),
                lambda log: log.shutdown(delete_data=True),
                workers=4,
            )
        except BaseException:
            LAYOUTS.forget(name)
            raise
        cluster = cls(layout)
        cluster._logs = {log.group.name: log for log in started}
        try:  # a fresh leader hands over to its preferred member and takes office (its
            # first entry committed: seconds on a busy host) before it takes messages
            cluster.wait_for_leaders(60, preferred=True)
            for log in started:
                log.topics()
        except LedgerError as exc:
            logger.warning("broker cluster %s is not settled yet: %s", name, exc)
        logger.info("broker cluster %s started: %d broker groups of %s", name, broker_groups, ids)
        return cluster

    @classmethod
    def get(cls, name: str) -> BrokerCluster:
        """Attach to a cluster by name (from any driver or Ray job); UNKNOWN_GROUP when none."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        return cls(LAYOUTS.require(name))

    connect = get

    @staticmethod
    def list() -> list[str]:
        """The names of the broker clusters on the Ray cluster."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        return LAYOUTS.names()

    def _name(self, broker: str | int) -> str:
        """A broker group's name from its name or index; UNEXPECTED_ARGUMENT when it is not
        one of the cluster's."""
        if isinstance(broker, int) and not isinstance(broker, bool):
            if not 0 <= broker < self.layout.broker_groups:
                raise _bad(f"cluster {self.name!r} has broker groups 0.."
                           f"{self.layout.broker_groups - 1}, not {broker}")  # fmt: skip
            return self.brokers[broker]
        if broker not in self.brokers:
            raise _bad(f"{broker!r} is no broker group of cluster {self.name!r}: {self.brokers}")
        return broker

    def broker(self, broker: str | int, timeout_s: float = 30.0) -> CommitLog:
        """Broker group ``broker``'s commit log (by name or index; cached per timeout)."""
        broker = self._name(broker)
        key = broker if timeout_s == 30.0 else f"{broker}@{timeout_s}"
        with self._lock:
            log = self._logs.get(key)
        if log is None:
            log = CommitLog(LedgerGroup.get(broker), timeout_s=timeout_s)
            with self._lock:
                log = self._logs.setdefault(key, log)
        return log

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, topic: str, queues_per_broker: int | None = None) -> TopicRoute:
        """Give ``topic`` its own number of queues per broker group (RocketMQ's updateTopic;
        a topic never created has the cluster's default).  MESSAGE_ILLEGAL for a topic name
        RocketMQ refuses, UNEXPECTED_ARGUMENT for a bad count or one that changes an
        existing topic's (that would move its sharding keys).  The layout is read, changed
        and written back: create topics from one driver at a time."""
        check_topic(topic)
        layout = LAYOUTS.require(self.name)
        n = layout.queues_per_broker if queues_per_broker is None else queues_per_broker
        _count("queues_per_broker", n)
        have = layout.topics.get(topic)
        if have is not None and have != n:
            raise _bad(f"topic {topic!r} of cluster {self.name!r} has {have} queues per "
                       f"broker group, not {n}")  # fmt: skip
        if have is None:
            layout = replace(layout, topics={**layout.topics, topic: n})
            LAYOUTS.save(layout)
        self.layout = layout
        return self.route(topic)

    def route(self, topic: str) -> TopicRoute:
        """The topic's message queues (MessageError(MESSAGE_ILLEGAL) for a bad topic)."""
        check_topic(topic)
        return TopicRoute(topic, tuple(self.brokers), self.layout.queues_of(topic))

    def refresh(self) -> BrokerClusterLayout:
        """Read the layout again (topics created by other drivers)."""
        self.layout = LAYOUTS.require(self.name)
        return self.layout

    def topics(self) -> dict[str, dict[str, dict[int, int]]]:
        """Per topic, per broker group: each queue's max offset (broker groups that do not
        answer are left out, logged)."""
        out: dict[str, dict[str, dict[int, int]]] = {}
        for b in self.brokers:
            try:
                queues = self.broker(b).topics()
            except LedgerError as exc:
                logger.warning("broker group %s did not list its topics: %s", b, exc)
                continue
            for topic, qs in queues.items():
                out.setdefault(topic, {})[b] = qs
        return out

    # -- clients -----------------------------------------------------------------------------
    def producer(self, **kwargs) -> Producer:
        """A :class:`Producer` over the cluster (keyword arguments: its settings)."""
        return Producer(self, **kwargs)

    def consumer(self, group: str | None = None, **kwargs) -> PullConsumer:
        """A :class:`PullConsumer`; with ``group`` it consumes from and commits that
        consumer group's offsets."""
        return PullConsumer(self, group, **kwargs)

    # -- watching and stopping ----------------------------------------------------------------
    def preferred_leader(self, broker: str | int) -> str:
        """The member broker group ``broker``'s leadership goes to when it can."""
        index = self.brokers.index(self._name(broker))
        return self.layout.members[index % len(self.layout.members)]

    def wait_for_leaders(self, timeout_s: float = 60.0, preferred: bool = False) -> dict[str, str]:
        """Each broker group's master, once every group has one (``preferred``: once each is
        led by its preferred member, as after a start settles; TIMEOUT otherwise)."""
        deadline = time.monotonic() + timeout_s
        leaders = {
            b: self.broker(b).group.wait_for_leader(max(0.1, deadline - time.monotonic()))
            for b in self.brokers
        }  # one deadline for them all
        want = {b: self.preferred_leader(b) for b in self.brokers}
        while preferred and leaders != want:
            if time.monotonic() > deadline:
                raise LedgerError.of(ResponseCode.TIMEOUT,
                                     f"cluster {self.name!r}: masters {leaders}, preferred {want}")  # fmt: skip
            time.sleep(0.1)
            leaders = {r["broker"]: r["leader"] for r in self.status()}
        return leaders

    def status(self, timeout_s: float = 2.0) -> list[dict]:
        """Per broker group: its master, term and committed index (none when it does not
        answer)."""
        rows = []
        for b in self.brokers:
            row: dict = {"broker": b, "leader": None, "term": -1, "committed_index": -1}
            try:
                st = self.broker(b).group.status(timeout_s)
            except LedgerError as exc:
                row["error"] = str(exc)
                rows.append(row)
                continue
            leaders = [(s.term, m) for m, s in st.items() if s.alive and s.role.name == "LEADER"]
            if leaders:
                term, leader = max(leaders)
                row.update(leader=leader, term=term, committed_index=st[leader].committed_index)
            rows.append(row)
        return rows

    def delete(self, delete_data: bool = False) -> None:
        """Stop every broker group (and remove their files with ``delete_data``), then forget
        the cluster.  Every broker group is tried; the first failure is raised after, with
        the layout kept, so a second delete finishes the job."""
        errors: list[Exception] = []
        for b in self.brokers:
            try:
                log = self._logs.get(b) or CommitLog(LedgerGroup.get(b))
                log.shutdown(delete_data=delete_data)
            except LedgerError as exc:
                if exc.code != ResponseCode.UNKNOWN_GROUP:  # gone already: nothing to stop
                    errors.append(exc)
            except Exception as exc:  # noqa: BLE001 -- the others are still stopped
                errors.append(exc)
        if errors:
            raise errors[0]
        for log in self._logs.values():  # the producers' clients too
            log.client.close()
        self._logs.clear()
        LAYOUTS.forget(self.name)
        logger.info("broker cluster %s deleted", self.name)


def _client_prefix() -> str:
    """RocketMQ's MessageClientIDSetter prefix: IPv4, pid and a random part, in hex."""
    try:
        ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        ip = bytes([127, 0, 0, 1])
    return f"{ip.hex()}{os.getpid() & 0xFFFF:04X}{secrets.token_hex(4)}".upper()


class Producer:
    """RocketMQ's DefaultMQProducer over a :class:`BrokerCluster` (thread-safe: share one).

    ``retry_times_when_send_failed``: how many other broker groups a message refused with
    nothing stored may go to; ``send_latency_fault_enable``: keep off a broker group that
    failed for ``fault_isolation_s`` (unless every one is isolated); ``send_timeout_s``:
    each broker group's deadline for one attempt (RocketMQ's sendMsgTimeout)."""

    def __init__(
        self,
        cluster: BrokerCluster,
        *,
        retry_times_when_send_failed: int = 2,
        send_latency_fault_enable: bool = True,
        fault_isolation_s: float = 30.0,
        send_timeout_s: float = 3.0,
    ):
        if type(retry_times_when_send_failed) is not int or retry_times_when_send_failed < 0:
            raise _bad(f"retry_times_when_send_failed must be an int >= 0, "
                       f"got {retry_times_when_send_failed!r}")  # fmt: skip
        if not send_timeout_s > 0 or not fault_isolation_s >= 0:
            raise _bad("send_timeout_s must be > 0 and fault_isolation_s >= 0")
        self.cluster = cluster
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.send_latency_fault_enable = send_latency_fault_enable
        self.send_timeout_s = send_timeout_s
        self.faults = _Faults(fault_isolation_s)
        self._which = itertools.count(secrets.randbelow(1 << 16))  # RocketMQ's sendWhichQueue
        self._ids = itertools.count()
        self._prefix = _client_prefix()
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def _msg_id(self) -> str:
        with self._lock:
            n = next(self._ids)
        ms = int((time.monotonic() - self._start) * 1000)
        return f"{self._prefix}{ms & 0xFFFFFFFF:08X}{n & 0xFFFF:04X}"

    def _next(self) -> int:
        with self._lock:
            return next(self._which)

    def select(self, route: TopicRoute, last_broker: str | None = None) -> MessageQueue:
        """The next queue round robin (RocketMQ's selectOneMessageQueue): not on
        ``last_broker`` and, with the fault switch on, not on an isolated broker group,
        while another queue qualifies."""
        mqs = route.queues
        start = self._next()
        order = [mqs[(start + k) % len(mqs)] for k in range(len(mqs))]
        fit = [mq for mq in order if mq.broker != last_broker]
        if self.send_latency_fault_enable:
            fit = [mq for mq in fit if self.faults.available(mq.broker)] or fit
        return (fit or order)[0]

    # -- sending -----------------------------------------------------------------------------
    def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | None = None,
        properties: dict[str, str] | None = None,
        flag: int = 0,
        delay_level: int = 0,
        *,
        mq: MessageQueue | None = None,
        sharding_key: str | bytes | None = None,
        selector: Selector | None = None,
    ) -> SendResult:
        """Send one message: to ``mq``, or to the queue of ``sharding_key`` (through
        ``selector``, default :func:`select_by_hash`), both without failover; else round
        robin with failover.  A message RocketMQ refuses is MESSAGE_ILLEGAL (nothing
        stored); a queue outside the route is UNEXPECTED_ARGUMENT (raised)."""
        msg = {"topic": topic, "body": body, "tags": tags, "keys": keys,
               "properties": properties, "flag": flag, "delay_level": delay_level}  # fmt: skip
        return self._send([msg], topic, mq, sharding_key, selector)[0]

    def send_batch(
        self,
        topic: str,
        messages: Sequence[Mapping],
        *,
        mq: MessageQueue | None = None,
        sharding_key: str | bytes | None = None,
        selector: Selector | None = None,
    ) -> list[SendResult]:
        """Send a batch to one queue, with one commit wait (RocketMQ's batch send: one
        topic, no delayed messages).  ``messages``: dicts with ``body`` and optionally
        ``tags``, ``keys``, ``properties``, ``flag``.  Queue choice and failover as
        :meth:`send`; the whole batch goes to one broker group or fails."""
        if not messages:
            raise _bad("a batch needs at least one message")
        msgs = []
        for m in messages:
            if not isinstance(m, Mapping) or "body" not in m:
                raise _bad(f"a batch's messages are dicts with a 'body', got {m!r}")
            if m.get("topic", topic) != topic:
                raise _bad(f"a batch goes to one topic ({topic!r}), got {m['topic']!r}")
            msgs.append({**m, "topic": topic})
        return self._send(msgs, topic, mq, sharding_key, selector)

    def _send(self, msgs, topic, mq, sharding_key, selector) -> list[SendResult]:
        try:
            route = self.cluster.route(topic)
        except MessageError as exc:
            return [SendResult(exc.status, error=exc.message)] * len(msgs)
        for m in msgs:
            props = dict(m.get("properties") or {})
            props.setdefault(UNIQ_KEY, self._msg_id())
            m["properties"] = props
        if mq is not None or sharding_key is not None or selector is not None:
            if mq is None:
                if sharding_key is None:
                    raise _bad("a selector needs a sharding_key to select by")
                mq = (selector or select_by_hash)(route.queues, sharding_key)
            return self._attempt(route.check(mq), msgs, ())  # ordered: no failover
        attempts: tuple[tuple[str, PutMessageStatus], ...] = ()
        last: str | None = None
        for _ in range(1 + self.retry_times_when_send_failed):
            target = self.select(route, last)
            out = self._attempt(target, msgs, attempts)
            first = out[0]
            if first.ok or first.outcome_unknown or first.status not in _RETRIABLE:
                return out
            attempts += ((target.broker, first.status),)
            last = target.broker
            logger.info("broker group %s refused a send to %s (%s): trying another",
                        target.broker, topic, first.status.value)  # fmt: skip
        return out

    def _attempt(self, mq: MessageQueue, msgs: list[dict], attempts) -> list[SendResult]:
        """One broker group's answer for ``msgs`` (all to ``mq``)."""
        try:
            log = self.cluster.broker(mq.broker, timeout_s=self.send_timeout_s)
        except LedgerError as exc:  # the group is not running: nothing sent
            self.faults.failed(mq.broker)
            r = PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error=str(exc))
            return [self._result(mq, r, m, attempts) for m in msgs]
        if len(msgs) == 1:
            m = msgs[0]
            rs = [log.put_message(m["topic"], mq.queue_id, m["body"], m.get("tags"),
                                  m.get("keys"), m["properties"], m.get("flag", 0),
                                  m.get("delay_level", 0))]  # fmt: skip
        else:
            rs = log.put_messages([{**m, "queue_id": mq.queue_id} for m in msgs])
        status = rs[0].status
        if status is PutMessageStatus.PUT_OK:
            self.faults.succeeded(mq.broker)
        elif status in _RETRIABLE or rs[0].outcome_unknown:
            self.faults.failed(mq.broker)
        return [self._result(mq, r, m, attempts) for r, m in zip(rs, msgs, strict=True)]

    @staticmethod
    def _result(mq, r: PutMessageResult, m: dict, attempts) -> SendResult:
        return SendResult(
            r.status, mq, r.queue_offset, m["properties"].get(UNIQ_KEY),
            r.msg_id, r.wrote_offset, r.error, r.outcome_unknown, attempts,
        )  # fmt: skip


class PullConsumer:
    """A pull consumer over every queue of every broker group (RocketMQ's pull consumer).
    With ``group``, :meth:`consume` and :meth:`follow` start from the group's committed
    offsets and commit each queue's next offset, through that broker group's ledger, after
    the caller has gone through the pulled batch (at least once: a consumer that dies
    mid-batch gets that batch again)."""

    def __init__(self, cluster: BrokerCluster, group: str | None = None, batch: int = 256):
        if group is not None and (not isinstance(group, str) or not group):
            raise _bad(f"a consumer group is a non-empty string, got {group!r}")
        self.cluster, self.group = cluster, group
        self.batch = _count("batch", batch)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's message queues (RocketMQ's fetchSubscribeMessageQueues)."""
        return self.cluster.route(topic).queues

    def _log(self, mq: MessageQueue) -> CommitLog:
        """The commit log of ``mq``'s broker group; UNEXPECTED_ARGUMENT for a queue outside
        its topic's route."""
        if not isinstance(mq, MessageQueue):
            raise _bad(f"a message queue is a MessageQueue, got {mq!r}")
        try:
            route = self.cluster.route(mq.topic)
        except MessageError as exc:
            raise _bad(f"{mq!r}: {exc.message}") from None
        return self.cluster.broker(route.check(mq).broker)

    def pull(self, mq: MessageQueue, offset: int, max_msgs: int = 32) -> PullResult:
        """Committed messages of ``mq`` from ``offset`` (UNEXPECTED_ARGUMENT for a queue
        outside the topic's route or a bad offset)."""
        if type(offset) is not int or offset < 0:
            raise _bad(f"offset must be an int >= 0, got {offset!r}")
        return self._log(mq).pull(mq.topic, mq.queue_id, offset, max_msgs)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._log(mq).max_offset(mq.topic, mq.queue_id)

    def commit_offset(self, mq: MessageQueue, offset: int, group: str | None = None) -> None:
        """Commit ``group``'s (default: this consumer's) offset of ``mq`` on its broker."""
        group = self._group(group)
        self._log(mq).commit_offset(group, mq.topic, mq.queue_id, offset)

    def fetch_offset(self, mq: MessageQueue, group: str | None = None) -> int:
        """``group``'s committed offset of ``mq`` (-1 when none)."""
        return self._log(mq).fetch_offset(self._group(group), mq.topic, mq.queue_id)

    def _group(self, group: str | None) -> str:
        group = group or self.group
        if not group:
            raise _bad("no consumer group: give one here or to the consumer")
        return group

    def _start(self, mq: MessageQueue) -> int:
        return max(0, self.fetch_offset(mq)) if self.group else 0

    def consume(self, topic: str) -> Iterator[tuple[MessageQueue, Message]]:
        """Every queue's committed messages, up to each queue's max offset when called,
        as ``(message queue, message)``; the queues' pulls of a round run in parallel.
        A broker group that does not answer raises its LedgerError (offsets committed so
        far stay)."""
        queues = self.queues(topic)
        stop = {mq: self.max_offset(mq) for mq in queues}
        at = {mq: self._start(mq) for mq in queues}
        with _pool(len(at)) as pool:
            while (yield from self._round(pool, at, stop, raise_errors=True)) > 0:
                pass

    def follow(self, topic: str, poll_s: float = 0.05) -> Iterator[tuple[MessageQueue, Message]]:
        """The topic's messages as they commit, on every queue, forever; a broker group that
        does not answer is logged and tried again on the next round."""
        at: dict[MessageQueue, int] = {}
        for mq in self.queues(topic):
            try:
                at[mq] = self._start(mq)
            except LedgerError as exc:
                logger.warning("%s: no committed offset read (%s): from 0", mq, exc)
                at[mq] = 0
        with _pool(len(at)) as pool:
            while True:
                if not (yield from self._round(pool, at, None, raise_errors=False)):
                    time.sleep(poll_s)

    def _round(self, pool, at, stop, raise_errors: bool):
        """Pull every queue with something left (``stop``: a max offset per queue, None: no
        end) in parallel, yield the batches queue by queue, committing each queue's next
        offset after its batch; returns how many queues moved on."""
        live = [mq for mq in at if stop is None or at[mq] < stop[mq]]
        futs = {}
        for mq in live:
            n = self.batch if stop is None else min(self.batch, stop[mq] - at[mq])
            futs[mq] = pool.submit(self.pull, mq, at[mq], n)
        moved = 0
        for mq in live:
            try:
                r = futs[mq].result()
                if r.status == OFFSET_TOO_SMALL:
                    logger.warning("%s: the messages before offset %d are gone: "
                                   "consuming on from there", mq, r.next_offset)  # fmt: skip
                elif not r.messages:
                    if stop is not None:  # less there than its max offset said
                        stop[mq] = at[mq]
                    continue
                for m in r.messages:
                    yield mq, m
                at[mq] = r.next_offset
                moved += 1
                if self.group:
                    self.commit_offset(mq, at[mq])
            except LedgerError as exc:
                if raise_errors:
                    raise
                logger.warning("%s: pull or commit failed (%s): trying again later", mq, exc)
        return moved


def _pool(queues: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(min(8, max(1, queues)), "rayledger-mq-pull")


__all__ = [
    "BROKERS_NAMESPACE",
    "BrokerCluster",
    "BrokerClusterLayout",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "SendResult",
    "TopicRoute",
    "UNIQ_KEY",
    "broker_group",
    "select_by_hash",
]
