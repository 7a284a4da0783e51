"""``rayledger kv``: the key-value store of a group running the KV machine, like etcdctl.

``put`` sets a key (a UTF-8 VALUE, ``--file PATH`` or ``-`` for stdin's bytes) and prints
its revision; ``get`` prints a value (UTF-8 text, base64 with a note on stderr when it is
not UTF-8, or its bytes with ``--raw``); ``del`` deletes a key; ``scan`` prints
``key<TAB>value`` lines in key order; ``watch`` prints ``revision<TAB>op<TAB>key<TAB>value``
lines as changes commit, until ``--count`` changes or Ctrl-C.  ``--json`` prints one JSON
object per line instead.  A missing key is ``error: ...`` on stderr and exit status 1 (there
is no DLedger code for it); every other error is a coded line, exit status 2.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
from collections.abc import Iterator

from rayledger.storage import LedgerError, ResponseCode

from . import output
from .options import add_start_options, group_command_adder, group_running, start_group
from .output import say

CONSISTENCY = ("linearizable", "lease", "committed")


@contextlib.contextmanager
def _kv(args) -> Iterator:
    """A KVClient on ``--group``, closed after the command; UNKNOWN_GROUP when no group has
    that name, UNEXPECTED_ARGUMENT when the group does not run the KV machine."""
    from rayledger.integration.kv import KVClient
    from rayledger.integration.kv.client import MACHINE

    group = group_running(args, MACHINE, "the key-value store",
                          "create one with `rayledger kv start` or KVClient.create")  # fmt: skip
    kv = KVClient(group, timeout_s=args.timeout)
    try:
        yield kv
    finally:
        kv.close()


def _key(key: str) -> str:
    if not key:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "KEY must be a non-empty string")
    return key


def _text(value) -> tuple[str, str]:
    """A value as text and its encoding: ``utf-8``, ``base64`` when the bytes are not UTF-8,
    or ``json`` for a value a ``set_command`` stored (any JSON value)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            return base64.b64encode(value).decode(), "base64"
    return json.dumps(value), "json"


def _positive(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{name} must be > 0, got {value}")


def _write_bytes(data: bytes) -> None:
    """``data`` as is on the command's own stdout (an unbuffered file may take it in parts)."""
    out = output._out()
    out.flush()
    view = memoryview(data)
    while view:
        view = view[out.buffer.write(view) or 0 :]
    out.buffer.flush()


def cmd_put(args) -> int:
    given = [x for x in (args.value, args.file) if x is not None]
    if len(given) != 1:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT,
            "give exactly one of VALUE, `-` (stdin) or --file PATH",
        )
    if args.file is not None:
        try:
            with open(args.file, "rb") as f:
                value = f.read()
        except OSError as exc:
            raise LedgerError(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"cannot read --file {args.file}: {exc.strerror or exc}",
            ) from exc
    elif args.value == "-":
        value = sys.stdin.buffer.read()
    else:
        value = args.value.encode()
    key = _key(args.key)
    with _kv(args) as kv:
        revision = kv.put(key, value)
    say(json.dumps({"key": key, "revision": revision}) if args.json else revision)
    return 0


def cmd_get(args) -> int:
    key = _key(args.key)
    with _kv(args) as kv:
        value = kv.get(key, consistency=args.consistency, member=args.member)
    if value is None:
        output.error(f"error: key {key!r} not found in group {args.group!r}", show_log=False)
        output.finish(True)  # an absent key is an answer, not a failure: drop Ray's log
        return 1
    if args.raw:
        data = value if isinstance(value, (bytes, bytearray)) else json.dumps(value).encode()
        _write_bytes(bytes(data))
        return 0
    text, enc = _text(value)
    if args.json:
        say(json.dumps({"key": key, "value": text, "encoding": enc}))
        return 0
    if enc == "base64":
        note = "note: the value is not UTF-8, shown as base64 (--raw writes its bytes)"
        output.error(note, show_log=False)
    say(text)
    return 0


def cmd_del(args) -> int:
    key = _key(args.key)
    with _kv(args) as kv:
        revision = kv.delete(key)
    say(json.dumps({"key": key, "revision": revision}) if args.json else revision)
    return 0


