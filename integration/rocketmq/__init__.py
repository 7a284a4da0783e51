"""RocketMQ on the ledger: the commit-log record (message.py), DLedgerCommitLog as a state
machine every member runs (commitlog.py, consume queues in consumequeue.py), and the
producer/consumer API (client.py)."""

from .client import CommitLog, PullResult, PutMessageResult
from .message import Message, MessageError, PutMessageStatus, decode, encode, msg_id

__all__ = [
    "CommitLog",
    "Message",
    "MessageError",
    "PullResult",
    "PutMessageResult",
    "PutMessageStatus",
    "decode",
    "encode",
    "msg_id",
]
