"""Replication throughput of the protocol cores, without a network.

A 3-member group in one process: the leader's store, checker and two
dispatchers, and two followers' entry handlers and stores (MemoryStore), wired
directly to each other (a push is answered by a function call).  What this
measures is the cost of the replication path itself -- admission, the leader's
append, batch reads, the followers' verification and writes, the quorum check --
so it bounds what the Ray shells can reach.  ``rayledger bench replication
--json`` runs it.
"""

from __future__ import annotations

import time

from rayledger.election import MemberState, MemoryTermStore
from rayledger.replication import (
    EntryDispatcher,
    EntryHandler,
    QuorumAckChecker,
    ReplicationConfig,
    check_append,
)
from rayledger.replication.checker import AwaitQuorum, CheckQuorum, LeadTerm, MarkStored
from rayledger.replication.messages import Push
from rayledger.replication.push import FollowerAnswer, FreshState, NextPushes
from rayledger.storage import MemoryStore, ResponseCode, StoreConfig

GROUP = "bench"
IDS = ("n0", "n1", "n2")


class _Bench:
    """The leader's cores and two followers wired by function calls; one method per step."""

    def __init__(self, cfg: ReplicationConfig, term: int = 1) -> None:
        store_cfg = StoreConfig(data_segment_size=256 * 1024 * 1024)
        self.cfg = cfg
        self.term = term
        self.now = 0
        self.leader_state = MemberState(GROUP, IDS[0], IDS, MemoryTermStore(term=term))
        self.leader_state.change_to_leader(term)
        self.leader = MemoryStore(store_cfg)
        self.leader_state.attach_log(self.leader)
        self.checker = QuorumAckChecker(GROUP, IDS[0], list(IDS), cfg)
        self.dispatchers = {p: EntryDispatcher(GROUP, IDS[0], p, cfg) for p in IDS[1:]}
        self.handlers: dict[str, EntryHandler] = {}
        self.followers: dict[str, MemoryStore] = {}
        for p in IDS[1:]:
            st = MemberState(GROUP, p, IDS, MemoryTermStore(term=term))
            st.change_to_follower(term, IDS[0])
            self.followers[p] = MemoryStore(store_cfg)
            self.handlers[p] = EntryHandler(GROUP, p, st, self.followers[p], cfg)
        self.resolved_ok = 0
        self.pushes = 0

    def pump(self) -> None:
        """One round: every dispatcher pushes, every follower answers, the checker commits."""
        for peer, d in self.dispatchers.items():
            handler = self.handlers[peer]
            for req in d.step(NextPushes(self.leader), self.now):
                self.pushes += 1
                for tok, resp in handler.step(Push(req, req), self.now):
                    d.step(FollowerAnswer(tok, resp), self.now)
            self.checker.step(MarkStored(self.term, peer, d.water_mark), 0)
        self.checker.step(MarkStored(self.term, IDS[0], self.leader.ledger_end_index), 0)
        committed, resolved = self.checker.step(CheckQuorum(), self.now)
        if committed is not None:
            self.leader.update_committed_index(committed)
        for r in resolved:
            if r.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"append {r.first_index}..{r.last_index} failed: {r.code.name}")
            self.resolved_ok += r.last_index - r.first_index + 1

    def elect(self) -> None:
        """The leader's empty entry, COMPARE/TRUNCATE with the empty followers."""
        first = self.leader.append_as_leader([b""], self.term).first_index
        self.checker.step(LeadTerm(self.term, first, self.leader.ledger_end_index), 0)
        for d in self.dispatchers.values():
            d.step(FreshState(self.term, IDS[0], True), 0)
        for _ in range(4):
            self.pump()

    def write(self, entries: int, bodies: list[bytes], in_flight: int) -> None:
        """Admit and append ``entries`` in batches, pumping every ``in_flight`` batches."""
        batch = len(bodies)
        written = pending = 0
        while written < entries:
            n = min(batch, entries - written)
            chunk = bodies if n == batch else bodies[:n]
            check_append(
                self.leader_state, GROUP, IDS[0], chunk, self.checker.pending_count, self.cfg
            )
            a = self.leader.append_as_leader(chunk, self.term)
            self.checker.step(AwaitQuorum(self.term, a.first_index, a.last_index, None), self.now)
            written += n
            pending += 1
            if pending >= in_flight:
                self.pump()
                pending = 0

    def drain(self, entries: int) -> None:
        """Pump until every append resolved; a round without progress is a stall."""
        while self.resolved_ok < entries:
            before = self.resolved_ok
            self.pump()
            idle = all(d.pending_pushes == 0 for d in self.dispatchers.values())
            if self.resolved_ok == before and idle:
                raise RuntimeError(
                    f"replication stalled at {self.resolved_ok} of {entries} entries"
                )

    def verify(self) -> None:
        end = self.leader.ledger_end_index
        tail = self.leader.read_batch(end - 10).data
        for p, f in self.followers.items():
            if f.ledger_end_index != end or f.read_batch(end - 10).data != tail:
                raise RuntimeError(f"follower {p} does not match the leader")


def run_replication_bench(
    entries: int = 200_000,
    batch: int = 1000,
    body_size: int = 128,
    *,
    config: ReplicationConfig | None = None,
    in_flight: int = 4,
) -> dict:
    """Append ``entries`` bodies of ``body_size`` bytes in batches of ``batch`` and
    replicate them to two followers; returns throughput and what was checked.

    ``in_flight`` batches are appended before the first is pushed, as concurrent
    clients would; every batch must commit (SUCCESS) for the run to count.
    """
    if entries <= 0 or batch <= 0 or body_size < 0:
        raise ValueError("entries and batch must be positive, body_size non-negative")
    b = _Bench(config or ReplicationConfig())
    t0 = time.perf_counter()
    c0 = time.process_time()
    b.elect()
    b.write(entries, [b"x" * body_size] * batch, in_flight)
    b.drain(entries)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    b.verify()
    return {
        "entries": entries,
        "batch": batch,
        "body_size": body_size,
        "members": len(IDS),
        "seconds": round(elapsed, 4),
        "entries_per_s": round(entries / elapsed),
        "cpu_seconds": round(cpu, 4),
        "entries_per_cpu_s": round(entries / cpu) if cpu > 0 else None,  # steadier on a busy host
        "mb_per_s": round(entries * body_size / elapsed / 1e6, 2),
        "pushes": b.pushes,
        "committed_index": b.leader.committed_index,
        "follower_committed": {p: f.committed_index for p, f in b.followers.items()},
    }
