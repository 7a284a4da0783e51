"""``rayledger mq``: RocketMQ on a running group, like RocketMQ's mqadmin and console tools.

``mq start`` creates a group whose members run the commit log; ``produce`` puts messages,
``consume`` pulls them (``--follow`` tails, ``--consumer-group`` starts from and commits the
group's offset), ``topics`` lists queues with their max offsets, ``query`` finds messages by
key and ``stats`` shows queues, consumer groups and the leader.  ``mq cluster`` creates,
lists, shows and deletes broker clusters (a topic's queues over N groups), and ``produce``
and ``consume`` take ``--cluster NAME`` instead of ``--group``.  Output is one JSON object
per line (``cluster list|status``: a table unless ``--json``); a message RocketMQ refuses
prints its PutMessageStatus and exits 2.
"""

from __future__ import annotations

import json
import time

from rayledger.storage import LedgerError, ResponseCode

from ..connect import connect
from . import output
from .options import (
    Parser,
    add_start_options,
    group_command_adder,
    group_running,
    parse_members,
    start_group,
    store_dir_of,
)
from .output import say


def _bad(msg: str) -> LedgerError:
    return LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, msg)


def _log(args):
    from rayledger.integration.rocketmq import CommitLog
    from rayledger.integration.rocketmq.client import MACHINE

    group = group_running(args, MACHINE, "the RocketMQ commit log",
                          "start one with `rayledger mq start`")  # fmt: skip
    return CommitLog(group, timeout_s=args.timeout)


def _row(m) -> dict:
    return {
        "topic": m.topic,
        "queue": m.queue_id,
        "offset": m.queue_offset,
        "msg_id": m.msg_id,
        "tags": m.tags,
        "keys": m.keys,
        "store_ts": m.store_timestamp,
        "body": m.body.decode("utf-8", "backslashreplace"),
    }


def cmd_start(args) -> int:
    from rayledger.integration.rocketmq import CommitLog

    return start_group(args, lambda *a: CommitLog.create(*a, delay_levels=args.delay_levels).group)


def _cluster(args, *group_only: str):
    """The broker cluster ``--cluster`` names, or None for ``--group``'s commit log: exactly
    one of them, and none of the ``group_only`` options (one group's queue or offset) with
    a cluster, else UNEXPECTED_ARGUMENT before anything is sent."""
    if args.group is not None and args.cluster is not None:
        raise _bad("--group and --cluster exclude each other: one commit-log group or a "
                   "broker cluster")  # fmt: skip
    if args.group is None and args.cluster is None:
        raise _bad("pass --group G (one commit-log group) or --cluster NAME (a broker cluster)")
    if args.cluster is None:
        return None
    given = [f"--{o.replace('_', '-')}" for o in group_only if getattr(args, o) is not None]
    if given:
        raise _bad(f"{', '.join(given)} goes with --group, not --cluster")
    return _brokers(args).get(args.cluster)


def _printed(r, row: dict) -> bool:
    """Print a put's row, and its error line when it was refused; whether it was."""
    if not r.ok:
        output.error(f"error: [{r.status.name}] {r.error or 'refused'}")
        row.update(error=r.error, outcome_unknown=r.outcome_unknown)
    say(json.dumps(row))
    return not r.ok


def _deliver_delayed(groups: list[str]) -> None:
    """Someone must deliver delayed messages: each group's schedule service, started if down."""
    from rayledger.integration.rocketmq.schedule_service import ensure_service

    for g in groups:
        ensure_service(g)


