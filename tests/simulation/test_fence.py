"""A dispatcher of an ended term gets nothing from its member: the fence of
``MemberLogic.answer_fetch``, driven step by step.

Five members m, f, n, x, y run the shipped logic classes (MemberLogic,
DispatcherLogic, CheckerLogic) over MemoryStores; the test is their transport,
one call at a time:

1. m leads term T and everything up to index 1 commits everywhere;
2. cut off from n, x and y, m writes two rounds (indexes 2..3 and 4); only f
   stores them, and m never hears f's answers;
3. n wins term T+1 with the votes of n, x and y, writes 3..4 and commits 2..4
   (term T+1) on n, x, y;
4. m hears of term T+1 and steps down; n truncates m's log and m learns the
   committed index 4 -- of n's entries;
5. m's dispatcher to f, still activated for term T (its ``deactivate`` is in
   flight), pushes again from its water mark 1 and needs entry 2, evicted from its
   cache: it asks m.

Fenced, m answers None and f never commits m's old entries.  The unfenced answer
(the same call with the fence taken away) would hand the stale dispatcher m's
committed index 4, learned from n: its next COMPARE carries it and f commits m's
term-T entries at 2..4, where n, x and y committed term-(T+1) entries.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace

import pytest
from rayledger.actors.core import member as mc
from rayledger.actors.core.member_logic import EntriesRead, MemberLogic, StartLeading, StopLeading
from rayledger.election import MemoryTermStore, Role
from rayledger.replication import PushEntryRequest
from rayledger.replication import checker as ck
from rayledger.replication import dispatcher as dl
from rayledger.replication.checker import CheckerLogic
from rayledger.replication.dispatcher import CachedBatch, DispatcherLogic
from rayledger.replication.messages import TURN_END, Inline, Push
from rayledger.replication.push import COMMIT_LINGER_MS
from rayledger.storage import LedgerError, MemoryStore, ResponseCode, StoreConfig

from .group_sim import SIM_ELECTION, SIM_REPLICATION, SIM_STORE

GROUP = "g"
IDS = ["m", "f", "n", "x", "y"]
CONFIG = replace(SIM_REPLICATION, max_pending_pushes=8, max_batch_push_bytes=64 * 1024)


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


class FiveMembers:
    """The logic of five members and a transport driven by hand: calls are delivered at
    once over the links that are up; a call over a cut link fails (None)."""

    def __init__(self, cache_bytes: int = 1):
        self.now = 0
        self.logic = {
            mid: MemberLogic(
                GROUP,
                mid,
                IDS,
                MemoryStore(StoreConfig(**SIM_STORE)),
                SIM_ELECTION,
                CONFIG,
                MemoryTermStore(),
                rng=random.Random(k),
            )
            for k, mid in enumerate(IDS)
        }
        self.disp = {
            mid: {p: DispatcherLogic(GROUP, mid, p, CONFIG, cache_bytes) for p in IDS if p != mid}
            for mid in IDS
        }
        self.chk = {mid: CheckerLogic(GROUP, mid, IDS, CONFIG) for mid in IDS}
        self.cut: set[tuple[str, str]] = set()
        self.lost_answers: set[tuple[str, str]] = set()  # (leader, follower): answers lost
        self.in_flight: list[tuple[str, str, PushEntryRequest]] = []  # calls still unanswered
        self.rids = iter(range(1 << 30))

    # -- links --------------------------------------------------------------------------
    def isolate(self, group_a: list[str], group_b: list[str]) -> None:
        for a in group_a:
            for b in group_b:
                self.cut |= {(a, b), (b, a)}

    def connect(self, a: str, b: str) -> None:
        self.cut -= {(a, b), (b, a)}

    def up(self, a: str, b: str) -> bool:
        return (a, b) not in self.cut

    def store(self, mid: str):
        return self.logic[mid].store

    # -- elections ------------------------------------------------------------------------
    def _deliver_election(self, src: str, actions: list) -> None:
        sends, _ = MemberLogic.split(actions)
        for s in sends:
            resp = None
            if self.up(src, s.to) and self.up(s.to, src):
                resp, more = self.logic[s.to].handle_election(s.message, self.now)
                self._deliver_election(s.to, more)
            self._deliver_election(
                src, self.logic[src].on_election_response(s.to, s.message, resp, self.now)
            )

    def tick(self, mid: str, ms: int = 10, deliver: bool = True) -> None:
        """Tick ``mid``; its votes and heartbeats cross the links that are up (none when
        ``deliver`` is false: its calls fail)."""
        self.now += ms
        lg = self.logic[mid]
        actions, answers = lg.tick(self.now)
        assert not answers
        if deliver:
            self._deliver_election(mid, actions)
            return
        for s in MemberLogic.split(actions)[0]:
            lg.on_election_response(s.to, s.message, None, self.now)

    def elect(self, mid: str, voters: tuple[str, ...] = ()) -> None:
        """Tick ``mid`` until it leads (its votes and heartbeats cross the links that are
        up); ``voters`` tick too, at the same instant, with their own calls failing (a voter
        asked for a newer term moves to it on its next tick, as in DLedger)."""
        lg = self.logic[mid]
        for _ in range(1000):
            if lg.state.is_leader:
                break
            self.tick(mid)
            for v in voters:
                self.tick(v, 0, deliver=False)
        assert lg.state.is_leader, f"{mid} was not elected"
        self.tick(mid, SIM_ELECTION.heartbeat_interval_ms)  # heartbeats: voters follow
        self.take_office(mid)

    def follow(self, mid: str, leader: str) -> None:
        """``leader``'s heartbeats until ``mid`` follows it (a member that hears of a newer
        term becomes a candidate and moves to that term on its next tick, as in DLedger)."""
        lg = self.logic[mid]
        for _ in range(20):
            self.tick(leader, SIM_ELECTION.heartbeat_interval_ms)
            if lg.state.is_follower and lg.state.leader_id == leader:
                return
            self.tick(mid, 0, deliver=False)
        raise AssertionError(f"{mid} does not follow {leader}: {lg.state}")

    def take_office(self, mid: str) -> None:
        """What the member's shell does with ``leadership()``: set up or stop its helpers."""
        for change in self.logic[mid].leadership():
            if isinstance(change, StopLeading):
                self.chk[mid].step(ck.LeadershipEnded(change.new_term), self.now)
                # the dispatchers' deactivate(term) is left in flight: see stale()
            else:
                assert isinstance(change, StartLeading)
                self.chk[mid].step(
                    ck.BecomeLeader(change.term, change.term_start_index, change.info), self.now
                )
                for d in self.disp[mid].values():
                    d.step(dl.Activate(change.info), self.now)
                assert self.logic[mid].mark_ready(change.term)

    # -- appends and replication -----------------------------------------------------------
    def append(self, mid: str, bodies: list[bytes]):
        lg = self.logic[mid]
        term, bodies = lg.admit(bodies, GROUP, mid, 0)
        rnd = lg.write_round([(None, bodies)], term)
        a = lg.announcement(rnd)
        for p, d in self.disp[mid].items():
            if d.step(dl.RoundAnnounced(a), self.now):
                self.push(mid, p)
        self.chk[mid].step(
            ck.AddRound(term, rnd.first_index, rnd.last_index, next(self.rids), lg.water_mark()),
            self.now,
        )
        self.check(mid)
        return rnd

    def fetch(self, mid: str, peer: str, fenced: bool = True):
        """The dispatcher's need, answered by its member (as EntryDispatcherActor._fetch)."""
        d = self.disp[mid][peer]
        need = d.need
        lg = self.logic[mid]
        f = dl.Fetch(d.term, need.kind, need.index, CONFIG.max_batch_push_bytes,
                     need.count or CONFIG.max_batch_push_count)  # fmt: skip
        answer = lg.answer_fetch(f)
        if isinstance(answer, EntriesRead):
            batch = lg.store.read_batch(answer.start, answer.max_bytes, answer.max_count)
            answer = (
                CachedBatch(batch.first_index, batch.count, Inline(batch), len(batch.data)),
                answer.info,
            )
        d.step(dl.Fetched(f, answer), self.now)
        return need, answer

    def push(self, mid: str, peer: str, rounds: int = 50) -> None:
        """Run ``mid``'s dispatcher to ``peer`` until it has nothing to send: pushes cross the
        link if it is up (answers may be lost), needs are fetched from ``mid``."""
        d = self.disp[mid][peer]
        for _ in range(rounds):
            r = d.step(TURN_END, self.now)
            if r.report is not None:  # the checker's answer, as EntryDispatcherActor._report
                term, wm = r.report
                served = self.chk[mid].step(ck.Report(term, peer, wm), self.now)
                self.check(mid)
                committed = self.chk[mid].committed_index if served else None
                d.step(dl.Reported(term, wm, committed), self.now)
            if not r.pushes and r.fetch is None and r.report is None:
                return
            for req in r.pushes:
                self._call(mid, peer, req)
            if r.fetch is not None:
                self.fetch(mid, peer)

    def _call(self, mid: str, peer: str, req: PushEntryRequest) -> None:
        d = self.disp[mid][peer]
        batch = req.batch
        wire = replace(req, batch=batch.payload.batch) if isinstance(batch, CachedBatch) else req
        if not self.up(mid, peer):
            self._answer(mid, peer, d, req, None)
            return
        answers = self.logic[peer].on_push(Push(wire, req), self.now)
        if (mid, peer) in self.lost_answers or not self.up(peer, mid):
            self.in_flight.append((mid, peer, req))
            return
        for tok, resp in answers:
            self._answer(mid, peer, d, tok, resp)

    def _answer(self, mid: str, peer: str, d: DispatcherLogic, req, resp) -> None:
        d.step(dl.FollowerAnswer(req, resp), self.now)  # a new water mark is reported by push()

    def check(self, mid: str) -> None:
        """The checker commits; the member and the dispatchers of its term learn it."""
        chk = self.chk[mid]
        res = chk.step(TURN_END, self.now).resolution
        if res is not None and res.committed is not None:
            self.logic[mid].on_committed(res.term, res.committed)
            for d in self.disp[mid].values():
                d.step(dl.Committed(res.term, res.committed), self.now)

    def time_out_calls(self) -> None:
        """The calls whose answers were lost fail (what a Ray call returns after its timeout)."""
        calls, self.in_flight = self.in_flight, []
        for mid, peer, req in calls:
            self._answer(mid, peer, self.disp[mid][peer], req, None)

    def replicate(self, mid: str) -> None:
        for p in self.disp[mid]:
            self.push(mid, p)


