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


def run(args) -> dict[str, Any]:
    import ray

    if not ray.is_initialized():
        ray.init(
            address=args.address or os.environ.get("RAY_ADDRESS") or "auto",
            namespace="rayledger",
            log_to_driver=False,
            configure_logging=False,
        )
    t0 = time.monotonic()
    group, created = _group(args)
    leader = group.wait_for_leader(timeout_s=args.timeout)
    tag = uuid.uuid4().hex[:8]
    pad = max(0, args.body_size)

    def body(i: int) -> bytes:
        b = f"job-{tag}-{i:09d}|".encode()
        return b + b"#" * max(0, pad - len(b))

    starts = list(range(0, args.entries, args.batch))
    it = iter(starts)
    lock = threading.Lock()
    acked: dict[int, bytes] = {}
    unknown = 0
    errors: list[str] = []

    def worker() -> None:
        nonlocal unknown
        client = group.client(timeout_s=args.timeout)
        while True:
            with lock:
                a = next(it, None)
            if a is None:
                return
            bodies = [body(i) for i in range(a, min(args.entries, a + args.batch))]
            try:
                results = client.append_batch(bodies)
            except OutcomeUnknownError:
                with lock:
                    unknown += len(bodies)
                continue
            except LedgerError as exc:
                with lock:
                    errors.append(str(exc))
                continue
            with lock:
                for r, b in zip(results, bodies, strict=True):
                    acked[r.index] = b

    t_append = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, args.clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    append_s = time.monotonic() - t_append

    client = group.client(timeout_s=args.timeout)
    read_back: dict[int, bytes] = {}
    if acked:
        lo, hi = min(acked), max(acked) + 1
        a = lo
        while a < hi:
            for e in client.read(a, min(hi, a + 5000)):
                read_back[e.index] = e.body
            a += 5000
    mismatched = [i for i, b in acked.items() if read_back.get(i) != b]
    result: dict[str, Any] = {
        "group": args.group,
        "created": created,
        "members": group.members,
        "leader": leader,
        "requested": args.entries,
        "acked": len(acked),
        "unknown": unknown,
        "errors": errors[:5],
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
        result["reader_rows"] = len(got)
        result["reader_mismatched"] = sum(1 for i, b in acked.items() if got.get(i) != b)
    result["ok"] = (
        bool(acked)
        and not mismatched
        and len(acked) + unknown <= args.entries
        and result.get("reader_mismatched", 0) == 0
        and not errors
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
