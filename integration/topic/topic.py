"""LedgerTopic: create, find, watch, rebalance and delete a topic's partitions (groups)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray
from rayledger.actors import LedgerConfig, LedgerError, ResponseCode
from rayledger.actors.group import LedgerGroup, check_group_args, start_groups
from rayledger.actors.naming import NAMESPACE, group_members, now_ms
from rayledger.actors.placement import alive_nodes, member_nodes

from . import layout as lay
from .balance import Lead, SettleWatch, plan_moves
from .client import TopicClient
from .layout import TopicLayout

log = logging.getLogger("rayledger.topic")


def _bad(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, msg)


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
        auto_rebalance: bool = True,
    ) -> LedgerTopic:
        """Start a topic of ``partitions`` groups; every argument is checked before any actor
        starts, and a topic whose groups did not all start is taken down again.
        ``auto_rebalance``: a keeper actor rebalances the leaders once a failover settled
        (:mod:`.keeper`)."""
        if type(partitions) is not int or partitions < 1:
            raise _bad(f"partitions must be an int >= 1, got {partitions!r}")
        ids, config, store_dir = check_group_args("topic", name, members, store_dir, config)
        if lay.load(name) is not None:
            raise _bad(f"a topic named {name!r} already exists")
        layout = TopicLayout(name, partitions, ids, store_dir, lay.now_ms(),
                             auto_rebalance=bool(auto_rebalance))  # fmt: skip
        taken = [g for g in layout.groups if group_members(g)]
        if taken:
            raise _bad(f"groups {taken} already run under a partition's name of {name!r}")
        lay.save(layout)  # the partitions' names are the topic's from here on
        try:
            started = start_groups(
                layout.groups,
                ids,
                config,
                lambda g, cfg: LedgerGroup.create(
                    g, ids, store_dir, cfg, nodes=nodes, partition_of=name
                ),
                lambda g: g.shutdown(delete_data=True),
                workers=8,
            )
        except BaseException:
            lay.forget(name)
            raise
        if auto_rebalance:
            start_keeper(name)
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
    def leads(self) -> tuple[list[Lead], list[str]]:
        """Each partition's leader, its node, preferred member and members' nodes, and the
        live nodes: what :mod:`.balance` decides from."""
        leads = []
        for r in self.status():
            group = self.layout.group(r["partition"])
            members = member_nodes(group, self.group(r["partition"]).members)
            leads.append(Lead(r["partition"], r["leader"], r["node"],
                              self.preferred_leader(r["partition"]), members))  # fmt: skip
        return leads, alive_nodes()

    def rebalance(
        self,
        timeout_s: float = 30.0,
        *,
        leads: Sequence[Lead] | None = None,
        live: Sequence[str] | None = None,
    ) -> list[dict]:
        """Move leaders off nodes that lead more than their share (``ceil(partitions / live
        nodes)``), the ones a failover displaced first, each to its member on the node that
        leads the fewest (:func:`~.balance.plan_moves`); returns the moves made.  The topic's
        keeper calls it once a failover has settled."""
        if leads is None or live is None:
            leads, live = self.leads()
        moves = []
        for mv in plan_moves(leads, live):
            try:
                self.group(mv.partition).transfer_leadership(mv.target, timeout_s)
            except LedgerError as exc:
                log.warning("topic %s: moving partition %d's leader %s to %s failed: %s",
                            self.name, mv.partition, mv.source, mv.target, exc)  # fmt: skip
                continue
            moves.append({"partition": mv.partition, "from": mv.source, "to": mv.target,
                          "node": mv.node})  # fmt: skip
        return moves

    def keeper_moves(self) -> list[dict]:
        """The leader moves the topic's keeper made after failovers (empty without one)."""
        h = keeper(self.name)
        if h is None:
            return []
        return ray.get(h.moves.remote(), timeout=30)

    # -- stopping ------------------------------------------------------------------------------
    def delete(self, delete_data: bool = False) -> None:
        """Stop every partition's group (and remove their files with ``delete_data``), then
        forget the topic."""
        stop_keeper(self.name)
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


# -- the keeper ----------------------------------------------------------------------
# The topic keeper: one small actor per topic that rebalances its leaders once a failover
# has settled, so a lost node does not leave the leaders piled on the nodes that remain.
#
# It only watches and asks: every ``interval_s`` it reads the partitions' leaders and the live
# nodes, feeds them to :class:`~.balance.SettleWatch`, and once they held still for
# ``settle_s`` it hands over the leaderships :func:`~.balance.plan_moves` names (each group's
# own leadership transfer, as ``topic.rebalance()`` does).  Detached and restarted by Ray
# wherever there is room, as the node it ran on may be the one lost.

keeper_log = logging.getLogger("rayledger.topic.keeper")

#: How often the keeper looks, and how long the leaders must hold still before it moves one.
INTERVAL_S = 2.0
SETTLE_S = 10.0


def keeper_name(topic: str) -> str:
    """The keeper's actor name (no '/': a group's members are named ``GROUP/MEMBER``)."""
    return f"topic-keeper:{topic}"


@ray.remote(num_cpus=0, max_concurrency=4)
class TopicKeeper:
    def __init__(self, topic: str, interval_s: float = INTERVAL_S, settle_s: float = SETTLE_S):
        self.topic, self.interval_s = topic, interval_s
        self.watch = SettleWatch(int(settle_s * 1000))
        self._moves: list[dict] = []  # as rebalance() reports them
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="topic-keeper").start()

    def _loop(self) -> None:
        topic: LedgerTopic | None = None
        while not self._stop.wait(self.interval_s):
            try:
                topic = topic or LedgerTopic.get(self.topic)
                leads, live = topic.leads()
                if self.watch.observe(now_ms(), leads, live):
                    moved = topic.rebalance(leads=leads, live=live)
                    if moved:
                        keeper_log.info("topic %s: moved leaders %s", self.topic, moved)
                        self._moves += moved
                        self.watch.moved()
            except Exception as exc:  # noqa: BLE001 -- a keeper outlives a bad look
                keeper_log.warning("topic %s: keeper look failed: %r", self.topic, exc)

    def moves(self) -> list[dict]:
        """Every leadership this keeper handed over, oldest first."""
        return list(self._moves)

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()


def start_keeper(topic: str, interval_s: float = INTERVAL_S, settle_s: float = SETTLE_S) -> Any:
    """The topic's keeper, started when it does not run yet."""
    return TopicKeeper.options(
        name=keeper_name(topic),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,
    ).remote(topic, interval_s, settle_s)


def keeper(topic: str) -> Any | None:
    """The topic's keeper's handle, or None when it runs none."""
    try:
        return ray.get_actor(keeper_name(topic), namespace=NAMESPACE)
    except ValueError:
        return None


def stop_keeper(topic: str) -> None:
    h = keeper(topic)
    if h is not None:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(h, no_restart=True)
