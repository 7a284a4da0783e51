"""``MemberActor`` (actors/member/actor.py) in the whole-group simulation: ticks, role changes,
client appends written as rounds, and the answers of the helpers and the fast path."""

from __future__ import annotations

import dataclasses

import numpy as np
from rayledger.actors.core import member as mc
from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.read_path import AskLeader, WaitCommitted
from rayledger.actors.core.reads import Consistency
from rayledger.actors.core.rounds import Finished
from rayledger.election import RoleChange
from rayledger.election.messages import LeadershipTransferRequest
from rayledger.replication.checker import Resolution
from rayledger.replication.messages import Announcement
from rayledger.storage import LedgerError, ResponseCode

from .clients import ClientAppend, ClientRead, ClientReadReply, ClientReply, LeaderReadIndex
from .kv_history import KvGet
from .node_state import CgToken, Node
from .node_transport import DIED, TIMEOUT, Timed
from .sim_config import CHECKER_CONFIGURE_MS, MAINTAIN_MAX_SLEEP_MS


class MemberDelivery:
    """The member's actor shell (a mixin of :class:`~.group_sim.GroupSim`): it steps the
    shipped :class:`~rayledger.actors.core.member.MemberCore` with the events that reach
    the node and carries out what the core returns (:meth:`_carry`)."""

    def _step(self, node: Node, ev) -> mc.MemberOut:
        """One event into the member's core; its Out carried out at once."""
        out = node.core.step(ev, self.clock.now_ms)
        self._carry(node, out)
        return out

    def _carry(self, node: Node, out: mc.MemberOut) -> None:
        """``MemberActor``'s carrying out of a :class:`MemberOut` (the core's one order)."""
        mc.carry_out(out, _SimPorts(self, node))

    def _run_action(self, node: Node, run: mc.Run):
        """One action of a core's process, then its answer stepped in (an action that takes
        no time is answered in this very step)."""
        value = yield from self._perform(node, run.action)
        self._step(node, mc.ProcessAnswered(run.pid, value))

    def _maintain(self, node: Node) -> None:
        """``MemberActor._maintain``: tick, then sleep until the elector's next deadline
        (at least the maintain interval, at most a second)."""
        now = self.clock.now_ms
        self._step(node, mc.Tick())
        if node.dead:
            return
        interval = self.tick_ms
        delay = node.core.next_tick_ms(now) - now
        due = now + min(MAINTAIN_MAX_SLEEP_MS, max(interval, delay))
        node.maintain_at = self._at(node, due, self._maintain, node)

    def _rearm(self, node: Node) -> None:
        """``MemberActor._rearm`` (with ``wake_on_election``): an election message, an
        answer to one, a transfer or a step-down that brings the elector's next deadline
        before the maintainer's wake-up wakes it (a hop: it sleeps on another loop)."""
        entry = node.maintain_at
        if not self.wake_on_election or node.dead or entry is None or not entry[5]:
            return
        if node.core.next_tick_ms(self.clock.now_ms) < entry[0]:
            self._cancel(entry)
            node.maintain_at = self._hop(node, self._maintain, node)

    def _flush_then_answer(self, node: Node, answers: list):
        if (yield from self._disk_flush(node)) is None:
            self._answer(node, answers)

    def _answer(self, node: Node, answers: list) -> None:
        """Answers of the entry handler: a plain push's go back over the network, a graph
        push's wait for the next ``cg_push`` (``MemberActor._late``)."""
        for tok, resp in answers:
            if type(tok) is CgToken:
                node.late.append((tok.key, resp, tok.origin))
            else:
                caller, call_id = tok
                self.rpc.reply(node.id, caller, call_id, resp)

    def _m_helper_started(
        self, node: Node, kind: str, peer: str | None, pid: int, restarted: bool = False
    ) -> None:
        """``MemberActor.helper_started``: a restarted helper is set up again."""
        self._step(node, mc.HelperStarted(kind, peer, pid, restarted))

    @staticmethod
    def _failed(value) -> sv.Failed | None:
        if value is TIMEOUT:
            return sv.Failed("no answer in time", timeout=True)
        if value is DIED:
            return sv.Failed("the helper's process died")
        return None

    def _register(self, node: Node, a: rp.Register) -> None:
        """A round to the node's checker (a hop: the call is on its way)."""
        self._hop(node, self._c_add_round, node, a.term, a.first, a.last, a.rid,
                  a.leader_mark, a.config)  # fmt: skip

    def _perform(self, node: Node, a):  # noqa: C901 -- one branch per action, nothing else
        """Carry out an action of the core's processes: calls to the helpers with their
        time-outs, the disk, the compiled path."""
        if isinstance(a, rp.Register):
            self._register(node, a)
            return None
        if isinstance(a, rp.Submit):
            return self._fp_submit(node, a.a, list(a.spans))
        if isinstance(a, rp.Announce):
            self._announce_plain(node, a.a)
            return None
        if isinstance(a, sv.Sleep):
            if a.ms:
                yield a.ms
            return None
        if isinstance(a, sv.FastStop):
            if node.fast is not None:
                self._fp_stop(node)
            return None
        if isinstance(a, sv.CheckerStepDown):
            self.net.note(f"{node.id} stops leading (now {a.new_term})")
            (resolved,) = yield Timed(a.timeout_ms, [lambda: self._c_step_down(node, a.new_term)])
            return self._failed(resolved) or resolved
        if isinstance(a, sv.DeactivateDispatchers):
            calls = [(lambda p=p: self._d_deactivate(node, p, a.term)) for p in node.dispatchers]
            done = yield Timed(a.timeout_ms, calls)
            return sum(1 for r in done if r is TIMEOUT)
        if isinstance(a, sv.Flush):
            return (yield from self._disk_flush(node))
        if isinstance(a, sv.SetUpHelpers):
            # MemberActor._create_helpers (ensure_helpers): a member's first term starts them,
            # once; later the configuration's changes (Helpers) add and stop dispatchers
            if not node.helpers_made:
                node.helpers_made = True
                self._m_helpers(node, node.core.supervisor.dispatcher_peers())
            if a.only is None:
                self.net.note(
                    f"{node.id} LEADS term={a.term} from index {a.start} "
                    f"(committed {a.info.committed})"
                )
            if a.only in (None, "checker"):
                call = [lambda: self._c_become_leader(node, a.term, a.start, a.info)]
                (r,) = yield Timed(a.timeout_ms, call)
                if self._failed(r):
                    return self._failed(r)
                self._step(node, mc.CheckerSetUp(a.term))  # what a dead checker held
            peers = [p for p in node.dispatchers if a.only in (None, "checker", p)]
            # a dispatcher added by a configuration answers once its process booted
            if (yield from self._booted(node, [("dispatcher", p) for p in peers], a.timeout_ms)):
                return sv.Failed("no answer in time", timeout=True)
            done = yield Timed(a.timeout_ms, [(lambda p=p: self._d_activate(node, p, a.info))
                                              for p in peers])  # fmt: skip
            return next((self._failed(r) for r in done if self._failed(r)), None)
        if isinstance(a, sv.Ping):
            late = yield from self._booted(node, a.keys, a.timeout_ms)
            if late:
                a = dataclasses.replace(a, keys=tuple(k for k in a.keys if k not in late))
            calls = [(lambda k=k: self._c_pid(node) if k == sv.CHECKER else self._d_pid(node, k[1]))
                     for k in a.keys]  # fmt: skip
            done = yield Timed(a.timeout_ms, calls)
            out = dict.fromkeys(late, "timeout")
            for k, r in zip(a.keys, done, strict=True):
                out[k] = "timeout" if r is TIMEOUT else "error" if r is DIED else "ok"
            return out
        if isinstance(a, sv.Replace):
            for k in a.keys:
                if k == sv.CHECKER:
                    self._hop(node, self._c_kill, node)
                else:
                    self._hop(node, self._d_kill, node, k[1])
            return None
        if isinstance(a, sv.Ready):
            self.net.note(f"{node.id} ready for appends in term {a.term}")
            if self.members[node.id].fast_enabled and len(self.ids) > 1:
                self._fp_start(node, a.term)
            return None
        if isinstance(a, WaitCommitted):
            while node.logic.store.committed_index < a.index:
                if self.clock.now_ms >= a.deadline_ms:
                    return sv.Failed("not committed in time", timeout=True)
                yield 5
            return True
        if isinstance(a, AskLeader):  # the leader's read index, over the network
            slot: list = []
            self.rpc.call(node.id, a.leader, LeaderReadIndex(a.consistency.value, slot))
            while not slot:
                if self.clock.now_ms >= a.deadline_ms:
                    return sv.Failed("no read index in time", timeout=True)
                yield 5
            got = slot[0]
            return sv.Failed("no answer", timeout=True) if got is None else got
        if isinstance(a, sv.Helpers):
            if not node.helpers_made:  # LeadershipPart._helpers: none yet -- made now, or not
                if not a.start:
                    return None
                node.helpers_made = True
                self._m_helpers(node, node.core.supervisor.dispatcher_peers())
                return None
            if self.helper_delays:  # membership_changes.py: new dispatchers boot a while
                self._m_helpers(node, a.peers, booting=True)
            else:
                self._m_helpers(node, a.peers)
            return None
        if isinstance(a, sv.CheckerConfigure):
            if self.helper_delays:  # the checker's queue: the role lock is held meanwhile
                yield self._helper_rng.randint(*CHECKER_CONFIGURE_MS)
                self.stats["checker_configures_delayed"] += 1
            call = [lambda: self._c_configure(node, a.term, a.info)]
            (r,) = yield Timed(a.timeout_ms, call)
            return self._failed(r) or r  # False: the checker does not serve the term
        if isinstance(a, sv.MachineRole):
            return (yield from self._m_role(node))  # machine_delivery.py
        if isinstance(a, sv.WaitMachine):
            return (yield from self._m_wait_ready(node, a.term))
        raise TypeError(f"unknown action {a!r}")

    def _booted(self, node: Node, keys, timeout_ms: int):
        """An actor coroutine: calls to helpers still booting (``Node.booting``) wait in
        their queue until they booted; returns the keys that did not within ``timeout_ms``."""
        now = self.clock.now_ms
        due = {k: node.booting.get(f"{k[0]}:{k[1]}", 0) for k in keys if k != sv.CHECKER}
        due = {k: t for k, t in due.items() if t > now}
        if not due:
            return ()
        wait = min(max(due.values()) - now, timeout_ms)
        self.stats["calls_wait_for_boot"] += 1
        yield wait
        return tuple(k for k, t in due.items() if t > now + wait)

    # -- reads: the shipped read path, its rounds over the network --------------------------
    def _read_task(self, node: Node, msg: ClientRead) -> None:
        """``MemberActor.read_index`` on the member a reader believes leads, or a read any
        member serves (``ReadPart._read_limit``)."""
        ev = mc.ReadIndex(Consistency(msg.consistency), msg, leader_only=not msg.anywhere)
        self._step(node, ev)

    def _reads_out(self, node: Node, out: mc.MemberOut) -> None:
        """Readers answered, confirmation rounds' heartbeats over the network, timers."""
        for msg, result in out.reads_done:
            if isinstance(msg, KvGet):  # a KV get: the machine answers next (kv_history.py)
                self._kv_read_done(node, msg, result)
                continue
            if isinstance(msg, tuple):  # a follower's LeaderReadIndex call
                caller, call_id = msg
                self.rpc.reply(node.id, caller, call_id, result)
                continue
            if isinstance(result, LedgerError):
                reply = ClientReadReply(msg.req_id, result.code, leader_id=result.leader_id)
            else:
                by = "leader" if node.logic.state.is_leader else "follower"
                self.stats[f"reads_served_{msg.consistency}_{by}"] += 1
                reply = ClientReadReply(msg.req_id, ResponseCode.SUCCESS, result, node.id)
            self._send_held(node.id, msg.client, reply, self._read_rng.randint(1, 15))
        for peer, req in out.read_pings:
            self.rpc.call(node.id, peer, req)
        if out.expire_at_ms is not None:
            self._at(node, out.expire_at_ms, self._step, node, mc.ExpireReads())
        for pid, at in out.deadlines:
            self._at(node, at, self._step, node, mc.Deadline(pid))

    def _client_append(self, node: Node, msg: ClientAppend) -> None:
        """``MemberActor.append``: admit and queue (:class:`RoundBook`), one round per turn."""
        ev = mc.ClientAppend(list(msg.bodies), self.group, msg.target, (msg.client, msg.req_id),
                             msg.ident, msg.maybe_stored)  # fmt: skip
        try:
            self._step(node, ev)
        except LedgerError as exc:
            self._to_client(
                node.id, msg.client, ClientReply(msg.req_id, exc.code, leader_id=exc.leader_id)
            )

    def _write_round(self, node: Node) -> None:
        """Group commit: the queued appends become one store batch and one round, sent on
        by the shipped round path (:class:`~rayledger.actors.core.round_path.RoundPath`)."""
        fast = node.fast is not None and node.fast.logic.offered  # live or parked
        self._step(node, mc.WriteRound(fast, self.clock.now_ms + self._skew(node.id)))

    def _skew(self, member: str) -> int:
        """How far ``member``'s wall clock is off the simulation's (``stamp_skew_ms``)."""
        if not self.stamp_skew_ms:
            return 0
        if member not in self._skews:
            self._skews[member] = self._skew_rng.randint(-self.stamp_skew_ms, self.stamp_skew_ms)
        return self._skews[member]

    def _announce_plain(self, node: Node, a: Announcement) -> None:
        for p in node.dispatchers:
            self._hop(node, self._d_on_announcement, node, p, a)

    def _m_on_resolved(self, node: Node, r: Resolution) -> None:
        """``MemberActor.on_resolved``: from the checker, or the compiled graph's output."""
        self._step(node, mc.RoundsResolved(r))

    def _answer_round(self, node: Node, fin: Finished) -> None:
        node.round_born.pop(fin.rid, None)
        if fin.ok:
            for (client, req_id), first, last in fin.calls:
                reply = ClientReply(req_id, fin.code, first, last, fin.round.term, node.id)
                self._to_client(node.id, client, reply)
            return
        # stored here, not acknowledged by a quorum: the outcome is unknown
        leader = node.logic.state.leader_id
        for (client, req_id), _, _ in fin.calls:
            self._to_client(node.id, client, ClientReply(req_id, fin.code, leader_id=leader))

    def _m_on_peer_progress(self, node: Node, peer: str, term: int, wm: int) -> None:
        self._step(node, mc.PeerProgress(peer, term, wm))

    def _m_cg_push(self, node: Node, pushed) -> tuple:
        """``MemberActor.cg_push``: a follower takes the pushes of a graph execution."""
        carry, wire = pushed
        done, flush, rest = [], False, []
        for key, req in wire:
            token = CgToken(key, (req.leader_id, req.term))
            out = node.core.step(mc.Push(req, token, graph=True), self.clock.now_ms)
            done += out.answers
            flush = flush or out.flush_first
            out.answers, out.flush_first = [], False
            rest.append(out)
        if flush and self._disk_flush_now(node) is not None:
            done = []  # the graph's thread waits for the disk; a failed flush answers none
        for out in rest:  # what else the pushes started, carried out on the member's loop
            if out.run or out.installed or out.sends or out.notes:
                self._hop(node, self._carry, node, out)
        answers = []
        for tok, resp in done:
            if type(tok) is CgToken:
                answers.append((tok.key, resp, tok.origin))
            else:
                self._answer(node, [(tok, resp)])
        if node.late:
            self.stats["late_answers"] += len(node.late)
            answers += node.late
            node.late = []
        return carry, answers

    def _m_on_graph_fallback(self, node: Node, items: list) -> None:
        """Rounds queued or in flight in an abandoned graph travel again as plain calls."""
        self._step(node, mc.GraphFallback(items))


