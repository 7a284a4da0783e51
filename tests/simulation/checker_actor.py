"""``QuorumAckCheckerActor`` (actors/checker.py) in the whole-group simulation: the shipped
:class:`~rayledger.actors.checker_logic.CheckerDriver` on a node's loop, its messages to the
member and the dispatchers carried as node-local hops.  Delivery only."""

from __future__ import annotations

from rayledger.actors.checker_logic import CheckerDriver, CheckerLogic, Resolution

from .node_state import Node
from .node_transport import SimLoop


class _SimCheckerPorts:
    __slots__ = ("sim", "node")

    def __init__(self, sim, node: Node):
        self.sim, self.node = sim, node

    def resolved(self, r: Resolution) -> None:
        sim, node = self.sim, self.node
        sim._hop(node, sim._m_on_resolved, node, r.term, r.committed, r.outcomes)

    def notice(self, term: int, committed: int) -> None:
        sim, node = self.sim, self.node
        for p in node.dispatchers:
            sim._hop(node, sim._d_on_committed, node, p, term, committed)


class CheckerActor:
    """Calls to a node's checker (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _checker_driver(self, node: Node, logic: CheckerLogic) -> CheckerDriver:
        driver = CheckerDriver(logic, _SimCheckerPorts(self, node))
        driver.attach(SimLoop(self, node))
        return driver

    def _c_become_leader(self, node: Node, term: int, start: int, info) -> list:
        return node.checker_driver.become_leader(term, start, info)

    def _c_step_down(self, node: Node, term: int) -> list:
        return node.checker_driver.step_down(term)

    def _c_add_round(
        self, node: Node, term: int, first: int, last: int, token, leader_mark: int
    ) -> None:
        if term == node.checker.term and node.checker.is_registered(token):
            self.stats["double_registered"] += 1
        node.checker_driver.add_round(term, first, last, token, leader_mark)

    def _c_report(self, node: Node, term: int, peer: str, wm: int) -> int | None:
        return node.checker_driver.report(term, peer, wm)

    def _c_cg_begin(self, node: Node, term: int, gen: int) -> bool:
        return node.checker_driver.graph_begin(term, gen)

    def _c_cg_end(self, node: Node, gen: int) -> None:
        node.checker_driver.graph_end(gen)

    def _c_cg_report(self, node: Node, ack) -> tuple | None:
        for _, _, token in ack[4]:
            if ack[0] == node.checker.graph_gen and node.checker.is_registered(token):
                self.stats["double_registered"] += 1
        return node.checker_driver.graph_report(ack)
