"""EntryDispatcherActor: pushes its leader's entries to one follower (DLedger EntryDispatcher).

The COMPARE / TRUNCATE / APPEND / COMMIT logic is the sans-I/O
:class:`rayledger.replication.EntryDispatcher`; this shell feeds it a view of the
leader's log made of the batches the leader announced (each put into the object
store once, as an ObjectRef) and fetches what the view lacks from the member.
Pushes are pipelined: every request the core emits is sent at once, and the
answers are folded back as they arrive.  Payload bytes go from the object store
to the follower without passing through this process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import ray
from rayledger.replication import EntryDispatcher, PushEntryRequest
from rayledger.storage import LedgerError

from .config import LedgerConfig
from .faults import LinkDown, LinkFaults
from .member import NAMESPACE, actor_name, now_ms

log = logging.getLogger("rayledger.actors")


@dataclass(slots=True)
class RefBatch:
    """A batch whose bytes live in the object store; the core reads only the counts."""

    first_index: int
    count: int
    ref: Any
    nbytes: int

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


class LeaderView:
    """The part of the leader's log a dispatcher needs, cached from announcements."""

    def __init__(self, cache_bytes: int, member, max_batch_bytes: int):
        self.cache_bytes = cache_bytes
        self.member = member
        self.max_batch_bytes = max_batch_bytes
        self.batches: OrderedDict[int, RefBatch] = OrderedDict()
        self.meta: dict[int, tuple[int, int]] = {}
        self.cached_bytes = 0
        self.ledger_begin_index = 0
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1

    def update(self, info: dict) -> None:
        self.ledger_begin_index = info["begin"]
        self.ledger_end_index = max(self.ledger_end_index, info["end"])
        self.committed_index = max(self.committed_index, info["committed"])

    def clear(self) -> None:
        self.batches.clear()
        self.meta.clear()
        self.cached_bytes = 0
        self.ledger_end_index = -1
        self.committed_index = -1

    def add(self, batch: RefBatch) -> None:
        self.batches[batch.first_index] = batch
        self.cached_bytes += batch.nbytes
        while self.cached_bytes > self.cache_bytes and len(self.batches) > 1:
            _, old = self.batches.popitem(last=False)
            self.cached_bytes -= old.nbytes

    def prune(self, water_mark: int) -> None:
        while self.batches:
            first, b = next(iter(self.batches.items()))
            if b.last_index > water_mark:
                break
            self.batches.popitem(last=False)
            self.cached_bytes -= b.nbytes
        if len(self.meta) > 4096:
            self.meta.clear()

    # -- filling the view from the member (blocking: only on a cache miss) ------------------
    # A fetch is a member call whose answer ``took_*`` folds in; the core's synchronous
    # reads block on it (rare), the prefetch before each step awaits it.
    def batch_call(self, start: int, max_count: int = 1 << 20):
        return self.member.read_for_push.remote(start, self.max_batch_bytes, max_count)

    def took_batch(self, answer) -> RefBatch:
        first, count, refs, info, nbytes = answer
        self.update(info)
        b = RefBatch(first, count, refs[0], nbytes)
        self.add(b)
        return b

    def meta_call(self, index: int):
        return self.member.entry_meta.remote(index)

    def took_meta(self, index: int, answer) -> tuple[int, int]:
        term, pos, info = answer
        self.update(info)
        self.meta[index] = (term, pos)
        return term, pos

    def fetch_batch(self, start: int, max_count: int = 1 << 20) -> RefBatch:
        return self.took_batch(ray.get(self.batch_call(start, max_count)))

    def fetch_meta(self, index: int) -> tuple[int, int]:
        return self.took_meta(index, ray.get(self.meta_call(index)))

    # -- the LeaderLog protocol the dispatcher core reads -------------------------------------
    def get_term(self, index: int) -> int:
        m = self.meta.get(index)
        return (m or self.fetch_meta(index))[0]

    def get_pos(self, index: int) -> int:
        m = self.meta.get(index)
        return (m or self.fetch_meta(index))[1]

    def read_batch(
        self, start: int, max_bytes: int = 1 << 62, max_count: int = 1 << 62
    ) -> RefBatch:
        b = self.batches.get(start)
        if b is not None and b.count <= max_count:
            return b
        return self.fetch_batch(start, max_count)


