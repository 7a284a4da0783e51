"""Lost nodes and their replacement in the whole-group simulation.

A seeded fault loses a member's node for good: its process dies and never comes back (Ray
reports the node dead).  The leader hears Ray's view of the nodes each second, as
``MemberActor._watch_nodes`` delivers it (:class:`~rayledger.actors.core.member.ClusterView`);
the shipped core decides when a member is lost long enough and where its replacement goes
(:meth:`~rayledger.election.membership.Membership.lost`), and hands out a
:class:`~rayledger.election.membership.Spawn`.  This mixin carries it out as
``MemberActor._spawn`` does: start the new member on the chosen node (an empty disk, the
configuration of the spawn as its first), ask this leader to replace the lost member with it
(``change_members("replace", ...)``, again while LEADER_NOT_READY), and step
:class:`~rayledger.actors.core.member.SpawnDone`; the member it started is stopped
(``ray.kill``) when the core says so (its change refused; not when it may be written).  Nothing decides here but when a node is lost.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass

from rayledger.actors.core import member as mc
from rayledger.election import MemoryTermStore
from rayledger.election.membership import GONE, Op, Spawn
from rayledger.storage import LedgerError, ResponseCode

from .clients import ClientReply
from .node_state import Node, SimMember
from .sim_config import CLUSTER_VIEW_MS, FREE_HOSTS, LOST_MEAN_MS, SPAWN_START_MS

SPAWNER = "spawner"  # where the answers to a spawn's change go (MemberActor._spawn's future)


@dataclass
class _SpawnCall:
    """A spawn's ``change_members`` call: its answer once the configuration committed."""

    spawn: Spawn
    reply: ClientReply | None = None


