"""QuorumAckCheckerActor: commits by quorum and resolves the appends waiting for it.

The leader's ``append`` awaits :meth:`wait_commit`; dispatchers report their
followers' water marks with :meth:`report`.  The sans-I/O
:class:`rayledger.replication.QuorumAckChecker` decides the committed index
(Raft §5.4.2: only entries of the current term commit directly) and which
waiting appends succeed, time out (WAIT_QUORUM_ACK_TIMEOUT) or lose their term.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import ray
from rayledger.replication import QuorumAckChecker
from rayledger.storage import ResponseCode

from .config import LedgerConfig
from .member import now_ms

log = logging.getLogger("rayledger.actors")


@ray.remote(num_cpus=0, max_concurrency=100000)
class QuorumAckCheckerActor:
    def __init__(self, group: str, self_id: str, peers: list[str], config: LedgerConfig, member):
        self.group, self.self_id = group, self_id
        self.config = config
        self.core = QuorumAckChecker(group, self_id, list(peers), config.replication)
        self.member = member
        self.term = -1
        self._futures: dict[int, asyncio.Future] = {}
        self._tokens = itertools.count()
        self._ticker: asyncio.Task | None = None
        self._committed_sent = -1
        self._dispatchers: list = []
        self._notify_scheduled = False

    async def set_dispatchers(self, dispatchers: list) -> None:
        self._dispatchers = list(dispatchers)

    async def become_leader(self, term: int, term_start_index: int, info: dict) -> None:
        if self._ticker is None:
            self._ticker = asyncio.ensure_future(self._tick())
        self.term = term
        self._committed_sent = -1
        self._settle(
            self.core.become_leader(term, term_start_index, info["end"], info["committed"])
        )
        self.core.update_water_mark(term, self.self_id, info["end"])
        self._check()

    async def step_down(self, term: int) -> None:
        self.term = -1
        self._settle(self.core.step_down(term))

    async def report(self, term: int, peer: str, index: int) -> int | None:
        if term != self.term:
            return None
        self.core.update_water_mark(term, peer, index)
        self._check()
        return self.core.committed_index

    async def wait_commit(self, term: int, first: int, last: int) -> ResponseCode:
        if term != self.term:
            return ResponseCode.TERM_CHANGED
        token = next(self._tokens)
        fut = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        self.core.update_water_mark(term, self.self_id, last)
        self.core.add_pending(term, first, last, token, now_ms())
        self._check()
        return await fut

    def _check(self) -> None:
        committed, resolved = self.core.check(now_ms())
        if (
            committed is not None
            and committed > self._committed_sent
            and not self._notify_scheduled
        ):
            # coalesce: one notification per loop turn, however many reports advanced it
            self._notify_scheduled = True
            asyncio.get_running_loop().call_soon(self._notify_committed)
        self._settle(resolved)

    def _notify_committed(self) -> None:
        """Tell the member (its store) and the dispatchers (their COMMIT pushes) the new index."""
        self._notify_scheduled = False
        committed = self.core.committed_index
        if self.term < 0 or committed <= self._committed_sent:
            return
        self._committed_sent = committed
        self.member.on_committed.remote(self.term, committed)
        for d in self._dispatchers:
            d.on_committed.remote(self.term, committed)

    def _settle(self, resolved) -> None:
        for r in resolved:
            fut = self._futures.pop(r.token, None)
            if fut is not None and not fut.done():
                fut.set_result(r.code)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.config.maintain_interval_ms / 1000)
            if self.term >= 0:
                try:
                    self._check()
                except Exception:
                    log.exception("[%s] checker error term=%d", self.self_id, self.term)
