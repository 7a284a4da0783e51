"""Each safety fix, reverted on its own: the simulation must catch every one of them.

``revert(name)`` is a context manager that puts back the behaviour the fix replaced (by
patching the shipped cores in this process only), so that a sweep can show the fix is what
keeps it safe (docs/SAFETY.md's table).  ``REVERTS`` names them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

from rayledger.actors.core import client_session as cs
from rayledger.actors.core.fastpath import FastPathLogic
from rayledger.actors.core.machine import MachineCore
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.reads import ReadIndexLogic
from rayledger.actors.core.round_path import RoundPath
from rayledger.actors.core.rounds import RoundBook
from rayledger.actors.core.supervision import Supervisor
from rayledger.election.membership import Membership
from rayledger.election.messages import VoteResult
from rayledger.election.voting import Voting
from rayledger.integration.kv.machine import KvMachine
from rayledger.replication.handler import EntryHandler
from rayledger.replication.sessions import Check, Session, SessionTable, Verdict
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.snapshots import SESSIONS_FILE, read_sessions


def _checker_config(patch: Callable) -> None:
    """The checker learns a change only through the role lock, and the next change is
    admitted on the commits of a checker that may lag."""
    patch(RoundPath, "_config_in", lambda self, first, last: None)
    patch(MemberLogic, "checker_counts_latest", lambda self: True)


def _term_queue(patch: Callable) -> None:
    """Appends queued when a term ends stay queued for the member's next term."""
    patch(RoundBook, "settle_term", lambda self, force=False: None)


def _read_expire(patch: Callable) -> None:
    """A round confirmed at once on expiry trips an assertion (the readers are lost)."""
    real = ReadIndexLogic.expire

    def expire(self, now_ms):
        sends, expired, confirmed = real(self, now_ms)
        assert not confirmed
        return sends, expired, confirmed

    patch(ReadIndexLogic, "expire", expire)

    def configure(self, voters, now_ms=0):  # the round in flight stays counted as it was
        self.others = [p for p in voters if p != self.self_id]
        self.quorum = len(voters) // 2 + 1
        self._own = 1 if self.self_id in voters else 0
        self._lease = (-1, -1)
        return [], []

    patch(ReadIndexLogic, "configure", configure)


def _lease_config(patch: Callable) -> None:
    """A lease confirmed by the old voters survives configuration changes (a round in
    flight is still counted again: that is ``read-expire``)."""
    real = ReadIndexLogic.configure

    def configure(self, voters, now_ms=0):
        lease = self._lease
        out = real(self, voters, now_ms)
        self._lease = lease
        return out

    patch(ReadIndexLogic, "configure", configure)


def _session_expiry(patch: Callable) -> None:
    """Sessions expired by an entry later truncated stay forgotten, and a run of entries
    (one client's, in one batch) keeps the stamp of its last entry even after a truncation
    cuts that entry."""

    def appended(self, indexes, records):
        if not len(indexes):
            return
        if not isinstance(records, list):
            records = [tuple(int(x) for x in r) for r in records.tolist()]
        indexes = [int(i) for i in indexes]
        a = 0
        while a < len(records):
            client, seq = records[a][0], records[a][1]
            z = a + 1
            while (z < len(records) and records[z][0] == client
                   and records[z][1] == seq + (z - a) and indexes[z] == indexes[a] + (z - a)):  # fmt: skip
                z += 1
            run(self, client, seq, indexes[a], z - a, records[z - 1][2])
            a = z
        self.last_stamp = max(self.last_stamp, max(r[2] for r in records))
        self.expire(self.last_stamp)

    def run(self, client, first_seq, first_index, count, stamp):
        s = self.sessions.pop(client, None)
        if s is None:
            s = Session(first_seq - 1, stamp)
        runs = s.runs
        last = runs[-1] if runs else None
        if last is not None and last[0] + last[2] == first_seq and last[1] + last[2] == first_index:
            last[2] += count
            last[3] = stamp
        else:
            runs.append([first_seq, first_index, count, stamp])
            if len(runs) > self.keep_runs:
                del runs[0]
        s.last_seq = first_seq + count - 1
        s.stamp = max(s.stamp, stamp)
        self.sessions[client] = s

    patch(SessionTable, "appended", appended)


def _snapshot_point(patch: Callable) -> None:
    """A TRUNCATE at the snapshot point is refused (no entry there to match)."""
    real = EntryHandler._truncate

    def truncate(self, req):
        st = self.store
        at = req.first_index
        if not req.reset and at == st.ledger_begin_index - 1 and at >= self.matched_index:
            if not self._entry_matches(at, req.entry_term, req.entry_pos):
                return self._resp(req, ResponseCode.INCONSISTENT_STATE)
        return real(self, req)

    patch(EntryHandler, "_truncate", truncate)


