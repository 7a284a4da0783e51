"""Where a topic's leaders should be: the rebalancing decisions, with no Ray and no clock.

A topic's partitions spread their leaders over the nodes through preferred leaders (partition
``i`` prefers member ``i mod members``, and members go round robin over the nodes).  A lost
node leaves its partitions to whichever member wins the election, which may pile them on one
node; :func:`plan_moves` says which leaders to hand over so no live node leads more than its
share, and :class:`SettleWatch` says when a failover has settled enough to do it (moving a
leader while elections still run would only start more of them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Lead:
    """One partition as observed: its leader (None: none right now), the leader's node, its
    preferred member, and every member's node (None: unknown)."""

    partition: int
    leader: str | None
    node: str | None
    preferred: str
    members: Mapping[str, str | None]


@dataclass(frozen=True)
class Move:
    """Hand ``partition``'s leadership from ``source`` to ``target`` (on ``node``)."""

    partition: int
    source: str
    target: str
    node: str


def share(partitions: int, live_nodes: int) -> int:
    """The most leaders one live node should carry."""
    return math.ceil(partitions / max(1, live_nodes))


def plan_moves(leads: Sequence[Lead], live: Sequence[str]) -> list[Move]:
    """The transfers that bring every live node down to its share of leaders.

    From a node above its share, the partitions led away from their preferred member go
    first (a failover displaced them; the ones at home keep their leader), each to its member
    on the live node that leads the fewest, and only when that node would still lead fewer
    than the one it leaves."""
    count = {n: 0 for n in live}
    for lead in leads:
        if lead.node in count:
            count[lead.node] += 1
    most = share(len(leads), len(live))
    moves: list[Move] = []
    order = sorted(leads, key=lambda lead: (lead.leader == lead.preferred, lead.partition))
    for lead in order:
        if lead.leader is None or lead.node not in count or count[lead.node] <= most:
            continue
        spots = sorted(
            (count[n], n, m) for m, n in lead.members.items() if n in count and m != lead.leader
        )
        if not spots or spots[0][0] + 1 > count[lead.node] - 1:
            continue  # no member on a node that would lead fewer
        _, node, target = spots[0]
        count[lead.node] -= 1
        count[node] += 1
        moves.append(Move(lead.partition, lead.leader, target, node))
    return moves


class SettleWatch:
    """Says when the leaders have held still for ``settle_ms`` with every partition led:
    the moment a failover has settled and a rebalance may follow.  Fed observations in
    time order (``now_ms`` from the caller's clock)."""

    def __init__(self, settle_ms: int) -> None:
        self.settle_ms = settle_ms
        self._seen: tuple | None = None
        self._since_ms = 0

    def observe(self, now_ms: int, leads: Sequence[Lead], live: Sequence[str]) -> bool:
        """True when the same leaders on the same live nodes have been seen since at least
        ``settle_ms`` ago, every partition having one."""
        seen = (tuple((lead.partition, lead.leader) for lead in leads), tuple(sorted(live)))
        if seen != self._seen:
            self._seen, self._since_ms = seen, now_ms
            return False
        led = all(lead.leader is not None for lead in leads)
        return led and now_ms - self._since_ms >= self.settle_ms

    def moved(self) -> None:
        """Leaders were handed over: the next settled view starts from scratch."""
        self._seen = None
