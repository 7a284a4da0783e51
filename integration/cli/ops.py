"""Operating a running group: ``status [--watch]``, ``tail``, ``list``, ``stop`` and ``fault``.

These are the commands a person on call reaches for (as with etcdctl, Kafka's
console consumer or RocketMQ's mqadmin): see the members, follow the committed
log, find and stop groups, and practise failures with the group's own fault
injection (:class:`~rayledger.actors.LedgerGroup` kill/pause/partition).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rayledger.election import Role
from rayledger.election.configuration import CONFIG_CHANNEL
from rayledger.storage import LedgerError, ResponseCode

from ..connect import NAMESPACE, connect
from . import output
from .options import one_target, or_topic
from .output import say

#: Entries per read while tailing (one call to the leader).
TAIL_CHUNK = 1000
FAULTS = ("kill", "pause", "resume", "partition", "heal")


def _group(args):
    from rayledger.actors import LedgerGroup

    connect(args.address)
    return LedgerGroup.get(args.group)


# -- status ----------------------------------------------------------------------------------
def status_rows(group, prev: dict[str, Any] | None = None) -> tuple[list[dict], dict[str, Any]]:
    """One row per member (role, term, end, committed, lag, alive) and the leader's append rate.

    ``prev`` is the previous call's second value; the rate is the leader's end index
    growth since then (or since the last call that saw a leader), per second.
    """
    st = group.status()
    now = time.monotonic()
    leader = next((m for m, s in st.items() if s.alive and s.role and s.role is Role.LEADER), None)
    leader_end = st[leader].ledger_end_index if leader else None
    rows = [
        {
            "member": m,
            "alive": s.alive,
            "role": s.role.value if s.role else None,
            "term": s.term,
            "leader": s.leader_id,
            "begin": s.ledger_begin_index,
            "end": s.ledger_end_index,
            "committed": s.committed_index,
            "lag": (leader_end - s.ledger_end_index)
            if leader_end is not None and s.alive
            else None,
        }
        for m, s in st.items()
    ]
    rate = None
    if prev and leader_end is not None and prev.get("end") is not None and now > prev["t"]:
        rate = max(0.0, (leader_end - prev["end"]) / (now - prev["t"]))
    if leader_end is None and prev and prev.get("end") is not None:
        # no leader seen this time (an election, or it answered late): the next rate is
        # measured from the last time one was
        return rows, {**prev, "leader": None, "append_rate": None}
    return rows, {"t": now, "end": leader_end, "leader": leader, "append_rate": rate}


def _table(name: str, rows: list[dict], info: dict[str, Any]):
    from rich.table import Table

    rate = info.get("append_rate")
    caption = f"leader {info.get('leader') or '-'}" + (
        f", appending {rate:,.0f} entries/s" if rate is not None else ""
    )
    table = Table(title=f"group {name}", caption=caption)
    for col in rows[0]:
        table.add_column(
            col, justify="right" if col not in ("member", "role", "leader") else "left"
        )
    for r in rows:
        table.add_row(*("-" if v is None else str(v) for v in r.values()))
    return table


def cmd_status(args) -> int:
    group = _group(args)
    if args.interval <= 0 or args.count < 0:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT, "--interval must be > 0 and --count >= 0"
        )
    if not args.watch:
        rows, info = status_rows(group)
        if args.json:
            say(json.dumps(rows))
        else:
            output.console().print(_table(args.group, rows, info))
        return 0
    return _watch(group, args)


def _watch(group, args) -> int:
    """Refresh every ``--interval`` s, ``--count`` times (0: until Ctrl-C)."""
    from rich.live import Live

    info: dict[str, Any] | None = None
    n = 0
    live = None if args.json else Live(console=output.console(), auto_refresh=False)
    try:
        if live:
            live.start()
        while args.count == 0 or n < args.count:
            rows, info = status_rows(group, info)
            if live:
                live.update(_table(args.group, rows, info), refresh=True)
            else:
                say(json.dumps({"members": rows, "append_rate": info["append_rate"]}))
            n += 1
            if args.count == 0 or n < args.count:
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live:
            live.stop()
    return 0


# -- tail ------------------------------------------------------------------------------------
#: How ``tail`` marks a configuration entry in its text lines (before the body).
CONFIG_MARK = "[configuration] "


def _entry_line(e, as_json: bool) -> str:
    """One entry as ``tail`` prints it.  Every entry of the log is printed, as a term's
    empty first entry (an empty body) always was: a configuration entry (on
    :data:`~rayledger.election.configuration.CONFIG_CHANNEL`) is marked, with
    ``"channel"`` (0 for a client's entry) in JSON and :data:`CONFIG_MARK` before its body
    in text, so it is never taken for a client's data."""
    try:
        body, enc = e.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, enc = e.body.hex(), "hex"
    channel = e.channel
    if as_json:
        return json.dumps(
            {"index": e.index, "term": e.term, "pos": e.pos, "body": body, "encoding": enc,
             "channel": channel}
        )  # fmt: skip
    mark = CONFIG_MARK if channel == CONFIG_CHANNEL else f"[channel {channel}] " if channel else ""
    return f"{e.index}\t{e.term}\t{mark}{body}"


def cmd_tail(args) -> int:
    """Print committed entries from ``--from``; with ``--follow``, as they commit (every
    entry, configuration entries marked: see :func:`_entry_line`)."""
    if one_target(args):
        from .topic import tail_topic

        return tail_topic(args, _entry_line)
    if args.start is not None and args.start < 0:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT, f"--from must be >= 0, got {args.start}"
        )
    client = _group(args).client(timeout_s=args.timeout)
    nxt = args.start or 0
    committed = client.committed_index()
    if nxt > committed + 1 and not args.follow:
        raise LedgerError(
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            f"--from {nxt} is past the committed index {committed} (pass --follow to wait)",
        )
    printed = 0
    try:
        while args.max is None or printed < args.max:
            if nxt > committed:
                if not args.follow:
                    break
                time.sleep(args.poll)
                committed = client.committed_index()
                continue
            stop = min(committed + 1, nxt + TAIL_CHUNK)
            if args.max is not None:
                stop = min(stop, nxt + args.max - printed)
            entries = client.read(nxt, stop)
            if not entries:
                raise LedgerError(
                    ResponseCode.INDEX_OUT_OF_BOUNDS, f"no committed entries at [{nxt}, {stop})"
                )
            for e in entries:
                say(_entry_line(e, args.json))
            printed += len(entries)
            nxt = entries[-1].index + 1
    except KeyboardInterrupt:
        pass
    return 0