def _stranded_machine(patch: Callable) -> None:
    """A machine below its log's begin asks no leader for a snapshot, and its member leads
    with it."""
    patch(MachineCore, "snapshot_wanted", lambda self, begin: -1)
    real = MachineCore._wait_ready

    def wait_ready(self, leads, begin=lambda: 0):
        stranded, self.stranded = self.stranded, False
        try:
            return (yield from real(self, leads, begin))
        finally:
            self.stranded = stranded or self.stranded

    patch(MachineCore, "_wait_ready", wait_ready)


def _votes_by_configuration(patch: Callable) -> None:
    """A voter refuses any candidate that is not a voter in its own latest configuration."""
    real = Voting._judge_vote

    def judge(self, req, now_ms, *, self_vote):
        if not self.sh.state.is_voter(req.leader_id):
            return self._vote_response(req, VoteResult.REJECT_UNKNOWN_LEADER), []
        return real(self, req, now_ms, self_vote=self_vote)

    patch(Voting, "_judge_vote", judge)


def _live_majority(patch: Callable) -> None:
    """Changes of voters (the operator's, a plan's removal) ignore lost nodes."""
    patch(Membership, "check_live", lambda self, current, after: after)


def _stopped_spawns(patch: Callable) -> None:
    """A replacement stopped as failed stays (its plan never ends), and one added is still
    counted as starting until it is in the configuration."""
    patch(Membership, "stopped_spawns", lambda self, current, nodes=None: None)
    real = Membership.spawn_done

    def spawn_done(self, member, ok, code=None):
        return real(self, member, ok, code) if not ok else False

    patch(Membership, "spawn_done", spawn_done)


def _kv_snapshot_cut(patch: Callable) -> None:
    """A KV snapshot loads only at the very index of the last entry the machine applied."""
    real = KvMachine.load_snapshot

    def load(self, path, index):
        from rayledger.integration.kv.machine import SNAPSHOT_FILE, read_snapshot

        _, applied, _ = read_snapshot(f"{path}/{SNAPSHOT_FILE}")
        if applied != index:
            raise LedgerError.of(ResponseCode.INCONSISTENT_STATE,
                                 f"snapshot {path} holds the state at {applied}, not {index}")  # fmt: skip
        real(self, path, index)

    patch(KvMachine, "load_snapshot", load)


def _queued_retry(patch: Callable) -> None:
    """A retry of an append still queued on the leader is refused as a gap."""
    real = SessionTable.check

    def check(self, client, first_seq, n, now, queued=-1):
        c = real(self, client, first_seq, n, now, queued)
        return Check(Verdict.GAP, next_seq=c.next_seq) if c.verdict is Verdict.QUEUED else c

    patch(SessionTable, "check", check)


def _client_stays(patch: Callable) -> None:
    """A client never leaves a session whose append ended unacknowledged: a gap the next
    leader sees is retried under the same identity until the session expires."""
    patch(cs.ClientSessions, "_ended", lambda self, a, why: cs.SessionOut())
    patch(
        cs.ClientSessions, "_gap", lambda self, live, maybe: cs.SessionOut(action=cs.Action.RETRY)
    )


def _mq_queue_table(patch: Callable) -> None:
    """The commit log takes no snapshots: a member reset past its queues rebuilds them from
    the reset log alone (a queue with no message since is unknown to it), and its log is
    compacted up to its own checkpoint."""
    import shutil

    from rayledger.actors.machine import StateMachine
    from rayledger.integration.rocketmq.commitlog import CommitLogMachine
    from rayledger.integration.rocketmq.keyindex import KeyIndex

    def rebase(self, index):
        for q in self.queues.values():
            q.close()
        self.keys.close()
        self.queues = {}
        if self.root is not None:
            shutil.rmtree(self.root / "cq", ignore_errors=True)
            (self.root / "keys").unlink(missing_ok=True)
        self.keys = KeyIndex(self.root / "keys" if self.root is not None else None)
        self.applied = index
        self._checkpoint()

    patch(CommitLogMachine, "snapshot", StateMachine.snapshot)
    patch(CommitLogMachine, "rebase", rebase)


def _machine_ahead(patch: Callable) -> None:
    """A machine whose own state a power loss left ahead of its log answers queries."""
    real = MachineCore.__init__

    def init(self, *args, **kw):
        real(self, *args, **kw)
        self.ahead_of_log = False

    patch(MachineCore, "__init__", init)


