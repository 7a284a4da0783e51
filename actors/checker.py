"""QuorumAckCheckerActor: the Ray transport of the leader's
:class:`~rayledger.replication.checker.CheckerLogic`.

The leader registers every round it stores (:meth:`add_round`); dispatchers report their followers'
water marks (:meth:`report`); a compiled graph reports both at once (:meth:`cg_report`, on the
graph's thread).  The core decides everything -- the committed index (Raft section 5.4.2: only
entries of the current term commit directly), which rounds succeed, time out
(WAIT_QUORUM_ACK_TIMEOUT) or lose their term, when the dispatchers hear of a commit -- and
:class:`~rayledger.replication.checker.CheckerDriver` carries its answers out: to the leader as one
:meth:`MemberActor.on_resolved` call per loop turn, to the dispatchers as ``on_committed``.  This
actor only makes those Ray calls.

A threaded actor (:mod:`.threadloop` says why): one Ray thread takes the calls in the order
they were sent and delivers them under the driver's lock; the driver's loop runs on a thread
of its own.
"""

from __future__ import annotations

import os
import threading

import ray
from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.pump import CheckerDriver
from rayledger.actors.threadloop import ThreadLoop
from rayledger.actors.wire import pack_resolution
from rayledger.replication.checker import (
    AddRound,
    BecomeLeader,
    CheckerLogic,
    Configure,
    GraphBegin,
    GraphEnd,
    GraphReport,
    LeadershipEnded,
    Report,
    Resolution,
)
from rayledger.replication.messages import LeaderInfo
from rayledger.storage import LedgerError, ResponseCode


class _CheckerRayPorts:
    """The checker's messages as Ray actor calls."""

    def __init__(self, member):
        self.member = member
        self.dispatchers: list = []

    def resolved(self, r: Resolution) -> None:
        self.member.on_resolved.remote(pack_resolution(r))

    def notice(self, term: int, committed: int) -> None:
        for d in self.dispatchers:
            d.on_committed.remote(term, committed)


@ray.remote(num_cpus=0, max_concurrency=1)
class QuorumAckCheckerActor:
    def __init__(self, group: str, self_id: str, peers: list[str], config: LedgerConfig, member):
        self.group, self.self_id = group, self_id
        self.ports = _CheckerRayPorts(member)
        self.driver = CheckerDriver(
            CheckerLogic(group, self_id, list(peers), config.replication),
            self.ports,
            lock=threading.Lock(),  # the loop's and a compiled graph's threads deliver too
            guard=threading.RLock(),
        )
        self.driver.attach(ThreadLoop(f"rayledger-checker-{group}"))
        self.logic = self.driver.logic
        restarted = ray.get_runtime_context().was_current_actor_reconstructed  # set me up again
        member.helper_started.remote("checker", None, os.getpid(), restarted)

    def pid(self) -> int:
        return os.getpid()

    def set_dispatchers(self, dispatchers: list) -> None:
        """The member's dispatchers: told when the committed index moves, for their COMMITs."""
        self.ports.dispatchers = list(dispatchers)

    def become_leader(self, term: int, term_start_index: int, info: LeaderInfo) -> list:
        return self.driver.deliver(BecomeLeader(term, term_start_index, info))

    def configure(self, term: int, info: LeaderInfo) -> bool:
        """The leader of ``term`` acts on a new configuration."""
        return self.driver.deliver(Configure(term, info))

    def step_down(self, term: int) -> list:
        """Leadership ended: the rounds still waiting are answered to the caller."""
        return self.driver.deliver(LeadershipEnded(term))

    @ray.method(enable_task_events=False)
    def add_round(self, r: list) -> None:
        """A round waits for its quorum: ``[term, first, last, token, leader_mark, config]``
        in one argument (one to serialize, a list: see :mod:`~rayledger.actors.wire`);
        ``leader_mark`` is how far the leader counts its own copy (see
        :meth:`MemberLogic.water_mark`), ``config`` the ``[index, Configuration]`` the round
        holds, counted from now on."""
        term, first, last, token, mark, config = r
        self.driver.deliver(
            AddRound(term, first, last, token, mark, None if config is None else tuple(config))
        )

    @ray.method(enable_task_events=False)
    def report(self, term: int, peer: str, water_mark: int) -> int | None:
        """A follower stores the leader's log up to ``water_mark``; returns the committed
        index of ``term`` (None when this checker does not serve that term)."""
        return self.driver.deliver(Report(term, peer, water_mark))

    # -- the compiled path (see fastpath.py); cg_report runs on the graph's thread -----------
    def cg_begin(self, term: int, gen: int) -> None:
        if not self.driver.deliver(GraphBegin(term, gen)):
            raise LedgerError.of(
                ResponseCode.TERM_CHANGED, f"checker serves term {self.logic.term}"
            )

    def cg_end(self, gen: int) -> None:
        self.driver.deliver(GraphEnd(gen))

    def cg_report(self, ack):
        """A follower's water mark and the rounds of its execution, from the graph."""
        return self.driver.deliver(GraphReport(ack))
