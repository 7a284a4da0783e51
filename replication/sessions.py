"""Client sessions of idempotent appends, as a member's log holds them.

An idempotent client numbers its entries 0, 1, 2, ... in a session named by its client id;
each entry carries both, and its leader's stamp, in a prefix (``storage.codec.SESSION``).
A :class:`SessionTable` follows those prefixes as the store writes, truncates and resets
its log (it is the store's session watcher), so every member -- and so every future
leader -- knows from its own log, committed or not:

* each session's last sequence, so a leader takes a client's next entries in order and
  refuses a gap or a step back;
* where a session's latest runs of entries sit (``(first seq, first index, count)``, the
  newest ``keep_runs``), so a retry of an append already in the log is answered with the
  original indexes instead of being written twice;
* when each session was last active (the stamp of its latest entry).  A session silent for
  ``ttl_ms`` by the log's own stamps has expired: a leader refuses its appends
  (SESSION_EXPIRED) and forgets it, which bounds the table.  Stamps come from the log, so
  every member expires the same sessions at the same point of the log.

A session the table does not hold is either new or forgotten, and a forgotten one may have
stored its first entry: a retry of that entry must not start it again.  So a client id says
when its session began (:func:`new_client_id`: the client's clock, in its high bits), and a
leader starts a session at sequence 0 only while that is less than half a TTL behind the
log's stamps; an older one is SESSION_EXPIRED.  A session that stored an entry expires
only a whole TTL after that entry's stamp, so a retry that outlives its session is refused
instead of stored twice, as long as clients' clocks are no more than half a TTL ahead of
their leaders' (docs/SAFETY.md).

Sans-I/O: no clock (stamps are handed in), no Ray, no store reads.  The decisions it
returns (:class:`Verdict`) are acted on by the leader's round book (``actors/core/rounds.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

KEEP_RUNS = 8  # runs kept per session: a client retries at most its calls in flight (4)
NONCE_BITS = 21  # a client id: the ms its session began (42 bits, to 2109), 21 random bits


def new_client_id(wall_ms: int, nonce: int) -> int:
    """The id of a session a client starts at ``wall_ms`` (its clock), ``nonce`` telling
    apart the sessions begun in the same millisecond (random on Ray)."""
    if wall_ms < 0 or wall_ms >> (63 - NONCE_BITS):
        raise ValueError(f"a session begins at a clock in [0, 2**42) ms, got {wall_ms}")
    return (wall_ms << NONCE_BITS) | (nonce & ((1 << NONCE_BITS) - 1))


def born_ms(client: int) -> int:
    """When the session ``client`` began, by its client's clock (:func:`new_client_id`)."""
    return client >> NONCE_BITS


class Verdict(enum.Enum):
    """What a leader does with an idempotent append of ``n`` entries from ``first_seq``."""

    NEW = "new"  # the session's next entries: append them
    DUPLICATE = "duplicate"  # all in the log already: answer with where they are
    PARTIAL = "partial"  # the first ones in the log (a call cut by a leader change)
    GAP = "gap"  # later than the session's next: an earlier append is missing
    QUEUED = "queued"  # a retry of entries this leader admitted and has not written yet
    EXPIRED = "expired"  # no such session (silent too long, or never started)
    UNKNOWN = "unknown"  # may be a session of entries whose table this member lacks
    FORGOTTEN = "forgotten"  # in the log, but older than the runs kept: no answer to give


@dataclass(frozen=True, slots=True)
class Check:
    """A verdict, and for DUPLICATE / PARTIAL the ``(first index, count)`` spans of the
    entries already in the log, in sequence order (``known`` entries in all)."""

    verdict: Verdict
    spans: tuple[tuple[int, int], ...] = ()
    known: int = 0
    next_seq: int = 0  # the sequence the session expects next


@dataclass(slots=True)
class Session:
    last_seq: int
    stamp: int  # the leader's stamp on its latest entry
    # [first seq, first index, count, stamp of its last entry], oldest first
    runs: list[list[int]] = field(default_factory=list)
    # the stamp of the newest entry before the runs kept (None: the table knows of none):
    # the session's stamp again when a truncation cuts every run kept
    before: int | None = None


