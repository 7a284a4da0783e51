"""``rayledger member``: see and change a running group's members.

``list`` prints one line per member of the committed configuration (its id, voter or
learner, its Raft role, term, end and committed indexes, and whether it answers), then a
line per change under way and one naming the lost members waiting for a node; ``--json``
prints one JSON object instead.  ``add`` starts a member and prints its id: it joins as a
learner and is promoted to voter once caught up (unless ``--learner``).  ``remove`` takes a
member out (a leader hands leadership over first) and stops it.  ``replace`` adds a new
member, promotes it once caught up, then removes the old one, and prints the new id; run
again after an interruption, it picks up the replacement under way.  Errors are coded lines
(exit status 2), as with every other command.
"""

from __future__ import annotations

import json

from rayledger.storage import LedgerError, ResponseCode

from .options import group_command_adder
from .output import say

COLUMNS = ("MEMBER", "ROLE", "RAFT", "TERM", "END", "COMMITTED", "ALIVE")


def _group(args):
    """The group ``--group`` (UNKNOWN_GROUP when none has that name), whatever it runs."""
    from rayledger.actors import LedgerGroup

    from ..connect import connect

    if args.timeout <= 0:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT, f"--timeout must be > 0, got {args.timeout}"
        )
    connect(args.address)
    return LedgerGroup.get(args.group)


def members_doc(group, timeout_s: float = 5.0) -> dict:
    """What ``member list`` shows: each member of the committed configuration with its
    status, the leader, the configurations (``latest`` differs from ``committed`` while a
    change is in flight), the plans under way and the lost members waiting for a node."""
    membership = group.membership(timeout_s=timeout_s)
    status = group.status()
    roles = group.roles()
    rows = []
    for m, s in status.items():
        rows.append(
            {
                "id": m,
                "role": roles.get(m) or None,
                "raft_role": s.role.value if s.alive and s.role else None,
                "term": s.term if s.alive else None,
                "leader": s.leader_id if s.alive else None,
                "begin": s.ledger_begin_index if s.alive else None,
                "end": s.ledger_end_index if s.alive else None,
                "committed": s.committed_index if s.alive else None,
                "alive": bool(s.alive),
            }
        )
    leaders = [r for r in rows if r["raft_role"] == "LEADER"]
    leader = max(leaders, key=lambda r: r["term"])["id"] if leaders else None
    latest = membership["latest"]
    joining = [{"id": new, "replaces": old or None} for new, old in latest.get("joining", ())]
    return {
        "group": group.name,
        "leader": leader,
        "members": rows,
        "joining": joining,
        "waiting": list(membership.get("waiting") or ()),
        "latest": latest,
        "committed": membership["committed"],
    }


def member_lines(doc: dict) -> list[str]:
    """``doc`` (of :func:`members_doc`) as aligned text lines: a header, one line per
    member, then what is under way."""

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return str(v)

    keys = ("id", "role", "raft_role", "term", "end", "committed", "alive")
    table = [list(COLUMNS)] + [[cell(r[k]) for k in keys] for r in doc["members"]]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]
    for j in doc["joining"]:
        then = f", then {j['replaces']} leaves" if j["replaces"] else ""
        lines.append(f"joining: {j['id']} (a voter once caught up{then})")
    latest, committed = doc["latest"], doc["committed"]
    if (latest["voters"], latest.get("learners", [])) != (
        committed["voters"],
        committed.get("learners", []),
    ):
        lines.append(
            f"change not committed yet: voters {', '.join(latest['voters'])}"
            + (f"; learners {', '.join(latest['learners'])}" if latest.get("learners") else "")
        )
    if doc["waiting"]:
        lines.append(
            f"waiting for a node: {', '.join(doc['waiting'])} (lost; each is replaced once "
            "a live node hosts no member of the group)"
        )
    return lines


def cmd_list(args) -> int:
    doc = members_doc(_group(args), timeout_s=args.timeout)
    if args.json:
        say(json.dumps(doc))
    else:
        for line in member_lines(doc):
            say(line)
    return 0


def cmd_add(args) -> int:
    group = _group(args)
    new = group.add_member(
        member_id=args.member_id, node_id=args.node_id, learner=args.learner,
        timeout_s=args.timeout,
    )  # fmt: skip
    say(new)
    return 0


def cmd_remove(args) -> int:
    group = _group(args)
    group.remove_member(args.member, timeout_s=args.timeout)
    say(f"removed {args.member} from group {args.group}")
    return 0


def cmd_replace(args) -> int:
    group = _group(args)
    new = group.replace_member(
        args.old, node_id=args.node_id, member_id=args.member_id, timeout_s=args.timeout
    )
    say(new)
    return 0


def _new_member_options(sp, metavar: str, id_help: str) -> None:
    """``--id`` and ``--node`` of a command that starts a member (add, replace)."""
    sp.add_argument("--id", dest="member_id", metavar=metavar, default=None, help=id_help)
    sp.add_argument(
        "--node",
        dest="node_id",
        default=None,
        help="Ray node id to run it on (default: a live node hosting no member of the group)",
    )


def add_commands(sub, common) -> None:
    """``rayledger member SUBCOMMAND``, each on one group (--group/--address/--timeout)."""
    member = sub.add_parser(
        "member", parents=[common], help="a group's members: list, add, remove, replace"
    )
    member.description = (
        "See and change a running group's members: list them, add one (a learner, promoted "
        "to voter once caught up), remove one, or replace one by a new member."
    )
    add = group_command_adder(member.add_subparsers(dest="member_command", required=True), common)

    def described(sp, text: str):
        sp.description = text
        return sp

    ls = described(
        add("list", "each member's role, Raft role, term and indexes", cmd_list, timeout=5.0),
        "One line per member of the committed configuration: id, voter or learner, Raft "
        "role, term, end and committed index, alive; then the changes under way and the "
        "lost members waiting for a node.",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object")

    ad = described(
        add("add", "add a member; prints its id", cmd_add, timeout=60.0),
        "Start a member and add it to the group; prints its id.  It joins as a learner, "
        "gets the log (or the leader's snapshot), and is promoted to voter once caught up "
        "-- unless --learner, when it stays a learner.",
    )
    _new_member_options(ad, "ID", "its id (default: next n<k>)")
    ad.add_argument("--learner", action="store_true", help="stay a learner (never votes)")

    rm = described(
        add("remove", "remove a member and stop it", cmd_remove, timeout=60.0),
        "Remove member ID from the group and stop it (its files stay).  Removing the "
        "leader, it hands leadership over first.  Refused with nothing changed: the last "
        "voter, a change leaving no majority of live voters, another change in flight.",
    )
    rm.add_argument("member", metavar="ID", help="the member to remove")

    rp = described(
        add("replace", "replace a member by a new one; prints its id", cmd_replace, timeout=120.0),
        "Replace member OLD: a new member joins as a learner, is promoted once caught up, "
        "then OLD leaves and stops; prints the new id.  The leader carries the plan on, so "
        "it is safe to run again when interrupted: it picks up the replacement under way.",
    )
    rp.add_argument("old", metavar="OLD", help="the member to replace")
    _new_member_options(rp, "NEW", "the new member's id (default: next n<k>)")
