"""Topics: one log spread over N ordinary groups (partitions ``NAME-p0`` ...).

A topic is the unit a load that outgrows one group's leader scales out with, as Kafka's
partitions and RocketMQ's broker groups are: each partition is a full group (file store,
membership, snapshots, sessions, metrics) whose leader may run on another node, and one
:class:`TopicClient` routes appends over them -- a keyed append always to the same
partition (:func:`~.routing.partition_of`), an unkeyed one round robin.  Order holds per
partition, so per key; exactly-once holds per partition through each group's idempotent
sessions.
"""

from .client import TopicAppendResult, TopicClient, TopicEntry
from .layout import TopicLayout
from .routing import partition_of
from .topic import LedgerTopic

__all__ = [
    "LedgerTopic",
    "TopicAppendResult",
    "TopicClient",
    "TopicEntry",
    "TopicLayout",
    "partition_of",
]
