"""``QuorumAckCheckerActor`` (actors/checker.py) in the whole-group simulation: the shipped
:class:`~rayledger.replication.checker.CheckerDriver` on a node's loop, its messages to the
member and the dispatchers carried as node-local hops.  Delivery only -- plus a checker
process that can hang (a SIGSTOP: calls wait in it, its timers stop) until its member
kills it, when Ray starts a fresh one that tells the member (``helper_started``)."""

from __future__ import annotations

import itertools

from rayledger.actors.core.pump import CheckerDriver
from rayledger.replication.checker import (
    AddRound,
    BecomeLeader,
    CheckerLogic,
    Configure,
    GraphBegin,
    GraphEnd,
    GraphReport,
    LeadershipEnded,
    Report,
    Resolution,
)

from .node_state import Node
from .node_transport import PARK, SimLoop

CHECKER = "checker"
_pids = itertools.count(1_000_000)


class _SimCheckerPorts:
    __slots__ = ("sim", "node")

    def __init__(self, sim, node: Node):
        self.sim, self.node = sim, node

    def resolved(self, r: Resolution) -> None:
        sim, node = self.sim, self.node
        sim._hop(node, sim._m_on_resolved, node, r)

    def notice(self, term: int, committed: int) -> None:
        sim, node = self.sim, self.node
        for p in node.dispatchers:
            sim._hop(node, sim._d_on_committed, node, p, term, committed)


class CheckerDelivery:
    """Calls to a node's checker (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _checker_driver(self, node: Node, logic: CheckerLogic) -> CheckerDriver:
        driver = CheckerDriver(logic, _SimCheckerPorts(self, node))
        driver.attach(SimLoop(self, node, actor=CHECKER))
        return driver

    def _c_hung(self, node: Node) -> bool:
        return CHECKER in node.hung

    def _c_become_leader(self, node: Node, term: int, start: int, info) -> list:
        if self._c_hung(node):
            return PARK
        return node.checker_driver.deliver(BecomeLeader(term, start, info))

    def _c_configure(self, node: Node, term: int, info) -> bool:
        if self._c_hung(node):
            return PARK
        return node.checker_driver.deliver(Configure(term, info))

    def _c_step_down(self, node: Node, term: int) -> list:
        if self._c_hung(node):
            return PARK
        return node.checker_driver.deliver(LeadershipEnded(term))

    def _c_pid(self, node: Node) -> int:
        if self._c_hung(node):
            return PARK
        return node.helper_gen.get(CHECKER, 0)

    def _c_add_round(
        self,
        node: Node,
        term: int,
        first: int,
        last: int,
        token,
        leader_mark: int,
        config=None,
    ) -> None:
        if self._c_hung(node):
            return  # lost with the process when it is killed
        if term == node.checker.term and token in node.checker._registered:
            self.stats["double_registered"] += 1
        node.checker_driver.deliver(AddRound(term, first, last, token, leader_mark, config))

    def _c_report(self, node: Node, term: int, peer: str, wm: int) -> int | None:
        if self._c_hung(node):
            return PARK
        return node.checker_driver.deliver(Report(term, peer, wm))

    def _c_cg_begin(self, node: Node, term: int, gen: int) -> bool:
        if self._c_hung(node):
            return PARK
        return node.checker_driver.deliver(GraphBegin(term, gen))

    def _c_cg_end(self, node: Node, gen: int) -> None:
        if not self._c_hung(node):
            node.checker_driver.deliver(GraphEnd(gen))

    def _c_cg_report(self, node: Node, ack) -> tuple | None:
        for _, _, token in ack[4]:
            if ack[0] == node.checker.graph_gen and token in node.checker._registered:
                self.stats["double_registered"] += 1
        return node.checker_driver.deliver(GraphReport(ack))

    # -- the hang fault and the replacement ---------------------------------------------------
    def hang_checker(self, mid: str) -> None:
        """SIGSTOP ``mid``'s checker: it answers nothing until its member kills it."""
        node = self.members[mid].node
        if node is not None and CHECKER not in node.hung:
            node.hung.add(CHECKER)
            node.last_hang_ms = self.clock.now_ms
            node.hang_began_ms = self.clock.now_ms
            self.stats["checker_hangs"] += 1
            self.net.note(f"FAULT hang {mid}'s checker")

    def _c_kill(self, node: Node) -> None:
        """The member killed its checker's process: Ray starts a fresh one (empty state),
        which tells its member; the calls that waited in the old one fail."""
        if CHECKER in node.hung:  # hung until now: rounds born meanwhile waited for this
            node.last_hang_ms = self.clock.now_ms
        node.hung.discard(CHECKER)
        node.helper_gen[CHECKER] = node.helper_gen.get(CHECKER, 0) + 1
        self.stats["checker_replaced"] += 1
        self.net.note(f"{node.id}'s checker killed: Ray starts it again")
        self._release_parked(node)
        members = list(node.logic.config_log.latest().members)
        logic = CheckerLogic(self.group, node.id, members, self.replication)
        node.checker = logic
        node.checker_driver = self._checker_driver(node, logic)
        self._hop(node, self._m_helper_started, node, CHECKER, None, next(_pids), True)
