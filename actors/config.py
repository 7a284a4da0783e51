"""LedgerConfig: one object composing every layer's settings (DLedger's DLedgerConfig)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rayledger.actors.core.snapshot_policy import SnapshotConfig
from rayledger.election import ElectionConfig
from rayledger.replication import ReplicationConfig
from rayledger.storage import LedgerError, ResponseCode, StoreConfig


@dataclass
class LedgerConfig:
    """Settings of a group; the defaults are DLedger's.

    ``store``, ``election`` and ``replication`` belong to their layers; the rest
    is how the Ray actors drive them.  ``store.data_dir`` is filled in per member
    by :class:`~rayledger.actors.LedgerGroup` from its ``store_dir``.
    """

    store: StoreConfig = field(default_factory=StoreConfig)
    election: ElectionConfig = field(default_factory=ElectionConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    maintain_interval_ms: int = 10  # DLedger's maintainState period
    rpc_timeout_ms: int = 3000  # one vote / heartbeat / push call
    dispatcher_cache_bytes: int = 64 * 1024 * 1024  # recent batches a dispatcher keeps refs to
    max_restarts: int = (
        -1
    )  # for file-backed members: Ray restarts a dead member this often (-1: always)
    fast_path: bool = False  # run the steady-state round as a Ray Compiled Graph (see fastpath.py)
    fast_path_stall_ms: int | None = None  # leave the graph after this; None: heartbeat / 2
    # tear the graph down after this long without a round (its participants spin while it
    # lives); the next round goes as plain calls while it is built again (fastpath_logic.py)
    fast_path_park_ms: int = 2000
    # rounds a leader lets wait for their quorum at once (rounds that overlap);
    # appends arriving while that many wait join one larger round when one ends
    max_rounds: int = 1
    # lease reads assume members' clocks run at rates differing by at most this (see reads.py)
    max_clock_drift: float = 0.1
    # a state machine every member runs, "package.module:Class" (see machine.py)
    state_machine: str | None = None
    state_machine_args: dict = field(default_factory=dict)
    # a machine's snapshots: every N applied entries (0: off) or bytes (0: off),
    # the newest K kept; the log may be compacted up to the newest
    snapshot_every_entries: int = 100_000
    snapshot_every_bytes: int = 0
    snapshot_keep: int = 2
    # membership: a learner planned to vote is promoted once it stores all but
    # this many of the leader's entries; a member whose node Ray reports dead this long is
    # replaced by the leader on a live node hosting no member of the group (None: never).
    # Ray itself declares a node dead after ~30 s without health checks, so a minute more
    # rides out a slow reboot but not a lost host.
    promote_lag: int = 1000
    replace_lost_after_s: float | None = 60.0
    # exactly-once appends: an idempotent client's session silent this long, by
    # its leaders' stamps, expires (its appends then get SESSION_EXPIRED); None keeps the
    # replication layer's ``client_session_ttl_ms`` (1 h)
    client_session_ttl_s: float | None = None

    def replace_lost_after_ms(self) -> int | None:
        s = self.replace_lost_after_s
        return None if s is None else int(s * 1000)

    def node_watch_interval_s(self) -> float:
        """How often a leader reads Ray's view of the nodes for ``replace_lost_after_s``: a
        twelfth of it, between 1 and 5 s (each look asks the GCS for every node; a lost
        member is replaced at most that much late)."""
        lost = self.replace_lost_after_s or 0.0
        return min(5.0, max(1.0, lost / 12))

    def snapshots(self) -> SnapshotConfig:
        return SnapshotConfig(
            self.snapshot_every_entries, self.snapshot_every_bytes, self.snapshot_keep
        )

    def lease_ms(self) -> int:
        """How long a confirmed read-index round lets the leader serve lease reads: the time
        a quorum refuses pre-votes after hearing from it, shortened for clock drift."""
        return int(self.election.heartbeat_timeout_ms / (1 + self.max_clock_drift))

    def stall_ms(self) -> int:
        """How long one compiled-graph execution may take before plain calls take over
        (within one heartbeat interval: half of it, between 20 and 500 ms)."""
        if self.fast_path_stall_ms is not None:
            return self.fast_path_stall_ms
        return max(20, min(500, self.election.heartbeat_interval_ms // 2))

    def __post_init__(self) -> None:
        if self.state_machine is not None and (
            not isinstance(self.state_machine, str) or self.state_machine.count(":") != 1
        ):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"state_machine must be 'package.module:Class', got {self.state_machine!r}",
            )
        if not isinstance(self.state_machine_args, dict):
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, "state_machine_args: a dict")
        self.snapshots()  # UNEXPECTED_ARGUMENT for bad snapshot settings
        if not 0 <= self.max_clock_drift < 1:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"max_clock_drift must be in [0, 1), got {self.max_clock_drift!r}",
            )
        lost = self.replace_lost_after_s
        if (lost is not None and (isinstance(lost, bool) or not isinstance(lost, int | float)
                                  or lost < 0)) or not isinstance(self.promote_lag, int) or (
            self.promote_lag < 0
        ):  # fmt: skip
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"replace_lost_after_s must be None or >= 0 and promote_lag an int >= 0, got "
                f"{lost!r} and {self.promote_lag!r}",
            )
        ttl = self.client_session_ttl_s
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl >= 0.001:
                raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT,
                                     f"client_session_ttl_s must be > 0, got {ttl!r}")  # fmt: skip
            self.replication = dataclasses.replace(
                self.replication, client_session_ttl_ms=int(ttl * 1000)
            )
        mr = self.max_rounds
        if isinstance(mr, bool) or not isinstance(mr, int) or not 1 <= mr <= 64:
            raise LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"max_rounds must be an int in [1, 64], got {mr!r}")  # fmt: skip
        if self.maintain_interval_ms <= 0 or self.rpc_timeout_ms <= 0:
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                "maintain_interval_ms and rpc_timeout_ms must be positive",
            )

    @classmethod
    def fast(
        cls, heartbeat_interval_ms: int = 100, max_heartbeat_leak: int = 3, **overrides
    ) -> LedgerConfig:
        """Short timers for demos, benchmarks and tests: heartbeat 100 ms, leak 3, votes 50-150 ms."""
        election = ElectionConfig(
            heartbeat_interval_ms=heartbeat_interval_ms,
            max_heartbeat_leak=max_heartbeat_leak,
            min_vote_interval_ms=heartbeat_interval_ms // 2,
            max_vote_interval_ms=heartbeat_interval_ms * 3 // 2,
            vote_wait_base_ms=heartbeat_interval_ms,
        )
        base = cls(
            election=election, rpc_timeout_ms=max(1000, heartbeat_interval_ms * max_heartbeat_leak)
        )
        return dataclasses.replace(base, **overrides) if overrides else base

    def for_member(self, data_dir: str | None) -> LedgerConfig:
        return dataclasses.replace(self, store=dataclasses.replace(self.store, data_dir=data_dir))
