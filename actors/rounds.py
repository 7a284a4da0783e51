"""The leader's appends between admission and answer: group commit into rounds.

Sans-I/O (no Ray, no asyncio, no clock), so the Ray member (:mod:`.member_appends`) and the
whole-group simulation run the same decisions:

* an admitted append waits in the queue; the queue is written as *one* store batch and one
  replication round (:meth:`RoundBook.write`), unless ``max_rounds`` rounds already wait
  for their quorum -- then it grows and goes out as one larger round when one ends (every
  round costs a dozen actor calls, whatever its size);
* a round ends with the checker's code (:meth:`RoundBook.finish`): SUCCESS answers each
  append call with its span (and moves this member's committed index: read-your-writes),
  anything else is an *unknown outcome* -- the entries are in this member's log and may
  still commit under a later leader, so they are never a plain failure to retry;
* the rounds of a term that ended (:meth:`RoundBook.of_term`) are failed by the shell with
  TERM_CHANGED, or registered again with a restarted checker.

Tokens are opaque: futures on Ray, (client, request id) in the simulation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayledger.election.configuration import CONFIG_CHANNEL
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode

from .checker_logic import Resolution
from .logic import MemberLogic, Round

MAX_ROUNDS = 1  # rounds waiting for a quorum before new appends wait to join one round


@dataclass(frozen=True, slots=True)
class Written:
    """The queue became round ``rid`` (``round`` set), or the store refused it (``error``:
    nothing was written, each token gets the error)."""

    rid: int
    tokens: tuple[Any, ...]
    round: Round | None = None
    error: LedgerError | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """Round ``rid`` ended with ``code``; ``calls`` holds ``(token, first, last)`` per append."""

    rid: int
    round: Round
    code: ResponseCode
    calls: tuple[tuple[Any, int, int], ...]

    @property
    def ok(self) -> bool:
        return self.code == ResponseCode.SUCCESS

    def unknown(self, first: int, last: int, self_id: str, leader_id: str | None):
        """The error of one append call of a round that did not succeed."""
        return OutcomeUnknownError(
            self.code,
            f"entries {first}..{last} (term {self.round.term}) were stored by {self_id} but not "
            f"acknowledged by a quorum ({self.code.name}); the outcome is unknown, check before "
            "retrying",
            leader_id=leader_id,
        )


class RoundBook:
    """Queued appends and the rounds waiting for their quorum, of one leader member."""

    def __init__(self, logic: MemberLogic, max_rounds: int = MAX_ROUNDS):
        self.logic = logic
        self.max_rounds = max_rounds
        self.queue: list[tuple[Any, list]] = []
        self._configs: list[tuple[Any, bytes]] = []  # a configuration change to write
        self.rounds: dict[int, tuple[Round, tuple[Any, ...]]] = {}
        self._ids = itertools.count()
        self._write_pending = False
        self.in_rounds = 0  # append calls in rounds that have not ended

    @property
    def outstanding(self) -> int:
        """Append calls admitted and not yet answered (DLedger's pending-append limit)."""
        return len(self.queue) + self.in_rounds

    def admit(self, bodies: Sequence[bytes], group: str, target: str | None, token: Any) -> None:
        """DLedger's checks (raises LedgerError, nothing queued), then queue the append."""
        _, checked = self.logic.admit(bodies, group, target, self.outstanding)
        self.queue.append((token, checked))

    def admit_config(self, proposed: Any, token: Any) -> None:
        """A configuration change (issue 22): the single-server rules first (raises, nothing
        queued), then it waits to be written as a round of its own, on the configuration
        channel, before the appends queued.  One may be queued at a time, and none while one
        is uncommitted.  ``token`` None: the leader's own change, answered to no one."""
        body = self.logic.admit_config(proposed, queued=bool(self._configs))
        self._configs.append((token, body))

    @property
    def config_queued(self) -> bool:
        return bool(self._configs)

    def write_due(self) -> bool:
        """True once when the shell should write the queue (in this loop turn / step):
        something is queued, no write is already due, and fewer than ``max_rounds`` wait."""
        waiting = self.queue or self._configs
        if self._write_pending or not waiting or len(self.rounds) >= self.max_rounds:
            return False
        self._write_pending = True
        return True

    def write(self) -> Written | None:
        """Write the queue as one round (group commit); None when nothing was queued.  A
        refusal (nothing written) or an :class:`OutcomeUnknownError` (written, then the
        store failed) keeps no round: each token gets ``error``."""
        self._write_pending = False
        channel = 0
        if self._configs:  # a configuration entry is a round of its own, the appends next
            token, body = self._configs.pop(0)
            queue, channel = [(token, [body])], CONFIG_CHANNEL
        else:
            queue, self.queue = self.queue, []
        if not queue:
            return None
        rid = next(self._ids)
        tokens = tuple(t for t, _ in queue)
        term = self.logic.ready_term
        try:
            rnd = self.logic.write_round([(None, b) for _, b in queue], term, channel)
        except LedgerError as exc:
            return Written(rid, tuple(t for t in tokens if t is not None), error=exc)
        self.rounds[rid] = (rnd, tokens)
        self.in_rounds += len(tokens)
        return Written(rid, tokens, round=rnd)

    def finish(self, rid: int, code: ResponseCode) -> Finished | None:
        """Round ``rid`` ended (None when it had already); on SUCCESS this member's committed
        index moves to its end at once (read-your-writes, before the checker's notice)."""
        item = self.rounds.pop(rid, None)
        if item is None:
            return None
        rnd, tokens = item
        self.in_rounds -= len(tokens)
        if code == ResponseCode.SUCCESS:
            self.logic.on_committed(rnd.term, rnd.last_index)
        calls = tuple((tok, first, last) for tok, (_, first, last) in zip(tokens, rnd.calls,
                                                                          strict=True)
                      if tok is not None)  # fmt: skip
        return Finished(rid, rnd, code, calls)

    def resolve(self, r: Resolution) -> list[Finished]:
        """The checker's (or the compiled graph's) answer: the committed index of
        ``r.term`` first, then the rounds that ended, in order."""
        if r.committed is not None:
            self.logic.on_committed(r.term, r.committed)
        return [f for rid, code in r.outcomes if (f := self.finish(rid, code)) is not None]

    def waiting(self, rid: int) -> bool:
        return rid in self.rounds

    def of_term(self, term: int) -> list[tuple[int, Round]]:
        """``(rid, round)`` of the rounds of ``term`` still waiting, oldest first."""
        return [(rid, rnd) for rid, (rnd, _) in self.rounds.items() if rnd.term == term]