class SessionTable:
    """The client sessions of one member's log (see the module's docstring)."""

    def __init__(self, ttl_ms: int, keep_runs: int = KEEP_RUNS):
        if ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
        self.ttl_ms = ttl_ms
        self.keep_runs = keep_runs
        # client id -> session, in the order of their latest entries (oldest first)
        self.sessions: dict[int, Session] = {}
        self.last_stamp = 0  # the latest stamp in the log
        # sessions expired by entries not known to be committed: (index of the entry whose
        # stamp expired them, client, session).  A truncation of that entry brings them
        # back, so every member's table is the one its log makes, whatever it once held
        self._expired: list[tuple[int, int, Session]] = []
        self._committed = -1
        # entries up to here are in the snapshot's table this one was rebuilt from: a log
        # reset below a snapshot gets them again, and they must not count twice
        self._covered = -1
        # the sessions of entries up to here are not known (a log reset or compacted below
        # a snapshot whose table was damaged): a session this table lacks may be one of
        # them, so none starts anew until a snapshot's table there is loaded (-1: all known)
        # or the log's stamps show that every one of them has expired
        self.unknown_upto = -1
        # ``(index, stamp)`` of the first stamped entry after ``unknown_upto``: no session
        # this table lacks has a later stamp (its writer knew them all, :meth:`bounded`)
        self.unknown_bound: tuple[int, int] | None = None
        self._known_at = -1  # the entry whose stamp expires every session lacked (-1: none)

    def __len__(self) -> int:
        return len(self.sessions)

    # -- following the log (the store's SessionWatcher) ------------------------------------
    def appended(self, indexes, records) -> None:
        """Prefixes of entries just written (ascending indexes): runs of one client's
        consecutive entries are taken as one.  numpy arrays (``records`` of
        ``SESSION_DTYPE``), or for a few entries lists (``(client, seq, stamp, crc)``)."""
        n = len(indexes)
        if n and indexes[0] <= self._covered:  # (ascending: the covered ones lead)
            skip = int(np.searchsorted(np.asarray(indexes), self._covered, side="right"))
            indexes, records = indexes[skip:], records[skip:]
            n = len(indexes)
        if not n:
            return
        if isinstance(records, list):
            self._rows(indexes, records)
            return
        idx = np.asarray(indexes, dtype=np.int64)
        client = records["client"].astype(np.int64)
        seq = records["seq"].astype(np.int64)
        stamp = records["stamp"].astype(np.int64)
        brk = np.ones(n, dtype=bool)
        brk[1:] = (
            (client[1:] != client[:-1]) | (seq[1:] != seq[:-1] + 1)
            | (idx[1:] != idx[:-1] + 1) | (stamp[1:] != stamp[:-1])
        )  # fmt: skip
        starts = np.flatnonzero(brk).tolist()
        ends = starts[1:] + [n]
        for a, z in zip(starts, ends, strict=True):
            self._run(int(client[a]), int(seq[a]), int(idx[a]), z - a, int(stamp[a]))

    def _rows(self, indexes: list[int], rows: list[tuple]) -> None:
        """:meth:`appended` for a few entries, in plain Python."""
        a = 0
        n = len(rows)
        while a < n:
            client, seq, _stamp, _crc = rows[a]
            z = a + 1
            while (
                z < n
                and rows[z][0] == client
                and rows[z][1] == seq + (z - a)
                and (indexes[z] == indexes[a] + (z - a))
                and rows[z][2] == rows[a][2]
            ):
                z += 1
            self._run(client, seq, indexes[a], z - a, rows[a][2])
            a = z

    def _expire_at(self, index: int) -> None:
        """Expire by the stamps up to entry ``index`` (whose stamp is the log's latest),
        keeping what it forgot until that entry is committed (:meth:`committed`)."""
        if index <= self._committed:  # never truncated: forgotten for good
            self.expire(self.last_stamp)
            return
        self._expired += [(index, c, s) for c, s in self.expire(self.last_stamp, keep=True)]

    def committed(self, index: int) -> None:
        """Entries up to ``index`` are committed (never truncated): sessions they expired
        are forgotten for good -- the ones this table lacks too."""
        self._committed = max(self._committed, index)
        if self._expired and self._expired[0][0] <= index:
            self._expired = [e for e in self._expired if e[0] > index]
        if 0 <= self._known_at <= index:
            self._all_known()

    def _all_known(self) -> None:
        """Every session this table lacked has expired by committed stamps: a member that
        held them has forgotten them at the same entry, and the tables are equal again."""
        self.unknown_upto, self.unknown_bound, self._known_at = -1, None, -1

    def _run(self, client: int, first_seq: int, first_index: int, count: int, stamp: int) -> None:
        """Consecutive entries of one session under one stamp (so that a truncation inside
        the run leaves its stamp right); then what that stamp expires, as of the run's
        first entry (a truncation that keeps it keeps the expiry)."""
        self._follow(client, first_seq, first_index, count, stamp)
        if stamp > self.last_stamp:
            self.last_stamp = stamp
            self._expire_at(first_index)  # bounded: what the log's own stamps say is gone
        if self.unknown_upto >= 0 and first_index > self.unknown_upto:
            if self.unknown_bound is None:
                self.unknown_bound = (first_index, stamp)
            if self._known_at < 0 and self.unknown_bound[1] < stamp - self.ttl_ms:
                self._known_at = first_index  # the lacked sessions expire here
                if first_index <= self._committed:
                    self._all_known()

    def _follow(self, client: int, first_seq: int, first_index: int, count: int,
                stamp: int) -> None:  # fmt: skip
        s = self.sessions.pop(client, None)  # re-inserted last: the newest activity
        if s is None:
            s = Session(first_seq - 1, stamp)
        runs = s.runs
        last = runs[-1] if runs else None
        if (last is not None and last[0] + last[2] == first_seq
                and last[1] + last[2] == first_index and last[3] == stamp):  # fmt: skip
            # one stamp per run: a truncation inside a run leaves its stamp right (a run
            # of several stamps would keep the cut entry's, which other members never had)
            last[2] += count
        else:
            runs.append([first_seq, first_index, count, stamp])
            if len(runs) > self.keep_runs:
                s.before = runs.pop(0)[3]
        s.last_seq = first_seq + count - 1
        s.stamp = max(s.stamp, stamp)
        self.sessions[client] = s

    def truncated(self, end_index: int) -> None:
        """Entries after ``end_index`` are gone: so is what the table knew of them (their
        stamps too, so every member expires sessions at the same point of the log).  What
        the table took from a snapshot (up to ``_covered``) stays: those entries are
        committed, and a log cut below them gets them again."""
        end_index = max(end_index, self._covered)
        if self.unknown_bound is not None and self.unknown_bound[0] > end_index:
            self.unknown_bound = None  # the next entry written there bounds them again
        if self._known_at > end_index:
            self._known_at = -1
        cut = False
        for client in list(self.sessions):
            cut = self._cut(client, end_index) or cut
        back = [e for e in self._expired if e[0] > end_index]
        if back:  # expired by entries now gone: alive again, as on members that never had
            # them -- cut like the others, as their own entries may be gone too
            self._expired = [e for e in self._expired if e[0] <= end_index]
            for _i, client, session in back:
                if client not in self.sessions:
                    self.sessions[client] = session
                    self._cut(client, end_index)
            cut = True
        if cut:  # back in the order of their latest entries
            self.sessions = dict(sorted(self.sessions.items(), key=lambda kv: kv[1].stamp))
            self.last_stamp = max((x.stamp for x in self.sessions.values()), default=0)

    def _cut(self, client: int, end_index: int) -> bool:
        """Session ``client`` without its entries after ``end_index``; whether any went."""
        s = self.sessions[client]
        runs = s.runs
        if not runs or runs[-1][1] + runs[-1][2] - 1 <= end_index:
            return False
        while runs and runs[-1][1] > end_index:
            first_seq = runs.pop()[0]
            s.last_seq = first_seq - 1  # seqs are consecutive in the log
        if runs and runs[-1][1] + runs[-1][2] - 1 > end_index:
            runs[-1][2] = end_index - runs[-1][1] + 1
            s.last_seq = runs[-1][0] + runs[-1][2] - 1
        if runs:
            s.stamp = runs[-1][3]  # (a cut entry's stamp may be later than the last kept)
        elif s.before is None:  # nothing of it is left in the log
            del self.sessions[client]
        else:  # its older entries are still there, in runs no longer kept: it goes on from
            s.stamp = s.before  # them (a retry of one is FORGOTTEN, never written again)
        return True

    def reset(self, begin_index: int) -> None:
        """The log restarts empty at ``begin_index`` (a snapshot install): the sessions
        come with the snapshot (:meth:`load`), the runs are not in this log."""
        self.sessions.clear()
        self._expired = []
        self._committed = max(self._committed, begin_index - 1)
        self._covered = -1
        self.unknown_upto = begin_index - 1  # until the snapshot's table is loaded
        self.unknown_bound, self._known_at = None, -1

    # -- what a leader decides -------------------------------------------------------------
    def check(self, client: int, first_seq: int, n: int, now: int, queued: int = -1,
              maybe_stored: bool = True) -> Check:  # fmt: skip
        """The verdict on ``n`` entries of ``client`` from ``first_seq``, the leader's stamp
        being ``now``; ``queued``: the last sequence of this session admitted and not yet
        written (-1: none); ``maybe_stored``: whether a call carrying these entries ended
        with an unknown outcome (the client says; a first call cannot be stored)."""
        s = self.sessions.get(client)
        last_seq = -1 if s is None else s.last_seq
        if last_seq < first_seq <= queued:  # the call it retries waits to be written here:
            return Check(Verdict.QUEUED, next_seq=queued + 1)  # its outcome is not known yet
        if s is None:  # a new session starts at 0 (its first entries may wait to be written)
            if queued < 0:
                if first_seq != 0 or not self.young(client, now):
                    return Check(Verdict.EXPIRED)
                # young: one of the sessions this table lacks, if it may lack any and the
                # entries may be stored
                new = not maybe_stored or self.bounded(client)
                return Check(Verdict.NEW if new else Verdict.UNKNOWN)
            verdict = Verdict.NEW if first_seq == queued + 1 else Verdict.GAP
            return Check(verdict, next_seq=queued + 1)
        if s.stamp < now - self.ttl_ms:
            return Check(Verdict.EXPIRED)
        expected = max(s.last_seq, queued) + 1
        if first_seq == expected:
            return Check(Verdict.NEW, next_seq=expected)
        if first_seq > expected:
            return Check(Verdict.GAP, next_seq=expected)
        if first_seq + n - 1 > s.last_seq and queued > s.last_seq:
            return Check(Verdict.GAP, next_seq=expected)  # overlaps appends not yet written
        last = min(first_seq + n - 1, s.last_seq)
        spans = self._spans(s, first_seq, last)
        if spans is None:
            return Check(Verdict.FORGOTTEN, next_seq=expected)
        known = last - first_seq + 1
        verdict = Verdict.DUPLICATE if known == n else Verdict.PARTIAL
        return Check(verdict, spans, known, expected)

    def young(self, client: int, now: int) -> bool:
        """Whether session ``client`` began too recently to have expired by stamps up to
        ``now``: less than half a TTL ago (the other half covers a client's clock running
        ahead of the stamp its first entry got)."""
        return born_ms(client) >= now - self.ttl_ms // 2

    def bounded(self, client: int) -> bool:
        """Whether session ``client``, not in the table, is none of those it lacks.

        A lacked session's entries are stamped at most ``unknown_bound`` (stamps never go
        back along a log: a leader stamps at least its table's latest, and the writer of
        the bound knew every session before it), and a client's clock runs at most half a
        TTL ahead of its leaders', so such a session began by ``bound + ttl/2``: one begun
        later is new.  A leader lacking sessions refuses only the clients that began before
        its bound, and with no bound yet every new one."""
        if self.unknown_upto < 0:
            return True
        bound = self.unknown_bound
        return bound is not None and born_ms(client) > bound[1] + self.ttl_ms // 2

    @staticmethod
    def _spans(s: Session, lo: int, hi: int) -> tuple[tuple[int, int], ...] | None:
        """Where sequences ``lo..hi`` of session ``s`` sit, or None when not all are kept."""
        out = []
        want = lo
        for first_seq, first_index, count, _stamp in s.runs:
            end = first_seq + count - 1
            if end < want or first_seq > hi:
                continue
            if first_seq > want:
                return None  # a hole: the run holding ``want`` is no longer kept
            a = want - first_seq
            z = min(hi, end) - first_seq
            out.append((first_index + a, z - a + 1))
            want = min(hi, end) + 1
            if want > hi:
                return tuple(out)
        return None

    def expire(self, now: int, keep: bool = False) -> list:
        """Forget the sessions silent since before ``now - ttl_ms``: their client ids, or
        with ``keep`` their ``(client id, session)`` pairs (to bring back on a truncation)."""
        cut = now - self.ttl_ms
        gone = []
        for client, s in self.sessions.items():  # oldest activity first
            if s.stamp >= cut:
                break
            gone.append(client)
        if keep:
            return [(client, self.sessions.pop(client)) for client in gone]
        for client in gone:
            del self.sessions[client]
        return gone

    def next_stamp(self, wall_ms: int) -> int:
        """The stamp a leader writes now: its wall clock, never below the log's latest."""
        bound = self.unknown_bound  # (the sessions lacked were stamped at most that)
        return max(wall_ms, self.last_stamp, -1 if bound is None else bound[1])

    # -- snapshots and size ----------------------------------------------------------------
    def dump(self) -> dict:
        """The table as plain data (a snapshot carries it)."""
        return {
            "ttl_ms": self.ttl_ms,
            "last_stamp": self.last_stamp,
            "unknown_upto": self.unknown_upto,
            "unknown_bound": None if self.unknown_bound is None else list(self.unknown_bound),
            "sessions": [
                [c, s.last_seq, s.stamp, [list(r) for r in s.runs], s.before]
                for c, s in self.sessions.items()
            ],  # fmt: skip
        }

    def at(self, index: int) -> dict:
        """The table as the log up to ``index`` makes it (a snapshot at ``index`` carries
        this): what later entries added is left out, as a truncation would."""
        copy = SessionTable(self.ttl_ms, self.keep_runs)
        copy.load(self.dump())
        copy._expired = [(i, c, _copy(s)) for i, c, s in self._expired]
        copy.truncated(index)
        return copy.dump()

    def rebuild(self, doc: dict | None, records, covered: int = -1, unknown_upto: int = -1) -> None:
        """Start again from a snapshot's table (``doc``, of the log up to ``covered``;
        None: empty, the sessions of entries up to ``unknown_upto`` unknown) and the log's
        session prefixes after the snapshot (``records``: ``(indexes, records)``
        stretches).  Entries up to ``covered`` written later (a log reset below the
        snapshot fills in again) are already in ``doc``."""
        self.sessions, self.last_stamp, self._expired = {}, 0, []
        self._covered = covered
        self.unknown_upto, self.unknown_bound, self._known_at = unknown_upto, None, -1
        if doc is not None:
            self.load(doc)
            bound = self.unknown_bound  # (the snapshot's entries are committed)
            if bound is not None and bound[1] < self.last_stamp - self.ttl_ms:
                self._all_known()
        for indexes, recs in records:
            self.appended(indexes, recs)

    def load(self, doc: dict) -> None:
        self.last_stamp = int(doc["last_stamp"])
        # a table that lacked sessions when its snapshot was taken still lacks them
        self.unknown_upto = int(doc.get("unknown_upto", -1))
        bound = doc.get("unknown_bound") if self.unknown_upto >= 0 else None
        self.unknown_bound = None if bound is None else (int(bound[0]), int(bound[1]))
        self._known_at = -1
        self.sessions = {}
        for c, q, t, runs, *before in doc["sessions"]:  # (tables once had no ``before``)
            b = before[0] if before else None
            self.sessions[int(c)] = Session(int(q), int(t), [list(map(int, r)) for r in runs],
                                            None if b is None else int(b))  # fmt: skip


def _copy(s: Session) -> Session:
    return Session(s.last_seq, s.stamp, [list(r) for r in s.runs], s.before)


def recover_sessions(store, ttl_ms: int) -> SessionTable:
    """The table of the log ``store`` holds (a restart), then kept in step with it: the
    store tells it of every session prefix written, every truncation and reset."""
    table = SessionTable(ttl_ms)
    table.committed(store.committed_index)
    # a compacted log: the sessions below its begin live in a snapshot, loaded next
    table.unknown_upto = store.ledger_begin_index - 1
    for indexes, records in store.session_records(store.ledger_begin_index):
        table.appended(indexes, records)  # (expiring what the log's stamps say is gone)
    store.watch_sessions(table)
    return table


__all__ = [
    "KEEP_RUNS",
    "NONCE_BITS",
    "Check",
    "Session",
    "SessionTable",
    "Verdict",
    "born_ms",
    "new_client_id",
    "recover_sessions",
]
