"""DLedger's log store: codecs, segment files, file and memory stores, recovery, cleanup."""

from .codec import Entry, EntryBatch
from .config import StoreConfig
from .errors import (
    InconsistentStateError,
    InvalidRequestError,
    LedgerError,
    LedgerTimeoutError,
    NotLeaderError,
    OutcomeUnknownError,
    ResponseCode,
    SessionError,
    StorageError,
)
from .file_store import FileStore, RecoveryReport, open_store
from .store import Appended, AppendHook, LogStore, MemoryStore

__all__ = [
    "Appended",
    "AppendHook",
    "Entry",
    "EntryBatch",
    "FileStore",
    "InconsistentStateError",
    "SessionError",
    "InvalidRequestError",
    "LedgerError",
    "LedgerTimeoutError",
    "LogStore",
    "MemoryStore",
    "NotLeaderError",
    "OutcomeUnknownError",
    "RecoveryReport",
    "ResponseCode",
    "StorageError",
    "StoreConfig",
    "open_store",
]