def _terms(store, lo: int, hi: int) -> list[int]:
    return [store.get_term(i) for i in range(lo, hi + 1)]


def stale_dispatcher_needs_entries() -> FiveMembers:
    """Steps 1-5 of the module doc; returns with m's dispatcher to f needing entry 2."""
    g = FiveMembers()
    m, f, n = g.logic["m"], g.logic["f"], g.logic["n"]

    # 1. m leads term T; index 1 commits everywhere
    g.elect("m")
    T = g.T = m.state.current_term
    g.replicate("m")
    g.append("m", [b"committed-1"])
    g.replicate("m")
    g.now += CONFIG.commit_push_interval_ms
    g.replicate("m")  # COMMIT pushes: the followers learn index 1 is committed
    for mid in IDS:
        assert g.store(mid).committed_index == 1, mid

    # 2. only f stores m's next two rounds, and m never hears back
    g.isolate(["m", "f"], ["n", "x", "y"])
    g.lost_answers.add(("m", "f"))
    g.append("m", [b"m-old-2", b"m-old-3"])  # indexes 2..3
    g.append("m", [b"m-old-4"])  # index 4: the first round's batch leaves the cache
    assert _terms(g.store("f"), 2, 4) == [T, T, T]
    assert g.store("f").committed_index == 1 and g.store("m").committed_index == 1
    d = g.disp["m"]["f"]
    assert d.term == T and d.water_mark == 1 and 2 not in d.view.batches

    # 3. n wins term T + 1 with the votes of n, x and y, and commits its own 2..4
    for _ in range(100):  # m's heartbeats stopped coming: x and y stop following it
        if all(g.logic[mid].state.role is Role.CANDIDATE for mid in ("x", "y")):
            break
        for mid in ("x", "y"):
            g.tick(mid, 5, deliver=False)
    g.elect("n", voters=("x", "y"))
    assert n.state.current_term == T + 1 and n.state.is_leader
    for mid in ("x", "y"):
        assert g.logic[mid].state.leader_id == "n" and g.logic[mid].state.current_term == T + 1
    g.replicate("n")
    g.append("n", [b"n-new-3", b"n-new-4"])
    g.replicate("n")
    g.now += COMMIT_LINGER_MS  # no next round to carry the commit: a COMMIT push
    g.replicate("n")
    for mid in ("n", "x", "y"):
        assert g.store(mid).committed_index == 4, mid
        assert _terms(g.store(mid), 2, 4) == [T + 1] * 3, mid

    # 4. m hears of term T + 1 and steps down; n's dispatcher truncates m and commits 4 on it
    g.connect("m", "n")
    g.follow("m", "n")
    assert m.state.role is Role.FOLLOWER and m.state.current_term == T + 1
    g.take_office("m")  # StopLeading(T, T + 1): the checker steps down, deactivates in flight
    assert m.leading_term == -1
    g.now += CONFIG.error_backoff_ms + 1
    g.push("n", "m")
    g.now += CONFIG.commit_push_interval_ms
    g.push("n", "m")
    assert _terms(g.store("m"), 2, 4) == [T + 1] * 3
    assert g.store("m").committed_index == 4  # learned from n, in term T + 1

    # 5. the stale dispatcher (term T) pushes again from its water mark and needs entry 2
    assert d.active and d.term == T
    g.time_out_calls()  # f's answers never came: push again from the water mark
    g.lost_answers.discard(("m", "f"))
    g.now += CONFIG.max_push_timeout_ms + CONFIG.error_backoff_ms + 1
    r = d.step(TURN_END, g.now)
    assert r.pushes == [] and r.fetch is not None and (r.fetch.kind, r.fetch.index) == ("batch", 2)
    assert f.state.current_term == T and f.state.leader_id == "m"  # f still follows m
    return g


