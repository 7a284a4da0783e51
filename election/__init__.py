"""Leader election: DLedger's ``DLedgerLeaderElector`` and ``MemberState`` as a
sans-I/O state machine (no clock, threads, asyncio or Ray inside).

The member's core owns the elector and steps it (:meth:`Elector.step`) with the events
its shell delivers: a ``Tick`` every ~10 ms, each incoming request (``ElectionRequest``),
and the answer (or ``None``) to every :class:`Send` (``ElectionAnswer``); it carries
out the sends and announces every :class:`RoleChange`.
"""

from .config import ElectionConfig
from .elector import Elector
from .member_state import FileTermStore, MemberState, MemoryTermStore, TermStore
from .messages import (
    Action,
    HeartbeatRequest,
    HeartbeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    ParseResult,
    Role,
    RoleChange,
    Send,
    TransferOutcome,
    VoteRequest,
    VoteResponse,
    VoteResult,
)

__all__ = [
    "Action",
    "ElectionConfig",
    "Elector",
    "FileTermStore",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "LeadershipTransferRequest",
    "LeadershipTransferResponse",
    "MemberState",
    "MemoryTermStore",
    "ParseResult",
    "Role",
    "RoleChange",
    "Send",
    "TermStore",
    "TransferOutcome",
    "VoteRequest",
    "VoteResponse",
    "VoteResult",
]
