"""The timing, fault mix and store layout of the whole-group simulation (:mod:`.group_sim`)."""

from __future__ import annotations

import os
import random
from dataclasses import replace

from rayledger.actors.config import LedgerConfig
from rayledger.actors.core.rounds import MAX_ROUNDS as ROUNDBOOK_MAX_ROUNDS
from rayledger.election import ElectionConfig
from rayledger.replication import ReplicationConfig

from .network import FaultConfig

SIM_ELECTION = ElectionConfig(
    heartbeat_interval_ms=100,
    max_heartbeat_leak=3,
    min_vote_interval_ms=100,
    max_vote_interval_ms=300,
    vote_wait_base_ms=300,
)
"""DLedger's election timing scaled down about tenfold, so a seed covers many terms."""

SIM_REPLICATION = ReplicationConfig(
    max_push_timeout_ms=300,
    max_wait_ack_time_ms=2500,
    max_batch_push_bytes=2048,  # a few entries per push: batching boundaries get exercised
    max_pending_pushes=8,
    compare_timeout_ms=1000,
    commit_push_interval_ms=200,
    error_backoff_ms=100,
    abnormal_check_ms=300,
    push_wait_timeout_ms=300,
)

SIM_FAULTS = FaultConfig(
    mean_interval_ms=700,
    weights=(
        ("partition", 3.0),
        ("one_way", 1.5),
        ("isolate", 2.5),
        ("crash", 2.5),
        ("restart", 2.5),
        ("heal", 1.5),
        ("flaky", 1.0),
    ),
)
"""Frequent faults that mostly separate or kill members; heals are rarer than breaks."""

LEASE_ELECTION = replace(SIM_ELECTION, heartbeat_interval_ms=300)
"""The lease mix's timing: heartbeats three times slower than :data:`SIM_ELECTION`, so a
lease (``heartbeat_timeout / 1.1``: 818 ms, not 272) outlasts what a transferee needs to
take over, commit its first entry and acknowledge an append (about 100-200 ms here: the
take-leadership votes, 30-100 ms apart, and the links are not scaled down).  With DLedger's
defaults (2 s heartbeats, a 1.8 s lease) the lease is longer still."""

LEASE_FAULTS = FaultConfig(
    mean_interval_ms=3000,
    weights=(("flaky", 1.0), ("heal", 1.0), ("crash", 0.5), ("restart", 1.0)),
)
"""The lease mix's random faults: rarer, and no partitions of their own (the mix parts the
old leader itself when a late take order lands)."""

LEASE_MIX = dict(
    election=LEASE_ELECTION,
    faults=LEASE_FAULTS,
    slow_followers=False,
    hangs=False,
    wake_on_election=True,
    late_take_orders=1.0,
    lease_partitions=1.0,
    client_timeout_ms=150,
    reader_timeout_ms=200,
    readers_stay=True,
    follower_reads=0.0,  # every read at the member a reader believes leads
)
"""GroupSim arguments of the lease mix (``test_lease_after_take_order``): every take order
of an operator transfer is held up past the transfer's time-out, and when it lands the old
leader is parted from the group (``GroupSim._take_order_lands``); maintainers wake on
election messages as ``MemberActor._rearm`` does; writers give up on a member after 150 ms
(and ask another, so they find the new leader soon), readers give up on a read after 200 ms
and ask the same member again (so they keep asking the old leader while its lease could
still hold)."""

SIM_STORE = dict(data_segment_size=16 * 1024, index_segment_size=32 * 256)
"""Small segments so entries roll over segment ends (and leave padding) often."""

SIM_TMP = os.environ.get("RAYLEDGER_SIM_TMP") or (
    "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
)
"""Where FileStore members keep their files: a RAM disk when there is one (power loss is
modelled from ``flushed_pos``, so a real disk's fsync would only cost time)."""

LOCAL_HOP_MS = (0, 2)
"""One actor call between a member and its helpers (same node)."""

FAST_PATH_STALL_MS = LedgerConfig(election=SIM_ELECTION).stall_ms()
"""The shipped ``LedgerConfig.stall_ms()``: an execution unanswered this long abandons the graph."""

