"""Where a group's members run on Ray: each member's node (recorded in Ray's KV store, so that a
leader knows the node of a member whose node is gone) and the cluster's live nodes, shared by
:class:`~.group.LedgerGroup` (create, add, replace) and a leader replacing a lost member
(``replace_lost_after_s``); both start the member with
:func:`~rayledger.actors.member.actor.spawn_member`. The choice of a node is
:func:`~rayledger.election.membership.choose_node`'s."""

from __future__ import annotations

import logging
from pathlib import Path

import ray
from rayledger.actors.ray_compat import kv_del, kv_get, kv_put
from rayledger.election.membership import GONE

log = logging.getLogger("rayledger.actors")

_KV_NAMESPACE = "rayledger-nodes"


def _key(group: str, member: str) -> str:
    return f"{group}/{member}"


def record_node(group: str, member: str, node_id: str) -> None:
    """A member says where it runs (at every start: a restart may move a memory member)."""
    kv_put(_key(group, member), node_id, _KV_NAMESPACE)


def record_gone(group: str, member: str) -> None:
    """A member's process was stopped for good (:data:`~rayledger.election.membership.GONE`): any
    later leader's view of the nodes says so."""
    try:
        kv_put(_key(group, member), GONE, _KV_NAMESPACE)
    except Exception as exc:  # no Ray here: nothing reads the view either
        log.warning("could not record %s of %s as gone: %r", member, group, exc)


def forget_node(group: str, member: str) -> None:
    try:
        kv_del(_key(group, member), _KV_NAMESPACE)
    except Exception:  # no Ray here
        pass


def member_nodes(group: str, members) -> dict[str, str | None]:
    """Each member's node as last recorded (None: never recorded)."""
    out: dict[str, str | None] = {}
    for m in members:
        raw = kv_get(_key(group, m), _KV_NAMESPACE)
        out[m] = raw.decode() if raw else None
    return out


def alive_nodes() -> list[str]:
    """The ids of the nodes Ray reports alive."""
    return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))


def data_dir_of(store_dir: str | None, group: str, member: str) -> str | None:
    return str(Path(store_dir) / group / member) if store_dir is not None else None


def store_dir_of(data_dir: str | None) -> str | None:
    """The group's store directory from one member's data directory."""
    return str(Path(data_dir).parent.parent) if data_dir else None


__all__ = [
    "alive_nodes",
    "data_dir_of",
    "forget_node",
    "member_nodes",
    "record_node",
    "store_dir_of",
]
