"""The state-machine runner (actors/member/machine.py) in the whole-group simulation.

On the seeds that run one, every member runs a real machine -- the KV example
(``KvMachine``) or the RocketMQ commit log (``CommitLogMachine``) -- through the shipped
:class:`~rayledger.actors.machine.Applier` and its core
(:class:`~rayledger.actors.core.machine.MachineCore`), which decide what to apply next and
when a new leader's machine is ready.  This mixin is only their transport, as the Ray
runner is: the machine's one thread is a queue in simulated time (an apply takes a seeded
while, now and then a long one), the supervisor's ``MachineRole``/``WaitMachine`` are
performed on it, the leader's store calls the machine's ``pre_append`` in its write, and a
crash closes the machine; the restarted member reopens it from what it saved in the
member's data dir (memory members keep nothing and replay the whole log), as on Ray.

Queries (``MachineRunner.query`` with the ``committed`` consistency) go to a random member
now and then; the core answers them at once, lets them wait for a batch, or times them out.

Checks: each ``apply`` call continues exactly where the machine stands and gives it only
entries committed at that index in that term (instrumented around the applier's calls,
the machines unchanged); a reopened machine never claims more than it was given; at the
end every member's machine state equals a fresh machine's fed the committed log from
scratch, and the leader's stamps hold (a KV revision is the entry's index; RocketMQ queue
offsets run 0, 1, 2, ... per queue over the committed log and match the consume queues,
physical offsets are the entries' positions).  A power loss without ``sync_flush`` may void
these (a machine kept entries its log lost): then they are counted, not failed.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import struct
import tempfile
from collections.abc import Callable
from typing import Any

from rayledger.actors.core import machine as mcore
from rayledger.actors.core import supervision as sv
from rayledger.actors.core.machine import AskReady, Install, QueryVerdict, Rebase
from rayledger.actors.core.read_path import run_to_end
from rayledger.actors.core.snapshot_policy import SnapshotConfig
from rayledger.actors.machine import Applier, MachineContext, StateMachine, load_machine
from rayledger.election.configuration import CONFIG_CHANNEL
from rayledger.integration.kv import set_command
from rayledger.integration.rocketmq.commitlog import CommitLogMachine, offset_command
from rayledger.integration.rocketmq.message import (
    MAGIC_CODE,
    PHYS_OFFSET_POS,
    QUEUE_OFFSET_POS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    decode,
    encode,
)
from rayledger.storage import LedgerError
from rayledger.storage.codec import HEADER_SIZE
from rayledger.storage.snapshots import SESSIONS_FILE, with_sessions

from .network import SimulationFailure
from .node_state import Node, SimMember
from .sim_config import LEASE_PARTITION_TIMEOUTS, SNAPSHOT_CUT_CHANCE

MACHINES = {
    "kv": "rayledger.integration.kv:KvMachine",
    "mq": "rayledger.integration.rocketmq.commitlog:CommitLogMachine",
}
MACHINE_CALL_MS = (0, 2)  # a role change or a readiness question on the machine's thread
MACHINE_APPLY_MS = (0, 5)  # an applied batch, plus a millisecond per 64 entries
MACHINE_PAUSE = (0.02, (50, 400))  # now and then an apply pauses long (a GC, a slow disk)
MACHINE_QUERY_EVERY_MS = (10, 80)  # a query to some member's machine this often
MACHINE_QUERY_TIMEOUT_MS = (50, 400)  # seeded: some run out while an apply pauses
NEVER_MS = 10**15  # CommitLogMachine checkpoint interval: never (time.monotonic is no input)

_REV = re.compile(rb'"rev": "\d{10}"')
_STORE_TS_POS = 56
_MAGIC = struct.pack(">i", MAGIC_CODE)


class MachineDelivery:
    """Members' state machines and their checks (a mixin of :class:`~.group_sim.GroupSim`)."""

    def _init_machines(
        self,
        machine: str | None,
        keep: int = 2,
        sessions_damage: float = 0.0,
        snapshot_cuts: bool = False,
    ) -> None:
        """``machine``: "kv", "mq" or None; ``keep``: the snapshots each keeps;
        ``sessions_damage``: the share of damaged snapshots damaged in their client sessions;
        ``snapshot_cuts``: see :meth:`_m_snapshot_cut`.
        Its own streams, so the other streams of a seed stay as they were."""
        self.sessions_damage = sessions_damage
        self.machine = machine
        self.machine_path = MACHINES[machine] if machine else None
        self._machine_rng = random.Random(self.seed * 7919 + 71)
        self._body_rng = random.Random(self.seed * 7919 + 73)
        self._query_rng = random.Random(self.seed * 7919 + 79)
        self._snapshot_rng = random.Random(self.seed * 7919 + 83)
        self._damage_rng = random.Random(self.seed * 7919 + 173)  # which file a damage hits
        self._snapshot_cut_rng = random.Random(self.seed * 7919 + 191) if snapshot_cuts else None
        # snapshots: every 20-80 applied entries, the newest ``keep`` kept; a restart
        # sometimes finds the machine's own state file gone and starts from a snapshot
        self.snapshots = SnapshotConfig(every_entries=20 * (1 + self.seed % 4), keep=keep)
        self._next_query_ms: int | None = 0 if machine else None
        self.machine_args: dict = {}
        if machine == "mq":  # every batch checkpoints, or none does (replays from the start)
            self.machine_args = {"checkpoint_interval_ms": self._machine_rng.choice((0, NEVER_MS))}

    # -- the machine's process ---------------------------------------------------------------
    def _m_open(self, m: SimMember) -> None:
        """``MachineRunner.__init__``: build the machine and open it in the member's dir."""
        node = m.node
        machine = load_machine(self.machine_path)
        if m.incarnation > 1 and m.data_dir is not None and self._snapshot_rng.random() < 0.3:
            if self.snapshots.keep > 1 or self._others_hold_state(m):
                self._damage_newest_snapshot(m)
        ctx = MachineContext(self.group, m.id, m.data_dir, dict(self.machine_args), m.store)
        try:  # MachineRunner.__init__: a machine that cannot open fails the member's start
            node.applier = Applier(machine, ctx, snapshots=self.snapshots)
        except Exception as exc:
            self.fail(f"{m.id}'s machine failed to open: {exc!r}")
        if node.applier.shelf is not None:  # MachineRunner: offered to, taken from leaders
            node.logic.take_snapshots(
                node.applier.shelf,
                node.applier.core.snapshot_wanted,
                lambda index, have, node=node: self._m_asked(node, index, have),
            )
        store = m.store
        store.keep_from = node.applier.core.keep_from(node.applier.saved)
        inner = machine.apply

        def apply(entries: list) -> None:  # instruments the applier's calls, not the machine
            self._m_check_apply(node, entries)
            inner(entries)
            self._m_after_apply(node, entries)

        machine.apply = apply  # type: ignore[method-assign]
        opened = node.applier.core.applied
        if opened > node.applier.saved:
            m.rebases.append((opened, opened))  # a snapshot's state, as a leader's would be
            self.stats["machine_from_snapshot"] += 1
            self.net.note(f"{m.id} machine starts from its snapshot at {opened}")
        # (a snapshot sealed from a leader may be opened before it was loaded: a crash
        # between the two; _m_installed's check of it against the replay runs then too)
        if opened > m.machine_high and opened > m.sealed_high:
            self.fail(
                f"{m.id}'s machine reopened at {opened}, but was given up to {m.machine_high}"
            )
        if opened > m.machine_high:
            self._m_check_snapshot_state(node, opened)
            m.machine_high = opened
        node.machine_next = opened + 1
        node.machine_free_ms = self.clock.now_ms
        if m.hooked is not m.store and type(machine).pre_append is not StateMachine.pre_append:
            m.hooked = m.store  # one hook per store object, to whichever machine runs now
            m.store.add_append_hook(lambda i, pos, body: self._m_pre_append(m, i, pos, body))
        self.stats["machine_opens"] += 1
        self.net.note(f"{m.id} machine opened at {opened}")

    def _any_stranded(self) -> bool:
        """Whether a live member's machine waits for a leader's snapshot.  With one snapshot
        kept, a damaged one leaves its member nothing to start from but another member's:
        damaging a second member's meanwhile could leave every voter stranded, each handing
        leadership to the next (corruption on several disks at once, which no group that
        keeps one copy survives unattended)."""
        for other in self.members.values():
            a = other.node.applier if other.alive and other.node is not None else None
            if a is not None and (
                a.core.stranded or a.core.snapshot_wanted(other.store.ledger_begin_index) >= 0
            ):
                return True  # fmt: skip
        return False

    def _others_hold_state(self, m: SimMember) -> bool:
        """Whether ``m``'s only snapshot may be damaged: the group survives that unattended
        only while another voter holds the state, so every other voter of the latest
        committed configuration is up, on a node not lost, and no machine waits for a
        snapshot (else a lost node and a damaged disk together leave the state nowhere)."""
        if self._any_stranded():
            return False
        latest = self.committed_configs[max(self.committed_configs)] if (
            self.committed_configs) else None  # fmt: skip
        voters = latest.voters if latest is not None else self.voters0
        others = [v for v in voters if v != m.id]  # (a lone voter's is the only copy)
        return bool(others) and all(self.members[v].alive and not self.gone(v) for v in others)

    def _damage_newest_snapshot(self, m: SimMember) -> None:
        """A restart finds its newest snapshot damaged (a flipped byte), in the machine's
        state or, on ``sessions_damage`` of them, in the client sessions that travel with
        it: it starts from an older one (the log keeps what comes after the oldest kept), or
        waits for the leader's."""
        snaps = os.path.join(m.data_dir, "snapshots")
        names = sorted(n for n in os.listdir(snaps) if not n.startswith(".")) if os.path.isdir(
            snaps) else []  # fmt: skip
        sessions = self._damage_rng.random() < self.sessions_damage
        target = os.path.join(snaps, names[-1], SESSIONS_FILE if sessions else "kv.arrow") if (
            names) else None  # fmt: skip
        if target is None or not os.path.exists(target) or not os.path.getsize(target):
            return
        with open(target, "r+b") as f:
            data = bytearray(f.read())
            at = self._snapshot_rng.randrange(len(data))
            if sessions:  # one bit of a digit: the table still parses, only its checksum tells
                digits = [i for i, c in enumerate(data) if 48 <= c <= 57]
                at = next((i for i in digits if i >= at), digits[-1] if digits else at)
            data[at] ^= 0x01 if sessions else 0xFF
            f.seek(0)
            f.write(data)
        self.stats["snapshot_damaged"] += 1
        self.stats["snapshot_sessions_damaged"] += sessions
        self.net.note(f"FAULT {m.id}'s newest snapshot {names[-1]} damaged ({target})")

    @staticmethod
    def _m_pre_append(m: SimMember, index: int, pos: int, body: bytearray) -> None:
        if m.node is not None and m.node.applier is not None:
            m.node.applier.machine.pre_append(index, pos, body)

    def _m_close(self, node: Node) -> None:
        """A crash: the machine's process dies.  Its buffered writes reach the files (they
        may, in a real crash); what it never flushed is cut on its next open anyway."""
        if node.applier is not None:
            node.applier.machine.close()

    def _m_thread(self, node: Node, ms: int, fn: Callable, *args) -> int:
        """Run ``fn`` on the machine's one thread, after what was queued there, ``ms`` from
        when it starts; returns when it has run."""
        end = max(self.clock.now_ms, node.machine_free_ms) + ms
        node.machine_free_ms = end
        self._at(node, end, fn, *args)
        return end

    def _machines_step(self) -> None:
        """``MachineRunner.kick`` after the committed index moved: checked every step."""
        for m in self.members.values():
            if m.alive and m.node.applier is not None:
                self._m_pump(m.node)
        now = self.clock.now_ms
        if self._next_query_ms is not None and self.clients_on and now >= self._next_query_ms:
            rng = self._query_rng
            self._next_query_ms = now + rng.randint(*MACHINE_QUERY_EVERY_MS)
            alive = [m for m in self.members.values() if m.alive]
            if alive:
                self._m_query(rng.choice(alive).node)

    def _m_pump(self, node: Node) -> None:
        core = node.applier.core
        store = node.logic.store
        batch = core.step(
            mcore.NextJob(store.committed_index, store.ledger_begin_index), self.clock.now_ms
        )
        if batch is None:
            if core.stranded:
                self.stats["machine_stranded_steps"] += 1
            return
        if isinstance(batch, Install | Rebase):
            ms = self._machine_rng.randint(*MACHINE_APPLY_MS)
            done = self._m_installed if isinstance(batch, Install) else self._m_rebased
            self._m_thread(node, ms, done, node, batch)
            return
        try:
            entries = store.get_range(batch.start, batch.stop)
            core.step(mcore.BatchRead(batch, entries), self.clock.now_ms)
        except Exception as exc:
            core.step(mcore.MachineFailed(repr(exc)), self.clock.now_ms)
            self.fail(f"{node.id} could not read {batch} for its machine: {exc!r}")
        rng = self._machine_rng
        ms = rng.randint(*MACHINE_APPLY_MS) + len(entries) // 64
        if rng.random() < MACHINE_PAUSE[0]:
            ms += rng.randint(*MACHINE_PAUSE[1])
        self._m_thread(node, ms, self._m_applied, node, batch, entries)

    def _m_applied(self, node: Node, batch, entries: list) -> None:
        """The batch ran on the machine's thread (it takes effect at the end of its time)."""
        core = node.applier.core
        try:
            node.applier.run(entries)
        except SimulationFailure:
            raise  # a check of the instrumented apply
        except Exception as exc:
            core.step(mcore.MachineFailed(repr(exc)), self.clock.now_ms)
            self.fail(f"{node.id}'s machine failed on {batch}: {exc!r}")
        self._m_skip_configs(node, batch.stop)
        m = self.members[node.id]
        m.machine_high = max(m.machine_high, node.machine_next - 1)
        store = node.logic.store
        for token in core.step(mcore.BatchApplied(batch.stop - 1), self.clock.now_ms):
            self._m_answer(node, token)
        store.keep_from = core.keep_from(node.applier.saved_now())
        index = core.step(mcore.SnapshotDue(entries, store.ledger_begin_index), self.clock.now_ms)
        if index is not None:
            self._m_snapshot(node, index)
        elif self.machine == "mq":
            self._m_compact(node, 0.1)  # up to the commit log's last checkpoint
        self.stats["machine_batches"] += 1
        self._m_pump(node)

    def _m_compact(self, node: Node, chance: float) -> None:
        """An operator's compaction (``group.compact``) on a file-store member, seeded: the
        log up to what its machine can come back from goes, and a member that was away
        longer than that is reset past it."""
        store = node.logic.store
        if self.store_kind == "file" and self._snapshot_rng.random() < chance:
            if store.clean(compact=True):
                self.stats["log_compactions"] += 1
                self.net.note(f"{node.id} compacts its log to {store.ledger_begin_index}")

    def _m_rebased(self, node: Node, job) -> None:
        """``MachineRunner._rebase`` on the machine's thread: its log was reset past where
        it stands and it takes no snapshots: it continues after ``job.index``."""
        m = self.members[node.id]
        if job.index < node.machine_next - 1:
            self.fail(f"{node.id}'s machine rebases to {job.index}, standing at "
                      f"{node.machine_next - 1}")  # fmt: skip
        try:
            node.applier.machine.rebase(job.index)
        except Exception as exc:
            node.applier.core.step(mcore.MachineFailed(repr(exc)), self.clock.now_ms)
            self.fail(f"{node.id}'s machine failed to rebase to {job.index}: {exc!r}")
        m.rebases.append((node.machine_next - 1, job.index))  # (stood at, continues after)
        node.machine_next = job.index + 1
        m.machine_high = max(m.machine_high, job.index)
        for token in node.applier.core.step(mcore.Rebased(job.index), self.clock.now_ms):
            self._m_answer(node, token)
        self.stats["machine_rebases"] += 1
        self.net.note(f"{node.id} machine rebases to {job.index}")
        self._m_pump(node)

    def _m_offer(self, node: Node, sealed: list) -> None:
        """``MachineRunner.offer``: snapshots sealed from the leader; the core decides."""
        if node.applier is None:
            return
        m = self.members[node.id]
        for meta in sealed:
            self.stats["installs_sealed"] += 1
            m.sealed_high = max(m.sealed_high, meta.index)
            if node.applier.core.step(
                mcore.SnapshotOffered(meta.index, meta.path), self.clock.now_ms
            ):
                self.stats["installs_offered"] += 1
        self._m_pump(node)

    def _m_check_snapshot_state(self, node: Node, index: int) -> None:
        """The machine, just loaded from a leader's snapshot at ``index``, holds exactly the
        committed log up to it, replayed."""
        a, store = node.applier, node.logic.store
        ref = self._replayed_to(index, store, [(index, index)])
        if ref is None or machine_state(a.machine) != machine_state(ref):
            if ref is None and not self.durability_void:
                self.fail(f"{node.id} loads a snapshot at {index}, not all committed")
            if ref is not None and not self.durability_void:
                self.fail(f"{node.id}'s snapshot at {index} differs from the committed log "
                          f"replayed: {_diff(machine_state(a.machine), machine_state(ref))}")  # fmt: skip

    def _m_installed(self, node: Node, job: Install) -> None:
        """``MachineRunner._install`` on the machine's thread: the snapshot replaces the
        machine's state; checked to hold exactly the committed log up to its index."""
        m = self.members[node.id]
        a, store = node.applier, node.logic.store
        if job.index < node.machine_next:  # it would apply those entries a second time
            self.fail(f"{node.id}'s machine loads a snapshot at {job.index}, standing at "
                      f"{node.machine_next - 1}")  # fmt: skip
        try:
            a.machine.load_snapshot(job.path, job.index)
        except Exception as exc:
            a.core.step(mcore.MachineFailed(repr(exc)), self.clock.now_ms)
            self.fail(f"{node.id}'s machine failed to load snapshot {job.index}: {exc!r}")
        self._m_check_snapshot_state(node, job.index)
        m.rebases.append((job.index, job.index))
        node.machine_next = job.index + 1
        m.machine_high = max(m.machine_high, job.index)
        released, gone, store.keep_from = a.core.step(
            mcore.Installed(job.index, a.snapshots.list(), a.saved), self.clock.now_ms
        )
        for old in gone:
            a.snapshots.delete(old)
        for token in released:
            self._m_answer(node, token)
        self.stats["machine_installs"] += 1
        self.net.note(f"{node.id} machine loads the leader's snapshot at {job.index}")
        self._m_pump(node)

    def _m_asked(self, node: Node, index: int, have: int | None = None) -> None:
        """``MachineRunner.snapshot_asked``: a follower's machine needs a snapshot that far."""
        now = node.applier.core.step(
            mcore.SnapshotAsked(index, node.logic.store.ledger_begin_index, have), self.clock.now_ms
        )
        if now is not None:
            self.stats["snapshots_asked"] += 1
            self._m_snapshot(node, now)

    def _m_snapshot(self, node: Node, index: int) -> None:
        """``MachineRunner._snapshot``: the cut on the machine's thread (now, right after
        the batch), written, sealed and the oldest dropped (at once: the writer's thread
        takes no simulated time)."""
        a, store = node.applier, node.logic.store
        snaps = a.snapshots
        writer = a.machine.snapshot()
        term = store.get_term(index)
        sessions = node.logic.sessions.at(index)  # MachineRunner._snapshot: the cut's table
        snaps.seal(index, term, with_sessions(writer, sessions))
        gone, store.keep_from = a.core.step(
            mcore.SnapshotSealed(index, snaps.list(), a.saved), self.clock.now_ms
        )
        for old in gone:
            snaps.delete(old)
        self.stats["machine_snapshots"] += 1
        self._m_compact(node, 0.5)  # a member away longer than that gets the snapshot
        self._m_snapshot_cut(node, index)

    def _m_snapshot_cut(self, node: Node, index: int) -> None:
        """Now and then (``snapshot_cuts``, seeded, its own stream) a leader that has just
        snapshotted at its committed index is cut off from its voters for 1.5-4 heartbeat
        timeouts and compacts its log there: the entries it appended after it reach no later
        leader, and its log (and a learner's it resets) begins right after the snapshot
        point -- what a TRUNCATE at that point must cut."""
        rng, m = self._snapshot_cut_rng, self.members[node.id]
        store = node.logic.store
        if rng is None or self._next_change_ms is None:  # none once healed
            return
        if not m.state.is_leader or index != store.committed_index:
            return
        if rng.random() >= SNAPSHOT_CUT_CHANCE:
            return
        lo, hi = LEASE_PARTITION_TIMEOUTS
        timeout = self.election.heartbeat_timeout_ms
        until = self.clock.now_ms + rng.randint(int(lo * timeout), int(hi * timeout))
        for voter in node.logic.config_log.latest().voters:
            if voter != node.id:
                self._cut_for(node.id, voter, until)
        if store.clean(compact=True):
            self.stats["log_compactions"] += 1
        self.stats["snapshot_cuts"] += 1
        self.net.note(f"FAULT {node.id} cut off from its voters until {until} as it snapshots "
                      f"at {index}; its log now begins at {store.ledger_begin_index}")  # fmt: skip

    def _m_check_apply(self, node: Node, entries: list) -> None:
        """Instrumented around the applier's call: in order from where the machine stands,
        each entry committed at its index in its term."""
        m = self.members[node.id]
        for e in entries:
            self._m_skip_configs(node, e.index)
            if e.index != node.machine_next:
                self.fail(f"{node.id}'s machine got entry {e.index}, expected {node.machine_next}")
            node.machine_next += 1
            got = self.committed.get(e.index)
            if got is None:  # committed in this very step: the checks have not seen it yet
                self._check_member(m)
                got = self.committed.get(e.index)
            if got is None or got[0] != e.term:
                if not self.durability_void:
                    self.fail(
                        f"{node.id}'s machine applies {e.index} (term {e.term}), committed as {got}"
                    )
                self.stats["machine_applied_lost_after_power_loss"] += 1
        m.machine_high = max(m.machine_high, node.machine_next - 1)

    def _m_after_apply(self, node: Node, entries: list) -> None:
        """After the machine applied ``entries`` (a hook for the KV history)."""

    def _is_config(self, index: int) -> bool:
        """Whether the committed entry at ``index`` is a configuration (the group's, never
        the machine's: the applier skips it)."""
        e = self.committed_entries.get(index)
        return e is not None and e.channel == CONFIG_CHANNEL

    def _m_skip_configs(self, node: Node, upto: int) -> None:
        """The machine's next entry moves past the configuration entries before ``upto``
        (the applier gives it none of them)."""
        while node.machine_next < upto and self._is_config(node.machine_next):
            node.machine_next += 1

    def _machine_floor(self, index: int) -> int:
        """The last index at or below ``index`` a machine is given (configurations skipped)."""
        while index >= 0 and self._is_config(index):
            index -= 1
        return index

    # -- queries -----------------------------------------------------------------------------
    def _m_query(self, node: Node) -> None:
        """``MachineRunner.query`` with the ``committed`` consistency: the machine answers
        once it applied this member's committed index (the core decides when, or that it
        times out)."""
        rng = self._query_rng
        if self.machine == "kv":
            request: Any = (
                {"get": f"k{rng.randint(0, 12)}"} if rng.random() < 0.8 else {"keys": True}
            )
        else:
            request = rng.choice(
                (
                    ("topics",),
                    ("max_offset", f"t{rng.randint(0, 1)}", 0),
                    ("pull", f"t{rng.randint(0, 1)}", rng.randint(0, 2), 0, 64),
                )
            )
        index = node.logic.store.committed_index
        token = (index, request)  # compared by identity
        core = node.applier.core
        now = self.clock.now_ms
        timeout = rng.randint(*MACHINE_QUERY_TIMEOUT_MS)
        verdict = core.step(mcore.Query(index, token, timeout), now)  # raises once failed
        self.stats["machine_queries"] += 1
        if verdict == QueryVerdict.ANSWER:
            self._m_answer(node, token)
        else:
            self.stats["machine_query_waits"] += 1
            self._at(node, now + timeout, self._m_expire, node)

    def _m_expire(self, node: Node) -> None:
        for _token, err in node.applier.core.step(mcore.ExpireQueries(), self.clock.now_ms):
            self.stats[f"machine_query_{err.code.name.lower()}"] += 1

    def _m_answer(self, node: Node, token: tuple) -> None:
        """The core released the query: the machine answers on its thread, having applied
        at least the index it waited for."""
        index, request = token
        machine = node.applier.machine
        if machine.applied < self._machine_floor(index):  # released before it got there
            self.fail(f"{node.id}'s machine may answer a query at {index} having applied "
                      f"{machine.applied}")  # fmt: skip

        def ask() -> None:
            try:
                answer = machine.query(request)
            except LedgerError as exc:
                # a machine that kept entries its log lost (a power loss without sync_flush)
                # may point past the log: RocketMQ's pull then reads beyond the store's end
                if not self.durability_void:
                    self.fail(f"{node.id}'s machine failed query {request}: {exc!r}")
                self.stats["machine_query_error_after_power_loss"] += 1
                return
            if self.machine == "kv" and isinstance(request, dict) and "get" in request and answer:
                rev = answer[1]
                if rev > machine.applied:
                    self.fail(
                        f"{node.id} answered {request} with revision {rev}, past {machine.applied}"
                    )
            self.stats["machine_query_answered"] += 1
            done = getattr(token, "done", None)  # a KV client's get waits for the answer
            if done is not None:
                done(answer)

        self._m_thread(node, self._query_rng.randint(*MACHINE_CALL_MS), ask)

    # -- the supervisor's actions ------------------------------------------------------------
    def _m_role(self, node: Node):
        """``MachineRole``: the role and term as the member holds them now."""
        st = node.logic.state
        core = node.applier.core
        if not core.step(mcore.RoleNews(st.role, st.current_term), self.clock.now_ms):
            return None
        role, term, out = st.role, st.current_term, []
        end = self._m_thread(
            node,
            self._machine_rng.randint(*MACHINE_CALL_MS),
            self._m_call,
            out,
            node.applier.machine.on_role_change,
            role,
            term,
        )
        yield end - self.clock.now_ms
        if out and isinstance(out[0], sv.Failed):
            core.step(mcore.MachineFailed(out[0].why), self.clock.now_ms)
            self.fail(f"{node.id}'s machine failed on a role change: {out[0].why}")
        return None

    def _m_wait_ready(self, node: Node, term: int):
        """``WaitMachine``: the core's process, its questions asked on the machine's thread."""
        store = node.logic.store
        proc = node.applier.core.step(mcore.WaitReady(lambda: node.logic.holds_office(term), lambda: store.ledger_begin_index), self.clock.now_ms)  # fmt: skip
        answer = None
        while True:
            action, result = run_to_end(proc, answer)
            if action is None:
                self.stats["machine_ready" if result is True else "machine_not_ready"] += 1
                return result  # True, False, or MACHINE_STRANDED
            value = None
            if isinstance(action, AskReady):
                out: list = []
                ms = self._machine_rng.randint(*MACHINE_CALL_MS)
                end = self._m_thread(
                    node, ms, self._m_call, out, node.applier.machine.ready_to_lead
                )
                yield end - self.clock.now_ms
                value = out[0] if out else sv.Failed("no answer")
                self.stats["machine_ready_asks"] += 1
            else:
                yield action.ms
            answer = sv.Answer(self.clock.now_ms, value)

    @staticmethod
    def _m_call(out: list, fn: Callable, *args) -> None:
        try:
            out.append(fn(*args))
        except Exception as exc:
            out.append(sv.Failed(repr(exc)))

    # -- what clients append -----------------------------------------------------------------
    def _machine_bodies(self, client: str, req_id: int, k: int) -> tuple[bytes, ...]:
        """Bodies the machine takes, each unique: KV sets and deletes; RocketMQ messages
        (some prepared, committed or rolled back) and consumer offsets; now and then a body
        it must skip alike everywhere."""
        rng = self._body_rng
        out = []
        for j in range(k):
            tag = f"{client}:{req_id}:{j}"
            roll = rng.random()
            if roll < 0.03:
                out.append(f"junk {tag}".encode())
            elif self.machine == "kv":
                key = f"k{rng.randint(0, 12)}"
                if roll < 0.25:  # a delete, unique by a field the machine ignores
                    doc = {"op": "del", "key": key, "rev": "0" * 10, "by": tag}
                    out.append(json.dumps(doc).encode())
                elif roll < 0.45:  # KVClient's put and compare-and-set, of a few values
                    key = f"p{rng.randint(0, 3)}"  # keys only these take, so some swap
                    doc = {"op": "put", "key": key, "b64": _b64(b"v%d" % rng.randint(0, 3)),
                           "rev": "0" * 10, "by": tag}  # fmt: skip
                    if roll >= 0.35:
                        exp = rng.choice((None, b"v0", b"v1", b"v2", b"v3"))
                        doc.update(op="cas", exp=None if exp is None else _b64(exp))
                    out.append(json.dumps(doc).encode())
                else:
                    out.append(set_command(key, {"by": tag, "pad": "x" * rng.randint(0, 60)}))
            elif roll < 0.12:
                out.append(
                    offset_command(
                        client, f"t{rng.randint(0, 1)}", rng.randint(0, 2), req_id * 16 + j
                    )
                )
            else:
                sys_flag = 0
                if roll > 0.9:
                    sys_flag = rng.choice(
                        (
                            TRANSACTION_PREPARED_TYPE,
                            TRANSACTION_COMMIT_TYPE,
                            TRANSACTION_ROLLBACK_TYPE,
                        )
                    )
                props = {"KEYS": f"{client} {tag}"}
                if rng.random() < 0.5:
                    props["TAGS"] = rng.choice(("a", "b"))
                msg = Message(
                    f"t{rng.randint(0, 1)}",
                    f"{tag}:".encode() + b"m" * rng.randint(0, 80),
                    queue_id=rng.randint(0, 2),
                    properties=props,
                    sys_flag=sys_flag,
                )
                out.append(encode(msg))
        return tuple(out)

    def _body_key(self, body: bytes) -> bytes:
        """A body as the client sent it: without what the leader's ``pre_append`` stamps
        (a KV revision; a record's queue and physical offsets and store time)."""
        if self.machine == "kv":
            return _REV.sub(b'"rev": "0000000000"', body)
        if self.machine == "mq" and len(body) >= 92 and body[4:8] == _MAGIC:
            b = bytearray(body)
            b[QUEUE_OFFSET_POS : PHYS_OFFSET_POS + 8] = bytes(16)
            b[_STORE_TS_POS : _STORE_TS_POS + 8] = bytes(8)
            return bytes(b)
        return body

    # -- the checks at the end ---------------------------------------------------------------
    def machines_converged(self) -> bool:
        """Every machine applied its member's committed log, nothing in flight (members
        outside the configuration may lag for good: a removed one never commits again)."""
        members = self.current_members() or self.ids
        for m in self.members.values():
            if m.alive and m.node.applier is not None and m.id in members:
                core = m.node.applier.core
                if core.applying is not None or core.applied != m.store.committed_index:
                    return False
        return True

    def check_machines(self) -> None:
        """Each member's machine state equals a fresh machine's fed its committed log from
        scratch (up to where it applied); the leader's stamps hold.  A member outside the
        configuration is checked up to where its log is committed (its machine may have
        applied more before a restart that recovered a lower committed index)."""
        members = self.current_members() or self.ids
        for m in self.members.values():
            if not m.alive or m.node.applier is None:
                continue
            if m.id not in members and m.node.applier.core.applied > m.store.committed_index:
                self.stats["machines_outside_unchecked"] += 1
                continue
            core = m.node.applier.core
            if core.failed is not None:
                self.fail(f"{m.id}'s machine failed: {core.failed}")
            store = m.store
            last = min(core.applied, store.committed_index)
            fresh = self._replayed_to(last, store, m.rebases)
            if fresh is None:
                self.stats["machine_replay_unknown"] += 1
                continue
            got, want = machine_state(m.node.applier.machine), machine_state(fresh)
            if core.applied > store.committed_index or got != want:
                if self.durability_void:  # it kept entries its log lost to a power loss
                    self.stats["machine_diverged_after_power_loss"] += 1
                    continue
                self.fail(
                    f"{m.id}'s machine (applied {core.applied}, committed "
                    f"{store.committed_index}) differs from a replay of its log: "
                    f"{_diff(got, want)}"
                )
            self._check_stamps(m, fresh, last)
            self.stats["machines_checked"] += 1

    def _replayed_to(
        self, last: int, store: Any = None, rebases: list[tuple[int, int]] = ()
    ) -> StateMachine | None:
        """A fresh machine fed the group's committed log from its first entry up to
        ``last`` -- rebased where the member's machine rebased: ``(stood at, continued
        after)``, the entries between never applied; snapshotted and loaded again where it
        loaded a leader's snapshot: ``(at, at)`` -- (None when the simulation did not see
        all of it: a power loss voided it).  ``store``: the member's log, whose entries
        the machine reads (RocketMQ's pulls)."""
        fresh = load_machine(self.machine_path)
        ctx = MachineContext(self.group, "replay", None, {"checkpoint_interval_ms": NEVER_MS},
                             store)  # fmt: skip
        fresh.open(ctx)
        cuts = [(a, r) for a, r in rebases if r <= last]
        # a loaded snapshot is the committed log's state at its index whatever came before
        # (a restart may have taken the machine back below an earlier one): start there
        loads = [k for k, (a, r) in enumerate(cuts) if a == r]
        cuts = cuts[loads[-1] :] if loads else cuts
        at = 0
        for stood, after in [*cuts, (last, None)]:
            batch: list = []
            for i in range(at, stood + 1):
                e = self.committed_entries.get(i)
                if e is None:
                    return None
                if e.channel == CONFIG_CHANNEL:  # the group's, not the machine's
                    continue
                batch.append(e)
                if len(batch) == 1024:
                    fresh.apply(batch)
                    batch = []
            if batch:
                fresh.apply(batch)
            if after is not None and after == stood:
                _reload(fresh, after)
                at = after + 1
            elif after is not None:
                fresh.rebase(after)
                at = after + 1
        return fresh

    def _check_stamps(self, m: SimMember, fresh: StateMachine, last: int) -> None:
        store = m.store
        bad = None
        if self.machine == "kv":
            for e in store.get_range(store.ledger_begin_index, last + 1):
                hit = _REV.search(e.body)
                if hit and e.body.startswith(b'{"op"') and int(hit.group()[-11:-1]) != e.index:
                    bad = f"entry {e.index} carries revision {hit.group()!r}"
                    break
        elif isinstance(fresh, CommitLogMachine):
            for (topic, qid), q in fresh.queues.items():
                for k, (phys, _size, _tags, index) in enumerate(q.get(q.base, q.max_offset)):
                    if index < store.ledger_begin_index:
                        continue  # compacted away
                    e = store.get(index)
                    msg = decode(e.body, verify=False)
                    if (
                        msg.queue_offset != q.base + k
                        or phys != e.pos + HEADER_SIZE
                        or msg.phys_offset != phys
                    ):
                        bad = (
                            f"queue {topic}/{qid} unit {k} is entry {index} stamped offset "
                            f"{msg.queue_offset}, phys {msg.phys_offset} (at {e.pos})"
                        )
                        break
        if bad is not None:
            if self.durability_void:
                self.stats["machine_stamps_broken_after_power_loss"] += 1
                return
            self.fail(f"{m.id}: the leader's stamps do not hold: {bad}")


def _reload(machine: StateMachine, index: int) -> None:
    """The machine takes its own snapshot at ``index`` and loads it: the state a member
    that loads that snapshot from its leader continues from."""
    with tempfile.TemporaryDirectory() as d:
        machine.snapshot()(d)
        machine.load_snapshot(d, index)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def machine_state(machine: StateMachine) -> Any:
    """What a machine holds, comparable across instances."""
    if isinstance(machine, CommitLogMachine):
        queues = {
            f"{t}/{q}": (cq.base, cq.get(cq.base, cq.max_offset))
            for (t, q), cq in machine.queues.items()
            if cq.max_offset
        }
        keys = {h: list(v) for h, v in machine.keys._by_hash.items()}
        return {
            "applied": machine.applied,
            "queues": queues,
            "keys": keys,
            "offsets": machine.offsets,
        }
    return {"applied": machine.applied, "data": machine.data, "cas": machine.cas_results}


def _diff(got: dict, want: dict) -> str:
    parts = []
    for k in want:
        if got.get(k) != want[k]:
            parts.append(f"{k}: {str(got.get(k))[:200]} vs replay {str(want[k])[:200]}")
    return "; ".join(parts)