class LostMembers:
    """Lost nodes, Ray's view of the nodes, and spawns (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _init_lost(self, seed: int, on: bool) -> None:
        self.lost_members = on
        self._lost_rng = random.Random(seed * 7919 + 101)  # its own stream
        rng = self._lost_rng
        self._next_lost_ms: int | None = (
            int(rng.expovariate(1 / LOST_MEAN_MS)) + 2000 if on else None
        )
        self._next_view_ms: int | None = CLUSTER_VIEW_MS if on else None
        self.lost: set[str] = set()  # members whose node is gone for good
        self.killed: set[str] = set()  # spawned members stopped again (their node lives)
        self.host_of: dict[str, str] = {mid: f"host-{mid}" for mid in self.ids}
        # Ray's live nodes: each process's, and some that host none
        self._hosts = {*self.host_of.values(), *(f"host-free{k}" for k in range(FREE_HOSTS))}
        self._spawn_calls: dict[int, _SpawnCall] = {}
        self._spawn_ids = iter(range(-1, -(1 << 40), -1))  # req ids of spawn calls

    # -- the fault ---------------------------------------------------------------------------
    def _lost_step(self, now: int) -> None:
        """Now and then a member's node is lost (one at a time, and only while the voters
        left of the leader's configuration are still a majority of it)."""
        if self._next_view_ms is not None and now >= self._next_view_ms:
            self._next_view_ms = now + CLUSTER_VIEW_MS
            self._cluster_view()
        if self._next_lost_ms is None or now < self._next_lost_ms:
            return
        rng = self._lost_rng
        self._next_lost_ms = now + int(rng.expovariate(1 / LOST_MEAN_MS)) + 1
        leaders = [m for m in self.members.values() if m.alive and m.state.is_leader]
        if len(leaders) != 1:
            return
        leader = leaders[0]
        clog = leader.node.logic.config_log
        latest = clog.latest()
        if any(m in self.lost for m in latest.members):  # its replacement is not done yet
            return
        # a change under way may leave fewer voters (a plan's removal, an entry not yet
        # committed): a loss now could take a majority of the configuration that follows,
        # which no Raft group survives -- lose nodes only between changes
        if latest.joining or clog.pending(leader.store.committed_index):
            return
        if leader.node.book.config_queued:
            return
        # nor while a member holds a change its leader never got (an old leader's entry,
        # not committed): its configuration counts the node to lose, and the log that
        # truncates it may be the lost one -- until then it votes with what it holds
        for m in self.members.values():
            if m.alive and m.id in latest.members and m.node.logic.config_log.latest() != latest:
                return
        voters = list(latest.voters)
        if len(voters) - 1 < latest.quorum:
            return
        mid = rng.choice(voters)
        if self._removes_a_state_holder():  # (a stranded machine waits for its state)
            return
        self.lose(mid)

    def lose(self, mid: str) -> None:
        """``mid``'s node is lost for good: its process dies and never restarts."""
        m = self.members[mid]
        if self.injector is not None:
            self.injector.crashed.discard(mid)  # never restarted by the fault injector
        if m.alive:
            self._crash(mid, power=False)
        self.lost.add(mid)
        self._hosts.discard(self.host_of[mid])
        self.stats["nodes_lost"] += 1
        self.net.note(f"FAULT {mid}'s node {self.host_of[mid]} is lost for good")

    def _cluster_view(self) -> None:
        """``MemberActor._watch_nodes``: each live leader gets Ray's view of the nodes (a
        crashed member's node lives: Ray restarts the member on it).  Every process of the
        run counts as a member's -- a spare's too: its id and node are taken -- and one a
        failed spawn stopped is GONE (its node hosts nothing)."""
        alive = tuple(sorted(self._hosts))
        nodes = {mid: GONE if mid in self.killed else h for mid, h in self.host_of.items()}
        for m in self.members.values():
            if m.alive and m.state.is_leader:
                # a member the operator removed is stopped and its node forgotten
                # (LedgerGroup.remove_member), until the operator adds it back
                latest = m.node.logic.config_log.latest()
                view = {k: v for k, v in nodes.items()
                        if k not in self.operator_removed or k in latest}  # fmt: skip
                self._step(m.node, mc.ClusterView(alive, view))

    # -- MemberActor._spawn ------------------------------------------------------------------
    def _spawn_member(self, node: Node, spawn: Spawn) -> None:
        self.stats["spawns"] += 1
        self.net.note(f"{node.id} SPAWNS {spawn.member} on {spawn.node} to replace "
                      f"{spawn.replaces}")  # fmt: skip
        self._spawn(node, self._spawn_task(node, spawn))

    def _spawn_task(self, node: Node, spawn: Spawn):
        """An actor coroutine of the leader: start the member, ask for the change, report;
        stop it when the core says so."""
        ok, code = False, None
        yield self._lost_rng.randint(*SPAWN_START_MS)
        if self._start_spawned(spawn):
            while True:
                call = _SpawnCall(spawn)
                req_id = next(self._spawn_ids)
                self._spawn_calls[req_id] = call
                try:
                    self._step(node, mc.ChangeMembers(Op.REPLACE, spawn.member, (SPAWNER, req_id),
                                                      spawn.replaces))  # fmt: skip
                except LedgerError as exc:
                    del self._spawn_calls[req_id]
                    if exc.code == ResponseCode.LEADER_NOT_READY:
                        yield 200
                        continue
                    self.net.note(f"{node.id}: replacing {spawn.replaces} refused: {exc.code.name}")
                    code = exc.code
                    break
                while call.reply is None:  # the future of change_members (no time-out)
                    yield 10
                del self._spawn_calls[req_id]
                ok = call.reply.code == ResponseCode.SUCCESS
                code = None if ok else call.reply.code
                if not ok:
                    self.net.note(f"{node.id}: replacing {spawn.replaces} ended "
                                  f"{call.reply.code.name}")  # fmt: skip
                break
        self.stats["spawns_ok" if ok else "spawns_failed"] += 1
        out = self._step(node, mc.SpawnDone(spawn.member, ok, code))
        if spawn.member in out.stop_spawned:  # not a member: no lingering
            self._kill_spawned(spawn.member)

    def _spawn_reply(self, reply: ClientReply) -> None:
        call = self._spawn_calls.get(reply.req_id)
        if call is not None and call.reply is None:
            call.reply = reply

    def _start_spawned(self, spawn: Spawn) -> bool:
        """``spawn_member``: a new process on ``spawn.node`` with an empty disk; False when
        the name is taken (a live process, or a crashed one Ray would restart)."""
        mid = spawn.member
        m = self.members.get(mid)
        if m is not None and mid not in self.killed:
            self.stats["spawn_name_taken"] += 1
            return False
        if m is None:
            m = SimMember(mid, MemoryTermStore())
            self.members[mid] = m
            self.ids.append(mid)
            self.net.nodes = (*self.net.nodes, mid)
        else:  # a name freed by ray.kill, on another node: nothing of the old one
            self.killed.discard(mid)
            m.store = None
            m.term_store = MemoryTermStore()
            m.committed_seen = m.verified_end = m.machine_high = -1
            m.rebases = []
            m.hooked = None
            m.config_store = type(m.config_store)()
        if self._tmp is not None:
            m.data_dir = os.path.join(self._tmp, f"{mid}@{spawn.node}")
            shutil.rmtree(m.data_dir, ignore_errors=True)
        m.initial = spawn.config
        self.host_of[mid] = spawn.node
        self._start(mid)
        return True

    def _kill_spawned(self, mid: str) -> None:
        """``ray.kill(no_restart=True)`` of a spawned member that did not join."""
        if self.injector is not None:
            self.injector.crashed.discard(mid)
        if self.members[mid].alive:
            self._crash(mid, power=False)
        self.killed.add(mid)
        self.stats["spawned_killed"] += 1

    def _stop_losing(self) -> None:
        """Healing: no more lost nodes (Ray's view of the nodes goes on)."""
        self._next_lost_ms = None

    def gone(self, mid: str) -> bool:
        """Whether ``mid``'s process is gone for good (its node lost, or killed)."""
        return mid in self.lost or mid in self.killed


__all__ = ["SPAWNER", "LostMembers"]
