"""A topic's layout -- its partitions' groups and how they were started -- kept in the
cluster's key-value store (Ray's GCS, as members' nodes are), so any driver finds it.

:class:`LayoutStore` is that mechanism for any layout dataclass in a KV namespace of its own
(RocketMQ's broker clusters keep theirs with it too)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from rayledger.actors.naming import TOPICS_NAMESPACE, partition_group
from rayledger.actors.ray_compat import kv_del, kv_get, kv_keys, kv_put
from rayledger.storage import LedgerError, ResponseCode


@dataclass(frozen=True)
class TopicLayout:
    """What a topic is made of: ``partitions`` groups named ``NAME-p0`` ..., each started with
    ``members`` members (ids) under ``store_dir`` (None: memory stores)."""

    name: str
    partitions: int
    members: list[str]
    store_dir: str | None
    created_ms: int = 0
    hash: str = "crc32"  # routing.partition_of
    auto_rebalance: bool = True  # a keeper actor rebalances the leaders after failovers

    @property
    def groups(self) -> list[str]:
        return [partition_group(self.name, i) for i in range(self.partitions)]

    def group(self, partition: int) -> str:
        """Partition ``partition``'s group; UNEXPECTED_ARGUMENT when out of range."""
        if type(partition) is not int or not 0 <= partition < self.partitions:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"topic {self.name!r} has partitions 0..{self.partitions - 1}, not {partition!r}",
            )
        return partition_group(self.name, partition)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> TopicLayout:
        return cls(**json.loads(raw))


L = TypeVar("L")


class LayoutStore(Generic[L]):
    """Layouts of one kind (a dataclass with a ``name``), one JSON document per name in the
    KV namespace ``namespace``; ``kind`` names them in errors."""

    def __init__(self, cls: type[L], namespace: str, kind: str):
        self.cls, self.namespace, self.kind = cls, namespace, kind

    def save(self, layout: Any) -> None:
        kv_put(layout.name, json.dumps(asdict(layout), sort_keys=True), self.namespace)

    def load(self, name: str) -> L | None:
        raw = kv_get(name, self.namespace)
        return None if raw is None else self.cls(**json.loads(raw))

    def require(self, name: str) -> L:
        """The layout of ``name``; UNKNOWN_GROUP when there is none."""
        layout = self.load(name)
        if layout is None:
            raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no {self.kind} named {name!r}")
        return layout

    def forget(self, name: str) -> None:
        kv_del(name, self.namespace)

    def names(self) -> list[str]:
        return kv_keys("", self.namespace)


TOPICS: LayoutStore[TopicLayout] = LayoutStore(TopicLayout, TOPICS_NAMESPACE, "topic")


def save(layout: TopicLayout) -> None:
    TOPICS.save(layout)


def load(name: str) -> TopicLayout | None:
    return TOPICS.load(name)


def require(name: str) -> TopicLayout:
    """The layout of topic ``name``; UNKNOWN_GROUP when there is none."""
    return TOPICS.require(name)


def forget(name: str) -> None:
    TOPICS.forget(name)


def names() -> list[str]:
    return TOPICS.names()


def now_ms() -> int:
    return int(time.time() * 1000)
