"""MemberActor: the Ray transport of one member's
:class:`~rayledger.actors.core.member_logic.MemberLogic`.

A thin threaded shell: it owns the Ray handles and two asyncio loops on threads of its own (the
main loop and the election loop), and is built from parts, each owning its state (see
:mod:`.context` for what they share and the one concurrency model):

* :class:`~.election.ElectionPart`: the elector's clock and messages, election RPCs;
* :class:`~.leadership.LeadershipPart`: taking and leaving office, supervising the
  helpers;
* :class:`~.appends.AppendPart`: appends on the leader, grouped into rounds;
* :class:`~.reads.ReadPart`: read index rounds, leases and the read RPCs.

Ray's methods live here and only hand their calls to a part.  The hot path -- appends, pushes, the
checker's resolutions and the helpers' reports -- runs on Ray's threads under the member's lock,
with no hop onto a loop (a threaded Ray actor receives a call for about 40 % less CPU than an
asyncio one); every other call runs on the main loop, or on the election loop beside the
elector's clock, so a queue of bulk pushes never delays a vote or a heartbeat.  The
helpers (a :class:`~rayledger.actors.checker.QuorumAckCheckerActor` and one
:class:`~rayledger.actors.dispatcher.EntryDispatcherActor` per peer) are created by the member, on
its node, and die with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rayledger.actors.aioloop import call, run_on, start_loop
from rayledger.actors.checker import QuorumAckCheckerActor
from rayledger.actors.config import LedgerConfig
from rayledger.actors.core import round_path as rp
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.member import (
    ChangeMembers,
    ChunkAsked,
    ClusterView,
    FetchAsked,
    HelperStarted,
    MemberClosed,
    MemberCore,
    MemberOut,
    PeerProgress,
    ProcessAnswered,
    Push,
    Run,
    SpawnDone,
    answer_fetch,
    carry_out,
)
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.read_path import AskLeader, WaitCommitted
from rayledger.actors.dispatcher import EntryDispatcherActor
from rayledger.actors.faults import LinkFaults, load_faults
from rayledger.actors.futures import settle_threadsafe
from rayledger.actors.member.appends import AppendPart, to_wire
from rayledger.actors.member.context import MemberContext
from rayledger.actors.member.election import ElectionPart
from rayledger.actors.member.leadership import LeadershipPart
from rayledger.actors.member.machine import MachineRunner
from rayledger.actors.member.reads import ReadPart
from rayledger.actors.metrics import MemberMetrics
from rayledger.actors.naming import NAMESPACE, actor_name
from rayledger.actors.placement import (
    alive_nodes,
    data_dir_of,
    member_nodes,
    record_gone,
    record_node,
    store_dir_of,
)
from rayledger.actors.priority import set_background
from rayledger.actors.ray_compat import install_loop_registry, reset_loops
from rayledger.actors.types import MemberStatus
from rayledger.actors.wire import pack_response, unpack_push, unpack_resolution
from rayledger.election import TransferOutcome
from rayledger.election.configuration import Configuration
from rayledger.replication import PushEntryRequest, PushEntryResponse
from rayledger.replication.dispatcher import CachedBatch, Fetch
from rayledger.replication.messages import Inline
from rayledger.storage import LedgerError, ResponseCode, open_store

log = logging.getLogger("rayledger.actors")


# Ray's threads, by concurrency group.  The default group's calls block until answered (an append
# until its quorum, a read until its index commits); what answers them runs in groups of its own,
# so blocked calls never hold it up: the follower's pushes ("push": an out-of-order push waits on
# its thread for the one before it), the helpers' reports in the order sent ("helpers"), the
# dispatchers' fetches ("replication") and the election RPCs ("election").
CONCURRENCY = {"election": 16, "push": 16, "helpers": 1, "replication": 4}
CALLS = 128  # default group: appends and reads that may wait at once


@ray.remote(num_cpus=0, concurrency_groups=CONCURRENCY, max_concurrency=CALLS)
class MemberActor:
    def __init__(
        self,
        group: str,
        self_id: str,
        peers: list[str],
        config: LedgerConfig,
        data_dir: str | None,
        initial: dict | None = None,
    ):
        logging.basicConfig(
            level=os.environ.get("RAYLEDGER_LOG_LEVEL", "WARNING"),
            format="%(asctime)s %(levelname)s %(name)s %(message)s",
        )
        self.group = group
        self.self_id = self_id
        self.peers = list(peers)
        self.config = config.for_member(data_dir)
        self._lock = threading.RLock()
        self._started = time.time()
        self._late: list = []  # answers to compiled-path pushes that came out of order
        self._graphs_left = 0  # graphs it left by itself (its core's leave_graphs)
        store = open_store(self.config.store)
        self.logic = MemberLogic(
            group,
            self_id,
            self.peers,
            store,
            self.config.election,
            self.config.replication,
            data_dir=data_dir,
            initial=Configuration.from_doc(initial) if initial is not None else None,
        )
        self.store = store
        # the members of the configuration it acts on (it changes); the parts share
        # this list, changed in place
        self.peers[:] = [*self.logic.config_log.latest().members]
        # sync_flush: fdatasync outside the member's lock, so heartbeats and votes never
        # wait behind a flush; answers and rounds go out only once it is done
        sync = bool(getattr(self.config.store, "sync_flush", False))
        store.defer_sync = sync
        self._metrics = MemberMetrics(group, self_id, store, data_dir)
        cfg = self.config
        core = MemberCore(
            self.logic,
            rpc_timeout_ms=cfg.rpc_timeout_ms,
            sync=sync,
            machine=cfg.state_machine is not None,
            fast_path=cfg.fast_path,
            tick_ms=cfg.maintain_interval_ms,
            lease_ms=cfg.lease_ms(),
            promote_lag=cfg.promote_lag,
            replace_lost_after_ms=cfg.replace_lost_after_ms(),
            max_rounds=cfg.max_rounds,
        )
        ctx = self.ctx = MemberContext(
            group, self_id, self.peers, self.config, self.logic, self._lock, self._metrics, sync,
            core, self._carry,
            faults=load_faults(group, self_id),  # faults follow a member across restarts
        )  # fmt: skip
        self.election = ElectionPart(ctx)
        self.reads = ReadPart(ctx, self.election.ask_peer)
        self.appends = AppendPart(ctx)
        self.leadership = LeadershipPart(ctx, self.appends)
        if self.config.state_machine is not None:
            ctx.machine = MachineRunner(ctx, data_dir)
        if self.config.fast_path:  # the group's leaders compile graphs this member runs in
            install_loop_registry()
        self._boot()
        log.info(
            "[%s] member of %s started: term=%d end=%d",
            self_id,
            group,
            self.logic.state.current_term,
            self.store.ledger_end_index,
        )

    @property
    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self.ctx.loop

    @property
    def faults(self) -> LinkFaults:
        return self.ctx.faults

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> str:
        """Returns once the member is up (it boots itself in ``__init__``, also after a restart)."""
        return self.self_id

    def _boot(self) -> None:
        """Start its loops and maintaining state (from ``__init__``, so this also runs when Ray
        restarts the member after its process died).  No helper starts here: a member's
        checker and dispatchers start when it first takes office
        (:meth:`rayledger.actors.core.supervision.Supervisor.runs_helpers`)."""
        ctx = self.ctx
        ctx.loop = start_loop(f"rayledger-main-{self.self_id}")
        self._eloop = self.election.loop = start_loop(f"rayledger-election-{self.self_id}")
        me = ray.get_runtime_context().current_actor
        self._me = me
        ctx.ensure_helpers = self._create_helpers
        ctx.new_dispatcher = self._new_dispatcher
        try:
            record_node(self.group, self.self_id, ray.get_runtime_context().get_node_id())
        except Exception as exc:  # the leader cannot replace this member if its node dies
            log.warning("[%s] could not record its node: %r", self.self_id, exc)
        with self._lock:
            learner = not self.ctx.core.supervisor.is_voter()
        set_background(learner)  # a learner catches up on CPU the voters leave (priority.py)
        self._eloop.call_soon_threadsafe(self.election.ensure_maintainer)
        if self.config.replace_lost_after_s is not None:
            asyncio.run_coroutine_threadsafe(_watch_nodes(self), ctx.loop)

    def _create_helpers(self) -> None:
        """The checker and a dispatcher per peer, on this node (once)."""
        ctx = self.ctx
        if ctx.checker is not None:
            return
        here = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        )
        # Ray restarts a helper whose process died; the new one tells its member
        # (helper_restarted), which sets it up again for the term it leads
        helper = {"scheduling_strategy": here, "max_restarts": -1}
        checker = QuorumAckCheckerActor.options(**helper).remote(
            self.group, self.self_id, self.peers, self.config, self._me
        )
        with self._lock:
            peers = self.ctx.core.supervisor.dispatcher_peers()
        for peer in peers:
            ctx.dispatchers[peer] = self._new_dispatcher(peer, checker)
        checker.set_dispatchers.remote(list(ctx.dispatchers.values()))
        # last: other threads (status, helper_pids) take a set checker to mean "all there"
        ctx.checker = checker

    def _new_dispatcher(self, peer: str, checker=None):
        """A dispatcher for ``peer``, on this node (see :meth:`_create_helpers`)."""
        here = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        )
        return EntryDispatcherActor.options(scheduling_strategy=here, max_restarts=-1).remote(
            self.group, self.self_id, peer, self.config, self._me, checker or self.ctx.checker
        )

    # -- answers to pushes ------------------------------------------------------------------
    def _resolve(self, answers) -> None:
        for fut, resp in answers:
            if type(fut) is tuple:  # a compiled-path push answered late: with the next one
                with self._lock:
                    self._late.append((fut[1], resp))
            else:
                settle_threadsafe(fut, resp)

    # -- carrying out what the core returns -------------------------------------------------
    def _carry(self, out: MemberOut, follow: int | None = None) -> Run | None:
        """Carry out a :class:`MemberOut` of the member's core, on whichever loop or thread
        stepped it: answers, messages and rounds at once, what needs a loop on the main loop.
        Returns the next action of process ``follow`` (its caller goes on with it)."""
        try:
            running = asyncio.get_running_loop()
            where = _MAIN if running is self.ctx.loop else _LOOP
        except RuntimeError:  # one of Ray's threads, or a compiled graph's: no loop
            where = _THREAD
        return carry_out(out, _RayPorts(self, where, follow))

    def _on_main(self, coro):
        """Run ``coro`` on the main loop; Ray's thread waits for its result."""
        return run_on(self.ctx.loop, coro)

    def _on_election(self, coro):
        """Run ``coro`` on the election loop; Ray's thread waits for its result."""
        return run_on(self._eloop, coro)

    def _offer(self, sealed: list) -> None:
        """Snapshots sealed from the leader: the machine's core decides whether to load."""
        if self.ctx.machine is not None:
            with self.ctx.lock:
                self.ctx.machine.offer(sealed)

    def _rounds_out(self, out: MemberOut) -> None:
        for fin in out.finished:
            self.appends.answer(fin)
        if out.settled:
            self.appends.settle(out.settled)
        if out.written is not None:
            self.appends.written(out.written)

    def _start_runs(self, runs: list[Run], follow: int | None, on_main: bool) -> Run | None:
        """A round's actions go on at once, on the thread that stepped it (a flush off it),
        another process's as a task on the main loop; the action of ``follow`` is handed
        back."""
        nxt = None
        for run in runs:
            if run.pid == follow:
                nxt = run
            elif run.kind in ("round", "fallback") and not isinstance(run.action, sv.Flush):
                self._drive(run, on_main)
            else:
                self._task(run, on_main)
        return nxt

    def _task(self, run: Run, on_main: bool) -> None:
        if on_main:
            asyncio.ensure_future(_run_task(self, run))
        else:
            asyncio.run_coroutine_threadsafe(_run_task(self, run), self.ctx.loop)

    def _drive(self, run: Run | None, on_main: bool) -> None:
        """A round's process, its actions performed now under the lock, so rounds go out in
        the order they were written (a flush runs off the thread, on the main loop)."""
        with self._lock:
            while run is not None and not self.ctx.closed:
                if isinstance(run.action, sv.Flush):
                    self._task(run, on_main)
                    return
                value = self.appends.perform(run.action)
                run = self._carry(self.ctx.step(ProcessAnswered(run.pid, value)), run.pid)

    # -- the parts' Ray methods ------------------------------------------------------------------
    @ray.method(concurrency_group="election", enable_task_events=False)
    def run_maintainer(self) -> None:
        """The elector's clock runs on the election loop, beside the vote and heartbeat
        handlers (see :class:`~.election.ElectionPart`)."""
        self._eloop.call_soon_threadsafe(self.election.ensure_maintainer)

    @ray.method(concurrency_group="election", enable_task_events=False)
    def handle_election(self, req):
        """A vote, pre-vote, heartbeat or leadership-transfer request from a peer."""
        return self._on_election(call(self.election.handle, req))

    @ray.method(concurrency_group="election")
    def transfer_leadership(self, target: str):
        """Ask this member (the leader) to hand leadership to ``target``."""
        return self._on_election(self.election.transfer(target))

    @ray.method(concurrency_group="helpers")
    def helper_started(
        self, kind: str, peer: str | None, pid: int, restarted: bool = False
    ) -> None:
        """Every helper says so when its process starts (see
        :meth:`~rayledger.actors.core.supervision.Supervisor.helper_started`)."""
        self.leadership.helper_started(pid)
        self.ctx.step_carry(HelperStarted(kind, peer, pid, restarted))

    @ray.method(enable_task_events=False)
    def append(
        self,
        bodies: list,
        group: str | None = None,
        target: str | None = None,
        ident: list[int] | tuple[int, int] | None = None,
        maybe_stored: bool = True,
    ):
        """Append a batch as leader (see :meth:`~.appends.AppendPart.append`);
        ``ident``: an idempotent client's (client id, first sequence), as a tuple or a list,
        ``maybe_stored``: whether a call carrying that identity ended with an unknown
        outcome."""
        if ident is not None:
            ident = (ident[0], ident[1])
        return self.appends.append(bodies, group, target, ident, maybe_stored)

    @ray.method(concurrency_group="helpers", enable_task_events=False)
    def on_resolved(self, r: list) -> None:
        """From the checker (:func:`~rayledger.actors.wire.pack_resolution`): the committed
        index moved and/or rounds ended."""
        self.appends.on_resolved(unpack_resolution(r))

    def read_index(self, consistency: str = "linearizable") -> int:
        """On the leader: an index every read that starts now may be served at."""
        return self._on_main(self.reads.read_index(consistency))

    def get(self, index: int, committed_only: bool = True, consistency: str = "committed"):
        return self._on_main(self.reads.get(index, committed_only, consistency))

    def read(
        self, start: int, stop: int, committed_only: bool = True, consistency: str = "committed"
    ):
        return self._on_main(self.reads.read(start, stop, committed_only, consistency))

    def read_batch(self, start: int, stop: int, committed_only: bool = True):
        return self._on_main(self.reads.read_batch(start, stop, committed_only))

    def committed_index(self, consistency: str = "committed") -> int:
        return self._on_main(self.reads.committed_index(consistency))

    def query(self, request, consistency: str = "committed"):
        return self._on_main(self.reads.query(request, consistency))

    # -- membership ------------------------------------------------------------
    def change_members(self, op: str, member: str, replaces: str = "") -> int:
        """On the leader: change the configuration (an
        :class:`~rayledger.election.membership.Op`); returns the index of the configuration entry
        once it committed.  Coded errors: see
        :class:`~rayledger.actors.core.member.ChangeMembers`."""
        return self._on_main(_change_members(self, op, member, replaces))

    @ray.method(concurrency_group="election")
    def membership(self) -> dict:
        """The configurations this member knows: the latest in its log (which it acts on)
        and the committed one, with the lost members its leadership waits to replace."""
        with self._lock:
            clog = self.logic.config_log
            committed = clog.committed(self.store.committed_index)
            st = self.logic.state
            return {
                "member": self.self_id,
                "leads": st.is_leader,
                "leader_id": st.leader_id,
                "term": st.current_term,
                "latest": clog.latest().to_doc(),
                "latest_index": clog.latest_index(),
                "committed": committed.to_doc(),
                "committed_index": self.store.committed_index,
                "waiting": list(self.ctx.core.membership.waiting),
            }

    # -- status and operators (election concurrency group) ---------------------------------
    @ray.method(concurrency_group="election")
    def status(self) -> MemberStatus:
        self._eloop.call_soon_threadsafe(self.election.ensure_maintainer)
        with self._lock:
            st = self.logic.state
            config = self.logic.config_log.committed(self.store.committed_index)
            return MemberStatus(
                role=st.role,
                term=st.current_term,
                leader_id=st.leader_id,
                ledger_begin_index=self.store.ledger_begin_index,
                ledger_end_index=self.store.ledger_end_index,
                committed_index=self.store.committed_index,
                alive=True,
                membership=config.role_of(self.self_id) or "removed",
                lost=tuple(self.ctx.core.membership.waiting),
            )

    @ray.method(concurrency_group="election")
    def info(self) -> dict:
        """What this member is and runs: its settings, process, election state, and its
        transport's counters (``transport``: the compiled path, graph loops, rounds)."""
        f = self.appends.fast
        with self._lock:
            election = self.logic.elector.snapshot()
            leading, waiting = self.logic.leading_term, len(self.ctx.core.book.rounds)
        transport = {
            "leading_term": leading,
            "fast_path_active": bool(f and f.active),
            "fast_path_compiles": f.compiles if f else 0,
            "fast_path_fallbacks": f.fallbacks if f else 0,
            "fast_path_parks": f.parks if f else 0,
            # as a follower: the graph loops it runs, and how often it left one by itself
            "graph_loops": len(self.__dict__.get("_cg_loops", ())),
            "graphs_left": self._graphs_left,
            "rounds_waiting": waiting,
        }
        return {
            "group": self.group,
            "self_id": self.self_id,
            "peers": self.peers,
            "config": self.config,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "started": self._started,
            "election": election,
            "transport": transport,
        }

    def set_fast_path(self, enabled: bool) -> None:
        """Switch the compiled path off or on again (see :meth:`LedgerGroup.set_fast_path`)."""
        if not self.config.fast_path:
            raise LedgerError.of(
                ResponseCode.UNSUPPORTED,
                f"{self.self_id}: the group runs without fast_path; create it with "
                "LedgerConfig(fast_path=True) to switch the compiled path",
            )
        self._on_main(call(self.appends.switch_fast, bool(enabled)))

    @ray.method(concurrency_group="election")
    def helper_pids(self) -> dict[str, int | None]:
        """Process ids of this member's checker and dispatchers (for fault injection); none
        before it first took office (they start then)."""
        if self.ctx.checker is None:
            return {}
        refs = {"checker": self.ctx.checker.pid.remote()}
        refs.update({f"dispatcher:{p}": d.pid.remote() for p, d in self.ctx.dispatchers.items()})
        return self._on_election(_helper_answers(self, refs))

    @ray.method(concurrency_group="election")
    def peer_progress(self) -> dict[str, dict | None]:
        """Each follower's replication progress as this member's dispatchers see it."""
        return self._on_election(
            _helper_answers(self, {p: d.progress.remote() for p, d in self.ctx.dispatchers.items()})
        )

    @ray.method(concurrency_group="election")
    def set_faults(
        self, cut: list[str], drop: dict[str, float], delay_ms: dict[str, float]
    ) -> None:
        self.ctx.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))
        refs = [d.set_faults.remote(cut, drop, delay_ms) for d in self.ctx.dispatchers.values()]
        # a restarting helper gets them when it is set up again
        ray.wait(refs, num_returns=len(refs))

    # -- follower ---------------------------------------------------------------------------
    @ray.method(concurrency_group="push", enable_task_events=False)
    def push(self, packed: list, batch=None):
        """A push from the leader's dispatcher (:func:`~rayledger.actors.wire.pack_push`; a
        large batch arrives from the object store as ``batch``), stored and answered on this
        thread; one that comes before its turn waits here for the pushes before it (on the
        group's other threads).  Answers :func:`~rayledger.actors.wire.pack_response`."""
        return _packed(self._push(unpack_push(packed, batch)))

    def _push(self, req: PushEntryRequest):
        fut: Future = Future()
        with self._lock:
            out = self.ctx.step(Push(req, fut))
            own = [resp for tok, resp in out.answers if tok is fut]
            if own:
                out.answers = [a for a in out.answers if a[0] is not fut]
            flush = out.flush_first and bool(own)
            # the rest like any Out: other answers (after their flush), the processes a push
            # starts (a configuration entry reconfigures the helpers), snapshots installed
            self._carry(out)
        if not own:
            return fut.result()
        if flush:  # acknowledge only what is on disk (the flush outside the lock)
            self.store.flush()
        return own[0]

    def cg_push(self, pushed):
        """Pushes from the leader's compiled graph (runs on the graph's thread)."""
        carry, wire = pushed
        answers = []
        done, flush = [], False
        with self._lock:  # the round's pushes and the late answers in one hold (an RLock)
            rest = self.ctx.step_all(Push(req, ("cg", key), graph=True) for key, req in wire)
            if self._late:
                answers += self._late
                self._late = []
        for out in rest:
            done += out.answers
            flush = flush or out.flush_first
            out.answers, out.flush_first = [], False
        if flush:
            self.store.flush()  # the graph's thread waits for the disk, not the member
        for out in rest:  # what else the pushes started, carried out on the main loop
            if out.run or out.installed or out.sends or out.notes:
                self.ctx.loop.call_soon_threadsafe(self._carry, out)
        for tok, resp in done:
            if type(tok) is tuple:
                answers.append((tok[1], resp))
            else:
                settle_threadsafe(tok, resp)
        return carry, answers

    @ray.method(concurrency_group="election")
    def cg_reset(self, term: int) -> int:
        """A leader of ``term`` is about to compile its graph: leave every older one."""
        n = reset_loops(self)
        if n:
            log.info("[%s] term=%d: left %d old compiled-graph loop(s)", self.self_id, term, n)
        return n

    # -- answers to this member's helpers (fenced by term) ------------------------------------
    @ray.method(concurrency_group="helpers", enable_task_events=False)
    def on_peer_progress(self, peer: str, term: int, match_index: int) -> None:
        self.ctx.step_carry(PeerProgress(peer, term, match_index))

    @ray.method(concurrency_group="replication")
    def fetch(self, f: Fetch):
        """For a dispatcher of ``f.term`` that lacks a batch (or a learner catching up),
        an entry's (term, pos) or our newest snapshot: the core's fenced answer, entries
        read off the loop so appends are not held up meanwhile."""
        return self._on_main(_fetch(self, f))

    @ray.method(concurrency_group="replication")
    def read_snapshot(self, term: int, index: int, snap_term: int, offset: int, n: int):
        """A chunk of snapshot ``index`` for a dispatcher of ``term`` (fenced by the core,
        read outside the lock); it reaches the follower through the object store."""
        meta = self.ctx.step(ChunkAsked(term, index, snap_term)).reply
        files = self.logic.snapshots.store  # the bytes: storage, past the core's fence
        return files.read(meta, offset, n)

    @ray.method(concurrency_group="election")
    def leading_term(self) -> int:
        """The term this member leads with its helpers set up, or -1."""
        with self._lock:
            return self.logic.leading_term if self.logic.state.is_leader else -1

    def store_dir(self) -> str | None:
        return self.config.store.data_dir

    def last_install(self):
        """The last snapshot installed here from a leader (InstallDone), or None."""
        with self._lock:
            installs = self.logic.handler.installs
            return None if installs is None else installs.last

    def compact(self) -> int:
        """Drop the committed log segments this member's machine no longer needs (up to its
        newest snapshot, whatever their age); returns the log's begin index after it.  A
        memory store keeps its log (UNSUPPORTED).  What was written is flushed first: a
        segment goes only once the one after it is on disk."""
        clean = getattr(self.store, "clean", None)
        if clean is None:
            raise LedgerError.of(
                ResponseCode.UNSUPPORTED, f"{self.self_id} keeps its log in memory"
            )
        self.store.flush()
        clean(compact=True)
        return self.store.ledger_begin_index

    @ray.method(concurrency_group="election")
    def close(self) -> None:
        self.ctx.closed = True
        self._eloop.call_soon_threadsafe(self.election.stop)
        self.ctx.step(MemberClosed())
        if self.ctx.machine is not None:
            self.ctx.machine.close()
        with self._lock:
            self.store.close()


