"""Where a group's actors live in Ray: their namespace and names, and finding a group's
members by name (shared by the member, its helpers, the group and the client); and how a
topic's partitions are named (a topic is N ordinary groups, ``NAME-p0`` ...)."""

from __future__ import annotations

import re
import time
from typing import Any

import ray

NAMESPACE = "rayledger"
#: Ray's KV namespace of the topics' layouts (one JSON document per topic).
TOPICS_NAMESPACE = "rayledger-topics"
_PARTITION = re.compile(r"^(?P<topic>.+)-p(?P<index>0|[1-9][0-9]*)$")


def actor_name(group: str, member: str) -> str:
    return f"{group}/{member}"


def member_handle(handles: dict[str, Any], group: str, member: str) -> Any:
    """The named actor of ``member``, looked up once and then kept in ``handles`` (a caller
    drops the entry when the actor died, so the next call looks it up again)."""
    h = handles.get(member)
    if h is None:
        h = ray.get_actor(actor_name(group, member), namespace=NAMESPACE)
        handles[member] = h
    return h


def group_members(name: str) -> list[str]:
    """Member ids of a running group, found by its named actors."""
    prefix = f"{name}/"
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(
        a["name"][len(prefix) :]
        for a in found
        if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix)
    )


def partition_group(topic: str, index: int) -> str:
    """The name of partition ``index``'s group of ``topic``."""
    return f"{topic}-p{index}"


def partition_of_group(name: str) -> tuple[str, int] | None:
    """``(topic, index)`` when ``name`` is shaped like a partition's group, else None."""
    m = _PARTITION.match(name)
    return (m["topic"], int(m["index"])) if m else None


def now_ms() -> int:
    """The actors' clock: monotonic milliseconds (the logic classes never read a clock)."""
    return int(time.monotonic() * 1000)