def _settled_reply(req_id: int, value, member: str) -> ClientReply:
    """A retry's answer from the log (:class:`~rayledger.actors.core.rounds.Spread`), or its
    error."""
    if isinstance(value, LedgerError):
        return ClientReply(req_id, value.code, leader_id=value.leader_id)
    idx = np.frombuffer(value.indexes, dtype=np.int64).tolist()
    terms = np.frombuffer(value.terms, dtype=np.int64).tolist()
    spread = tuple(zip(idx, terms, strict=True))
    return ClientReply(req_id, ResponseCode.SUCCESS, idx[0], idx[-1], max(terms), member,
                       spread=spread)  # fmt: skip


class _SimPorts:
    """What the simulation does with each part of a member's :class:`MemberOut`."""

    def __init__(self, sim: MemberDelivery, node: Node) -> None:
        self.sim, self.node = sim, node

    def rounds(self, out: mc.MemberOut) -> None:
        sim, node = self.sim, self.node
        for fin in out.finished:
            sim._answer_round(node, fin)
        for (client, req_id), value in out.settled:  # retries answered from the log
            sim._to_client(node.id, client, _settled_reply(req_id, value, node.id))
        w = out.written
        if w is None:
            return
        if w.error is not None:
            for client, req_id in w.tokens:
                reply = ClientReply(req_id, w.error.code, leader_id=w.error.leader_id)
                sim._to_client(node.id, client, reply)
        else:
            node.round_born[w.rid] = sim.clock.now_ms
            if len(node.core.book.rounds) > 1:  # another still waits for its quorum
                sim.stats["overlapped_rounds"] += 1

    def answers(self, answers: list, flush_first: bool) -> None:
        if flush_first:
            self.sim._spawn(self.node, self.sim._flush_then_answer(self.node, answers))
        else:
            self.sim._answer(self.node, answers)

    def register(self, rounds: list) -> None:
        for r in rounds:
            self.sim._register(self.node, r)

    def notes(self, notes: list) -> None:
        for a in notes:
            if isinstance(a, RoleChange):
                self.sim.net.note(f"{self.node.id} -> {a.role.value} term={a.term} "
                                  f"leader={a.leader_id}")  # fmt: skip
            else:
                self.sim.net.note(f"{self.node.id} transfer to {a.transferee}: {a.code.name}")

    def sends(self, sends: list) -> None:
        sim, node = self.sim, self.node
        for s in sends:
            if isinstance(s.message, LeadershipTransferRequest) and sim._late_take_order():
                # a take order held up on the way: it arrives after the transfer was given up
                delay = sim.election.leadership_transfer_wait_timeout_ms + 200
                sim.stats["late_take_orders"] += 1
                sim._late_orders.add((node.id, s.to, s.message.term))
                sim._at(node, sim.clock.now_ms + delay, sim.rpc.call, node.id, s.to, s.message)
                continue
            sim.rpc.call(node.id, s.to, s.message)

    def run(self, runs: list) -> None:
        for run in runs:
            if run.kind == "fallback" and isinstance(run.action, rp.Register):
                self.sim.stats["re_registered"] += 1
            self.sim._spawn(self.node, self.sim._run_action(self.node, run))

    def write_due(self) -> None:
        self.sim._soon(self.node, self.sim._write_round, self.node)

    def installed(self, sealed: list) -> None:
        self.sim._m_offer(self.node, sealed)

    def spawns(self, spawns: list) -> None:
        for spawn in spawns:  # lost_members.py
            self.sim._spawn_member(self.node, spawn)

    def reads(self, out: mc.MemberOut) -> None:
        self.sim._reads_out(self.node, out)

    def leave_graphs(self) -> None:
        self.sim._leave_graphs(self.node.id, "core")

    def commits_moved(self) -> None:
        """Readers waiting for a commit are stepped by the simulation's own events."""

    def elector_moved(self) -> None:
        self.sim._rearm(self.node)
