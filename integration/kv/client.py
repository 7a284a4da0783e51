"""KVClient: an etcd-style key-value store on a group running :class:`~.machine.KvMachine`
(put, get, delete, compare-and-set, prefix scans and watches; ``rayledger kv`` on the
command line).

Keys are non-empty strings, values bytes.  Writes are appends (with ``LedgerClient``'s
error model: a coded :class:`~rayledger.storage.LedgerError`, ``OutcomeUnknownError`` when
the outcome is unknown); each returns its revision, the index of its entry.  Reads are
machine queries at ``consistency`` (``linearizable`` by default, ``lease`` or
``committed``), from the leader or ``member`` (a member id or ``"any"``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from rayledger.actors.config import LedgerConfig
from rayledger.actors.group import LedgerGroup
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

from .machine import cas_command, delete_command, put_command, value_bytes

MACHINE = "rayledger.integration.kv:KvMachine"
WATCH_READ = 1024  # entries a watch reads per call


@dataclass(frozen=True, slots=True)
class KVChange:
    """One change a watch sees: ``op`` is ``"put"`` (``value`` set) or ``"delete"``;
    ``revision`` is the index of its entry."""

    revision: int
    op: str
    key: str
    value: bytes | None


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, f"a key is a non-empty str, not {key!r}"
        )
    return key


def _value(value: object, what: str = "value") -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, f"a {what} is bytes, not {type(value).__name__}"
        )
    return bytes(value)


class KVClient:
    def __init__(self, group: LedgerGroup, timeout_s: float = 30.0):
        self.group = group
        self.client = group.client(timeout_s=timeout_s)

    @classmethod
    def create(
        cls, name: str, members: int = 3, store_dir: str | None = None,
        config: LedgerConfig | None = None,
    ) -> KVClient:  # fmt: skip
        """A new group running the KV machine (``config``'s other settings kept)."""
        config = config or LedgerConfig()
        if config.state_machine not in (None, MACHINE):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"a KV group runs {MACHINE}, not {config.state_machine!r}",
            )
        group = LedgerGroup.create(name, members, store_dir=store_dir,
                                   config=replace(config, state_machine=MACHINE))  # fmt: skip
        group.wait_for_leader(timeout_s=60)
        return cls(group)

    @classmethod
    def connect(cls, name: str) -> KVClient:
        return cls(LedgerGroup.get(name))

    # -- writes ------------------------------------------------------------------------------
    def put(self, key: str, value: bytes) -> int:
        """Set ``key`` to ``value``; returns the revision."""
        return self.client.append(put_command(_key(key), _value(value))).index

    def delete(self, key: str) -> int:
        return self.client.append(delete_command(_key(key))).index

    def cas(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Set ``key`` to ``value`` if it holds ``expected`` (None: if absent); True when it
        swapped.  Every member decides alike when it applies the entry; the answer is read
        back from the leader's machine."""
        exp = None if expected is None else _value(expected, "expected value")
        r = self.client.append(cas_command(_key(key), exp, _value(value)))
        swapped = self.client.query({"cas": r.index}, consistency="linearizable")
        if swapped is None:  # more than CAS_RESULTS compare-and-sets since: not kept
            raise OutcomeUnknownError(
                ResponseCode.APPEND_OUTCOME_UNKNOWN,
                f"the compare-and-set at {r.index} committed; its outcome is no longer kept",
            )
        return bool(swapped)

    # -- reads -------------------------------------------------------------------------------
    def get(self, key: str, consistency: str = "linearizable", member: str | None = None):
        """The value of ``key`` (bytes), or None when absent."""
        got = self.client.query({"get": _key(key)}, consistency=consistency, member=member)
        return None if got is None else value_bytes(got[0])

    def scan(self, prefix: str = "", consistency: str = "linearizable", member: str | None = None):
        """``(key, value)`` pairs whose key starts with ``prefix``, in key order."""
        if not isinstance(prefix, str):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"a prefix is a str, not {prefix!r}"
            )
        rows = self.client.query({"scan": prefix}, consistency=consistency, member=member)
        return [(k, value_bytes(v)) for k, v, _rev in rows]

    def watch(
        self, prefix: str = "", from_index: int = 0, poll_s: float = 0.05
    ) -> Iterator[KVChange]:
        """The changes of keys starting with ``prefix``, from entry ``from_index`` on, in
        commit order, forever (break out of it); it polls the committed index every
        ``poll_s`` once it has caught up.  A compare-and-set is a change only when it
        swapped.  INDEX_OUT_OF_BOUNDS when ``from_index`` is below what the group still
        keeps (compacted: scan, then watch from the scan's revision)."""
        if not isinstance(prefix, str):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"a prefix is a str, not {prefix!r}"
            )
        if type(from_index) is not int or from_index < 0:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"from_index: an int >= 0, not {from_index!r}"
            )
        nxt = from_index
        while True:
            committed = self.client.committed_index()
            if committed < nxt:
                time.sleep(poll_s)
                continue
            stop = min(committed + 1, nxt + WATCH_READ)
            for e in self.client.read(nxt, stop, consistency="committed"):
                if e.channel:  # a configuration entry: the group's, no command
                    continue
                change = self._change(e.index, e.body, prefix)
                if change is not None:
                    yield change
            nxt = stop

    def _change(self, index: int, body: bytes, prefix: str) -> KVChange | None:
        try:
            cmd = json.loads(body)
            op, key = cmd["op"], cmd["key"]
        except (ValueError, KeyError, TypeError):
            return None  # a term's empty entry, or not a command
        if not isinstance(key, str) or not key.startswith(prefix):
            return None
        if op == "del":
            return KVChange(index, "delete", key, None)
        if op == "set":
            return KVChange(index, "put", key, value_bytes(cmd.get("value")))
        if op == "put":
            return KVChange(index, "put", key, value_bytes({"b64": cmd.get("b64")}))
        if op == "cas":
            swapped = self.client.query({"cas": index}, consistency="linearizable")
            if swapped is None:
                raise OutcomeUnknownError(
                    ResponseCode.APPEND_OUTCOME_UNKNOWN,
                    f"whether the compare-and-set at {index} swapped is no longer kept",
                )
            return (
                KVChange(index, "put", key, value_bytes({"b64": cmd.get("b64")}))
                if swapped
                else None
            )
        return None

    def close(self) -> None:
        self.client.close()