def _gone_spawns(patch: Callable) -> None:
    """Only the leader that stopped a replacement removes it: Ray's view does not say a
    member's process is gone (its node is unknown, as before it started)."""
    from rayledger.election.membership import GONE

    real, real_lost = Membership.stopped_spawns, Membership.lost
    patch(Membership, "stopped_spawns", lambda self, current, nodes=None: real(self, current))

    def lost(self, current, alive, nodes, now_ms, taken=()):
        nodes = {m: None if n == GONE else n for m, n in nodes.items()}
        return real_lost(self, current, alive, nodes, now_ms, taken)

    patch(Membership, "lost", lost)


def _spawn_maybe_written(patch: Callable) -> None:
    """A replacement whose change failed in any way is stopped, even one that may be in
    the log."""
    real = Membership.spawn_done

    def spawn_done(self, member, ok, code=None):
        real(self, member, ok, code)
        if not ok:
            self._failed.add(member)
        return not ok

    patch(Membership, "spawn_done", spawn_done)


def _stranded_at_start(patch: Callable) -> None:
    """A new leader's machine counts as stranded only once a batch found it so."""
    real = MachineCore._wait_ready
    patch(MachineCore, "_wait_ready", lambda self, leads, begin: real(self, leads, lambda: 0))


def _role_lock(patch: Callable) -> None:
    """A reconfiguration waits under the role lock for a booting dispatcher, and a helper's
    restore waits behind reconfigurations."""
    from rayledger.actors.core import supervision as sv

    def next_(self):
        if self._again:
            self._again = False
            return self.supervisor.role_changes()
        if self._reconfigure:
            self._reconfigure = False
            return self.supervisor.reconfigure()
        if self._waiting:
            return self._waiting.pop(0)
        self.busy = False
        return None

    def set_up_added(self, term, peers, give_up):
        for peer in peers:
            while self.logic.leads(term):
                done = yield sv.SetUpHelpers(term, self.logic.term_start_index,
                                        self.logic.leader_info(), self.rpc_ms, peer)  # fmt: skip
                if not isinstance(done.value, sv.Failed):
                    self.heard.add(("dispatcher", peer))
                    break
                if done.now_ms > give_up:
                    break
                yield sv.Sleep(sv.RETRY_MS[1])

    patch(sv.RoleQueue, "next", next_)
    patch(sv.Supervisor, "_set_up_added", set_up_added)


def _office_wait(patch: Callable) -> None:
    """A new leader's wait for its machine ends at a moment as a candidate."""
    patch(MemberLogic, "holds_office", MemberLogic.leads)


def _setup_after_candidacy(patch: Callable) -> None:
    """A booting dispatcher's set-up, tried again later, is dropped when its leader is a
    candidate for a moment then (elected again in the same term, no role change runs)."""
    from rayledger.actors.core import supervision as sv

    def set_up_later(self, term, peers, give_up):
        yield sv.Sleep(sv.RETRY_MS[1])
        if self.logic.leads(term):
            setup = self._set_up_added(term, peers, give_up)
            yield sv.Queue(sv.Process("dispatcher-setup", setup, exclusive=True))

    patch(sv.Supervisor, "_set_up_later", set_up_later)


def _snapshot_after_reset(patch: Callable) -> None:
    """A snapshot is cut where the machine stands even when the log was reset past it."""
    real = MachineCore._snapshot_due
    patch(MachineCore, "_snapshot_due", lambda self, entries, begin=0: real(self, entries))


def _reset_term_floor(patch: Callable) -> None:
    """A log reset to the leader's begin reports last term -1 until its first entry."""
    from rayledger.storage.store import LogStore

    real = LogStore.reset
    patch(LogStore, "reset", lambda self, begin, pos, term_floor=-1: real(self, begin, pos))


def _read_index_end(patch: Callable) -> None:
    """A leader's read index is its committed index, which its followers may be past."""
    from rayledger.actors.core.read_path import Confirm, ReadPath
    from rayledger.actors.core.reads import Consistency
    from rayledger.actors.core.supervision import Failed

    def leader_read(self, c, deadline):
        lg = self.logic
        term, start = lg.read_base()
        now = yield from self._wait(start, deadline)
        if lg.read_base()[0] != term:
            raise self.not_leader()
        index = lg.store.committed_index
        if c is not Consistency.LINEARIZABLE and lg.lease_holds(self.reads, term, now):
            return index
        got = (yield Confirm(term, index, deadline)).value
        if isinstance(got, Failed):
            raise self.not_leader()
        return got

    patch(ReadPath, "_leader_read", leader_read)


def _same_term_campaign(patch: Callable) -> None:
    """A candidate campaigns again in its current term even after its voters changed."""
    from rayledger.election.member_state import MemberState

    patch(MemberState, "voters_changed_in_term", lambda self: False)


