"""``FastPath`` (actors/fastpath.py) in the whole-group simulation: the shipped
:class:`~rayledger.actors.core.fastpath.FastPathDriver` on the node's fast-path loop, with a
"graph" of in-order channels (one chain per follower) as its transport, and the seeded
faults that switch it on and off or stall a channel.  Delivery only: the core decides when
to build, what goes through, the watchdog and the fallback."""

from __future__ import annotations

from typing import Any

from rayledger.actors.core.fastpath import (
    Began,
    Built,
    Collected,
    Execution,
    FastPathDriver,
    FastPathLogic,
    GraphFailed,
)
from rayledger.replication.checker import Resolution

from .node_state import Chain, Channel, Node
from .node_transport import SimLoop
from .sim_config import (
    FAST_PATH_COMPILE_MS,
    FAST_PATH_PARK_MS,
    FAST_PATH_RETRY_MS,
    FAST_PATH_STALL_MS,
    FAST_PATH_SWITCH_MEAN_MS,
    LOCAL_HOP_MS,
)


class _SimFastPorts:
    """The graph's transport on a simulated node."""

    __slots__ = ("sim", "node")

    def __init__(self, sim, node: Node):
        self.sim, self.node = sim, node

    def build(self, build_id: int, term: int) -> None:
        self.sim._spawn(self.node, self.sim._fp_build(self.node, build_id, term))

    def begin(self, term: int, gen: int) -> None:
        self.sim._spawn(self.node, self.sim._fp_begin(self.node, term, gen))

    def execute(self, graph: dict[str, Chain], ex: Execution) -> None:
        for chain in graph.values():
            self.sim._put(chain, 0, (ex, ex.item))

    def end(self, gen: int) -> None:
        sim, node = self.sim, self.node
        fp = node.fast.logic
        sim.stats["fast_fallbacks"] += 1
        sim.net.note(
            f"{node.id} term={fp.term}: compiled path off (generation {gen}): {fp.last_fallback}"
        )
        for p in node.dispatchers:
            sim._hop(node, sim._d_cg_end, node, p, gen)
        sim._hop(node, sim._c_cg_end, node, gen)

    def fallback(self, items: list) -> None:
        sim, node = self.sim, self.node
        sim._lane(node, "to_main", sim._m_on_graph_fallback, node, items)

    def output(self, r: Resolution) -> None:
        sim, node = self.sim, self.node
        sim._lane(node, "to_main", sim._m_on_resolved, node, r)

    def teardown(self, graph: dict[str, Chain]) -> None:
        for chain in graph.values():
            if not chain.live:  # built, never executed
                continue
            # what is in flight on the torn-down graph arrives late, or never
            if self.sim._fp_rng.random() < 0.5:
                for e in chain.edges:
                    e.items.clear()
            else:
                self.sim.stats["late_channels"] += 1