def test_stale_dispatcher_is_fenced() -> None:
    g = stale_dispatcher_needs_entries()
    m, f = g.logic["m"], g.logic["f"]
    d = g.disp["m"]["f"]
    T = g.T
    # the fence: a helper of term T gets nothing from a member that no longer leads it
    cap = (CONFIG.max_batch_push_bytes, CONFIG.max_batch_push_count)
    assert m.answer_fetch(dl.Fetch(T, "batch", 2, *cap)) is None
    assert m.answer_fetch(dl.Fetch(T, "meta", 2, *cap)) is None
    assert m.answer_fetch(dl.Fetch(T, "meta", 1, *cap)) is None
    for _ in range(5):
        need, answer = g.fetch("m", "f")
        assert answer is None, need
        g.now += CONFIG.max_push_timeout_ms + 1
        g.push("m", "f")
    assert d.view.committed_index == 1  # nothing learned outside term T
    # f keeps m's old entries uncommitted until n's dispatcher reaches it
    assert f.store.committed_index == 1
    assert _terms(f.store, 2, 4) == [T, T, T]
    # ... which cuts them and commits n's entries
    d.step(dl.Deactivate(T), g.now)  # the deactivate in flight arrives
    g.connect("f", "n")
    for mid in ("x", "y"):
        g.connect("f", mid)
    g.follow("f", "n")
    for _ in range(3):
        g.now += CONFIG.commit_push_interval_ms + CONFIG.error_backoff_ms
        g.push("n", "f")
    assert f.state.current_term == T + 1 and f.state.leader_id == "n"
    assert _terms(f.store, 2, 4) == [T + 1] * 3
    assert f.store.committed_index == 4


