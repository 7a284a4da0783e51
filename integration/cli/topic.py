"""``rayledger topic``: create, list, watch, rebalance and delete topics (a log over N groups),
and the topic side of ``append --topic`` and ``tail --topic``.

Every command prints JSON lines (``status`` and ``list`` a table unless ``--json``); errors
are one coded line, as for the other commands.
"""

from __future__ import annotations

import json

from rayledger.storage import LedgerError, ResponseCode

from ..connect import connect
from . import output
from .options import add_start_options, parse_members, store_dir_of
from .output import say


def _topic(args):
    from rayledger.integration.topic import LedgerTopic

    connect(args.address)
    return LedgerTopic.get(args.topic)


def cmd_create(args) -> int:
    from rayledger.actors import LedgerConfig
    from rayledger.integration.topic import LedgerTopic

    members = parse_members(args.members)
    connect(args.address)
    config = LedgerConfig.fast() if args.fast else LedgerConfig()
    topic = LedgerTopic.create(args.topic, args.partitions, members, store_dir_of(args), config)
    leaders = topic.wait_for_leaders(timeout_s=args.timeout)
    say(json.dumps({"topic": args.topic, "partitions": topic.partitions,
                    "groups": topic.groups, "leaders": leaders}))  # fmt: skip
    return 0


def cmd_status(args) -> int:
    rows = _topic(args).status()
    for r in rows:  # a node id is long: its head names it
        if r.get("node"):
            r["node"] = r["node"][:12]
    output.print_rows(rows, f"topic {args.topic}", args.json)
    return 0


def cmd_list(args) -> int:
    from rayledger.integration.topic import LedgerTopic

    connect(args.address)
    rows = []
    for name in LedgerTopic.list():
        try:
            status = LedgerTopic.get(name).status()
        except LedgerError:
            continue  # deleted while we looked
        rows.append({"topic": name, "partitions": len(status),
                     "led": sum(r["leader"] is not None for r in status),
                     "nodes": len({r["node"] for r in status if r["node"]})})  # fmt: skip
    output.print_rows(rows, "topics", args.json)
    return 0


def cmd_rebalance(args) -> int:
    moves = _topic(args).rebalance(timeout_s=args.timeout)
    say(json.dumps({"topic": args.topic, "moves": moves}))
    return 0


def cmd_delete(args) -> int:
    _topic(args).delete(delete_data=args.delete_data)
    say(json.dumps({"topic": args.topic, "deleted": True, "deleted_data": args.delete_data}))
    return 0


def append_to_topic(args, bodies: list[bytes]) -> int:
    """``append --topic T [--key K]``: every body to K's partition (round robin without)."""
    from rayledger.integration.topic import TopicClient

    connect(args.address)
    client = TopicClient.connect(args.topic, timeout_s=args.timeout)
    try:
        keys = args.key if args.key is not None else [None] * len(bodies)  # one by one
        for r in client.append_batch(bodies, keys):
            say(json.dumps(r._asdict()))
    finally:
        client.close()
    return 0


def tail_topic(args, line) -> int:
    """``tail --topic T``: every partition's committed entries, merged as they come
    (``line(entry, as_json)`` prints one; a partition's entries stay in its order)."""
    from rayledger.integration.topic import TopicClient

    if args.start is not None and args.start < 0:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT, f"--from must be >= 0, got {args.start}"
        )
    connect(args.address)
    client = TopicClient.connect(args.topic, timeout_s=args.timeout)
    try:
        for t in client.tail(start=args.start or 0, follow=args.follow, poll_s=args.poll,
                             max_entries=args.max):  # fmt: skip
            text = line(t.entry, args.json)
            if args.json:
                say(json.dumps({"partition": t.partition, **json.loads(text)}))
            else:
                say(f"p{t.partition}\t{text}")
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


def add_commands(sub, common) -> None:
    """``rayledger topic SUBCOMMAND``."""
    tp = sub.add_parser("topic", parents=[common], help="topics: a log over N groups")
    tsub = tp.add_subparsers(dest="topic_command", required=True)

    def add(name: str, help: str, func, with_topic: bool = True):
        sp = tsub.add_parser(name, parents=[common], help=help)
        if with_topic:
            sp.add_argument("--topic", "-t", required=True, help="topic name")
        sp.add_argument(
            "--address", default=None, help="Ray address (default: the running cluster)"
        )
        sp.add_argument("--timeout", type=float, default=60.0, help="seconds to wait")
        sp.set_defaults(func=func)
        return sp

    cr = add("create", "start a topic of N partitions (groups NAME-p0 ...)", cmd_create)
    cr.add_argument("--partitions", "-p", type=int, required=True, help="how many partitions")
    add_start_options(cr, "members per partition: a count or comma-separated ids")
    ls = add("list", "the topics on the cluster", cmd_list, with_topic=False)
    ls.add_argument("--json", action="store_true")
    st = add("status", "each partition's leader, node, term and committed index", cmd_status)
    st.add_argument("--json", action="store_true")
    add("rebalance", "move leaders off nodes that lead more than their share", cmd_rebalance)
    de = add("delete", "stop every partition's group and forget the topic", cmd_delete)
    de.add_argument("--delete-data", action="store_true", help="also delete their files")
