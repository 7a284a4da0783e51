"""Replication settings with DLedger's defaults (``DLedgerConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from rayledger.storage.errors import LedgerError, ResponseCode


@dataclass
class ReplicationConfig:
    """How a leader pushes entries and how long its appends and pushes may wait.

    All durations are milliseconds and all sizes bytes.  The names follow
    DLedgerConfig (``maxPendingRequestsNum``, ``maxPushTimeOutMs``, ...).
    """

    max_pending_requests_num: int = 10000  # appends waiting for a quorum before LEADER_PENDING_FULL
    max_push_timeout_ms: int = 1000  # a push unanswered this long is resent
    max_wait_ack_time_ms: int = 2500  # an append not committed this long: WAIT_QUORUM_ACK_TIMEOUT
    max_batch_push_bytes: int = 4 * 1024 * 1024  # maxBatchAppendSize
    max_batch_push_count: int = 100_000  # entries per push (a bound on the index work per push)
    max_pending_pushes: int = 1000  # pushes in flight per follower (pipelining window)
    peer_push_throttle_point: int = 300 * 1024 * 1024  # lag in bytes above which the quota applies
    peer_push_quota: int = 20 * 1024 * 1024  # bytes per second to a lagging follower
    # ... and to a learner, whatever its lag: a member being added catches up
    # faster, its pushes paced evenly, and on CPU the voters leave (actors/priority.py)
    learner_push_quota: int = 150 * 1024 * 1024
    compare_timeout_ms: int = 3000  # a COMPARE/TRUNCATE unanswered this long is sent again
    commit_push_interval_ms: int = (
        1000  # a COMMIT goes out at least this often when no entries flow
    )
    error_backoff_ms: int = 500  # pause after an unexpected answer (DLedger sleeps 500 ms)
    leak_check_interval_ms: int = 1000  # prune pushes below the follower's water mark this often
    abnormal_check_ms: int = 1000  # follower: how often queued pushes are checked for gaps
    push_wait_timeout_ms: int = (
        1000  # follower: a queued out-of-order push older than this is a gap
    )
    install_chunk_bytes: int = 8 * 1024 * 1024  # a snapshot goes to a follower in chunks this big
    # an idempotent client's session silent this long (by its leaders' stamps) expires: its
    # appends are refused with SESSION_EXPIRED and the members forget it
    client_session_ttl_ms: int = 3_600_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise LedgerError.of(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"ReplicationConfig: {f.name} must be an int, got {value!r}",
                )
            if value < 0 or (value == 0 and f.name != "error_backoff_ms"):
                raise LedgerError.of(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"ReplicationConfig: {f.name} must be > 0, got {value}",
                )
