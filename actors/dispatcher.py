"""EntryDispatcherActor: the Ray transport of one leader -> follower
:class:`~rayledger.replication.dispatcher.DispatcherLogic`.

The member announces every round it stores (the bytes inline, or one ObjectRef for a large round);
the core decides what to push, what to fetch from the member, when to report to the checker and to
the member's elector, and :class:`~rayledger.replication.dispatcher.DispatcherDriver` runs it on
this actor's loop.  This shell only makes the calls: pushes to the follower (with the link faults
tests inject and a timeout), term-fenced fetches from the member, reports to the checker, and the
compiled graph's entry points.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time

import ray
from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.pump import DispatcherDriver
from rayledger.actors.faults import LinkFaults
from rayledger.actors.metrics import PeerMetrics
from rayledger.actors.naming import NAMESPACE, actor_name
from rayledger.actors.priority import set_background
from rayledger.actors.threadloop import ThreadLoop
from rayledger.actors.wire import out_of_band, pack_push, unpack_announcement, unpack_response
from rayledger.replication import PushEntryRequest
from rayledger.replication.dispatcher import (
    Activate,
    Committed,
    Deactivate,
    DispatcherLogic,
    Fetch,
    Fetched,
    FollowerAnswer,
    GraphAck,
    GraphPush,
    Reported,
    RoundAnnounced,
    read_committed,
)
from rayledger.replication.messages import GraphBegin, GraphEnd, Inline, LeaderInfo
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.reader import StoreReader

log = logging.getLogger("rayledger.actors")


class _DispatcherRayPorts:
    """The dispatcher's calls as Ray actor calls; answers go back to the driver."""

    def __init__(self, actor: EntryDispatcherActor):
        self.a = actor

    def push(self, req: PushEntryRequest) -> None:
        self.a._send(req)

    def fetch(self, f: Fetch) -> None:
        self.a._fetch(f)

    def report(self, term: int, wm: int) -> None:
        self.a._report(term, wm)

    def progress(self, term: int, wm: int) -> None:
        self.a.member.on_peer_progress.remote(self.a.peer_id, term, wm)

    def priority(self, background: bool) -> None:
        set_background(background)


