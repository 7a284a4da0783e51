"""The parser's building blocks every command family shares (main, ops and mq)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


class Parser(argparse.ArgumentParser):
    """Bad options and values are errors like the others: a code and a next step, exit 2."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"error: [UNEXPECTED_ARGUMENT] {message}; see `{self.prog} --help`\n")


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes."""
    common = Parser(add_help=False)
    common.add_argument(
        "--verbose", "-v", action="store_true", help="also show Ray's and Spark's own output"
    )
    return common


def with_group(sp: argparse.ArgumentParser, timeout: float = 30.0) -> argparse.ArgumentParser:
    """``--group``, ``--address`` and ``--timeout``: what a command on one group needs."""
    sp.add_argument("--group", "-g", required=True, help="group name")
    sp.add_argument("--address", default=None, help="Ray address (default: the running cluster)")
    sp.add_argument("--timeout", type=float, default=timeout, help="seconds to wait")
    return sp


def or_topic(sp: argparse.ArgumentParser, help: str) -> None:
    """``--group`` or ``--topic``: a command that works on either (:func:`one_target` says
    which it got)."""
    for action in sp._actions:
        if "--group" in action.option_strings:
            action.required = False
    sp.add_argument("--topic", "-t", default=None, help=help)


def one_target(args) -> bool:
    """Whether a command that takes ``--group`` or ``--topic`` got the topic (exactly one of
    them, else UNEXPECTED_ARGUMENT)."""
    from rayledger.storage import LedgerError, ResponseCode

    if (args.group is None) == (args.topic is None):
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "pass one of --group and --topic")
    return args.topic is not None


AddCommand = Callable[..., argparse.ArgumentParser]


def group_command_adder(subparsers, common: argparse.ArgumentParser) -> AddCommand:
    """``add(name, help, func, timeout=30.0)``: a subcommand on one group that runs ``func``."""

    def add(name: str, help: str, func, timeout: float = 30.0) -> argparse.ArgumentParser:
        sp = with_group(subparsers.add_parser(name, parents=[common], help=help), timeout)
        sp.set_defaults(func=func)
        return sp

    return add


DATA_ENV = "RAYLEDGER_DATA"
DEFAULT_DATA = "~/.rayledger/data"
"""Where ``start`` keeps a group's files unless told otherwise: on every node, the same path
(``$RAYLEDGER_DATA``, else ``~/.rayledger/data``), one directory per group and member."""


def add_start_options(sp: argparse.ArgumentParser, members_help: str) -> argparse.ArgumentParser:
    """What ``start`` (of a plain, RocketMQ or KV group) takes: members, store and timers."""
    sp.add_argument("--members", default="3", help=members_help)
    sp.add_argument(
        "--store-dir",
        default=None,
        help=f"file store root on every node (default: ${DATA_ENV}, else {DEFAULT_DATA}); "
        "a member that restarts recovers from it",
    )
    sp.add_argument(
        "--memory", action="store_true", help="keep the log in memory only (lost on a restart)"
    )
    sp.add_argument("--fast", action="store_true", help="short election timers (heartbeat 100 ms)")
    return sp


def store_dir_of(args) -> str | None:
    """The store root ``start`` uses: ``--store-dir``, else the per-node default; None with
    ``--memory`` (UNEXPECTED_ARGUMENT with both)."""
    import os

    from rayledger.storage import LedgerError, ResponseCode

    if args.memory and args.store_dir is not None:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT, "--memory and --store-dir exclude each other"
        )
    if args.memory:
        return None
    return os.path.expanduser(args.store_dir or os.environ.get(DATA_ENV) or DEFAULT_DATA)


def parse_members(text: str) -> int | list[str]:
    """``--members``: a count (``3``) or comma-separated member ids (``n0,n1,n2``)."""
    from rayledger.storage import LedgerError, ResponseCode

    text = text.strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    ids = [m.strip() for m in text.split(",")]
    if "," not in text or not all(ids) or len(set(ids)) != len(ids):
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"--members must be a count > 0 or distinct comma-separated member ids, got {text!r}",
        )
    return ids


def start_group(args, create: Callable) -> int:
    """``start`` of a plain, RocketMQ or KV group: ``create(name, members, store_dir,
    config)`` returns its LedgerGroup; prints the group, its members and its leader."""
    import json

    from rayledger.actors import LedgerConfig

    from ..connect import connect
    from .output import say

    members = parse_members(args.members)
    connect(args.address)
    config = LedgerConfig.fast() if args.fast else LedgerConfig()
    group = create(args.group, members, store_dir_of(args), config)
    leader = group.wait_for_leader(timeout_s=args.timeout)
    say(json.dumps({"group": args.group, "members": group.members, "leader": leader}))
    return 0


def group_running(args, machine: str, what: str, start: str):
    """The group ``--group`` on ``--address``: UNKNOWN_GROUP when none has that name,
    UNEXPECTED_ARGUMENT when it does not run ``machine`` (``what``; ``start`` says how to
    get one)."""
    from rayledger.actors import LedgerGroup
    from rayledger.storage import LedgerError, ResponseCode

    from ..connect import connect

    connect(args.address)
    group = LedgerGroup.get(args.group)
    if group.config.state_machine != machine:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"group {args.group!r} does not run {what} ({start})",
        )
    return group