class FastPathDelivery:
    """The compiled steady-state path (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _fp(self, node: Node) -> FastPathDriver:
        if node.fast is None:
            logic = FastPathLogic(len(node.dispatchers), FAST_PATH_STALL_MS, FAST_PATH_RETRY_MS,
                                  park_ms=FAST_PATH_PARK_MS)  # fmt: skip
            logic.enabled = self.members[node.id].fast_enabled
            node.fast = FastPathDriver(logic, _SimFastPorts(self, node))
            node.fast.attach(SimLoop(self, node, lane="to_fast"))
        return node.fast

    def _fp_start(self, node: Node, term: int) -> None:
        self._fp(node).start(term)

    def _fp_stop(self, node: Node) -> None:
        """The term ended: leave the graph (the member fails the rounds of the term)."""
        node.fast.stop()

    def _fp_submit(self, node: Node, a, rounds: list) -> bool:
        if not node.fast.submit(a, rounds):
            return False
        self.stats["graph_rounds"] += 1
        return True

    def _reachable(self, a: str, b: str) -> bool:
        return self.net.link_up(a, b) and self.net.link_up(b, a) and self.members[b].alive

    def _fp_build(self, node: Node, build_id: int, term: int):
        """Followers leave old loops and the graph compiles; a follower away fails it."""
        lo, hi = FAST_PATH_COMPILE_MS
        yield self._fp_rng.randint(lo, hi)
        peers = list(node.dispatchers)
        if not all(self._reachable(node.id, p) for p in peers):
            self.net.note(f"{node.id} term={term}: compiled path not built (a follower is away)")
            node.fast.deliver(Built(build_id, term, None, "a follower is away"))
            return
        for p in peers:
            self._leave_graphs(p, "cg_reset")
        graph = {p: Chain(node.id, p, self.members[p].incarnation) for p in peers}
        node.fast.deliver(Built(build_id, term, graph, None))

    def _fp_begin(self, node: Node, term: int, gen: int):
        """The helpers are told the generation they serve."""
        calls = [lambda: self._c_cg_begin(node, term, gen)]
        calls += [(lambda p=p: self._d_cg_begin(node, p, term, gen)) for p in node.dispatchers]
        answers = yield calls
        fp = node.fast.logic
        raced = fp.raced
        node.fast.deliver(Began(term, gen, all(a is True for a in answers)))  # DIED: killed
        if fp.raced > raced:
            self.stats["fast_build_raced"] += 1
        if fp.active and fp.gen == gen:
            for chain in fp.graph.values():
                chain.live = True
                self._chains.append((node, chain))
            self.stats["fast_compiles"] += 1
            self.net.note(f"{node.id} term={term}: compiled path on (generation {gen})")

    def _fp_fallback(self, node: Node, gen: int, why: str) -> None:
        if node.fast is not None:
            node.fast.deliver(GraphFailed(gen, why))

    # -- the graph's channels ----------------------------------------------------------------

    def _put(self, chain: Chain, edge: int, item: Any) -> None:
        ch = chain.edges[edge]
        now = self.clock.now_ms
        if ch.remote:
            delay = self._fp_rng.randint(0, 3)
            if chain.peer in self.slow and self.slow[chain.peer] > now:
                delay += self._fp_rng.randint(20, 250)
        else:
            delay = self._fp_rng.randint(*LOCAL_HOP_MS)
        ready = max(now + delay, ch.last)
        ch.last = ready
        ch.items.append((ready, item))

    def _deliverable(self, ch: Channel, now: int) -> bool:
        if not ch.items or ch.items[0][0] > now:
            return False
        if ch.remote:
            return ch.stall_until <= now and self.net.link_up(ch.src, ch.dst)
        return True

    @staticmethod
    def _live_chain(node: Node, chain: Chain) -> bool:
        """The chain belongs to the node's live graph."""
        graph = node.fast.logic.graph if node.fast is not None else None
        return graph is not None and graph.get(chain.peer) is chain

    def _run_chains(self, now: int) -> bool:
        ran = False
        keep = []
        for node, chain in self._chains:
            if node.dead:
                if chain.live and not chain.left:  # the follower's loop spins until it leaves
                    keep.append((node, chain))
                continue
            for k, ch in enumerate(chain.edges):
                while self._deliverable(ch, now):
                    _, item = ch.items.popleft()
                    ran = True
                    self._chain_stage(node, chain, k, item)
                    if node.dead:
                        break
            if not chain.empty() or self._live_chain(node, chain):
                keep.append((node, chain))
        self._chains = keep
        return ran

    def _chain_stage(self, node: Node, chain: Chain, k: int, item: Any) -> None:
        peer = chain.peer
        if k in (0, 2) and self._d_hung(node, peer):
            return  # a hung dispatcher answers nothing: the execution stalls
        if k == 0:
            ex, g = item
            self._put(chain, 1, (ex, self._d_cg_push(node, peer, g)))
        elif k == 1:
            ex, pushed = item
            follower = self.members[peer].node
            if follower is None or follower.incarnation != chain.follower_inc:
                self._hop(node, self._fp_fallback, node, ex.gen, f"participant {peer} failed")
                return
            if chain.left:  # its loop is closed: the execution fails at its channel
                self._hop(node, self._fp_fallback, node, ex.gen, f"participant {peer} left")
                return
            self._put(chain, 2, (ex, self._m_cg_push(follower, pushed)))
        elif k == 2:
            ex, answered = item
            self._put(chain, 3, (ex, self._d_cg_ack(node, peer, answered)))
        elif k == 3:
            ex, ack = item
            if "checker" in node.hung:
                return  # a hung checker answers nothing: the execution stalls
            self._put(chain, 4, (ex, self._c_cg_report(node, ack)))
        else:
            ex, out = item
            node.fast.deliver(Collected(ex, out))

    def _leave_graphs(self, follower: str, why: str) -> None:
        """``reset_loops`` on a follower: it leaves every graph it serves (``why``: its
        core's ``leave_graphs``, a new leader's ``cg_reset``, its process died)."""
        for node, chain in self._chains:
            if chain.peer == follower and not chain.left:
                chain.left = True
                if node.dead:
                    self.stats[f"dead_graphs_left_{why}"] += 1
                self.net.note(f"{follower} left {node.id}'s compiled graph ({why})")

    def _next_chain_ms(self) -> int | None:
        best = None
        for node, chain in self._chains:
            if node.dead:
                continue
            for ch in chain.edges:
                if not ch.items:
                    continue
                t = ch.items[0][0]
                if ch.remote:
                    if not self.net.link_up(ch.src, ch.dst):
                        continue
                    t = max(t, ch.stall_until)
                if best is None or t < best:
                    best = t
        return best

    # -- the switch faults --------------------------------------------------------------------

    def _switch_step(self, now: int) -> None:
        """Seeded fast-path faults: switch a member's compiled path on or off, or stall
        one channel of a leader's graph."""
        if self._next_switch_ms is None or now < self._next_switch_ms:
            return
        rng = self._fp_rng
        self._next_switch_ms = now + int(rng.expovariate(1 / FAST_PATH_SWITCH_MEAN_MS)) + 1
        kind = rng.choices(("on", "off", "stall"), (2.0, 1.0, 4.0))[0]
        if kind == "stall":
            graphs = [
                m.node
                for m in self.members.values()
                if m.alive
                and m.node.fast is not None
                and m.node.fast.logic.active
                and m.node.fast.logic.graph  # (a single voter's graph has no edges)
            ]
            if not graphs:
                kind = "on"
            else:
                node = rng.choice(graphs)
                graph = node.fast.logic.graph
                peer = rng.choice(sorted(graph))
                edge = graph[peer].edges[rng.choice((1, 2))]
                edge.stall_until = now + rng.randint(10, 400)
                self.net.note(
                    f"FAULT stall {edge.src}->{edge.dst} of {node.id}'s graph "
                    f"until {edge.stall_until}"
                )
                return
        m = self.members[rng.choice(self.ids)]
        if kind == "on":
            m.fast_enabled = True
            self.net.note(f"FAULT fast path on at {m.id}")
            if m.alive:
                node = m.node
                term = node.logic.ready_leading_term()
                if node.fast is not None:
                    node.fast.set_enabled(True)
                elif term >= 0:
                    self._fp_start(node, term)
        else:
            m.fast_enabled = False
            self.net.note(f"FAULT fast path off at {m.id}")
            if m.alive and m.node.fast is not None:
                m.node.fast.set_enabled(False)
