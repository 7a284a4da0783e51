"""State machines run by every member (DLedger's StateMachine, PySyncObj's ``@replicated``).

A group names its machine by import path in ``LedgerConfig(state_machine="pkg.mod:Class")``; every
member imports it and builds its own instance (never unpickled from disk).  The member drives it
through :class:`Applier`, whose runner core (:class:`~rayledger.actors.core.machine.MachineCore`)
makes every decision around it; both are Ray-free, so the simulation runs the same code:

* ``open(ctx)`` once per member lifetime; returns the last index the machine has applied
  and made durable itself (-1 for none).  The member replays committed entries after it,
  so ``apply`` sees every committed entry in order, at most once per lifetime.
* ``apply(entries)`` with committed entries in index order (a term's first entry has an
  empty body: machines usually skip empty bodies).  A group's configuration entries
  (on their own channel) are the group's, not the machine's: ``apply`` never
  sees them, so the indexes it is given skip theirs.
* ``pre_append(index, pos, body)`` on the leader, before the write: it may rewrite the
  ``bytearray`` body in place with the same length (DLedger's AppendHook; RocketMQ stamps
  the physical offset this way).  Not called for a configuration entry.
* ``on_role_change(role, term)``, and ``ready_to_lead()``: appends are refused with
  LEADER_NOT_READY until it says True (RocketMQ waits until dispatch caught up).
* ``query(request)`` answers ``client.query(request, consistency=...)`` once the member has
  applied everything the read consistency requires.
* ``snapshot()`` at a consistent cut: on the machine's thread, right after a
  whole batch, every ``snapshot_every_entries`` (or ``snapshot_every_bytes``); returns a
  function that writes that state into an empty directory, run on another thread while
  the machine applies on (so it must capture an immutable copy), or None (no snapshots).
  The member seals the directory (checksums, atomic rename), keeps the newest
  ``snapshot_keep`` and lets its log be compacted up to the newest.
* ``load_snapshot(path, index)``: at the start, before any ``apply``, when the newest
  snapshot that verifies is newer than what ``open`` returned -- and later, between two
  batches, when a snapshot installed from the leader is ahead of the machine (its log was
  reset past where it stands): the machine's state becomes the state after entry
  ``index`` (whatever it held before is replaced), and the member applies what comes after.
* ``saved_index()``: the last index whose effects the machine has made durable on its own
  (a checkpoint), asked after every batch; the member's log may be compacted up to it.
  Default: what ``open`` returned.
* ``rebase(index)``: for a machine that takes no snapshots, when its member's log was reset
  past where it stands (it was away while the group compacted): the entries up to
  ``index`` are gone for good; continue after it, keeping what can be rebuilt from the log
  (the RocketMQ commit log starts its consume queues over at the first message it sees).
  Default: UNSUPPORTED (the machine then fails: its state is unknown).
* ``close()`` when the member stops.

Only ``apply`` is required; :class:`StateMachine` supplies the rest.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayledger.actors.core import machine as mcore
from rayledger.actors.core.machine import MachineCore
from rayledger.actors.core.snapshot_policy import SnapshotConfig, SnapshotPolicy
from rayledger.actors.naming import now_ms
from rayledger.election import Role
from rayledger.storage import Entry, LedgerError, ResponseCode
from rayledger.storage.snapshots import SnapshotStore


@dataclass(frozen=True)
class MachineContext:
    """What a machine learns about where it runs."""

    group: str
    member: str
    data_dir: str | None  # the member's directory (None for a memory store): keep files here
    args: dict
    log: Any = None  # the member's store, to read committed entries (never to write)


class StateMachine:
    """Base class with the optional hooks; subclasses override ``apply`` at least."""

    def open(self, ctx: MachineContext) -> int:
        return -1

    def apply(self, entries: list[Entry]) -> None:
        raise NotImplementedError

    def pre_append(self, index: int, pos: int, body: bytearray) -> None:
        pass

    def receipt(self, first: int, last: int) -> list | None:
        """On the leader, once entries ``first..last`` committed: one value per entry for the
        appender (``AppendResult.receipt``), e.g. what ``pre_append`` stamped into them, so
        the client need not read them back.  None: no receipts."""
        return None

    def on_role_change(self, role: Role, term: int) -> None:
        pass

    def ready_to_lead(self) -> bool:
        return True

    def query(self, request: Any) -> Any:
        raise LedgerError.of(ResponseCode.UNSUPPORTED, f"{type(self).__name__} answers no queries")

    def snapshot(self) -> Callable[[str], None] | None:
        return None

    def load_snapshot(self, path: str, index: int) -> None:
        raise LedgerError.of(ResponseCode.UNSUPPORTED, f"{type(self).__name__} takes no snapshots")

    def saved_index(self) -> int:
        return -1

    def rebase(self, index: int) -> None:
        raise LedgerError.of(
            ResponseCode.UNSUPPORTED,
            f"{type(self).__name__} cannot continue after {index}: the entries before are "
            "gone from the log and it takes no snapshots",
        )

    def close(self) -> None:
        pass


def load_machine(path: str) -> StateMachine:
    """Build the machine named ``"package.module:Class"`` (UNEXPECTED_ARGUMENT otherwise)."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"state_machine must be 'package.module:Class', got {path!r}",
        )
    module, name = path.split(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, f"cannot import state machine {path!r}: {exc}"
        ) from None
    machine = cls()
    if not callable(getattr(machine, "apply", None)):
        raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"{path!r} has no apply()")
    return machine


