"""A Ray job entry point: an append-and-read workload against a named group.

.. code-block:: console

    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m rayledger.integration.cli.job --group orders --create --entries 2000

It attaches to the group by name (``--create`` starts it when missing), appends
``--entries`` unique bodies in batches from ``--clients`` threads, reads every
acknowledged index back (through the client, and with ``--read dataset`` also
through the Ray Data reader of the committed log, or ``--read spark`` through
RayDP), and prints one JSON object.  The exit status is 0 only when every
acknowledged body was read back unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

log = logging.getLogger("rayledger.integration")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rayledger.integration.cli.job", description=__doc__.split("\n")[0]
    )
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--create", action="store_true", help="start the group when it is not running")
    p.add_argument("--members", type=int, default=3, help="with --create: how many members")
    p.add_argument(
        "--store-dir", default=None, help="with --create: file store root (default: memory store)"
    )
    p.add_argument("--fast", action="store_true", help="with --create: short election timers")
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--body-size", type=int, default=64)
    p.add_argument("--read", choices=["client", "dataset", "spark"], default="client")
    p.add_argument(
        "--shutdown", action="store_true", help="stop the group (and delete its data) at the end"
    )
    p.add_argument("--address", default=None, help="Ray address (default: the job's cluster)")
    p.add_argument("--timeout", type=float, default=60.0)
    return p


def _group(args):
    import ray
    from rayledger.actors import LedgerConfig, LedgerGroup
    from rayledger.actors.group import group_members

    if group_members(args.group):
        return LedgerGroup.get(args.group), False
    if not args.create:
        raise LedgerError.of(
            ResponseCode.UNKNOWN_GROUP, f"no group named {args.group!r} (pass --create)"
        )
    config = LedgerConfig.fast() if args.fast else LedgerConfig()
    try:
        group = LedgerGroup.create(
            args.group, args.members, store_dir=args.store_dir, config=config
        )
    except LedgerError:
        if group_members(args.group):  # another job created it meanwhile
            return LedgerGroup.get(args.group), False
        raise
    log.info("created group %s on %d nodes", args.group, len(ray.nodes()))
    return group, True


@dataclass
class _Appended:
    """What the job's client threads got back."""

    acked: dict[int, bytes] = field(default_factory=dict)
    unknown: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _append(group, args, tag: str) -> tuple[_Appended, float]:
    """``args.entries`` bodies in batches from ``args.clients`` threads; returns (outcome, seconds)."""
    pad = max(0, args.body_size)

    def body(i: int) -> bytes:
        b = f"job-{tag}-{i:09d}|".encode()
        return b + b"#" * max(0, pad - len(b))

    it = iter(range(0, args.entries, args.batch))
    out = _Appended()

    def worker() -> None:
        client = group.client(timeout_s=args.timeout)
        while True:
            with out.lock:
                a = next(it, None)
            if a is None:
                return
            bodies = [body(i) for i in range(a, min(args.entries, a + args.batch))]
            try:
                results = client.append_batch(bodies)
            except OutcomeUnknownError:
                with out.lock:
                    out.unknown += len(bodies)
                continue
            except LedgerError as exc:
                with out.lock:
                    out.errors.append(str(exc))
                continue
            with out.lock:
                for r, b in zip(results, bodies, strict=True):
                    out.acked[r.index] = b

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, args.clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.monotonic() - t0


def _read_back(client, acked: dict[int, bytes]) -> dict[int, bytes]:
    """The committed bodies over the acked range, through the client."""
    got: dict[int, bytes] = {}
    if acked:
        lo, hi = min(acked), max(acked) + 1
        for a in range(lo, hi, 5000):
            for e in client.read(a, min(hi, a + 5000)):
                got[e.index] = e.body
    return got


def _read_with(args, acked: dict[int, bytes]) -> dict[str, int]:
    """Read the acked range again through Ray Data or Spark and count mismatches."""
    from ..spark import committed_dataset, committed_read, init_spark, spark_running, stop_spark

    lo, hi = min(acked), max(acked) + 1
    if args.read == "dataset":
        read = committed_dataset(args.group, lo, hi)
        rows = read.dataset.take_all() if read.dataset is not None else []
    else:
        own_spark = not spark_running()
        spark = init_spark(f"rayledger-job-{args.group}")
        try:
            rows = committed_read(spark, args.group, lo, hi)[0].collect()
        finally:
            if own_spark:
                stop_spark()
    got = {int(r["index"]): bytes(r["body"]) for r in rows}
    return {
        "reader_rows": len(got),
        "reader_mismatched": sum(1 for i, b in acked.items() if got.get(i) != b),
    }


def run(args) -> dict[str, Any]:
    from ..connect import connect

    connect(args.address or os.environ.get("RAY_ADDRESS"))
    t0 = time.monotonic()
    group, created = _group(args)
    leader = group.wait_for_leader(timeout_s=args.timeout)
    out, append_s = _append(group, args, uuid.uuid4().hex[:8])
    acked = out.acked
    client = group.client(timeout_s=args.timeout)
    read_back = _read_back(client, acked)
    mismatched = [i for i, b in acked.items() if read_back.get(i) != b]
    result: dict[str, Any] = {
        "group": args.group,
        "created": created,
        "members": group.members,
        "leader": leader,
        "requested": args.entries,
        "acked": len(acked),
        "unknown": out.unknown,
        "errors": out.errors[:5],
        "first_index": min(acked) if acked else None,
        "last_index": max(acked) if acked else None,
        "committed_index": client.committed_index(),
        "read_back": len(read_back),
        "mismatched": len(mismatched),
        "append_s": round(append_s, 3),
        "append_per_s": round(len(acked) / append_s) if append_s > 0 else 0,
        "read_via": args.read,
    }
    if args.read in ("dataset", "spark") and acked:
        result.update(_read_with(args, acked))
    result["ok"] = (
        bool(acked)
        and not mismatched
        and len(acked) + out.unknown <= args.entries
        and result.get("reader_mismatched", 0) == 0
        and not out.errors
    )
    if args.shutdown:
        group.shutdown(delete_data=True)
        result["shutdown"] = True
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=os.environ.get("RAYLEDGER_LOG_LEVEL", "WARNING"))
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except LedgerError as exc:
        print(json.dumps({"group": args.group, "ok": False, "error": str(exc)}))
        return 2
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
