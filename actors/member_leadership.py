"""Taking and leaving office on Ray: the transport of the member's
:class:`~.supervision.Supervisor`.

A part of :class:`~.member.MemberActor` (see :mod:`.member_context`).  The supervisor
decides what a role change does, how long every helper call may take, when a helper is hung
and replaced, and when the leader hands leadership on; this part runs its processes as asyncio tasks (those that
change the helpers' setup under ``_role_lock``, one at a time) and performs their actions
with actor calls, an executor for the flush and signals for a hung helper's process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from contextlib import nullcontext

import ray
from rayledger.storage import LedgerError

from . import supervision as sv
from .member_appends import AppendPart
from .member_context import MemberContext, Part
from .member_election import ElectionPart
from .member_reads import ReadPart
from .naming import now_ms

log = logging.getLogger("rayledger.actors")


class LeadershipPart(Part):
    """Role changes of ``ctx.logic`` and the helpers' supervision.  It tells the other
    parts what a role change means for them: the elector (``election``: step-downs and
    hand-overs), the append path (``appends``: rounds of an ended term, the compiled path)
    and the readers (``reads``)."""

    def __init__(
        self, ctx: MemberContext, election: ElectionPart, appends: AppendPart, reads: ReadPart
    ):
        super().__init__(ctx)
        self.election, self.appends, self.reads = election, appends, reads
        cfg = self.config
        self.supervisor = sv.Supervisor(
            self.logic,
            appends.book,
            self.peers,
            cfg.rpc_timeout_ms,
            cfg.election.heartbeat_timeout_ms,
            sync=ctx.sync,
            machine=cfg.state_machine is not None,
            fast_path=cfg.fast_path,
        )
        self._role_lock = asyncio.Lock()  # role changes and helper restores, one at a time

    async def sync_role(self) -> None:
        """Start or stop leading; changes are carried out one at a time, in order."""
        await self._run_process(self.supervisor.role_changes())

    async def helper_started(self, kind: str, peer: str | None, pid: int) -> None:
        """Every helper says so when its process starts (see
        :meth:`~.supervision.Supervisor.helper_started`)."""
        with self._lock:
            proc = self.supervisor.helper_started(kind, peer, pid)
        if proc is not None:
            await self._run_process(proc)

    async def _run_process(self, proc: sv.Process) -> None:
        """Resume ``proc`` with each action's answer until it ends (under the role lock
        when it changes the helpers' setup; under the member's lock while it decides)."""
        async with self._role_lock if proc.exclusive else nullcontext():
            with self._lock:
                action = proc.start()
            while action is not None and not self.ctx.closed:
                value = await self._perform(action)
                with self._lock:
                    action = proc.send(sv.Answer(now_ms(), value))

    async def _perform(self, a):  # noqa: C901 -- one branch per action, nothing else
        rpc_s = lambda ms: ms / 1000  # noqa: E731
        if isinstance(a, sv.Sleep):
            if a.ms:
                await asyncio.sleep(a.ms / 1000)
            return None
        if isinstance(a, sv.FailReaders):
            self.reads.fail_readers()
            return None
        if isinstance(a, sv.FastStop):
            self.appends.fast_stop()
            return None
        if isinstance(a, sv.CheckerStepDown):
            try:
                return await asyncio.wait_for(
                    self.ctx.checker.step_down.remote(a.new_term), rpc_s(a.timeout_ms)
                )
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                return sv.Failed(repr(exc), isinstance(exc, asyncio.TimeoutError))
        if isinstance(a, sv.Finish):
            self.appends.finish(a.outcomes)
            return None
        if isinstance(a, sv.Deactivate):
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
        if isinstance(a, sv.Install):
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
        if isinstance(a, sv.HandOver):
            self._hand_over(a)
            return None
        if isinstance(a, sv.StepDown):
            self.step_down(a.why)
            return None
        if isinstance(a, sv.MachineRole):
            st = self.logic.state
            await self.ctx.machine.role_changed(st.role, st.current_term)
            return None
        if isinstance(a, sv.WaitMachine):
            return await self.ctx.machine.wait_ready(lambda: self.logic.leads(a.term))
        if isinstance(a, sv.Watch):
            asyncio.ensure_future(self._run_process(self.supervisor.watch(a.term)))
            return None
        if isinstance(a, sv.Ready):
            if a.fast:
                self.appends.fast_start(a.term)
            if not a.watching:
                asyncio.ensure_future(self._run_process(self.supervisor.watch(a.term)))
            return None
        raise TypeError(f"unknown supervision action {a!r}")

    def _helper_handles(self) -> dict:
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
            try:  # helpers run on this member's node: a hung process gets no Ray message
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                else:
                    ray.kill(handles[(kind, peer)], no_restart=False)
            except (ProcessLookupError, ray.exceptions.RayError) as exc:  # already gone
                log.warning("[%s] could not kill its %s helper: %r", self.self_id, kind, exc)

    async def _install_helpers(self, a: sv.Install) -> None:
        """Start the checker and the dispatchers (or one of them, ``a.only``) for ``a.term``."""
        timeout = a.timeout_ms / 1000
        term, only = a.term, a.only
        if only in (None, "checker"):
            dispatchers = list(self.ctx.dispatchers.values())
            await asyncio.wait_for(self.ctx.checker.set_dispatchers.remote(dispatchers), timeout)
            await asyncio.wait_for(
                self.ctx.checker.become_leader.remote(term, a.start, a.info), timeout
            )
            with self._lock:
                again = self.appends.round_path.reregister(term)  # what a dead checker held
            for r in again:
                self.ctx.checker.add_round.remote(r.term, r.first, r.last, r.rid, r.leader_mark)
        dispatchers = [d for p, d in self.ctx.dispatchers.items() if only in (None, "checker", p)]
        f = self.ctx.faults
        await asyncio.wait_for(
            asyncio.gather(
                *(d.set_faults.remote(sorted(f.cut), f.drop, f.delay_ms) for d in dispatchers),
                *(d.activate.remote(a.info) for d in dispatchers),
            ),
            timeout,
        )

    def _hand_over(self, a: sv.HandOver) -> None:
        """Leave leadership of ``a.term`` to ``a.target``; the elector steps down when the
        transfer cannot start or is given up (:meth:`Elector.hand_over`), so the term ends
        either way -- even when the transferee cannot catch up because the helpers that
        would bring it the term's entries never started."""
        if a.target is None:
            self.step_down(a.why)
            return
        log.error("[%s] term=%d: hands leadership to %s: %s", self.self_id, a.term, a.target,
                  a.why)  # fmt: skip
        with self._lock:
            _, actions = self.logic.elector.hand_over(a.target, now_ms())
        asyncio.ensure_future(self.election.apply(actions))
        self.election.rearm()

    def step_down(self, why: str) -> None:
        """Stop leading at once (see :meth:`Elector.step_down`)."""
        with self._lock:
            term = self.logic.state.current_term
            actions = self.logic.elector.step_down(now_ms())
        if actions:
            log.error("[%s] term=%d: steps down: %s", self.self_id, term, why)
            asyncio.ensure_future(self.election.apply(actions))
            self.election.rearm()