# -- the shell's work on its loops (coroutines live outside the actor class: Ray runs a
# class with any coroutine method as an asyncio actor) ------------------------------------
async def _flush_then_answer(m: MemberActor, answers) -> None:
    """sync_flush: a follower acknowledges only what is on disk (a failed flush answers
    none: the leader's pushes time out)."""
    try:
        await asyncio.get_running_loop().run_in_executor(None, m.store.flush)
    except Exception as exc:
        log.error("[%s] flush failed, %d answers dropped: %r", m.self_id, len(answers), exc)
        return
    m._resolve(answers)
    m.reads.commits_moved()


async def _spawn(m: MemberActor, spawn) -> None:
    """Start a member to replace one whose node is lost (the core chose the node), then
    ask the core to add it as that member's replacement."""
    store_dir = store_dir_of(m.config.store.data_dir)
    h, ok, code = None, False, None
    try:
        h = spawn_member(m.group, spawn.member, list(spawn.config.members), m.config,
                         store_dir, spawn.node, spawn.config.to_doc())  # fmt: skip
        await asyncio.wait_for(h.start.remote(), 60)
        code = ResponseCode.TIMEOUT  # asked: from here on, an error may hide a commit
        while True:  # its term's first entry may not have committed yet: a moment
            try:
                await _change_members(m, "replace", spawn.member, spawn.replaces)
                break
            except LedgerError as exc:
                if exc.code != ResponseCode.LEADER_NOT_READY:
                    code = exc.code
                    raise
                await asyncio.sleep(0.2)
        ok, code = True, None
    except Exception as exc:
        log.error("[%s] could not replace %s with %s on node %s: %r", m.self_id,
                  spawn.replaces, spawn.member, spawn.node, exc)  # fmt: skip
    out = m.ctx.step(SpawnDone(spawn.member, ok, code))
    if spawn.member in out.stop_spawned and h is not None:  # not a member: no lingering
        try:
            ray.kill(h, no_restart=True)
        except Exception:
            pass
        record_gone(m.group, spawn.member)  # in case its add went through after all
    m._carry(out)


