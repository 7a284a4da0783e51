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

import json
import time

from rayledger.election import MemberState, MemoryTermStore
from rayledger.replication import (
    EntryDispatcher,
    EntryHandler,
    QuorumAckChecker,
    ReplicationConfig,
    check_append,
)
from rayledger.storage import MemoryStore, ResponseCode, StoreConfig

GROUP = "bench"
IDS = ("n0", "n1", "n2")


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
    cfg = config or ReplicationConfig()
    store_cfg = StoreConfig(data_segment_size=256 * 1024 * 1024)
    term = 1
    now = 0

    leader_state = MemberState(GROUP, IDS[0], IDS, MemoryTermStore(term=term))
    leader_state.change_to_leader(term)
    leader = MemoryStore(store_cfg)
    checker = QuorumAckChecker(GROUP, IDS[0], list(IDS), cfg)
    dispatchers = {p: EntryDispatcher(GROUP, IDS[0], p, cfg) for p in IDS[1:]}
    handlers = {}
    followers = {}
    for p in IDS[1:]:
        st = MemberState(GROUP, p, IDS, MemoryTermStore(term=term))
        st.change_to_follower(term, IDS[0])
        followers[p] = MemoryStore(store_cfg)
        handlers[p] = EntryHandler(GROUP, p, st, followers[p], cfg)

    body = b"x" * body_size
    bodies = [body] * batch
    resolved_ok = 0
    pushes = 0

    def pump() -> None:
        nonlocal resolved_ok, pushes
        for peer, d in dispatchers.items():
            handler = handlers[peer]
            for req in d.next_requests(now, leader):
                pushes += 1
                for tok, resp in handler.handle_push(req, req, now):
                    d.on_response(tok, resp, now)
            checker.update_water_mark(term, peer, d.water_mark)
        checker.update_water_mark(term, IDS[0], leader.ledger_end_index)
        committed, resolved = checker.check(now)
        if committed is not None:
            leader.update_committed_index(committed)
        for r in resolved:
            if r.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"append {r.first_index}..{r.last_index} failed: {r.code.name}")
            resolved_ok += r.last_index - r.first_index + 1

    t0 = time.perf_counter()
    c0 = time.process_time()
    # election: the leader's empty entry, COMPARE/TRUNCATE with the empty followers
    first = leader.append_as_leader([b""], term).first_index
    checker.become_leader(term, first, leader.ledger_end_index)
    for d in dispatchers.values():
        d.check_and_fresh_state(term, IDS[0], True)
    for _ in range(4):
        pump()
    written = 0
    pending = 0
    while written < entries:
        n = min(batch, entries - written)
        chunk = bodies if n == batch else bodies[:n]
        check_append(leader_state, GROUP, IDS[0], chunk, checker.pending_count, cfg, False)
        a = leader.append_as_leader(chunk, term)
        leader_state.update_ledger(leader.ledger_end_index, term)
        checker.add_pending(term, a.first_index, a.last_index, None, now)
        written += n
        pending += 1
        if pending >= in_flight:
            pump()
            pending = 0
    while resolved_ok < entries:
        before = resolved_ok
        pump()
        if resolved_ok == before and all(d.pending_pushes == 0 for d in dispatchers.values()):
            raise RuntimeError(f"replication stalled at {resolved_ok} of {entries} entries")
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0

    end = leader.ledger_end_index
    for p, f in followers.items():
        if (
            f.ledger_end_index != end
            or f.read_batch(end - 10).data != leader.read_batch(end - 10).data
        ):
            raise RuntimeError(f"follower {p} does not match the leader")
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
        "pushes": pushes,
        "committed_index": leader.committed_index,
        "follower_committed": {p: f.committed_index for p, f in followers.items()},
    }


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--body-size", type=int, default=128)
    args = ap.parse_args()
    print(json.dumps(run_replication_bench(args.entries, args.batch, args.body_size), indent=2))
