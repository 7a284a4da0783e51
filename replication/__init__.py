"""DLedger's replication as sans-I/O state machines.

Leader side: :class:`EntryDispatcher` (one per follower) and
:class:`QuorumAckChecker`; follower side: :class:`EntryHandler`; append
admission: :func:`check_append`.  Nothing here reads a clock, sleeps, or does
I/O beyond the store it is given; the shell passes ``now_ms`` and sends the
messages.
"""

from .admission import check_append
from .checker import QuorumAckChecker, Resolved
from .config import ReplicationConfig
from .handler import EntryHandler
from .leaderlog import LeaderLog, NotCached
from .messages import PushEntryRequest, PushEntryResponse, PushType, SnapshotChunk
from .push import DispatcherState, EntryDispatcher

__all__ = [
    "DispatcherState",
    "EntryDispatcher",
    "EntryHandler",
    "LeaderLog",
    "NotCached",
    "PushEntryRequest",
    "PushEntryResponse",
    "PushType",
    "QuorumAckChecker",
    "ReplicationConfig",
    "Resolved",
    "SnapshotChunk",
    "check_append",
]
