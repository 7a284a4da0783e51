"""How a read index is found, decided once (sans-I/O: no Ray, no asyncio, no clock).

A read is a :class:`~.supervision.Process`: it yields what it needs -- the committed index to reach
an index (:class:`WaitCommitted`), a confirmation round of the leader's
:class:`~.reads.ReadIndexLogic` (:class:`Confirm`), a read index from the leader
(:class:`AskLeader`) -- and is resumed with the answer (a time-out is an answer:
:class:`~.supervision.Failed`).  It returns the read index, or raises the
:class:`~rayledger.storage.LedgerError` its caller gets.  :mod:`.reads` says what each consistency
promises; the Ray member (:mod:`rayledger.actors.member.reads`) and the simulation perform the
actions.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.reads import Consistency, ReadIndexLogic
from rayledger.actors.core.supervision import Answer, Failed, Process
from rayledger.storage import LedgerError, ResponseCode


@dataclass(frozen=True, slots=True)
class WaitCommitted:
    """Answered once this member committed ``index`` (True), or :class:`Failed` at
    ``deadline_ms``."""

    index: int
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class Confirm:
    """Join the next confirmation round of term ``term`` at ``index``
    (:meth:`ReadIndexLogic.request`); answered with the confirmed index, or
    :class:`Failed` at ``deadline_ms`` or when leadership ends."""

    term: int
    index: int
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class AskLeader:
    """Ask ``leader`` for a read index with ``consistency``; answered with the index, a
    :class:`LedgerError` of the leader, or :class:`Failed` at ``deadline_ms``."""

    leader: str
    consistency: Consistency
    deadline_ms: int


class ReadPath:
    """The member's read decisions over its cores (resumed under the member's lock)."""

    def __init__(self, logic: MemberLogic, reads: ReadIndexLogic, rpc_timeout_ms: int):
        self.logic = logic
        self.reads = reads
        self.rpc_ms = rpc_timeout_ms

    def leader_read(self, c: Consistency, now_ms: int) -> Process:
        """On the leader: an index every read that starts now may be served at."""
        return Process("leader-read", self._leader_read(c, now_ms + self.rpc_ms), exclusive=False)

    def _leader_read(self, c: Consistency, deadline: int) -> Generator:
        lg = self.logic
        term, start = lg.read_base()  # NOT_LEADER / LEADER_NOT_READY
        # the term's first entry must commit first: until then the committed index may lag
        now = yield from self._wait(start, deadline)
        if lg.read_base()[0] != term:
            raise self.not_leader()
        # the read index is the end of this leader's log, not its committed index: the
        # checker tells the followers (through the dispatchers) of a commit before it tells
        # this member, so a follower may serve an entry this member does not yet count as
        # committed (the all-features simulation: a lease read on the leader missed a
        # write a follower's reader had seen).  Every committed entry is at or below the
        # end; the read waits until the end is committed here
        index = lg.store.ledger_end_index
        now = yield from self._wait(index, deadline)
        if lg.read_base()[0] != term:
            raise self.not_leader()
        if c is not Consistency.LINEARIZABLE and lg.lease_holds(self.reads, term, now):
            return index
        got = (yield Confirm(term, index, deadline)).value
        if isinstance(got, Failed):
            if not got.timeout:
                raise self.not_leader()
            raise LedgerError.of(
                ResponseCode.TIMEOUT,
                f"{lg.self_id} could not confirm with a quorum that it still leads term {term}",
            )
        return got

    def follower_read(self, c: Consistency, now_ms: int) -> Process:
        """Ask the leader for a read index, then wait until this member committed that far
        (two RPC timeouts in all: a follower that missed pushes catches up after a pause)."""
        return Process("follower-read", self._follower_read(c, now_ms + 2 * self.rpc_ms), False)

    def _follower_read(self, c: Consistency, deadline: int) -> Generator:
        lg = self.logic
        leader = lg.state.leader_id
        if leader is None or leader == lg.self_id:
            raise LedgerError.of(
                ResponseCode.NOT_LEADER, f"{lg.self_id} knows no leader to ask for a read index"
            )
        got = (yield AskLeader(leader, c, deadline)).value
        if isinstance(got, LedgerError):
            raise got
        if isinstance(got, Failed):
            raise LedgerError.of(
                ResponseCode.NOT_LEADER,
                f"{lg.self_id} could not get a read index from {leader}: {got.why}",
            )
        yield from self._wait(got, deadline)
        return got

    def _wait(self, index: int, deadline: int) -> Generator:
        """Until this member committed ``index``; returns the time it was answered."""
        lg = self.logic
        got = yield WaitCommitted(index, deadline)  # answered at once when already there
        if isinstance(got.value, Failed):
            raise LedgerError.of(
                ResponseCode.TIMEOUT,
                f"{lg.self_id} has committed up to {lg.store.committed_index}, not yet "
                f"{index}; it is catching up, try again or read from the leader",
            )
        return got.now_ms

    def not_leader(self) -> LedgerError:
        from rayledger.replication.admission import not_leader

        lg = self.logic
        return not_leader(lg.state, f"{lg.self_id} no longer leads {lg.group!r}")


def not_committed_here(lg: MemberLogic, index: int, c: Consistency) -> LedgerError:
    """The error of a read of ``index`` past the read's limit.  Past a leader's committed
    index or a read index the entry is not committed in the group (INDEX_OUT_OF_BOUNDS); a
    follower's own committed index may lag, so a ``committed`` read there is pointed at the
    leader (NOT_LEADER, with its id when known) and never refused as out of bounds."""
    from rayledger.replication.admission import not_leader

    committed = lg.store.committed_index
    st = lg.state
    if c is Consistency.COMMITTED and not st.is_leader:
        return not_leader(
            st,
            f"entry {index} is not committed on {lg.self_id} (committed index "
            f"{committed}); ask the leader",
        )
    return LedgerError.of(
        ResponseCode.INDEX_OUT_OF_BOUNDS,
        f"entry {index} is not committed (committed index {committed})",
    )


def run_to_end(proc: Process, answer) -> tuple[object | None, object]:
    """Resume ``proc`` with ``answer``: ``(next action, None)``, or ``(None, result)`` when
    it returned (a raised LedgerError propagates)."""
    try:
        return proc.gen.send(answer), None
    except StopIteration as stop:
        return None, stop.value


__all__ = [
    "Answer",
    "AskLeader",
    "Confirm",
    "ReadPath",
    "WaitCommitted",
    "not_committed_here",
    "run_to_end",
]
