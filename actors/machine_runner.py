"""The Ray member's shell around its state machine (see machine.py): every call into the
machine (apply, role changes, readiness, queries) runs in order on one thread of its own,
so slow user code never blocks the member's event loop.  ``pre_append`` is the exception:
the store calls it inside the leader's write, on the member's loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rayledger.election import Role
from rayledger.storage import LedgerError, ResponseCode

from .machine import Applier, MachineContext, StateMachine, load_machine
from .reads import CommitWaiters

log = logging.getLogger("rayledger.actors")


class MachineRunner:
    def __init__(self, member: Any, data_dir: str | None):
        cfg = member.config
        machine = load_machine(cfg.state_machine)
        ctx = MachineContext(
            member.group, member.self_id, data_dir, dict(cfg.state_machine_args), member.store
        )
        self.applier = Applier(machine, ctx)
        if type(machine).pre_append is not StateMachine.pre_append:
            member.store.add_append_hook(machine.pre_append)  # only then: hooks copy bodies
        self.member = member
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"machine-{member.self_id}")
        self._running = False
        self._waiters = CommitWaiters()  # queries waiting for the machine to apply an index
        self.failed: BaseException | None = None
        log.info(
            "[%s] state machine %s applied up to %d",
            member.self_id,
            cfg.state_machine,
            self.applier.applied,
        )

    def receipt(self, first: int, last: int) -> list | None:
        """The machine's receipts for a committed round (None if it fails: the append still
        committed, and the appender can read the entries back)."""
        try:
            return self.applier.machine.receipt(first, last)
        except Exception as exc:
            log.error("[%s] receipt of %d..%d failed: %r", self.member.self_id, first, last, exc)
            return None

    # -- applying committed entries --------------------------------------------------------
    def kick(self) -> None:
        """The committed index may have moved (any thread)."""
        self.member._loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if not self._running and self.failed is None:
            self._running = True
            asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        m = self.member
        loop = asyncio.get_running_loop()
        try:
            while True:
                with m._lock:
                    due = self.applier.due(m.store.committed_index)
                    if due is None:
                        # no await since the check: a later commit's kick starts a new run
                        self._running = False
                        return
                    entries = m.store.get_range(*due)
                await loop.run_in_executor(self._pool, self.applier.apply, entries)
                self._release()
        except Exception as exc:
            log.exception(
                "[%s] state machine failed at %d; it applies no more",
                m.self_id,
                self.applier.applied + 1,
            )
            self.failed = exc
            self._running = False
            self._release()

    def _release(self) -> None:
        for fut in self._waiters.reached(self.applier.applied):
            if not fut.done():
                fut.set_result(None)
        if self.failed is not None:
            for fut in self._waiters.reached(1 << 62):
                if not fut.done():
                    fut.set_exception(self._broken())

    def _broken(self) -> LedgerError:
        return LedgerError.of(
            ResponseCode.INTERNAL_ERROR,
            f"the state machine of {self.member.self_id} failed: {self.failed!r}",
        )

    # -- role, readiness, queries ----------------------------------------------------------
    async def role_changed(self, role: Role, term: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.applier.role_changed, role, term)

    async def wait_ready(self, still_leading: Callable[[], bool]) -> bool:
        """Until the machine says it is ready to lead; False once leadership is gone."""
        loop = asyncio.get_running_loop()
        while still_leading():
            if self.failed is None and await loop.run_in_executor(
                self._pool, self.applier.machine.ready_to_lead
            ):
                return True
            await asyncio.sleep(0.01)
        return False

    async def query(self, request: Any, index: int, timeout_s: float = 30.0) -> Any:
        """The machine's answer once it has applied ``index``."""
        if self.failed is not None:
            raise self._broken()
        if self.applier.applied < index:
            await self._waiters.wait(
                index,
                time.monotonic() + timeout_s,
                self.kick,
                lambda: LedgerError.of(
                    ResponseCode.TIMEOUT,
                    f"{self.member.self_id} has applied up to {self.applier.applied}, "
                    f"not yet {index}",
                ),
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.applier.machine.query, request)

    def close(self) -> None:
        self._pool.submit(self.applier.machine.close)
        self._pool.shutdown(wait=False)
