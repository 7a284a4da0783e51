"""``EntryDispatcherActor`` (actors/dispatcher.py) in the whole-group simulation: the shipped
:class:`~rayledger.replication.dispatcher.DispatcherDriver` on a node's loop, its pushes
carried by the network, its fetches and reports as node-local calls.  Delivery only, plus
two checks on what it carries (a fetch livelock, a COMMIT the follower cannot explain) --
and dispatcher processes that die (Ray restarts them at once) or hang (a SIGSTOP: calls
wait in them, their timers stop, answers to their pushes reach nobody) until their member
kills them; a fresh one tells its member (``helper_started``), as on Ray."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from rayledger.actors.core import member as mc
from rayledger.actors.core.fastpath import GraphRound
from rayledger.actors.core.pump import DispatcherDriver
from rayledger.replication import PushEntryRequest, PushType
from rayledger.replication.dispatcher import (
    Activate,
    CachedBatch,
    Committed,
    Deactivate,
    DispatcherLogic,
    Fetch,
    Fetched,
    FollowerAnswer,
    GraphAck,
    GraphPush,
    Reported,
    RoundAnnounced,
    read_committed,
)
from rayledger.replication.messages import GraphBegin, GraphEnd, Inline
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.reader import StoreReader

from .node_state import NeedWatch, Node
from .node_transport import DIED, SimLoop, park
from .sim_config import FETCH_LIVELOCK_MS, FETCH_LOOP

_pids = itertools.count(2_000_000)  # the pids of restarted dispatcher processes


def dkey(peer: str) -> str:
    """The helper key (``Node.hung``, ``Node.helper_gen``) of the dispatcher to ``peer``."""
    return f"dispatcher:{peer}"


class _SimDispatcherPorts:
    __slots__ = ("sim", "node", "peer", "gen", "files")

    def __init__(self, sim, node: Node, peer: str):
        self.sim, self.node, self.peer = sim, node, peer
        self.gen = node.helper_gen.get(dkey(peer), 0)  # the process this driver runs in
        self.files: StoreReader | None = None  # the leader's files, opened at the first read

    def push(self, req: PushEntryRequest) -> None:
        batch = req.batch
        # a copy per call: its answer is delivered to the process that sent it, or to nobody
        if req.snapshot is not None:  # the chunk, read from the leader's snapshot
            data = self.sim._d_snapshot_chunk(self.node, req)
            req = replace(req, batch=data)
            self.node.sent[id(req)] = (req, self.gen)
            if data is None:  # the read failed: the call fails (Ray: the argument raised)
                self.sim._hop(self.node, self.sim._d_on_response, self.node, self.peer, req, None)
            else:
                self.sim.rpc.call(self.node.id, self.peer, req)
            return
        if isinstance(batch, CachedBatch):
            req = replace(req, batch=batch.payload.batch)  # always Inline here
        else:
            req = replace(req)
        self.node.sent[id(req)] = (req, self.gen)
        self.sim.rpc.call(self.node.id, self.peer, req, self.sim._late_copy_ms(req))

    def fetch(self, f: Fetch) -> None:
        self.sim._spawn(self.node, self.sim._d_fetch(self.node, self.peer, f, self.gen, self))

    def report(self, term: int, wm: int) -> None:
        self.sim._spawn(self.node, self.sim._d_report(self.node, self.peer, term, wm, self.gen))

    def progress(self, term: int, wm: int) -> None:
        sim, node = self.sim, self.node
        sim._hop(node, sim._m_on_peer_progress, node, self.peer, term, wm)

    def priority(self, background: bool) -> None:
        pass  # no processes to schedule here


class DispatcherDelivery:
    """Calls to a node's dispatchers (a mixin of :class:`~.group_sim.GroupSim`)."""

    file_reads = False  # dispatchers read committed batches from the leader's files first

    def _dispatcher_driver(self, node: Node, peer: str, logic: DispatcherLogic):
        driver = DispatcherDriver(logic, _SimDispatcherPorts(self, node, peer))
        driver.attach(SimLoop(self, node, actor=dkey(peer)))
        return driver

    def _d_hung(self, node: Node, peer: str) -> bool:
        return dkey(peer) in node.hung

    def _d_gone(self, node: Node, peer: str, gen: int) -> bool:
        """The dispatcher process ``gen`` cannot take an answer: it hangs, or it was killed
        (also for good: its peer left the configuration)."""
        key = dkey(peer)
        return (key in node.hung or node.helper_gen.get(key, 0) != gen
                or peer not in node.dispatcher_drivers)  # fmt: skip

    @staticmethod
    def _d_removed(node: Node, peer: str) -> bool:
        """The member stopped this dispatcher: its peer left the configuration."""
        return peer not in node.dispatcher_drivers

    def _d_pid(self, node: Node, peer: str):
        if self._d_removed(node, peer):
            return DIED
        if self._d_hung(node, peer):
            return park(dkey(peer))
        return node.helper_gen.get(dkey(peer), 0)

    def _d_activate(self, node: Node, peer: str, info):
        if self._d_removed(node, peer):
            return DIED
        if self._d_hung(node, peer):
            return park(dkey(peer))
        node.dispatcher_drivers[peer].deliver(Activate(info))
        return None

    def _d_deactivate(self, node: Node, peer: str, term: int):
        if self._d_removed(node, peer):
            return DIED
        if self._d_hung(node, peer):
            return park(dkey(peer))
        node.dispatcher_drivers[peer].deliver(Deactivate(term))
        return None

    def _d_on_announcement(self, node: Node, peer: str, a) -> None:
        if not self._d_hung(node, peer) and not self._d_removed(
            node, peer
        ):  # else lost with the process when it is killed
            node.dispatcher_drivers[peer].deliver(RoundAnnounced(a))

    def _d_on_committed(self, node: Node, peer: str, term: int, index: int) -> None:
        if not self._d_hung(node, peer) and not self._d_removed(node, peer):
            node.dispatcher_drivers[peer].deliver(Committed(term, index))

    def _d_fetch(self, node: Node, peer: str, f: Fetch, gen: int = 0, ports=None):
        """A batch the cache lacks, or an entry's (term, pos): the member's fenced answer
        (lost when the dispatcher hangs or was killed meanwhile).  With ``file_reads``, a
        batch of committed entries is read from the leader's files first, as on Ray."""
        lg = node.logic
        driver = node.dispatcher_drivers.get(peer)
        if driver is None:
            return
        self.stats[f"fetch_{f.kind}"] += 1
        data_dir = self.members[node.id].data_dir
        if self.file_reads and f.from_files and ports is not None and data_dir is not None:
            if ports.files is None:
                ports.files = StoreReader(data_dir)
            files = ports.files
            (batch,) = yield [lambda: _call(read_committed, files, f)]
            if self._d_gone(node, peer, gen):
                self.stats["dispatcher_answers_lost"] += 1
                return
            if isinstance(batch, CachedBatch):
                self.stats["fetch_from_files"] += 1
                driver.deliver(Fetched(f, (batch, None)))
                return
            self.stats["fetch_files_missed"] += 1  # not there: the member's fenced answer
        step = partial(self._step, node)
        (answer,) = yield [lambda: _call(mc.answer_fetch, step, lg.store, f)]
        if self._d_gone(node, peer, gen):
            self.stats["dispatcher_answers_lost"] += 1
            return
        if isinstance(answer, LedgerError):
            driver.deliver(Fetched(f, failed=True))
            return
        if answer is None:
            self.stats["fetch_fenced"] += 1
        else:
            self._note_need(node, peer, (f.term, f.kind, f.index))
        if f.kind == "batch":
            driver.deliver(Fetched(f, _cached(answer)))
        else:
            driver.deliver(Fetched(f, answer))

    def _d_snapshot_chunk(self, node: Node, req: PushEntryRequest) -> bytes | None:
        """``MemberActor.read_snapshot``: the chunk's bytes (None: fenced, or the snapshot
        is gone -- a newer one replaced it)."""
        c = req.snapshot
        lg = node.logic
        meta = _call(lambda: self._step(node, mc.ChunkAsked(req.term, c.index, c.term)).reply)
        if isinstance(meta, LedgerError):
            self.stats[f"install_read_{meta.code.name.lower()}"] += 1
            return None
        data = _call(lg.snapshots.store.read, meta, c.offset, c.length)
        if isinstance(data, LedgerError):
            self.stats["install_read_gone"] += 1
            return None
        self.stats["install_chunks"] += 1
        return data

    def _d_report(self, node: Node, peer: str, term: int, wm: int, gen: int = 0):
        driver = node.dispatcher_drivers.get(peer)
        if driver is None:
            return
        (committed,) = yield [lambda: self._c_report(node, term, peer, wm)]
        if self._d_gone(node, peer, gen):  # the answer waits in, or died with, the dispatcher
            self.stats["dispatcher_answers_lost"] += 1
            return
        if committed is DIED:  # the checker's process was killed while the report waited
            driver.deliver(Reported(term, wm, failed=True))
            return
        driver.deliver(Reported(term, wm, committed))

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
                    f"served: {d.core!r} "
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
        _, gen = node.sent.pop(id(req), (None, None))
        if gen is None:
            self.fail(f"{node.id}: an answer from {peer} to a push no dispatcher sent: {req!r}")
        if self._d_gone(node, peer, gen):  # answered to nobody
            self.stats["dispatcher_answers_lost"] += 1
            return
        node.dispatcher_drivers[peer].deliver(FollowerAnswer(req, resp))

    def _d_cg_begin(self, node: Node, peer: str, term: int, gen: int):
        if self._d_removed(node, peer):
            return DIED
        if self._d_hung(node, peer):
            return park(dkey(peer))
        return node.dispatcher_drivers[peer].deliver(GraphBegin(term, gen))

    def _d_cg_end(self, node: Node, peer: str, gen: int) -> None:
        if self._d_hung(node, peer) or self._d_removed(node, peer):
            return
        d = node.dispatchers[peer]
        if d.graph_gen == gen and d.active:
            self.stats["rewinds"] += 1
        node.dispatcher_drivers[peer].deliver(GraphEnd(gen))

    def _d_cg_push(self, node: Node, peer: str, g: GraphRound) -> tuple:
        if self._d_removed(node, peer):
            return DIED
        return node.dispatcher_drivers[peer].deliver(GraphPush(g))

    def _d_cg_ack(self, node: Node, peer: str, answered) -> tuple:
        (gen, term, rounds), answers = answered
        if self._d_removed(node, peer):
            return DIED
        d = node.dispatchers[peer]
        for key, resp, origin in answers:
            if origin != (node.id, term):
                self.stats["late_answer_elsewhere"] += 1
            req = d._graph_sent.get(key)  # the push this answer belongs to
            if req is not None:
                self._check_commit_answer(node, peer, req, resp)
        plain = [(key, resp) for key, resp, _ in answers]
        return node.dispatcher_drivers[peer].deliver(GraphAck(((gen, term, rounds), plain)))

    # -- the faults and the replacement -------------------------------------------------------
    def hang_dispatcher(self, mid: str, peer: str) -> None:
        """SIGSTOP ``mid``'s dispatcher to ``peer``: it answers nothing until its member
        kills it."""
        node = self.members[mid].node
        key = dkey(peer)
        if node is not None and key not in node.hung:
            node.hung.add(key)
            node.last_hang_ms = self.clock.now_ms
            node.hang_began_ms = self.clock.now_ms
            self.stats["dispatcher_hangs"] += 1
            self.net.note(f"FAULT hang {mid}'s dispatcher to {peer}")

    def kill_dispatcher(self, mid: str, peer: str) -> None:
        """``mid``'s dispatcher to ``peer`` dies (an OOM, a crash): Ray restarts it at once."""
        node = self.members[mid].node
        if node is not None:
            self.stats["dispatcher_kills"] += 1
            self.net.note(f"FAULT kill {mid}'s dispatcher to {peer}")
            self._d_restart(node, peer)

    def _d_kill(self, node: Node, peer: str) -> None:
        """The member killed its dispatcher's process (supervision's Replace)."""
        self.stats["dispatcher_replaced"] += 1
        self.net.note(f"{node.id}'s dispatcher to {peer} killed: Ray starts it again")
        self._d_restart(node, peer)

    def _d_restart(self, node: Node, peer: str) -> None:
        """Ray starts a fresh process (empty state) that tells its member; the calls that
        waited in the old one fail, the answers it waited for reach nobody, and a compiled
        graph through it fails."""
        key = dkey(peer)
        if key in node.hung:  # hung until now: rounds born meanwhile waited for this
            node.last_hang_ms = self.clock.now_ms
        node.hung.discard(key)
        node.helper_gen[key] = node.helper_gen.get(key, 0) + 1
        self._release_parked(node, key)
        logic = DispatcherLogic(self.group, node.id, peer, self.replication, self.cache_bytes)
        node.dispatchers[peer] = logic
        node.dispatcher_drivers[peer] = self._dispatcher_driver(node, peer, logic)
        node.need_watch[peer] = NeedWatch()
        for n, chain in self._chains:
            if n is node and chain.peer == peer:
                chain.edges[0].items.clear()  # to the dead dispatcher: lost
                chain.edges[2].items.clear()
        fp = node.fast.logic if node.fast is not None else None
        if fp is not None and fp.graph is not None and peer in fp.graph:
            self._hop(node, self._fp_fallback, node, fp.gen, f"dispatcher to {peer} died")
        self._hop(node, self._m_helper_started, node, "dispatcher", peer, next(_pids), True)


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
    if batch is None:  # compacted away: the dispatcher learns the leader's begin
        return None, info
    return CachedBatch(batch.first_index, batch.count, Inline(batch), len(batch.data)), info
