"""Taking and leaving office on Ray: the transport of the member's
:class:`~rayledger.actors.core.supervision.Supervisor`.

A part of :class:`~.actor.MemberActor` (see :mod:`.context`).  The supervisor
(inside the member's core) decides what a role change does, how long every helper call may
take, when a helper is hung and replaced, and when the leader hands leadership on; it also
keeps the role lock's queue.  This part only performs its processes' actions, with actor
calls, an executor for the flush and signals for a hung helper's process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import psutil
import ray
from rayledger.actors.core import member as mc
from rayledger.actors.core import supervision as sv
from rayledger.actors.member.appends import AppendPart
from rayledger.actors.member.context import MemberContext, Part
from rayledger.actors.priority import set_background
from rayledger.storage import LedgerError

log = logging.getLogger("rayledger.actors")


class LeadershipPart(Part):
    """The actions of the member core's role changes and helper supervision
    (:class:`~rayledger.actors.core.supervision.Supervisor`, run inside
    :class:`~rayledger.actors.core.member.MemberCore`): helper calls with their time-outs, the flush
    of a new term's first entry, signals to a hung helper, and the append path's share of a role
    change (``appends``: the compiled path)."""

    def __init__(self, ctx: MemberContext, appends: AppendPart):
        super().__init__(ctx)
        self.appends = appends
        # a helper's pid -> its process's start time, read when it said it started: a pid
        # is signalled only while it still names that process (pids are reused)
        self._started_at: dict[int, float] = {}

    def helper_started(self, pid: int) -> None:
        """A helper's process said it started: remember which process the pid names."""
        started = _process_start(pid)
        if started is not None:
            self._started_at[pid] = started

    async def perform(self, a):  # noqa: C901 -- one branch per action, nothing else
        """Carry out one action of the core's supervision processes; returns its answer."""
        rpc_s = lambda ms: ms / 1000  # noqa: E731
        if isinstance(a, sv.Sleep):
            if a.ms:
                await asyncio.sleep(a.ms / 1000)
            return None
        if isinstance(a, sv.FastStop):
            self.appends.fast_stop()
            return None
        if isinstance(a, sv.CheckerStepDown):
            if self.ctx.checker is None:  # a restarted member that has not created it yet
                return None
            try:
                return await asyncio.wait_for(
                    self.ctx.checker.step_down.remote(a.new_term), rpc_s(a.timeout_ms)
                )
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                return sv.Failed(repr(exc), isinstance(exc, asyncio.TimeoutError))
        if isinstance(a, sv.DeactivateDispatchers):
            calls = [asyncio.ensure_future(d.deactivate.remote(a.term))
                     for d in self.ctx.dispatchers.values()]  # fmt: skip
            if not calls:
                return 0
            _, late = await asyncio.wait(calls, timeout=rpc_s(a.timeout_ms))
            for f in late:  # their answer, if any ever comes, is of no use
                f.add_done_callback(lambda f: f.cancelled() or f.exception())
            return len(late)
        if isinstance(a, sv.Flush):
            try:
                await self.ctx.loop.run_in_executor(None, self.store.flush)
            except (LedgerError, OSError) as exc:
                return sv.Failed(str(exc))
            return None
        if isinstance(a, sv.SetUpHelpers):
            try:
                await self._install_helpers(a)
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                return sv.Failed(repr(exc), isinstance(exc, asyncio.TimeoutError))
            return None
        if isinstance(a, sv.Ping):
            return await self._ping(a)
        if isinstance(a, sv.Replace):
            self._replace(a)
            return None
        if isinstance(a, sv.MachineRole):
            st = self.logic.state
            await self.ctx.machine.role_changed(st.role, st.current_term)
            return None
        if isinstance(a, sv.WaitMachine):
            return await self.ctx.machine.wait_ready(lambda: self.logic.holds_office(a.term))
        if isinstance(a, sv.Ready):  # the core watches the helpers from now on
            if a.fast and self.appends.fast_on:
                self.appends.fast_start(a.term)
            return None
        if isinstance(a, sv.Helpers):
            self._helpers(a.peers, a.start, a.background)
            return None
        if isinstance(a, sv.CheckerConfigure):
            try:  # False: the checker does not serve the term
                return await asyncio.wait_for(
                    self.ctx.checker.configure.remote(a.term, a.info), rpc_s(a.timeout_ms)
                )
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                return sv.Failed(repr(exc), isinstance(exc, asyncio.TimeoutError))
        raise TypeError(f"unknown supervision action {a!r}")

    def _helpers(
        self, peers: tuple[str, ...], start: bool = True, background: bool = False
    ) -> None:
        """One dispatcher per member of the configuration other than this one: new ones for
        members added, those of members gone killed; the checker learns the list."""
        ctx = self.ctx
        with self._lock:
            ctx.peers[:] = self.logic.config_log.latest().members
        set_background(background)  # a learner catches up on CPU the voters leave (priority.py)
        if ctx.checker is None:  # none yet (Supervisor.runs_helpers): created from ctx.peers
            if start:
                ctx.ensure_helpers()
            return
        for gone in [p for p in ctx.dispatchers if p not in peers]:
            d = ctx.dispatchers.pop(gone)
            log.info("[%s] stops its dispatcher for %s (no longer a member)", self.self_id, gone)
            try:
                ray.kill(d, no_restart=True)
            except ray.exceptions.RayError:
                pass
        for peer in peers:
            if peer not in ctx.dispatchers:
                log.info("[%s] starts a dispatcher for %s (a new member)", self.self_id, peer)
                ctx.dispatchers[peer] = ctx.new_dispatcher(peer)
        ctx.checker.set_dispatchers.remote(list(ctx.dispatchers.values()))

    def _helper_handles(self) -> dict:
        self.ctx.ensure_helpers()  # a leader's: they start with its first term
        handles = {sv.CHECKER: self.ctx.checker}
        handles.update({("dispatcher", p): d for p, d in self.ctx.dispatchers.items()})
        return handles

    async def _ping(self, a: sv.Ping) -> dict:
        handles = self._helper_handles()
        pings = {k: asyncio.ensure_future(handles[k].pid.remote()) for k in a.keys}
        await asyncio.wait(pings.values(), timeout=a.timeout_ms / 1000)
        out = {}
        for k, f in pings.items():
            if not f.done():
                f.add_done_callback(lambda f: f.cancelled() or f.exception())
                out[k] = "timeout"
            else:
                out[k] = "error" if f.exception() is not None else "ok"
        return out

    def _replace(self, a: sv.Replace) -> None:
        """Kill helpers that answer nothing (a hung process: Ray sees nothing to restart), so
        Ray starts them again and :meth:`helper_started` sets them up for whoever leads
        then; otherwise the hung helper would cost this member every term it wins again."""
        handles = self._helper_handles()
        for (kind, peer), pid in zip(a.keys, a.pids, strict=True):
            same = pid is not None and _process_start(pid) == self._started_at.get(pid)
            try:  # helpers run on this member's node: a hung process gets no Ray message
                if same:
                    os.kill(pid, signal.SIGKILL)
                else:  # no pid, or it names another process now: Ray's kill, by handle
                    if pid is not None:
                        log.warning("[%s] pid %d is no longer its %s helper's: not signalled",
                                    self.self_id, pid, kind)  # fmt: skip
                    ray.kill(handles[(kind, peer)], no_restart=False)
            except (ProcessLookupError, KeyError, ray.exceptions.RayError) as exc:  # gone
                log.warning("[%s] could not kill its %s helper: %r", self.self_id, kind, exc)

    async def _install_helpers(self, a: sv.SetUpHelpers) -> None:
        """Start the checker and the dispatchers (or one of them, ``a.only``) for ``a.term``."""
        self.ctx.ensure_helpers()  # its first term: they start now (Supervisor.runs_helpers)
        timeout = a.timeout_ms / 1000
        term, only = a.term, a.only
        if only in (None, "checker"):
            dispatchers = list(self.ctx.dispatchers.values())
            await asyncio.wait_for(self.ctx.checker.set_dispatchers.remote(dispatchers), timeout)
            await asyncio.wait_for(
                self.ctx.checker.become_leader.remote(term, a.start, a.info), timeout
            )
            self.ctx.carry(self.ctx.step(mc.CheckerSetUp(term)))  # what a dead checker held
        dispatchers = [d for p, d in self.ctx.dispatchers.items() if only in (None, "checker", p)]
        f = self.ctx.faults
        await asyncio.wait_for(
            asyncio.gather(
                *(d.set_faults.remote(sorted(f.cut), f.drop, f.delay_ms) for d in dispatchers),
                *(d.activate.remote(a.info) for d in dispatchers),
            ),
            timeout,
        )


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (None: no such process): with the pid, it names one
    process for good."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None
