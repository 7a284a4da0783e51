"""``EntryDispatcherActor`` (actors/dispatcher.py) in the whole-group simulation: the shipped
:class:`~rayledger.actors.dispatcher_logic.DispatcherDriver` on a node's loop, its pushes
carried by the network, its fetches and reports as node-local calls.  Delivery only, plus
two checks on what it carries (a fetch livelock, a COMMIT the follower cannot explain)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rayledger.actors.dispatcher_logic import (
    CachedBatch,
    DispatcherDriver,
    DispatcherLogic,
    Fetch,
    Inline,
)
from rayledger.actors.fastpath_logic import GraphRound
from rayledger.replication import PushEntryRequest, PushType
from rayledger.storage import LedgerError, ResponseCode

from .node_state import Node
from .node_transport import DIED, SimLoop
from .sim_config import FETCH_LIVELOCK_MS, FETCH_LOOP


class _SimDispatcherPorts:
    __slots__ = ("sim", "node", "peer")

    def __init__(self, sim, node: Node, peer: str):
        self.sim, self.node, self.peer = sim, node, peer

    def push(self, req: PushEntryRequest) -> None:
        batch = req.batch
        if isinstance(batch, CachedBatch):
            req = replace(req, batch=batch.payload.batch)  # always Inline here
        self.sim.rpc.call(self.node.id, self.peer, req, self.sim._late_copy_ms(req))

    def fetch(self, f: Fetch) -> None:
        self.sim._spawn(self.node, self.sim._d_fetch(self.node, self.peer, f))

    def report(self, term: int, wm: int) -> None:
        self.sim._spawn(self.node, self.sim._d_report(self.node, self.peer, term, wm))

    def progress(self, term: int, wm: int) -> None:
        sim, node = self.sim, self.node
        sim._hop(node, sim._m_on_peer_progress, node, self.peer, term, wm)


class DispatcherActor:
    """Calls to a node's dispatchers (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _dispatcher_driver(self, node: Node, peer: str, logic: DispatcherLogic):
        driver = DispatcherDriver(logic, _SimDispatcherPorts(self, node, peer))
        driver.attach(SimLoop(self, node))
        return driver

    def _d_activate(self, node: Node, peer: str, info) -> None:
        node.dispatcher_drivers[peer].activate(info)

    def _d_deactivate(self, node: Node, peer: str, term: int) -> None:
        node.dispatcher_drivers[peer].deactivate(term)

    def _d_on_announcement(self, node: Node, peer: str, a) -> None:
        node.dispatcher_drivers[peer].on_announcement(a)

    def _d_on_committed(self, node: Node, peer: str, term: int, index: int) -> None:
        node.dispatcher_drivers[peer].on_committed(term, index)

    def _d_fetch(self, node: Node, peer: str, f: Fetch):
        """A batch the cache lacks, or an entry's (term, pos): the member's fenced answer."""
        lg = node.logic
        driver = node.dispatcher_drivers[peer]
        self.stats[f"fetch_{f.kind}"] += 1
        if f.kind == "batch":
            args = (f.term, f.index, f.max_bytes, f.max_count)
            (answer,) = yield [lambda: _call(lg.read_for_push, *args)]
        else:
            (answer,) = yield [lambda: _call(lg.entry_meta, f.term, f.index)]
        if isinstance(answer, LedgerError):
            driver.fetch_failed()
            return
        if answer is None:
            self.stats["fetch_fenced"] += 1
        else:
            self._note_need(node, peer, (f.term, f.kind, f.index))
        if f.kind == "batch":
            driver.fetched_batch(f.term, _cached(answer))
        else:
            driver.fetched_meta(f.term, f.index, answer)

    def _d_report(self, node: Node, peer: str, term: int, wm: int):
        (committed,) = yield [lambda: self._c_report(node, term, peer, wm)]
        if committed is DIED:  # the checker's process was killed while the report waited
            node.dispatcher_drivers[peer].report_failed()
            return
        node.dispatcher_drivers[peer].reported(term, wm, committed)

    def _note_need(self, node: Node, peer: str, need: tuple) -> None:
        """A dispatcher that fetches the same thing again and again, answered every time,
        never gets what it needs: a hot loop of actor calls, and a livelock when it lasts."""
        w = node.need_watch[peer]
        now = self.clock.now_ms
        if w.need != need:
            w.need, w.times, w.since = need, 1, now
            return
        w.times += 1
        if w.times == FETCH_LOOP:
            self.stats["fetch_loops"] += 1
        if w.times >= FETCH_LOOP:
            lasted = now - w.since
            self.stats["fetch_loop_max_ms"] = max(self.stats["fetch_loop_max_ms"], lasted)
            if lasted > FETCH_LIVELOCK_MS:
                d = node.dispatchers[peer]
                self.fail(
                    f"dispatcher {node.id}->{peer} has fetched {need[1]}@{need[2]} (term "
                    f"{need[0]}) {w.times} times in {lasted} ms and the answer never "
                    f"served: {d.core!r} pending={d.core._pending} "
                    f"cached={ {k: b.count for k, b in d.view.batches.items()} }"
                )

    def _check_commit_answer(self, node: Node, peer: str, req: PushEntryRequest, resp) -> None:
        """A COMMIT the follower could not match (the ``commit.unheld`` warning) must be
        explained by entries it lost."""
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

    def _d_on_response(self, node: Node, peer: str, req: PushEntryRequest, resp) -> None:
        self._check_commit_answer(node, peer, req, resp)
        node.dispatcher_drivers[peer].on_response(req, resp)

    def _d_cg_begin(self, node: Node, peer: str, term: int, gen: int) -> bool:
        return node.dispatcher_drivers[peer].graph_begin(term, gen)

    def _d_cg_end(self, node: Node, peer: str, gen: int) -> None:
        d = node.dispatchers[peer]
        if d.graph_gen == gen and d.active:
            self.stats["rewinds"] += 1
        node.dispatcher_drivers[peer].graph_end(gen)

    def _d_cg_push(self, node: Node, peer: str, g: GraphRound) -> tuple:
        return node.dispatcher_drivers[peer].graph_push(g)

    def _d_cg_ack(self, node: Node, peer: str, answered) -> tuple:
        (gen, term, rounds), answers = answered
        d = node.dispatchers[peer]
        for key, resp, origin in answers:
            if origin != (node.id, term):
                self.stats["late_answer_elsewhere"] += 1
            req = d.sent_through_graph(key)
            if req is not None:
                self._check_commit_answer(node, peer, req, resp)
        plain = [(key, resp) for key, resp, _ in answers]
        return node.dispatcher_drivers[peer].graph_ack(((gen, term, rounds), plain))


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
    return CachedBatch(batch.first_index, batch.count, Inline(batch), len(batch.data)), info
