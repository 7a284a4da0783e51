"""Leader election: DLedger's ``DLedgerLeaderElector`` and ``MemberState`` as a
sans-I/O state machine (no clock, threads, asyncio or Ray inside).

The Ray shell owns the clock and the transport: it calls :meth:`Elector.tick`
every ~10 ms, hands incoming requests to :meth:`Elector.handle`, delivers every
:class:`Send` and feeds the answer (or ``None``) to :meth:`Elector.on_response`,
and announces every :class:`RoleChange`.
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
