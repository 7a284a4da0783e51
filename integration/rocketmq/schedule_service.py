"""The schedule service that delivers a commit log's delayed messages (RocketMQ's
ScheduleMessageService): a thin runner around schedule.py's decisions, in a small Ray actor.

Who runs it.  One detached actor per commit-log group (``num_cpus=0``, named
``<group>:schedule`` in the project's namespace), started by ``CommitLog.create`` and
ensured by ``CommitLog.connect``; Ray restarts it when its process dies.  RocketMQ runs the
service inside the master broker; here the members stay free of client work and of a clock
loop of their own, and the service is just another client of the group: it reads the level
offsets and parked messages from the leader and appends deliveries through an idempotent
LedgerClient, so a failover is, for it, a leader that moved.  It holds no state worth
keeping: the level offsets are in the ledger (one entry delivers a message and moves its
level on), so a killed service restarts where the group stands.  It stops on its own once
its group is gone (``CommitLog.shutdown`` also stops it).

Delivery is exactly once: a delivery names its level and schedule offset, and the leader
voids one whose level is already past it (``CommitLogMachine.pre_append``), so a retry after
an unknown outcome, a read of a lagging state, or a restarted service queues nothing twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import ray
from rayledger.actors import LedgerError, LedgerGroup
from rayledger.actors.naming import NAMESPACE, group_members

from .message import decode, encode, pulled_messages
from .schedule import SCHEDULE_TOPIC, Delivery, LevelPlan, plan_level, skip_command

logger = logging.getLogger("rayledger.integration.rocketmq.schedule")

POLL_S = 0.1  # RocketMQ's DELAY_FOR_A_WHILE: how often a level is looked at
_GONE_CHECKS = 3  # a group whose members are all gone this many looks in a row is deleted


def service_name(group: str) -> str:
    """The actor's name: not ``<group>/...``, which would make it a member of the group."""
    return f"{group}:schedule"


class ScheduleRunner:
    """One pass over a group's levels per ``tick``: read the level offsets (linearizable,
    so a delivery just acknowledged is seen applied), read the parked messages of levels
    with a backlog, ask :func:`plan_level`, append what it says.  A level whose next message
    is not due yet is not read again before its due time (unless its offset moved)."""

    def __init__(self, client: Any, batch: int = 64):
        self.client = client
        self.batch = batch
        self._wait: dict[int, tuple[int, int]] = {}  # level -> (offset, due at) not due yet
        self.delivered = 0

    def tick(self, now_ms: int) -> list[LevelPlan]:
        state = self.client.query(("schedule",), "linearizable")
        delays = state["delays"]
        plans = []
        for level, (offset, max_offset, _min) in sorted(state["levels"].items()):
            if offset >= max_offset:
                continue
            wait = self._wait.get(level)
            if wait is not None and wait[0] == offset and wait[1] > now_ms:
                continue
            plan = self._plan(level, delays[level - 1], offset, now_ms)
            self._put(plan)
            if plan.wake_at_ms is not None:
                self._wait[level] = (plan.next_offset, plan.wake_at_ms)
            plans.append(plan)
        return plans

    def _plan(self, level: int, delay_ms: int, offset: int, now_ms: int) -> LevelPlan:
        r = self.client.query(("pull", SCHEDULE_TOPIC, level - 1, offset, self.batch), "committed")
        pulled = pulled_messages(r["data"], r["bounds"], r["first_offset"])
        parked = [(m.queue_offset, decode(m.record, verify=False)) for m in pulled]
        gone = r["next_offset"] if r.get("status") == "OFFSET_TOO_SMALL" else None
        return plan_level(level, delay_ms, offset, parked, now_ms, gone)

    def _put(self, plan: LevelPlan) -> None:
        if not plan.puts:
            return
        bodies = []
        for p in plan.puts:
            if isinstance(p, Delivery):
                bodies.append(encode(p.message))
            else:
                logger.warning("level %d: passing over parked messages %d..%d (%s)",
                               p.level, p.start, p.stop - 1, p.why)  # fmt: skip
                bodies.append(skip_command(p.level, p.start, p.stop))
        self.client.append_batch(bodies)
        self.delivered += sum(isinstance(p, Delivery) for p in plan.puts)


@ray.remote
class ScheduleServiceActor:
    """The runner on a thread of its own (started with the actor, so also after Ray
    restarts it); its methods only report and stop."""

    def __init__(self, group: str, poll_s: float = POLL_S):
        self.group = group
        self.poll_s = poll_s
        self.runner: ScheduleRunner | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="schedule", daemon=True)
        self._thread.start()

    def status(self) -> dict:
        runner = self.runner
        return {"group": self.group, "pid": os.getpid(), "errors": self.errors,
                "delivered": runner.delivered if runner else 0}  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        gone = 0
        while not self._stop.is_set():
            try:
                if self.runner is None:
                    self.runner = ScheduleRunner(LedgerGroup.get(self.group).client(timeout_s=10))
                self.runner.tick(int(time.time() * 1000))
                gone = 0
            except Exception as exc:  # a failover, a restarting member, a deleted group
                self.errors += 1
                self.runner = None  # a new client: the members may have changed
                gone = gone + 1 if not group_members(self.group) else 0
                if gone >= _GONE_CHECKS:
                    logger.warning("group %s is gone: its schedule service stops", self.group)
                    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                    return
                level = logging.INFO if isinstance(exc, LedgerError) else logging.WARNING
                logger.log(level, "schedule service of %s: %r", self.group, exc)
                self._stop.wait(min(1.0, self.poll_s * 5))
                continue
            self._stop.wait(self.poll_s)


def ensure_service(group: str, poll_s: float = POLL_S):
    """The group's schedule service, started unless it runs."""
    return ScheduleServiceActor.options(
        name=service_name(group), namespace=NAMESPACE, get_if_exists=True,
        lifetime="detached", num_cpus=0, max_restarts=-1,
    ).remote(group, poll_s)  # fmt: skip


def stop_service(group: str) -> None:
    """Stop the group's schedule service, if it runs."""
    try:
        h = ray.get_actor(service_name(group), namespace=NAMESPACE)
    except ValueError:
        return
    try:
        ray.get(h.stop.remote(), timeout=15)
    except Exception as exc:
        logger.info("schedule service of %s did not stop cleanly: %r", group, exc)
    ray.kill(h, no_restart=True)
