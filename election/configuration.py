"""Group membership as data: who votes, who only learns, and how a change may
be made (sans-I/O: no clock, no Ray, no files).

A configuration is an entry in the log, on its own channel (:data:`CONFIG_CHANNEL`, in
DLedger's header field ``channel``), so readers tell it from a client's entry the way they
tell a term's empty first entry.  Each member acts on the *latest* configuration in its log,
committed or not (Raft dissertation §4.1); :class:`ConfigLog` follows a member's log --
appends, truncations, resets -- and says which one that is.

Changes are single-server (§4.2): two consecutive configurations differ by one voter at
most, so any majority of the old one and any majority of the new one share a member and
two leaders cannot be elected in one term.  That argument needs two guards, both in
:func:`check_change`: one change at a time (the previous one committed), and a leader
changes the configuration only after it has committed an entry of its own term -- the fix
Ongaro posted in 2015 for the bug where a leader of a new term, still holding an
uncommitted change of an old leader, adds another and two disjoint majorities appear.
Learners (non-voting members) may come and go in any change: they count toward no
majority.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rayledger.storage.errors import LedgerError, ResponseCode
from rayledger.storage.metafile import atomic_write_json, read_json

CONFIG_CHANNEL = 0x43_46_47  # "CFG": the channel of a configuration entry
"""DLedger's ``channel`` header field of a configuration entry (client entries use 0)."""


def _bad(code: ResponseCode, message: str) -> LedgerError:
    return LedgerError.of(code, message)


