"""``rayledger mq``: RocketMQ on a running group, like RocketMQ's mqadmin and console tools.

``mq start`` creates a group whose members run the commit log; ``produce`` puts messages,
``consume`` pulls them (``--follow`` tails, ``--consumer-group`` starts from and commits the
group's offset), ``topics`` lists queues with their max offsets, ``query`` finds messages by
key and ``stats`` shows queues, consumer groups and the leader.  Output is one JSON object
per line; a message RocketMQ refuses prints its PutMessageStatus and exits 2.
"""

from __future__ import annotations

import json
import time

from rayledger.storage import LedgerError, ResponseCode

from . import output
from .options import add_start_options, group_command_adder, group_running, start_group
from .output import say


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


def cmd_produce(args) -> int:
    if args.count is not None and args.count <= 0:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "--count must be positive")
    bodies = [b.encode() for b in args.bodies]
    if args.count:
        bodies += [b"m%d-%s" % (i, b"x" * max(0, args.size - 8)) for i in range(args.count)]
    if not bodies:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "give message bodies or --count N")
    log = _log(args)
    if args.delay_level:  # someone must deliver them: the group's service, started if down
        from rayledger.integration.rocketmq.schedule_service import ensure_service

        ensure_service(log.group.name)
    failed = 0
    for start in range(0, len(bodies), args.batch):
        chunk = bodies[start : start + args.batch]
        if len(chunk) == 1 or args.delay_level:
            results = [
                log.put_message(
                    args.topic,
                    args.queue,
                    b,
                    tags=args.tags,
                    keys=args.keys,
                    delay_level=args.delay_level,
                )  # fmt: skip
                for b in chunk
            ]
        else:
            results = log.put_messages([
                {"topic": args.topic, "queue_id": args.queue, "body": b, "tags": args.tags,
                 "keys": args.keys} for b in chunk
            ])  # fmt: skip
        for r in results:
            row = {"status": r.status.name, "msg_id": r.msg_id, "queue_offset": r.queue_offset,
                   "wrote_offset": r.wrote_offset}  # fmt: skip
            if not r.ok:
                failed += 1
                output.error(f"error: [{r.status.name}] {r.error or 'refused'}")
                row["error"] = r.error
            say(json.dumps(row))
    return 2 if failed else 0


def cmd_consume(args) -> int:
    log = _log(args)
    queues = [args.queue] if args.queue is not None else None
    nxt: dict[int, int] = {}
    shown = 0
    while True:
        qids = queues or sorted(log.topics().get(args.topic, {}))
        got = 0
        for qid in qids:
            if qid not in nxt:
                start = args.offset
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


def add_commands(sub, common) -> None:
    """``rayledger mq SUBCOMMAND``, each on one group (--group/--address/--timeout)."""
    mq = sub.add_parser("mq", parents=[common], help="RocketMQ on a group: produce, consume, ...")
    add = group_command_adder(mq.add_subparsers(dest="mq_command", required=True), common)
    st = add("start", "start a group whose members run the RocketMQ commit log", cmd_start)
    add_start_options(st, "how many members")
    st.add_argument(
        "--delay-levels", default=None,
        help="each delay level's delay, RocketMQ's messageDelayLevel (default "
        '"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"; units ms/s/m/h/d)',
    )  # fmt: skip
    pr = add("produce", "put messages (one per BODY, or --count N generated)", cmd_produce)
    pr.add_argument("bodies", nargs="*", help="message bodies (UTF-8)")
    pr.add_argument("--topic", "-t", required=True)
    pr.add_argument("--queue", "-q", type=int, default=0, help="queue id")
    pr.add_argument("--tags", default=None)
    pr.add_argument("--keys", default=None, help="space-separated keys (for `mq query`)")
    pr.add_argument("--count", type=int, default=None, help="generate N messages")
    pr.add_argument("--size", type=int, default=128, help="--count: body bytes")
    pr.add_argument("--batch", type=int, default=32, help="messages per put (one commit wait)")
    pr.add_argument(
        "--delay-level", type=int, default=0,
        help="RocketMQ delay level (1-18 by default): parked in SCHEDULE_TOPIC_XXXX, then "
        "delivered to the topic's queue, once, when the level's delay has passed",
    )  # fmt: skip
    co = add("consume", "pull committed messages of a topic", cmd_consume)
    co.add_argument("--topic", "-t", required=True)
    co.add_argument("--queue", "-q", type=int, default=None, help="one queue (default: all)")
    co.add_argument("--offset", type=int, default=0, help="first queue offset")
    co.add_argument("--max", type=int, default=None, help="stop after N messages")
    co.add_argument("--follow", "-f", action="store_true", help="wait for new messages")
    co.add_argument("--poll", type=float, default=0.2, help="--follow: seconds between pulls")
    co.add_argument(
        "--consumer-group", default=None, help="start from and commit this group's offsets"
    )
    add("topics", "topics and queues with their max offsets", cmd_topics)
    qu = add("query", "messages of a topic by key", cmd_query)
    qu.add_argument("--topic", "-t", required=True)
    qu.add_argument("--key", "-k", required=True)
    qu.add_argument("--max", type=int, default=32)
    add("stats", "messages per queue, consumer-group offsets and lag, the leader", cmd_stats)
