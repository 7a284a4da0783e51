"""``FastPath`` (actors/fastpath.py) in the whole-group simulation: per leader term a graph
of in-order channels (one chain per follower), its watchdog and fallback to plain calls,
and the seeded faults that switch it on and off or stall a channel."""

from __future__ import annotations

from typing import Any

from rayledger.actors.logic import Announcement

from .node_state import Chain, Channel, Execution, FastPathState, GraphRound, Node
from .sim_config import (
    FAST_PATH_COMPILE_MS,
    FAST_PATH_MAX_INFLIGHT,
    FAST_PATH_RETRY_MS,
    FAST_PATH_STALL_MS,
    FAST_PATH_SWITCH_MEAN_MS,
    LOCAL_HOP_MS,
)


class FastPath:
    """The compiled steady-state path (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _fp(self, node: Node) -> FastPathState:
        if node.fast is None:
            node.fast = FastPathState()
        return node.fast

    def _fp_start(self, node: Node, term: int) -> None:
        self._lane(node, "to_fast", self._fp_do_start, node, term)

    def _fp_do_start(self, node: Node, term: int) -> None:
        fp = self._fp(node)
        self._fp_do_stop(node)
        fp.term = term
        fp.backoff = FAST_PATH_RETRY_MS[0]
        self._fp_schedule_build(node, 0)

    def _fp_stop(self, node: Node) -> None:
        """The term ended: leave the graph (the member fails the rounds of the term)."""
        node.fast.active = False
        self._lane(node, "to_fast", self._fp_do_stop, node)

    def _fp_do_stop(self, node: Node) -> None:
        fp = node.fast
        self._cancel(fp.retry)
        fp.retry = None
        fp.building = None
        self._fp_abandon(node)
        fp.term = -1

    def _fp_submit(self, node: Node, a: Announcement, rounds: list) -> bool:
        fp = node.fast
        if not fp.active:
            return False
        self.stats["graph_rounds"] += 1
        self._lane(node, "to_fast", self._fp_enqueue, node, a, rounds)
        return True

    def _fp_abandon(self, node: Node) -> list:
        fp = node.fast
        fp.active = False
        fp.gen += 1
        self._cancel(fp.watchdog)
        fp.watchdog = None
        items = [(e.announcement, e.rounds) for e in fp.inflight]
        items += [(g.announcement, g.rounds) for g in fp.queue]
        fp.inflight.clear()
        fp.queue.clear()
        for chain in fp.chains.values():
            # what is in flight on the torn-down graph arrives late, or never
            if self._fp_rng.random() < 0.5:
                for e in chain.edges:
                    e.items.clear()
            else:
                self.stats["late_channels"] += 1
        fp.chains = {}
        return items

    def _fp_schedule_build(self, node: Node, delay: int) -> None:
        fp = node.fast
        self._cancel(fp.retry)
        fp.retry = self._at(node, self.clock.now_ms + delay, self._fp_begin_build, node)

    def _fp_begin_build(self, node: Node) -> None:
        fp = node.fast
        fp.retry = None
        if fp.term < 0 or fp.active or fp.building is not None:
            return
        if not self.members[node.id].fast_enabled:  # switched off: stay on plain calls
            return
        fp.building = next(fp.build_ids)
        self._spawn(node, self._fp_build(node, fp, fp.building, fp.term))

    def _reachable(self, a: str, b: str) -> bool:
        return self.net.link_up(a, b) and self.net.link_up(b, a) and self.members[b].alive

    def _fp_build(self, node: Node, fp: FastPathState, build_id: int, term: int):
        lo, hi = FAST_PATH_COMPILE_MS
        yield self._fp_rng.randint(lo, hi)  # followers leave old loops; the graph compiles
        if fp.building != build_id:
            return  # cancelled while compiling
        fp.building = None
        peers = list(node.dispatchers)
        if not all(self._reachable(node.id, p) for p in peers):
            self.net.note(f"{node.id} term={term}: compiled path not built (a follower is away)")
            self._fp_retry_later(node)
            return
        if term != fp.term:
            return
        fp.gen += 1
        gen = fp.gen
        calls = [lambda: self._c_cg_begin(node, term, gen)]
        calls += [(lambda p=p: self._d_cg_begin(node, p, term, gen)) for p in peers]
        answers = yield calls
        if not all(answers):
            self._fp_retry_later(node)
            return
        if gen != fp.gen or term != fp.term:
            # left (or restarted for a new term) while the helpers were told: see the report
            self.stats["fast_build_raced"] += 1
            return
        fp.active = True
        fp.compiles += 1
        self.stats["fast_compiles"] += 1
        for p in peers:
            chain = Chain(node.id, p, gen, self.members[p].incarnation)
            fp.chains[p] = chain
            self._chains.append((node, chain))
        self.net.note(f"{node.id} term={term}: compiled path on (generation {gen})")

    def _fp_retry_later(self, node: Node) -> None:
        fp = node.fast
        if fp.term < 0:
            return
        delay = fp.backoff
        fp.backoff = min(fp.backoff * 2, FAST_PATH_RETRY_MS[1])
        self._fp_schedule_build(node, delay)

    def _fp_enqueue(self, node: Node, a: Announcement, rounds: list) -> None:
        fp = node.fast
        if not fp.active:
            self._lane(node, "to_main", self._m_on_graph_fallback, node, [(a, tuple(rounds))])
            return
        q = fp.queue
        if q:
            prev = q.pop()
            a = prev.announcement.followed_by(a)
            rounds = list(prev.rounds) + list(rounds)
        q.append(GraphRound(fp.gen, a, tuple(rounds)))
        self._fp_submit_some(node)

    def _fp_submit_some(self, node: Node) -> None:
        fp = node.fast
        now = self.clock.now_ms
        while fp.active and fp.queue and len(fp.inflight) < FAST_PATH_MAX_INFLIGHT:
            g = fp.queue.popleft()
            ex = Execution(now, g.announcement, g.rounds, fp.gen, len(fp.chains))
            fp.inflight.append(ex)
            for chain in fp.chains.values():
                self._put(chain, 0, (ex, g))
            if fp.watchdog is None:
                self._fp_arm_watchdog(node)

    def _fp_collect(self, node: Node, ex: Execution, out) -> None:
        fp = node.fast
        if ex.gen != fp.gen:
            if out is not None:
                self._lane(node, "to_main", self._m_on_graph_output, node, *out)
            return
        if out is not None:
            self._lane(node, "to_main", self._m_on_graph_output, node, *out)
        ex.waiting -= 1
        if ex.waiting == 0:
            while fp.inflight and fp.inflight[0].waiting == 0:
                fp.inflight.popleft()
            self._fp_submit_some(node)
            self._fp_arm_watchdog(node)

    def _fp_arm_watchdog(self, node: Node) -> None:
        fp = node.fast
        self._cancel(fp.watchdog)
        fp.watchdog = None
        if not fp.inflight:
            return
        due = fp.inflight[0].started + FAST_PATH_STALL_MS
        fp.watchdog = self._at(node, max(self.clock.now_ms, due), self._fp_check_stall, node)

    def _fp_check_stall(self, node: Node) -> None:
        fp = node.fast
        fp.watchdog = None
        if fp.inflight and self.clock.now_ms - fp.inflight[0].started >= FAST_PATH_STALL_MS:
            self._fp_fallback(node, f"an execution waited more than {FAST_PATH_STALL_MS} ms")
        else:
            self._fp_arm_watchdog(node)

    def _fp_fallback(self, node: Node, why: str) -> None:
        """Leave the graph: plain calls carry everything until a new graph is built."""
        fp = node.fast
        if fp is None or not fp.active:
            return
        fp.fallbacks += 1
        self.stats["fast_fallbacks"] += 1
        gen = fp.gen
        self.net.note(f"{node.id} term={fp.term}: compiled path off (generation {gen}): {why}")
        items = self._fp_abandon(node)
        for p in node.dispatchers:
            self._hop(node, self._d_cg_end, node, p, gen)
        self._hop(node, self._c_cg_end, node, gen)
        self._lane(node, "to_main", self._m_on_graph_fallback, node, items)
        self._fp_retry_later(node)

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

    def _run_chains(self, now: int) -> bool:
        ran = False
        keep = []
        for node, chain in self._chains:
            if node.dead:
                continue
            for k, ch in enumerate(chain.edges):
                while self._deliverable(ch, now):
                    _, item = ch.items.popleft()
                    ran = True
                    self._chain_stage(node, chain, k, item)
                    if node.dead:
                        break
            fp = node.fast
            if not chain.empty() or (fp is not None and fp.chains.get(chain.peer) is chain):
                keep.append((node, chain))
        self._chains = keep
        return ran

    def _chain_stage(self, node: Node, chain: Chain, k: int, item: Any) -> None:
        peer = chain.peer
        if k == 0:
            ex, g = item
            self._put(chain, 1, (ex, self._d_cg_push(node, peer, g)))
        elif k == 1:
            ex, pushed = item
            follower = self.members[peer].node
            if follower is None or follower.incarnation != chain.follower_inc:
                if node.fast is not None and node.fast.gen == chain.gen:
                    self._hop(node, self._fp_fallback, node, f"participant {peer} failed")
                return
            self._put(chain, 2, (ex, self._m_cg_push(follower, pushed)))
        elif k == 2:
            ex, answered = item
            self._put(chain, 3, (ex, self._d_cg_ack(node, peer, answered)))
        elif k == 3:
            ex, ack = item
            self._put(chain, 4, (ex, self._c_cg_report(node, ack)))
        else:
            ex, out = item
            self._fp_collect(node, ex, out)

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
                if m.alive and m.node.fast is not None and m.node.fast.active
            ]
            if not graphs:
                kind = "on"
            else:
                node = rng.choice(graphs)
                peer = rng.choice(sorted(node.fast.chains))
                edge = node.fast.chains[peer].edges[rng.choice((1, 2))]
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
                fp = node.fast
                lg = node.logic
                if lg.ready_term == lg.state.current_term and lg.leads(lg.ready_term):
                    if fp is None or (not fp.active and fp.building is None):
                        self._fp_start(node, lg.ready_term)
        else:
            m.fast_enabled = False
            self.net.note(f"FAULT fast path off at {m.id}")
            if m.alive and m.node.fast is not None:
                self._hop(m.node, self._fp_fallback, m.node, "switched off")