@dataclass(frozen=True, slots=True)
class Configuration:
    """Who votes (``voters``) and who only receives the log (``learners``); disjoint.

    ``joining`` holds the group's plans, so that any leader carries them on: a pair
    ``(learner, old)`` says the learner is promoted once it has caught up and then member
    ``old`` ("" for none) is removed -- how ``add_member`` and ``replace_member`` survive a
    leader change or an interrupted caller."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    joining: tuple[tuple[str, str], ...] = ()
    # the smallest k such that no member named n<k> ever belonged to the group: ids are never
    # reused (a former member's data directory may still be there), even after compaction
    next_id: int = 0

    def __post_init__(self) -> None:
        every = (*self.voters, *self.learners)
        if not self.voters:
            raise _bad(ResponseCode.ILLEGAL_MEMBER_STATE, "a configuration needs a voter")
        if any(not isinstance(m, str) or not m for m in every):
            raise _bad(ResponseCode.UNEXPECTED_ARGUMENT, f"member ids are strings: {every!r}")
        if len(set(every)) != len(every):
            raise _bad(ResponseCode.UNEXPECTED_ARGUMENT, f"a member twice: {every!r}")
        for new, _old in self.joining:
            if new not in every:
                raise _bad(ResponseCode.UNEXPECTED_ARGUMENT, f"{new!r} joins but is no member")
        object.__setattr__(self, "next_id", _next_id(self.next_id, every))

    @classmethod
    def of(
        cls,
        voters: Iterable[str],
        learners: Iterable[str] = (),
        joining: Iterable = (),
        next_id: int = 0,
    ) -> Configuration:
        return cls(tuple(voters), tuple(learners), tuple((n, o) for n, o in joining), next_id)

    def fresh_id(self, taken: Iterable[str] = ()) -> str:
        """A member id never used in this group (``n<k>``), nor in ``taken``."""
        k = _next_id(self.next_id, (*self.members, *taken))
        return f"n{k}"

    @property
    def members(self) -> tuple[str, ...]:
        return (*self.voters, *self.learners)

    @property
    def quorum(self) -> int:
        """How many voters make a majority."""
        return len(self.voters) // 2 + 1

    def is_voter(self, member: str) -> bool:
        return member in self.voters

    def is_learner(self, member: str) -> bool:
        return member in self.learners

    def __contains__(self, member: object) -> bool:
        return member in self.voters or member in self.learners

    def role_of(self, member: str) -> str | None:
        """ "voter", "learner", or None (not a member)."""
        if member in self.voters:
            return "voter"
        if member in self.learners:
            return "learner"
        return None

    def plan_of(self, member: str) -> str | None:
        """The member ``member`` replaces when it joins ("" for none), or None: no plan."""
        return next((old for new, old in self.joining if new == member), None)

    def replacement_of(self, old: str) -> str | None:
        """The member planned to replace ``old``, or None."""
        return next((new for new, o in self.joining if o == old), None)

    # -- changes (each returns a new configuration; the rules are check_change's) -----------
    def with_learner(self, member: str, promote: bool = False, replaces: str = "") -> Configuration:
        """``member`` joins as a learner; with ``promote`` (or ``replaces``) it is planned to
        become a voter once caught up (and then ``replaces`` leaves)."""
        if member in self:
            raise _bad(ResponseCode.UNEXPECTED_MEMBER, f"{member!r} is a member already")
        if replaces and replaces not in self:
            raise _bad(ResponseCode.UNKNOWN_MEMBER, f"{replaces!r} is not a member")
        if replaces and self.replacement_of(replaces) is not None:
            raise _bad(ResponseCode.CONFIG_CHANGE_IN_PROGRESS,
                       f"{replaces!r} is being replaced already")  # fmt: skip
        plan = ((member, replaces),) if promote or replaces else ()
        return Configuration(self.voters, (*self.learners, member), self.joining + plan,
                             self.next_id)  # fmt: skip

    def with_voter(self, member: str) -> Configuration:
        """``member`` votes from now on: a learner promoted, or a new member added as a
        voter directly.  A plan that replaces nobody is done."""
        if member in self.voters:
            raise _bad(ResponseCode.UNEXPECTED_MEMBER, f"{member!r} votes already")
        learners = tuple(m for m in self.learners if m != member)
        joining = tuple((n, o) for n, o in self.joining if n != member or o)
        return Configuration((*self.voters, member), learners, joining, self.next_id)

    def without(self, member: str) -> Configuration:
        """``member`` leaves; the plans it was in end (it was replaced, or its replacement
        is abandoned by removing it)."""
        if member not in self:
            raise _bad(ResponseCode.UNKNOWN_MEMBER, f"{member!r} is not a member")
        if self.voters == (member,):
            raise _bad(ResponseCode.ILLEGAL_MEMBER_STATE, f"{member!r} is the last voter")
        return Configuration(
            tuple(m for m in self.voters if m != member),
            tuple(m for m in self.learners if m != member),
            tuple((n, o) for n, o in self.joining if member not in (n, o)),
            self.next_id,
        )

    def voter_change(self, other: Configuration) -> int:
        """How many voters differ between the two (added plus removed)."""
        return len(set(self.voters) ^ set(other.voters))

    # -- the entry body ----------------------------------------------------------------------
    def to_doc(self) -> dict:
        doc: dict = {"voters": list(self.voters), "learners": list(self.learners)}
        if self.joining:
            doc["joining"] = [list(p) for p in self.joining]
        if self.next_id:
            doc["next_id"] = self.next_id
        return doc

    @classmethod
    def from_doc(cls, doc: dict) -> Configuration:
        return cls.of(doc["voters"], doc.get("learners", ()), doc.get("joining", ()),
                      int(doc.get("next_id", 0)))  # fmt: skip

    def encode(self) -> bytes:
        return json.dumps(self.to_doc(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Configuration:
        """A configuration entry's body (CORRUPT_LOG when it is none)."""
        try:
            return cls.from_doc(json.loads(body))
        except (ValueError, KeyError, TypeError, LedgerError) as exc:
            raise _bad(
                ResponseCode.CORRUPT_LOG, f"a configuration entry that is none: {exc}"
            ) from None


def _next_id(start: int, members: Iterable[str]) -> int:
    """``start``, or past the highest ``n<k>`` among ``members``."""
    k = start
    for m in members:
        if len(m) > 1 and m[0] == "n" and m[1:].isdigit():
            k = max(k, int(m[1:]) + 1)
    return k


