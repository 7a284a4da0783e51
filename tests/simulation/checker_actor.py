"""``QuorumAckCheckerActor`` (actors/checker.py) in the whole-group simulation: rounds
registered, water marks reported, commits and resolutions told to the member, and the
commit notice for the dispatchers."""

from __future__ import annotations

from rayledger.replication import Resolved
from rayledger.storage import ResponseCode

from .node_state import Node
from .sim_config import COMMIT_NOTICE_MS


class CheckerActor:
    """The checker's actor shell (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _c_become_leader(self, node: Node, term: int, start: int, info) -> list:
        cs = node.csh
        cs.loop = True
        failed = node.checker.become_leader(term, start, info)
        cs.committed_sent = -1
        self._c_check(node)
        return [(r.token, r.code) for r in failed]

    def _c_step_down(self, node: Node, term: int) -> list:
        cs = node.csh
        failed = node.checker.step_down(term)
        failed += [r for _, r in cs.out]
        cs.out = []
        cs.cg_gen = None
        return [(r.token, r.code) for r in failed]

    def _c_add_round(
        self, node: Node, term: int, first: int, last: int, token, leader_mark: int
    ) -> None:
        chk = node.checker
        if term != chk.term:
            node.csh.out.append(
                (term, Resolved(token, ResponseCode.TERM_CHANGED, first, last, term))
            )
        else:
            if token in chk._registered:
                self.stats["double_registered"] += 1
            chk.add_round(term, first, last, token, self.clock.now_ms, leader_mark)
        self._c_kick(node)

    def _c_report(self, node: Node, term: int, peer: str, wm: int) -> int | None:
        chk = node.checker
        if term != chk.term:
            return None
        chk.report(term, peer, wm)
        self._c_check(node)
        return chk.committed_index

    def _c_kick(self, node: Node) -> None:
        cs = node.csh
        if not cs.scheduled and cs.loop:
            cs.scheduled = True
            self._soon(node, self._c_check, node)

    def _c_check(self, node: Node) -> None:
        """Commit what a quorum stores; one message to the leader with what changed."""
        cs = node.csh
        cs.scheduled = False
        chk = node.checker
        now = self.clock.now_ms
        term = chk.term
        if term < 0:
            return
        committed, resolved = chk.check(now)
        resolved += [r for _, r in cs.out]
        cs.out = []
        deadline = chk.next_deadline_ms()
        if committed is not None and committed > cs.committed_sent:
            cs.committed_sent = committed
        else:
            committed = None
        if committed is not None or resolved:
            self._hop(
                node,
                self._m_on_resolved,
                node,
                term,
                committed,
                [(r.token, r.code) for r in resolved],
            )
        if committed is not None:
            self._c_tell_dispatchers(node, term, committed)
        self._cancel(cs.timer)
        cs.timer = None
        if deadline is not None:
            cs.timer = self._at(node, max(now + 1, deadline), self._c_check, node)

    def _c_arm(self, node: Node) -> None:
        cs = node.csh
        chk = node.checker
        deadline = chk.next_deadline_ms() if chk.term >= 0 else None
        self._cancel(cs.timer)
        cs.timer = None
        if deadline is not None:
            cs.timer = self._at(node, max(self.clock.now_ms + 1, deadline), self._c_check, node)

    def _c_cg_begin(self, node: Node, term: int, gen: int) -> bool:
        if term != node.checker.term:
            return False
        node.csh.cg_gen = gen
        return True

    def _c_cg_end(self, node: Node, gen: int) -> None:
        if node.csh.cg_gen == gen:
            node.csh.cg_gen = None

    def _c_cg_report(self, node: Node, ack) -> tuple | None:
        gen, term, peer, wm, rounds = ack
        cs = node.csh
        chk = node.checker
        now = self.clock.now_ms
        if gen != cs.cg_gen or term != chk.term:
            return None
        for first, last, token in rounds:
            if token in chk._registered:
                self.stats["double_registered"] += 1
            chk.add_round(term, first, last, token, now, last)
        if wm >= 0:
            chk.report(term, peer, wm)
        committed, resolved = chk.check(now)
        resolved += [r for _, r in cs.out]
        cs.out = []
        if committed is not None and committed > cs.committed_sent:
            cs.committed_sent = committed
        else:
            committed = None
        if committed is not None:
            self._c_tell_dispatchers(node, term, committed)
        self._hop(node, self._c_arm, node)
        return term, committed, [(r.token, r.code) for r in resolved]

    def _c_tell_dispatchers(self, node: Node, term: int, committed: int) -> None:
        """The dispatchers hear of the committed index once it stood still a moment."""
        node.csh.notice = (term, committed)
        if node.csh.loop:
            self._hop(node, self._c_arm_notice, node)

    def _c_arm_notice(self, node: Node) -> None:
        cs = node.csh
        self._cancel(cs.notice_timer)
        cs.notice_timer = self._at(
            node, self.clock.now_ms + COMMIT_NOTICE_MS, self._c_send_notice, node
        )

    def _c_send_notice(self, node: Node) -> None:
        cs = node.csh
        cs.notice_timer = None
        if cs.notice is None:
            return
        term, committed = cs.notice
        cs.notice = None
        for p in node.dispatchers:
            self._hop(node, self._d_on_committed, node, p, term, committed)
