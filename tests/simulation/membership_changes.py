"""Configuration changes in the whole-group simulation: an operator's changes
on whoever leads -- add a member (a learner promoted once caught up), add a learner,
replace a voter, remove a member, promote a learner -- interleaved with every other
fault, and the checks that go with them.

Every process of the run exists from the start: members outside the first configuration
(``spares``) start from it as non-members, as a member the Ray group starts for
``add_member`` does, and never campaign; a removed member keeps running (and must never
disrupt the group).  The decisions are the shipped cores' (``MemberCore`` steps
``ChangeMembers``; the leader's ``Membership`` promotes and removes on its own); this file
only picks what an operator asks, when, and on which member.
"""

from __future__ import annotations

import random

from rayledger.actors.core import member as mc
from rayledger.election.configuration import CONFIG_CHANNEL, Configuration
from rayledger.election.membership import Op, check_live_quorum
from rayledger.replication.dispatcher import DispatcherLogic
from rayledger.storage import LedgerError

from .node_state import NeedWatch, Node
from .sim_config import HELPER_BOOT_MS

CHANGE_MEAN_MS = 900  # between two operator changes, on average
CUT_REMOVAL_MEAN_MS = 4000  # between two removals of a member the leader cannot reach


class MembershipChanges:
    """The operator's changes and the configuration checks (a mixin of
    :class:`~.group_sim.GroupSim`)."""

    def _init_membership(self, seed: int, on: bool, cut_removals: bool = False) -> None:
        self._member_rng = random.Random(seed * 7919 + 97)
        self._next_change_ms: int | None = (
            int(self._member_rng.expovariate(1 / CHANGE_MEAN_MS)) + 300 if on else None
        )
        self._cut_rng = random.Random(seed * 7919 + 131)  # its own stream
        self._next_cut_removal_ms: int | None = (
            int(self._cut_rng.expovariate(1 / CUT_REMOVAL_MEAN_MS)) + 1000
            if on and cut_removals else None
        )  # fmt: skip
        self.config_checked: dict[str, int] = {}  # member -> committed index checked
        self.operator_removed: set[str] = set()  # members an operator removed or replaced

    def _membership_step(self, now: int) -> None:
        """Now and then an operator asks the member it believes leads for a change."""
        self._cut_removal_step(now)
        if self._next_change_ms is None or now < self._next_change_ms:
            return
        rng = self._member_rng
        self._next_change_ms = now + int(rng.expovariate(1 / CHANGE_MEAN_MS)) + 1
        node = self._a_leader(rng)
        if node is None:
            return
        latest = node.logic.config_log.latest()
        # never a process gone for good (its node lost): it would never catch up
        outside = [p for p in self.ids if p not in latest and not self.gone(p)]
        voters, learners = list(latest.voters), list(latest.learners)
        choices = []
        if outside:
            choices += ["add", "add_learner"]
            if len(voters) > 1:
                choices += ["replace"]
        if learners:
            choices += ["promote", "remove_learner"]
        if len(voters) > 2:
            choices += ["remove"]
        if not choices:
            return
        what = rng.choice(choices)
        if what in ("add", "add_learner"):
            op, member, old = (Op.ADD if what == "add" else Op.ADD_LEARNER), rng.choice(outside), ""
        elif what == "replace":
            op, member, old = Op.REPLACE, rng.choice(outside), rng.choice(voters)
        elif what == "promote":
            op, member, old = Op.PROMOTE, rng.choice(learners), ""
        elif what == "remove_learner":
            op, member, old = Op.REMOVE, rng.choice(learners), ""
        else:
            op, member, old = Op.REMOVE, rng.choice(voters), ""
            if not self._leaves_live_majority(latest, member):
                return
        if op in (Op.REMOVE, Op.REPLACE) and self._removes_a_state_holder():
            return
        try:
            self._step(node, mc.ChangeMembers(op, member, None, old))
        except LedgerError as exc:
            self.stats[f"change_refused_{exc.code.name}"] += 1
            return
        self.stats[f"change_{op}"] += 1
        self.operator_removed.update([member] if op == Op.REMOVE else [old] if old else [])
        self.net.note(f"OPERATOR {node.id} takes {op} {member}" + (f" for {old}" if old else ""))

    def _a_leader(self, rng: random.Random) -> Node | None:
        """The member an operator believes leads: any that does (None: none does)."""
        leaders = [m for m in self.members.values() if m.alive and m.state.is_leader]
        return rng.choice(leaders).node if leaders else None

    def _leaves_live_majority(self, latest: Configuration, member: str) -> bool:
        """Whether LedgerGroup.remove_member's own check (``check_live_quorum``) lets
        ``member`` go: members whose node is lost do not count as alive."""
        try:
            check_live_quorum(latest.without(member), [p for p in self.ids if p not in self.lost])
        except LedgerError:
            return False
        return True

    def _removes_a_state_holder(self) -> bool:
        """Whether a removal (or a node lost) now may take away the last member holding the
        state a stranded machine waits for (its only snapshot damaged): the healthy members
        gone while one waits for their snapshot take the group's state with them, a double
        fault no group that keeps one copy survives."""
        return self.machine_path is not None and self._any_stranded()

    def _cut_removal_step(self, now: int) -> None:
        """Now and then the leader loses its links to a voter, and the operator removes that
        member -- down to the leader alone, as an operator removes a member that stopped
        answering: reads and rounds in flight then wait on a member being removed."""
        if self._next_cut_removal_ms is None or now < self._next_cut_removal_ms:
            return
        rng = self._cut_rng
        self._next_cut_removal_ms = now + int(rng.expovariate(1 / CUT_REMOVAL_MEAN_MS)) + 1
        node = self._a_leader(rng)
        if node is None:
            return
        latest = node.logic.config_log.latest()
        others = [v for v in latest.voters if v != node.id]
        if not others:
            return
        member = rng.choice(others)
        if not self._leaves_live_majority(latest, member) or self._removes_a_state_holder():
            return
        self.net.cut_both(node.id, member)
        try:
            self._step(node, mc.ChangeMembers(Op.REMOVE, member, None, ""))
        except LedgerError as exc:
            self.stats[f"change_refused_{exc.code.name}"] += 1
            return
        self.stats["change_cut_remove"] += 1
        self.operator_removed.add(member)
        self.net.note(f"OPERATOR {node.id} removes {member}, which it cannot reach")

    # -- the members' helpers follow their configuration ---------------------------------
    def _m_helpers(self, node: Node, peers: tuple[str, ...], booting: bool = False) -> None:
        """``LeadershipPart._helpers``: a dispatcher per member, none for members gone.
        ``booting``: a new dispatcher's process takes :data:`~.sim_config.HELPER_BOOT_MS`
        to start (calls to it wait meanwhile, and it reports its start at the end)."""
        for gone in [p for p in node.dispatchers if p not in peers]:
            del node.dispatchers[gone], node.dispatcher_drivers[gone], node.need_watch[gone]
            for n, chain in self._chains:  # its compiled-graph channels go with it
                if n is node and chain.peer == gone:
                    for e in chain.edges:
                        e.items.clear()
            fp = node.fast.logic if node.fast is not None else None
            if fp is not None and fp.graph is not None and gone in fp.graph:
                self._hop(node, self._fp_fallback, node, fp.gen, f"dispatcher to {gone} stopped")
        for p in peers:
            if p not in node.dispatchers:  # a new process: answers to an older one are lost
                key = f"dispatcher:{p}"
                node.helper_gen[key] = node.helper_gen.get(key, 0) + 1
                d = DispatcherLogic(self.group, node.id, p, self.replication, self.cache_bytes)
                node.dispatchers[p] = d
                node.dispatcher_drivers[p] = self._dispatcher_driver(node, p, d)
                node.need_watch[p] = NeedWatch()
                boot = None
                if booting:
                    boot = self.clock.now_ms + self._helper_rng.randint(*HELPER_BOOT_MS)
                    node.booting[key] = boot
                    self.stats["dispatchers_booting"] += 1
                    self.net.note(f"{node.id}'s dispatcher to {p} boots until {boot}")
                self._helper_up(node, "dispatcher", p, boot)

    # -- checks ----------------------------------------------------------------------------
    def voters_at(self, index: int) -> tuple[str, ...]:
        """The voters in effect at ``index``, as the live member that committed the most
        has them (the first configuration's without configuration changes)."""
        if len(self.ids) == self.n:
            return tuple(self.ids)
        alive = [m for m in self.members.values() if m.alive]
        if not alive:
            return tuple(self.voters0)
        best = max(alive, key=lambda m: m.store.committed_index)
        return best.node.logic.config_log.at(index).voters

    def voters_around(self, index: int) -> list[tuple[str, ...]]:
        """The voters in effect at ``index`` and, when a change took effect at or below it,
        those of the configuration before: a leader's checker counts the latest or, at most
        one change behind, the one before -- a majority of either meets every majority of
        the other (single-server changes)."""
        now = self.voters_at(index)
        if len(self.ids) == self.n:
            return [now]
        alive = [m for m in self.members.values() if m.alive]
        if not alive:
            return [now]
        clog = max(alive, key=lambda m: m.store.committed_index).node.logic.config_log
        at = [i for i, _ in clog.entries if i <= index]
        return [now, clog.at(at[-1] - 1).voters] if at else [now]

    def current_members(self) -> tuple[str, ...] | None:
        """The members of the configuration the leader acts on (None: no single leader)."""
        leaders = [m for m in self.members.values() if m.alive and m.state.is_leader]
        if len(leaders) != 1:
            return None
        return leaders[0].node.logic.config_log.latest().members

    def check_configurations(self) -> None:
        """Each live member's configurations are those its log holds (the watch misses no
        append, truncation or reset), and the committed ones agree with every other
        member's: what a member committed is a prefix of what any later leader holds."""
        for m in self.members.values():
            if not m.alive:
                continue
            clog = m.node.logic.config_log
            store = m.store
            held = [
                (i, Configuration.decode(body))
                for i, body in store.channel_entries(CONFIG_CHANNEL, store.ledger_begin_index)
            ]
            mine = [(i, c) for i, c in clog.entries if i >= store.ledger_begin_index]
            if held != mine:
                self.fail(f"{m.id}'s configurations {mine} are not those its log holds {held}")
            committed = store.committed_index
            for i, c in mine:
                if i > committed:
                    break
                seen = self.committed_configs.setdefault(i, c)
                if seen != c:
                    self.fail(f"{m.id} committed configuration {c} at {i}, another {seen}")
