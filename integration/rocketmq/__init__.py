"""RocketMQ on the ledger: the commit-log record, and (to come) DLedgerCommitLog's put path,
consume queues and broker roles on the state-machine API."""

from .message import Message, MessageError, PutMessageStatus, decode, encode, msg_id

__all__ = ["Message", "MessageError", "PutMessageStatus", "decode", "encode", "msg_id"]
