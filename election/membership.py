"""The leader's membership decisions (sans-I/O: no clock, no Ray, no files).

A change is one configuration entry written through the append path (``RoundBook.admit_config``,
checked by ``check_change``: one voter at a time, one change in flight, none before the
leader committed an entry of its term).  What this module decides:

* what an operator's request means as the next configuration (:meth:`Membership.propose`):
  add a learner, add a member (a learner planned to be promoted), replace one (a learner
  planned to be promoted and then to see the old member removed), remove one;
* what the leader changes on its own (:meth:`Membership.due`): a planned learner within
  ``promote_lag`` entries of the leader's log becomes a voter, and then the member it
  replaces leaves -- two single-server changes, carried on by whichever member leads,
  since the plans are part of the configuration;
* which members to replace because Ray reports their node dead for ``replace_lost_after_ms``
  and on which node (:meth:`Membership.lost`, :func:`choose_node`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rayledger.election.configuration import Configuration
from rayledger.storage import LedgerError, ResponseCode

log = logging.getLogger("rayledger.actors")


class Op:
    """What an operator asks of the group's configuration."""

    ADD_LEARNER = "add_learner"  # a learner that stays one
    ADD = "add"  # a learner, promoted to voter once caught up
    REPLACE = "replace"  # a learner, promoted once caught up, then ``replaces`` leaves
    REMOVE = "remove"
    PROMOTE = "promote"  # a learner votes from now on (whatever its progress)
    ALL = (ADD_LEARNER, ADD, REPLACE, REMOVE, PROMOTE)


MAYBE_WRITTEN = frozenset(
    {
        ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
        ResponseCode.TERM_CHANGED,
        ResponseCode.TIMEOUT,
        ResponseCode.APPEND_OUTCOME_UNKNOWN,
    }
)
"""A change that ended with one of these may be in the log all the same: its entry was
written and its commit not seen."""

GONE = "gone"
"""A member's node as Ray's view reports it once its process was stopped for good (a
replacement whose add was taken for failed): it runs nowhere, and no leader -- also one
elected after the leader that stopped it -- waits for it."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """The leader must hand leadership to ``target`` before the change it plans (it is
    the member to leave)."""

    target: str


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start member ``member`` on node ``node`` (as a learner of ``config``) to replace
    ``replaces``, whose node is lost."""

    member: str
    node: str
    replaces: str
    config: Configuration


def choose_node(alive_nodes: Iterable[str], member_nodes: Mapping[str, str | None]) -> str | None:
    """A live node for a new member: one that hosts no member of this group (the first in
    order; a lost member's node counts as taken, Ray may report it alive for a while), or --
    on a one-node cluster -- that node; None when every live node of several hosts one."""
    alive = sorted(set(alive_nodes))
    taken = {n for n in member_nodes.values() if n is not None}
    free = [n for n in alive if n not in taken]
    if free:
        return free[0]
    if len(alive) == 1:
        return alive[0]
    return None


def check_node(
    node: str, alive_nodes: Iterable[str], member_nodes: Mapping[str, str | None]
) -> str:
    """``node`` may host a new member: it is alive, and -- unless it is the only node --
    hosts no member of this group (NODE_UNAVAILABLE otherwise)."""
    alive = set(alive_nodes)
    if node not in alive:
        raise LedgerError.of(ResponseCode.NODE_UNAVAILABLE, f"node {node} is not alive")
    hosts = sorted(m for m, n in member_nodes.items() if n == node)
    if hosts and len(alive) > 1:
        raise LedgerError.of(ResponseCode.NODE_UNAVAILABLE,
                             f"node {node} already hosts member(s) {hosts} of this group")  # fmt: skip
    return node


def check_live_quorum(after: Configuration, alive_members: Iterable[str]) -> Configuration:
    """A change may leave the group only with a majority of live voters (NO_LIVE_QUORUM)."""
    live = [v for v in after.voters if v in set(alive_members)]
    if len(live) < after.quorum:
        raise LedgerError.of(
            ResponseCode.NO_LIVE_QUORUM,
            f"voters {list(after.voters)} after the change, only {live} alive: no majority",
        )
    return after


