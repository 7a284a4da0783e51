"""The Ray member's shell around its state machine (see machine.py): every call into the
machine (apply, role changes, readiness, queries) runs in order on one thread of its own,
so slow user code never blocks the member's event loop.  ``pre_append`` is the exception:
the store calls it inside the leader's write, on the member's loop.

Every decision -- what to apply next, when a query is answered or fails, when the machine is ready
for a new leader's term, what a failure does -- is the core's
(:class:`~rayledger.actors.core.machine.MachineCore`, ``applier.core``); this shell only delivers
events to it (under the member's lock, on the member's loop) and carries out what it says with the
pool, futures and timers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rayledger.actors.core import machine as mcore
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.machine import AskReady, Batch, Install, QueryVerdict, Rebase
from rayledger.actors.futures import set_exception, set_result
from rayledger.actors.machine import (
    Applier,
    MachineContext,
    StateMachine,
    load_machine,
    load_quietly,
)
from rayledger.actors.member.context import MemberContext
from rayledger.actors.naming import now_ms
from rayledger.election import Role
from rayledger.storage import Entry
from rayledger.storage.snapshots import with_sessions

log = logging.getLogger("rayledger.actors")


class MachineRunner:
    def __init__(self, ctx: MemberContext, data_dir: str | None):
        cfg = ctx.config
        machine = load_machine(cfg.state_machine)
        own = MachineContext(
            ctx.group, ctx.self_id, data_dir, dict(cfg.state_machine_args), ctx.store
        )
        self.applier = Applier(machine, own, snapshots=cfg.snapshots())
        self.core = self.applier.core
        ctx.store.keep_from = self.core.keep_from(self.applier.saved)
        if self.applier.shelf is not None:
            # push answers carry what the core says the machine needs from the leader
            ctx.logic.take_snapshots(
                self.applier.shelf, self.core.snapshot_wanted, self.snapshot_asked
            )
        if type(machine).pre_append is not StateMachine.pre_append:
            ctx.store.add_append_hook(machine.pre_append)  # only then: hooks copy bodies
        self.ctx = ctx
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"machine-{ctx.self_id}")
        log.info(
            "[%s] state machine %s applied up to %d",
            ctx.self_id,
            cfg.state_machine,
            self.core.applied,
        )

    @property
    def failed(self) -> str | None:
        """Why the machine failed (it applies no more), or None."""
        return self.core.failed

    def receipt(self, first: int, last: int) -> list | None:
        """The machine's receipts for a committed round (None if it fails: the append still
        committed, and the appender can read the entries back)."""
        try:
            return self.applier.machine.receipt(first, last)
        except Exception as exc:
            log.error("[%s] receipt of %d..%d failed: %r", self.ctx.self_id, first, last, exc)
            return None

    # -- applying committed entries --------------------------------------------------------
    def kick(self) -> None:
        """The committed index may have moved (any thread)."""
        self.ctx.loop.call_soon_threadsafe(self._pump)

    def _pump(self) -> None:
        """Start the job the core says is due (none while one is in flight)."""
        m = self.ctx
        with m.lock:
            batch = self.core.step(
                mcore.NextJob(m.store.committed_index, m.store.ledger_begin_index), now_ms()
            )
            if batch is None:
                return
            if isinstance(batch, Install):
                asyncio.ensure_future(self._install(batch))
                return
            if isinstance(batch, Rebase):
                asyncio.ensure_future(self._rebase(batch))
                return
            try:
                entries = m.store.get_range(batch.start, batch.stop)
                self.core.step(mcore.BatchRead(batch, entries), now_ms())
            except Exception as exc:
                self._failed(exc)
                return
        asyncio.ensure_future(self._apply(batch, entries))

    async def _apply(self, batch: Batch, entries: list[Entry]) -> None:
        loop = asyncio.get_running_loop()
        try:
            saved = await loop.run_in_executor(self._pool, self._run, entries)
        except Exception as exc:
            with self.ctx.lock:
                self._failed(exc)
            return
        m = self.ctx
        with m.lock:
            released = self.core.step(mcore.BatchApplied(batch.stop - 1), now_ms())
            m.store.keep_from = self.core.keep_from(saved)
            index = self.core.step(mcore.SnapshotDue(entries, m.store.ledger_begin_index), now_ms())
            term = m.store.get_term(index) if index is not None else -1
        for fut in released:
            set_result(fut, None)
        if index is not None:
            self._cut(index, term)
        self._pump()  # whatever committed meanwhile

    def snapshot_asked(self, index: int, have: int | None = None) -> None:
        """A follower's machine needs a snapshot at or past ``index`` (on the member's
        loop, under its lock): cut one now if the core says so, before any later batch."""
        m = self.ctx
        with m.lock:
            now = self.core.step(
                mcore.SnapshotAsked(index, m.store.ledger_begin_index, have), now_ms()
            )
            term = m.store.get_term(now) if now is not None else -1
        if now is not None:
            self._cut(now, term)

    def _cut(self, index: int, term: int) -> None:
        """The snapshot's cut on the machine's thread, queued before any later batch; it
        is written and sealed off that thread."""
        cut = asyncio.get_running_loop().run_in_executor(self._pool, self.applier.machine.snapshot)
        asyncio.ensure_future(self._snapshot(cut, index, term))

    async def _snapshot(self, cut, index: int, term: int) -> None:
        """Write the machine's state at ``index`` off the machine's thread, seal it, keep
        the newest, and let the log go up to it (see SnapshotPolicy)."""
        m, snaps = self.ctx, self.applier.snapshots
        loop = asyncio.get_running_loop()
        with m.lock:  # the client sessions as of the cut travel with it
            sessions = m.logic.sessions.at(index)
        try:
            writer = await cut
            if writer is None:
                raise RuntimeError("the machine's snapshot() returned no writer")
            write = with_sessions(writer, sessions)
            await loop.run_in_executor(None, snaps.seal, index, term, write)
            with m.lock:
                gone, m.store.keep_from = self.core.step(
                    mcore.SnapshotSealed(index, snaps.list(), self.applier.saved), now_ms()
                )
            for old in gone:
                snaps.delete(old)
            log.info("[%s] state machine snapshot at %d (term %d)", m.self_id, index, term)
        except Exception as exc:
            with m.lock:
                self.core.step(mcore.SnapshotFailed(index, repr(exc)), now_ms())
            return
        # batches that ended while it was written took none: one may be due now (no batch
        # in flight, so the cut is where the machine stands; later batches queue behind it)
        with m.lock:
            due = self.core.applying is None
            again = (
                self.core.step(mcore.SnapshotDue([], m.store.ledger_begin_index), now_ms())
                if due
                else None
            )
            term = m.store.get_term(again) if again is not None else -1
        if again is not None:
            self._cut(again, term)

    def _run(self, entries: list[Entry]) -> int:
        """On the machine's thread: apply, then what the machine has made durable itself."""
        self.applier.run(entries)
        return self.applier.saved_now()

    async def _rebase(self, job: Rebase) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self.applier.machine.rebase, job.index)
        except Exception as exc:
            with self.ctx.lock:
                self._failed(exc)
            return
        with self.ctx.lock:
            released = self.core.step(mcore.Rebased(job.index), now_ms())
        for fut in released:
            set_result(fut, None)
        self._pump()

    # -- snapshots installed from the leader ----------------------------------------------
    def offer(self, sealed: list) -> None:
        """Snapshots the member sealed from its leader (under the member's lock): the core
        says whether the machine loads one."""
        if any(
            [
                self.core.step(mcore.SnapshotOffered(meta.index, meta.path), now_ms())
                for meta in sealed
            ]
        ):
            self.kick()

    async def _install(self, job: Install) -> None:
        loop = asyncio.get_running_loop()
        m, snaps = self.ctx, self.applier.snapshots
        try:
            await loop.run_in_executor(
                self._pool, load_quietly, self.applier.machine, job.path, job.index
            )
        except Exception as exc:
            with m.lock:
                self._failed(exc)
            return
        with m.lock:
            released, gone, m.store.keep_from = self.core.step(
                mcore.Installed(job.index, snaps.list(), self.applier.saved), now_ms()
            )
        for old in gone:
            snaps.delete(old)
        for fut in released:
            set_result(fut, None)
        self._pump()

    def _failed(self, exc: BaseException) -> None:
        """Tell the core (under the member's lock); its waiting queries fail."""
        for fut, err in self.core.step(mcore.MachineFailed(repr(exc)), now_ms()):
            set_exception(fut, err)

    # -- role, readiness, queries ----------------------------------------------------------
    async def role_changed(self, role: Role, term: int) -> None:
        with self.ctx.lock:
            news = self.core.step(mcore.RoleNews(role, term), now_ms())
        if not news:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self.applier.machine.on_role_change, role, term)
        except Exception as exc:
            with self.ctx.lock:
                self._failed(exc)

    async def wait_ready(self, still_leading: Callable[[], bool]) -> bool | str:
        """Until the machine says it is ready to lead; False once leadership is gone,
        ``MACHINE_STRANDED`` when it needs a snapshot from another leader."""
        loop = asyncio.get_running_loop()
        proc = self.core.step(
            mcore.WaitReady(still_leading, lambda: self.ctx.store.ledger_begin_index), now_ms()
        )
        gen, answer = proc.gen, None
        while True:
            try:
                action = gen.send(answer)
            except StopIteration as stop:
                return stop.value  # True, False, or MACHINE_STRANDED
            if isinstance(action, AskReady):
                try:
                    value = await loop.run_in_executor(
                        self._pool, self.applier.machine.ready_to_lead
                    )
                except Exception as exc:
                    value = sv.Failed(repr(exc))
            else:  # sv.Sleep
                await asyncio.sleep(action.ms / 1000)
                value = None
            answer = sv.Answer(now_ms(), value)

    async def query(self, request: Any, index: int, timeout_s: float = 30.0) -> Any:
        """The machine's answer once it has applied ``index``."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.ctx.lock:
            verdict = self.core.step(mcore.Query(index, fut, int(timeout_s * 1000)), now_ms())
        if verdict == QueryVerdict.WAIT:
            timer = loop.call_later(timeout_s + 0.002, self._expire)  # past the deadline
            self.kick()
            try:
                await fut
            finally:
                timer.cancel()
                with self.ctx.lock:
                    self.core.step(mcore.QueryGone(fut), now_ms())
        return await loop.run_in_executor(self._pool, self.applier.machine.query, request)

    def _expire(self) -> None:
        with self.ctx.lock:
            late = self.core.step(mcore.ExpireQueries(), now_ms())
        for fut, err in late:
            set_exception(fut, err)

    def close(self) -> None:
        self._pool.submit(self.applier.machine.close)
        self._pool.shutdown(wait=False)
