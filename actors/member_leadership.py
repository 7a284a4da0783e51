"""Taking and leaving office on Ray: a member's role changes and the supervision of the
helpers (checker and dispatchers) it leads with.

Mixed into :class:`~.member.MemberActor`.  A new leader sets its helpers up for the term and
watches them while it leads; a helper Ray restarted is set up again
(:meth:`LeadershipMixin.helper_started`), and a leader whose helpers do not work hands
leadership on, or steps down, rather than holding it with heartbeats while no append can
commit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import replace

import ray
from rayledger.storage import LedgerError, ResponseCode

from .futures import set_exception
from .logic import StartLeading, StopLeading
from .naming import now_ms

log = logging.getLogger("rayledger.actors")

HELPER_START_S = 30.0  # how long a new leader waits for helpers that are still starting


class LeadershipMixin:
    """Role changes of ``self.logic`` and the helpers' supervision (uses the shell's
    ``_checker``, ``_dispatchers``, ``_lock``, ``_role_lock`` and the other mixins)."""

    def _init_leadership(self) -> None:
        self._helper_pids: dict[tuple[str, str | None], int] = {}

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
        """Stop the helpers of ``change.term``.  Each call waits one RPC timeout at most: a
        hung helper (a SIGSTOPped process Ray does not restart) must not hold ``_role_lock``,
        or this member could never take office again (issue 20 item 4).  A helper that did
        not answer is harmless: it serves an old term, and every answer to it is fenced."""
        with self._lock:
            readers = self.reads.step_down()
        for token in readers:
            if not token.done():
                set_exception(token, self._not_leader())
        if self._fast is not None:
            self._fast.stop()
        timeout = self.config.rpc_timeout_ms / 1000
        try:
            resolved = await asyncio.wait_for(
                self._checker.step_down.remote(change.new_term), timeout
            )
            self._finish(resolved)
        except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
            log.warning("[%s] term=%d: checker step_down failed: %r", self.self_id,
                        change.new_term, exc)  # fmt: skip
        # whatever the checker did not answer ends here: the outcome is unknown
        for rid, _ in self._book.of_term(change.term):
            self._finish_round(rid, ResponseCode.TERM_CHANGED)
        calls = [asyncio.ensure_future(d.deactivate.remote(change.term))
                 for d in self._dispatchers.values()]  # fmt: skip
        if calls:
            _, late = await asyncio.wait(calls, timeout=timeout)
            for f in late:  # their answer, if any ever comes, is of no use
                f.add_done_callback(lambda f: f.cancelled() or f.exception())
            if late:
                log.warning("[%s] term=%d: %d dispatcher(s) did not stop within %.1f s",
                            self.self_id, change.new_term, len(late), timeout)  # fmt: skip

    async def _start_leading(self, change: StartLeading) -> None:
        """Set the helpers up for the new term, trying again while they restart.  Each try
        waits one RPC timeout; after the first that fails, helpers that answer nothing (hung)
        are replaced (killed, so Ray starts them again) and get one more helper wait.  A
        leader that cannot get them working hands leadership on (after ``HELPER_START_S``
        while a helper has never started: at a member's start they may still be booting)."""
        term = change.term
        info = change.info
        if self._sync:  # the term's first entry is on disk before we count ourselves
            try:
                await self._loop.run_in_executor(None, self.store.flush)
            except (LedgerError, OSError) as exc:
                self._step_down(f"its term's first entry could not be flushed: {exc}")
                return
            with self._lock:  # now flushed: the checker may count it
                info = replace(info, water_mark=self.logic.water_mark())
        wait_s = self._helper_wait_s()
        known = wait_s < HELPER_START_S  # every helper has started before: not still booting
        give_up = time.monotonic() + wait_s
        rpc_s = self.config.rpc_timeout_ms / 1000
        replaced = False
        delay = 0.05
        while True:
            try:
                budget = rpc_s if known else max(give_up - time.monotonic(), rpc_s)
                await self._install_helpers(term, change.term_start_index, info, budget)
                break
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                log.error("[%s] term=%d: helpers did not start: %r", self.self_id, term, exc)
            if not self.logic.leads(term):
                return
            if known and not replaced:  # a hung helper: replace it at once, wait for it once
                replaced = True
                if await self._replace_silent_helpers(term):
                    give_up = max(give_up, time.monotonic() + wait_s)
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
        hung process, or one Ray could not restart) is killed so that Ray starts it again,
        and costs the leadership, which the leader hands on rather than holding it with
        heartbeats while no append can commit."""
        wait_s = self._helper_wait_s()
        answered = {k: time.monotonic() for k in self._helper_keys()}

        async def ping(key: tuple[str, str | None], handle) -> None:
            try:
                await handle.pid.remote()
                answered[key] = time.monotonic()
            except ray.exceptions.RayError:
                pass  # dead: Ray restarts it, or it stays silent and costs the leadership

        while self.logic.leads(term) and not self._closed:
            handles = self._helper_handles()
            pings = [asyncio.ensure_future(ping(k, h)) for k, h in handles.items()]
            await asyncio.wait(pings, timeout=wait_s / 4)
            silent = [k for k, t in answered.items() if time.monotonic() - t > wait_s]
            if silent and self.logic.leads(term):
                why = f"its {silent[0][0]} {silent[0][1] or ''} answered nothing for {wait_s} s"
                self._replace(term, {k: handles[k] for k in silent})
                self._hand_over(term, why)  # ends the term: transferred, or stepped down
                return
            await asyncio.sleep(wait_s / 4)

    def _helper_handles(self) -> dict[tuple[str, str | None], object]:
        handles = {("checker", None): self._checker}
        handles.update({("dispatcher", p): d for p, d in self._dispatchers.items()})
        return handles

    async def _replace_silent_helpers(self, term: int) -> bool:
        """Find the helpers that do not answer a ping within one RPC timeout and replace
        them (a new leader whose helpers time out); True when there were any."""
        handles = self._helper_handles()
        pings = {k: asyncio.ensure_future(h.pid.remote()) for k, h in handles.items()}
        await asyncio.wait(pings.values(), timeout=self.config.rpc_timeout_ms / 1000)
        silent = {}
        for k, f in pings.items():  # a dead one (an exception) is being restarted by Ray
            if not f.done():
                f.add_done_callback(lambda f: f.cancelled() or f.exception())
                silent[k] = handles[k]
        self._replace(term, silent)
        return bool(silent)

    def _replace(self, term: int, silent: dict) -> None:
        """Kill helpers that answer nothing (a hung process: Ray sees nothing to restart), so
        Ray starts them again and :meth:`helper_started` sets them up for whoever leads
        then; otherwise the hung helper would cost this member every term it wins again."""
        for (kind, peer), handle in silent.items():
            pid = self._helper_pids.get((kind, peer))
            log.error("[%s] term=%d: replaces its hung %s helper %s (pid %s)", self.self_id,
                      term, kind, peer or "", pid)  # fmt: skip
            try:  # helpers run on this member's node: a hung process gets no Ray message
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                else:
                    ray.kill(handle, no_restart=False)
            except (ProcessLookupError, ray.exceptions.RayError) as exc:  # already gone
                log.warning("[%s] could not kill its %s helper: %r", self.self_id, kind, exc)

    async def _install_helpers(
        self, term: int, start: int, info, timeout: float, only: str | None = None
    ) -> None:
        """Start the checker and the dispatchers (or one of them, ``only``) for ``term``."""
        if only in (None, "checker"):
            dispatchers = list(self._dispatchers.values())
            await asyncio.wait_for(self._checker.set_dispatchers.remote(dispatchers), timeout)
            await asyncio.wait_for(self._checker.become_leader.remote(term, start, info), timeout)
            mark = self.logic.water_mark()  # sync_flush: rounds still flushing do not count us
            for rid, rnd in self._book.of_term(term):  # rounds a dead checker held
                self._checker.add_round.remote(term, rnd.first_index, rnd.last_index, rid, mark)
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
        hold it: heartbeats alone would keep it forever).  The elector steps down when the
        transfer cannot start or is given up (:meth:`Elector.hand_over`), so the term ends
        either way -- even when the transferee cannot catch up because the helpers that
        would bring it the term's entries never started."""
        peers = [p for p in self.peers if p != self.self_id]
        if not self.logic.leads(term):
            return
        if not peers:
            self._step_down(why)
            return
        target = peers[term % len(peers)]
        log.error("[%s] term=%d: hands leadership to %s: %s", self.self_id, term, target, why)
        with self._lock:
            _, actions = self.logic.elector.hand_over(target, now_ms())
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
