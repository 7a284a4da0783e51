"""The leader's appends between admission and answer: group commit into rounds.

Sans-I/O (no Ray, no asyncio, no clock), so the Ray member (:mod:`rayledger.actors.member.appends`)
and the whole-group simulation run the same decisions:

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

* an idempotent client's append (``ident`` = its client id and first sequence)
  is checked against the client-session table the member keeps from its own log
  (:mod:`rayledger.replication.sessions`): its session's next entries are queued and
  written with the session prefix; a retry of entries already in the log is answered with
  where they are -- at once when they are committed, else once they commit (or with an
  unknown outcome when this leader's term ends first); a retry of a call a leader change
  cut short is answered from the log for what is there and appended for the rest; a gap,
  an expired session, bodies that differ from the stored ones: a coded refusal, nothing
  appended.  Those answers leave the book in :attr:`RoundBook.settled`.

Tokens are opaque: futures on Ray, (client, request id) in the simulation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rayledger.actors.core.member_logic import MemberLogic, Round
from rayledger.election.configuration import CONFIG_CHANNEL
from rayledger.replication.admission import not_leader
from rayledger.replication.checker import Resolution
from rayledger.replication.sessions import Verdict
from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode
from rayledger.storage.codec import (
    SESSION_FLAG,
    SESSION_SIZE,
    crc32,
    session_rows,
    with_session,
)

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


@dataclass(frozen=True, slots=True)
class Spread:
    """Where an append call's entries sit when they are not one stretch of one round (a
    retry answered from the log): per entry, little-endian int64 bytes."""

    indexes: bytes
    terms: bytes
    positions: bytes


@dataclass(frozen=True, slots=True)
class _Rest:
    """The token of the part of a cut-short call appended again: ``spans`` of it are in
    the log already, the rest is in a round."""

    token: Any
    spans: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class _Join:
    """A retry waiting for entries already in the log (``spans``, up to ``last``) to
    commit in this leader's ``term``."""

    token: Any
    spans: tuple[tuple[int, int], ...]
    last: int
    term: int


_REFUSED = {
    Verdict.GAP: (ResponseCode.OUT_OF_ORDER_SEQUENCE, "an earlier append of the session is "
                  "not in the log; the session expects sequence {next}"),
    Verdict.EXPIRED: (ResponseCode.SESSION_EXPIRED, "the session is unknown here: silent "
                      "longer than client_session_ttl_s, never started at 0, or begun more "
                      "than half that TTL ago by its id (a client clock behind its leader's?)"),
    Verdict.UNKNOWN: (ResponseCode.LEADER_NOT_READY, "this leader lacks the client "
                      "sessions of its compacted entries (a damaged snapshot); ask again"),
    Verdict.FORGOTTEN: (ResponseCode.DUPLICATE_SEQUENCE, "appended long ago; where it went is "
                        "no longer kept"),
}  # fmt: skip