def cmd_produce(args) -> int:
    if args.count is not None and args.count <= 0:
        raise _bad("--count must be positive")
    bodies = [b.encode() for b in args.bodies]
    if args.count:
        bodies += [b"m%d-%s" % (i, b"x" * max(0, args.size - 8)) for i in range(args.count)]
    if not bodies:
        raise _bad("give message bodies or --count N")
    cluster = _cluster(args, "queue")
    if cluster is not None:
        return _produce_to_cluster(args, cluster, bodies)
    if args.sharding_key is not None:
        raise _bad("--sharding-key goes with --cluster")
    log = _log(args)
    if args.delay_level:
        _deliver_delayed([log.group.name])
    queue = args.queue or 0
    failed = 0
    for start in range(0, len(bodies), args.batch):
        chunk = bodies[start : start + args.batch]
        if len(chunk) == 1 or args.delay_level:
            results = [
                log.put_message(
                    args.topic,
                    queue,
                    b,
                    tags=args.tags,
                    keys=args.keys,
                    delay_level=args.delay_level,
                )  # fmt: skip
                for b in chunk
            ]
        else:
            results = log.put_messages([
                {"topic": args.topic, "queue_id": queue, "body": b, "tags": args.tags,
                 "keys": args.keys} for b in chunk
            ])  # fmt: skip
        for r in results:
            failed += _printed(r, {"status": r.status.name, "msg_id": r.msg_id,
                                   "queue_offset": r.queue_offset,
                                   "wrote_offset": r.wrote_offset})  # fmt: skip
    return 2 if failed else 0


def _produce_to_cluster(args, cluster, bodies: list[bytes]) -> int:
    """One send per message: round robin over every broker group's queues with failover, or
    to the sharding key's queue; ``msg_id`` is the producer's id, ``offset_msg_id`` the
    broker's."""
    if args.delay_level:
        _deliver_delayed(cluster.brokers)
    producer = cluster.producer(send_timeout_s=args.timeout)
    failed = 0
    for b in bodies:
        r = producer.send(args.topic, b, args.tags, args.keys, delay_level=args.delay_level,
                          sharding_key=args.sharding_key)  # fmt: skip
        failed += _printed(r, {"status": r.status.name, "broker": r.broker,
                               "queue_id": r.queue_id, "queue_offset": r.queue_offset,
                               "msg_id": r.msg_id, "offset_msg_id": r.offset_msg_id})  # fmt: skip
    return 2 if failed else 0


def cmd_consume(args) -> int:
    cluster = _cluster(args, "queue", "offset")
    if cluster is not None:
        return _consume_cluster(args, cluster)
    log = _log(args)
    queues = [args.queue] if args.queue is not None else None
    nxt: dict[int, int] = {}
    shown = 0
    while True:
        qids = queues or sorted(log.topics().get(args.topic, {}))
        got = 0
        for qid in qids:
            if qid not in nxt:
                start = args.offset or 0
                if args.consumer_group:
                    start = max(0, log.fetch_offset(args.consumer_group, args.topic, qid))
                nxt[qid] = start
            r = log.pull(args.topic, qid, nxt[qid], 256)
            for m in r.messages[: args.max - shown if args.max else None]:
                say(json.dumps(_row(m)))
                shown += 1
                got += 1
                nxt[qid] = m.queue_offset + 1
            if args.consumer_group and r.messages:
                log.commit_offset(args.consumer_group, args.topic, qid, nxt[qid])
            if args.max and shown >= args.max:
                return 0
        if not args.follow:
            return 0
        if not got:
            time.sleep(args.poll)


def _consume_cluster(args, cluster) -> int:
    """Every queue of every broker group; with ``--consumer-group`` from its offsets, each
    queue's committed after its batch (and, cut short by ``--max``, up to the last shown)."""
    consumer = cluster.consumer(args.consumer_group)
    pulled = consumer.follow(args.topic, args.poll) if args.follow else consumer.consume(args.topic)
    try:
        for shown, (mq, m) in enumerate(pulled, 1):
            say(json.dumps({"broker": mq.broker, **_row(m)}))
            if args.max and shown >= args.max:
                if args.consumer_group:  # the queues before this one are committed
                    consumer.commit_offset(mq, m.queue_offset + 1)
                break
    finally:
        pulled.close()
    return 0


def cmd_topics(args) -> int:
    log = _log(args)
    for topic, queues in sorted(log.topics().items()):
        for qid, max_offset in sorted(queues.items()):
            say(json.dumps({"topic": topic, "queue": qid, "max_offset": max_offset}))
    return 0


def cmd_query(args) -> int:
    log = _log(args)
    for m in log.query_message(args.topic, args.key, args.max):
        say(json.dumps(_row(m)))
    return 0