@dataclass
class Membership:
    """One leader's membership decisions: the learners' progress (from their dispatchers),
    the plans carried in the configuration, and the lost members it replaces."""

    self_id: str
    promote_lag: int = 1000
    replace_lost_after_ms: int | None = None  # None: no automatic replacement
    match: dict[str, int] = field(default_factory=dict)  # peer -> index it stores
    dead_since: dict[str, int] = field(default_factory=dict)  # member -> first seen dead
    waiting: tuple[str, ...] = ()  # lost members with no free node to replace them on
    spawn_wait_ms: int = 120_000  # one replacement at a time, each given this long to start
    _spawned: set[str] = field(default_factory=set)  # member ids started for a replacement
    _spawning: tuple[str, int] | None = None  # (member, give up at) started, not yet added
    _failed: set[str] = field(default_factory=set)  # spawned, then stopped: not to stay

    # -- what an operator asks ---------------------------------------------------------
    def propose(
        self, current: Configuration, op: str, member: str, replaces: str = ""
    ) -> Configuration | Transfer:
        """The configuration after ``op`` on ``member`` (raises the coded error of a bad
        request; the configuration itself does not change), or a :class:`Transfer` when
        the leader itself is to leave: it hands over first, the caller asks the next one."""
        if op not in Op.ALL:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"unknown change {op!r}")
        if not isinstance(member, str) or not member or "/" in member:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"a member id is a non-empty string without '/': {member!r}")  # fmt: skip
        if op == Op.REMOVE:
            if member == self.self_id and member in current:
                current.without(member)  # the last voter: refused before any hand-over
                others = [v for v in current.voters if v != member]
                return Transfer(self._best(others))
            return current.without(member)
        if op == Op.ADD_LEARNER:
            return current.with_learner(member)
        if op == Op.PROMOTE:
            if not current.is_learner(member):
                raise LedgerError.of(ResponseCode.ILLEGAL_MEMBER_STATE,
                                     f"{member!r} is not a learner")  # fmt: skip
            return current.with_voter(member)
        if op == Op.ADD:
            return current.with_learner(member, promote=True)
        if not replaces or replaces not in current:
            raise LedgerError.of(ResponseCode.UNKNOWN_MEMBER, f"{replaces!r} is not a member")
        return current.with_learner(member, replaces=replaces)

    def _best(self, voters: list[str]) -> str:
        """The voter that stores the most of the leader's log (to hand leadership to)."""
        return max(voters, key=lambda v: (self.match.get(v, -1), v))

    def _successor(self, current: Configuration, new: str, end_index: int) -> str | None:
        """Whom a leader about to leave hands leadership to: its replacement when that one
        is caught up in this term, else the voter caught up the furthest; None while no
        voter's progress in this term is known yet (ask again).  Handing over to a
        replacement that fell behind after its promotion -- again and again, each time the
        leader was re-elected in its term, while it could not win an election -- wedged
        the group."""
        lag = end_index - self.promote_lag
        known = {v: m for v, m in self.match.items() if m >= lag}  # reported in this term
        if new in known:
            return new
        ready = [v for v in current.voters if v != self.self_id and v in known]
        return self._best(ready) if ready else None

    def check_live(self, current: Configuration, after: Configuration) -> Configuration:
        """A change of voters may leave the group only with a majority of them on live
        nodes, as far as this leader knows (NO_LIVE_QUORUM): a group of {n1, n2} with n1's
        node lost can never commit again, nor change back."""
        if after.voters == current.voters:
            return after
        return check_live_quorum(after, [v for v in after.voters if v not in self.dead_since])

    # -- what the leader changes on its own ------------------------------------------------
    def progress(self, peer: str, match_index: int) -> None:
        self.match[peer] = max(self.match.get(peer, -1), match_index)

    def reset(self) -> None:
        """A new term: progress is learned again from its dispatchers."""
        self.match.clear()

    def due(self, current: Configuration, end_index: int) -> Configuration | Transfer | None:
        """The next step of a plan in ``current``: a learner within ``promote_lag`` of
        ``end_index`` promoted, or the member it replaces removed once it votes (a
        hand-over first when that is this leader)."""
        for new, old in current.joining:
            if current.is_learner(new):
                # caught up, as its dispatcher reported in this term (no report: nothing yet)
                if new in self.match and self.match[new] >= end_index - self.promote_lag:
                    if old and current.is_learner(old):  # a learner's replacement stays one
                        return current.without(old)
                    log.info("[%s] promotes %s (stores %d of %d)", self.self_id, new,
                             self.match.get(new, -1), end_index)  # fmt: skip
                    return current.with_voter(new)
            elif old and old in current:
                if old == self.self_id:
                    target = self._successor(current, new, end_index)
                    return None if target is None else Transfer(target)
                after = current.without(old)
                try:  # another voter's node is lost: removing a live one would leave no live
                    return self.check_live(current, after)  # majority; wait for its return
                except LedgerError:
                    return None
        return None

    # -- lost nodes ----------------------------------------------------------------------
    def lost(
        self,
        current: Configuration,
        alive_nodes: Iterable[str],
        member_nodes: Mapping[str, str | None],
        now_ms: int,
        taken_ids: Iterable[str] = (),
    ) -> Spawn | None:
        """Ray's view of the nodes: a member whose node is dead for ``replace_lost_after_ms``
        and not being replaced yet gets a replacement on a live node that hosts no member of
        this group (:attr:`waiting` lists those that wait for one)."""
        if self.replace_lost_after_ms is None:
            return None
        if self._spawning is not None:
            member, until = self._spawning
            if member in current or now_ms >= until:
                self._spawning = None  # added (it is in the configuration), or given up
            else:
                return None  # one replacement at a time
        alive = set(alive_nodes)
        lost = []
        for m in current.members:
            node = member_nodes.get(m)
            if m == self.self_id or node is None or node in alive:
                self.dead_since.pop(m, None)
                continue
            since = self.dead_since.setdefault(m, now_ms)
            if now_ms - since >= self.replace_lost_after_ms:
                lost.append(m)
        self.waiting = ()
        for m in lost:
            if current.replacement_of(m) is not None:
                continue  # its replacement is under way
            node = choose_node(alive, member_nodes)
            if node is None:
                self.waiting = tuple(x for x in lost if current.replacement_of(x) is None)
                return None
            new = current.fresh_id([*member_nodes, *self._spawned, *taken_ids])
            self._spawned.add(new)
            self._spawning = (new, now_ms + self.spawn_wait_ms)
            log.warning("[%s] replaces %s (its node is lost) with %s on node %s",
                        self.self_id, m, new, node)  # fmt: skip
            return Spawn(new, node, m, current.with_learner(new, replaces=m))
        return None

    def spawn_done(self, member: str, ok: bool, code: ResponseCode | None = None) -> bool:
        """The transport started ``member`` and asked for it to be added (``ok``), or could
        not (``code``: how the change ended, None: it was never asked): the next view of
        the nodes may try again (with another id).  Either way this replacement is no
        longer starting: once added, the configuration says it replaces the lost member (a
        second one is not started for it), and an operator may remove it before the next
        view -- then the lost member is replaced again.  Returns whether to stop its
        process: not when the change may be in the log (:data:`MAYBE_WRITTEN`) -- it may
        be promoted to a voter, and stopping a voter can leave no majority; the member
        then stays, as a member or a process its configuration leaves out."""
        if self._spawning is not None and self._spawning[0] == member:
            self._spawning = None
        if ok or code in MAYBE_WRITTEN:
            return False
        self._failed.add(member)
        return True

    def stopped_spawns(
        self, current: Configuration, member_nodes: Mapping[str, str | None] | None = None
    ) -> Configuration | None:
        """A replacement the transport stopped as failed may have been added all the same
        (its add went through as the call failed): it would stay a learner that never
        catches up, and its plan would never end.  It is removed, and the next view of
        the nodes replaces the lost member again.  The leader that stopped it remembers;
        a later one knows it from the view (its node is :data:`GONE`)."""
        nodes = member_nodes or {}
        gone = {m for m, node in nodes.items() if node == GONE and current.is_learner(m)}
        for m in sorted(self._failed | gone):
            if m in current:
                return current.without(m)
            self._failed.discard(m)
        return None

    def lost_count(self, current: Configuration) -> int:
        """Members whose node Ray reports dead, not being replaced yet (the
        ``rayledger_members_lost`` figure)."""
        return sum(
            1 for m in current.members if m in self.dead_since and current.replacement_of(m) is None
        )


__all__ = [
    "Membership",
    "Op",
    "Spawn",
    "Transfer",
    "check_live_quorum",
    "check_node",
    "choose_node",
]
