"""The ``rayledger`` command line (also ``python -m rayledger.integration.cli``).

Every subcommand prints one clear line on error and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from rayledger.storage import LedgerError

from ..connect import connect


def _status_table(group) -> list[dict]:
    rows = []
    for m, s in group.status().items():
        rows.append(
            {
                "member": m,
                "alive": s.alive,
                "role": s.role.value if s.role else None,
                "term": s.term,
                "leader": s.leader_id,
                "begin": s.ledger_begin_index,
                "end": s.ledger_end_index,
                "committed": s.committed_index,
            }
        )
    return rows


def cmd_start(args) -> int:
    from rayledger.actors import LedgerConfig, LedgerGroup

    connect(args.address)
    config = LedgerConfig.fast() if args.fast else LedgerConfig()
    members = args.members.split(",") if "," in args.members else int(args.members)
    group = LedgerGroup.create(args.group, members, store_dir=args.store_dir, config=config)
    leader = group.wait_for_leader(timeout_s=args.timeout)
    print(json.dumps({"group": args.group, "members": group.members, "leader": leader}))
    return 0


def cmd_status(args) -> int:
    from rayledger.actors import LedgerGroup

    connect(args.address)
    rows = _status_table(LedgerGroup.get(args.group))
    if args.json:
        print(json.dumps(rows))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"group {args.group}")
        for col in rows[0]:
            table.add_column(col)
        for r in rows:
            table.add_row(*(str(v) for v in r.values()))
        Console().print(table)
    return 0


def cmd_append(args) -> int:
    from rayledger.actors import LedgerClient

    connect(args.address)
    bodies = [b.encode() for b in args.bodies]
    if args.file:
        with open(args.file, "rb") as f:
            bodies.append(f.read())
    client = LedgerClient.connect(args.group, timeout_s=args.timeout)
    results = client.append_batch(bodies)
    for r in results:
        print(json.dumps({"index": r.index, "term": r.term, "pos": r.pos}))
    return 0


def cmd_get(args) -> int:
    from rayledger.actors import LedgerClient

    connect(args.address)
    client = LedgerClient.connect(args.group, timeout_s=args.timeout)
    entries = client.read(args.index, args.index + args.count)
    if not entries:
        print(f"error: no committed entry at {args.index}", file=sys.stderr)
        return 1
    for e in entries:
        body = e.body.decode("utf-8", "backslashreplace")
        print(json.dumps({"index": e.index, "term": e.term, "pos": e.pos, "body": body}))
    return 0


def cmd_transfer(args) -> int:
    from rayledger.actors import LedgerGroup

    connect(args.address)
    group = LedgerGroup.get(args.group)
    leader = group.transfer_leadership(args.member, timeout_s=args.timeout)
    print(json.dumps({"group": args.group, "leader": leader}))
    return 0


def cmd_export(args) -> int:
    from ..spark.export import export_main

    return export_main(args)


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_bench(args) -> int:
    from .. import bench

    result = bench.run(args.which, args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rayledger", description="DLedger's replicated commitlog on Ray"
    )
    sub = p.add_subparsers(dest="command", required=True)

    def with_group(sp, timeout: float = 30.0):
        sp.add_argument("--group", "-g", required=True, help="group name")
        sp.add_argument(
            "--address", default=None, help="Ray address (default: the running cluster)"
        )
        sp.add_argument("--timeout", type=float, default=timeout, help="seconds to wait")
        return sp

    demo = sub.add_parser(
        "demo", help="the main job: failover, checks and a Spark aggregation on a local Ray"
    )
    demo.add_argument("--entries", type=int, default=100_000)
    demo.add_argument("--clients", type=int, default=4)
    demo.add_argument("--batch", type=int, default=200, help="entries per append batch")
    demo.add_argument(
        "--data-dir", default=None, help="where the group keeps its files (default: a temp dir)"
    )
    demo.add_argument("--address", default=None, help="use this Ray cluster instead of a local one")
    demo.add_argument("--no-spark", action="store_true", help="skip the Spark step")
    demo.add_argument("--keep", action="store_true", help="keep the data directory")
    demo.set_defaults(func=cmd_demo)

    st = with_group(sub.add_parser("start", help="start a group on the running Ray cluster"))
    st.add_argument("--members", default="3", help="a count or comma-separated member ids")
    st.add_argument("--store-dir", default=None, help="file store root (default: memory store)")
    st.add_argument("--fast", action="store_true", help="short election timers (heartbeat 100 ms)")
    st.set_defaults(func=cmd_start)

    ss = with_group(sub.add_parser("status", help="each member's role, term and indexes"))
    ss.add_argument("--json", action="store_true")
    ss.set_defaults(func=cmd_status)

    ap = with_group(
        sub.add_parser("append", help="append entries (one per argument) and wait for commit")
    )
    ap.add_argument("bodies", nargs="*", help="entry bodies (UTF-8)")
    ap.add_argument("--file", help="also append this file's bytes as one entry")
    ap.set_defaults(func=cmd_append)

    gt = with_group(sub.add_parser("get", help="read committed entries"))
    gt.add_argument("index", type=int)
    gt.add_argument("--count", type=int, default=1)
    gt.set_defaults(func=cmd_get)

    tr = with_group(sub.add_parser("transfer", help="move leadership to a member"))
    tr.add_argument("member")
    tr.set_defaults(func=cmd_transfer)

    ex = with_group(sub.add_parser("export", help="committed entries to Parquet through Spark"))
    ex.add_argument("--out", required=True, help="output directory")
    ex.add_argument(
        "--from", dest="start", type=int, default=None, help="first index (default: resume)"
    )
    ex.set_defaults(func=cmd_export)

    be = sub.add_parser("bench", help="benchmarks (figures go to docs/BENCHMARKS.md)")
    be.add_argument("which", choices=["store", "replication", "group", "peer", "spark"])
    be.add_argument("--json", action="store_true", help="one JSON object on stdout")
    be.add_argument("--quick", action="store_true", help="a smaller run")
    be.add_argument("--clients", type=int, default=4, help="group: batch clients")
    be.add_argument("--batch", type=int, default=1000, help="group: entries per batch")
    be.add_argument("--members", type=int, default=3, help="group: members")
    be.add_argument("--threads", type=int, default=64, help="group: threads sharing one client")
    be.add_argument(
        "--sync-flush", action="store_true", help="group: ack only after fdatasync on a quorum"
    )
    be.add_argument("--gib", type=float, default=1.0, help="store: size of the recovery log")
    be.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