FAST_PATH_RETRY_MS = (100, 1500)  # fastpath_logic.RETRY_MS, scaled like the election timing
# fastpath_logic.PARK_MS, short enough that the seeds' lulls park and wake the graph
FAST_PATH_PARK_MS = 300
FAST_PATH_COMPILE_MS = (20, 80)  # cg_reset on the followers + compiling
FAST_PATH_SWITCH_MEAN_MS = 900
TRANSFER_MEAN_MS = 1500  # how often, on average, an operator asks the leader to transfer
LEASE_PARTITION_TIMEOUTS = (1.5, 4.0)  # a late take order lands: its old leader is parted
# from the group for this many heartbeat timeouts (longer than its lease)
HANG_MEAN_MS = 6000  # how often, on average, a member's checker hangs (SIGSTOP) in a faulty run
DISPATCHER_FAULT_MEAN_MS = 5000  # ... a member's dispatcher hangs or dies (helper_faults.py)
DISPATCHER_KILL_SHARE = 0.5  # the share of dispatcher faults that kill it (the rest: hangs)
ROUND_SLACK_MS = 1000  # how much later than max_wait_ack_time_ms a round may be answered

MAX_ROUNDS = ROUNDBOOK_MAX_ROUNDS  # the shipped RoundBook's: rounds waiting before appends queue
MAINTAIN_MAX_SLEEP_MS = 1000  # MemberActor._maintain sleeps at most this long
FETCH_LOOP = 20  # one need fetched and answered this often in a row: a hot loop (counted)
FETCH_LIVELOCK_MS = 20_000  # ... and for this long: a livelock (a failure)

FLUSH_TICK_MS = (20, 200)
"""The file store's flush service, run in simulated time: a FileStore member fsyncs what it
wrote this often (its own thread is parked), so what a power loss keeps is seeded."""

DISK_FLUSH_MS = (0, 4)  # a flush's time on a healthy disk (sync_flush runs)
DISK_SLOW_MS = (20, 300)  # ... on a slow one
DISK_FAULT_MEAN_MS = 2500  # how often, on average, a disk turns slow or fails (sync_flush runs)
DISK_FAIL_SHARE = 0.25  # the share of disk faults that fail the disk (fsync errors)
KILL_IN_FLUSH_SHARE = 0.3  # a leader's flush during which its checker is killed (sync runs)

PARKED_MS = 1 << 40  # flush/checkpoint intervals of the store's own thread: never on its own


def sim_config_for(seed: int) -> ReplicationConfig:
    """Vary the replication settings by seed: tiny pushes, small windows, a throttled follower,
    snapshot chunks of a few hundred bytes."""
    rng = random.Random(seed * 7919 + 1)
    cfg = SIM_REPLICATION
    return replace(
        cfg,
        max_batch_push_bytes=rng.choice((200, 2048, 64 * 1024)),
        max_pending_pushes=rng.choice((1, 4, 8, 64)),
        peer_push_throttle_point=rng.choice((cfg.peer_push_throttle_point, 2048)),
        peer_push_quota=rng.choice((cfg.peer_push_quota, 40 * 1024)),
        # snapshots to lagging followers in many small chunks, or in one (its own stream)
        install_chunk_bytes=random.Random(seed * 7919 + 3).choice((300, 2048, 1 << 20)),
    )


# ---------------------------------------------------------------------- every feature at once

HELPER_BOOT_MS = (500, 3000)
"""A new dispatcher's process booting (``Helpers``/``Install`` of a peer just added): on Ray
the member's role lock is held meanwhile, so later configurations wait for it."""

CHECKER_CONFIGURE_MS = (0, 1500)
"""How long a leader's ``CheckerConfigure`` takes to reach its checker (its actor queue)."""

SLOW_HOP = (0.02, (5, 80))
"""The share of node-local actor calls that take longer (a busy actor, a GC pause), and how
long: with ``slow_hops``, on top of :data:`LOCAL_HOP_MS`."""

LOST_MEAN_MS = 5000  # how often, on average, a member's node is lost for good
REPLACE_LOST_AFTER_MS = 1500  # LedgerConfig.replace_lost_after_s, scaled like the election
CLUSTER_VIEW_MS = 1000  # MemberActor._watch_nodes: Ray's view of the nodes, each second
SPAWN_START_MS = (100, 1500)  # a replacement member's actor starting on its node
FREE_HOSTS = 2  # live nodes that host no member, where a lost member's replacement may go

ALL_FEATURES_FAULTS = FaultConfig(mean_interval_ms=1500, weights=SIM_FAULTS.weights)
"""The network faults, crashes and restarts of :data:`SIM_FAULTS`, half as often: every
other fault source of the mode (lost nodes, hung helpers, slow and failing disks, transfers,
membership changes) comes on top.  As often as :data:`SIM_FAULTS`, most seeds spent their
chaos without a leader ready for appends."""

KV_GET_EVERY_MS = (20, 120)  # a KV client's gets (any member, any consistency)
KV_GET_TIMEOUT_MS = 1500  # ... given up after this long (a read with no answer: dropped)