def check_change(
    current: Configuration,
    proposed: Configuration,
    *,
    pending: bool,
    committed_own_term: bool,
) -> Configuration:
    """Whether a leader may append ``proposed`` now (returns it) or why not (raises):

    * CONFIG_CHANGE_IN_PROGRESS while a configuration entry in its log is not committed
      (``pending``): one change at a time;
    * LEADER_NOT_READY until it has committed an entry of its own term (Ongaro's fix);
    * ILLEGAL_MEMBER_STATE for a change of more than one voter (single-server changes).
    """
    if pending:
        raise _bad(ResponseCode.CONFIG_CHANGE_IN_PROGRESS,
                   "another configuration change is not committed yet")  # fmt: skip
    if not committed_own_term:
        raise _bad(ResponseCode.LEADER_NOT_READY,
                   "the leader has not committed an entry of its term yet")  # fmt: skip
    if current.voter_change(proposed) > 1:
        raise _bad(ResponseCode.ILLEGAL_MEMBER_STATE,
                   f"{current.voters} -> {proposed.voters} changes more than one voter")  # fmt: skip
    return proposed


@dataclass
class ConfigLog:
    """The configurations in one member's log: ``base`` is the one in effect before its
    first configuration entry (the group's initial one, or the one a snapshot, a reset or a
    compaction left), ``entries`` the configuration entries it holds, by index.  The member
    acts on :meth:`latest`; :meth:`committed` is what ``group.members`` shows.  ``save``
    (when set) is called after every change: a compacted log no longer holds its base."""

    base: Configuration
    base_index: int = -1  # the index the base was written at (-1: the initial one)
    entries: list[tuple[int, Configuration]] = field(default_factory=list)
    save: Callable[[dict], None] | None = field(default=None, repr=False, compare=False)

    def _changed(self) -> None:
        if self.save is not None:
            self.save(self.to_json())

    def latest(self) -> Configuration:
        return self.entries[-1][1] if self.entries else self.base

    def latest_index(self) -> int:
        return self.entries[-1][0] if self.entries else self.base_index

    def at(self, index: int) -> Configuration:
        """The configuration in effect at ``index`` (the latest at or below it; the base
        below every entry)."""
        for i, config in reversed(self.entries):
            if i <= index:
                return config
        return self.base

    def committed(self, committed_index: int) -> Configuration:
        """The latest configuration at or below ``committed_index``."""
        return self.at(committed_index)

    def pending(self, committed_index: int) -> bool:
        """Whether a configuration entry above ``committed_index`` is in the log."""
        return bool(self.entries) and self.entries[-1][0] > committed_index

    def appended(self, index: int, config: Configuration) -> None:
        """A configuration entry was written at ``index`` (after every one held)."""
        if self.entries and index <= self.entries[-1][0]:
            raise _bad(ResponseCode.INCONSISTENT_INDEX,
                       f"configuration at {index} after one at {self.entries[-1][0]}")  # fmt: skip
        self.entries.append((index, config))
        self._changed()

    def truncated(self, end_index: int) -> bool:
        """The log now ends at ``end_index``: configurations after it are gone.  True when
        the latest one changed (the member acts on the one before)."""
        if not (self.entries and self.entries[-1][0] > end_index):
            return False
        before = self.latest()
        self.entries = [(i, c) for i, c in self.entries if i <= end_index]
        self._changed()
        return self.latest() != before

    def compacted(self, begin_index: int) -> None:
        """Entries below ``begin_index`` left the log: the latest of them becomes the base."""
        if not (self.entries and self.entries[0][0] < begin_index):
            return
        while self.entries and self.entries[0][0] < begin_index:
            self.base_index, self.base = self.entries.pop(0)
        self._changed()

    def reset(self, config: Configuration, index: int) -> bool:
        """The log was reset (a snapshot installed, or a reset to the leader's begin) with
        ``config`` in effect at ``index``; True when the latest one changed."""
        before = self.latest()
        self.base, self.base_index, self.entries = config, index, []
        self._changed()
        return self.latest() != before

    def frozen(self) -> tuple[tuple[int, Configuration], ...]:
        """A copy to send (a leader's helpers learn the configuration at an index from it)."""
        return ((self.base_index, self.base), *self.entries)

    # -- persisted beside the log (a compacted log no longer holds its base) ----------------
    def to_json(self) -> dict:
        return {
            "base": [self.base_index, self.base.to_doc()],
            "entries": [[i, c.to_doc()] for i, c in self.entries],
        }

    @classmethod
    def from_json(cls, doc: dict) -> ConfigLog:
        index, base = doc["base"]
        entries = [(int(i), Configuration.from_doc(c)) for i, c in doc.get("entries", [])]
        return cls(Configuration.from_doc(base), int(index), entries)

    @classmethod
    def initial(cls, voters: Sequence[str], learners: Sequence[str] = ()) -> ConfigLog:
        return cls(Configuration.of(voters, learners))


