"""What the member's sans-I/O core costs per append, without Ray (``rayledger bench core``).

A one-member group's :class:`~rayledger.actors.core.member.MemberCore` over a memory store
is stepped as its transport steps it -- a client append, the round written at the end of
the turn, the round's actions answered (announce, register), its resolution -- so the
figure is the decisions' own CPU per append cycle, to set beside an append's
milliseconds of Ray hops (``bench group``)."""

from __future__ import annotations

import random
import time

from rayledger.actors.core import member as mc
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.replication.checker import Resolution
from rayledger.storage import MemoryStore, ResponseCode, StoreConfig


def _leader() -> mc.MemberCore:
    """A one-member group's core, elected by its own ticks and in office."""
    logic = MemberLogic("bench", "n0", ["n0"], MemoryStore(StoreConfig()), ElectionConfig(),
                        ReplicationConfig(), MemoryTermStore(), rng=random.Random(1))  # fmt: skip
    core = mc.MemberCore(logic, rpc_timeout_ms=1000)
    runs: list[mc.Run] = []
    now = 0
    while logic.ready_term < 0:
        now += 10
        runs += core.step(mc.Tick(), now).run
        while runs:  # the helpers answer at once (a one-member group has only a checker)
            run = runs.pop(0)
            if run.kind != "watch":
                value = {} if isinstance(run.action, sv.Ping) else None
                runs += core.step(mc.ProcessAnswered(run.pid, value), now).run
        if now > 60_000:
            raise RuntimeError("the one-member group did not take office")
    return core


def run_core_bench(cycles: int = 50_000, body_bytes: int = 100) -> dict:
    core = _leader()
    term = core.logic.state.current_term
    body = b"x" * body_bytes
    t0 = time.perf_counter()
    for i in range(cycles):
        core.step(mc.ClientAppend([body], "bench", None, i), 0)
        out = core.step(mc.WriteRound(), 0)
        rid = out.written.rid
        run = out.run[0]
        while run is not None:  # announce, then register
            nxt = core.step(mc.ProcessAnswered(run.pid, None), 0).run
            run = nxt[0] if nxt else None
        core.step(mc.RoundsResolved(Resolution(term, None, [(rid, ResponseCode.SUCCESS)])), 0)
    dt = time.perf_counter() - t0
    return {
        "cycles": cycles,
        "body_bytes": body_bytes,
        "append_cycle_us": round(dt / cycles * 1e6, 1),
        "steps_per_cycle": 5,
    }