@ray.remote(num_cpus=0, max_concurrency=1)
class EntryDispatcherActor:
    def __init__(
        self, group: str, self_id: str, peer_id: str, config: LedgerConfig, member, checker
    ):
        self.group, self.self_id, self.peer_id = group, self_id, peer_id
        self.config = config
        self.driver = DispatcherDriver(
            DispatcherLogic(
                group, self_id, peer_id, config.replication, config.dispatcher_cache_bytes
            ),
            _DispatcherRayPorts(self),
            lock=threading.Lock(),  # the loop's and a compiled graph's threads deliver too
            guard=threading.RLock(),
        )
        self.loop = ThreadLoop(f"rayledger-dispatcher-{group}-{peer_id}")
        self.driver.attach(self.loop)
        self.logic = self.driver.logic
        self.member = member
        restarted = ray.get_runtime_context().was_current_actor_reconstructed  # set me up again
        member.helper_started.remote("dispatcher", peer_id, os.getpid(), restarted)
        self.checker = checker
        self.faults = LinkFaults()
        self._follower = None
        self._reader: StoreReader | None = None  # the leader's files, for committed entries
        self._files: concurrent.futures.ThreadPoolExecutor | None = None  # reads them
        self._file_reads = 0
        self._metrics = PeerMetrics(group, self_id, peer_id)

    def pid(self) -> int:
        return os.getpid()

    @ray.method(enable_task_events=False)
    def progress(self) -> dict:
        """Where replication to this follower stands (like etcd's Progress), for operators
        and failure messages."""
        with self.driver.lock:
            lg = self.logic
            core = lg.core
            return {
                "term": lg.term,
                "state": core.state.name if core.active else "INACTIVE",
                "water_mark": core.water_mark,
                "write_index": core.write_index,
                "pending": core.pending_pushes,
                "need": repr(lg.need) if lg.need else None,
                "fetching": lg.fetching,
                "reporting": lg.reporting,
                "graph": lg.graph_gen,
                "installs": core.installs,
                "last_install": core.last_install,  # (index, bytes, ms from first chunk)
                "file_reads": self._file_reads,  # committed batches read from the files
            }

    # -- from the member and the checker -------------------------------------------------
    def activate(self, info: LeaderInfo) -> None:
        self.driver.deliver(Activate(info))

    def deactivate(self, term: int) -> None:
        self.driver.deliver(Deactivate(term))

    @ray.method(enable_task_events=False)
    def on_announcement(self, a: list) -> None:
        """The leader stored a round (:func:`~rayledger.actors.wire.pack_announcement`):
        push it now when it is next in line."""
        self.driver.deliver(RoundAnnounced(unpack_announcement(a)))

    @ray.method(enable_task_events=False)
    def on_committed(self, term: int, index: int) -> None:
        self.driver.deliver(Committed(term, index))

    def set_faults(self, cut: list[str], drop: dict, delay_ms: dict) -> None:
        self.faults = LinkFaults(set(cut), dict(drop), dict(delay_ms))

    # -- the compiled path (see fastpath.py); cg_* run on the graph's thread -----------------
    def cg_begin(self, term: int, gen: int) -> None:
        if not self.driver.deliver(GraphBegin(term, gen)):
            raise LedgerError.of(
                ResponseCode.TERM_CHANGED, f"dispatcher serves term {self.logic.term}"
            )

    def cg_end(self, gen: int) -> None:
        """The leader left graph ``gen``: its pushes in flight are lost, push again."""
        self.driver.deliver(GraphEnd(gen))

    def cg_push(self, g):
        """A round through the graph: the pushes the logic wants now (others go plain)."""
        carry, wire = self.driver.deliver(GraphPush(g))
        self._metrics.sent_first(wire)
        return carry, wire

    def cg_ack(self, answered):
        """The follower's answers: fold them in, hand the water mark to the checker."""
        for key, _ in answered[1]:
            self._metrics.acked(key, self.logic)
        return self.driver.deliver(GraphAck(answered))

    # -- the calls ---------------------------------------------------------------------------
    def _committed_from_files(self, f: Fetch):
        """``read_committed`` from the leader's files (this actor runs on its node), or None:
        a memory store, or files that do not hold them."""
        if self._reader is None:
            data_dir = self.config.store.data_dir
            if data_dir is None:
                return None
            try:
                self._reader = StoreReader(data_dir)
            except LedgerError:
                return None
        batch = read_committed(self._reader, f)
        if batch is None:
            return None
        self._file_reads += 1
        return batch, None

    def _fetch(self, f: Fetch) -> None:
        """Ask the leader's files (off this loop, they may be slow) or else the member."""
        if f.from_files:
            if self._files is None:
                self._files = concurrent.futures.ThreadPoolExecutor(1, "rayledger-files")
            self._files.submit(self._fetch_from_files, f)
        else:
            self._fetch_from_member(f)

    def _fetch_from_files(self, f: Fetch) -> None:
        try:
            answer = self._committed_from_files(f)
        except LedgerError as exc:
            self.loop.call_soon(self._fetch_failed, f, exc)
            return
        if answer is None:
            self.loop.call_soon(self._fetch_from_member, f)
        else:
            self.loop.call_soon(self.driver.deliver, Fetched(f, answer))

    def _fetch_from_member(self, f: Fetch) -> None:
        def done(answer, exc: BaseException | None) -> None:
            if exc is not None:
                self._fetch_failed(f, exc)
            else:
                self.driver.deliver(Fetched(f, answer))

        self.loop.on_done(self.member.fetch.remote(f), done)

    def _fetch_failed(self, f: Fetch, exc: BaseException) -> None:
        log.debug(
            "[%s->%s] term=%d fetch %s@%d failed: %s",
            self.self_id,
            self.peer_id,
            f.term,
            f.kind,
            f.index,
            exc,
        )
        self.driver.deliver(Fetched(f, failed=True))

    def _send(self, req: PushEntryRequest) -> None:
        """Push ``req`` to the follower; its answer (None: lost, refused or late) goes to the
        driver on the loop."""
        t0 = time.perf_counter()
        if self.faults.active:
            dropped, wait_ms = self.faults.verdict(self.peer_id)
            if dropped:
                self.loop.call_later_ms(int(wait_ms), self._lost, req, t0, "link down")
                return
            if wait_ms:
                self.loop.call_later_ms(int(wait_ms), self._send_now, req, t0)
                return
        self._send_now(req, t0)

    def _send_now(self, req: PushEntryRequest, t0: float) -> None:
        try:
            if self._follower is None:
                self._follower = ray.get_actor(
                    actor_name(self.group, self.peer_id), namespace=NAMESPACE
                )
            batch = req.batch
            if req.snapshot is not None:  # the chunk goes from the leader to the follower
                c = req.snapshot
                data = self.member.read_snapshot.remote(
                    req.term, c.index, c.term, c.offset, c.length
                )
                ref = self._follower.push.remote(pack_push(req), data)
            elif batch is None:
                ref = self._follower.push.remote(pack_push(req), None)
            elif isinstance(batch.payload, Inline):
                inline = out_of_band(batch.payload.batch)
                ref = self._follower.push.remote(pack_push(req, inline), None)
            else:  # the follower's argument: Ray resolves it there, once
                ref = self._follower.push.remote(pack_push(req), batch.payload.ref)
        except (ray.exceptions.RayError, ValueError) as exc:
            if isinstance(exc, ValueError):
                self._follower = None
            self.loop.call_soon(self._lost, req, t0, exc)
            return
        pending = [True]  # until the answer or the timeout, whichever comes first

        def answered(resp, exc: BaseException | None) -> None:
            if pending[0]:
                pending[0] = False
                timer.cancel()
                if exc is not None:
                    self._lost(req, t0, exc)
                else:
                    self._answered(req, t0, unpack_response(resp))

        def timed_out() -> None:
            if pending[0]:
                pending[0] = False
                self._lost(req, t0, "no answer in time")

        timer = self.loop.call_later_ms(self.config.rpc_timeout_ms, timed_out)
        self.loop.on_done(ref, answered)

    def _lost(self, req: PushEntryRequest, t0: float, why: object) -> None:
        log.debug(
            "[%s->%s] push %s@%d term=%d failed: %s",
            self.self_id,
            self.peer_id,
            req.type.value,
            req.first_index,
            req.term,
            why,
        )
        self._answered(req, t0, None)

    def _answered(self, req: PushEntryRequest, t0: float, resp) -> None:
        self.driver.deliver(FollowerAnswer(req, resp))
        self._metrics.answered(t0, resp, self.logic)

    def _report(self, term: int, wm: int) -> None:
        def done(committed, exc: BaseException | None) -> None:
            if exc is not None:
                log.debug(
                    "[%s->%s] term=%d report failed: %s", self.self_id, self.peer_id, term, exc
                )
                self.driver.deliver(Reported(term, wm, failed=True))
            else:
                self.driver.deliver(Reported(term, wm, committed))

        self.loop.on_done(self.checker.report.remote(term, self.peer_id, wm), done)