async def _watch_nodes(m: MemberActor) -> None:
    """On the leader with ``replace_lost_after_s``: Ray's view of the nodes, every
    ``node_watch_interval_s``, into the core (which decides who is lost and where the
    replacement goes)."""
    every = m.config.node_watch_interval_s()
    while not m.ctx.closed:
        await asyncio.sleep(every)
        with m._lock:
            leads = m.logic.state.is_leader
            members = list(m.logic.config_log.latest().members)
        if not leads:
            continue
        try:
            alive, nodes = await m._loop.run_in_executor(
                None, lambda ms=members: (alive_nodes(), member_nodes(m.group, ms))
            )
        except Exception as exc:
            log.warning("[%s] no view of the nodes: %r", m.self_id, exc)
            continue
        m._carry(m.ctx.step(ClusterView(tuple(alive), nodes)))
        m._metrics.members_lost(m.ctx.core.membership.lost_count(
            m.logic.config_log.latest()))  # fmt: skip


async def _run_task(m: MemberActor, run: Run | None) -> None:
    """A process of the core as an asyncio task: each action performed, its answer
    stepped in, until the process ends (or the member closes)."""
    while run is not None and not m.ctx.closed:
        if isinstance(run.action, rp.Register | rp.Announce | rp.Submit):
            value = m.appends.perform(run.action)
        elif isinstance(run.action, WaitCommitted | AskLeader):
            value = await m.reads.perform(run.action)
        else:
            value = await m.leadership.perform(run.action)
        run = m._carry(m.ctx.step(ProcessAnswered(run.pid, value)), run.pid)