ALL_FEATURES = dict(
    store_kind="file",
    faults=ALL_FEATURES_FAULTS,
    power_loss=0.0,
    spares=2,
    membership=True,
    lost_members=True,
    idempotent=True,
    client_deadline_ms=8000,
    clients=3,
    client_interval_ms=(2, 30),
    follower_reads=0.5,
    helper_delays=True,
    slow_hops=True,
    late_start_reports=(0, 800),
    wake_on_election=True,
    kv_getters=2,
)
"""GroupSim arguments of the all-features mode (``test_all_features_sim.py``): file stores
(half the seeds with sync_flush and every crash a power loss, the other half async with
process crashes only -- an async power loss voids the durability checks for the rest of its
run: :func:`all_features`), operator membership changes and lost nodes replaced by the
leader, idempotent clients that give an append up after 8 s, a state machine with
snapshots, compaction and installs, reads at every consistency on any member, KV gets
checked for linearizability, transfers, hung and killed helpers, helpers' configuration
that lags by up to seconds, and every other fault of the simulation."""


SHORT_TTL_SHARE = 0.3
SHORT_TTL_MS = (2000, 3000, 5000)
"""On this share of the all-features seeds, client sessions expire after a few seconds of
silence (``client_session_ttl_ms``; 1 h otherwise), shorter than a client's deadline: retries
outlive their sessions, sessions expire by entries later truncated, and the members' clocks
that stamp the entries are off the clients' by up to a quarter of the TTL either way."""


CUT_REMOVALS_SHARE = 0.3
"""On this share of the all-features seeds, the operator also removes voters the leader
has just lost its links to, down to a single voter (``GroupSim(cut_removals=True)``)."""


KEEP_ONE_SHARE = 0.3
"""On this share of the all-features seeds, each machine keeps one snapshot: its log is
compacted right up to it, so a follower's log begins at its snapshot point (a leader then
compares and truncates there), and a damaged snapshot leaves no older one to fall back on
(the member asks its leader for one, for its machine or its client sessions)."""


SESSIONS_DAMAGE_SHARE = 0.3
"""The share of a restart's damaged snapshots whose damage is in the client sessions kept
with the machine's state: the member must not load them, and asks a leader for sessions it
then lacks."""


SMALL_SEGMENTS_SHARE = 0.5
SMALL_SEGMENT_BYTES = 1024

SNAPSHOT_CUTS_SHARE = 0.5
"""On this share of the seeds with small segments, a leader is now and then cut off from
its voters the moment it snapshots at its committed index, and compacts its log there
(``GroupSim(snapshot_cuts=True)``): its log then begins right after its snapshot point with
entries no later leader gets, and so may a learner's it resets there."""
SNAPSHOT_CUT_CHANCE = 0.3  # of such snapshots
"""On this share of the seeds that keep one snapshot, data segments hold a few entries
each, so a compaction up to the snapshot leaves a log that begins right after its point
(with 16 KiB segments only by chance): a leader then compares and truncates there."""


def all_features(seed: int) -> dict:
    """The all-features arguments for ``seed``: the KV machine on three seeds of four (the
    RocketMQ commit log on the fourth), sync_flush on odd seeds, the replication settings of
    :func:`sim_config_for`, short session TTLs on some (:data:`SHORT_TTL_SHARE`), removals
    of unreachable voters on some (:data:`CUT_REMOVALS_SHARE`), one kept snapshot on some
    (:data:`KEEP_ONE_SHARE`), small segments on some of those (:data:`SMALL_SEGMENTS_SHARE`),
    leaders cut off as they snapshot on some of those (:data:`SNAPSHOT_CUTS_SHARE`)."""
    kw = dict(ALL_FEATURES, sessions_damage=SESSIONS_DAMAGE_SHARE)
    kw["machine"] = "mq" if seed % 4 == 3 else "kv"
    if seed % 2:
        kw.update(sync_flush=True, power_loss=1.0)
    replication = sim_config_for(seed)
    rng = random.Random(seed * 7919 + 132)
    if rng.random() < SHORT_TTL_SHARE:
        ttl = rng.choice(SHORT_TTL_MS)
        replication = replace(replication, client_session_ttl_ms=ttl)
        kw["stamp_skew_ms"] = ttl // 4
    kw["replication"] = replication
    kw["cut_removals"] = random.Random(seed * 7919 + 149).random() < CUT_REMOVALS_SHARE
    if random.Random(seed * 7919 + 163).random() < KEEP_ONE_SHARE:
        kw["snapshot_keep"] = 1
        if random.Random(seed * 7919 + 167).random() < SMALL_SEGMENTS_SHARE:
            kw["segment_bytes"] = SMALL_SEGMENT_BYTES
            kw["snapshot_cuts"] = random.Random(seed * 7919 + 181).random() < SNAPSHOT_CUTS_SHARE
    return kw
