"""A member's view of its group (DLedger's ``MemberState``) and its durable term/vote.

The current term and the vote of that term are Raft's persistent state: they are
written (atomically, together) before a vote is answered and before a new term
is used, and read back on start, so a member never votes twice in one term even
across restarts.  Everything else here is volatile and rebuilt after a restart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from rayledger.storage.errors import LedgerError, ResponseCode
from rayledger.storage.metafile import atomic_write_json, read_json

from .configuration import ConfigLog
from .messages import Role

log = logging.getLogger("rayledger.election")

TERM_FILE = "currterm.json"


@runtime_checkable
class TermStore(Protocol):
    """Durable home of (current term, vote of that term)."""

    def load(self) -> tuple[int, str | None]:
        """The last saved (term, vote_for); (0, None) when nothing was saved."""
        ...

    def save(self, term: int, vote_for: str | None) -> None:
        """Persist both values atomically; must not return before they are durable."""
        ...


class LogEnd(Protocol):
    """What MemberState reads of a log: a store has both (read-only here)."""

    @property
    def ledger_end_index(self) -> int: ...

    @property
    def ledger_end_term(self) -> int: ...


class _NoLog:
    """The log end of a state before its store is attached: an empty log."""

    ledger_end_index = -1
    ledger_end_term = -1


class FileTermStore:
    """``<data_dir>/currterm.json`` written with temp file + fsync + rename."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.path = Path(data_dir) / TERM_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> tuple[int, str | None]:
        data = read_json(self.path)
        if data is None:
            return 0, None
        try:
            term = int(data["currTerm"])
            vote = data.get("voteFor") or None
        except (KeyError, TypeError, ValueError) as exc:
            raise LedgerError.of(
                ResponseCode.CORRUPT_LOG, f"bad term file {self.path}: {data!r}"
            ) from exc
        if term < 0 or (vote is not None and not isinstance(vote, str)):
            raise LedgerError.of(ResponseCode.CORRUPT_LOG, f"bad term file {self.path}: {data!r}")
        return term, vote

    def save(self, term: int, vote_for: str | None) -> None:
        atomic_write_json(self.path, {"currTerm": term, "voteFor": vote_for})

    def __repr__(self) -> str:
        return f"FileTermStore({str(self.path.parent)!r})"


class MemoryTermStore:
    """In-memory store; a simulation keeps the object to model what survives a crash."""

    def __init__(self, term: int = 0, vote_for: str | None = None) -> None:
        self.term = term
        self.vote_for = vote_for
        self.saves = 0

    def load(self) -> tuple[int, str | None]:
        return self.term, self.vote_for

    def save(self, term: int, vote_for: str | None) -> None:
        self.term = term
        self.vote_for = vote_for
        self.saves += 1

    def __repr__(self) -> str:
        return f"MemoryTermStore(term={self.term}, vote_for={self.vote_for!r})"


def _bad(message: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, message)