def cmd_stats(args) -> int:
    log = _log(args)
    topics = log.topics()
    consumers = log.client.query(("consumer_groups",))
    doc = {
        "group": args.group,
        "leader": log.group.leader_id(),
        "committed_index": log.client.committed_index(),
        "messages": sum(sum(q.values()) for q in topics.values()),
        "queues": [
            {"topic": t, "queue": q, "max_offset": n}
            for t, qs in sorted(topics.items())
            for q, n in sorted(qs.items())
        ],
        "consumer_groups": [
            {
                "consumer_group": cg,
                "topic": slot.split("\0")[0],
                "queue": int(slot.split("\0")[1]),
                "offset": off,
                "lag": topics.get(slot.split("\0")[0], {}).get(int(slot.split("\0")[1]), 0) - off,
            }
            for cg, slots in sorted(consumers.items())
            for slot, off in sorted(slots.items())
        ],  # fmt: skip
    }
    say(json.dumps(doc))
    return 0


def _brokers(args):
    """:class:`BrokerCluster`, once attached to ``--address``'s Ray."""
    from rayledger.integration.rocketmq import BrokerCluster

    connect(args.address)
    return BrokerCluster


def cmd_cluster_create(args) -> int:
    from rayledger.actors import LedgerConfig

    members, store_dir = parse_members(args.members), store_dir_of(args)  # before any actor
    config = LedgerConfig.fast() if args.fast else LedgerConfig()
    cluster = _brokers(args).create(args.name, args.brokers, members, store_dir, config,
                                    queues_per_broker=args.queues,
                                    delay_levels=args.delay_levels)  # fmt: skip
    leaders = cluster.wait_for_leaders(args.timeout)
    say(json.dumps({"cluster": args.name, "brokers": cluster.brokers,
                    "members": cluster.layout.members, "queues_per_broker": args.queues,
                    "leaders": leaders}))  # fmt: skip
    return 0


def cmd_cluster_list(args) -> int:
    BrokerCluster = _brokers(args)
    rows = []
    for name in sorted(BrokerCluster.list()):
        try:
            cluster = BrokerCluster.get(name)
        except LedgerError:
            continue  # deleted while we looked
        status = cluster.status()
        rows.append({"cluster": name, "brokers": len(status),
                     "led": sum(r["leader"] is not None for r in status),
                     "members": len(cluster.layout.members),
                     "queues_per_broker": cluster.layout.queues_per_broker})  # fmt: skip
    output.print_rows(rows, "broker clusters", args.json)
    return 0


def cmd_cluster_status(args) -> int:
    rows = _brokers(args).get(args.name).status()
    if any("error" in r for r in rows):  # a table's rows need the same columns
        rows = [{**r, "error": r.get("error", "")} for r in rows]
    output.print_rows(rows, f"broker cluster {args.name}", args.json)
    return 0


def cmd_cluster_delete(args) -> int:
    _brokers(args).get(args.name).delete(delete_data=args.delete_data)
    say(json.dumps({"cluster": args.name, "deleted": True, "deleted_data": args.delete_data}))
    return 0


def _add_delay_levels(sp) -> None:
    sp.add_argument(
        "--delay-levels", default=None,
        help="each delay level's delay, RocketMQ's messageDelayLevel (default "
        '"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"; units ms/s/m/h/d)',
    )  # fmt: skip


def _add_cluster_commands(msub, common) -> None:
    """``rayledger mq cluster create|list|status|delete``: broker clusters by name."""
    on_ray = Parser(add_help=False)
    on_ray.add_argument(
        "--address", default=None, help="Ray address (default: the running cluster)"
    )
    on_ray.add_argument("--timeout", type=float, default=60.0, help="seconds to wait")
    cl = msub.add_parser("cluster", parents=[common], help="broker clusters: a topic's queues "
                         "over N commit-log groups")  # fmt: skip
    csub = cl.add_subparsers(dest="cluster_command", required=True)

    def add(name: str, help: str, func, named: bool = True):
        sp = csub.add_parser(name, parents=[common, on_ray], help=help)
        if named:
            sp.add_argument("name", help="broker cluster name")
        sp.set_defaults(func=func)
        return sp

    cr = add("create", "start N broker groups NAME-b0 ... (masters spread over the nodes)",
             cmd_cluster_create)  # fmt: skip
    cr.add_argument("--brokers", type=int, required=True, help="how many broker groups")
    add_start_options(cr, "members per broker group: a count or comma-separated ids")
    cr.add_argument(
        "--queues", type=int, default=4, help="queues per broker group of a topic (default 4)"
    )
    _add_delay_levels(cr)
    add("list", "the broker clusters on the Ray cluster", cmd_cluster_list, named=False)
    st = add("status", "each broker group's master, term and committed index", cmd_cluster_status)
    for sp in (csub.choices["list"], st):
        sp.add_argument("--json", action="store_true", help="one JSON array, not a table")
    de = add("delete", "stop every broker group and forget the cluster", cmd_cluster_delete)
    de.add_argument("--delete-data", action="store_true", help="also delete their files")


