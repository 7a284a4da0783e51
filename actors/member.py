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
from rayledger.election.messages import HeartbeatRequest, TransferOutcome
from rayledger.replication import PushEntryRequest
from rayledger.storage import (
    Entry,
    EntryBatch,
    LedgerError,
    OutcomeUnknownError,
    ResponseCode,
    open_store,
)

from .checker import QuorumAckCheckerActor
from .config import LedgerConfig
from .dispatcher import EntryDispatcherActor
from .fastpath import FastPath, install_loop_registry, reset_loops
from .faults import LinkDown, LinkFaults, load_faults
from .logic import MemberLogic, Round, StartLeading, StopLeading
from .machine_runner import MachineRunner
from .metrics import MemberMetrics
from .naming import NAMESPACE, actor_name, now_ms
from .reads import CommitWaiters, Consistency, ReadIndexLogic
from .types import MemberStatus

log = logging.getLogger("rayledger.actors")

MAX_ROUNDS = 1  # rounds waiting for a quorum before new appends wait to join one round
HELPER_START_S = 30.0  # how long a new leader waits for helpers that are still starting
INLINE_BYTES = 64 * 1024  # rounds up to this size travel inside the call, larger ones via ray.put
MAINTAINER_STALL_S = 10.0  # a maintainer that has not ticked for this long is replaced


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
        # sync_flush: fdatasync outside the member's lock, so heartbeats and votes never
        # wait behind a flush; answers and rounds go out only once it is done
        self._sync = bool(getattr(self.config.store, "sync_flush", False))
        store.defer_sync = self._sync
        self._metrics = MemberMetrics(group, self_id, store, data_dir)
        self.faults = load_faults(group, self_id)  # faults follow a member across restarts
        self._handles: dict[str, Any] = {}
        self._dispatchers: dict[str, Any] = {}
        self._checker = None
        self._maintainer: asyncio.Task | None = None
        self._last_tick = time.monotonic()
        self._closed = False
        self._queue: list[tuple[asyncio.Future, list]] = []
        self._round_scheduled = False
        self._rounds: dict[int, tuple[Round, list[asyncio.Future]]] = {}
        self._round_ids = itertools.count()
        self._outstanding = 0
        self._started = time.time()
        self._fast: FastPath | None = None
        self._late: list = []  # answers to compiled-path pushes that came out of order
        self.reads = ReadIndexLogic(
            self_id, self.peers, self.config.lease_ms(), self.config.rpc_timeout_ms
        )
        self._commit_waiters = CommitWaiters()
        self._machine_runner: MachineRunner | None = None
        if self.config.state_machine is not None:
            self._machine_runner = MachineRunner(self, data_dir)
        self._helper_pids: dict[tuple[str, str | None], int] = {}
        self._transfers: dict[tuple[int, str], asyncio.Future] = {}  # (term, target) -> outcome
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

    @ray.method(concurrency_group="election", enable_task_events=False)
    async def run_maintainer(self) -> None:
        """The elector's clock runs on the election group's loop, beside the vote and
        heartbeat handlers: a main loop busy with appends and pushes never delays a
        heartbeat (role changes are carried out on the main loop)."""
        self._ensure_maintainer()

    def _ensure_maintainer(self) -> None:
        """Start the elector's clock on the running (election) loop unless it is ticking.

        ``run_maintainer`` starts it at boot; every election message and status call
        checks again, so a clock whose start call was lost (seen once in CI after a
        restart: the member stayed a candidate of an old term for good, answering the
        leader's heartbeats TERM_NOT_READY) or whose task ended restarts within one
        heartbeat.  A clock that stopped ticking for ``MAINTAINER_STALL_S`` is replaced.
        """
        task = self._maintainer
        if self._closed:
            return
        if task is not None and not task.done():
            if time.monotonic() - self._last_tick < MAINTAINER_STALL_S:
                return
            log.error("[%s] the maintainer stalled; starting it again", self.self_id)
            task.cancel()
        elif task is not None:
            log.error("[%s] the maintainer had stopped; starting it again", self.self_id)
        self._tick_loop = asyncio.get_running_loop()
        self._tick_wake = asyncio.Event()
        self._last_tick = time.monotonic()
        self._maintainer = asyncio.ensure_future(self._maintain())

    async def _maintain(self) -> None:
        """DLedger's maintainState, event-timed: sleep until the elector's next deadline
        (at least ``maintain_interval_ms``, at most one second) instead of every 10 ms; an
        election message that brings the deadline forward wakes it (:meth:`_rearm`)."""
        interval = self.config.maintain_interval_ms
        while True:
            delay = interval
            self._last_tick = time.monotonic()
            try:
                now = now_ms()
                with self._lock:
                    actions, answers = self.logic.tick(now)
                if self._sync and answers:
                    await asyncio.get_running_loop().run_in_executor(None, self.store.flush)
                self._resolve(answers)
                self._commits_moved()
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
        if due < self._sleep_until and self._tick_loop is not None:
            self._tick_loop.call_soon_threadsafe(self._tick_wake.set)

    # -- talking to peers ---------------------------------------------------------------
    def _peer(self, peer: str):
        h = self._handles.get(peer)
        if h is None:
            h = ray.get_actor(actor_name(self.group, peer), namespace=NAMESPACE)
            self._handles[peer] = h
        return h

    async def _apply(self, actions: list) -> None:
        """Send the messages from the running loop (the election loop for the elector's
        own, so they never wait behind the data path); a role change is carried out on
        the main loop, where the append path lives."""
        if not actions:
            return
        sends, role_changed = MemberLogic.split(actions)
        for a in actions:
            if isinstance(a, TransferOutcome):
                self._transfer_done(a)
        for s in sends:
            asyncio.ensure_future(self._send(s.to, s.message))
        if role_changed:
            if asyncio.get_running_loop() is self._loop:
                await self._sync_role()
            else:
                asyncio.run_coroutine_threadsafe(self._sync_role(), self._loop)

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
            try:
                with self._lock:
                    changes = self.logic.leadership()
            except (LedgerError, OSError) as exc:  # the term's empty entry was not written
                self._step_down(f"its term's first entry could not be written: {exc}")
                return
            if self._machine_runner is not None:  # before it is asked whether it is ready
                st = self.logic.state
                await self._machine_runner.role_changed(st.role, st.current_term)
            for change in changes:
                if isinstance(change, StopLeading):
                    await self._stop_leading(change)
                else:
                    await self._start_leading(change)

    async def _stop_leading(self, change: StopLeading) -> None:
        with self._lock:
            readers = self.reads.step_down()
        for token in readers:
            if not token.done():
                _set_exception(token, self._not_leader())
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
        """Set the helpers up for the new term, trying again while they restart; a leader
        that cannot get them working hands leadership on (after ``HELPER_START_S``: at a
        member's start its helpers' processes may still be starting)."""
        term = change.term
        if self._sync:  # the term's first entry is on disk before we count ourselves
            try:
                await self._loop.run_in_executor(None, self.store.flush)
            except (LedgerError, OSError) as exc:
                self._step_down(f"its term's first entry could not be flushed: {exc}")
                return
        give_up = time.monotonic() + self._helper_wait_s()
        delay = 0.05
        while True:
            try:
                budget = max(give_up - time.monotonic(), self.config.rpc_timeout_ms / 1000)
                await self._install_helpers(term, change.term_start_index, change.info, budget)
                break
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                log.error("[%s] term=%d: helpers did not start: %r", self.self_id, term, exc)
            if not self.logic.leads(term):
                return
            if time.monotonic() > give_up:
                self._hand_over(term, "its helpers did not start")
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        if self._machine_runner is not None and not await self._machine_runner.wait_ready(
            lambda: self.logic.leads(term)
        ):
            return
        with self._lock:
            ready = self.logic.mark_ready(term)
        if ready:
            log.info("[%s] term=%d: ready to take appends", self.self_id, term)
            if self.config.fast_path and len(self.peers) > 1:
                self._fast_path().start(term)
            asyncio.ensure_future(self._watch_helpers(term))

    def _helper_keys(self) -> list[tuple[str, str | None]]:
        return [("checker", None)] + [("dispatcher", p) for p in self._dispatchers]

    def _helper_wait_s(self) -> float:
        """How long a leader waits for a helper before it hands leadership on: one election
        timeout (at least two RPC timeouts, so one slow call is not a lost helper), or
        ``HELPER_START_S`` while a helper has never started (at a member's start its
        helpers' processes may still be coming up: not dead, just new)."""
        if not all(k in self._helper_pids for k in self._helper_keys()):
            return HELPER_START_S
        cfg = self.config
        return max(cfg.election.heartbeat_timeout_ms, 2 * cfg.rpc_timeout_ms) / 1000

    async def _watch_helpers(self, term: int) -> None:
        """While this member leads ``term``, ask each helper for its pid every quarter of
        the wait.  A killed helper is restarted by Ray and set up again
        (:meth:`helper_started`); one that answers nothing for :meth:`_helper_wait_s` (a
        hung process, or one Ray could not restart) costs the leadership, which the leader
        hands on rather than holding it with heartbeats while no append can commit."""
        wait_s = self._helper_wait_s()
        answered = {k: time.monotonic() for k in self._helper_keys()}

        async def ping(key: tuple[str, str | None], handle) -> None:
            try:
                await handle.pid.remote()
                answered[key] = time.monotonic()
            except ray.exceptions.RayError:
                pass  # dead: Ray restarts it, or it stays silent and costs the leadership

        handed_over: float | None = None
        while self.logic.leads(term) and not self._closed:
            handles = {("checker", None): self._checker}
            handles.update({("dispatcher", p): d for p, d in self._dispatchers.items()})
            pings = [asyncio.ensure_future(ping(k, h)) for k, h in handles.items()]
            await asyncio.wait(pings, timeout=wait_s / 4)
            silent = [k for k, t in answered.items() if time.monotonic() - t > wait_s]
            if silent and self.logic.leads(term):
                why = f"its {silent[0][0]} {silent[0][1] or ''} answered nothing for {wait_s} s"
                if handed_over is None:
                    handed_over = time.monotonic()
                    self._hand_over(term, why)
                elif time.monotonic() - handed_over > wait_s:  # the transfer did not end it
                    self._step_down(why)
                    return
            await asyncio.sleep(wait_s / 4)

    async def _install_helpers(
        self, term: int, start: int, info, timeout: float, only: str | None = None
    ) -> None:
        """Start the checker and the dispatchers (or one of them, ``only``) for ``term``."""
        if only in (None, "checker"):
            dispatchers = list(self._dispatchers.values())
            await asyncio.wait_for(self._checker.set_dispatchers.remote(dispatchers), timeout)
            await asyncio.wait_for(self._checker.become_leader.remote(term, start, info), timeout)
            for rid, (rnd, _) in list(self._rounds.items()):
                if rnd.term == term:  # rounds a dead checker held
                    self._checker.add_round.remote(term, rnd.first_index, rnd.last_index, rid)
        dispatchers = [d for p, d in self._dispatchers.items() if only in (None, "checker", p)]
        f = self.faults
        await asyncio.wait_for(
            asyncio.gather(
                *(d.set_faults.remote(sorted(f.cut), f.drop, f.delay_ms) for d in dispatchers),
                *(d.activate.remote(info) for d in dispatchers),
            ),
            timeout,
        )

    async def helper_started(self, kind: str, peer: str | None, pid: int) -> None:
        """Every helper says so when its process starts.  A second process for the same
        helper means Ray restarted it after its process died: set it up again for the term
        this member leads (a restarted checker also needs the rounds in flight and every
        follower's water mark again, so the dispatchers start over too)."""
        known = self._helper_pids.setdefault((kind, peer), pid)
        if known == pid:
            return
        self._helper_pids[(kind, peer)] = pid
        log.warning("[%s] %s helper restarted (%s), pid %d", self.self_id, kind, peer or "", pid)
        async with self._role_lock:
            with self._lock:
                term = self.logic.leading_term
                if not self.logic.leads(term):
                    return
                start, info = self.logic.term_start_index, self.logic.leader_info()
            if self._fast is not None:
                self._fast.stop()
            # the helper is up (it called us): within an election timeout, or hand over
            give_up = time.monotonic() + self._helper_wait_s()
            while self.logic.leads(term):
                try:
                    budget = self.config.rpc_timeout_ms / 1000
                    only = kind if kind == "checker" else peer
                    await self._install_helpers(term, start, info, budget, only)
                    return
                except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                    log.error("[%s] term=%d: helper not restored: %s", self.self_id, term, exc)
                if time.monotonic() > give_up:
                    self._hand_over(term, f"its {kind} helper could not be restored")
                    return
                await asyncio.sleep(0.1)

    def _hand_over(self, term: int, why: str) -> None:
        """Leave leadership of ``term`` to a peer (a leader that cannot replicate must not
        hold it: heartbeats alone would keep it forever)."""
        peers = [p for p in self.peers if p != self.self_id]
        if not peers or not self.logic.leads(term):
            return
        target = peers[term % len(peers)]
        log.error("[%s] term=%d: hands leadership to %s: %s", self.self_id, term, target, why)
        with self._lock:
            resp, actions = self.logic.elector.transfer_leadership(target, now_ms())
        if resp.code is not ResponseCode.SUCCESS:
            self._step_down(f"{why}; the transfer to {target} did not start ({resp.code.name})")
            return
        asyncio.ensure_future(self._apply(actions))
        self._rearm()

    def _step_down(self, why: str) -> None:
        """Stop leading at once (see :meth:`Elector.step_down`)."""
        with self._lock:
            term = self.logic.state.current_term
            actions = self.logic.elector.step_down(now_ms())
        if actions:
            log.error("[%s] term=%d: steps down: %s", self.self_id, term, why)
            asyncio.ensure_future(self._apply(actions))
            self._rearm()

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
        self._finish(resolved)  # also releases readers waiting for the commit

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
        self._ensure_maintainer()
        with self._lock:
            resp, actions = self.logic.handle_election(req, now_ms())
        self._apply_threadsafe(actions)
        self._rearm()
        return resp

    def _apply_threadsafe(self, actions: list) -> None:
        """Carry out an election handler's actions on its own loop (see :meth:`_apply`)."""
        if actions:
            asyncio.ensure_future(self._apply(actions))

    @ray.method(concurrency_group="election")
    async def transfer_leadership(self, target: str):
        """Ask this member (the leader) to hand leadership to ``target``."""
        if target not in self.peers:
            raise LedgerError.of(
                ResponseCode.UNKNOWN_MEMBER, f"{target!r} is not a member of {self.group!r}"
            )
        with self._lock:
            term = self.logic.state.current_term
            resp, actions = self.logic.elector.transfer_leadership(target, now_ms())
            running = self.logic.elector.transferring
        done = None
        if resp.code == ResponseCode.SUCCESS and running:
            done = asyncio.get_running_loop().create_future()
            self._transfers[(term, target)] = done
        self._apply_threadsafe(actions)
        self._rearm()
        if resp.code != ResponseCode.SUCCESS:
            raise LedgerError.of(
                resp.code,
                f"{self.self_id} cannot transfer leadership to {target}",
                leader_id=self.logic.state.leader_id,
            )
        if done is not None:  # the transfer's outcome, as the elector decides it
            cfg = self.config
            wait_s = (
                cfg.election.leadership_transfer_wait_timeout_ms + 2 * cfg.rpc_timeout_ms
            ) / 1000
            try:
                code = await asyncio.wait_for(done, wait_s)
            except asyncio.TimeoutError:
                code = ResponseCode.TIMEOUT
            finally:
                self._transfers.pop((term, target), None)
            if code != ResponseCode.SUCCESS:
                raise LedgerError.of(
                    code,
                    f"{self.self_id}: the transfer of term {term} to {target} ended {code.name}",
                    leader_id=self.logic.state.leader_id,
                )
        return resp

    def _transfer_done(self, outcome: TransferOutcome) -> None:
        """A transfer ended (from any loop): its caller learns how."""
        fut = self._transfers.get((outcome.term, outcome.transferee))
        if fut is not None and not fut.done():
            fut.get_loop().call_soon_threadsafe(_set_result, fut, outcome.code)

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
            "rounds_waiting": len(self._rounds),
        }

    @ray.method(concurrency_group="election")
    async def helper_pids(self) -> dict[str, int | None]:
        """Process ids of this member's checker and dispatchers (for fault injection)."""
        refs = {"checker": self._checker.pid.remote()}
        refs.update({f"dispatcher:{p}": d.pid.remote() for p, d in self._dispatchers.items()})
        out: dict[str, int | None] = {}
        for k, r in refs.items():
            try:
                out[k] = await asyncio.wait_for(r, self.config.rpc_timeout_ms / 1000)
            except (ray.exceptions.RayError, asyncio.TimeoutError):
                out[k] = None  # dead or restarting
        return out

    @ray.method(concurrency_group="election")
    async def peer_progress(self) -> dict[str, dict | None]:
        """Each follower's replication progress as this member's dispatchers see it."""
        refs = {p: d.progress.remote() for p, d in self._dispatchers.items()}
        out: dict[str, dict | None] = {}
        for p, r in refs.items():
            try:
                out[p] = await asyncio.wait_for(r, self.config.rpc_timeout_ms / 1000)
            except (ray.exceptions.RayError, asyncio.TimeoutError):
                out[p] = None  # dead or restarting
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
        if self._sync and answers:  # acknowledge only what is on disk
            await self._loop.run_in_executor(None, self.store.flush)
        for f, resp in answers:
            if f is fut:
                _set_result(fut, resp)
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
        if self._sync and done:
            self.store.flush()  # the graph's thread waits for the disk, not the member
        for tok, resp in done:
            if type(tok) is tuple:
                answers.append((tok[1], resp))
            elif not tok.done():
                tok.get_loop().call_soon_threadsafe(_set_result, tok, resp)
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
                    _set_exception(fut, type(exc)(exc.code, exc.message, leader_id=exc.leader_id))
                return
            a = self.logic.announcement(rnd, None)
        self._rounds[rid] = (rnd, [f for f, _ in queue])
        try:
            batch = rnd.appended.batch()
            self._metrics.round_started(rid, rnd.last_index - rnd.first_index + 1, len(batch.data))
            if self._sync:  # followers write meanwhile; the quorum counts us once we flushed
                self._announce_plain(replace(a, payload=batch))
                asyncio.ensure_future(self._register_synced(term, rnd, rid))
                return
            fast = self._fast
            if fast is not None and fast.active:
                if fast.submit(replace(a, payload=batch), [(rnd.first_index, rnd.last_index, rid)]):
                    return
            self._announce_plain(replace(a, payload=batch))
            self._checker.add_round.remote(term, rnd.first_index, rnd.last_index, rid)
        except Exception as exc:  # stored, but not sent on (e.g. ray.put failed)
            log.error(
                "[%s] term=%d: round %d..%d not sent: %r",
                self.self_id,
                term,
                rnd.first_index,
                rnd.last_index,
                exc,
            )
            self._finish_round(rid, ResponseCode.INTERNAL_ERROR)

    async def _register_synced(self, term: int, rnd: Round, rid: int) -> None:
        """sync_flush: the round joins the quorum count once it is on this member's disk."""
        try:
            await self._loop.run_in_executor(None, self.store.flush)
        except LedgerError as exc:
            log.error("[%s] term=%d: flush of %d..%d failed: %s", self.self_id, term,
                      rnd.first_index, rnd.last_index, exc)  # fmt: skip
            self._finish_round(rid, ResponseCode.DISK_ERROR)  # stored: outcome unknown
            return
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
        self._commits_moved()

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
            runner = self._machine_runner
            for fut, (_, first, last) in zip(futs, rnd.calls, strict=True):
                # compact: (first index, term, positions as int64 bytes[, receipts]), expanded
                # by the client
                out = (first, rnd.term, positions[first - base : last - base + 1].tobytes())
                receipts = runner.receipt(first, last) if runner is not None else None
                _set_result(fut, out if receipts is None else (*out, receipts))
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

    # -- reads (see reads.py for what each consistency promises) -------------------------
    async def read_index(self, consistency: str = "linearizable") -> int:
        """On the leader: an index every read that starts now may be served at (a follower
        serving a linearizable read asks this, then waits until it has committed that far)."""
        return await self._leader_read_index(Consistency.of(consistency))

    async def _leader_read_index(self, c: Consistency) -> int:
        deadline = time.monotonic() + self.config.rpc_timeout_ms / 1000
        with self._lock:
            term, start = self.logic.read_base()
        # the term's first entry must commit first: until then the committed index may lag
        await self._wait_committed(start, deadline)
        with self._lock:
            if self.logic.read_base()[0] != term:
                raise self._not_leader()
            index = self.store.committed_index
            if c is not Consistency.LINEARIZABLE and self._lease_holds(term):
                return index
            fut = self._loop.create_future()
            sends, confirmed = self.reads.request(term, index, fut, now_ms())
        self._reads_out(sends, confirmed)
        try:
            return await asyncio.wait_for(fut, max(0.001, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise LedgerError.of(
                ResponseCode.TIMEOUT,
                f"{self.self_id} could not confirm with a quorum that it still leads term {term}",
            ) from None

    def _lease_holds(self, term: int) -> bool:
        """A lease read needs pre-vote on and no transfer under way (reads.py says why)."""
        return (
            self.config.election.enable_pre_vote
            and not self.logic.elector.transferring
            and self.reads.lease_holds(term, now_ms())
        )

    def _reads_out(self, sends: list, confirmed: list) -> None:
        for token, index in confirmed:
            if not token.done():
                token.get_loop().call_soon_threadsafe(_set_result, token, index)
        for rnd in sends:
            for peer in self.reads.others:
                asyncio.ensure_future(self._read_ping(peer, rnd))
            self._loop.call_later(self.reads.round_timeout_ms / 1000 + 0.001, self._expire_reads)

    async def _read_ping(self, peer: str, rnd) -> None:
        """One heartbeat of a confirmation round; it counts if ``peer`` follows us in the
        round's term."""
        req = HeartbeatRequest(
            group=self.group,
            local_id=self.self_id,
            remote_id=peer,
            leader_id=self.self_id,
            term=rnd.term,
            round_id=-rnd.round_id,
        )
        ok = False
        try:
            if self.faults.active:
                await self.faults.before_send(peer)
            ref = self._peer(peer).handle_election.remote(req)
            resp = await asyncio.wait_for(ref, self.reads.round_timeout_ms / 1000)
            ok = resp.code == ResponseCode.SUCCESS and resp.term == rnd.term
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError):
            pass
        with self._lock:
            sends, confirmed = self.reads.on_answer(rnd.round_id, peer, ok, now_ms())
        self._reads_out(sends, confirmed)

    def _expire_reads(self) -> None:
        with self._lock:
            sends, expired = self.reads.expire(now_ms())
        for token in expired:
            if not token.done():
                _set_exception(token, asyncio.TimeoutError())
        self._reads_out(sends, [])

    def _not_leader(self) -> LedgerError:
        st = self.logic.state
        leader = st.leader_id if st.leader_id != self.self_id else None
        return LedgerError.of(
            ResponseCode.NOT_LEADER,
            f"{self.self_id} no longer leads {self.group!r}",
            leader_id=leader,
        )

    async def _follower_read_index(self, c: Consistency) -> int:
        """Ask the leader for a read index, then wait until this member committed that far
        (two RPC timeouts in all: a follower that missed pushes catches up after a pause)."""
        deadline = time.monotonic() + 2 * self.config.rpc_timeout_ms / 1000
        leader = self.logic.state.leader_id
        if leader is None or leader == self.self_id:
            raise LedgerError.of(
                ResponseCode.NOT_LEADER, f"{self.self_id} knows no leader to ask for a read index"
            )
        try:
            if self.faults.active:
                await self.faults.before_send(leader)
            ref = self._peer(leader).read_index.remote(c.value)
            index = await asyncio.wait_for(ref, max(0.001, deadline - time.monotonic()))
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError) as exc:
            if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, LedgerError):
                raise exc.cause from None
            raise LedgerError.of(
                ResponseCode.NOT_LEADER,
                f"{self.self_id} could not get a read index from {leader}: {type(exc).__name__}",
            ) from None
        await self._wait_committed(index, deadline)
        return index

    async def _wait_committed(self, index: int, deadline: float) -> None:
        if self.store.committed_index >= index:
            return
        fut = self._loop.create_future()
        with self._lock:
            self._commit_waiters.add(index, fut)
        self._commits_moved()
        try:
            await asyncio.wait_for(fut, max(0.001, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            with self._lock:
                self._commit_waiters.discard(fut)
            raise LedgerError.of(
                ResponseCode.TIMEOUT,
                f"{self.self_id} has committed up to {self.store.committed_index}, not yet "
                f"{index}; it is catching up, try again or read from the leader",
            ) from None

    def _commits_moved(self) -> None:
        """Release the readers waiting for the committed index, and let the state machine
        apply what committed (callable from any thread)."""
        if self._machine_runner is not None:
            self._machine_runner.kick()
        with self._lock:
            done = self._commit_waiters.reached(self.store.committed_index)
        for fut in done:
            if not fut.done():
                fut.get_loop().call_soon_threadsafe(_set_result, fut, None)

    async def _read_limit(self, consistency: str) -> int:
        """The highest index a read with ``consistency`` may return from this member."""
        c = Consistency.of(consistency)
        if c is Consistency.COMMITTED:
            return self.store.committed_index
        if self.logic.state.is_leader:
            await self._leader_read_index(c)
        else:
            await self._follower_read_index(c)
        return self.store.committed_index

    def _not_committed_here(self, index: int, c: Consistency) -> LedgerError:
        """An index past the read's limit.  Past a leader's committed index or a read index
        the entry is not committed in the group (INDEX_OUT_OF_BOUNDS); a follower's own
        committed index may lag, so a ``committed`` read there is pointed at the leader
        (NOT_LEADER, with its id when known) and never refused as out of bounds."""
        committed = self.store.committed_index
        st = self.logic.state
        if c is Consistency.COMMITTED and not st.is_leader:
            leader = st.leader_id if st.leader_id != self.self_id else None
            return LedgerError.of(
                ResponseCode.NOT_LEADER,
                f"entry {index} is not committed on {self.self_id} (committed index "
                f"{committed}); ask the leader",
                leader_id=leader,
            )
        return LedgerError.of(
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            f"entry {index} is not committed (committed index {committed})",
        )

    async def get(
        self, index: int, committed_only: bool = True, consistency: str = "committed"
    ) -> Entry:
        self._metrics.read(Consistency.of(consistency).value if committed_only else "uncommitted")
        if type(index) is not int:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "index must be an int")
        if committed_only:
            limit = await self._read_limit(consistency)
            if index > limit:
                raise self._not_committed_here(index, Consistency.of(consistency))
        with self._lock:
            return self.store.get(index)

    async def read(
        self, start: int, stop: int, committed_only: bool = True, consistency: str = "committed"
    ) -> list[Entry]:
        if type(start) is not int or type(stop) is not int:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "start and stop must be ints")
        self._metrics.read(Consistency.of(consistency).value if committed_only else "uncommitted")
        limit = self.store.ledger_end_index
        if committed_only:
            limit = await self._read_limit(consistency)
            err = self._not_committed_here(stop - 1, Consistency.of(consistency))
            if stop - 1 > limit and err.code == ResponseCode.NOT_LEADER:
                raise err
        with self._lock:
            if start >= min(stop, limit + 1):
                return []
            return self.store.get_range(start, min(stop, limit + 1))

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

    async def committed_index(self, consistency: str = "committed") -> int:
        return await self._read_limit(consistency)

    async def query(self, request, consistency: str = "committed"):
        """Ask the state machine, once it has applied what ``consistency`` requires."""
        if self._machine_runner is None:
            raise LedgerError.of(
                ResponseCode.UNSUPPORTED, f"group {self.group!r} runs no state machine"
            )
        limit = await self._read_limit(consistency)
        return await self._machine_runner.query(request, limit)

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