@ray.remote(num_cpus=0, max_concurrency=1000)
class EntryDispatcherActor:
    def __init__(
        self, group: str, self_id: str, peer_id: str, config: LedgerConfig, member, checker
    ):
        self.group, self.self_id, self.peer_id = group, self_id, peer_id
        self.config = config
        self.core = EntryDispatcher(group, self_id, peer_id, config.replication)
        self.view = LeaderView(
            config.dispatcher_cache_bytes, member, config.replication.max_batch_push_bytes
        )
        self.member = member
        self.checker = checker
        self.faults = LinkFaults()
        self.term = -1
        self.active = False
        self._follower = None
        self._wake: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        self._last_progress = 0.0
        self._last_lease_check = time.monotonic()
        self._reported = -1

    def _ensure_running(self) -> None:
        if self._runner is None:
            self._wake = asyncio.Event()
            self._runner = asyncio.ensure_future(self._run())

    async def activate(self, term: int, info: dict) -> None:
        self._ensure_running()
        self.term = term
        self.view.clear()
        self.view.update(info)
        self.core.check_and_fresh_state(term, self.self_id, True)
        self.active = True
        self._reported = -1
        self._wake.set()

    async def deactivate(self, term: int) -> None:
        self._ensure_running()
        self.active = False
        self.core.check_and_fresh_state(term, None, False)
        self.view.clear()

    async def on_append(
        self,
        term: int,
        first: int,
        count: int,
        ref: list,
        end: int,
        nbytes: int = 0,
        edges: tuple[int, int] | None = None,
    ) -> None:
        """The leader stored a batch (``edges``: positions of its first and last entry)."""
        if term != self.term or not self.active:
            return
        self.view.add(RefBatch(first, count, ref[0], nbytes))
        if edges is not None:
            # every entry of a leader's batch has the leader's term: COMPARE/COMMIT pushes
            # that name a batch edge need no round trip to the member
            self.view.meta[first] = (term, edges[0])
            self.view.meta[first + count - 1] = (term, edges[1])
        self.view.ledger_end_index = max(self.view.ledger_end_index, end)
        if self.core.write_index == first:
            await self._step()  # the common case: push it now, without a loop turn
        else:
            self._wake.set()

    async def on_committed(self, term: int, index: int) -> None:
        if term == self.term and index > self.view.committed_index:
            self.view.committed_index = index
            self._wake.set()

    async def set_faults(self, cut: list[str], drop: dict, delay_ms: dict) -> None:
        self.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))

    async def _prefetch(self) -> None:
        """Fetch what the core is about to read, so its reads rarely block."""
        core, view = self.core, self.view
        try:
            if core.state.value == "APPEND":
                w = core.write_index
                if w <= view.ledger_end_index and w not in view.batches:
                    view.took_batch(await view.batch_call(w))
            else:
                index = core.compare_index
                if index < 0:
                    index = view.ledger_end_index
                if index >= 0 and index not in view.meta:
                    view.took_meta(index, await view.meta_call(index))
        except (ray.exceptions.RayError, LedgerError) as exc:
            log.debug("[%s->%s] prefetch failed: %s", self.self_id, self.peer_id, exc)

    async def _still_leading(self) -> None:
        """Safety net: stop pushing if the member no longer leads this term."""
        now = time.monotonic()
        if now - self._last_lease_check < 1.0:
            return
        self._last_lease_check = now
        try:
            term = await self.member.leading_term.remote()
        except ray.exceptions.RayError:
            return
        if term != self.term and self.active:
            log.info(
                "[%s->%s] member no longer leads term %d; dispatcher stops",
                self.self_id,
                self.peer_id,
                self.term,
            )
            await self.deactivate(term)

    async def _run(self) -> None:
        while True:
            try:
                if self.active:
                    await self._still_leading()
                if self.active:
                    await self._step()
            except Exception:
                log.exception(
                    "[%s->%s] dispatcher error term=%d", self.self_id, self.peer_id, self.term
                )
                await asyncio.sleep(0.05)
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.maintain_interval_ms / 1000)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _step(self) -> None:
        await self._prefetch()
        for req in self.core.next_requests(now_ms(), self.view):
            asyncio.ensure_future(self._send(req))

    async def _send(self, req: PushEntryRequest) -> None:
        resp = None
        try:
            if self.faults.active:
                await self.faults.before_send(self.peer_id)
            if self._follower is None:
                self._follower = ray.get_actor(
                    actor_name(self.group, self.peer_id), namespace=NAMESPACE
                )
            batch = req.batch
            if isinstance(batch, RefBatch):
                wire = replace(req, batch=None)
                ref = self._follower.push.remote(wire, batch.ref)
            else:
                ref = self._follower.push.remote(req, None)
            resp = await asyncio.wait_for(ref, self.config.rpc_timeout_ms / 1000)
        except (LinkDown, asyncio.TimeoutError, ray.exceptions.RayError, ValueError) as exc:
            log.debug(
                "[%s->%s] push %s@%d failed: %s",
                self.self_id,
                self.peer_id,
                req.type,
                req.first_index,
                exc,
            )
            self._follower = None if isinstance(exc, ValueError) else self._follower
        if req.term != self.term or not self.active:
            return
        self.core.on_response(req, resp, now_ms())
        wm = self.core.water_mark
        if wm > self._reported:
            self._reported = wm
            self.view.prune(wm)
            asyncio.ensure_future(self._report(req.term, wm))
        self._wake.set()

    async def _report(self, term: int, wm: int) -> None:
        try:
            committed = await self.checker.report.remote(term, self.peer_id, wm)
            if committed is not None:
                self.view.committed_index = max(self.view.committed_index, committed)
            now = time.monotonic()
            if now - self._last_progress > 0.05:
                self._last_progress = now
                self.member.on_peer_progress.remote(self.peer_id, wm)
        except ray.exceptions.RayError:
            pass