def add_commands(sub, common) -> None:
    """``rayledger mq SUBCOMMAND``, each on one group (--group/--address/--timeout), or for
    ``produce`` and ``consume`` on a broker cluster (--cluster); and ``mq cluster ...``."""
    mq = sub.add_parser(
        "mq", parents=[common], help="RocketMQ on a group or broker cluster: produce, consume, ..."
    )
    msub = mq.add_subparsers(dest="mq_command", required=True)
    add = group_command_adder(msub, common)
    st = add("start", "start a group whose members run the RocketMQ commit log", cmd_start)
    add_start_options(st, "how many members")
    _add_delay_levels(st)
    pr = add("produce", "put messages (one per BODY, or --count N generated)", cmd_produce)
    pr.add_argument("bodies", nargs="*", help="message bodies (UTF-8)")
    pr.add_argument("--topic", "-t", required=True)
    pr.add_argument("--queue", "-q", type=int, default=None, help="queue id (default 0)")
    pr.add_argument("--tags", default=None)
    pr.add_argument("--keys", default=None, help="space-separated keys (for `mq query`)")
    pr.add_argument("--count", type=int, default=None, help="generate N messages")
    pr.add_argument("--size", type=int, default=128, help="--count: body bytes")
    pr.add_argument(
        "--batch", type=int, default=32, help="--group: messages per put (one commit wait)"
    )
    pr.add_argument(
        "--delay-level", type=int, default=0,
        help="RocketMQ delay level (1-18 by default): parked in SCHEDULE_TOPIC_XXXX, then "
        "delivered to the topic's queue, once, when the level's delay has passed",
    )  # fmt: skip
    pr.add_argument(
        "--sharding-key", default=None,
        help="--cluster: every message to this key's queue (ordered, no failover)",
    )  # fmt: skip
    co = add("consume", "pull committed messages of a topic", cmd_consume)
    co.add_argument("--topic", "-t", required=True)
    co.add_argument("--queue", "-q", type=int, default=None, help="one queue (default: all)")
    co.add_argument("--offset", type=int, default=None, help="first queue offset (default 0)")
    co.add_argument("--max", type=int, default=None, help="stop after N messages")
    co.add_argument("--follow", "-f", action="store_true", help="wait for new messages")
    co.add_argument("--poll", type=float, default=0.2, help="--follow: seconds between pulls")
    co.add_argument(
        "--consumer-group", default=None, help="start from and commit this group's offsets"
    )
    for sp in (pr, co):
        _or_cluster(sp)
    add("topics", "topics and queues with their max offsets", cmd_topics)
    qu = add("query", "messages of a topic by key", cmd_query)
    qu.add_argument("--topic", "-t", required=True)
    qu.add_argument("--key", "-k", required=True)
    qu.add_argument("--max", type=int, default=32)
    add("stats", "messages per queue, consumer-group offsets and lag, the leader", cmd_stats)
    _add_cluster_commands(msub, common)


def _or_cluster(sp) -> None:
    """``--group`` or ``--cluster`` (:func:`_cluster` checks that exactly one is given)."""
    for action in sp._actions:
        if "--group" in action.option_strings:
            action.required = False
    sp.add_argument("--cluster", "-c", default=None,
                    help="a broker cluster's every broker group, instead of --group")  # fmt: skip
