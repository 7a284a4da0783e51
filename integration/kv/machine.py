"""KvMachine: a dict replicated through the ledger, with etcd-style revisions.

Commands are JSON entry bodies: ``{"op": "set", "key": k, "value": v, "rev": "0000000000"}``
or ``{"op": "del", ...}``.  The leader stamps each command's ``rev`` with the entry's index
before the write (``pre_append``, same length), so every member stores the same revision and
a reader learns which entry last changed a key.  The map and the applied index are saved
atomically after every applied batch, which makes the machine restart-safe: ``open``
returns the saved index and the member replays what came after.

Queries: ``{"get": key}`` -> ``[value, rev]`` or None; ``{"keys": True}`` -> sorted keys;
``{"scan": prefix}`` -> ``[[key, value, rev], ...]`` in key order; ``{"cas": index}`` ->
whether the compare-and-set at ``index`` swapped (None: not a recent one).

Commands of :class:`~.client.KVClient` (issue 23): ``put`` (a bytes value, base64 in the
body, stored as ``{"b64": ...}``), ``del``, and ``cas`` (put only when the key holds
``expected`` -- None: absent; every member decides alike, and keeps the last
``CAS_RESULTS`` outcomes by index for the appender to ask).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from typing import Any

from rayledger.actors.machine import MachineContext, StateMachine
from rayledger.storage import Entry, LedgerError, ResponseCode

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


def _cas(saved: dict) -> dict[int, bool]:
    return {int(k): bool(v) for k, v in saved.get("cas", {}).items()}


class KvMachine(StateMachine):
    def __init__(self) -> None:
        self.data: dict[str, list] = {}  # key -> [value, revision]
        self.applied = -1
        self.cas_results: dict[int, bool] = {}  # index of a cas -> whether it swapped
        self.path: str | None = None

    def open(self, ctx: MachineContext) -> int:
        if ctx.data_dir is not None:
            os.makedirs(ctx.data_dir, exist_ok=True)
            self.path = os.path.join(ctx.data_dir, "kv.json")
            if os.path.exists(self.path):
                with open(self.path) as f:
                    saved = json.load(f)
                self.data, self.applied = saved["data"], saved["applied"]
                self.cas_results = _cas(saved)
        return self.applied

    def pre_append(self, index: int, pos: int, body: bytearray) -> None:
        at = body.find(_REV_FIELD)
        if at >= 0:
            start = at + len(_REV_FIELD) - 1 - _REV_DIGITS
            body[start : start + _REV_DIGITS] = b"%010d" % index

    def apply(self, entries: list[Entry]) -> None:
        for e in entries:
            if e.body:  # a term's first entry is empty
                self._apply_one(e)
            self.applied = e.index
        self._save()

    def _apply_one(self, e: Entry) -> None:
        try:
            cmd = json.loads(e.body)
            op, key, rev = cmd["op"], cmd["key"], int(cmd["rev"])
        except (ValueError, KeyError, TypeError):
            return  # not a command: entries of other writers are skipped alike everywhere
        if op == "set":
            self.data[key] = [cmd.get("value"), rev]
        elif op == "put":
            self.data[key] = [{"b64": cmd.get("b64")}, rev]
        elif op == "del":
            self.data.pop(key, None)
        elif op == "cas":
            held = self.data.get(key)
            now = None if held is None else held[0]
            want = None if cmd.get("exp") is None else {"b64": cmd["exp"]}
            swapped = now == want
            if swapped:
                self.data[key] = [{"b64": cmd.get("b64")}, rev]
            self.cas_results[e.index] = swapped
            if len(self.cas_results) > CAS_RESULTS:
                del self.cas_results[next(iter(self.cas_results))]  # the oldest (in order)

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"data": self.data, "applied": self.applied, "cas": self.cas_results}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def snapshot(self) -> Callable[[str], None]:
        """The map as it stands (a shallow copy: applying replaces a key's pair, never
        changes it), written sorted by key into ``kv.json`` of the snapshot directory."""
        data, applied, cas = dict(self.data), self.applied, dict(self.cas_results)

        def write(directory: str) -> None:
            with open(os.path.join(directory, "kv.json"), "w") as f:
                json.dump({"data": data, "applied": applied, "cas": cas}, f, sort_keys=True)

        return write

    def load_snapshot(self, path: str, index: int) -> None:
        with open(os.path.join(path, "kv.json")) as f:
            saved = json.load(f)
        if saved["applied"] != index:
            raise LedgerError.of(
                ResponseCode.INCONSISTENT_STATE,
                f"snapshot {path} holds the state at {saved['applied']}, not {index}",
            )
        self.data, self.applied = saved["data"], index
        self.cas_results = _cas(saved)
        self._save()

    def query(self, request: Any) -> Any:
        if isinstance(request, dict) and "get" in request:
            return self.data.get(request["get"])
        if isinstance(request, dict) and request.get("keys"):
            return sorted(self.data)
        if isinstance(request, dict) and isinstance(request.get("scan"), str):
            p = request["scan"]
            return [[k, *self.data[k]] for k in sorted(self.data) if k.startswith(p)]
        if isinstance(request, dict) and isinstance(request.get("cas"), int):
            return self.cas_results.get(request["cas"])
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT,
            "KvMachine answers {'get': key}, {'keys': True}, {'scan': prefix} or "
            f"{{'cas': index}}, not {request!r}",
        )