class RoundBook:
    """Queued appends and the rounds waiting for their quorum, of one leader member."""

    def __init__(self, logic: MemberLogic, max_rounds: int = MAX_ROUNDS):
        self.logic = logic
        self.max_rounds = max_rounds
        self.queue: list[tuple[Any, list, tuple[int, int] | None]] = []  # token, bodies, ident
        self._configs: list[tuple[Any, bytes]] = []  # a configuration change to write
        self.rounds: dict[int, tuple[Round, tuple[Any, ...]]] = {}
        self._ids = itertools.count()
        self._write_pending = False
        self.in_rounds = 0  # append calls in rounds that have not ended
        self._queued: dict[int, int] = {}  # client id -> last sequence queued, not written
        self._joins: list[_Join] = []
        self._reround = -1  # a retry waits on this leader's entries up to here, in no round
        self.settled: list[tuple[Any, Any]] = []  # (token, Spread | LedgerError) to answer
        self._queue_term = -1  # the term the queued appends and changes were admitted in

    @property
    def outstanding(self) -> int:
        """Append calls admitted and not yet answered (DLedger's pending-append limit)."""
        return len(self.queue) + self.in_rounds + len(self._joins)

    def admit(
        self,
        bodies: Sequence[bytes],
        group: str,
        target: str | None,
        token: Any,
        ident: tuple[int, int] | None = None,
        maybe_stored: bool = True,
    ) -> None:
        """DLedger's checks (raises LedgerError, nothing queued), then queue the append;
        an idempotent one (``ident``: client id, first sequence) as its session says
        (``maybe_stored``: a call carrying that identity ended with an unknown outcome)."""
        term, checked = self.logic.admit(bodies, group, target, self.outstanding)
        self._queued_in(term)
        if ident is None:
            self.queue.append((token, checked, None))
            return
        client, seq = ident
        limit = self.logic.store.config.max_entry_size
        if max(map(len, checked)) + SESSION_SIZE > limit:
            raise LedgerError.of(ResponseCode.ENTRY_TOO_LARGE, f"an idempotent entry holds at "
                                 f"most {limit - SESSION_SIZE} bytes (the session prefix "
                                 f"takes {SESSION_SIZE})")  # fmt: skip
        sessions = self.logic.sessions
        c = sessions.check(client, seq, len(checked), sessions.last_stamp,
                           self._queued.get(client, -1), maybe_stored)  # fmt: skip
        if c.verdict is Verdict.NEW:
            self._enqueue(token, checked, client, seq)
        elif c.verdict is Verdict.DUPLICATE:
            self._same_bodies(c.spans, checked)
            self._join(token, c.spans)
        elif c.verdict is Verdict.PARTIAL:
            self._same_bodies(c.spans, checked[: c.known])
            self._enqueue(_Rest(token, c.spans), checked[c.known :], client, c.next_seq)
        elif c.verdict is Verdict.QUEUED:  # answered once written: ask again then
            raise OutcomeUnknownError(ResponseCode.REPEATED_REQUEST, f"client {client} "
                                      f"sequence {seq} waits to be written on this leader; "
                                      "its outcome is not known yet")  # fmt: skip
        else:
            code, why = _REFUSED[c.verdict]
            raise LedgerError.of(code, f"client {client} sequence {seq}: " +
                                 why.format(next=c.next_seq))  # fmt: skip

    def _enqueue(self, token: Any, bodies: list, client: int, seq: int) -> None:
        self.queue.append((token, bodies, (client, seq)))
        self._queued[client] = seq + len(bodies) - 1

    def _same_bodies(self, spans, bodies: Sequence[bytes]) -> None:
        """A retry must carry what its sequences stored (the CRC-32 in each entry's prefix:
        an append hook may have stamped the stored body since); SEQUENCE_MISMATCH else."""
        store = self.logic.store
        k = 0
        for first, count in spans:
            batch = store.read_batch(first, 1 << 62, count)
            heads = batch.headers()
            _, rows = session_rows(batch.data, first, [h[5] for h in heads],
                                   [h[1] for h in heads])  # fmt: skip
            for j, (_client, _seq, _stamp, crc) in enumerate(rows):
                if crc != crc32(bodies[k]):
                    raise LedgerError.of(ResponseCode.SEQUENCE_MISMATCH, f"entry {first + j} "
                                         "holds other bytes under this sequence")  # fmt: skip
                k += 1

    def _join(self, token: Any, spans) -> None:
        """Answer a retry of entries in the log: now if committed, else once they are.  Its
        entries of this leader's term that no waiting round covers (theirs ended without a
        quorum's answer) go out again as a round of their own: else they would wait for the
        next client's append to commit them."""
        last = max(first + count - 1 for first, count in spans)
        store = self.logic.store
        if last <= store.committed_index:
            self.settled.append((token, self._spread(spans)))
            return
        term = self.logic.ready_term
        self._joins.append(_Join(token, tuple(spans), last, term))
        covered = any(rnd.last_index >= last for rnd, _ in self.rounds.values())
        if not covered and store.get_term(last) == term:
            self._reround = max(self._reround, last)

    def _spread(self, spans) -> Spread:
        store = self.logic.store
        idx = np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in spans])
        terms = np.array([store.get_term(int(i)) for i in idx], dtype=np.int64)
        pos = np.array([store.get_pos(int(i)) for i in idx], dtype=np.int64)
        return Spread(idx.tobytes(), terms.tobytes(), pos.tobytes())

    def settle_joins(self) -> None:
        """Retries whose entries committed are answered; those of a term this member no
        longer leads get an unknown outcome (a later leader may still commit them)."""
        if not self._joins:
            return
        committed = self.logic.store.committed_index
        keep = []
        for j in self._joins:
            if j.last <= committed:
                self.settled.append((j.token, self._spread(j.spans)))
            elif not self.logic.leads(j.term):
                self.settled.append((j.token, OutcomeUnknownError(
                    ResponseCode.TERM_CHANGED, f"entries up to {j.last} are in the log of a "
                    f"leader of term {j.term} that lost it before they committed; the "
                    "outcome is unknown")))  # fmt: skip
            else:
                keep.append(j)
        self._joins = keep

    def take_settled(self) -> list[tuple[Any, Any]]:
        out, self.settled = self.settled, []
        return out

    def admit_config(self, proposed: Any, token: Any) -> None:
        """A configuration change: the single-server rules first (raises, nothing
        queued), then it waits to be written as a round of its own, on the configuration
        channel, before the appends queued.  One may be queued at a time, and none while one
        is uncommitted.  ``token`` None: the leader's own change, answered to no one."""
        body = self.logic.admit_config(proposed, queued=bool(self._configs))
        self._queued_in(self.logic.state.current_term)
        self._configs.append((token, body))

    def _queued_in(self, term: int) -> None:
        """What is queued was admitted in ``term``: a queue of an older term is settled
        first (:meth:`settle_term`), so the queue only ever holds one term's calls."""
        if term != self._queue_term:
            self.settle_term(force=True)
            self._queue_term = term

    def settle_term(self, force: bool = False) -> None:
        """A term's end settles everything queued in it: appends and changes admitted but
        not yet written get NOT_LEADER (nothing was stored, so a client may send them again,
        under the same identity, to the next leader).  Written later, in a term this member
        leads again, an idempotent append would land after another leader committed the
        client's retry of it: one body committed twice.  ``force``: settle whatever is
        queued, led or not."""
        if not (self.queue or self._configs):
            return
        if not force and self.logic.leads(self._queue_term):
            return
        logic = self.logic
        err = not_leader(logic.state, f"{logic.self_id} no longer leads term {self._queue_term}; "
                         "the append was not stored")  # fmt: skip
        tokens = [t.token if isinstance(t, _Rest) else t for t, _, _ in self.queue]
        tokens += [t for t, _ in self._configs]
        self.queue, self._configs = [], []
        self._queued.clear()
        self.settled += [(t, err) for t in tokens if t is not None]

    @property
    def config_queued(self) -> bool:
        return bool(self._configs)

    def write_due(self) -> bool:
        """True once when the shell should write the queue (in this loop turn / step):
        something is queued, no write is already due, and fewer than ``max_rounds`` wait."""
        waiting = self.queue or self._configs or self._reround >= 0
        if self._write_pending or not waiting or len(self.rounds) >= self.max_rounds:
            return False
        self._write_pending = True
        return True

    def write(self, wall_ms: int = 0) -> Written | None:
        """Write the queue as one round (group commit); None when nothing was queued.  A
        refusal (nothing written) or an :class:`OutcomeUnknownError` (written, then the
        store failed) keeps no round: each token gets ``error``.  ``wall_ms``: the
        leader's clock, for the stamp an idempotent client's entries carry."""
        self._write_pending = False
        channel: int | list[int] = 0
        if self._configs:  # a configuration entry is a round of its own, the appends next
            token, body = self._configs.pop(0)
            queue, channel = [(token, [body], None)], CONFIG_CHANNEL
        else:
            queue, self.queue = self.queue, []
            self._queued.clear()  # written now (the table follows the store), or refused
        if not queue:
            return self._reround_written()
        rid = next(self._ids)
        tokens = tuple(t for t, _, _ in queue)
        term = self.logic.ready_term
        calls = [(None, b) for _, b, _ in queue]
        if any(ident is not None for _, _, ident in queue):
            calls, channel = self._sessions_prefixed(queue, wall_ms)
        try:
            rnd = self.logic.write_round(calls, term, channel)
        except LedgerError as exc:  # each call gets the error (a cut-short retry's too)
            callers = (t.token if isinstance(t, _Rest) else t for t in tokens)
            return Written(rid, tuple(t for t in callers if t is not None), error=exc)
        self.rounds[rid] = (rnd, tokens)
        self.in_rounds += len(tokens)
        return Written(rid, tokens, round=rnd)

    def _reround_written(self) -> Written | None:
        """This term's entries a retry waits on, sent again as a round (nothing written)."""
        hi, self._reround = self._reround, -1
        logic = self.logic
        lo = max(logic.store.committed_index + 1, logic.term_start_index)
        if hi < lo or not logic.leads(logic.ready_term):
            return None
        rid = next(self._ids)
        rnd = logic.existing_round(lo, hi, logic.ready_term)
        self.rounds[rid] = (rnd, ())
        return Written(rid, (), round=rnd)

    def _sessions_prefixed(self, queue, wall_ms: int) -> tuple[list, list[int]]:
        """The calls' bodies with the session prefix on an idempotent client's entries,
        and each entry's channel."""
        stamp = self.logic.sessions.next_stamp(wall_ms)
        calls, channels = [], []
        for _, bodies, ident in queue:
            if ident is None:
                calls.append((None, bodies))
                channels += [0] * len(bodies)
                continue
            client, seq = ident
            calls.append((None, with_session(bodies, client, seq, stamp)))
            channels += [SESSION_FLAG] * len(bodies)
        return calls, channels

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
        if any(isinstance(t, _Rest) for t, _, _ in calls):
            calls = self._rest_answered(calls, code)
        return Finished(rid, rnd, code, calls)

    def _rest_answered(self, calls, code: ResponseCode) -> tuple:
        """The retries appended in part: their whole answer (or unknown outcome) is settled
        here, the other calls are the round's."""
        out = []
        for tok, first, last in calls:
            if not isinstance(tok, _Rest):
                out.append((tok, first, last))
            elif code == ResponseCode.SUCCESS:
                spans = (*tok.spans, (first, last - first + 1))
                self.settled.append((tok.token, self._spread(spans)))
            else:
                self.settled.append((tok.token, OutcomeUnknownError(
                    code, f"entries {first}..{last} were stored but not acknowledged by a "
                    f"quorum ({code.name}); the outcome is unknown")))  # fmt: skip
        return tuple(out)

    def resolve(self, r: Resolution) -> list[Finished]:
        """The checker's (or the compiled graph's) answer: the committed index of
        ``r.term`` first, then the rounds that ended, in order."""
        if r.config_index >= 0:
            self.logic.checker_counts(r.term, r.config_index)
        if r.committed is not None:
            self.logic.on_committed(r.term, r.committed)
        done = [f for rid, code in r.outcomes if (f := self.finish(rid, code)) is not None]
        self.settle_joins()
        return done

    def waiting(self, rid: int) -> bool:
        return rid in self.rounds

    def of_term(self, term: int) -> list[tuple[int, Round]]:
        """``(rid, round)`` of the rounds of ``term`` still waiting, oldest first."""
        return [(rid, rnd) for rid, (rnd, _) in self.rounds.items() if rnd.term == term]
