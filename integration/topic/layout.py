"""A topic's layout -- its partitions' groups and how they were started -- kept in the
cluster's key-value store (Ray's GCS, as members' nodes are), so any driver finds it."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

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


def save(layout: TopicLayout) -> None:
    kv_put(layout.name, layout.to_json(), TOPICS_NAMESPACE)


def load(name: str) -> TopicLayout | None:
    raw = kv_get(name, TOPICS_NAMESPACE)
    return None if raw is None else TopicLayout.from_json(raw)


def require(name: str) -> TopicLayout:
    """The layout of topic ``name``; UNKNOWN_GROUP when there is none."""
    layout = load(name)
    if layout is None:
        raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no topic named {name!r}")
    return layout


def forget(name: str) -> None:
    kv_del(name, TOPICS_NAMESPACE)


def names() -> list[str]:
    return kv_keys("", TOPICS_NAMESPACE)


def now_ms() -> int:
    return int(time.time() * 1000)
