"""MemberActor: one member of a group — its store, MemberState, elector and entry handler.

A thin async shell: it owns the clock, the Ray handles and the asyncio loop, and
feeds the sans-I/O cores (``rayledger.election``, ``rayledger.replication``).
The state-maintainer loop ticks the elector every ``maintain_interval_ms`` as
DLedger's ``maintainState`` does.  Votes and heartbeats run in their own Ray
concurrency group (their own thread and loop), so a queue of bulk pushes never
delays them; all core state is touched under one lock, never across an await.

While it leads, the member's :class:`EntryDispatcherActor` (one per peer) push
entries and its :class:`QuorumAckCheckerActor` resolves the appends waiting for
a quorum.  They are created by the member, on its node, and die with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rayledger.election import (
    Elector,
    MemberState,
    Role,
    RoleChange,
    Send,
)
from rayledger.replication import EntryHandler, PushEntryRequest, check_append
from rayledger.storage import Entry, LedgerError, OutcomeUnknownError, ResponseCode, open_store

from .config import LedgerConfig
from .faults import LinkDown, LinkFaults
from .types import MemberStatus

log = logging.getLogger("rayledger.actors")

NAMESPACE = "rayledger"


def actor_name(group: str, member: str) -> str:
    return f"{group}/{member}"


def now_ms() -> int:
    return int(time.monotonic() * 1000)


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
        self.store = open_store(self.config.store)
        self.state = MemberState(group, self_id, self.peers, data_dir=data_dir)
        self.state.update_ledger(self.store.ledger_end_index, self.store.ledger_end_term)
        self.elector = Elector(self.state, self.config.election, random.Random())
        self.handler = EntryHandler(group, self_id, self.state, self.store, self.config.replication)
        self.faults = LinkFaults()
        self._handles: dict[str, Any] = {}
        self._dispatchers: dict[str, Any] = {}
        self._checker = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._maintainer: asyncio.Task | None = None
        self._leader_term = -1
        self._ready_term = -1  # the term whose checker and dispatchers are set up
        self._pending_appends = 0
        self._started = time.time()
        self._boot()
        log.info(
            "[%s] member of %s started: term=%d end=%d",
            self_id,
            group,
            self.state.current_term,
            self.store.ledger_end_index,
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
        interval = self.config.maintain_interval_ms / 1000
        while True:
            try:
                with self._lock:
                    actions = self.elector.tick(now_ms())
                    answers = self.handler.tick(now_ms())
                self._resolve(answers)
                await self._apply(actions)
            except Exception:
                log.exception("[%s] maintain loop error", self.self_id)
            await asyncio.sleep(interval)

    # -- talking to peers ---------------------------------------------------------------
    def _peer(self, peer: str):
        h = self._handles.get(peer)
        if h is None:
            h = ray.get_actor(actor_name(self.group, peer), namespace=NAMESPACE)
            self._handles[peer] = h
        return h

    async def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Send):
                asyncio.ensure_future(self._send(action.to, action.message))
            elif isinstance(action, RoleChange):
                await self._role_changed(action)
            else:
                log.info("[%s] %s", self.self_id, action)

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
            actions = self.elector.on_response(to, msg, resp, now_ms())
        await self._apply(actions)

    async def _role_changed(self, change: RoleChange) -> None:
        """Start or stop leading; changes are handled one at a time, in order."""
        async with self._role_lock:
            log.info(
                "[%s] role %s term=%d leader=%s",
                self.self_id,
                change.role.value,
                change.term,
                change.leader_id,
            )
            if self._leader_term >= 0 and (
                change.role != Role.LEADER or change.term != self._leader_term
            ):
                self._leader_term = -1
                self._ready_term = -1
                await self._checker.step_down.remote(change.term)
                await asyncio.gather(
                    *(d.deactivate.remote(change.term) for d in self._dispatchers.values())
                )
            if change.role != Role.LEADER:
                return
            with self._lock:
                if not self.state.is_leader or self.state.current_term != change.term:
                    return  # already superseded
                # Raft §5.4.2: commit only entries of the leader's own term, so start the
                # term with an empty entry that carries everything before it.
                appended = self.store.append_as_leader([b""], change.term)
                self.state.update_ledger(self.store.ledger_end_index, self.store.ledger_end_term)
                self._leader_term = change.term
                info = self._leader_info()
            await self._checker.become_leader.remote(change.term, appended.first_index, info)
            await asyncio.gather(
                *(d.activate.remote(change.term, info) for d in self._dispatchers.values())
            )
            with self._lock:
                if self.state.is_leader and self.state.current_term == change.term:
                    self._ready_term = change.term

    def _leader_info(self) -> dict:
        s = self.store
        return {
            "begin": s.ledger_begin_index,
            "end": s.ledger_end_index,
            "end_term": s.ledger_end_term,
            "committed": s.committed_index,
        }

    def _resolve(self, answers) -> None:
        for fut, resp in answers:
            if not fut.done():
                fut.get_loop().call_soon_threadsafe(_set_result, fut, resp)

    # -- election RPCs (own concurrency group) ----------------------------------------------
    @ray.method(concurrency_group="election")
    async def handle_election(self, req):
        """A vote, pre-vote, heartbeat or leadership-transfer request from a peer."""
        with self._lock:
            resp, actions = self.elector.handle(req, now_ms())
        self._apply_threadsafe(actions)
        return resp

    def _apply_threadsafe(self, actions: list) -> None:
        """Election handlers run on another loop; actions are carried out on the main one."""
        if actions and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._apply(actions), self._loop)

    @ray.method(concurrency_group="election")
    async def transfer_leadership(self, target: str):
        """Ask this member (the leader) to hand leadership to ``target``."""
        if target not in self.peers:
            raise LedgerError.of(
                ResponseCode.UNKNOWN_MEMBER, f"{target!r} is not a member of {self.group!r}"
            )
        with self._lock:
            resp, actions = self.elector.transfer_leadership(target, now_ms())
        self._apply_threadsafe(actions)
        if resp.code != ResponseCode.SUCCESS:
            raise LedgerError.of(
                resp.code,
                f"{self.self_id} cannot transfer leadership to {target}",
                leader_id=self.state.leader_id,
            )
        return resp

    @ray.method(concurrency_group="election")
    async def status(self) -> MemberStatus:
        with self._lock:
            return MemberStatus(
                role=self.state.role,
                term=self.state.current_term,
                leader_id=self.state.leader_id,
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
    async def set_faults(
        self, cut: list[str], drop: dict[str, float], delay_ms: dict[str, float]
    ) -> None:
        self.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))
        await asyncio.gather(
            *(d.set_faults.remote(cut, drop, delay_ms) for d in self._dispatchers.values())
        )

    # -- data RPCs ------------------------------------------------------------------------
    async def push(self, req: PushEntryRequest, batch=None):
        """A push from the leader's dispatcher (batch arrives from the object store)."""
        if batch is not None:
            req.batch = batch
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            answers = self.handler.handle_push(req, fut, now_ms())
        self._resolve(answers)
        return await fut

    async def append(
        self, bodies: list, group: str | None = None, target: str | None = None
    ) -> list[tuple]:
        """Append a batch as leader; returns [(index, term, pos)] once a quorum stores it."""
        with self._lock:
            check_append(
                self.state,
                group if group is not None else self.group,
                target,
                bodies,
                self._pending_appends,
                self.config.replication,
                self.elector_transferring(),
            )
            term = self.state.current_term
            if self._ready_term != term:
                raise LedgerError.of(
                    ResponseCode.LEADER_NOT_READY,
                    f"{self.self_id} is taking office for term {term}",
                    leader_id=self.self_id,
                )
            appended = self.store.append_as_leader(bodies, term)
            self.state.update_ledger(self.store.ledger_end_index, self.store.ledger_end_term)
            first, last = appended.first_index, appended.last_index
            batch = appended.batch()
            end = self.store.ledger_end_index
            self._pending_appends += 1
        edges = (appended.positions[0], appended.positions[-1])
        try:
            ref = ray.put(batch)
            for d in self._dispatchers.values():
                d.on_append.remote(term, first, batch.count, [ref], end, len(batch.data), edges)
            code = await self._checker.wait_commit.remote(term, first, last)
        finally:
            self._pending_appends -= 1
        if code != ResponseCode.SUCCESS:
            # The entries are in this member's log and may still commit under a later
            # leader: the outcome is unknown, never a plain failure to retry.
            raise OutcomeUnknownError(
                code,
                f"entries {first}..{last} (term {term}) were stored by {self.self_id} but not "
                f"acknowledged by a quorum; the outcome is unknown, check before retrying",
                leader_id=self.state.leader_id,
            )
        with self._lock:  # the checker's on_committed may still be in flight: read-your-writes
            self.store.update_committed_index(last)
        return [(first + k, term, p) for k, p in enumerate(appended.positions)]

    def elector_transferring(self) -> bool:
        return self.elector.transferring

    async def on_committed(self, term: int, index: int) -> None:
        """From the checker: the quorum stores everything up to ``index``."""
        with self._lock:
            if self.state.current_term == term:
                self.store.update_committed_index(index)

    async def on_peer_progress(self, peer: str, match_index: int) -> None:
        with self._lock:
            actions = self.elector.on_peer_progress(peer, match_index, now_ms())
        await self._apply(actions)

    async def read_for_push(self, start: int, max_bytes: int, max_count: int):
        """For a dispatcher that missed a batch: encoded entries from ``start``, put once."""
        with self._lock:
            batch = self.store.read_batch(start, max_bytes, max_count)
            info = self._leader_info()
        return batch.first_index, batch.count, [ray.put(batch)], info, len(batch.data)

    async def entry_meta(self, index: int) -> tuple[int, int, dict]:
        with self._lock:
            return self.store.get_term(index), self.store.get_pos(index), self._leader_info()

    def _not_committed_here(self, index: int) -> LedgerError:
        """An uncommitted read: a follower points the client at the leader, which may know more."""
        committed = self.store.committed_index
        leader = self.state.leader_id
        if not self.state.is_leader and leader is not None and leader != self.self_id:
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
        with self._lock:
            if committed_only and type(index) is int and index > self.store.committed_index:
                raise self._not_committed_here(index)
            return self.store.get(index)

    async def read(self, start: int, stop: int, committed_only: bool = True) -> list[Entry]:
        if type(start) is not int or type(stop) is not int:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "start and stop must be ints")
        with self._lock:
            if (
                committed_only
                and stop - 1 > self.store.committed_index
                and not self.state.is_leader
            ):
                if self.state.leader_id not in (None, self.self_id):
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
        """The term this member leads with its dispatchers set up, or -1."""
        return self._leader_term if self.state.is_leader else -1

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


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)
