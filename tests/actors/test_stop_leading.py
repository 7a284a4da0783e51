"""Issue 20 item 4 (review c4_zombie), without Ray: a member whose checker never answers (a
SIGSTOPped process) must still finish stopping its term, so that when it leads again it
takes office.  On 24eedd2 ``_stop_leading`` awaited ``checker.step_down`` with no timeout
while holding ``_role_lock``: re-elected, the member never ran ``leadership()`` and refused
every append with LEADER_NOT_READY while its heartbeats kept the others from campaigning.
The Ray version is in test_safety_review.py."""

from __future__ import annotations

import asyncio
import threading
import types

from rayledger.actors.config import LedgerConfig
from rayledger.actors.logic import MemberLogic, StartLeading
from rayledger.actors.member_leadership import LeadershipMixin
from rayledger.actors.reads import ReadIndexLogic
from rayledger.actors.rounds import RoundBook
from rayledger.election import MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.storage import MemoryStore, StoreConfig

PEERS = ["n0", "n1", "n2"]


class _Shell(LeadershipMixin):
    """The leadership part of the member actor, with helpers that never answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._init_leadership()
        self.config = LedgerConfig.fast()
        store = MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 << 10))
        self.logic = MemberLogic("g", "n0", PEERS, store, self.config.election,
                                 ReplicationConfig(), MemoryTermStore(term=3))  # fmt: skip
        self.self_id, self.peers, self.store = "n0", PEERS, store
        self._lock, self._role_lock = threading.Lock(), asyncio.Lock()
        self._machine_runner, self._fast, self._sync = None, None, False
        self._book = RoundBook(self.logic)
        self._loop = loop
        self.reads = ReadIndexLogic("n0", PEERS, 1000, 1000)
        hung = types.SimpleNamespace(remote=lambda *a: loop.create_future())  # never answers
        self._checker = types.SimpleNamespace(step_down=hung)
        self._dispatchers = {p: types.SimpleNamespace(deactivate=hung) for p in PEERS[1:]}
        self.started: list[int] = []

    async def _start_leading(self, change: StartLeading) -> None:
        self.started.append(change.term)

    def _finish(self, resolved) -> None:
        pass

    def _not_leader(self):
        return RuntimeError("not leader")


def test_a_hung_checker_does_not_keep_the_member_from_leading_again() -> None:
    async def main() -> None:
        shell = _Shell(asyncio.get_running_loop())
        m = shell.logic
        m.state.change_to_leader(3)
        m.leadership()  # led term 3 with these helpers
        m.mark_ready(3)
        m.elector._change_role_to_candidate(4, 0)  # deposed
        rpc_s = shell.config.rpc_timeout_ms / 1000
        await asyncio.wait_for(shell._sync_role(), 2 * rpc_s + 1)  # bounded, whatever helpers do
        assert not shell._role_lock.locked()
        while m.state.current_term < 5:
            m.state.next_term()
        m.elector._change_role_to_leader(5, 1000)  # elected again
        await asyncio.wait_for(shell._sync_role(), 1)
        assert shell.started == [5] and m.leading_term == 5

    asyncio.run(main())