# -- list and stop ---------------------------------------------------------------------------
def group_names() -> list[str]:
    """Names of the groups running on the cluster (from their members' named actors)."""
    import ray

    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(
        {
            a["name"].split("/", 1)[0]
            for a in found
            if a.get("namespace") == NAMESPACE and "/" in a["name"]
        }
    )


def cmd_list(args) -> int:
    from rayledger.actors import LedgerGroup

    connect(args.address)
    rows = []
    for name in group_names():
        try:
            rows_, info = status_rows(LedgerGroup.get(name))
        except LedgerError:
            continue  # stopped while we looked
        alive = [r for r in rows_ if r["alive"]]
        rows.append(
            {
                "group": name,
                "members": len(rows_),
                "alive": len(alive),
                "leader": info["leader"],
                "term": max((r["term"] for r in alive), default=None),
                "committed": max((r["committed"] for r in alive), default=None),
            }
        )
    if args.json:
        say(json.dumps(rows))
    elif not rows:
        say("no groups are running")
    else:
        from rich.table import Table

        table = Table(title="groups")
        for col in rows[0]:
            table.add_column(col)
        for r in rows:
            table.add_row(*("-" if v is None else str(v) for v in r.values()))
        output.console().print(table)
    return 0


def cmd_stop(args) -> int:
    group = _group(args)
    group.shutdown(delete_data=args.delete_data)
    say(json.dumps({"group": args.group, "stopped": True, "deleted_data": bool(args.delete_data)}))
    return 0


