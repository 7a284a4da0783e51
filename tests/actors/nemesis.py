"""The seeded nemesis of the Ray chaos tests: every fault kind once in a shuffled order, then
random kinds.  Used by tests/actors/test_chaos.py and the RocketMQ chaos tests."""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field

from groupcheck import helper_pids
from rayledger.actors import LedgerGroup

KINDS = (
    "kill",  # SIGKILL a member's process; Ray restarts it from disk
    "pause",  # SIGSTOP, then SIGCONT: a long GC pause or a hung host
    "isolate",  # cut every link between one member and the others
    "one_way",  # one member cannot send to the others, but hears them
    "lossy",  # every link drops messages and adds delay
    "checker",  # SIGKILL the leader's checker actor
    "dispatcher",  # SIGKILL one of the leader's dispatcher actors
)


@dataclass
class Nemesis:
    """A seeded fault schedule: every kind once in a shuffled order, then random kinds."""

    g: LedgerGroup
    rng: random.Random
    done: list[str] = field(default_factory=list)  # what was applied, e.g. "kill n1"

    def schedule(self, steps: int) -> list[str]:
        first = list(KINDS)
        self.rng.shuffle(first)
        return (first + [self.rng.choice(KINDS) for _ in range(steps)])[: max(steps, len(KINDS))]

    def run(self, steps: int) -> None:
        for kind in self.schedule(steps):
            time.sleep(self.rng.uniform(0.3, 1.0))  # writes between faults
            getattr(self, kind)(self.rng.uniform(0.3, 1.5))

    def _victim(self) -> str:
        return self.rng.choice(self.g.members)

    def _helpers_of_leader(self) -> tuple[str, dict[str, int]]:
        leader = self.g.wait_for_leader(timeout_s=30)
        return leader, helper_pids(self.g, leader)

    def _sigkill(self, what: str, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone: Ray is restarting it
            pass
        self.done.append(what)

    def kill(self, _hold_s: float) -> None:
        m = self._victim()
        self.g.kill(m)
        self.done.append(f"kill {m}")

    def pause(self, hold_s: float) -> None:
        m = self._victim()
        self.g.pause(m)
        try:
            time.sleep(hold_s)  # part of the fault: how long the process stays frozen
        finally:
            self.g.resume(m)
        self.done.append(f"pause {m}")

    def isolate(self, hold_s: float) -> None:
        m = self._victim()
        self.g.partition({m}, set(self.g.members) - {m})
        time.sleep(hold_s)
        self.g.heal()
        self.done.append(f"isolate {m}")

    def one_way(self, hold_s: float) -> None:
        m = self._victim()
        self.g.partition({m}, set(self.g.members) - {m}, one_way=True)
        time.sleep(hold_s)
        self.g.heal()
        self.done.append(f"one_way {m}")

    def lossy(self, hold_s: float) -> None:
        drop, delay = self.rng.uniform(0.05, 0.3), self.rng.uniform(1, 20)
        self.g.set_link_faults(drop=drop, delay_ms=delay)
        time.sleep(hold_s)
        self.g.heal()
        self.done.append(f"lossy drop={drop:.2f} delay={delay:.0f}ms")

    def checker(self, _hold_s: float) -> None:
        leader, pids = self._helpers_of_leader()
        self._sigkill(f"checker {leader}", pids["checker"])

    def dispatcher(self, _hold_s: float) -> None:
        leader, pids = self._helpers_of_leader()
        key = self.rng.choice(sorted(k for k in pids if k.startswith("dispatcher")))
        self._sigkill(f"{key} of {leader}", pids[key])

    def kinds_done(self) -> set[str]:
        return {d.split()[0].split(":")[0] for d in self.done}
