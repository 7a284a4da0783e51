"""The safety checks of the whole-group simulation (Log Matching, Election Safety, Leader
Completeness, committed entries never change, acknowledged appends stay where they were
acknowledged, rounds answered in time) and the convergence checks at the end of a run."""

from __future__ import annotations

from dataclasses import replace

from rayledger.replication.sessions import SessionTable
from rayledger.storage import LogStore
from rayledger.storage.snapshots import SESSIONS_FILE, read_sessions

from .node_state import SimMember
from .sim_config import ROUND_SLACK_MS


class Invariants:
    """What the checks remember and the checks themselves (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _headers(self, store: LogStore, lo: int, hi: int) -> list[tuple]:
        """(index, term, chain crc, body crc) of entries lo..hi."""
        out = []
        start = lo
        while start <= hi:
            batch = store.read_batch(start, 1 << 20, hi - start + 1)
            for h in batch.headers():
                out.append((h[2], h[3], h[6], h[7]))
            start += batch.count
        return out

    def check_invariants(self) -> None:
        now = self.clock.now_ms
        stuck_after = self.replication.max_wait_ack_time_ms + ROUND_SLACK_MS
        for m in self.members.values():
            if not m.alive:
                continue
            lg = m.node.logic
            st = lg.state
            if st.is_leader:
                term = st.current_term
                holder = self.leaders_by_term.get(term)
                if holder is None:
                    self.leaders_by_term[term] = m.id
                    self.leader_incarnation[term] = m.incarnation
                    self._check_leader_completeness(m, term)
                elif holder == m.id and self.leader_incarnation[term] != m.incarnation:
                    # a power loss: it may have lost entries it acknowledged in that term
                    self.fail(f"{m.id} leads term {term} again after a restart")
                elif holder != m.id:
                    self.fail(f"Election Safety: {m.id} and {holder} both lead term {term}")
        for m in self.members.values():
            if not m.alive:
                continue
            self._check_member(m)
            lg = m.node.logic
            if m.node.book.rounds and lg.leads(lg.leading_term):
                for rid, (rnd, _) in m.node.book.rounds.items():
                    born = m.node.round_born.get(rid, now)
                    limit, since = stuck_after, born
                    if m.node.hung or m.node.last_hang_ms >= born:
                        # a hung helper answers nothing: the leader replaces it and hands
                        # the term on (one helper wait, then a transfer), ending the round;
                        # a helper that begins to hang again meanwhile starts that over
                        limit += m.node.supervisor.helper_wait_ms()
                        limit += self.election.leadership_transfer_wait_timeout_ms
                        since = max(born, m.node.hang_began_ms)
                    if rnd.term == lg.leading_term and now - since > limit:
                        self.fail(
                            f"{m.id} leads term {rnd.term} but round {rid} "
                            f"({rnd.first_index}..{rnd.last_index}, written at {born}) "
                            f"is unanswered after {now - born} ms"
                        )

    def _check_member(self, m: SimMember) -> None:
        store = m.store
        end = store.ledger_end_index
        cut = self.touched.pop(m.id, None)
        if cut is not None:
            self._check_sessions(m)
            if cut < m.verified_end:
                m.verified_end = cut
        if m.node is not None and m.node.logic.sessions.unknown_upto >= 0:
            self._check_lack(m)
        if end > m.verified_end:
            lo = max(m.verified_end + 1, store.ledger_begin_index)
            for index, term, chain, bcrc in self._headers(store, lo, end):
                key = (index, term)
                seen = self.entries.get(key)
                if seen is None:
                    self.entries[key] = (chain, bcrc)
                elif seen != (chain, bcrc):
                    self.fail(
                        f"Log Matching: {m.id} holds a different entry at index {index} term {term}"
                    )
            m.verified_end = end
        elif end < m.verified_end:
            m.verified_end = end
        committed = store.committed_index
        if committed > end:
            self.fail(f"{m.id} committed {committed} beyond its end {end}")
        if committed < m.committed_seen:
            self.fail(f"{m.id} committed index went back from {m.committed_seen} to {committed}")
        if committed > m.committed_seen:
            lo = max(m.committed_seen + 1, store.ledger_begin_index)
            if self.machine_path is not None:  # the committed log, for machine replays
                for e in store.get_range(lo, committed + 1):
                    if e.index not in self.committed or self.durability_void:
                        self.committed_entries[e.index] = e
            for index, term, chain, bcrc in self._headers(store, lo, committed):
                got = self.committed.get(index)
                if got is None:
                    self.committed[index] = (term, chain, bcrc)
                    unseen = self.acked_unseen.pop(index, None)
                    if unseen is not None and unseen[0] != term and not self.durability_void:
                        self.fail(
                            f"append {unseen[1]} acknowledged at {index} (term {unseen[0]}) "
                            f"but committed there in term {term}"
                        )
                elif got != (term, chain, bcrc):
                    if self.durability_void:
                        self.stats["committed_overwritten_after_power_loss"] += 1
                        self.committed[index] = (term, chain, bcrc)
                        continue
                    self.fail(
                        f"{m.id} committed index {index} as term {term}, "
                        f"another member committed term {got[0]} there"
                    )
            m.committed_seen = committed
            if committed > self.max_committed:
                self.max_committed = committed
            if m.alive:
                self._note_commit_term(m.node.logic.state.current_term, committed)

    def _check_lack(self, m: SimMember) -> None:
        """A member lacking client sessions holds no snapshot that knows them at or past
        its log's begin - 1 (one it could rebuild its table from)."""
        shelf = m.node.logic.snapshots
        if shelf is None:
            return
        begin = m.store.ledger_begin_index
        key = (begin, tuple(meta.index for meta in shelf.store.list()))
        if self.lack_checked.get(m.id) == key:
            return
        self.lack_checked[m.id] = key
        at = _whole_sessions_at(shelf.store, begin - 1)
        if at is not None:
            self.fail(f"{m.id} lacks client sessions its own snapshot at {at} knows "
                      f"(its log begins at {begin})")  # fmt: skip

    def _check_sessions(self, m: SimMember) -> None:
        """After a truncation or reset, the member's session table is the one its log makes:
        what a restart would rebuild from its snapshot and log (a session an entry now cut
        had expired is alive again; one the cut entries started is gone)."""
        lg = m.node.logic
        live = lg.sessions
        made = SessionTable(live.ttl_ms, live.keep_runs)
        store = m.store
        begin = store.ledger_begin_index
        if lg.snapshots is None:
            made.rebuild(None, store.session_records(begin))
        elif not lg._sessions_from_snapshot(begin, made) and begin > 0:
            return  # no whole snapshot there: the table lacks what it held (unknown_upto)
        got = {c: (s.last_seq, s.stamp) for c, s in live.sessions.items()}
        want = {c: (s.last_seq, s.stamp) for c, s in made.sessions.items()}
        if got != want:
            only = sorted(set(got.items()) ^ set(want.items()))[:6]
            self.fail(f"{m.id}'s session table is not the one its log makes after a cut to "
                      f"{store.ledger_end_index}: {only}")  # fmt: skip

    def _note_commit_term(self, term: int, index: int) -> None:
        """Entries up to ``index`` were committed in ``term`` or before."""
        if index > self.commit_terms.get(term, -1):
            self.commit_terms[term] = index

    def _committed_before(self, term: int) -> int:
        """The highest index known committed in a term before ``term``."""
        return max((i for t, i in self.commit_terms.items() if t < term), default=-1)

    def _check_leader_completeness(self, m: SimMember, term: int) -> None:
        c = self._committed_before(term)
        if c < 0 or self.durability_void:
            return
        store = m.store
        if store.ledger_end_index < c:
            self.fail(
                f"Leader Completeness: leader {m.id} of term {term} ends at "
                f"{store.ledger_end_index}, {c} was committed before"
            )
        if c < store.ledger_begin_index:  # compacted into a snapshot: committed by then
            return
        (h,) = self._headers(store, c, c)
        if (h[1], h[2], h[3]) != self.committed[c]:
            self.fail(
                f"Leader Completeness: leader {m.id} of term {term} holds another entry "
                f"at index {c}, committed before"
            )

    # ================================================================ convergence

    def converged(self) -> bool:
        """One leader followed by all; every log identical and fully committed; clients answered.
        With configuration changes: every member of the leader's configuration,
        which is committed with no plan left (members outside it may lag for good)."""
        members = self.current_members()
        if members is None:
            return False
        alive = [self.members[m] for m in members if self.members[m].alive]
        if len(alive) != len(members) or (len(self.ids) == self.n and len(alive) != self.n):
            return False
        leaders = [m for m in alive if m.state.is_leader]
        if len(leaders) != 1:
            return False
        leader = leaders[0]
        clog = leader.node.logic.config_log
        if clog.latest().joining or clog.pending(leader.store.committed_index):
            return False
        if leader.node.book.config_queued:
            return False
        node = leader.node
        term = leader.state.current_term
        end = leader.store.ledger_end_index
        if leader.store.committed_index != end or node.logic.ready_term != term:
            return False
        if node.checker.core.pending_count or node.book.rounds:
            return False
        for m in alive:
            st = m.state
            if st.current_term != term or st.leader_id != leader.id:
                return False
            if m.store.ledger_end_index != end or m.store.committed_index != end:
                return False
        if any(c.outstanding is not None for c in self.clients):
            return False
        if self.machine_path is not None and not self.machines_converged():
            return False
        if any(self._sessions_to_get(m, leader) for m in alive if m.node is not None):
            return False  # a member waits for a snapshot's client sessions
        return True

    @staticmethod
    def _sessions_to_get(m: SimMember, leader: SimMember) -> bool:
        """Whether ``m`` lacks client sessions its leader holds a snapshot of, one it asks
        for.  (Lacked by the leader too, they are known once the log's stamps show them
        expired, which takes appends; :meth:`_same_sessions` checks that what such a
        member holds agrees with the others.)"""
        lg = m.node.logic
        if lg.sessions.unknown_upto < 0 or leader.node.logic.snapshots is None:
            return False
        want = lg.snapshot_wanted(m.store.ledger_begin_index)
        return _whole_sessions_at(leader.node.logic.snapshots.store, want) is not None

    def _same_sessions(self, members) -> None:
        """Identical logs make identical session tables: every member knows the same
        sessions, each at the same last sequence and stamp (a member that forgot one its
        log still holds would refuse the client, or take a retry as new), and the runs of
        entries one keeps are the newest of the other's (one may keep fewer old runs, but
        none may answer a retry from another entry)."""
        live = {m.id: m.node.logic.sessions for m in members if m.node is not None}
        tables = {
            mid: {c: (s.last_seq, s.stamp) for c, s in t.sessions.items()}
            for mid, t in live.items()
        }
        if not tables:
            return
        # the fullest table: one that lacks sessions holds those of the others, no more
        a = min(tables, key=lambda mid: (live[mid].unknown_upto >= 0, -len(tables[mid])))
        first = tables[a]
        for b, table in tables.items():
            if live[b].unknown_upto >= 0:
                m = self.members[b]
                shelf = m.node.logic.snapshots
                at = shelf and _whole_sessions_at(shelf.store, m.store.ledger_begin_index - 1)
                if at is not None:
                    self.fail(f"{b} lacks client sessions its own snapshot at {at} knows")
                lacked = {(c, v) for c, v in first.items() if c not in table}
                extra = set(table.items()) - set(first.items())
                bound = live[b].unknown_bound
                late = {(c, v) for c, v in lacked if bound is not None and v[1] > bound[1]}
                if extra or late:
                    self.fail(f"{b}'s session table, which lacks some, is not {a}'s less the "
                              f"ones it lacks (stamped by {bound}): holds {sorted(extra)[:4]}, "
                              f"lacks {sorted(late)[:4]}")  # fmt: skip
            elif table != first:
                only = set(first.items()) ^ set(table.items())
                self.fail(f"session tables differ after convergence: {a} vs {b}: "
                          f"{sorted(only)[:6]}")  # fmt: skip
        runs = {mid: t.sessions for mid, t in live.items()}
        for b, sessions in runs.items():
            for c, s in sessions.items():
                if c not in runs[a]:
                    continue  # (a table lacking sessions holds none the fullest lacks)
                mine, theirs = s.runs, runs[a][c].runs
                if live[b].unknown_upto >= 0 and mine:
                    mine = [_whole_run(mine[0], theirs), *mine[1:]]
                n = min(len(mine), len(theirs))
                if mine[len(mine) - n :] != theirs[len(theirs) - n :]:
                    self.fail(f"session runs differ after convergence: {a} vs {b}, client "
                              f"{c}: {theirs} vs {mine}")  # fmt: skip

    def final_check(self) -> None:
        """Identical logs everywhere; acknowledged appends committed where acknowledged; no body twice."""
        if self.acked_unseen and not self.durability_void:
            self.fail(f"acknowledged but never committed: {sorted(self.acked_unseen)[:10]}")
        logs = {}
        # the members of the configuration: those outside it may lag for good
        members = [self.members[m] for m in self.current_members() or self.ids]
        # compacted logs begin where each member's snapshots let them: compare from the
        # highest begin (the entries below it are checked as committed, step by step)
        common = max(m.store.ledger_begin_index for m in members)
        for m in members:
            store = m.store
            start = max(common, store.ledger_begin_index)
            data = store.read_batch(start).data if store.ledger_end_index >= start else b""
            logs[m.id] = (start, store.ledger_end_index, data)
        first = next(iter(logs.values()))
        for mid, got in logs.items():
            if got != first:
                if self.durability_void:
                    # a power loss without sync_flush dropped a committed entry and a new
                    # leader wrote another there; a follower that had committed the lost one
                    # keeps it (it never truncates below its committed index): the
                    # divergence async mode allows (seed 30279), counted
                    self.stats["diverged_after_power_loss"] += 1
                    return
                self.fail(f"logs differ after convergence: {mid} {got[:2]} vs {first[:2]}")
        self._same_sessions(members)
        store = members[0].store
        bodies: dict[bytes, int] = {}
        key = self._body_key  # as the client sent it: without a state machine's stamps
        committed = store.get_range(store.ledger_begin_index, store.committed_index + 1)
        if store.ledger_begin_index > 0:  # compacted: the whole log as the checks saw it
            seen = self.committed_entries
            committed = [seen[i] for i in range(store.ledger_begin_index) if i in seen]
            committed += store.get_range(store.ledger_begin_index, store.committed_index + 1)
        for e in committed:
            if not e.body or e.channel:  # a term's first entry, a configuration
                continue
            k = key(e.body)
            if k in bodies:
                self.fail(f"body {e.body[:24]!r} committed twice, at {bodies[k]} and {e.index}")
            bodies[k] = e.index
        for index, body in self.acked.items():
            if bodies.get(key(body)) != index:
                if self.durability_void:
                    self.stats["acked_lost_after_power_loss"] += 1
                    continue
                self.fail(
                    f"acknowledged append {body[:24]!r} at {index} is at {bodies.get(body)} in the committed log"
                )


def _whole_run(run: list[int], runs: list[list[int]]) -> list[int]:
    """``run``, the oldest a table lacking sessions keeps, as the run of ``runs`` (a whole
    table's) it ends: its log may begin inside that run."""
    seq, index, count, stamp = run
    for r in runs:
        if (r[0] <= seq and r[0] + r[2] == seq + count and r[1] + seq - r[0] == index
                and r[3] == stamp):  # fmt: skip
            return r
    return run


def _whole_sessions_at(store, index: int) -> int | None:
    """The index of a snapshot in ``store`` at or past ``index`` whose session table is
    whole (verified, no session unknown), or None."""
    for meta in store.list():
        if meta.index < index:
            continue
        files = tuple(f for f in meta.files if f[0] == SESSIONS_FILE)
        if files and store.verify(replace(meta, files=files)) is None:
            if int(read_sessions(meta.path).get("unknown_upto", -1)) < 0:
                return meta.index
    return None
