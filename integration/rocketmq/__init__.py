"""RocketMQ on the ledger: the commit-log record (message.py), DLedgerCommitLog as a state
machine every member runs (commitlog.py, consume queues in consumequeue.py), the
producer/consumer API of one group (client.py), and broker clusters: a topic's queues over
several broker groups, each one commit-log group (brokers.py)."""

from .brokers import (
    BrokerCluster,
    MessageQueue,
    Producer,
    PullConsumer,
    SendResult,
    TopicRoute,
)
from .client import CommitLog, PullResult, PutMessageResult
from .message import Message, MessageError, PutMessageStatus, decode, encode, msg_id

__all__ = [
    "BrokerCluster",
    "CommitLog",
    "Message",
    "MessageError",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PutMessageResult",
    "PutMessageStatus",
    "SendResult",
    "TopicRoute",
    "decode",
    "encode",
    "msg_id",
]
