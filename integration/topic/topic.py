"""LedgerTopic: create, find, watch, rebalance and delete a topic's partitions (groups)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import ray
from rayledger.actors import LedgerConfig, LedgerError, ResponseCode
from rayledger.actors.group import LedgerGroup, member_ids
from rayledger.actors.naming import NAMESPACE, group_members
from rayledger.actors.placement import alive_nodes, member_nodes
from rayledger.storage.metafile import ensure_writable_dir

from . import layout as lay
from .client import TopicClient
from .layout import TopicLayout

log = logging.getLogger("rayledger.topic")


def _bad(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, msg)


def _with_preferred(config: LedgerConfig, member: str) -> LedgerConfig:
    """``config`` with ``member`` as the group's preferred leader (DLedger's
    preferredLeaderIds: the leader hands over to it once it is caught up)."""
    election = dataclasses.replace(config.election, preferred_leader_ids=(member,))
    return dataclasses.replace(config, election=election)


class LedgerTopic:
    """A topic: ``partitions`` groups named ``NAME-p0`` ..., each an ordinary
    :class:`~rayledger.actors.LedgerGroup`.  Partition ``i``'s preferred leader is its
    member ``i mod members``; members go round robin over the live nodes, so the leaders
    spread over the nodes, and each group's preferred-leader check brings its leader back
    after a failover once that member has caught up."""

    def __init__(self, layout: TopicLayout):
        self.layout = layout
        self._groups: dict[int, LedgerGroup] = {}

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def partitions(self) -> int:
        return self.layout.partitions

    @property
    def groups(self) -> list[str]:
        """The partitions' group names, in partition order."""
        return self.layout.groups

    def group(self, partition: int) -> LedgerGroup:
        """Partition ``partition``'s group (UNEXPECTED_ARGUMENT when out of range)."""
        name = self.layout.group(partition)
        g = self._groups.get(partition)
        if g is None:
            g = self._groups[partition] = LedgerGroup.get(name)
        return g

    # -- creating and finding -------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        partitions: int = 1,
        members: int | Sequence[str] = 3,
        store_dir: str | os.PathLike | None = None,
        config: LedgerConfig | None = None,
        *,
        nodes: Sequence[str] | None = None,
    ) -> LedgerTopic:
        """Start a topic of ``partitions`` groups; every argument is checked before any actor
        starts, and a topic whose groups did not all start is taken down again."""
        if not isinstance(name, str) or not name or "/" in name:
            raise _bad(f"topic name must be a non-empty string without '/', got {name!r}")
        if type(partitions) is not int or partitions < 1:
            raise _bad(f"partitions must be an int >= 1, got {partitions!r}")
        ids = member_ids(members)
        config = config or LedgerConfig()
        if not isinstance(config, LedgerConfig):
            raise _bad(f"config must be a LedgerConfig, got {type(config).__name__}")
        if store_dir is not None:
            store_dir = str(Path(store_dir).expanduser().resolve())
            ensure_writable_dir(store_dir)
        if not ray.is_initialized():
            ray.init(namespace=NAMESPACE)
        if lay.load(name) is not None:
            raise _bad(f"a topic named {name!r} already exists")
        layout = TopicLayout(name, partitions, ids, store_dir, lay.now_ms())
        taken = [g for g in layout.groups if group_members(g)]
        if taken:
            raise _bad(f"groups {taken} already run under a partition's name of {name!r}")
        lay.save(layout)  # the partitions' names are the topic's from here on
        started: list[LedgerGroup] = []
        try:
            with concurrent.futures.ThreadPoolExecutor(min(partitions, 8)) as pool:
                futs = [
                    pool.submit(
                        LedgerGroup.create,
                        g,
                        ids,
                        store_dir,
                        _with_preferred(config, ids[i % len(ids)]),
                        nodes=nodes,
                        partition_of=name,
                    )  # fmt: skip
                    for i, g in enumerate(layout.groups)
                ]
                errors = []
                for f in futs:
                    try:
                        started.append(f.result())
                    except Exception as exc:  # noqa: PERF203 -- every group is waited for
                        errors.append(exc)
                if errors:
                    raise errors[0]
        except BaseException:
            for g in started:
                g.shutdown(delete_data=True)
            lay.forget(name)
            raise
        topic = cls(layout)
        topic._groups = {i: g for i, g in enumerate(started)}  # in submission order
        log.info("topic %s started: %d partitions of %s", name, partitions, ids)
        return topic

    @classmethod
    def get(cls, name: str) -> LedgerTopic:
        """Attach to a topic by name (from any driver or Ray job); UNKNOWN_GROUP when none."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        return cls(lay.require(name))

    @staticmethod
    def list() -> list[str]:
        """The names of the topics on the cluster."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        return lay.names()

    def client(self, timeout_s: float = 30.0, idempotent: bool = True) -> TopicClient:
        """One client for every partition (see :class:`TopicClient`)."""
        return TopicClient(self.layout, timeout_s=timeout_s, idempotent=idempotent)

    # -- watching --------------------------------------------------------------------------
    def preferred_leader(self, partition: int) -> str:
        """The member partition ``partition``'s group hands its leadership to when it can."""
        self.layout.group(partition)  # in range
        members = self.layout.members
        return members[partition % len(members)]

    def wait_for_leaders(self, timeout_s: float = 60.0, preferred: bool = False) -> list[str]:
        """Each partition's leader, once every partition has one (``preferred``: once each
        is led by its preferred member, as after a start or a failover settles; TIMEOUT
        when that does not happen in time)."""
        deadline = time.monotonic() + timeout_s
        leaders = [self.group(i).wait_for_leader(timeout_s) for i in range(self.partitions)]
        if not preferred:
            return leaders
        want = [self.preferred_leader(i) for i in range(self.partitions)]
        while True:
            leaders = [r["leader"] for r in self.status()]
            if leaders == want:
                return leaders
            if time.monotonic() > deadline:
                raise LedgerError.of(
                    ResponseCode.TIMEOUT,
                    f"topic {self.name!r}: leaders {leaders}, preferred {want}",
                )
            time.sleep(0.2)

    def status(self, timeout_s: float = 2.0) -> list[dict]:
        """Per partition: its group, leader, the leader's node, term and committed index
        (a partition whose members do not answer shows no leader)."""
        rows = []
        for i in range(self.partitions):
            row: dict = {"partition": i, "group": self.layout.group(i), "leader": None,
                         "node": None, "term": -1, "committed_index": -1}  # fmt: skip
            try:
                st = self.group(i).status(timeout_s)
            except LedgerError as exc:
                row["error"] = str(exc)
                rows.append(row)
                continue
            leaders = [(s.term, m) for m, s in st.items() if s.alive and s.role.name == "LEADER"]
            if leaders:
                term, leader = max(leaders)
                row.update(leader=leader, term=term,
                           committed_index=st[leader].committed_index,
                           node=member_nodes(self.layout.group(i), [leader])[leader])  # fmt: skip
            rows.append(row)
        return rows

    # -- spreading the leaders ---------------------------------------------------------------
    def rebalance(self, timeout_s: float = 30.0) -> list[dict]:
        """Move leaders off nodes that lead more than their share (``ceil(partitions /
        live nodes)``) to a member on the node that leads the fewest; returns the moves."""
        rows = self.status()
        live = set(alive_nodes())
        count = {n: 0 for n in live}
        for r in rows:
            if r["node"] in count:
                count[r["node"]] += 1
        share = math.ceil(self.partitions / max(1, len(live)))
        moves = []
        for r in rows:
            if r["leader"] is None or count.get(r["node"], 0) <= share:
                continue
            group = self.group(r["partition"])
            where = member_nodes(r["group"], group.members)
            spots = sorted(
                (count[n], m) for m, n in where.items() if n in count and m != r["leader"]
            )
            if not spots or spots[0][0] + 1 > count[r["node"]] - 1:
                continue  # no member on a node that would lead fewer
            target = spots[0][1]
            try:
                group.transfer_leadership(target, timeout_s)
            except LedgerError as exc:
                log.warning("topic %s: moving %s's leader to %s failed: %s",
                            self.name, r["group"], target, exc)  # fmt: skip
                continue
            count[r["node"]] -= 1
            count[where[target]] += 1
            moves.append({"partition": r["partition"], "from": r["leader"], "to": target,
                          "node": where[target]})  # fmt: skip
        return moves

    # -- stopping ------------------------------------------------------------------------------
    def delete(self, delete_data: bool = False) -> None:
        """Stop every partition's group (and remove their files with ``delete_data``), then
        forget the topic."""
        for i, g in enumerate(self.layout.groups):
            try:
                group = self._groups.get(i) or LedgerGroup.get(g)
            except LedgerError as exc:
                if exc.code != ResponseCode.UNKNOWN_GROUP:
                    raise
                continue
            group.shutdown(delete_data=delete_data)
        self._groups.clear()
        lay.forget(self.name)
