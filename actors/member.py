"""MemberActor: the Ray transport of one member's :class:`~.logic.MemberLogic`.

A thin async shell: it owns the clock, the Ray handles and the asyncio loop, and composes
what it does from one mixin per concern:

* :mod:`.member_election`: the elector's clock and messages, election RPCs;
* :mod:`.member_leadership`: taking and leaving office, supervising the helpers;
* :mod:`.member_appends`: appends on the leader, grouped into rounds (group commit);
* :mod:`.member_reads`: read index rounds, leases and the read RPCs.

Votes and heartbeats run in their own Ray concurrency group (their own thread and loop),
so a queue of bulk pushes never delays them; all logic state is touched under one lock,
never across an await.  The helpers (a :class:`~.checker.QuorumAckCheckerActor` and one
:class:`~.dispatcher.EntryDispatcherActor` per peer) are created by the member, on its
node, and die with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rayledger.replication import PushEntryRequest
from rayledger.storage import open_store

from .checker import QuorumAckCheckerActor
from .config import LedgerConfig
from .dispatcher import EntryDispatcherActor
from .faults import LinkFaults, load_faults
from .futures import set_result
from .logic import MemberLogic
from .machine_runner import MachineRunner
from .member_appends import INLINE_BYTES, AppendsMixin
from .member_election import ElectionMixin
from .member_leadership import LeadershipMixin
from .member_reads import ReadsMixin
from .metrics import MemberMetrics
from .naming import member_handle, now_ms
from .ray_compat import install_loop_registry, reset_loops
from .types import MemberStatus

log = logging.getLogger("rayledger.actors")


@ray.remote(num_cpus=0, concurrency_groups={"election": 64}, max_concurrency=1000)
class MemberActor(ElectionMixin, LeadershipMixin, AppendsMixin, ReadsMixin):
    def __init__(
        self, group: str, self_id: str, peers: list[str], config: LedgerConfig, data_dir: str | None
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
        self._open_log(data_dir)
        self.faults = load_faults(group, self_id)  # faults follow a member across restarts
        self._handles: dict[str, Any] = {}
        self._dispatchers: dict[str, Any] = {}
        self._checker = None
        self._closed = False
        self._started = time.time()
        self._late: list = []  # answers to compiled-path pushes that came out of order
        self._init_election()
        self._init_appends()
        self._init_leadership()
        self._init_reads()
        self._machine_runner: MachineRunner | None = None
        if self.config.state_machine is not None:
            self._machine_runner = MachineRunner(self, data_dir)
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

    def _open_log(self, data_dir: str | None) -> None:
        """The member's store and its logic around it."""
        store = open_store(self.config.store)
        self.logic = MemberLogic(
            self.group,
            self.self_id,
            self.peers,
            store,
            self.config.election,
            self.config.replication,
            data_dir=data_dir,
        )
        self.store = store
        # sync_flush: fdatasync outside the member's lock, so heartbeats and votes never
        # wait behind a flush; answers and rounds go out only once it is done
        self._sync = bool(getattr(self.config.store, "sync_flush", False))
        store.defer_sync = self._sync
        self._metrics = MemberMetrics(self.group, self.self_id, store, data_dir)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> str:
        """Returns once the member is up (it boots itself in ``__init__``, also after a restart)."""
        return self.self_id

    def _boot(self) -> None:
        """Create this member's dispatchers and checker, and start maintaining state.

        Ray runs an async actor's ``__init__`` on its event loop, so this also runs
        when Ray restarts the member after its process died.
        """
        self._loop = asyncio.get_running_loop()
        self._role_lock = asyncio.Lock()
        self._tick_loop: asyncio.AbstractEventLoop | None = None  # the election group's
        self._tick_wake: asyncio.Event | None = None
        self._sleep_until = 0
        here = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        )
        me = ray.get_runtime_context().current_actor
        # Ray restarts a helper whose process died; the new one tells its member
        # (helper_restarted), which sets it up again for the term it leads
        helper = {"scheduling_strategy": here, "max_restarts": -1}
        self._checker = QuorumAckCheckerActor.options(**helper).remote(
            self.group, self.self_id, self.peers, self.config, me
        )
        for peer in self.peers:
            if peer != self.self_id:
                self._dispatchers[peer] = EntryDispatcherActor.options(**helper).remote(
                    self.group, self.self_id, peer, self.config, me, self._checker
                )
        self._checker.set_dispatchers.remote(list(self._dispatchers.values()))
        me.run_maintainer.remote()

    # -- talking to peers ---------------------------------------------------------------
    def _peer(self, peer: str):
        return member_handle(self._handles, self.group, peer)

    def _resolve(self, answers) -> None:
        for fut, resp in answers:
            if type(fut) is tuple:  # a compiled-path push answered late: with the next one
                with self._lock:
                    self._late.append((fut[1], resp))
            elif not fut.done():
                fut.get_loop().call_soon_threadsafe(set_result, fut, resp)

    # -- status and operators (election concurrency group) ---------------------------------
    @ray.method(concurrency_group="election")
    async def status(self) -> MemberStatus:
        self._ensure_maintainer()
        with self._lock:
            st = self.logic.state
            return MemberStatus(
                role=st.role,
                term=st.current_term,
                leader_id=st.leader_id,
                ledger_begin_index=self.store.ledger_begin_index,
                ledger_end_index=self.store.ledger_end_index,
                committed_index=self.store.committed_index,
                alive=True,
            )

    @ray.method(concurrency_group="election")
    async def info(self) -> dict:
        return {
            "group": self.group,
            "self_id": self.self_id,
            "peers": self.peers,
            "config": self.config,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "started": self._started,
        }

    @ray.method(concurrency_group="election")
    async def stats(self) -> dict:
        """Counters of this member's transport (for benchmarks and operators)."""
        f = self._fast
        return {
            "leading_term": self.logic.leading_term,
            "fast_path_active": bool(f and f.active),
            "fast_path_compiles": f.compiles if f else 0,
            "fast_path_fallbacks": f.fallbacks if f else 0,
            "rounds_waiting": len(self._book.rounds),
        }

    @ray.method(concurrency_group="election")
    async def helper_pids(self) -> dict[str, int | None]:
        """Process ids of this member's checker and dispatchers (for fault injection)."""
        refs = {"checker": self._checker.pid.remote()}
        refs.update({f"dispatcher:{p}": d.pid.remote() for p, d in self._dispatchers.items()})
        return await self._helper_answers(refs)

    @ray.method(concurrency_group="election")
    async def peer_progress(self) -> dict[str, dict | None]:
        """Each follower's replication progress as this member's dispatchers see it."""
        return await self._helper_answers(
            {p: d.progress.remote() for p, d in self._dispatchers.items()}
        )

    async def _helper_answers(self, refs: dict[str, Any]) -> dict[str, Any]:
        """The helpers' answers, each within an RPC timeout; None from a dead or restarting
        helper."""
        out: dict[str, Any] = {}
        for k, r in refs.items():
            try:
                out[k] = await asyncio.wait_for(r, self.config.rpc_timeout_ms / 1000)
            except (ray.exceptions.RayError, asyncio.TimeoutError):
                out[k] = None  # dead or restarting
        return out

    @ray.method(concurrency_group="election")
    async def set_faults(
        self, cut: list[str], drop: dict[str, float], delay_ms: dict[str, float]
    ) -> None:
        self.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))
        await asyncio.gather(
            *(d.set_faults.remote(cut, drop, delay_ms) for d in self._dispatchers.values()),
            return_exceptions=True,  # a restarting helper gets them when it is set up again
        )

    # -- follower ---------------------------------------------------------------------------
    @ray.method(enable_task_events=False)
    async def push(self, req: PushEntryRequest, batch=None):
        """A push from the leader's dispatcher (a large batch arrives from the object store)."""
        if batch is not None:
            req = replace(req, batch=batch)
        fut = self._loop.create_future()
        with self._lock:
            answers = self.logic.on_push(req, fut, now_ms())
        if self.logic.must_flush(answers):  # acknowledge only what is on disk
            await self._loop.run_in_executor(None, self.store.flush)
        for f, resp in answers:
            if f is fut:
                set_result(fut, resp)
            else:
                self._resolve([(f, resp)])
        self._commits_moved()
        return await fut

    def cg_push(self, pushed):
        """Pushes from the leader's compiled graph (runs on the graph's thread)."""
        carry, wire = pushed
        answers = []
        now = now_ms()
        with self._lock:
            done = [tr for key, req in wire for tr in self.logic.on_push(req, ("cg", key), now)]
            if self._late:
                answers += self._late
                self._late = []
        if self.logic.must_flush(done):
            self.store.flush()  # the graph's thread waits for the disk, not the member
        for tok, resp in done:
            if type(tok) is tuple:
                answers.append((tok[1], resp))
            elif not tok.done():
                tok.get_loop().call_soon_threadsafe(set_result, tok, resp)
        return carry, answers

    @ray.method(concurrency_group="election")
    async def cg_reset(self, term: int) -> int:
        """A leader of ``term`` is about to compile its graph: leave every older one."""
        n = reset_loops(self)
        if n:
            log.info("[%s] term=%d: left %d old compiled-graph loop(s)", self.self_id, term, n)
        return n

    # -- answers to this member's helpers (fenced by term) ------------------------------------
    @ray.method(enable_task_events=False)
    async def on_peer_progress(self, peer: str, term: int, match_index: int) -> None:
        with self._lock:
            actions = self.logic.on_peer_progress(peer, term, match_index, now_ms())
        await self._apply(actions)

    async def read_for_push(self, term: int, start: int, max_bytes: int, max_count: int):
        """For a dispatcher of ``term`` that missed a batch: entries from ``start``."""
        with self._lock:
            answer = self.logic.read_for_push(term, start, max_bytes, max_count)
        if answer is None:
            return None
        batch, info = answer
        payload = batch if len(batch.data) <= INLINE_BYTES else ray.put(batch)
        return (batch.first_index, batch.count, payload, len(batch.data)), info

    async def entry_meta(self, term: int, index: int):
        with self._lock:
            return self.logic.entry_meta(term, index)

    @ray.method(concurrency_group="election")
    async def leading_term(self) -> int:
        """The term this member leads with its helpers set up, or -1."""
        return self.logic.leading_term if self.logic.state.is_leader else -1

    async def store_dir(self) -> str | None:
        return self.config.store.data_dir

    @ray.method(concurrency_group="election")
    async def close(self) -> None:
        self._closed = True
        if self._maintainer is not None:
            self._maintainer.cancel()
        if self._machine_runner is not None:
            self._machine_runner.close()
        with self._lock:
            self.store.close()
