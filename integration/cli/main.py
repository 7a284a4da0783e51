"""The ``rayledger`` command line (also ``python -m rayledger.integration.cli``).

Every subcommand prints one clear line on error and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence

from rayledger.storage import LedgerError, ResponseCode

from ..connect import connect
from . import kv, member, mq, ops, output, topic
from .options import (
    Parser,
    add_start_options,
    common_options,
    group_command_adder,
    one_target,
    or_topic,
    start_group,
)
from .output import say


def cmd_start(args) -> int:
    from rayledger.actors import LedgerGroup

    return start_group(
        args, lambda name, members, store_dir, config: LedgerGroup.create(
            name, members, store_dir=store_dir, config=config)
    )  # fmt: skip


def cmd_append(args) -> int:
    from rayledger.actors import LedgerClient

    bodies = [b.encode() for b in args.bodies]
    if args.file:
        with open(args.file, "rb") as f:
            bodies.append(f.read())
    if one_target(args):
        return topic.append_to_topic(args, bodies)
    if args.key is not None:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "--key goes with --topic")
    connect(args.address)
    client = LedgerClient.connect(args.group, timeout_s=args.timeout)
    results = client.append_batch(bodies)
    for r in results:
        say(json.dumps({"index": r.index, "term": r.term, "pos": r.pos}))
    return 0


def cmd_get(args) -> int:
    from rayledger.actors import LedgerClient

    if args.index < 0 or args.count <= 0:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"INDEX must be >= 0 and --count > 0, got {args.index} and {args.count}",
        )
    connect(args.address)
    client = LedgerClient.connect(args.group, timeout_s=args.timeout)
    entries = client.read(args.index, args.index + args.count)
    if not entries:
        raise LedgerError(
            ResponseCode.INDEX_OUT_OF_BOUNDS, f"no committed entry at index {args.index}"
        )
    for e in entries:
        body = e.body.decode("utf-8", "backslashreplace")
        # "channel": 0 for a client's entry, CONFIG_CHANNEL for a configuration
        say(json.dumps({"index": e.index, "term": e.term, "pos": e.pos, "body": body,
                        "channel": e.channel}))  # fmt: skip
    return 0


def cmd_transfer(args) -> int:
    from rayledger.actors import LedgerGroup

    connect(args.address)
    group = LedgerGroup.get(args.group)
    leader = group.transfer_leadership(args.member, timeout_s=args.timeout)
    say(json.dumps({"group": args.group, "leader": leader}))
    return 0


def cmd_export(args) -> int:
    from ..spark.export import export_main

    one_target(args)  # --group or --topic
    return export_main(args)


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_bench(args) -> int:
    from .. import bench

    result = bench.run(args.which, args)
    say(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


#: The next step to suggest for each error code a user can meet at the command line.
NEXT_STEP: dict[ResponseCode, str] = {
    ResponseCode.UNKNOWN_GROUP: "see the running groups with `rayledger list`",
    ResponseCode.UNKNOWN_MEMBER: "see the members with `rayledger member list --group G`",
    ResponseCode.UNEXPECTED_MEMBER: "see the members with `rayledger member list --group G`",
    ResponseCode.CONFIG_CHANGE_IN_PROGRESS: "wait for the change under way: "
    "`rayledger member list --group G`",
    ResponseCode.NODE_UNAVAILABLE: "pick a live node hosting no member (`ray status`), or "
    "add a node",
    ResponseCode.NO_LIVE_QUORUM: "bring members back first (`rayledger status --group G`)",
    ResponseCode.NETWORK_ERROR: "start Ray with `ray start --head` or pass --address",
    ResponseCode.INDEX_OUT_OF_BOUNDS: "check the range with `rayledger status --group G`",
    ResponseCode.UNEXPECTED_ARGUMENT: "see `rayledger COMMAND --help`",
    ResponseCode.INTERNAL_ERROR: "this is a bug in rayledger or Ray",
    ResponseCode.TIMEOUT: "the group may have no leader: check `rayledger status --group G`",
    ResponseCode.NOT_LEADER: "retry; the group is electing a leader",
    ResponseCode.LEADER_NOT_READY: "retry; the group is electing a leader",
    ResponseCode.UNSUPPORTED: "run the command on the member's node",
}


def _add_demo(sub, common) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="the main job: failover, checks and a Spark aggregation on a local Ray",
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


def _add_group_commands(sub, common) -> None:
    add = group_command_adder(sub, common)
    st = add("start", "start a group on the running Ray cluster", cmd_start)
    add_start_options(st, "a count or comma-separated member ids")
    ap = add("append", "append entries (one per argument) and wait for commit", cmd_append)
    ap.add_argument("bodies", nargs="*", help="entry bodies (UTF-8)")
    ap.add_argument("--file", help="also append this file's bytes as one entry")
    or_topic(ap, "append to this topic instead of --group")
    ap.add_argument("--key", default=None, help="--topic: every entry to this key's partition")
    gt = add("get", "read committed entries", cmd_get)
    gt.add_argument("index", type=int)
    gt.add_argument("--count", type=int, default=1)
    tr = add("transfer", "move leadership to a member", cmd_transfer)
    tr.add_argument("member")
    ex = add("export", "committed entries to Parquet through Spark", cmd_export)
    ex.add_argument("--out", required=True, help="output directory")
    or_topic(ex, "export every partition of this topic (to OUT/partition-<p>/)")
    ex.add_argument(
        "--from", dest="start", type=int, default=None, help="first index (default: resume)"
    )
    ops.add_commands(add, sub, common)


def _add_bench(sub, common) -> None:
    be = sub.add_parser(
        "bench", parents=[common], help="benchmarks (figures go to docs/BENCHMARKS.md)"
    )
    be.add_argument(
        "which",
        choices=[
            "store",
            "replication",
            "core",
            "group",
            "peer",
            "spark",
            "mq",
            "kv",
            "divergent",
            "membership",
            "topic",
        ],  # fmt: skip
    )
    be.add_argument("--json", action="store_true", help="one JSON object on stdout")
    be.add_argument("--quick", action="store_true", help="a smaller run")
    be.add_argument("--clients", type=int, default=4, help="group: batch clients")
    be.add_argument("--batch", type=int, default=1000, help="group: entries per batch")
    be.add_argument("--members", type=int, default=3, help="group: members")
    be.add_argument("--threads", type=int, default=64, help="group: threads sharing one client")
    be.add_argument(
        "--sync-flush", action="store_true", help="group: ack only after fdatasync on a quorum"
    )
    be.add_argument(
        "--fast-path",
        choices=["on", "off"],
        default=None,
        help="group/peer: the compiled round path on or off (default: LedgerConfig's default)",
    )
    be.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="group/peer: rounds waiting for their quorum at once (default: LedgerConfig's, 1)",
    )
    be.add_argument("--gib", type=float, default=1.0, help="store: size of the recovery log")
    be.add_argument(
        "--keys", type=int, default=None, help="kv: keys the store holds (default 1M, quick 100k)"
    )
    be.add_argument(
        "--load-seconds",
        type=float,
        default=None,
        help="group: length of the saturating single-append phase (default 10, quick 3)",
    )
    be.add_argument("--plot", default=None, help="group: draw latency CDF and throughput to a PNG")
    be.add_argument(
        "--no-floor",
        action="store_true",
        help="group/peer: skip the bare Ray chain of the card's shape (the floor) and the ratios",
    )
    be.add_argument(
        "--floor-actors",
        choices=["mixed", "asyncio", "threaded"],
        default="threaded",
        help="group/peer: the floor's concurrency model; threaded (the default) as rayledger's "
        "actors; mixed: threaded dispatchers and checker, asyncio leader and followers",
    )
    be.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    p = Parser(
        prog="rayledger", description="DLedger's replicated commitlog on Ray", parents=[common]
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_demo(sub, common)
    _add_group_commands(sub, common)
    _add_bench(sub, common)
    mq.add_commands(sub, common)
    kv.add_commands(sub, common)
    member.add_commands(sub, common)
    topic.add_commands(sub, common)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse; ``fault`` takes the words left over after its options as its targets."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "fault":
        args.targets = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def _explain(exc: LedgerError, command: str | None = None) -> str:
    hint = NEXT_STEP.get(exc.code)
    if hint and command:
        hint = hint.replace("rayledger COMMAND", f"rayledger {command}")
    return f"error: {exc}" + (f"; {hint}" if hint else "")


def _unexpected(exc: BaseException, command: str | None) -> str:
    """The one line for an error no command expected; its traceback went to the log (or,
    with --verbose, to the terminal just above)."""
    rex = sys.modules.get("ray.exceptions")
    code, hint = ResponseCode.INTERNAL_ERROR, NEXT_STEP[ResponseCode.INTERNAL_ERROR]
    if rex is not None and isinstance(exc, rex.GetTimeoutError):
        code, hint = ResponseCode.TIMEOUT, "a member did not answer in time; retry"
    elif rex is not None and isinstance(exc, rex.RayActorError):
        hint = "a member's process died or is unreachable; check `rayledger status --group G`"
    text = " ".join(str(exc).split())  # Ray's messages run over many lines
    if len(text) > 300:
        text = text[:297] + "..."
    line = f"error: [{code.name}] {type(exc).__name__}" + (f": {text}" if text else "")
    path = output.log_path()
    where = f"see the log at {path}" if path else "the traceback is above"
    return f"{line}; {hint}; {where}"


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = parse_args(argv)
    if not args.verbose:
        output.quiet()
    code = 1
    try:
        code = int(args.func(args) or 0)
    except LedgerError as exc:
        output.error(_explain(exc, args.command))
        code = 2
    except KeyboardInterrupt:
        output.error("error: interrupted")
        code = 130
    except Exception as exc:  # a bug or a Ray failure: one line, the traceback in the log
        traceback.print_exc()  # fd 2: the log file unless --verbose
        sys.stderr.flush()
        output.error(_unexpected(exc, args.command), show_log=False)
        code = 1
    finally:
        output.finish(code == 0)
    return code


if __name__ == "__main__":
    sys.exit(main())