def cmd_scan(args) -> int:
    from rayledger.integration.kv import value_bytes

    _positive("--limit", args.limit)
    with _kv(args) as kv:
        if args.limit is None:
            rows = kv.scan(args.prefix, consistency=args.consistency, member=args.member)
        else:  # the machine stops at the limit: only those rows cross the wire
            request = {"scan": args.prefix, "limit": args.limit}
            got = kv.client.query(request, consistency=args.consistency, member=args.member)
            rows = [(k, value_bytes(v)) for k, v, _rev in got]
    for key, value in rows:
        text, enc = _text(value)
        row = {"key": key, "value": text, "encoding": enc}
        say(json.dumps(row) if args.json else f"{key}\t{text}")
    return 0


def cmd_watch(args) -> int:
    _positive("--count", args.count)
    if args.poll <= 0:
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"--poll must be > 0, got {args.poll}")
    if args.from_index is not None and args.from_index < 0:
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT, f"--from-index must be >= 0, got {args.from_index}"
        )
    seen = 0
    with _kv(args) as kv:
        start = args.from_index
        if start is None:  # from now on
            start = kv.client.committed_index() + 1
        changes = kv.watch(args.prefix, from_index=start, poll_s=args.poll)
        try:
            for c in changes:
                text, enc = ("", None) if c.value is None else _text(c.value)
                if args.json:
                    value = None if enc is None else text
                    row = {"revision": c.revision, "op": c.op, "key": c.key, "value": value}
                    say(json.dumps({**row, "encoding": enc}))
                else:
                    say(f"{c.revision}\t{c.op}\t{c.key}\t{text}")
                seen += 1
                if args.count is not None and seen >= args.count:
                    break
        except KeyboardInterrupt:
            pass
        finally:
            changes.close()
    return 0


def cmd_start(args) -> int:
    from rayledger.integration.kv import KVClient

    def create(*a):
        kv = KVClient.create(*a)
        kv.close()
        return kv.group

    return start_group(args, create)


def add_commands(sub, common) -> None:
    """``rayledger kv SUBCOMMAND``, each on one group (--group/--address/--timeout)."""
    kv = sub.add_parser("kv", parents=[common], help="the key-value store: put, get, scan, ...")
    add = group_command_adder(kv.add_subparsers(dest="kv_command", required=True), common)

    def reads(sp) -> None:
        sp.add_argument("--consistency", choices=CONSISTENCY, default="linearizable")
        sp.add_argument("--member", default=None, help="read from this member (or `any`)")
        sp.add_argument("--json", action="store_true", help="one JSON object per line")

    st = add("start", "start a group running the key-value store", cmd_start)
    add_start_options(st, "how many members")
    pu = add("put", "set KEY to VALUE; prints the revision", cmd_put)
    pu.add_argument("key")
    pu.add_argument("value", nargs="?", default=None, help="UTF-8 text, or `-` for stdin's bytes")
    pu.add_argument("--file", default=None, help="the value is this file's bytes")
    pu.add_argument("--json", action="store_true", help="a JSON object with the revision")
    gt = add("get", "print KEY's value (exit 1 when it is absent)", cmd_get)
    gt.add_argument("key")
    reads(gt)
    gt.add_argument("--raw", action="store_true", help="write the value's bytes to stdout")
    de = add("del", "delete KEY; prints the revision", cmd_del)
    de.add_argument("key")
    de.add_argument("--json", action="store_true", help="a JSON object with the revision")
    sc = add("scan", "print `key<TAB>value` of the keys starting with PREFIX, in order", cmd_scan)
    sc.add_argument("prefix", nargs="?", default="")
    reads(sc)
    sc.add_argument("--limit", type=int, default=None, help="at most N keys")
    wa = add("watch", "print changes of keys starting with PREFIX as they commit", cmd_watch)
    wa.add_argument("prefix", nargs="?", default="")
    wa.add_argument(
        "--from-index",
        type=int,
        default=None,
        help="first log index to replay (default: only changes from now on)",
    )
    wa.add_argument("--count", type=int, default=None, help="stop after N changes")
    wa.add_argument("--poll", type=float, default=0.05, help="seconds between polls")
    wa.add_argument("--json", action="store_true", help="one JSON object per change")