async def _change_members(m: MemberActor, op: str, member: str, replaces: str = "") -> int:
    fut: Future = Future()
    m._carry(m.ctx.step(ChangeMembers(op, member, fut, replaces)))
    first, _term, _pos = (await asyncio.wrap_future(fut))[:3]
    return first


async def _helper_answers(m: MemberActor, refs: dict[str, Any]) -> dict[str, Any]:
    """The helpers' answers, each within an RPC timeout; None from a dead or restarting
    helper."""
    out: dict[str, Any] = {}
    for k, r in refs.items():
        try:
            out[k] = await asyncio.wait_for(r, m.config.rpc_timeout_ms / 1000)
        except (ray.exceptions.RayError, asyncio.TimeoutError):
            out[k] = None  # dead or restarting
    return out


async def _fetch(m: MemberActor, f: Fetch):
    if f.kind != "batch":
        return m.ctx.step(FetchAsked(f)).reply
    answer = await m._loop.run_in_executor(None, answer_fetch, m.ctx.step, m.store, f)
    if answer is None or answer[0] is None:
        return answer
    batch, info = answer
    return CachedBatch(
        batch.first_index, batch.count, to_wire(Inline(batch)), len(batch.data)
    ), info


def spawn_member(
    group: str,
    member: str,
    peers: list[str],
    config: LedgerConfig,
    store_dir: str | None,
    node_id: str | None = None,
    initial: dict | None = None,
) -> Any:
    """Start member ``member`` as a named, detached actor (on ``node_id`` when given: a hard
    affinity, as its disk is on that host).  ``initial``: the configuration it starts from
    when its data directory holds none (a member added to a running group, as a learner)."""
    opts: dict[str, Any] = dict(
        name=actor_name(group, member),
        namespace=NAMESPACE,
        lifetime="detached",
        max_restarts=config.max_restarts if store_dir is not None else 0,
        max_task_retries=0,
    )
    if node_id is not None:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    data_dir = data_dir_of(store_dir, group, member)
    log.info("starts member %s of %s on node %s", member, group, node_id)
    return MemberActor.options(**opts).remote(group, member, peers, config, data_dir, initial)


