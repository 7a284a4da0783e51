"""The group on Ray: member, dispatcher and quorum-ack actors, LedgerGroup and LedgerClient.

The store's names (errors, response codes, ``Entry``, ...) are re-exported as they are, so
a user of the group needs only this package.
"""

from rayledger import storage as _storage
from rayledger.storage import *  # noqa: F403  (re-exported: see storage.__all__)

from .client import LedgerClient
from .config import LedgerConfig
from .group import LedgerGroup
from .types import AppendResult, MemberStatus

__all__ = [
    *_storage.__all__,
    "AppendResult",
    "LedgerClient",
    "LedgerConfig",
    "LedgerGroup",
    "MemberStatus",
]