def load_quietly(machine: StateMachine, path: str, index: int) -> None:
    """``machine.load_snapshot`` with Python's cycle collector paused, then the loaded state
    frozen out of its reach: a map of a million keys is millions of objects, and every full
    collection would walk them all (a load ran 20% faster, and batches after it stopped
    pausing for the collector)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        machine.load_snapshot(path, index)
    finally:
        if enabled:
            gc.enable()
    gc.freeze()


class SnapshotShelf:
    """A member's sealed snapshots as it offers them to followers below its begin (see
    :class:`~rayledger.actors.core.member_logic.SnapshotSource`): the newest that verifies -- each
    checked once, by checksum -- and one by (index, term)."""

    def __init__(self, store: SnapshotStore):
        self.store = store
        self._checked: dict[str, str | None] = {}  # path -> why damaged (None: whole)

    def newest(self):
        have = self.store.list()
        paths = {m.path for m in have}
        self._checked = {p: v for p, v in self._checked.items() if p in paths}
        return SnapshotPolicy.start_from(have, self._damaged)

    def _damaged(self, meta) -> str | None:
        if meta.path not in self._checked:
            self._checked[meta.path] = self.store.verify(meta)
        return self._checked[meta.path]

    def find(self, index: int, term: int):
        for meta in self.store.list():
            if meta.index == index and meta.term == term:
                return meta
        raise LedgerError.of(
            ResponseCode.CORRUPT_SNAPSHOT,
            f"snapshot {index} (term {term}) is gone: a newer one replaced it",
        )


class Applier:
    """A machine and its runner core (:class:`~rayledger.actors.core.machine.MachineCore`): the
    calls into the machine, each checked and recorded by the core.  ``run`` and ``saved_now`` only
    call the machine (the machine's thread); the shell tells the core what came of them on its own
    thread."""

    def __init__(
        self,
        machine: StateMachine,
        ctx: MachineContext,
        max_batch: int = 1024,
        snapshots: SnapshotConfig | None = None,
    ):
        self.machine = machine
        self.saved = start = int(machine.open(ctx))  # what the machine keeps itself
        self.snapshots: SnapshotStore | None = None
        self.shelf: SnapshotShelf | None = None  # what the member offers to followers
        last = -1
        if ctx.data_dir is not None and type(machine).snapshot is not StateMachine.snapshot:
            self.snapshots = SnapshotStore(Path(ctx.data_dir) / "snapshots")
            self.shelf = SnapshotShelf(self.snapshots)
            pick = SnapshotPolicy.start_from(self.snapshots.list(), self.snapshots.verify)
            if pick is not None:
                last = pick.index
                if pick.index > start:
                    load_quietly(machine, pick.path, pick.index)
                    start = pick.index
        policy = None
        if self.snapshots is not None:
            kept = [m.index for m in self.snapshots.list()]
            policy = SnapshotPolicy(snapshots or SnapshotConfig(), last, kept)
        log_end = ctx.log.ledger_end_index if ctx.log is not None else None
        self.core = MachineCore(ctx.member, start, max_batch, policy, log_end)

    def run(self, entries: list[Entry]) -> None:
        """Apply entries that continue exactly where the machine stands (the machine's
        thread; the core learns of it through a ``BatchApplied`` event)."""
        if entries:
            self.core.step(mcore.Continues(entries[0].index), now_ms())
            # configuration entries are the group's, not the machine's: it sees
            # client entries (and a term's empty first entry) only
            mine = [e for e in entries if not e.channel]
            if mine:
                self.machine.apply(mine)

    def saved_now(self) -> int:
        """What the machine has made durable itself (its thread): the larger of what
        ``open`` returned and ``saved_index()``."""
        self.saved = max(self.saved, int(self.machine.saved_index()))
        return self.saved
