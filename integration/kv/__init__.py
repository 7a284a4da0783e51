"""A replicated key-value store on the ledger: the state machine (:class:`KvMachine`) and
its client (:class:`KVClient`)."""

from .client import KVChange, KVClient
from .machine import (
    KvMachine,
    cas_command,
    delete_command,
    put_command,
    set_command,
    value_bytes,
)

__all__ = [
    "KVChange",
    "KVClient",
    "KvMachine",
    "cas_command",
    "delete_command",
    "put_command",
    "set_command",
    "value_bytes",
]