_MAIN, _LOOP, _THREAD = "main", "loop", "thread"  # where an Out is carried out (see _carry)


def _packed(answer: Any) -> Any:
    """A push's answer as it crosses Ray (see :mod:`rayledger.actors.wire`)."""
    return pack_response(answer) if isinstance(answer, PushEntryResponse) else answer


class _RayPorts:
    """What the Ray member does with each part of its core's :class:`MemberOut`, from where it
    was stepped: the main loop, another loop (the election loop's), or a thread with none
    (Ray's, a compiled graph's).  Answers, rounds and messages go out at once from anywhere;
    what needs the main loop hops there."""

    def __init__(self, member: MemberActor, where: str, follow: int | None) -> None:
        self.m, self.where, self.follow = member, where, follow
        self.on_main = where == _MAIN

    def _main(self, fn, *args) -> None:
        if self.on_main:
            fn(*args)
        else:
            self.m.ctx.loop.call_soon_threadsafe(fn, *args)

    def rounds(self, out: MemberOut) -> None:  # the append calls' futures
        with self.m._lock:  # the member's metrics, beside a tick on the election loop
            self.m._rounds_out(out)

    def answers(self, answers: list, flush_first: bool) -> None:
        if flush_first:
            self._main(_spawn_task, _flush_then_answer(self.m, answers))
        else:
            self.m._resolve(answers)

    def notes(self, notes: list) -> None:
        for note in notes:
            if isinstance(note, TransferOutcome):
                self.m.election.transfer_done(note)

    def sends(self, sends: list) -> None:
        election = self.m.election
        for snd in sends:
            if self.where == _THREAD:
                election.loop.call_soon_threadsafe(election.send, snd.to, snd.message)
            else:  # from the running loop
                election.send(snd.to, snd.message)

    def run(self, runs: list[Run]) -> Run | None:
        return self.m._start_runs(runs, self.follow, self.on_main)

    def register(self, rounds: list) -> None:
        for r in rounds:
            self.m.appends.perform(r)

    def write_due(self) -> None:
        if self.on_main:  # at the end of this turn: what else arrives in it joins the round
            self.m.ctx.loop.call_soon(self.m.appends.write_round)
        else:  # on a thread: now, under the lock its caller holds
            self.m.appends.write_round()

    def installed(self, sealed: list) -> None:  # in the step's hold of the lock
        self.m._offer(sealed)

    def spawns(self, spawns: list) -> None:
        for spawn in spawns:
            self._main(_spawn_task, _spawn(self.m, spawn))

    def reads(self, out: MemberOut) -> None:
        if self.where == _THREAD:
            self._main(self.m.reads.carry, out)
        else:
            self.m.reads.carry(out)

    def leave_graphs(self) -> None:
        if reset_loops(self.m):  # the graph's loop returns on its thread
            self.m._graphs_left += 1

    def commits_moved(self) -> None:
        self.m.reads.commits_moved()

    def elector_moved(self) -> None:
        self.m.election.rearm()


def _spawn_task(coro) -> None:
    asyncio.ensure_future(coro)
