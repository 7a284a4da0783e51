"""KvMachine: a dict replicated through the ledger, with etcd-style revisions.

Commands are JSON entry bodies: ``{"op": "set", "key": k, "value": v, "rev": "0000000000"}``
or ``{"op": "del", ...}``.  The leader stamps each command's ``rev`` with the entry's index
before the write (``pre_append``, same length), so every member stores the same revision and
a reader learns which entry last changed a key.  The machine keeps no file of its own: its
snapshots (a sorted Arrow file, ``kv.arrow``) are its state on disk, and a restarted member
loads the newest and replays the log after it.

Queries: ``{"get": key}`` -> ``[value, rev]`` or None; ``{"keys": True}`` -> sorted keys;
``{"scan": prefix, "limit": n}`` -> ``[[key, value, rev], ...]`` in key order (``limit``
optional); ``{"cas": index}`` ->
whether the compare-and-set at ``index`` swapped (None: not a recent one).

Commands of :class:`~.client.KVClient`: ``put`` (a bytes value, base64 in the
body, held as bytes), ``del``, and ``cas`` (put only when the key holds
``expected`` -- None: absent; every member decides alike, and keeps the last
``CAS_RESULTS`` outcomes by index for the appender to ask).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.feather as feather
from rayledger.actors.machine import MachineContext, StateMachine
from rayledger.storage import Entry, LedgerError, ResponseCode
from sortedcontainers import SortedDict

_REV_FIELD = b'"rev": "0000000000"'
_REV_DIGITS = 10


def set_command(key: str, value: Any) -> bytes:
    """The entry body that sets ``key`` to ``value`` (any JSON value)."""
    return json.dumps({"op": "set", "key": key, "value": value, "rev": "0" * _REV_DIGITS}).encode()


def delete_command(key: str) -> bytes:
    return json.dumps({"op": "del", "key": key, "rev": "0" * _REV_DIGITS}).encode()


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def put_command(key: str, value: bytes) -> bytes:
    """The entry body that puts bytes ``value`` at ``key``."""
    return json.dumps(
        {"op": "put", "key": key, "b64": _b64(value), "rev": "0" * _REV_DIGITS}
    ).encode()


def cas_command(key: str, expected: bytes | None, value: bytes) -> bytes:
    """Put ``value`` at ``key`` only if it holds ``expected`` (None: only if absent)."""
    return json.dumps({"op": "cas", "key": key, "exp": _b64(expected), "b64": _b64(value),
                       "rev": "0" * _REV_DIGITS}).encode()  # fmt: skip


def value_bytes(value: Any) -> Any:
    """A stored value as the client put it: bytes for ``put``/``cas``, the JSON value of a
    ``set``."""
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value


CAS_RESULTS = 10_000  # compare-and-set outcomes kept for their appenders (the newest)
SNAPSHOT_FILE = "kv.arrow"  # the map sorted by key, one row per key (Arrow IPC, uncompressed)


class KvMachine(StateMachine):
    """The map lives in memory, sorted by key (``SortedDict``: a prefix scan costs the keys
    it returns, not the whole map); applying a batch costs its entries only.  Its state on
    disk is the member's snapshots: ``open`` keeps nothing of its own, so the member starts
    from the newest snapshot that verifies and replays the log after it (the whole log when
    the group takes no snapshots)."""

    def __init__(self) -> None:
        self.data: SortedDict = SortedDict()  # key -> (value, revision); bytes for put/cas
        self.applied = -1
        self.cas_results: dict[int, bool] = {}  # index of a cas -> whether it swapped

    def open(self, ctx: MachineContext) -> int:
        return self.applied

    def pre_append(self, index: int, pos: int, body: bytearray) -> None:
        at = body.find(_REV_FIELD)
        if at >= 0:
            start = at + len(_REV_FIELD) - 1 - _REV_DIGITS
            body[start : start + _REV_DIGITS] = b"%010d" % index

    def apply(self, entries: list[Entry]) -> None:
        # each body parsed on its own: a batch's bodies parsed as one JSON array would let
        # two malformed bodies form one command, on members whose batches join them only
        loads = json.loads
        for e in entries:
            if e.body:  # a term's first entry is empty
                try:
                    doc = loads(e.body)
                except ValueError:
                    doc = None  # not a command: skipped alike everywhere
                self._apply_one(e.index, doc)
            self.applied = e.index

    def _apply_one(self, index: int, cmd: Any) -> None:
        try:
            op, key, rev = cmd["op"], cmd["key"], int(cmd["rev"])
        except (KeyError, TypeError, ValueError):
            return  # not a command: entries of other writers are skipped alike everywhere
        if not isinstance(key, str):
            return
        if op == "set":
            self.data[key] = (cmd.get("value"), rev)
        elif op == "put":
            self.data[key] = (_unb64(cmd.get("b64")), rev)
        elif op == "del":
            self.data.pop(key, None)
        elif op == "cas":
            held = self.data.get(key)
            now = None if held is None else held[0]
            swapped = now == _unb64(cmd.get("exp"))
            if swapped:
                self.data[key] = (_unb64(cmd.get("b64")), rev)
            self.cas_results[index] = swapped
            if len(self.cas_results) > CAS_RESULTS:
                del self.cas_results[next(iter(self.cas_results))]  # the oldest (in order)

    def snapshot(self) -> Callable[[str], None]:
        """The map as it stands (a shallow copy of its items: a key's pair is a tuple that
        applying replaces, never changes), written sorted by key into ``kv.arrow``."""
        items, applied, cas = list(self.data.items()), self.applied, dict(self.cas_results)

        def write(directory: str) -> None:
            write_snapshot(os.path.join(directory, SNAPSHOT_FILE), items, applied, cas)

        return write

    def load_snapshot(self, path: str, index: int) -> None:
        data, applied, cas = read_snapshot(os.path.join(path, SNAPSHOT_FILE))
        # a cut right after configuration entries (the group's, never applied here) is at
        # their index, past the last entry this machine applied; never before it
        if applied > index:
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"snapshot {path} holds the state at {applied}, past {index}",
            )
        self.data, self.applied, self.cas_results = data, applied, cas  # the state it holds

    def query(self, request: Any) -> Any:
        if isinstance(request, dict) and "get" in request:
            got = self.data.get(request["get"])
            return None if got is None else list(got)
        if isinstance(request, dict) and request.get("keys"):
            return list(self.data.keys())
        if isinstance(request, dict) and isinstance(request.get("scan"), str):
            return [[k, *v] for k, v in self.scan(request["scan"], request.get("limit"))]
        if isinstance(request, dict) and isinstance(request.get("cas"), int):
            return self.cas_results.get(request["cas"])
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT,
            "KvMachine answers {'get': key}, {'keys': True}, {'scan': prefix} or "
            f"{{'cas': index}}, not {request!r}",
        )

    def scan(self, prefix: str, limit: int | None = None) -> list[tuple[str, tuple]]:
        """``(key, (value, revision))`` of the keys starting with ``prefix``, in key order
        (at most ``limit``)."""
        out = []
        for k in self.data.irange(minimum=prefix):
            if not k.startswith(prefix) or (limit is not None and len(out) >= limit):
                break
            out.append((k, self.data[k]))
        return out


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def write_snapshot(path: str, items: list, applied: int, cas: dict[int, bool]) -> None:
    """The map's ``(key, (value, revision))`` items, sorted by key, as an Arrow IPC file:
    columns key, revision, raw (a put's bytes, or a set's JSON) and whether raw is JSON;
    the applied index and the compare-and-set outcomes in the schema's metadata."""
    keys, revs, raws, is_json = [], [], [], []
    for k, (value, rev) in items:
        keys.append(k)
        revs.append(rev)
        if isinstance(value, bytes):
            raws.append(value)
            is_json.append(False)
        else:
            raws.append(json.dumps(value).encode())
            is_json.append(True)
    meta = {"applied": str(applied), "cas": json.dumps({str(i): v for i, v in cas.items()})}
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "revision": pa.array(revs, pa.int64()),
            "raw": pa.array(raws, pa.binary()),
            "json": pa.array(is_json, pa.bool_()),
        }
    ).replace_schema_metadata(meta)
    feather.write_feather(table, path, compression="uncompressed")


def read_snapshot(path: str) -> tuple[SortedDict, int, dict[int, bool]]:
    """What :func:`write_snapshot` wrote: (map, applied index, compare-and-set outcomes)."""
    table = feather.read_table(path, memory_map=False)
    meta = table.schema.metadata or {}
    applied = int(meta[b"applied"])
    cas = {int(i): bool(v) for i, v in json.loads(meta[b"cas"]).items()}
    raws, flags = table["raw"].to_pylist(), table["json"].to_pylist()
    values = [
        (json.loads(r) if j else r, rev)
        for r, j, rev in zip(raws, flags, table["revision"].to_pylist(), strict=True)
    ]
    return SortedDict(zip(table["key"].to_pylist(), values, strict=True)), applied, cas
