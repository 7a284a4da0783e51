"""``EntryDispatcherActor`` (actors/dispatcher.py) in the whole-group simulation: pushes to
one follower, fenced fetches from the member, water-mark reports to the checker, and its
part in a compiled graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rayledger.actors.logic import Announcement, CachedBatch
from rayledger.replication import PushEntryRequest, PushType
from rayledger.storage import EntryBatch, LedgerError, ResponseCode

from .node_state import GraphRound, Node
from .sim_config import FETCH_LIVELOCK_MS, FETCH_LOOP


class DispatcherActor:
    """The dispatchers' actor shells (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _d_activate(self, node: Node, peer: str, info) -> None:
        node.dsh[peer].loop = True
        node.dispatchers[peer].activate(info)
        self._d_kick(node, peer)

    def _d_deactivate(self, node: Node, peer: str, term: int) -> None:
        sh = node.dsh[peer]
        node.dispatchers[peer].deactivate(term)
        sh.cg_gen = None
        sh.cg_sent.clear()
        self._cancel(sh.timer)
        sh.timer = None

    def _d_on_announcement(self, node: Node, peer: str, a: Announcement) -> None:
        if node.dispatchers[peer].on_announcement(a):
            self._d_pump(node, peer)
        else:
            self._d_kick(node, peer)

    def _d_on_committed(self, node: Node, peer: str, term: int, index: int) -> None:
        if node.dispatchers[peer].on_committed(term, index):
            self._d_kick(node, peer)

    def _d_kick(self, node: Node, peer: str) -> None:
        sh = node.dsh[peer]
        if not sh.scheduled and sh.loop:
            sh.scheduled = True
            self._soon(node, self._d_pump, node, peer)

    def _d_pump(self, node: Node, peer: str) -> None:
        sh = node.dsh[peer]
        sh.scheduled = False
        self._cancel(sh.timer)
        sh.timer = None
        d = node.dispatchers[peer]
        if not d.active:
            return
        now = self.clock.now_ms
        reqs = d.next_requests(now)
        need = d.need
        term = d.term
        wake = d.next_wakeup_ms(now)
        for req in reqs:
            self._d_send(node, peer, req)
        if need is not None and not sh.fetching:
            sh.fetching = True
            self._spawn(node, self._d_fetch(node, peer, term, need.kind, need.index, need.count))
        if wake is not None:
            sh.timer = self._at(node, max(now + 1, wake), self._d_pump, node, peer)

    def _d_fetch(
        self, node: Node, peer: str, term: int, kind: str, index: int, count: int | None = None
    ):
        """A batch the cache lacks, or an entry's (term, pos): the member's fenced answer."""
        cfg = self.replication
        lg = node.logic
        d = node.dispatchers[peer]
        self.stats[f"fetch_{kind}"] += 1
        if kind == "batch":
            limit = count or cfg.max_batch_push_count
            (answer,) = yield [
                lambda: _call(lg.read_for_push, term, index, cfg.max_batch_push_bytes, limit)
            ]
        else:
            (answer,) = yield [lambda: _call(lg.entry_meta, term, index)]
        if isinstance(answer, LedgerError):
            yield 50
        else:
            if answer is None:
                self.stats["fetch_fenced"] += 1
            else:
                self._note_need(node, peer, (term, kind, index))
            if kind == "batch":
                d.took_batch(term, _cached(answer))
            else:
                d.took_meta(term, index, answer)
        node.dsh[peer].fetching = False
        self._d_kick(node, peer)

    def _note_need(self, node: Node, peer: str, need: tuple) -> None:
        """A dispatcher that fetches the same thing again and again, answered every time,
        never gets what it needs: a hot loop of actor calls, and a livelock when it lasts."""
        sh = node.dsh[peer]
        now = self.clock.now_ms
        if sh.last_need != need:
            sh.last_need, sh.same_need, sh.same_need_since = need, 1, now
            return
        sh.same_need += 1
        if sh.same_need == FETCH_LOOP:
            self.stats["fetch_loops"] += 1
        if sh.same_need >= FETCH_LOOP:
            lasted = now - sh.same_need_since
            self.stats["fetch_loop_max_ms"] = max(self.stats["fetch_loop_max_ms"], lasted)
            if lasted > FETCH_LIVELOCK_MS:
                d = node.dispatchers[peer]
                self.fail(
                    f"dispatcher {node.id}->{peer} has fetched {need[1]}@{need[2]} (term "
                    f"{need[0]}) {sh.same_need} times in {lasted} ms and the answer never "
                    f"served: {d.core!r} pending={d.core._pending} "
                    f"cached={ {k: b.count for k, b in d.view.batches.items()} }"
                )

    def _d_send(self, node: Node, peer: str, req: PushEntryRequest) -> None:
        batch = req.batch
        if isinstance(batch, CachedBatch):
            req = replace(req, batch=batch.payload)
        self.rpc.call(node.id, peer, req)

    def _d_answered(self, node: Node, peer: str, req: PushEntryRequest, resp) -> int | None:
        """Feed an answer to the dispatcher core; a COMMIT the follower could not match
        (the ``commit.unheld`` warning) must be explained by entries it lost."""
        if (
            req.type is PushType.COMMIT
            and resp is not None
            and resp.code == ResponseCode.INCONSISTENT_STATE
        ):
            self.stats["commit_unheld"] += 1
            if self.lost_from.get(peer, req.first_index + 1) > req.first_index:
                self.fail(
                    f"{node.id}'s COMMIT names entry {req.first_index} (term {req.entry_term}) "
                    f"that {peer} acknowledged and does not hold, yet {peer} never lost it "
                    f"to a power loss (lost from: {self.lost_from.get(peer)})"
                )
        return node.dispatchers[peer].on_response(req, resp, self.clock.now_ms)

    def _d_on_response(self, node: Node, peer: str, req: PushEntryRequest, resp) -> None:
        sh = node.dsh[peer]
        wm = self._d_answered(node, peer, req, resp)
        if wm is not None and sh.reporting and sh.reporting_term != req.term:
            self.stats["report_swallowed"] += 1  # a report loop of an older term still runs
        if wm is not None and not sh.reporting:
            sh.reporting = True
            sh.reporting_term = req.term
            self._spawn(node, self._d_report(node, peer, req.term))
        self._d_kick(node, peer)

    def _d_report(self, node: Node, peer: str, term: int, force: bool = False):
        """Report the follower's water mark (the latest, one report in flight at a time)."""
        d = node.dispatchers[peer]
        sh = node.dsh[peer]
        while True:
            if d.term != term or not d.active:
                break
            wm = d.water_mark
            (committed,) = yield [lambda wm=wm: self._c_report(node, term, peer, wm)]
            if committed is not None and d.on_committed(term, committed):
                self._d_kick(node, peer)
            now = self.clock.now_ms
            if now - sh.last_progress > 50:
                sh.last_progress = now
                self._hop(node, self._m_on_peer_progress, node, peer, term, wm)
            if d.water_mark <= wm and not force:
                break
            force = False
        sh.reporting = False

    def _d_cg_begin(self, node: Node, peer: str, term: int, gen: int) -> bool:
        sh = node.dsh[peer]
        if term != node.dispatchers[peer].term:
            return False
        sh.cg_gen = gen
        sh.cg_sent.clear()
        return True

    def _d_cg_end(self, node: Node, peer: str, gen: int) -> None:
        """The leader left graph ``gen``: its pushes in flight are lost, push again."""
        sh = node.dsh[peer]
        if sh.cg_gen != gen:
            return
        sh.cg_gen = None
        sh.cg_sent.clear()
        d = node.dispatchers[peer]
        if d.active:
            self.stats["rewinds"] += 1
        d.rewind()
        # water marks that went into the graph may never have reached the checker
        if not sh.reporting:
            sh.reporting = True
            sh.reporting_term = d.term
            self._spawn(node, self._d_report(node, peer, d.term, force=True))
        self._d_kick(node, peer)

    def _d_cg_push(self, node: Node, peer: str, g: GraphRound) -> tuple:
        a = g.announcement
        sh = node.dsh[peer]
        d = node.dispatchers[peer]
        wire, plain = [], []
        if g.gen != sh.cg_gen:
            return (g.gen, a.term, g.rounds), []
        d.on_announcement(a)
        for req in d.next_requests(self.clock.now_ms):
            batch = req.batch
            inline = batch is None or isinstance(batch.payload, EntryBatch)
            if inline and req.type in (PushType.APPEND, PushType.COMMIT):
                key = (g.gen, next(sh.cg_keys))
                sh.cg_sent[key] = req
                wire.append((key, replace(req, batch=batch.payload) if batch else req))
            else:
                plain.append(req)
        if (plain or d.need is not None) and sh.loop:
            self._hop(node, self._d_send_all, node, peer, plain)
        return (g.gen, a.term, g.rounds), wire

    def _d_send_all(self, node: Node, peer: str, reqs: list) -> None:
        for req in reqs:
            self._d_send(node, peer, req)
        self._d_kick(node, peer)

    def _d_cg_ack(self, node: Node, peer: str, answered) -> tuple:
        (gen, term, rounds), answers = answered
        sh = node.dsh[peer]
        d = node.dispatchers[peer]
        for key, resp, origin in answers:
            req = sh.cg_sent.pop(key, None)
            if origin != (node.id, term):
                self.stats["late_answer_elsewhere"] += 1
                if req is not None:
                    # MemberActor._late is not kept per leader: an answer to another
                    # leader's push with the same (gen, n) key is folded into this one
                    self.stats["late_answer_misfolded"] += 1
                    self.net.note(
                        f"{node.id}->{peer} folds {origin}'s answer {resp} into {req.describe()}"
                    )
            if req is not None:
                self._d_answered(node, peer, req, resp)
        wm = d.water_mark if d.term == term else -1
        self._hop(node, self._d_after_ack, node, peer, term, wm)
        return gen, term, peer, wm, rounds

    def _d_after_ack(self, node: Node, peer: str, term: int, wm: int) -> None:
        sh = node.dsh[peer]
        now = self.clock.now_ms
        if wm >= 0 and now - sh.last_progress > 50:
            sh.last_progress = now
            self._hop(node, self._m_on_peer_progress, node, peer, term, wm)
        self._d_kick(node, peer)


def _call(fn: Callable, *args):
    """An actor call whose LedgerError comes back as a value (the caller's except)."""
    try:
        return fn(*args)
    except LedgerError as exc:
        return exc


def _cached(answer: tuple | None) -> tuple | None:
    """A fetched (batch, info) as the dispatcher's cache holds it."""
    if answer is None:
        return None
    batch, info = answer
    return CachedBatch(batch.first_index, batch.count, batch, len(batch.data)), info
