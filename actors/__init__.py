"""The group on Ray: member, dispatcher and quorum-ack actors, LedgerGroup and LedgerClient."""

from rayledger.storage import (
    InconsistentStateError,
    InvalidRequestError,
    LedgerError,
    LedgerTimeoutError,
    NotLeaderError,
    OutcomeUnknownError,
    ResponseCode,
    StorageError,
)
from rayledger.storage.codec import Entry

from .client import LedgerClient
from .config import LedgerConfig
from .group import LedgerGroup
from .types import AppendResult, MemberStatus

__all__ = [
    "AppendResult",
    "Entry",
    "InconsistentStateError",
    "InvalidRequestError",
    "LedgerClient",
    "LedgerConfig",
    "LedgerError",
    "LedgerGroup",
    "LedgerTimeoutError",
    "MemberStatus",
    "NotLeaderError",
    "OutcomeUnknownError",
    "ResponseCode",
    "StorageError",
]