# -- fault -----------------------------------------------------------------------------------
def _pid_file(group: str, member: str) -> Path:
    """Where ``fault pause`` leaves the paused pid for a later ``fault resume``."""
    return Path(tempfile.gettempdir()) / "rayledger-paused" / f"{group}.{member}.pid"


def _member(group, name: str | None) -> str:
    if name in (None, "leader"):
        return group.leader_id() or group.wait_for_leader(timeout_s=10)
    group.handle(name)  # UNKNOWN_MEMBER when it is not one
    return name


def cmd_fault(args) -> int:
    group = _group(args)
    done: dict[str, Any] = {"group": args.group, "fault": args.action}
    unknown = [t for t in args.targets if t.startswith("-")]
    if unknown:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"unknown options {unknown}")
    if args.action in ("kill", "pause", "resume"):
        if len(args.targets) > 1:
            raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{args.action} takes one member")
        member = _member(group, args.targets[0] if args.targets else None)
        done["member"] = member
        pid_file = _pid_file(args.group, member)
        if args.action == "kill":
            group.kill(member)
        elif args.action == "pause":
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(str(group.pause(member)))
        else:
            text = pid_file.read_text().strip() if pid_file.exists() else ""
            pid = int(text) if text.isdigit() else None  # else: ask the member for its pid
            group.resume(member, pid=pid)
            pid_file.unlink(missing_ok=True)
    elif args.action == "partition":
        sides = [[m for m in t.split(",") if m] for t in args.targets]
        if len(sides) < 2 or not all(sides):
            raise LedgerError(
                ResponseCode.UNEXPECTED_ARGUMENT,
                "partition takes two or more sides, e.g. `n0 n1,n2`",
            )
        group.partition(*sides, one_way=args.one_way)
        done["sides"] = sides
    else:
        group.heal()
    say(json.dumps(done))
    return 0


# -- parser ----------------------------------------------------------------------------------
def add_commands(add, sub, common) -> None:
    """Register the operating commands; ``add`` makes a subparser that takes ``--group``."""
    ss = add("status", "each member's role, term, indexes and lag", cmd_status)
    ss.add_argument("--json", action="store_true", help="JSON instead of a table")
    ss.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    ss.add_argument("--interval", type=float, default=1.0, help="--watch: seconds between rows")
    ss.add_argument("--count", type=int, default=0, help="--watch: stop after N refreshes")

    tl = add("tail", "print committed entries, like kafka-console-consumer", cmd_tail)
    tl.add_argument("--from", dest="start", type=int, default=None, help="first index (default 0)")
    tl.add_argument("--follow", "-f", action="store_true", help="wait for new entries")
    tl.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per entry ("channel": 0 for a client\'s entry, '
        f"{CONFIG_CHANNEL} for a configuration entry)",
    )
    tl.add_argument("--max", type=int, default=None, help="stop after N entries")
    tl.add_argument("--poll", type=float, default=0.2, help="--follow: seconds between polls")
    or_topic(tl, "every partition of this topic, merged (lines start with the partition)")

    sp = add("stop", "stop a group's members", cmd_stop)
    sp.add_argument("--delete-data", action="store_true", help="also delete its files")

    ls = sub.add_parser("list", parents=[common], help="the groups running on the cluster")
    ls.add_argument("--address", default=None, help="Ray address (default: the running cluster)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    ft = add(
        "fault",
        "game days: kill|pause|resume [MEMBER|leader], partition SIDE SIDE..., heal",
        cmd_fault,
    )
    ft.add_argument("action", choices=FAULTS)
    # its targets are the words left over after the options (main.parse_args), so that both
    # `fault pause --group G n1` and `fault pause n1 --group G` work
    ft.usage = "rayledger fault ACTION --group G [TARGET ...] [--one-way]"
    ft.description = (
        "kill|pause|resume [MEMBER|leader] (default: the leader); partition SIDE SIDE ... "
        "(each side comma-separated members, e.g. `n0 n1,n2`); heal (lift every partition)"
    )
    ft.add_argument("--one-way", action="store_true", help="partition: cut only side 1 -> others")