class MemberState:
    """Group membership, role, term, vote, leader, ledger end and transfer state.

    ``peers`` lists every member id of the group, this member included, so
    ``is_quorum(n)`` is ``n >= len(peers) // 2 + 1``.  Without a ``term_store``
    the term is kept in ``<data_dir>/currterm.json``, or only in memory when
    ``data_dir`` is None.
    """

    def __init__(
        self,
        group: str,
        self_id: str,
        peers: Sequence[str],
        term_store: TermStore | None = None,
        *,
        data_dir: str | os.PathLike | None = None,
        config: ConfigLog | None = None,
    ) -> None:
        if not group:
            raise _bad("group must be a non-empty string")
        peers = tuple(peers)
        if not peers or any(not isinstance(p, str) or not p for p in peers):
            raise _bad(f"peers must be non-empty member ids, got {peers!r}")
        if len(set(peers)) != len(peers):
            raise _bad(f"peers has duplicates: {peers!r}")
        if config is None and self_id not in peers:
            raise _bad(f"self id {self_id!r} is not one of the peers {peers!r}")
        if term_store is None:
            term_store = FileTermStore(data_dir) if data_dir is not None else MemoryTermStore()
        self.group = group
        self.self_id = self_id
        # the configurations in this member's log; it acts on the latest
        self.config = config if config is not None else ConfigLog.initial(peers)
        self.term_store = term_store

        self.role: Role = Role.CANDIDATE
        self.leader_id: str | None = None
        self._log: LogEnd = _NoLog()
        self.known_max_term_in_group = -1
        self.transferee: str | None = None
        self.term_to_take_leadership = -1

        term, vote = term_store.load()
        if vote is not None and vote not in self.config.latest():
            log.warning("[%s] persisted vote %r is not a peer; keeping it", self_id, vote)
        self._current_term = term
        self._vote_for = vote
        self._term_voters = self.config.latest().voters  # the voters as the term began
        log.info("[%s] loaded persistent state term=%d voteFor=%s", self_id, term, vote)

    # ---------------------------------------------------------------- persistent

    @property
    def current_term(self) -> int:
        return self._current_term

    @property
    def vote_for(self) -> str | None:
        return self._vote_for

    def set_vote_for(self, candidate: str | None) -> None:
        """Record the vote of the current term durably (before it is answered)."""
        self.term_store.save(self._current_term, candidate)
        self._vote_for = candidate

    def next_term(self) -> int:
        """Enter the next term (or the largest term seen in the group) with no vote.

        Persisted before it returns, so no request ever carries an unsaved term.
        """
        if self.role is not Role.CANDIDATE:
            raise LedgerError.of(
                ResponseCode.ILLEGAL_MEMBER_STATE, f"{self.self_id}: {self.role} != CANDIDATE"
            )
        if self.known_max_term_in_group > self._current_term:
            term = self.known_max_term_in_group
        else:
            term = self._current_term + 1
        self.term_store.save(term, None)
        self._current_term = term
        self._vote_for = None
        self._term_voters = self.config.latest().voters
        return term

    def voters_changed_in_term(self) -> bool:
        """Whether the voters changed since this member entered its current term.  Votes
        granted in the term under the old voters stay granted: counted against the new
        ones, a minority of before (a candidate's lost election) can make a majority."""
        return self.config.latest().voters != self._term_voters

    # ------------------------------------------------------------------- roles

    def change_to_leader(self, term: int) -> None:
        self._check_term(term)
        self.role = Role.LEADER
        self.leader_id = self.self_id

    def change_to_follower(self, term: int, leader_id: str) -> None:
        self._check_term(term)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.transferee = None

    def change_to_candidate(self, term: int) -> None:
        """Step down; ``term`` may exceed the current term, it is only *known* here
        and becomes current at the candidate's next :meth:`next_term`."""
        if term < self._current_term:
            raise LedgerError.of(
                ResponseCode.ILLEGAL_MEMBER_STATE,
                f"{self.self_id}: candidate term {term} < current {self._current_term}",
            )
        if term > self.known_max_term_in_group:
            self.known_max_term_in_group = term
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.transferee = None

    def _check_term(self, term: int) -> None:
        if term != self._current_term:
            raise LedgerError.of(
                ResponseCode.ILLEGAL_MEMBER_STATE,
                f"{self.self_id}: term {term} != current {self._current_term}",
            )

    def set_transferee(self, transferee: str | None) -> None:
        if transferee is not None and self.role is not Role.LEADER:
            raise LedgerError.of(ResponseCode.ILLEGAL_MEMBER_STATE, f"{self.self_id} is not leader")
        self.transferee = transferee

    # ---------------------------------------------------------------- queries

    @property
    def ledger_end_index(self) -> int:
        return self._log.ledger_end_index

    @property
    def ledger_end_term(self) -> int:
        return self._log.ledger_end_term

    def attach_log(self, log: LogEnd) -> None:
        """Read the log end from ``log`` (the member's store) from now on: one owner of the
        log end, so no write can leave the state behind it."""
        self._log = log

    # ---------------------------------------------------------------- membership
    @property
    def peers(self) -> tuple[str, ...]:
        """Every member of the latest configuration, voters and learners (heartbeats go
        to all of them)."""
        return self.config.latest().members

    @property
    def voters(self) -> tuple[str, ...]:
        """The members whose votes and acknowledgements make a majority."""
        return self.config.latest().voters

    @property
    def peer_size(self) -> int:
        return len(self.peers)

    @property
    def voter_size(self) -> int:
        return len(self.voters)

    def is_quorum(self, num: int) -> bool:
        """Whether ``num`` voters are a majority of the voters."""
        return num >= self.config.latest().quorum

    def is_voter(self, member_id: str | None = None) -> bool:
        """Whether ``member_id`` (default: this member) votes in the latest configuration;
        a learner, or a member removed, never campaigns."""
        member = self.self_id if member_id is None else member_id
        return self.config.latest().is_voter(member)

    def is_peer_member(self, member_id: str | None) -> bool:
        return member_id is not None and member_id in self.config.latest()

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def is_follower(self) -> bool:
        return self.role is Role.FOLLOWER

    def __repr__(self) -> str:
        return (
            f"MemberState({self.group}/{self.self_id} {self.role.value} term={self._current_term} "
            f"voteFor={self._vote_for} leader={self.leader_id} "
            f"ledger=({self.ledger_end_index},{self.ledger_end_term}))"
        )