def test_unfenced_answer_would_commit_the_old_entries(monkeypatch) -> None:
    """The same scenario with the fence taken away: f commits m's stale entries."""
    g = stale_dispatcher_needs_entries()
    m, f = g.logic["m"], g.logic["f"]
    d = g.disp["m"]["f"]
    monkeypatch.setattr(m, "leads", lambda term: True)  # no fence
    need, answer = g.fetch("m", "f")
    assert answer is not None and answer[1].committed == 4  # m's commit index of term T + 1
    assert d.view.committed_index == 4
    for _ in range(5):
        g.now += CONFIG.max_push_timeout_ms + CONFIG.error_backoff_ms + 1
        g.push("m", "f")
    # f committed m's term-T entries where n, x and y committed term-(T + 1) entries
    assert f.store.committed_index >= 2
    assert _terms(f.store, 2, f.store.committed_index) != _terms(
        g.store("n"), 2, f.store.committed_index
    )


def test_entries_compacted_while_read_are_answered_as_compacted() -> None:
    """The fence passed and the entries are read outside the member's lock: a compaction
    meanwhile fails that read, and the dispatcher is answered as if it had found them
    compacted (``(None, info)``: it learns the leader's begin), never with an error."""
    g = stale_dispatcher_needs_entries()
    n = g.logic["n"]
    f = dl.Fetch(g.T + 1, "batch", 2, CONFIG.max_batch_push_bytes, CONFIG.max_batch_push_count)
    assert isinstance(n.answer_fetch(f), EntriesRead)  # n leads T + 1: read outside the lock

    def step(ev):
        return mc.MemberOut(reply=n.answer_fetch(ev.fetch, ev.read_failed))

    batch, info = mc.answer_fetch(step, n.store, f)
    assert batch.first_index == 2 and info == n.leader_info()

    class Compacted:
        def read_batch(self, *_a):
            raise LedgerError.of(ResponseCode.INDEX_OUT_OF_BOUNDS, "compacted meanwhile")

    assert mc.answer_fetch(step, Compacted(), f) == (None, n.leader_info())
