"""A replicated key-value map on the ledger: the small example of the state-machine API."""

from .machine import KvMachine, delete_command, set_command

__all__ = ["KvMachine", "delete_command", "set_command"]
