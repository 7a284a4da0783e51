"""MemberActor: the Ray transport of one member's :class:`~.logic.MemberLogic`.

A thin async shell: it owns the clock, the Ray handles and the asyncio loop.
The elector is ticked every ``maintain_interval_ms`` (DLedger's
``maintainState``).  Votes and heartbeats run in their own Ray concurrency group
(their own thread and loop), so a queue of bulk pushes never delays them; all
logic state is touched under one lock, never across an await.

Appends are coalesced: every append that arrives in one turn of the event loop
joins one store batch and one replication round (group commit).  A round is
announced to the member's :class:`EntryDispatcherActor` s (one per peer) and
registered with its :class:`QuorumAckCheckerActor`, which answers with
:meth:`MemberActor.on_resolved` once a quorum stores it.  The helpers are created
by the member, on its node, and die with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rayledger.replication import PushEntryRequest
from rayledger.storage import (
    Entry,
    EntryBatch,
    LedgerError,
    OutcomeUnknownError,
    ResponseCode,
    open_store,
)

from .config import LedgerConfig
from .fastpath import FastPath, install_loop_registry, reset_loops
from .faults import LinkDown, LinkFaults
from .logic import MemberLogic, Round, StartLeading, StopLeading
from .metrics import MemberMetrics
from .types import MemberStatus

log = logging.getLogger("rayledger.actors")

NAMESPACE = "rayledger"
MAX_ROUNDS = 1  # rounds waiting for a quorum before new appends wait to join one round
INLINE_BYTES = 64 * 1024  # rounds up to this size travel inside the call, larger ones via ray.put


def actor_name(group: str, member: str) -> str:
    return f"{group}/{member}"


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


@ray.remote(num_cpus=0, concurrency_groups={"election": 64}, max_concurrency=1000)
class MemberActor:
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
        store = open_store(self.config.store)
        self.logic = MemberLogic(
            group,
            self_id,
            self.peers,
            store,
            self.config.election,
            self.config.replication,
            data_dir=data_dir,
        )
        self.store = store
        self._metrics = MemberMetrics(group, self_id, store, data_dir)
        self.faults = LinkFaults()
        self._handles: dict[str, Any] = {}
        self._dispatchers: dict[str, Any] = {}
        self._checker = None
        self._maintainer: asyncio.Task | None = None
        self._queue: list[tuple[asyncio.Future, list]] = []
        self._round_scheduled = False
        self._rounds: dict[int, tuple[Round, list[asyncio.Future]]] = {}
        self._round_ids = itertools.count()
        self._outstanding = 0
        self._started = time.time()
        self._fast: FastPath | None = None
        self._late: list = []  # answers to compiled-path pushes that came out of order
        install_loop_registry()
        self._boot()
        log.info(
            "[%s] member of %s started: term=%d end=%d",
            self_id,
            group,
            self.logic.state.current_term,
            store.ledger_end_index,
        )

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
        self._tick_wake = asyncio.Event()
        self._sleep_until = 0
        from .checker import QuorumAckCheckerActor
        from .dispatcher import EntryDispatcherActor

        here = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        )
        me = ray.get_runtime_context().current_actor
        self._checker = QuorumAckCheckerActor.options(scheduling_strategy=here).remote(
            self.group, self.self_id, self.peers, self.config, me
        )
        for peer in self.peers:
            if peer != self.self_id:
                self._dispatchers[peer] = EntryDispatcherActor.options(
                    scheduling_strategy=here
                ).remote(self.group, self.self_id, peer, self.config, me, self._checker)
        self._checker.set_dispatchers.remote(list(self._dispatchers.values()))
        self._maintainer = asyncio.ensure_future(self._maintain())

    async def _maintain(self) -> None:
        """DLedger's maintainState, event-timed: sleep until the elector's next deadline
        (at least ``maintain_interval_ms``, at most one second) instead of every 10 ms; an
        election message that brings the deadline forward wakes it (:meth:`_rearm`)."""
        interval = self.config.maintain_interval_ms
        while True:
            delay = interval
            try:
                now = now_ms()
                with self._lock:
                    actions, answers = self.logic.tick(now)
                self._resolve(answers)
                await self._apply(actions)
                self._metrics.tick(self.logic.state, self.store, self._outstanding)
                with self._lock:
                    delay = self.logic.next_tick_ms(now_ms(), interval) - now_ms()
            except Exception:
                log.exception("[%s] maintain loop error", self.self_id)
            delay = min(1000, max(interval, delay))
            self._sleep_until = now_ms() + delay
            self._tick_wake.clear()
            try:
                await asyncio.wait_for(self._tick_wake.wait(), delay / 1000)
            except asyncio.TimeoutError:
                pass
            self._sleep_until = 0

    def _rearm(self) -> None:
        """Wake the maintainer when the elector's next deadline moved before its wake-up
        (a leadership-transfer request, a new role); callable from any thread."""
        with self._lock:
            due = self.logic.next_tick_ms(now_ms(), self.config.maintain_interval_ms)
        if due < self._sleep_until:
            self._loop.call_soon_threadsafe(self._tick_wake.set)

    # -- talking to peers ---------------------------------------------------------------
    def _peer(self, peer: str):
        h = self._handles.get(peer)
        if h is None:
            h = ray.get_actor(actor_name(self.group, peer), namespace=NAMESPACE)
            self._handles[peer] = h
        return h

    async def _apply(self, actions: list) -> None:
        if not actions:
            return
        sends, role_changed = MemberLogic.split(actions)
        for s in sends:
            asyncio.ensure_future(self._send(s.to, s.message))
        if role_changed:
            await self._sync_role()

    async def _send(self, to: str, msg) -> None:
        resp = None
        try:
            if self.faults.active:
                await self.faults.before_send(to)
            ref = self._peer(to).handle_election.remote(msg)
            resp = await asyncio.wait_for(ref, self.config.rpc_timeout_ms / 1000)
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError) as exc:
            log.debug("[%s] %s to %s failed: %s", self.self_id, type(msg).__name__, to, exc)
            resp = None
            if isinstance(exc, (ValueError, ray.exceptions.ActorDiedError)):
                self._handles.pop(to, None)
        with self._lock:
            actions = self.logic.on_election_response(to, msg, resp, now_ms())
        await self._apply(actions)
        self._rearm()

    async def _sync_role(self) -> None:
        """Start or stop leading; changes are carried out one at a time, in order."""
        async with self._role_lock:
            with self._lock:
                changes = self.logic.leadership()
            for change in changes:
                if isinstance(change, StopLeading):
                    await self._stop_leading(change)
                else:
                    await self._start_leading(change)

    async def _stop_leading(self, change: StopLeading) -> None:
        if self._fast is not None:
            self._fast.stop()
        try:
            resolved = await self._checker.step_down.remote(change.new_term)
            self._finish(resolved)
        except ray.exceptions.RayError as exc:
            log.warning("[%s] checker step_down failed: %s", self.self_id, exc)
        # whatever the checker did not answer ends here: the outcome is unknown
        for rid in [r for r, (rnd, _) in self._rounds.items() if rnd.term == change.term]:
            self._finish_round(rid, ResponseCode.TERM_CHANGED)
        await asyncio.gather(
            *(d.deactivate.remote(change.term) for d in self._dispatchers.values()),
            return_exceptions=True,
        )

    async def _start_leading(self, change: StartLeading) -> None:
        term = change.term
        try:
            await self._checker.become_leader.remote(term, change.term_start_index, change.info)
            await asyncio.gather(
                *(d.activate.remote(change.info) for d in self._dispatchers.values())
            )
        except ray.exceptions.RayError as exc:
            log.error("[%s] term=%d: helpers did not start: %s", self.self_id, term, exc)
            return
        with self._lock:
            ready = self.logic.mark_ready(term)
        if ready:
            log.info("[%s] term=%d: ready to take appends", self.self_id, term)
            if self.config.fast_path and len(self.peers) > 1:
                self._fast_path().start(term)

    def _fast_path(self) -> FastPath:
        if self._fast is None:
            followers = {p: self._peer(p) for p in self.peers if p != self.self_id}
            self._fast = FastPath(
                self.self_id,
                followers,
                self._dispatchers,
                self._checker,
                self.config.stall_ms(),
                self._on_graph_output,
                self._on_graph_fallback,
                self._loop,
            )
        return self._fast

    def _on_graph_output(self, term: int, committed: int | None, resolved: list) -> None:
        if committed is not None:
            with self._lock:
                self.logic.on_committed(term, committed)
        self._finish(resolved)

    def _on_graph_fallback(self, items: list) -> None:
        """Rounds that were queued or in flight in an abandoned graph travel again as plain
        calls (a follower answers a push it already holds from its log)."""
        for a, rounds in items:
            waiting = [(f, la, rid) for f, la, rid in rounds if rid in self._rounds]
            if not waiting:
                continue
            self._announce_plain(a)
            for first, last, rid in waiting:
                self._checker.add_round.remote(a.term, first, last, rid)

    def _announce_plain(self, a) -> None:
        batch = a.payload
        if not isinstance(batch, EntryBatch) or len(batch.data) > INLINE_BYTES:
            a = replace(a, payload=ray.put(batch))
        for d in self._dispatchers.values():
            d.on_announcement.remote(a)

    def _resolve(self, answers) -> None:
        for fut, resp in answers:
            if type(fut) is tuple:  # a compiled-path push answered late: with the next one
                with self._lock:
                    self._late.append((fut[1], resp))
            elif not fut.done():
                fut.get_loop().call_soon_threadsafe(_set_result, fut, resp)

    # -- election RPCs (own concurrency group) ----------------------------------------------
    @ray.method(concurrency_group="election", enable_task_events=False)
    async def handle_election(self, req):
        """A vote, pre-vote, heartbeat or leadership-transfer request from a peer."""
        with self._lock:
            resp, actions = self.logic.handle_election(req, now_ms())
        self._apply_threadsafe(actions)
        self._rearm()
        return resp

    def _apply_threadsafe(self, actions: list) -> None:
        """Election handlers run on another loop; actions are carried out on the main one."""
        if actions:
            asyncio.run_coroutine_threadsafe(self._apply(actions), self._loop)

    @ray.method(concurrency_group="election")
    async def transfer_leadership(self, target: str):
        """Ask this member (the leader) to hand leadership to ``target``."""
        if target not in self.peers:
            raise LedgerError.of(
                ResponseCode.UNKNOWN_MEMBER, f"{target!r} is not a member of {self.group!r}"
            )
        with self._lock:
            resp, actions = self.logic.elector.transfer_leadership(target, now_ms())
        self._apply_threadsafe(actions)
        self._rearm()
        if resp.code != ResponseCode.SUCCESS:
            raise LedgerError.of(
                resp.code,
                f"{self.self_id} cannot transfer leadership to {target}",
                leader_id=self.logic.state.leader_id,
            )
        return resp

    @ray.method(concurrency_group="election")
    async def status(self) -> MemberStatus:
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
            "rounds_waiting": len(self._rounds),
        }

    @ray.method(concurrency_group="election")
    async def helper_pids(self) -> dict[str, int]:
        """Process ids of this member's checker and dispatchers (for fault injection)."""
        refs = {"checker": self._checker.pid.remote()}
        refs.update({f"dispatcher:{p}": d.pid.remote() for p, d in self._dispatchers.items()})
        return {k: await r for k, r in refs.items()}

    @ray.method(concurrency_group="election")
    async def set_faults(
        self, cut: list[str], drop: dict[str, float], delay_ms: dict[str, float]
    ) -> None:
        self.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))
        await asyncio.gather(
            *(d.set_faults.remote(cut, drop, delay_ms) for d in self._dispatchers.values())
        )

    # -- follower ---------------------------------------------------------------------------
    @ray.method(enable_task_events=False)
    async def push(self, req: PushEntryRequest, batch=None):
        """A push from the leader's dispatcher (a large batch arrives from the object store)."""
        if batch is not None:
            req.batch = batch
        fut = self._loop.create_future()
        with self._lock:
            answers = self.logic.on_push(req, fut, now_ms())
        for f, resp in answers:
            if f is fut:
                _set_result(fut, resp)
            else:
                self._resolve([(f, resp)])
        return await fut

    def cg_push(self, pushed):
        """Pushes from the leader's compiled graph (runs on the graph's thread)."""
        carry, wire = pushed
        answers = []
        now = now_ms()
        with self._lock:
            for key, req in wire:
                for tok, resp in self.logic.on_push(req, ("cg", key), now):
                    if type(tok) is tuple:
                        answers.append((tok[1], resp))
                    elif not tok.done():
                        tok.get_loop().call_soon_threadsafe(_set_result, tok, resp)
            if self._late:
                answers += self._late
                self._late = []
        return carry, answers

    @ray.method(concurrency_group="election")
    async def cg_reset(self, term: int) -> int:
        """A leader of ``term`` is about to compile its graph: leave every older one."""
        n = reset_loops(self)
        if n:
            log.info("[%s] term=%d: left %d old compiled-graph loop(s)", self.self_id, term, n)
        return n

    # -- leader: appends ----------------------------------------------------------------------
    @ray.method(enable_task_events=False)
    async def append(
        self, bodies: list, group: str | None = None, target: str | None = None
    ) -> list[tuple]:
        """Append a batch as leader; once a quorum stores it, returns ``(first index, term,
        positions)`` with the positions as little-endian int64 bytes (compact to send back).

        The batch joins the round of everything appended in the same loop turn.
        """
        with self._lock:
            _, bodies = self.logic.admit(
                bodies, group if group is not None else self.group, target, self._outstanding
            )
        fut = self._loop.create_future()
        self._queue.append((fut, bodies))
        self._outstanding += 1
        self._schedule_round()
        try:
            return await fut
        finally:
            self._outstanding -= 1

    def _schedule_round(self) -> None:
        """Write the queue as a round in this loop turn, unless ``MAX_ROUNDS`` rounds already
        wait for their quorum: then the queue grows until one of them ends, and goes out as
        one larger round (every round costs a dozen actor calls, whatever its size)."""
        if not self._round_scheduled and self._queue and len(self._rounds) < MAX_ROUNDS:
            self._round_scheduled = True
            self._loop.call_soon(self._write_round)

    def _write_round(self) -> None:
        """Group commit: the queued appends become one store batch and one round."""
        self._round_scheduled = False
        queue, self._queue = self._queue, []
        if not queue:
            return
        rid = next(self._round_ids)
        with self._lock:
            term = self.logic.ready_term
            try:
                rnd = self.logic.write_round([(None, b) for _, b in queue], term)
            except LedgerError as exc:
                for fut, _ in queue:
                    _set_exception(
                        fut, LedgerError.of(exc.code, exc.message, leader_id=exc.leader_id)
                    )
                return
            a = self.logic.announcement(rnd, None)
        self._rounds[rid] = (rnd, [f for f, _ in queue])
        batch = rnd.appended.batch()
        self._metrics.round_started(rid, rnd.last_index - rnd.first_index + 1, len(batch.data))
        fast = self._fast
        if fast is not None and fast.active:
            if fast.submit(replace(a, payload=batch), [(rnd.first_index, rnd.last_index, rid)]):
                return
        self._announce_plain(replace(a, payload=batch))
        self._checker.add_round.remote(term, rnd.first_index, rnd.last_index, rid)

    @ray.method(enable_task_events=False)
    async def on_resolved(self, term: int, committed: int | None, resolved: list) -> None:
        """From the checker: the committed index moved and/or rounds ended."""
        if committed is not None:
            with self._lock:
                self.logic.on_committed(term, committed)
        self._finish(resolved)

    def _finish(self, resolved) -> None:
        for token, code in resolved:
            self._finish_round(token, code)

    def _finish_round(self, rid: int, code: ResponseCode) -> None:
        item = self._rounds.pop(rid, None)
        if item is None:
            return
        self._metrics.round_done(rid, code == ResponseCode.SUCCESS)
        self._schedule_round()
        rnd, futs = item
        if code == ResponseCode.SUCCESS:
            with self._lock:  # read-your-writes, even before the checker's index arrives
                self.logic.on_committed(rnd.term, rnd.last_index)
            positions = np.asarray(rnd.appended.positions, dtype=np.int64)
            base = rnd.first_index
            for fut, (_, first, last) in zip(futs, rnd.calls, strict=True):
                # compact: (first index, term, positions as int64 bytes), expanded by the client
                _set_result(
                    fut, (first, rnd.term, positions[first - base : last - base + 1].tobytes())
                )
            return
        for fut, (_, first, last) in zip(futs, rnd.calls, strict=True):
            # the entries are in this member's log and may still commit under a later
            # leader: the outcome is unknown, never a plain failure to retry
            _set_exception(
                fut,
                OutcomeUnknownError(
                    code,
                    f"entries {first}..{last} (term {rnd.term}) were stored by {self.self_id} "
                    f"but not acknowledged by a quorum ({code.name}); the outcome is unknown, "
                    "check before retrying",
                    leader_id=self.logic.state.leader_id,
                ),
            )

    # -- answers to this member's helpers (fenced by term) ------------------------------------
    @ray.method(enable_task_events=False)
    async def on_peer_progress(self, peer: str, match_index: int) -> None:
        with self._lock:
            actions = self.logic.on_peer_progress(peer, match_index, now_ms())
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

    # -- reads ----------------------------------------------------------------------------------
    def _not_committed_here(self, index: int) -> LedgerError:
        """An uncommitted read: a follower points the client at the leader, which may know more."""
        committed = self.store.committed_index
        st = self.logic.state
        leader = st.leader_id
        if not st.is_leader and leader is not None and leader != self.self_id:
            return LedgerError.of(
                ResponseCode.NOT_LEADER,
                f"entry {index} is not committed on {self.self_id} (committed index {committed}); ask the leader",
                leader_id=leader,
            )
        return LedgerError.of(
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            f"entry {index} is not committed (committed index {committed})",
        )

    async def get(self, index: int, committed_only: bool = True) -> Entry:
        self._metrics.read("committed" if committed_only else "uncommitted")
        with self._lock:
            if committed_only and type(index) is int and index > self.store.committed_index:
                raise self._not_committed_here(index)
            return self.store.get(index)

    async def read(self, start: int, stop: int, committed_only: bool = True) -> list[Entry]:
        if type(start) is not int or type(stop) is not int:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "start and stop must be ints")
        self._metrics.read("committed" if committed_only else "uncommitted")
        with self._lock:
            st = self.logic.state
            if committed_only and stop - 1 > self.store.committed_index and not st.is_leader:
                if st.leader_id not in (None, self.self_id):
                    raise self._not_committed_here(stop - 1)
            limit = (
                self.store.committed_index + 1
                if committed_only
                else self.store.ledger_end_index + 1
            )
            if start >= min(stop, limit):
                return []
            return self.store.get_range(start, min(stop, limit))

    async def read_batch(self, start: int, stop: int, committed_only: bool = True):
        """Encoded entries in [start, stop) (clipped to the committed index) as one EntryBatch."""
        with self._lock:
            limit = (
                self.store.committed_index + 1
                if committed_only
                else self.store.ledger_end_index + 1
            )
            stop = min(stop, limit)
            if start >= stop:
                return None
            return self.store.read_batch(start, max_count=stop - start)

    @ray.method(concurrency_group="election")
    async def leading_term(self) -> int:
        """The term this member leads with its helpers set up, or -1."""
        return self.logic.leading_term if self.logic.state.is_leader else -1

    async def committed_index(self) -> int:
        return self.store.committed_index

    async def store_dir(self) -> str | None:
        return self.config.store.data_dir

    @ray.method(concurrency_group="election")
    async def close(self) -> None:
        if self._maintainer is not None:
            self._maintainer.cancel()
        with self._lock:
            self.store.close()