def _graph_stop(patch: Callable) -> None:
    """A graph stopped within the term (a reconfiguration, a restored helper) drops the
    rounds in it: they wait unanswered until the term ends."""

    def stop(self):
        self._build_at = None
        self.parked = False
        self.building = None
        self._abandon()
        self.term = -1

    patch(FastPathLogic, "_stop", stop)


def _snapshot_ask(patch: Callable) -> None:
    """A leader whose newest snapshot stops short of what a follower's machine needs
    waits for its next periodic one, which an idle group never takes."""
    patch(MachineCore, "_snapshot_asked", lambda self, index, begin, have=None: None)


def _watch_candidate(patch: Callable) -> None:
    """A watch replaces a hung helper only when a ping ends while its member leads."""
    patch(Supervisor, "_may_replace", lambda self, term: self.logic.leads(term))


def _session_born(patch: Callable) -> None:
    """An unknown session's first sequence always starts a new session, however long ago
    the session began: a retry that outlived its session is stored a second time."""
    patch(SessionTable, "young", lambda self, client, now: True)


def _snapshot_sessions_twice(patch: Callable) -> None:
    """A table rebuilt from a snapshot counts again the entries the snapshot holds when a
    log reset below it fills in."""
    real = SessionTable.rebuild
    patch(SessionTable, "rebuild", lambda self, doc, records, covered=-1: real(self, doc, records))


def _truncated_stamp(patch: Callable) -> None:
    """A truncation that cuts every run of a session kept leaves it the cut entries' stamp."""
    real = SessionTable.truncated

    def truncated(self, end_index):
        old = {c: s.stamp for c, s in self.sessions.items() if s.runs}
        real(self, end_index)
        cut = {c: old[c] for c, s in self.sessions.items() if not s.runs and c in old}
        for c, stamp in cut.items():
            self.sessions[c].stamp = stamp
        if cut:
            self.sessions = dict(sorted(self.sessions.items(), key=lambda kv: kv[1].stamp))
            self.last_stamp = max(x.stamp for x in self.sessions.values())

    patch(SessionTable, "truncated", truncated)


def _sessions_unknown(patch: Callable) -> None:
    """A member whose table lacks the sessions below its log's begin (its snapshot there
    damaged) does not know it: it asks no leader for them, and takes a young session it
    lacks for a new one."""
    patch(SessionTable, "unknown_upto", property(lambda self: -1, lambda self, value: None))


def _sessions_bridge(patch: Callable) -> None:
    """A member lacking sessions asks for a snapshot at the point they became unknown, even
    once its own snapshots let its log go past it (the leader's is sealed and never used)."""

    def snapshot_wanted(self, begin):
        machine = -1 if self.machine_wanted is None else self.machine_wanted(begin)
        return max(machine, self.sessions.unknown_upto)

    patch(MemberLogic, "snapshot_wanted", snapshot_wanted)


def _sessions_whole_first(patch: Callable) -> None:
    """A table is rebuilt from the newest snapshot at the log's begin even when that one
    was cut while sessions were unknown and an older one sealed from a leader knows them."""
    real = MemberLogic._sessions_from_snapshot

    def from_snapshot(self, begin, table=None):
        store = self.snapshots.store
        metas = sorted((m for m in store.list() if m.index >= begin - 1),
                       key=lambda m: m.index, reverse=True)  # fmt: skip
        for meta in metas[:1]:
            files = tuple(f for f in meta.files if f[0] == SESSIONS_FILE)
            if files and store.verify(dataclasses.replace(meta, files=files)) is None:
                doc = read_sessions(meta.path)
                if int(doc.get("unknown_upto", -1)) >= 0:
                    table = self.sessions if table is None else table
                    table.rebuild(doc, self.store.session_records(meta.index + 1),
                                  covered=meta.index)  # fmt: skip
                    return True
        return real(self, begin, table)

    patch(MemberLogic, "_sessions_from_snapshot", from_snapshot)


def _damaged_newest_ask(patch: Callable) -> None:
    """A follower's ask for a snapshot is taken as answered by the leader's newest one, even
    when that one was found damaged and cannot be sent."""
    from rayledger.actors.core.snapshot_policy import SnapshotPolicy

    real = SnapshotPolicy.ask
    patch(SnapshotPolicy, "ask", lambda self, index, have=None: real(self, index))


def _point_below_committed(patch: Callable) -> None:
    """The snapshot point matches only while the committed index reaches it (a restart may
    bring the index back checkpointed before the reset)."""

    def at_point(self, index):
        store = self.store
        return index == store.ledger_begin_index - 1 and 0 <= index <= store.committed_index

    patch(EntryHandler, "_at_snapshot_point", at_point)


