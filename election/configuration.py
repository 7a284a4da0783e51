"""Group membership as data (issue 22): who votes, who only learns, and how a change may
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rayledger.storage.errors import LedgerError, ResponseCode

CONFIG_CHANNEL = 0x43_46_47  # "CFG": the channel of a configuration entry
"""DLedger's ``channel`` header field of a configuration entry (client entries use 0)."""


def _bad(code: ResponseCode, message: str) -> LedgerError:
    return LedgerError.of(code, message)


@dataclass(frozen=True, slots=True)
class Configuration:
    """Who votes (``voters``) and who only receives the log (``learners``); disjoint."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        every = (*self.voters, *self.learners)
        if not self.voters:
            raise _bad(ResponseCode.ILLEGAL_MEMBER_STATE, "a configuration needs a voter")
        if any(not isinstance(m, str) or not m for m in every):
            raise _bad(ResponseCode.UNEXPECTED_ARGUMENT, f"member ids are strings: {every!r}")
        if len(set(every)) != len(every):
            raise _bad(ResponseCode.UNEXPECTED_ARGUMENT, f"a member twice: {every!r}")

    @classmethod
    def of(cls, voters: Iterable[str], learners: Iterable[str] = ()) -> Configuration:
        return cls(tuple(voters), tuple(learners))

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

    # -- changes (each returns a new configuration; the rules are check_change's) -----------
    def with_learner(self, member: str) -> Configuration:
        if member in self:
            raise _bad(ResponseCode.UNEXPECTED_MEMBER, f"{member!r} is a member already")
        return Configuration(self.voters, (*self.learners, member))

    def with_voter(self, member: str) -> Configuration:
        """``member`` votes from now on: a learner promoted, or a new member added as a
        voter directly."""
        if member in self.voters:
            raise _bad(ResponseCode.UNEXPECTED_MEMBER, f"{member!r} votes already")
        learners = tuple(m for m in self.learners if m != member)
        return Configuration((*self.voters, member), learners)

    def without(self, member: str) -> Configuration:
        if member not in self:
            raise _bad(ResponseCode.UNKNOWN_MEMBER, f"{member!r} is not a member")
        if self.voters == (member,):
            raise _bad(ResponseCode.ILLEGAL_MEMBER_STATE, f"{member!r} is the last voter")
        return Configuration(
            tuple(m for m in self.voters if m != member),
            tuple(m for m in self.learners if m != member),
        )

    def voter_change(self, other: Configuration) -> int:
        """How many voters differ between the two (added plus removed)."""
        return len(set(self.voters) ^ set(other.voters))

    # -- the entry body ----------------------------------------------------------------------
    def encode(self) -> bytes:
        return json.dumps({"voters": list(self.voters), "learners": list(self.learners)},
                          separators=(",", ":")).encode()  # fmt: skip

    @classmethod
    def decode(cls, body: bytes) -> Configuration:
        """A configuration entry's body (CORRUPT_LOG when it is none)."""
        try:
            doc = json.loads(body)
            return cls(tuple(doc["voters"]), tuple(doc.get("learners", ())))
        except (ValueError, KeyError, TypeError, LedgerError) as exc:
            raise _bad(
                ResponseCode.CORRUPT_LOG, f"a configuration entry that is none: {exc}"
            ) from None


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
    first configuration entry (the group's initial one, or the one a snapshot or a
    compaction left), ``entries`` the configuration entries it holds, by index.  The member
    acts on :meth:`latest`; :meth:`committed` is what ``group.members`` shows."""

    base: Configuration
    base_index: int = -1  # the index the base was written at (-1: the initial one)
    entries: list[tuple[int, Configuration]] = field(default_factory=list)

    def latest(self) -> Configuration:
        return self.entries[-1][1] if self.entries else self.base

    def latest_index(self) -> int:
        return self.entries[-1][0] if self.entries else self.base_index

    def committed(self, committed_index: int) -> Configuration:
        """The latest configuration at or below ``committed_index``."""
        for index, config in reversed(self.entries):
            if index <= committed_index:
                return config
        return self.base

    def pending(self, committed_index: int) -> bool:
        """Whether a configuration entry above ``committed_index`` is in the log."""
        return bool(self.entries) and self.entries[-1][0] > committed_index

    def appended(self, index: int, config: Configuration) -> None:
        """A configuration entry was written at ``index`` (after every one held)."""
        if self.entries and index <= self.entries[-1][0]:
            raise _bad(ResponseCode.INCONSISTENT_INDEX,
                       f"configuration at {index} after one at {self.entries[-1][0]}")  # fmt: skip
        self.entries.append((index, config))

    def truncated(self, end_index: int) -> bool:
        """The log now ends at ``end_index``: configurations after it are gone.  True when
        the latest one changed (the member acts on the one before)."""
        before = self.latest()
        self.entries = [(i, c) for i, c in self.entries if i <= end_index]
        return self.latest() != before

    def compacted(self, begin_index: int) -> None:
        """Entries below ``begin_index`` left the log: the latest of them becomes the base."""
        while self.entries and self.entries[0][0] < begin_index:
            self.base_index, self.base = self.entries.pop(0)

    def reset(self, config: Configuration, index: int) -> bool:
        """The log was reset (a snapshot installed, or a reset to the leader's begin) with
        ``config`` in effect at ``index``; True when the latest one changed."""
        before = self.latest()
        self.base, self.base_index, self.entries = config, index, []
        return self.latest() != before

    # -- persisted beside the log (a compacted log no longer holds its base) ----------------
    def to_json(self) -> dict:
        return {
            "base": [self.base_index, list(self.base.voters), list(self.base.learners)],
            "entries": [[i, list(c.voters), list(c.learners)] for i, c in self.entries],
        }

    @classmethod
    def from_json(cls, doc: dict) -> ConfigLog:
        index, voters, learners = doc["base"]
        entries = [(int(i), Configuration.of(v, lr)) for i, v, lr in doc.get("entries", [])]
        return cls(Configuration.of(voters, learners), int(index), entries)

    @classmethod
    def initial(cls, voters: Sequence[str], learners: Sequence[str] = ()) -> ConfigLog:
        return cls(Configuration.of(voters, learners))


class ConfigWatch:
    """A :class:`ConfigLog` following a member's store (``LogStore.watch_channel`` on
    :data:`CONFIG_CHANNEL`), saved through ``save`` after every change (a compacted log no
    longer holds its base).  A reset leaves the configurations below the new begin as the
    base; the leader's configuration at that point comes with the reset (issue 22, to wire)."""

    def __init__(self, log: ConfigLog, save: Callable[[dict], None] | None = None):
        self.log = log
        self._save = save

    def _saved(self) -> None:
        if self._save is not None:
            self._save(self.log.to_json())

    def appended(self, index: int, body: bytes) -> None:
        self.log.appended(index, Configuration.decode(body))
        self._saved()

    def truncated(self, end_index: int) -> None:
        if self.log.entries and self.log.entries[-1][0] > end_index:
            self.log.truncated(end_index)
            self._saved()

    def reset(self, begin_index: int) -> None:
        self.log.truncated(begin_index - 1)
        self.compacted(begin_index)

    def compacted(self, begin_index: int) -> None:
        if self.log.entries and self.log.entries[0][0] < begin_index:
            self.log.compacted(begin_index)
            self._saved()


__all__ = ["CONFIG_CHANNEL", "ConfigLog", "ConfigWatch", "Configuration", "check_change"]
