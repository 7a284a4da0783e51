"""What a written round does next, from the leader's store to its quorum (sans-I/O).

A round the :class:`~.rounds.RoundBook` wrote is sent on by a *process* (as in
:mod:`.supervision`): a generator that yields one action at a time and is resumed with its
answer.  Every decision on the way lives here, once, for the Ray member
(:mod:`rayledger.actors.member.appends`) and the whole-group simulation alike:

* plain or compiled: a round goes through the compiled graph when the fast path is active
  and takes it, else as plain calls to the dispatchers (:class:`Announce`);
* sync_flush: the followers write meanwhile, and the round is registered with the checker
  only once this member flushed it (:class:`~.supervision.Flush`) -- the checker's mark for
  the leader is its flushed end (:meth:`MemberLogic.water_mark`), so the leader's own copy
  counts only once it is on disk.  A failed flush fails the round's appends as an unknown
  outcome (DISK_ERROR) and costs the leadership: a leader whose disk fails can count
  itself toward nothing;
* a round that could not be sent on (the transport answers :class:`~.supervision.Failed`,
  e.g. ``ray.put`` failed) is stored but never acknowledged: an unknown outcome at once;
* the rounds of an abandoned graph that still wait travel again as plain calls and are
  registered again (:meth:`RoundPath.fallback`).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.rounds import RoundBook, Written
from rayledger.actors.core.supervision import (
    Answer,
    Failed,
    Finish,
    Flush,
    GiveUpLeadership,
    Process,
)
from rayledger.replication.messages import Announcement
from rayledger.storage import ResponseCode

Span = tuple[int, int, int]  # (first index, last index, round id)


@dataclass(frozen=True, slots=True)
class Announce:
    """Send the round to every dispatcher as plain calls; answered None, or
    :class:`~.supervision.Failed` when it could not be sent."""

    a: Announcement


@dataclass(frozen=True, slots=True)
class Submit:
    """Offer the round to the compiled graph; answered True when the graph took it."""

    a: Announcement
    spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class Register:
    """The round waits for its quorum at the checker; ``leader_mark`` is how far the
    leader's own copy counts (:meth:`MemberLogic.water_mark`)."""

    term: int
    first: int
    last: int
    rid: int
    leader_mark: int
    # ``(index, Configuration)``: the round holds the leader's latest configuration entry,
    # which the checker counts from the round's registration on
    config: tuple | None = None


RoundAction = Announce | Submit | Register | Flush | Finish | GiveUpLeadership


class RoundPath:
    """Sends the leader's rounds on: one process per round, started by the transport."""

    def __init__(self, logic: MemberLogic, book: RoundBook, sync: bool):
        self.logic, self.book, self.sync = logic, book, sync

    def send(self, w: Written, fast: bool) -> Process:
        """The process of round ``w`` (written, ``w.round`` set); ``fast``: the compiled
        path is active now."""
        return Process("round", self._send(w, fast), exclusive=False)

    def _send(self, w: Written, fast: bool) -> Generator[RoundAction, Answer, None]:
        rnd, rid = w.round, w.rid
        first, last, term = rnd.first_index, rnd.last_index, rnd.term
        a = self.logic.announcement(rnd)
        config = self._config_in(first, last)
        fast = fast and config is None  # the graph registers rounds without configurations
        if self.sync:  # followers write meanwhile; the quorum counts us once we flushed
            if isinstance((yield Announce(a)).value, Failed):
                yield Finish([(rid, ResponseCode.INTERNAL_ERROR)])  # stored, not sent on
                return
            flushed = (yield Flush()).value
            if isinstance(flushed, Failed):
                yield Finish([(rid, ResponseCode.DISK_ERROR)])  # stored: outcome unknown
                yield GiveUpLeadership(
                    f"the flush of entries {first}..{last} failed: {flushed.why}"
                )
                return
        else:
            if fast and (yield Submit(a, ((first, last, rid),))).value:
                return  # the graph registers it with the checker
            if isinstance((yield Announce(a)).value, Failed):
                yield Finish([(rid, ResponseCode.INTERNAL_ERROR)])  # stored, not sent on
                return
        yield Register(term, first, last, rid, self.logic.water_mark(), config)

    def _config_in(self, first: int, last: int) -> tuple | None:
        """The log's latest configuration entry when it lies in ``first..last``."""
        log = self.logic.config_log
        index = log.latest_index()
        return (index, log.latest()) if first <= index <= last else None

    def reregister(self, term: int) -> list[Register]:
        """A restarted checker of ``term`` was set up again: the rounds of the term still
        waiting were lost with the old one and are registered again, oldest first, with
        how far the leader's own copy counts now (a round still in its sync flush does
        not count yet)."""
        mark = self.logic.water_mark()
        return [
            Register(term, rnd.first_index, rnd.last_index, rid, mark)
            for rid, rnd in self.book.of_term(term)
        ]

    def fallback(self, items: Sequence[tuple[Announcement, Sequence[Span]]]) -> list:
        """Rounds that were queued or in flight in an abandoned graph: those still waiting
        travel again as plain calls (a follower answers a push it already holds from its
        log) and are registered again.  Those of a term whose office is over are left to
        its end, which fails them."""
        out: list[Announce | Register] = []
        for a, spans in items:
            if not self.logic.holds_office(a.term):
                continue
            waiting = [(f, la, rid) for f, la, rid in spans if self.book.waiting(rid)]
            if not waiting:
                continue
            out.append(Announce(a))
            mark = self.logic.water_mark()
            out += [Register(a.term, f, la, rid, mark) for f, la, rid in waiting]
        return out
