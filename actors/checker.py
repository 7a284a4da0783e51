"""QuorumAckCheckerActor: commits by quorum and resolves the leader's waiting rounds.

The leader registers every round it stores (:meth:`add_round`); dispatchers
report their followers' water marks (:meth:`report`).  The
:class:`~.logic.CheckerLogic` decides the committed index (Raft section 5.4.2:
only entries of the current term commit directly) and which rounds succeed,
time out (WAIT_QUORUM_ACK_TIMEOUT) or lose their term; the shell tells the
leader in one :meth:`MemberActor.on_resolved` call per loop turn.  Nothing
polls: a timer is set for the oldest round's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import ray
from rayledger.replication import Resolved
from rayledger.storage import LedgerError, ResponseCode

from .config import LedgerConfig
from .logic import CheckerLogic, LeaderInfo
from .naming import now_ms

log = logging.getLogger("rayledger.actors")

COMMIT_NOTICE_S = 0.005  # how long the committed index stands still before dispatchers hear


@ray.remote(num_cpus=0, max_concurrency=1000)
class QuorumAckCheckerActor:
    def __init__(self, group: str, self_id: str, peers: list[str], config: LedgerConfig, member):
        self.group, self.self_id = group, self_id
        self.logic = CheckerLogic(group, self_id, list(peers), config.replication)
        self.member = member
        member.helper_started.remote("checker", None, os.getpid())  # restarted: set me up
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._committed_sent = -1
        self._out: list[tuple[int, object]] = []
        self._cg_gen: int | None = None
        self._dispatchers: list = []
        self._notice: tuple[int, int] | None = None
        self._notice_timer: asyncio.TimerHandle | None = None

    async def pid(self) -> int:
        return os.getpid()

    async def set_dispatchers(self, dispatchers: list) -> None:
        """The member's dispatchers: told when the committed index moves, for their COMMITs."""
        self._dispatchers = list(dispatchers)

    async def become_leader(self, term: int, term_start_index: int, info: LeaderInfo) -> list:
        self._loop = asyncio.get_running_loop()
        with self._lock:
            failed = self.logic.become_leader(term, term_start_index, info)
            self._committed_sent = -1
        self._check()
        return [(r.token, r.code) for r in failed]

    async def step_down(self, term: int) -> list:
        """Leadership ended: the rounds still waiting are answered to the caller."""
        with self._lock:
            failed = self.logic.step_down(term)
            failed += [r for r in self._out_resolved()]
            self._cg_gen = None
        return [(r.token, r.code) for r in failed]

    def _out_resolved(self) -> list[Resolved]:
        out, self._out = self._out, []
        return [r for _, r in out]

    @ray.method(enable_task_events=False)
    async def add_round(self, term: int, first: int, last: int, token, leader_mark: int) -> None:
        """A round of ``term`` waits for its quorum; ``leader_mark`` is how far the leader
        counts its own copy (see :meth:`MemberLogic.water_mark`)."""
        with self._lock:
            if term != self.logic.term:
                self._out.append(
                    (term, Resolved(token, ResponseCode.TERM_CHANGED, first, last, term))
                )
            else:
                self.logic.add_round(term, first, last, token, now_ms(), leader_mark)
        self._kick()

    @ray.method(enable_task_events=False)
    async def report(self, term: int, peer: str, water_mark: int) -> int | None:
        """A follower stores the leader's log up to ``water_mark``; returns the committed
        index of ``term`` (None when this checker does not serve that term)."""
        with self._lock:
            if term != self.logic.term:
                return None
            self.logic.report(term, peer, water_mark)
        self._check()
        return self.logic.committed_index

    # -- the compiled path (see fastpath.py); cg_report runs on the graph's thread -----------
    async def cg_begin(self, term: int, gen: int) -> None:
        with self._lock:
            if term != self.logic.term:
                raise LedgerError.of(
                    ResponseCode.TERM_CHANGED, f"checker serves term {self.logic.term}"
                )
            self._cg_gen = gen

    async def cg_end(self, gen: int) -> None:
        with self._lock:
            if self._cg_gen == gen:
                self._cg_gen = None

    def cg_report(self, ack):
        """A follower's water mark and the rounds of its execution, from the graph."""
        gen, term, peer, wm, rounds = ack
        now = now_ms()
        with self._lock:
            if gen != self._cg_gen or term != self.logic.term:
                return None
            for first, last, token in rounds:  # the graph runs only without sync_flush:
                self.logic.add_round(term, first, last, token, now, last)  # written counts
            if wm >= 0:
                self.logic.report(term, peer, wm)
            committed, resolved = self.logic.check(now)
            resolved += self._out_resolved()
            if committed is not None and committed > self._committed_sent:
                self._committed_sent = committed
            else:
                committed = None
        if committed is not None:
            self._tell_dispatchers(term, committed)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._arm)
        return term, committed, [(r.token, r.code) for r in resolved]

    def _tell_dispatchers(self, term: int, committed: int) -> None:
        """Dispatchers learn the committed index for their COMMIT pushes.

        Under load every announcement and report answer carries it; only the last commit
        before a pause reaches an idle follower no other way, so the notice goes out once
        the index has stood still for ``COMMIT_NOTICE_S`` (one message, not one per round).
        """
        self._notice = (term, committed)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._arm_notice)

    def _arm_notice(self) -> None:
        if self._notice_timer is not None:
            self._notice_timer.cancel()
        self._notice_timer = self._loop.call_later(COMMIT_NOTICE_S, self._send_notice)

    def _send_notice(self) -> None:
        self._notice_timer = None
        if self._notice is None:
            return
        term, committed = self._notice
        self._notice = None
        for d in self._dispatchers:
            d.on_committed.remote(term, committed)

    def _arm(self) -> None:
        """Set the timer for the oldest waiting round's deadline."""
        with self._lock:
            deadline = self.logic.next_deadline_ms() if self.logic.term >= 0 else None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = self._loop.call_later(
                max(0.001, (deadline - now_ms()) / 1000), self._check
            )

    def _kick(self) -> None:
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._check)

    def _check(self) -> None:
        """Commit what a quorum stores; one message to the leader with what changed."""
        self._scheduled = False
        now = now_ms()
        with self._lock:
            term = self.logic.term
            if term < 0:
                return
            committed, resolved = self.logic.check(now)
            resolved += self._out_resolved()
            deadline = self.logic.next_deadline_ms()
            if committed is not None and committed > self._committed_sent:
                self._committed_sent = committed
            else:
                committed = None
        if committed is not None or resolved:
            self.member.on_resolved.remote(term, committed, [(r.token, r.code) for r in resolved])
        if committed is not None:
            self._tell_dispatchers(term, committed)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None and self._loop is not None:
            self._timer = self._loop.call_later(max(0.001, (deadline - now) / 1000), self._check)