def _empty_log_position(patch: Callable) -> None:
    """A follower's empty log keeps the position a reset gave its first entry, even when the
    leader's entry there lies elsewhere (an old leader's, padded differently)."""
    patch(EntryHandler, "_start_where_the_leader_does", lambda self, req: None)


def _sessions_lacked(patch: Callable) -> None:
    """A leader lacking client sessions hands over every time it is elected (with the
    others lacking them too, the group has no leader for good), and refuses every new
    session it lacks, however late it began."""
    patch(Supervisor, "_lacks_sessions", lambda self: self.logic.sessions.unknown_upto >= 0)
    patch(SessionTable, "bounded", lambda self, client: self.unknown_upto < 0)
    real = SessionTable.check

    def check(self, client, first_seq, n, now, queued=-1, maybe_stored=True):
        return real(self, client, first_seq, n, now, queued, True)

    patch(SessionTable, "check", check)


def _sessions_verify(patch: Callable) -> None:
    """A snapshot's session table is loaded without checking it against its checksum."""
    from rayledger.storage.snapshots import SnapshotStore

    real = SnapshotStore.verify

    def verify(self, meta):
        if all(f[0] == SESSIONS_FILE for f in meta.files):
            return None
        return real(self, meta)

    patch(SnapshotStore, "verify", verify)


def _expired_cut(patch: Callable) -> None:
    """A truncation brings back the sessions entries now cut had expired as they were,
    their own cut entries included."""
    real = SessionTable.truncated

    def truncated(self, end_index):
        back = [e for e in self._expired if e[0] > end_index]
        self._expired = [e for e in self._expired if e[0] <= end_index]
        real(self, end_index)
        for _i, client, session in back:
            self.sessions.setdefault(client, session)
        if back:
            self.sessions = dict(sorted(self.sessions.items(), key=lambda kv: kv[1].stamp))
            self.last_stamp = max((x.stamp for x in self.sessions.values()), default=0)

    patch(SessionTable, "truncated", truncated)


REVERTS: dict[str, Callable[[Callable], None]] = {
    "empty-log-position": _empty_log_position,
    "point-below-committed": _point_below_committed,
    "damaged-newest-ask": _damaged_newest_ask,
    "sessions-lacked": _sessions_lacked,
    "checker-config": _checker_config,
    "term-queue": _term_queue,
    "snapshot-point": _snapshot_point,
    "stranded-machine": _stranded_machine,
    "read-expire": _read_expire,
    "client-stays": _client_stays,
    "lease-config": _lease_config,
    "session-expiry": _session_expiry,
    "votes-by-configuration": _votes_by_configuration,
    "live-majority": _live_majority,
    "stopped-spawns": _stopped_spawns,
    "kv-snapshot-cut": _kv_snapshot_cut,
    "queued-retry": _queued_retry,
    "same-term-campaign": _same_term_campaign,
    "mq-queue-table": _mq_queue_table,
    "machine-ahead": _machine_ahead,
    "gone-spawns": _gone_spawns,
    "stranded-at-start": _stranded_at_start,
    "spawn-maybe-written": _spawn_maybe_written,
    "role-lock": _role_lock,
    "office-wait": _office_wait,
    "setup-after-candidacy": _setup_after_candidacy,
    "snapshot-after-reset": _snapshot_after_reset,
    "reset-term-floor": _reset_term_floor,
    "read-index-end": _read_index_end,
    "graph-stop": _graph_stop,
    "snapshot-ask": _snapshot_ask,
    "watch-candidate": _watch_candidate,
    "session-born": _session_born,
    "snapshot-sessions-twice": _snapshot_sessions_twice,
    "truncated-stamp": _truncated_stamp,
    "sessions-unknown": _sessions_unknown,
    "sessions-verify": _sessions_verify,
    "sessions-bridge": _sessions_bridge,
    "sessions-whole-first": _sessions_whole_first,
    "expired-cut": _expired_cut,
}
_ABSENT = object()


@contextlib.contextmanager
def revert(name: str) -> Iterator[None]:
    """Run the body with fix ``name`` reverted (``REVERTS``), then put it back."""
    undo: list[tuple[object, str, object]] = []

    def patch(owner: object, attr: str, value: object) -> None:
        undo.append((owner, attr, owner.__dict__.get(attr, _ABSENT)))
        setattr(owner, attr, value)

    try:
        REVERTS[name](patch)
        yield
    finally:
        for owner, attr, value in reversed(undo):
            if value is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)
