"""Starting, crashing and restarting members in the whole-group simulation: stores opened
and abandoned (never a clean close), power losses that keep only what fdatasync made
durable plus a seeded torn tail, and the flush service in simulated time."""

from __future__ import annotations

import os
import random
import shutil

from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.member import MemberCore
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.election import FileTermStore, MemoryTermStore
from rayledger.election.configuration import FileConfigStore
from rayledger.replication.checker import CheckerLogic
from rayledger.replication.dispatcher import DispatcherLogic
from rayledger.storage import FileStore, LogStore, MemoryStore, StoreConfig

from .node_state import Node, SimMember
from .sim_config import FLUSH_TICK_MS, PARKED_MS, REPLACE_LOST_AFTER_MS


class MemberLifecycle:
    """Members' processes and stores across crashes (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _open_store(self, m: SimMember) -> LogStore:
        if m.data_dir is None:
            return MemoryStore(StoreConfig(**self.store_config))
        return FileStore(
            StoreConfig(
                data_dir=m.data_dir,
                sync_flush=self.sync_flush,
                flush_interval_ms=PARKED_MS,
                checkpoint_interval_ms=PARKED_MS,
                **self.store_config,
            )
        )

    def _helper_up(
        self, node: Node, kind: str, peer: str | None, booted_at: int | None = None
    ) -> None:
        """A helper's first process started: it tells its member (``helper_started``), at
        once or, with ``late_start_reports``, after a seeded delay -- on Ray that call from
        the helper's constructor is unordered with the member's own calls to the helper, and
        a leader's watch that began before it kept the start-up wait (CI, stop 33).  A late
        report may arrive after the report of the process that replaced it.  ``booted_at``:
        the process boots until then, and reports after."""
        if booted_at is not None:
            lo, hi = self.late_start_reports or (0, 0)
            due = booted_at + self._start_rng.randint(lo, hi)
            self._at(node, due, self._m_helper_started, node, kind, peer, node.incarnation)
            return
        if self.late_start_reports is None:
            node.supervisor.pids.setdefault((kind, peer), node.incarnation)
            return
        lo, hi = self.late_start_reports
        due = self.clock.now_ms + self._start_rng.randint(lo, hi)
        self._at(node, due, self._m_helper_started, node, kind, peer, node.incarnation)

    def _start(self, mid: str) -> None:
        if self.gone(mid):  # its node is lost, or it was stopped for good
            return
        m = self.members[mid]
        if m.store is None:
            m.store = self._open_store(m)
        # the term store as persisted, never what the dead incarnation held in memory
        if m.data_dir is not None:
            m.term_store = FileTermStore(m.data_dir)
        else:
            m.term_store = MemoryTermStore(*m.term_store.load())
        self._watch_truncates(m)
        logic = MemberLogic(
            self.group,
            mid,
            self.voters0,
            m.store,
            self.election,
            self.replication,
            m.term_store,
            rng=random.Random(self.rng.getrandbits(64)),
            config_store=FileConfigStore(m.data_dir) if m.data_dir else m.config_store,
            initial=m.initial,
        )
        members = list(logic.config_log.latest().members)
        dispatchers = {
            p: DispatcherLogic(self.group, mid, p, self.replication, self.cache_bytes)
            for p in members
            if p != mid
        }
        checker = CheckerLogic(self.group, mid, members, self.replication)
        m.incarnation += 1
        m.node = Node(mid, m.incarnation, logic, dispatchers, checker)
        m.node.checker_driver = self._checker_driver(m.node, checker)
        m.node.core = MemberCore(
            logic,
            rpc_timeout_ms=self.rpc.timeout_ms,
            sync=self.sync_flush,
            machine=self.machine_path is not None,
            fast_path=True,  # the simulation's switch decides (SimMember.fast_enabled)
            tick_ms=self.tick_ms,
            lease_ms=LedgerConfig(election=self.election).lease_ms(),
            max_rounds=self.max_rounds,
            replace_lost_after_ms=REPLACE_LOST_AFTER_MS if self.lost_members else None,
        )
        m.store.defer_sync = self.sync_flush  # flushes are the cores' (tests/simulation/disk.py)
        # MemberActor._create_helpers: dispatchers for the members the core keeps them for
        keep = m.node.core.supervisor.dispatcher_peers()
        for p in [p for p in dispatchers if p not in keep]:
            del dispatchers[p], m.node.need_watch[p]
        for kind, peer in m.node.supervisor.keys():
            self._helper_up(m.node, kind, peer)
        m.node.dispatcher_drivers = {
            p: self._dispatcher_driver(m.node, p, d) for p, d in dispatchers.items()
        }
        if self.machine_path is not None:
            self._m_open(m)
        self._at(m.node, self.clock.now_ms, self._maintain, m.node)
        # a restart may recover a lower committed index (the checkpoint lags); never other entries
        m.committed_seen = min(m.committed_seen, m.store.committed_index)
        m.verified_end = min(m.verified_end, m.store.ledger_end_index)
        self.net.set_down(mid, False)
        if m.incarnation > 1:
            self.net.note(
                f"{mid} RESTART term={logic.state.current_term} end={m.store.ledger_end_index} "
                f"committed={m.store.committed_index}"
            )

    def _watch_truncates(self, m: SimMember) -> None:
        """Record how far truncates and resets cut the log, for the Log Matching scan."""
        store = m.store
        mid = m.id
        truncate, reset = store.truncate, store.reset

        def watched_truncate(end_index: int) -> int:
            out = truncate(end_index)
            self.touched[mid] = min(self.touched.get(mid, 1 << 62), store.ledger_end_index)
            self.net.note(f"{mid} truncated to {store.ledger_end_index}")
            return out

        def watched_reset(begin_index: int, begin_pos: int, term_floor: int = -1) -> None:
            reset(begin_index, begin_pos, term_floor)
            self.touched[mid] = min(self.touched.get(mid, 1 << 62), store.ledger_end_index)
            self.net.note(f"{mid} reset to begin at {begin_index}")

        store.truncate = watched_truncate  # type: ignore[method-assign]
        store.reset = watched_reset  # type: ignore[method-assign]

    def _crash(self, mid: str, power: bool | None = None) -> None:
        """Kill ``mid``: a process crash, or (``power``; None: seeded) a power loss."""
        m = self.members[mid]
        if power is None:
            power = m.data_dir is not None and self._power_rng.random() < self.power_loss
        if m.alive:
            self._check_member(m)  # what it committed this step counts
            m.node.dead = True
            self._m_close(m.node)
        m.node = None
        kind = "CRASH"
        if m.data_dir is not None and m.store is not None:
            kind = self._kill_store(m, power)
            m.store = None
        self.net.set_down(mid, True)
        self.rpc.forget_caller(mid)
        self.net.note(f"{mid} {kind}")
        # a graph with a participant that died fails; what was in flight to it is lost
        self._leave_graphs(mid, "died")
        for node, chain in self._chains:
            if chain.peer == mid and not node.dead:
                for e in chain.edges[1:3]:
                    e.items.clear()
                fp = node.fast.logic if node.fast is not None else None
                if fp is not None and fp.graph is not None and fp.graph.get(mid) is chain:
                    self._hop(node, self._fp_fallback, node, fp.gen, f"participant {mid} died")

    def _kill_store(self, m: SimMember, power: bool) -> str:
        """Abandon a FileStore without close(): no final flush, no checkpoint.  A power loss
        then cuts each file to what fdatasync made durable plus a seeded prefix of the rest."""
        store = m.store
        at = store.abandon()  # parks the flush thread for good, without its final flush
        durable, written, lists = at.durable, at.written, (store._data, store._index)
        if not power:
            self._durable_end[m.id] = store.ledger_end_index  # the page cache survives
            return "CRASH"
        rng = self._power_rng
        keeps = []
        for sl, d, w in zip(lists, durable, written, strict=True):
            keep = w if d >= w else rng.choice((d, d, rng.randint(d, w)))
            keeps.append(keep)
            for seg in sl.segments:
                if seg.start >= keep and seg.start > 0:
                    seg.path.unlink(missing_ok=True)  # created after the last durable point
                elif seg.start + seg.length > keep:
                    os.truncate(seg.path, max(0, keep - seg.start))
        lost_from = store.flushed_index + 1
        kept = lost_from if keeps[0] == durable[0] else None
        seen = min(self.max_committed, store.ledger_end_index)  # committed anywhere
        self._durable_end[m.id] = store.flushed_index
        if lost_from <= seen and self.sync_flush:
            self._check_durable_quorum(m.id, lost_from, seen)
        if lost_from <= store.ledger_end_index and not self.sync_flush:
            # whatever it lost it may have acknowledged to a leader, which may count it
            # towards a quorum later (seed 20196: acked at 196 twice); without sync_flush
            # that voids the durability checks for the rest of the run (with it, a member
            # acknowledges and counts only what it flushed: it lost nothing it counted)
            self.durability_void = True
            self.stats["power_lost_entries"] += 1
            self.lost_from[m.id] = min(lost_from, self.lost_from.get(m.id, lost_from))
        self.stats["power_losses"] += 1
        return (
            f"POWER LOSS (durable data {durable[0]}/{written[0]}, kept {keeps[0]}; "
            f"index units {durable[1]}/{written[1]}, kept {keeps[1]}; from index {kept})"
        )

    def _check_durable_quorum(self, mid: str, lost_from: int, seen: int) -> None:
        """sync_flush: ``mid`` lost entries it never flushed, so it never counted them
        toward a quorum; what was committed among them must be on the disks of a quorum of
        the others (a copy counted before it was flushed is how an acknowledged append is
        lost).  The quorum is of the voters in effect there or, one change behind, of those
        before (what the leader's checker may count)."""
        ok, holders = False, []
        for voters in self.voters_around(seen):
            others = [x for x in voters if x != mid]
            holders = [x for x in others if self._durable_end_of(x) >= seen]
            ok = ok or len(holders) >= len(voters) // 2 + 1
        if not ok:
            self.fail(
                f"{mid} lost committed entries {lost_from}..{seen} to a power loss with "
                f"sync_flush, and only {holders} of the others hold {seen} on disk: a copy "
                "was counted toward the quorum before it was flushed"
            )

    def _durable_end_of(self, mid: str) -> int:
        m = self.members[mid]
        if m.store is not None:
            return m.store.flushed_index
        return self._durable_end.get(mid, -1)

    def _flush_step(self, now: int) -> None:
        """The flush service of every live FileStore member, in simulated time."""
        if self._tmp is None or self.sync_flush:
            return
        for m in self.members.values():
            if m.store is None or not m.alive:
                continue
            due = self._next_flush_ms.get(m.id)
            if due is None or now >= due:
                if due is not None:
                    m.store.flush()
                self._next_flush_ms[m.id] = now + self._power_rng.randint(*FLUSH_TICK_MS)

    def crash(self, mid: str, power: bool | None = None) -> None:
        """Crash ``mid`` by hand (the fault injector counts it down until ``restart``)."""
        if self.injector is not None:
            self.injector.crashed.add(mid)
        self._crash(mid, power)

    def close(self) -> None:
        for m in self.members.values():
            if m.store is not None:
                m.store.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