def config_at(frozen: Sequence[tuple[int, Configuration]], index: int) -> Configuration:
    """The configuration in effect at ``index`` in a :meth:`ConfigLog.frozen` copy."""
    for i, config in reversed(frozen[1:]):
        if i <= index:
            return config
    return frozen[0][1]


class MemoryConfigStore:
    """Where a member keeps its :class:`ConfigLog` between restarts, in memory: a
    simulation keeps the object to model what survives a crash (like ``MemoryTermStore``)."""

    def __init__(self) -> None:
        self.doc: dict | None = None

    def load(self) -> dict | None:
        return self.doc

    def save(self, doc: dict) -> None:
        self.doc = doc


class FileConfigStore:
    """``membership.json`` beside a member's log (atomic writes)."""

    NAME = "membership.json"

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, self.NAME)

    def load(self) -> dict | None:
        return read_json(self.path)

    def save(self, doc: dict) -> None:
        atomic_write_json(self.path, doc)


TAIL_SCAN = 4096
"""Entries at the end of a log a restart reads for configuration entries its saved
:class:`ConfigLog` may lack (written, then the process died before the save)."""


def recover_config_log(saved, store, initial: Configuration) -> ConfigLog:
    """A member's configurations at a restart: the saved ones (those past the log's end
    dropped: a power loss took them) and any configuration entry in the log after them --
    the whole log when nothing was saved, else its tail -- or ``initial``.  Saved after
    every change from now on."""
    doc = saved.load()
    end = store.ledger_end_index
    if doc is not None:
        clog = ConfigLog.from_json(doc)
        clog.truncated(end)
        scan = max(clog.latest_index() + 1, end - TAIL_SCAN)
    else:
        clog = ConfigLog(initial)
        scan = 0
    for index, body in store.channel_entries(CONFIG_CHANNEL, scan):
        if index > clog.latest_index():
            clog.appended(index, Configuration.decode(body))
    clog.save = saved.save
    saved.save(clog.to_json())
    return clog


class ConfigWatch:
    """A :class:`ConfigLog` following a member's store (``LogStore.watch_channel`` on
    :data:`CONFIG_CHANNEL`).  A reset keeps the configurations below the new begin as the
    base until the leader's configuration at that point arrives with the reset (the entry
    handler's :meth:`ConfigLog.reset`)."""

    def __init__(self, log: ConfigLog):
        self.log = log

    def appended(self, index: int, body: bytes) -> None:
        self.log.appended(index, Configuration.decode(body))

    def truncated(self, end_index: int) -> None:
        self.log.truncated(end_index)

    def reset(self, begin_index: int) -> None:
        self.log.truncated(begin_index - 1)
        self.log.compacted(begin_index)

    def compacted(self, begin_index: int) -> None:
        self.log.compacted(begin_index)


__all__ = [
    "CONFIG_CHANNEL",
    "FileConfigStore",
    "MemoryConfigStore",
    "recover_config_log",
    "ConfigLog",
    "ConfigWatch",
    "Configuration",
    "check_change",
    "config_at",
]
